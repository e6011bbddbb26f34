"""Offline training of the AutoMDT PPO agent in the buffer simulator.

:func:`train` runs stable-baselines3 PPO on many batched simulated transfers
(:class:`~automdt.simulator.sb3.BatchedSimVecEnv`), evaluates the current network every
``eval_every`` timesteps as a fraction of the oracle's utility, keeps the best network, stops
early once ``target_fraction`` is reached, and writes:

* ``out``: the SB3 zip with the actor's weights as numpy arrays (``automdt_actor.npz``, what
  :meth:`automdt.agents.ppo.PPOPolicy.load` reads, pickle-free and without torch);
* ``out + ".json"``: metadata (simulator env id and version, spaces, k, thread bound, seed,
  timesteps, wall time, fraction of the oracle, hyperparameters, sha256 of the zip);
* ``<stem>.curve.csv`` and ``<stem>.curve.png``: the learning curve (timesteps, wall seconds,
  mean reward per step, fraction of the oracle).

The pieces: :class:`PPOConfig` (the learner's hyperparameters) and :class:`EnvSettings` (the
simulated task) configure :func:`make_model` (the seeded SB3 model); the callbacks of
:mod:`automdt.agents.callbacks` evaluate, keep the best network and stop (target, hook, wall
time); :func:`training_metadata` describes the result and
:func:`automdt.agents.ppo.write_policy_metadata` writes it. :func:`train` runs them in order.

Two runs with the same arguments give the same network (everything random is seeded in
:func:`make_model`; ``max_seconds`` is the only wall-clock-dependent input). Training uses a fixed
number of torch threads (``PPOConfig.torch_threads``) so that CPU results do not depend on the
machine's core count. This module imports neither torch nor stable-baselines3 until it trains.
"""
from __future__ import annotations

import csv
import functools
import logging
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from automdt.agents import ppo as ppo_mod
from automdt.policy_contract import K_DEFAULT
from automdt.simulator.contract import action_names
from automdt.simulator.profile import Profile, StageProfile
from automdt.simulator.task import SimTask

log = logging.getLogger(__name__)


def __getattr__(name: str) -> Any:
    """``PolicyInputVecEnv``, re-exported from :mod:`automdt.simulator.sb3` (its home) without
    importing stable-baselines3 up front."""
    if name == "PolicyInputVecEnv":
        from automdt.simulator.sb3 import PolicyInputVecEnv

        return PolicyInputVecEnv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "PPOConfig",
    "EnvSettings",
    "EvalPoint",
    "TrainReport",
    "train",
    "make_model",
    "training_metadata",
    "eval_policy_metadata",
    "shipped_config",
    "profile_settings",
    "PROFILE_EVAL_STARTS",
    "evaluate",
    "held_out_random_profiles",
    "bottleneck_profiles",
    "DEFAULT_TIMESTEPS",
    "DEFAULT_TIMESTEPS_RANDOM",
]

DEFAULT_TIMESTEPS = 2_000_000
"""Budget of :func:`train` for one profile when ``timesteps`` is None (early stopping usually
ends training long before)."""
DEFAULT_TIMESTEPS_RANDOM = 20_000_000
"""Budget of :func:`train` with ``random_profiles`` when ``timesteps`` is None."""

PROFILE_EVAL_STARTS: Tuple[Any, ...] = (None, "oracle", (4, 4, 4), (16, 16, 16))
"""The starts ``automdt train --profile`` evaluates from (:func:`evaluate`'s ``starts``): the
evaluation policy's own (1, 1, 1), the profile's oracle triple (where the written policy starts),
and two wider ones (capped at the profile's thread bound). Judged from its oracle triple alone, a
network that merely holds its count scores near 1.0 however badly it moves from anywhere else, so
an untrained network could pass and then wander off on the engine; the other starts make the
score say how the network reaches the optimum, not only whether it stays there."""
EVAL_SEED = 1_000_003
"""Seed of the evaluation episodes during training (fixed; they never touch the global generators)."""
EVAL_PROFILE_SEED = 0x5EED_E7A1
"""Root seed of :func:`held_out_random_profiles` (a stream no training env is seeded from)."""


@dataclass(frozen=True)
class PPOConfig:
    """PPO hyperparameters (stable-baselines3 names), chosen for speed on a few CPU cores.

    The network is small: two hidden layers of 64 by default; its input is ``frame_stack`` frames,
    each the :data:`~automdt.simulator.contract.OBS_DIM` numbers of the encoding plus the derived
    ``features``; its output is one of a handful of choices per stage
    (:func:`~automdt.simulator.contract.action_nvec` of ``action_head``). A rollout of many batched
    environments and a few large minibatch epochs is the cheap way to spend CPU on it.
    """

    num_envs: int = 128
    """Simulated transfers stepped together (one numpy batch)."""
    n_steps: int = 32
    """Steps per environment per rollout (rollout = ``num_envs * n_steps`` timesteps)."""
    batch_size: int = 1024
    """Minibatch size of the PPO update."""
    n_epochs: int = 5
    """Passes over each rollout."""
    learning_rate: float = 1e-3
    """Adam step size (constant)."""
    gamma: float = 0.95
    """Discount per control interval (a ramp of ~6 intervals matters, a 30-step episode is long)."""
    gae_lambda: float = 0.9
    """GAE trace decay."""
    clip_range: float = 0.2
    """PPO ratio clip."""
    ent_coef: float = 0.01
    """Entropy bonus (keeps exploring every stage's choices early on)."""
    anneal: bool = False
    """Decay the learning rate linearly to 10% and the entropy bonus to 0 over the timestep budget,
    so that late updates settle fine details (an extra thread costs ~0.7% of the utility)."""
    reward_k: Optional[float] = None
    """Per-thread cost base of the *training* reward (``None``: the ``k`` of :func:`train`).
    A base above ``k`` (e.g. 1.04 for k = 1.02) sharpens the signal against surplus threads;
    evaluation and model selection always use ``k``."""
    reward: str = "measured"
    """Training reward (:data:`automdt.simulator.vector.REWARD_MODES`): ``"measured"``, the utility
    of the interval's achieved throughputs (what evaluation scores), or ``"steady"``, the
    noise-free steady-state utility of the chosen triple (what the oracle maximises): the same
    optimum without the capacity noise and buffer transients in the learning signal."""
    surplus_penalty: float = 0.0
    """Training-only shaping: reward minus this much per thread a stage runs above the episode
    oracle's count for it (:class:`automdt.simulator.vector.BatchedBufferSim`); the optimum stays
    the oracle's, the signal against surplus threads gets stronger. Evaluation never uses it."""
    change_penalty: float = 0.0
    """Training-only shaping: reward minus this much per stage whose thread count an action
    changes (:class:`automdt.simulator.vector.BatchedBufferSim`), against swapping between two
    nearly equal counts where a stage's need is fractional. Evaluation never uses it."""
    vf_coef: float = 0.5
    """Value-loss weight."""
    max_grad_norm: float = 0.5
    """Gradient clipping."""
    net_arch: Tuple[int, ...] = (64, 64)
    """Hidden layers of the (separate) policy and value networks."""
    activation: str = "Tanh"
    """Activation of the hidden layers (a ``torch.nn`` class name)."""
    episode_steps: int = 30
    """Control intervals per simulated episode."""
    torch_threads: int = 1
    """``torch.set_num_threads`` during training (fixed, so results are reproducible)."""
    frame_stack: int = 1
    """Encoded observations the network sees at once (:class:`automdt.simulator.pipeline.FrameStack`,
    the values of SB3 ``VecFrameStack``; 1 = the last only).
    More history lets a policy probe (step, look, step back) without a recurrent network."""
    features: Tuple[str, ...] = ()
    """Derived inputs added to each encoding (:data:`automdt.simulator.pipeline.FEATURES`)."""
    action_head: str = "target"
    """The action head (:data:`automdt.simulator.dynamics.ACTION_HEADS`): ``"target"`` sets each
    stage to a count anchored on what the stages measured (any count in one step), ``"absolute"``
    to a count 1..max_threads (or hold/+-1), ``"step"`` is the first head (halve, -1, hold, +1,
    double)."""
    chunk_range: Optional[Tuple[float, float]] = None
    """Train with the engine's chunk effects (:func:`automdt.simulator.dynamics.measure_interval`):
    each episode's chunk is ``ratio * (slowest per-thread rate) * interval``, the ratio
    log-uniform in this range. ``None``: the profile's ``meta["chunk_bytes"]`` if any, else the
    fluid model."""
    start_mix: Optional[Tuple[float, float, float]] = None
    """Probabilities of cold, random and draining starts of the training episodes
    (:class:`automdt.simulator.dynamics.SimCore`); ``None``: ``train``'s ``random_start``."""

    def policy_kwargs(self) -> Dict[str, Any]:
        """The ``policy_kwargs`` recorded in the metadata (JSON form: activation by name)."""
        arch = list(self.net_arch)
        return {"net_arch": {"pi": arch, "vf": list(arch)}, "activation_fn": self.activation}

    def replace(self, **changes: Any) -> "PPOConfig":
        import dataclasses

        return dataclasses.replace(self, **changes)


TRAINING_TASK = SimTask(randomize=0.1, random_start=False)
"""Where training departs from the simulated task's defaults (:class:`~automdt.simulator.task.SimTask`):
each episode jitters the profile by 10% (robustness to the fit's errors) and starts cold, at
(1, 1, 1) with empty buffers, where a transfer starts."""


@dataclass(frozen=True)
class EnvSettings:
    """The simulated transfers a policy trains on (the task), apart from :class:`PPOConfig` (the
    learner). :func:`train` takes these as keyword arguments of the same names and records them in
    the metadata; evaluation always runs the profiles as they are (no randomisation, no changes).
    The defaults are :data:`TRAINING_TASK`'s; :meth:`task` makes the
    :class:`~automdt.simulator.task.SimTask` the environments run.
    """

    k: float = TRAINING_TASK.k
    """Utility base per thread: of the training reward (unless ``PPOConfig.reward_k``), of every
    evaluation and of the oracle."""
    random_profiles: bool = TRAINING_TASK.random_profiles
    """A fresh random profile per episode (a general policy); else the training profile's."""
    randomize: float = TRAINING_TASK.randomize
    """Relative jitter of TPT and B at each episode (robustness to fit errors)."""
    random_start: bool = TRAINING_TASK.random_start
    """Start training episodes from random thread counts and buffer fills instead of (1, 1, 1)
    and empty buffers (where a transfer, and every evaluation, starts)."""
    noise: Optional[float] = TRAINING_TASK.noise
    """Capacity noise (relative std per interval) of the training environments; ``None``: each
    (random) profile's own."""
    changes: Any = TRAINING_TASK.changes
    """A :class:`automdt.simulator.changes.ProfileChanges`: training episodes whose profile changes
    at random steps (a moving bottleneck, a link that halves), so the policy has seen a path change
    under it; ``None``: every episode keeps its profile."""

    def task(self, config: PPOConfig) -> SimTask:
        """The simulated task of the training environments: these settings with the learner's
        episode length and chunk and start draws."""
        return TRAINING_TASK.replace(k=config.reward_k or self.k, episode_steps=config.episode_steps,
                                     randomize=self.randomize, random_profiles=self.random_profiles,
                                     random_start=self.random_start, noise=self.noise, changes=self.changes,
                                     chunk_range=config.chunk_range, start_mix=config.start_mix)

    def make_vec_env(self, profile: Profile, config: PPOConfig, seed: int) -> Any:
        """The SB3 ``VecEnv`` of ``config.num_envs`` batched simulated transfers, seeded (env i gets
        ``seed + i`` at its first reset), behind the policy's input pipeline
        (:class:`automdt.simulator.sb3.PolicyInputVecEnv`) when ``config`` adds features or frames."""
        from automdt.simulator.sb3 import BatchedSimVecEnv, PolicyInputVecEnv

        venv = BatchedSimVecEnv(
            num_envs=config.num_envs, profile=profile, task=self.task(config), seed=seed, reward=config.reward,
            surplus_penalty=config.surplus_penalty, change_penalty=config.change_penalty, action_head=config.action_head,
        )
        venv.seed(seed)
        if config.features or config.frame_stack > 1:  # the policy's input pipeline, as PPOPolicy runs it live
            return PolicyInputVecEnv(venv, config.features, profile.max_threads, config.frame_stack)
        return venv


@dataclass(frozen=True)
class EvalPoint:
    """One evaluation during training (a row of the learning-curve CSV)."""

    timesteps: int
    wall_s: float
    mean_reward: float
    """Mean per-step training reward since the previous evaluation (NaN before any step)."""
    fraction_of_oracle: float
    """Mean over the evaluation profiles of the policy's utility / the oracle's."""
    min_fraction_of_oracle: float
    """The worst evaluation profile's fraction."""


@dataclass(frozen=True)
class TrainReport:
    """What :func:`train` did and wrote."""

    model_path: Path
    metadata_path: Path
    curve_csv: Path
    curve_png: Path
    timesteps: int
    """Timesteps actually trained."""
    wall_s: float
    fraction_of_oracle: float
    """The saved (best) network's mean fraction of the oracle on the evaluation profiles."""
    per_profile_fraction: Dict[str, float]
    reached_target: bool
    stop_reason: str
    """``"target"``, ``"hook"``, ``"max_seconds"`` or ``"timesteps"``."""
    best_timesteps: int
    """Timesteps at which the saved network was evaluated."""
    wall_s_to_target: Optional[float]
    """Wall seconds when the target was first reached (None if never)."""
    curve: Tuple[EvalPoint, ...] = field(repr=False, default=())
    metadata: Dict[str, Any] = field(repr=False, default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------
def held_out_random_profiles(count: int, max_threads: int = 32, interval_s: float = 1.0) -> List[Tuple[str, Profile]]:
    """``count`` random profiles from a seed stream no training environment uses.

    Bottlenecks cycle read, net, write so every kind is represented. Each profile is drawn with
    :meth:`Profile.random` from ``default_rng([EVAL_PROFILE_SEED, i])`` until its bottleneck is
    the wanted one.
    """
    out: List[Tuple[str, Profile]] = []
    stages = ("read", "net", "write")
    for i in range(count):
        want = stages[i % 3]
        rng = np.random.default_rng([EVAL_PROFILE_SEED, i])
        while True:
            p = Profile.random(rng, max_threads=max_threads, interval_s=interval_s)
            if p.bottleneck == want:
                break
        out.append((f"random{i}-{want}", p))
    return out


def bottleneck_profiles(max_threads: int = 32, noise: float = 0.03) -> List[Tuple[str, Profile]]:
    """Three hand-written paths, one per bottleneck, for reports and benchmarks.

    They are not drawn from :meth:`Profile.random` and no training run evaluates on them by
    default, so they are held out from both the training distribution's seeds and model selection.
    Rates in MB/s (per thread, stage bandwidth); 512 MiB staging buffers.

    * ``read-bound``: source disk 40 per reader up to 400; network 150/1500; destination 120/1200.
    * ``net-bound``: 75 per TCP connection up to 1200 (~10 Gbit/s); disks 250/2500 and 200/2000.
    * ``write-bound``: destination disk 30 per writer up to 600; source 300/3000; network 400/4000.
    """
    mb = 1e6

    def prof(r: Tuple[float, float], n: Tuple[float, float], w: Tuple[float, float]) -> Profile:
        return Profile(read=StageProfile(r[0] * mb, r[1] * mb), net=StageProfile(n[0] * mb, n[1] * mb),
                       write=StageProfile(w[0] * mb, w[1] * mb), sender_buffer=512 * 2**20,
                       receiver_buffer=512 * 2**20, max_threads=max_threads, noise=noise,
                       meta={"name": "bottleneck_profiles"})

    return [
        ("read-bound", prof((40, 400), (150, 1500), (120, 1200))),
        ("net-bound", prof((250, 2500), (75, 1200), (200, 2000))),
        ("write-bound", prof((300, 3000), (400, 4000), (30, 600))),
    ]


def evaluate(
    policy: Any,
    profiles: Sequence[Tuple[str, Profile]],
    k: float = K_DEFAULT,
    steps: int = 60,
    seed: int = 0,
    starts: Optional[Sequence[Any]] = None,
) -> Dict[str, Any]:
    """Run ``policy`` on each profile in the simulator; fractions of the oracle's utility.

    :param starts: start triples to run each profile from (``None`` in the list: the policy's own
        start, ``"oracle"``: the profile's oracle triple); a profile's fraction is the mean over
        them. Default: the policy's own start only.
    :return: ``{"mean": float, "min": float, "per_profile": {name: fraction},
        "settled": {name: triple}, "oracle": {name: triple}}`` (``settled``: from the first start).
    """
    from automdt.simulator.oracle import evaluate_policy_in_sim, oracle

    per: Dict[str, float] = {}
    settled: Dict[str, Tuple[int, int, int]] = {}
    oracle_threads: Dict[str, Tuple[int, int, int]] = {}
    for j, (name, prof) in enumerate(profiles):
        fractions = []
        for i, start in enumerate(starts or [None]):
            if start == "oracle":
                start = oracle(prof, k=k).threads
            triple: Optional[Tuple[int, int, int]] = None
            if start is not None:
                r, n, w = (max(1, min(int(x), int(prof.max_threads))) for x in start)
                triple = (r, n, w)
            traj = evaluate_policy_in_sim(policy, prof, steps=steps, seed=seed + j, k=k, start_threads=triple)
            fractions.append(float(traj.fraction_of_oracle))
            if i == 0:
                settled[name] = tuple(int(x) for x in traj.settled_threads)  # type: ignore[assignment]
                oracle_threads[name] = tuple(int(x) for x in traj.oracle.threads)  # type: ignore[assignment]
        per[name] = float(np.mean(fractions))
    vals = np.array(list(per.values()), dtype=np.float64)
    return {
        "mean": float(vals.mean()) if vals.size else float("nan"),
        "min": float(vals.min()) if vals.size else float("nan"),
        "per_profile": per,
        "settled": settled,
        "oracle": oracle_threads,
    }


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def _out_paths(out: Union[str, os.PathLike]) -> Tuple[Path, Path, Path, Path]:
    p = Path(os.fspath(out))
    if p.suffix != ".zip":
        p = p.with_name(p.name + ".zip")
    stem = p.with_suffix("")
    return p, Path(str(p) + ".json"), stem.with_name(stem.name + ".curve.csv"), stem.with_name(stem.name + ".curve.png")


def train(
    profile: Optional[Profile],
    out: Union[str, os.PathLike],
    timesteps: Optional[int] = None,
    seed: int = 0,
    k: float = TRAINING_TASK.k,
    random_profiles: bool = TRAINING_TASK.random_profiles,
    randomize: float = TRAINING_TASK.randomize,
    random_start: bool = TRAINING_TASK.random_start,
    noise: Optional[float] = TRAINING_TASK.noise,
    progress: bool = True,
    target_fraction: Optional[float] = 0.95,
    max_seconds: Optional[float] = None,
    num_envs: Optional[int] = None,
    config: Optional[PPOConfig] = None,
    eval_every: Optional[int] = None,
    eval_profiles: Optional[Sequence[Tuple[str, Profile]]] = None,
    eval_steps: int = 60,
    n_eval_profiles: int = 12,
    init_from: Optional[Union[str, os.PathLike]] = None,
    select_from: float = 0.0,
    changes: Any = None,
    tensorboard_log: Optional[Union[str, os.PathLike]] = None,
    eval_hook: Optional[Any] = None,
    cold_start: bool = True,
    eval_starts: Optional[Sequence[Any]] = None,
) -> TrainReport:
    """Train a PPO policy in the simulator and write it with its metadata and learning curve.

    The steps: the seeded model (:func:`make_model`), ``model.learn`` with the callbacks of
    :mod:`automdt.agents.callbacks` (evaluation with a stop-at-target child, TensorBoard, hook,
    wall-time limit, entropy annealing, progress bar), the kept network written with its numpy
    weights, then :func:`training_metadata` through
    :func:`automdt.agents.ppo.write_policy_metadata`, and the learning curve.

    :param profile: the path profile to train on; ``None``: :meth:`Profile.default`. With
        ``random_profiles`` only its ``max_threads`` and ``interval_s`` are used.
    :param out: the policy file (``.zip`` is appended if missing).
    :param timesteps: training budget; ``None``: :data:`DEFAULT_TIMESTEPS` (one profile) or
        :data:`DEFAULT_TIMESTEPS_RANDOM` (random profiles). Early stopping may end it sooner.
    :param seed: seeds python, numpy, torch, the environments and PPO.
    :param k, random_profiles, randomize, random_start, noise, changes: the simulated environments
        (:class:`EnvSettings`, whose fields they are, documents each).
    :param progress: show a rich progress bar.
    :param target_fraction: stop once the evaluation reaches this fraction of the oracle's
        utility (mean over the evaluation profiles); ``None``: train the whole budget.
    :param max_seconds: stop after this much wall time (makes the result timing-dependent).
    :param num_envs: override of ``config.num_envs``.
    :param config: PPO hyperparameters (:class:`PPOConfig`).
    :param eval_every: timesteps between evaluations; default: 4 rollouts (one profile) or
        12 rollouts (random profiles).
    :param eval_profiles: ``(name, profile)`` pairs to evaluate on; default: the training profile,
        or :func:`held_out_random_profiles` (``n_eval_profiles``) with ``random_profiles``.
    :param eval_steps: control intervals per evaluation episode (from the policy's start triple).
    :param n_eval_profiles: number of held-out random profiles for ``random_profiles``.
    :param init_from: start from this policy file's network (e.g. ``"default"`` to fine-tune the
        shipped general policy on a fitted profile) instead of a random one; its network shape
        and ``frame_stack`` must match ``config``. The PPO optimiser state starts afresh.
    :param select_from: keep (and stop early on) only networks evaluated after this fraction of
        ``timesteps`` (earlier ones are still evaluated and drawn in the curve). With ``anneal``,
        e.g. 0.75 keeps the choice among the settled late networks: an early network can score
        well on the evaluation profiles while its high learning rate and entropy bonus still
        leave it wavering between two thread counts.
    :param tensorboard_log: write SB3's TensorBoard logs (``train/*``, ``time/*``) to a new
        ``PPO_<n>`` run directory under this folder, plus every evaluation as
        ``eval/fraction_of_oracle``, ``eval/min_fraction_of_oracle`` and ``eval/mean_step_reward``
        (:class:`automdt.agents.callbacks.TensorBoardEvalLogger`).
    :param eval_hook: called as ``eval_hook(timesteps, fraction_of_oracle)`` after every
        evaluation; a true return stops training (stop reason ``"hook"``; e.g. Optuna pruning).
    :param cold_start: with ``random_profiles``, choose the policy's cold start in the simulator
        (:func:`automdt.agents.cold_start.choose_cold_start`, a search in the simulator) and record it as
        the metadata's ``start``; a policy trained on one profile starts at its oracle triple.
    :param eval_starts: the start triples of every evaluation (:func:`evaluate`'s ``starts``);
        default: the policy's own start only.
    """
    cfg = config or PPOConfig()
    if num_envs is not None:
        cfg = cfg.replace(num_envs=int(num_envs))
    env = EnvSettings(k=k, random_profiles=random_profiles, randomize=randomize, random_start=random_start,
                      noise=noise, changes=changes)
    if profile is None:
        profile = Profile.default()
    timesteps = _checked_budget(timesteps, random_profiles, select_from, target_fraction)
    if eval_every is None:
        eval_every = cfg.num_envs * cfg.n_steps * (12 if random_profiles else 4)
    if eval_profiles is None:
        eval_profiles = (held_out_random_profiles(n_eval_profiles, profile.max_threads, profile.interval_s)
                         if random_profiles else [("train", profile)])
    eval_profiles = list(eval_profiles)
    model_path, meta_path, csv_path, png_path = _out_paths(out)
    model_path.parent.mkdir(parents=True, exist_ok=True)

    score = functools.partial(evaluate, profiles=eval_profiles, k=env.k, steps=eval_steps, seed=EVAL_SEED,
                              starts=eval_starts)
    run = _learn(profile, env, cfg, seed, init_from, timesteps, score, eval_every=eval_every,
                 select_from=select_from, target_fraction=target_fraction, max_seconds=max_seconds,
                 progress=progress, tensorboard_log=tensorboard_log, eval_hook=eval_hook)
    model, evals = run.model, run.evals

    weight_names = _save_network(run, model_path)
    start = _policy_start(profile, env.k, random_profiles, cold_start, model.policy, cfg)
    meta = training_metadata(
        profile, env, cfg, seed=seed, start=start, weight_names=weight_names, init_from=init_from,
        init_sha256=None if run.init is None else run.init.metadata.get("sha256"), timesteps=int(model.num_timesteps),
        timesteps_budget=timesteps, evals=evals, wall_s=run.wall_s, stop_reason=run.stop_reason,
        target_fraction=target_fraction, select_from=select_from, eval_profiles=eval_profiles, eval_steps=eval_steps,
        model_sha256=ppo_mod.sha256_file(model_path),
    )
    ppo_mod.write_policy_metadata(model_path, meta)
    _write_curve(evals.curve, csv_path, png_path, target_fraction,
                 title=("random profiles" if random_profiles else "one profile") + f", seed {seed}")
    if run.tensorboard is not None:
        run.tensorboard.close()
    model.get_env().close()
    assert evals.best_eval is not None
    return TrainReport(
        model_path=model_path, metadata_path=meta_path, curve_csv=csv_path, curve_png=png_path,
        timesteps=int(model.num_timesteps), wall_s=run.wall_s, fraction_of_oracle=float(evals.best_fraction),
        per_profile_fraction=dict(evals.best_eval["per_profile"]),
        reached_target=target_fraction is not None and evals.best_fraction >= target_fraction,
        stop_reason=run.stop_reason, best_timesteps=int(evals.best_timesteps), wall_s_to_target=evals.target_wall_s,
        curve=tuple(evals.curve), metadata=meta,
    )


@dataclass(frozen=True)
class _Learned:
    """What :func:`_learn` hands to the writing steps of :func:`train`."""

    model: Any
    """The SB3 ``PPO`` model after ``learn`` (its network is the last one, not yet the kept one)."""
    init: Any
    """The :class:`~automdt.agents.ppo.PPOPolicy` training started from (None: a random network)."""
    evals: Any
    """The :class:`automdt.agents.callbacks.OracleEvalCallback`: the kept network and the curve."""
    tensorboard: Any
    """The TensorBoard logger (None without ``tensorboard_log``); closed after the curve is written."""
    wall_s: float
    stop_reason: str
    """``"target"``, ``"hook"``, ``"max_seconds"`` or ``"timesteps"``."""


def _learn(profile: Profile, env: EnvSettings, cfg: PPOConfig, seed: int,
           init_from: Optional[Union[str, os.PathLike]], timesteps: int, score: Any, *, eval_every: int,
           select_from: float, target_fraction: Optional[float], max_seconds: Optional[float], progress: bool,
           tensorboard_log: Optional[Union[str, os.PathLike]], eval_hook: Optional[Any]) -> _Learned:
    """The seeded model (:func:`make_model`) trained for ``timesteps`` with the callbacks: evaluation
    by ``score`` with its children (:func:`_eval_callback`), the wall-time limit, entropy annealing
    and the progress bar. Torch's thread count is restored afterwards, however training ends."""
    import torch as th
    from stable_baselines3.common.callbacks import CallbackList

    from automdt.agents import callbacks as cbs

    old_threads = th.get_num_threads()
    bar = None
    try:
        model, init = make_model(profile, env, cfg, seed, init_from)
        started = time.perf_counter()
        evals, tensorboard = _eval_callback(score, eval_policy_metadata(profile, cfg), eval_every,
                                            select_from * timesteps, started, target_fraction, tensorboard_log,
                                            eval_hook)
        wall = None if max_seconds is None else cbs.StopTrainingOnWallTime(max_seconds, started)
        anneal = cbs.AnnealEntropy(cfg.ent_coef, timesteps) if cfg.anneal else None
        bar = cbs.RichProgressCallback(timesteps, evals) if progress else None
        model.learn(total_timesteps=timesteps, progress_bar=False,
                    callback=CallbackList([c for c in (evals, wall, anneal, bar) if c is not None]))
        timed_out = wall is not None and wall.stopped
        evals.finish(model.num_timesteps, ran_to_budget=evals.stop_reason is None and not timed_out)
    finally:
        if bar is not None:
            bar.close()
        th.set_num_threads(old_threads)
    wall_s = time.perf_counter() - started
    stop_reason = evals.stop_reason or ("max_seconds" if timed_out else "timesteps")
    return _Learned(model=model, init=init, evals=evals, tensorboard=tensorboard, wall_s=wall_s,
                    stop_reason=stop_reason)


def _save_network(run: _Learned, model_path: Path) -> List[str]:
    """Write the kept network (the best one evaluated) to ``model_path`` as an SB3 zip with its
    numpy weights, mode 0644; returns the weights' names."""
    from automdt.agents import ppo_sb3

    run.model.policy.load_state_dict(run.evals.best_state)
    run.model.save(model_path)
    weight_names = ppo_sb3.write_numpy_weights(model_path, run.model.policy)
    os.chmod(model_path, 0o644)
    return weight_names


def make_model(profile: Profile, env: EnvSettings, config: PPOConfig, seed: int,
               init_from: Optional[Union[str, os.PathLike]] = None) -> Tuple[Any, Optional[Any]]:
    """The seeded SB3 ``PPO`` model on ``env``'s environments, and the policy it starts from.

    Everything random in a training run is seeded here, in this order (the order is part of the
    result): torch's thread count (``config.torch_threads``, left set for training), python
    ``random``, numpy and torch, the environments (env i gets ``seed + i`` at its first reset, SB3
    ``VecEnv`` semantics), PPO; then ``init_from``'s network is loaded (building it draws from
    torch's generator). Evaluations are seeded by :data:`EVAL_SEED` and never touch the global
    generators.

    :return: ``(model, init)``: ``init`` is the :class:`~automdt.agents.ppo.PPOPolicy` of
        ``init_from`` (None without it).
    :raises ValueError: ``init_from``'s network or input pipeline does not match ``config``.
    """
    import torch as th
    from stable_baselines3 import PPO
    from stable_baselines3.common.utils import set_random_seed

    from automdt.agents.callbacks import silence_logger

    th.set_num_threads(config.torch_threads)
    set_random_seed(seed)  # python `random`, numpy global, torch
    train_env = env.make_vec_env(profile, config, seed)
    model = PPO(
        "MlpPolicy", train_env,
        n_steps=config.n_steps, batch_size=config.batch_size, n_epochs=config.n_epochs,
        learning_rate=(_linear(config.learning_rate, 0.1 * config.learning_rate) if config.anneal
                       else config.learning_rate),
        gamma=config.gamma, gae_lambda=config.gae_lambda,
        clip_range=config.clip_range, ent_coef=config.ent_coef, vf_coef=config.vf_coef,
        max_grad_norm=config.max_grad_norm,
        policy_kwargs={"net_arch": config.policy_kwargs()["net_arch"],
                       "activation_fn": getattr(th.nn, config.activation)},
        seed=seed, device="cpu", verbose=0,
    )
    silence_logger(model)  # the learning curve is written by this module instead
    if init_from is None:
        return model, None
    init = ppo_mod.load_policy(init_from)
    if (init.frame_stack != config.frame_stack or init.input_features != tuple(config.features)
            or init.action_head != config.action_head):
        raise ValueError(f"{init.path}: frame_stack {init.frame_stack}, features {list(init.input_features)} and "
                         f"action head {init.action_head!r} do not match the config's {config.frame_stack}, "
                         f"{list(config.features)} and {config.action_head!r}")
    try:
        model.policy.load_state_dict(init.network.state_dict(), strict=True)
    except RuntimeError as e:
        raise ValueError(f"{init.path}: network does not match config (net_arch {list(config.net_arch)}): "
                         f"{str(e).splitlines()[0]}") from None
    return model, init


def shipped_config() -> "PPOConfig":
    """Hyperparameters of the shipped general policy: :class:`PPOConfig`'s single-profile defaults
    (128 batched envs x 32 steps, minibatch 1024, 5 epochs, 64x64 tanh networks) plus the lines
    below (``scripts/train_default_policy.py`` trains the shipped PPO network with it, and
    :func:`profile_settings` fine-tunes that network for one profile with it).

    The action head (``target``): each stage's next count is chosen among targets anchored on
    what the stages measured (hold, -1, +1, the threads its flow needs, the threads it needs to
    carry its neighbour's flow, each +1, double, x4, the bound, half): any count in one step, the
    exact one a single choice. A head of absolute counts (1..32, with or without +-1) ramps as
    fast, but a categorical over 32 counts lands near the count a stage needs, not on it.

    Why the training reward differs from the scored one (k = 1.02): the reward is the noise-free
    steady-state utility of the triple just chosen (``reward="steady"``), so a full buffer cannot
    hide a stage cut below its need (the measured utility stays high until the buffer drains),
    and neither lumps of chunks nor capacity noise blur what one thread is worth; with k = 1.02
    one surplus thread costs ~0.7% of the utility, so the training base is 1.10, and a cost per
    changed stage (``change_penalty``) stops swapping between two counts. Trained on the measured
    utility, a policy ramps as fast but may hold a stage below its need after a wide start, while
    the buffer that start filled hides the shortfall. Selection and every evaluation still use the
    measured utility at k = 1.02.

    What the episodes look like: the engine's chunk effects (``chunk_range``: a chunk is 0.5% to
    60% of the slowest stage's per-thread interval; the lumps, the bytes of threads that were cut,
    the slots busy threads hold), half of them cold starts (1-16 threads, empty buffers), a fifth
    random, and 30% with the sender buffer 70-100% full and random threads (a drain to see coming:
    a full buffer says an upstream stage was ahead, not that it still is).
    """
    return PPOConfig(
        frame_stack=8,  # eight intervals of history: a probe, its answer and some noise averaging
        features=("noise_level", "need", "spare", "drain"),  # what each stage needs, what a buffer loses
        episode_steps=60,  # more of each episode spent holding the settled triple
        gamma=0.8,  # a useful move pays off at once; a short horizon keeps the advantages clean
        anneal=True,  # lr 1e-3 -> 1e-4 and entropy bonus 0.01 -> 0 over the budget
        reward="steady",  # training only: the steady-state utility of the chosen triple (no buffer masking)
        reward_k=1.10,  # training only: a surplus thread costs ~10% of its stage's term
        change_penalty=0.03,  # training only: per stage whose count an action changes
        action_head="target",
        chunk_range=(0.005, 0.6),
        start_mix=(0.5, 0.2, 0.3),
    )


def profile_settings() -> Dict[str, Any]:
    """The :func:`train` arguments that fine-tune the shipped PPO network for one profile
    (``init_from="default"``, with its :func:`shipped_config`), judged from
    :data:`PROFILE_EVAL_STARTS`; the experiments' ``ppo-own`` label and ``bench_train.py`` use it.
    (``automdt train --profile`` trains a tuned policy instead: :mod:`automdt.agents.tuned_training`.)
    Where the shipped network already reaches the target on the profile, training stops at its
    first evaluation."""
    return {"config": shipped_config(), "init_from": "default", "eval_starts": PROFILE_EVAL_STARTS}


def eval_policy_metadata(profile: Profile, config: PPOConfig) -> Dict[str, Any]:
    """The metadata of the numpy :class:`~automdt.agents.ppo.PPOPolicy` run on the network during
    training (evaluations, cold start): thread bound, input pipeline, action head."""
    return {"max_threads": profile.max_threads, "frame_stack": config.frame_stack, "features": list(config.features),
            "policy_kwargs": config.policy_kwargs(), "start_threads": [1, 1, 1], "action_head": config.action_head}


def training_metadata(
    profile: Profile, env: EnvSettings, config: PPOConfig, *, seed: int, start: Dict[str, Any],
    weight_names: Sequence[str], init_from: Optional[Union[str, os.PathLike]], init_sha256: Optional[str],
    timesteps: int, timesteps_budget: int, evals: Any, wall_s: float, stop_reason: str,
    target_fraction: Optional[float], select_from: float, eval_profiles: Sequence[Tuple[str, Profile]],
    eval_steps: int, model_sha256: str,
) -> Dict[str, Any]:
    """The metadata sidecar of a trained policy (format :data:`automdt.agents.ppo.POLICY_FORMAT`):
    what loading checks (spaces, input pipeline, network, numpy weights, sha256), how it was
    trained (env settings, profile, seed, budget, hyperparameters, versions) and how well (the kept
    network's evaluation, from ``evals``, an :class:`automdt.agents.callbacks.OracleEvalCallback`)."""
    from automdt import __version__
    from automdt.agents import ppo_sb3
    from automdt.simulator import env as sim_env

    obs_space, act_space = ppo_sb3.simulator_spaces(config.frame_stack, config.features, config.action_head,
                                                    profile.max_threads)
    best = evals.best_eval
    return {
        "format": ppo_mod.POLICY_FORMAT,
        "algorithm": "PPO",
        "env_id": sim_env.ENV_ID,
        "simulator_version": __version__,
        "observation_space": ppo_sb3.space_to_json(obs_space),
        "action_space": ppo_sb3.space_to_json(act_space),
        "observation_names": list(sim_env.OBS_NAMES),
        "action_head": config.action_head,
        "action_names": action_names(config.action_head, profile.max_threads),
        "policy_kwargs": config.policy_kwargs(),
        "frame_stack": int(config.frame_stack),
        "features": list(config.features),
        "start_threads": list(start["threads"]),
        "start": start,
        "numpy_weights": ppo_sb3.numpy_weights_metadata(weight_names),
        "k": float(env.k),
        "max_threads": int(profile.max_threads),
        "interval_s": float(profile.interval_s),
        "random_profiles": bool(env.random_profiles),
        "randomize": float(env.randomize),
        "random_start": bool(env.random_start),
        "changes": None if env.changes is None else env.changes.to_dict(),
        "noise": env.noise,
        "profile": None if env.random_profiles else profile.to_dict(include_samples=False),
        "seed": int(seed),
        "init_from": None if init_from is None else str(init_from),
        "init_from_sha256": init_sha256,
        "timesteps": timesteps,
        "timesteps_budget": timesteps_budget,
        "best_timesteps": int(evals.best_timesteps),
        "wall_s": round(wall_s, 3),
        "wall_s_to_target": None if evals.target_wall_s is None else round(evals.target_wall_s, 3),
        "stop_reason": stop_reason,
        "target_fraction": target_fraction,
        "select_from": float(select_from),
        "fraction_of_oracle": float(evals.best_fraction),
        "min_fraction_of_oracle": float(best["min"]),
        "per_profile_fraction": best["per_profile"],
        "eval_profiles": {name: p.to_dict(include_samples=False) for name, p in eval_profiles},
        "eval_steps": int(eval_steps),
        "hyperparameters": {**asdict(config), "net_arch": list(config.net_arch), "features": list(config.features),
                            "chunk_range": None if config.chunk_range is None else list(config.chunk_range),
                            "start_mix": None if config.start_mix is None else list(config.start_mix)},
        "versions": _versions(),
        "sha256": model_sha256,
    }


def _linear(start: float, end: float) -> Any:
    """SB3 schedule: ``start`` at the beginning (progress_remaining 1) to ``end`` at the end."""

    def schedule(progress_remaining: float) -> float:
        return end + (start - end) * progress_remaining

    return schedule


def _checked_budget(timesteps: Optional[int], random_profiles: bool, select_from: float,
                    target_fraction: Optional[float]) -> int:
    """The timestep budget (:data:`DEFAULT_TIMESTEPS` or :data:`DEFAULT_TIMESTEPS_RANDOM` when
    None), after checking it and the stopping rules (:class:`ValueError`, one line)."""
    if timesteps is None:
        timesteps = DEFAULT_TIMESTEPS_RANDOM if random_profiles else DEFAULT_TIMESTEPS
    if timesteps < 1:
        raise ValueError(f"timesteps must be >= 1, got {timesteps}")
    if not 0.0 <= select_from < 1.0:
        raise ValueError(f"select_from is a fraction of the budget in [0, 1), got {select_from}")
    if target_fraction is not None and not 0.0 < target_fraction <= 1.5:
        raise ValueError(f"target_fraction is a fraction of the oracle's utility (e.g. 0.95), got {target_fraction}")
    return int(timesteps)


def _eval_callback(score: Any, policy_metadata: Dict[str, Any], eval_every: int, select_from: float,
                   started: float, target_fraction: Optional[float],
                   tensorboard_log: Optional[Union[str, os.PathLike]], eval_hook: Optional[Any]) -> Tuple[Any, Any]:
    """:class:`automdt.agents.callbacks.OracleEvalCallback` with its children: the target stop on
    a new best, TensorBoard then the hook after every evaluation. Returns it and the TensorBoard
    logger (None without ``tensorboard_log``)."""
    from stable_baselines3.common.callbacks import CallbackList

    from automdt.agents import callbacks as cbs

    tensorboard = None if tensorboard_log is None else cbs.TensorBoardEvalLogger(tensorboard_log)
    after_eval = [c for c in (tensorboard, None if eval_hook is None else cbs.EvalHookCallback(eval_hook))
                  if c is not None]
    evals = cbs.OracleEvalCallback(
        score, policy_metadata, eval_every, select_from=select_from, started=started,
        callback_on_new_best=None if target_fraction is None else cbs.StopTrainingOnOracleFraction(target_fraction),
        callback_after_eval=CallbackList(after_eval) if after_eval else None,
    )
    return evals, tensorboard


def _policy_start(profile: Profile, k: float, random_profiles: bool, cold_start: bool, network: Any,
                  config: PPOConfig) -> Dict[str, Any]:
    """The metadata's ``start``: a policy trained on one profile starts at that profile's oracle
    triple (:func:`automdt.simulator.oracle.oracle`); a general one at the cold start chosen in the
    simulator (:func:`automdt.agents.cold_start.choose_cold_start`, with ``cold_start``) or at
    (1, 1, 1)."""
    if random_profiles and cold_start:
        from automdt.agents.cold_start import choose_cold_start

        return choose_cold_start(ppo_mod.PPOPolicy(network, deterministic=True,
                                                   metadata=eval_policy_metadata(profile, config)))
    if random_profiles:
        return {"threads": [1, 1, 1], "source": "policy"}
    from automdt.simulator.oracle import oracle

    return {"threads": [int(x) for x in oracle(profile, k).threads], "source": "profile"}


def _versions() -> Dict[str, str]:
    import gymnasium
    import stable_baselines3
    import torch

    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "stable_baselines3": stable_baselines3.__version__,
        "gymnasium": gymnasium.__version__,
    }


def _write_curve(curve: Sequence[EvalPoint], csv_path: Path, png_path: Path, target: Optional[float],
                 title: str) -> Any:
    """Write the learning curve's CSV and PNG; returns the matplotlib figure. A curve of one
    evaluation (training stopped at once, on target) is drawn from 0 steps with a note saying so."""
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["timesteps", "wall_s", "mean_reward", "fraction_of_oracle", "min_fraction_of_oracle"])
        for p in curve:
            w.writerow([p.timesteps, f"{p.wall_s:.3f}", f"{p.mean_reward:.6f}",
                        f"{p.fraction_of_oracle:.6f}", f"{p.min_fraction_of_oracle:.6f}"])

    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.6), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    ts = [p.timesteps for p in curve]
    few = len(curve) <= 1  # training stopped at its first evaluation: a point, not a curve
    ax.plot(ts, [p.fraction_of_oracle for p in curve], marker="o" if few else ".", markersize=8 if few else 6,
            label="mean fraction of oracle")
    if any(p.min_fraction_of_oracle != p.fraction_of_oracle for p in curve):
        ax.plot(ts, [p.min_fraction_of_oracle for p in curve], linestyle="--", marker="v" if few else None,
                label="worst profile")
    if target is not None:
        ax.axhline(target, color="grey", linewidth=0.8, linestyle=":", label=f"target {target:g}")
    if few:
        # one dot on an axis matplotlib centres around it says nothing: start the axis at 0 steps
        # and say in words why there is no curve
        ax.set_xlim(0, max(ts[0] if ts else 0, 1) * 1.25)
        if curve:
            p0 = curve[0]
            why = (f"training stopped at its first evaluation ({p0.timesteps} steps):\n"
                   f"{p0.fraction_of_oracle:.3f} of the oracle" +
                   (f", target {target:g} reached" if target is not None and p0.fraction_of_oracle >= target else ""))
        else:
            why = "no evaluation ran: no curve"
        ax.text(0.03, 0.05, why, transform=ax.transAxes, fontsize="small", va="bottom",
                bbox={"facecolor": "white", "edgecolor": "grey", "alpha": 0.9})
    ax.set_xlabel("timesteps")
    ax.set_ylabel("utility / oracle utility")
    ax.set_ylim(0.0, 1.05)
    ax.set_title(f"PPO learning curve ({title})")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(png_path)
    return fig
