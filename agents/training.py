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

Two runs with the same arguments give the same network (the seeding is in one marked block in
:func:`train`; ``max_seconds`` is the only wall-clock-dependent input). Training uses a fixed
number of torch threads (``PPOConfig.torch_threads``) so that CPU results do not depend on the
machine's core count.
"""
from __future__ import annotations

import copy
import csv
import json
import logging
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from automdt.simulator.contract import action_names
from automdt.simulator.profile import Profile, StageProfile

log = logging.getLogger(__name__)

__all__ = [
    "PPOConfig",
    "EvalPoint",
    "TrainReport",
    "train",
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

EVAL_PROFILE_SEED = 0x5EED_E7A1
"""Root seed of :func:`held_out_random_profiles` (a stream no training env is seeded from)."""


@dataclass(frozen=True)
class PPOConfig:
    """PPO hyperparameters (stable-baselines3 names), chosen for speed on a few CPU cores.

    The network is tiny (the observation has 14 numbers, the action 3 x 5 choices), so a rollout
    of many batched environments and a few large minibatch epochs is the cheap way to spend CPU.
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
    """Entropy bonus (keeps exploring the 5 per-stage choices early on)."""
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
    """``"target"``, ``"timesteps"`` or ``"max_seconds"``."""
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
    k: float = 1.02,
    steps: int = 60,
    seed: int = 0,
) -> Dict[str, Any]:
    """Run ``policy`` on each profile in the simulator; fractions of the oracle's utility.

    :return: ``{"mean": float, "min": float, "per_profile": {name: fraction},
        "settled": {name: triple}, "oracle": {name: triple}}``.
    """
    from automdt.simulator.oracle import evaluate_policy_in_sim

    per: Dict[str, float] = {}
    settled: Dict[str, Tuple[int, int, int]] = {}
    oracle_threads: Dict[str, Tuple[int, int, int]] = {}
    for j, (name, prof) in enumerate(profiles):
        traj = evaluate_policy_in_sim(policy, prof, steps=steps, seed=seed + j, k=k)
        per[name] = float(traj.fraction_of_oracle)
        settled[name] = tuple(int(x) for x in traj.settled_threads)  # type: ignore[assignment]
        oracle_threads[name] = tuple(int(x) for x in traj.oracle.threads)  # type: ignore[assignment]
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
    k: float = 1.02,
    random_profiles: bool = False,
    randomize: float = 0.1,
    random_start: bool = False,
    noise: Optional[float] = None,
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
) -> TrainReport:
    """Train a PPO policy in the simulator and write it with its metadata and learning curve.

    :param profile: the path profile to train on; ``None``: :meth:`Profile.default`. With
        ``random_profiles`` only its ``max_threads`` and ``interval_s`` are used.
    :param out: the policy file (``.zip`` is appended if missing).
    :param timesteps: training budget; ``None``: :data:`DEFAULT_TIMESTEPS` (one profile) or
        :data:`DEFAULT_TIMESTEPS_RANDOM` (random profiles). Early stopping may end it sooner.
    :param seed: seeds python, numpy, torch, the environments and PPO.
    :param k: utility base per thread.
    :param random_profiles: a fresh random profile per episode (a general policy).
    :param randomize: relative jitter of TPT and B at each episode (robustness to fit errors).
    :param random_start: start training episodes from random thread counts and buffer fills
        instead of (1, 1, 1) and empty buffers (where a transfer, and every evaluation, starts).
    :param noise: capacity noise (relative std per interval) of the training environments;
        ``None``: each (random) profile's own. Evaluations always use the profiles' own noise.
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
    :param changes: a :class:`automdt.simulator.changes.ProfileChanges`: training episodes whose
        profile changes at random steps (a moving bottleneck, a link that halves), so the policy
        has seen a path change under it; None: every episode keeps its profile. Evaluation
        episodes never change (the oracle is defined for one profile).
    :param tensorboard_log: write SB3's TensorBoard logs (``train/*``, ``time/*``) to a new
        ``PPO_<n>`` run directory under this folder, plus every evaluation as
        ``eval/fraction_of_oracle``, ``eval/min_fraction_of_oracle`` and ``eval/mean_step_reward``.
    :param eval_hook: called as ``eval_hook(timesteps, fraction_of_oracle)`` after every
        evaluation; a true return stops training (stop reason ``"hook"``; e.g. Optuna pruning).
    :param cold_start: with ``random_profiles``, choose the policy's cold start in the simulator
        (:func:`automdt.agents.cold_start.choose_cold_start`, about 15 s) and record it as
        the metadata's ``start``; a policy trained on one profile starts at its oracle triple.
    """
    import torch as th
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.utils import set_random_seed

    import automdt
    from automdt.agents import ppo as ppo_mod
    from automdt.agents import ppo_sb3
    from automdt.simulator import env as sim_env
    from automdt.simulator.sb3 import BatchedSimVecEnv

    cfg = config or PPOConfig()
    if num_envs is not None:
        cfg = cfg.replace(num_envs=int(num_envs))
    if profile is None:
        profile = Profile.default()
    if timesteps is None:
        timesteps = DEFAULT_TIMESTEPS_RANDOM if random_profiles else DEFAULT_TIMESTEPS
    if timesteps < 1:
        raise ValueError(f"timesteps must be >= 1, got {timesteps}")
    if not 0.0 <= select_from < 1.0:
        raise ValueError(f"select_from is a fraction of the budget in [0, 1), got {select_from}")
    if target_fraction is not None and not 0.0 < target_fraction <= 1.5:
        raise ValueError(f"target_fraction is a fraction of the oracle's utility (e.g. 0.95), got {target_fraction}")
    rollout = cfg.num_envs * cfg.n_steps
    every = eval_every if eval_every is not None else rollout * (12 if random_profiles else 4)
    if eval_profiles is None:
        if random_profiles:
            eval_profiles = held_out_random_profiles(n_eval_profiles, profile.max_threads, profile.interval_s)
        else:
            eval_profiles = [("train", profile)]
    eval_profiles = list(eval_profiles)
    model_path, meta_path, csv_path, png_path = _out_paths(out)
    model_path.parent.mkdir(parents=True, exist_ok=True)

    old_threads = th.get_num_threads()
    # ---- seeding: everything random in a training run is seeded here ------------------------
    th.set_num_threads(cfg.torch_threads)
    set_random_seed(seed)  # python `random`, numpy global, torch
    venv = BatchedSimVecEnv(
        num_envs=cfg.num_envs, profile=profile, k=cfg.reward_k or k, episode_steps=cfg.episode_steps,
        randomize=randomize, random_profiles=random_profiles, random_start=random_start, noise=noise,
        seed=seed, reward=cfg.reward, surplus_penalty=cfg.surplus_penalty,
        change_penalty=cfg.change_penalty, changes=changes, chunk_range=cfg.chunk_range, start_mix=cfg.start_mix,
        action_head=cfg.action_head,
    )
    venv.seed(seed)  # env i gets seed + i at the first reset (SB3 VecEnv semantics)
    train_env: Any = venv
    if cfg.features or cfg.frame_stack > 1:  # the policy's input pipeline, as PPOPolicy runs it live
        train_env = PolicyInputVecEnv(venv, cfg.features, profile.max_threads, cfg.frame_stack)
    policy_kwargs_json = cfg.policy_kwargs()
    model = PPO(
        "MlpPolicy", train_env,
        n_steps=cfg.n_steps, batch_size=cfg.batch_size, n_epochs=cfg.n_epochs,
        learning_rate=(_linear(cfg.learning_rate, 0.1 * cfg.learning_rate) if cfg.anneal else cfg.learning_rate),
        gamma=cfg.gamma, gae_lambda=cfg.gae_lambda,
        clip_range=cfg.clip_range, ent_coef=cfg.ent_coef, vf_coef=cfg.vf_coef,
        max_grad_norm=cfg.max_grad_norm,
        policy_kwargs={"net_arch": policy_kwargs_json["net_arch"],
                       "activation_fn": getattr(th.nn, cfg.activation)},
        seed=seed, device="cpu", verbose=0,
    )
    # A logger without outputs: SB3's default one creates an empty $SB3_LOGDIR or /tmp/SB3-<time>
    # directory on every learn() (the learning curve is written by this module instead).
    model.set_logger(Logger(folder=None, output_formats=[]))
    if tensorboard_log is not None:
        from stable_baselines3.common.utils import configure_logger

        model.set_logger(configure_logger(0, os.fspath(tensorboard_log), "PPO", True))
    if init_from is not None:
        init = ppo_mod.load_policy(init_from)
        if (init.frame_stack != cfg.frame_stack or init.features != tuple(cfg.features)
                or init.action_head != cfg.action_head):
            raise ValueError(f"{init.path}: frame_stack {init.frame_stack}, features {list(init.features)} and "
                             f"action head {init.action_head!r} do not match the config's {cfg.frame_stack}, "
                             f"{list(cfg.features)} and {cfg.action_head!r}")
        try:
            model.policy.load_state_dict(init.network.state_dict(), strict=True)
        except RuntimeError as e:
            raise ValueError(f"{init.path}: network does not match config (net_arch {list(cfg.net_arch)}): "
                             f"{str(e).splitlines()[0]}") from None
    # Evaluation episodes are seeded by `eval_seed` (fixed) and never touch the global RNGs.
    eval_seed = 1_000_003
    # ------------------------------------------------------------------------------------------

    t0 = time.perf_counter()
    eval_meta = {"max_threads": profile.max_threads, "frame_stack": cfg.frame_stack, "features": list(cfg.features),
                 "policy_kwargs": policy_kwargs_json, "start_threads": [1, 1, 1], "action_head": cfg.action_head}
    curve: List[EvalPoint] = []
    state: Dict[str, Any] = {
        "best": -math.inf, "best_state": None, "best_ts": 0, "best_eval": None,
        "stop": "timesteps", "t_target": None,
    }

    prog = None
    task = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        prog = Progress(
            TextColumn("[bold]training PPO"), BarColumn(), MofNCompleteColumn(),
            TextColumn("steps"), TimeElapsedColumn(), TextColumn("{task.fields[status]}"),
        )
        task = prog.add_task("train", total=int(timesteps), status="")
        prog.start()

    def do_eval(num_timesteps: int, rewards: List[float]) -> bool:
        """Evaluate, record, keep the best; return True when training should stop."""
        # the numpy policy the transfer path runs, on a copy of the current weights
        eval_policy = ppo_mod.PPOPolicy(model.policy, deterministic=True, metadata=eval_meta)
        res = evaluate(eval_policy, eval_profiles, k=k, steps=eval_steps, seed=eval_seed)
        wall = time.perf_counter() - t0
        point = EvalPoint(num_timesteps, round(wall, 3), float(np.mean(rewards)) if rewards else float("nan"),
                          res["mean"], res["min"])
        curve.append(point)
        state["last"] = (num_timesteps, res)
        if tensorboard_log is not None:
            model.logger.record("eval/fraction_of_oracle", res["mean"])
            model.logger.record("eval/min_fraction_of_oracle", res["min"])
            if rewards:
                model.logger.record("eval/mean_step_reward", point.mean_reward)
            model.logger.dump(step=num_timesteps)
        if eval_hook is not None and eval_hook(num_timesteps, res["mean"]):
            state["stop"] = "hook"
            if num_timesteps >= select_from * timesteps and res["mean"] > state["best"]:
                state.update(best=res["mean"], best_state=copy.deepcopy(model.policy.state_dict()),
                             best_ts=num_timesteps, best_eval=res)
            return True
        if num_timesteps < select_from * timesteps:
            return False
        if res["mean"] > state["best"]:
            state.update(best=res["mean"], best_state=copy.deepcopy(model.policy.state_dict()),
                         best_ts=num_timesteps, best_eval=res)
        log.info("eval at %d steps: %.3f of the oracle (min %.3f)", num_timesteps, res["mean"], res["min"])
        if prog is not None and task is not None:
            prog.update(task, completed=min(num_timesteps, timesteps),
                        status=f"oracle fraction {res['mean']:.3f} (best {state['best']:.3f})")
        if target_fraction is not None and res["mean"] >= target_fraction:
            state["stop"], state["t_target"] = "target", wall
            return True
        return False

    class _Callback(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.next_eval = every
            self.rewards: List[float] = []

        def _on_training_start(self) -> None:
            self.stop_now = do_eval(0, [])

        def _on_step(self) -> bool:
            if self.stop_now:
                return False
            self.rewards.append(float(np.mean(self.locals["rewards"])))
            if self.num_timesteps >= self.next_eval:
                self.next_eval += every
                if do_eval(self.num_timesteps, self.rewards):
                    return False
                self.rewards = []
            if max_seconds is not None and time.perf_counter() - t0 >= max_seconds:
                state["stop"] = "max_seconds"
                return False
            return True

        def _on_rollout_end(self) -> None:
            if cfg.anneal:  # read by the PPO update that follows this rollout
                self.model.ent_coef = cfg.ent_coef * max(0.0, 1.0 - self.num_timesteps / timesteps)
            if prog is not None and task is not None:
                prog.update(task, completed=min(self.num_timesteps, timesteps))

    cb = _Callback()
    try:
        model.learn(total_timesteps=int(timesteps), callback=cb, progress_bar=False)
        if state["stop"] == "timesteps" and (not curve or curve[-1].timesteps != model.num_timesteps):
            do_eval(model.num_timesteps, cb.rewards)
    finally:
        if prog is not None:
            prog.stop()
        th.set_num_threads(old_threads)
    wall_s = time.perf_counter() - t0
    trained = int(model.num_timesteps)

    if state["best_state"] is None:  # stopped (max_seconds) before select_from: keep the last network
        if curve[-1].timesteps != model.num_timesteps:
            do_eval(model.num_timesteps, cb.rewards)
        ts_last, res_last = state["last"]
        state.update(best=res_last["mean"], best_state=copy.deepcopy(model.policy.state_dict()), best_ts=ts_last,
                     best_eval=res_last)
    model.policy.load_state_dict(state["best_state"])
    model.save(model_path)
    weight_names = ppo_sb3.write_numpy_weights(model_path, model.policy)
    os.chmod(model_path, 0o644)
    best_eval = state["best_eval"]
    reached = target_fraction is not None and state["best"] >= target_fraction

    obs_space, act_space = ppo_sb3.simulator_spaces(cfg.frame_stack, cfg.features, cfg.action_head,
                                                    profile.max_threads)
    if random_profiles and cold_start:
        from automdt.agents.cold_start import choose_cold_start

        start = choose_cold_start(ppo_mod.PPOPolicy(model.policy, deterministic=True, metadata=eval_meta))
    else:
        start = _policy_start(profile, k, random_profiles)
    meta: Dict[str, Any] = {
        "format": ppo_mod.POLICY_FORMAT,
        "algorithm": "PPO",
        "env_id": sim_env.ENV_ID,
        "simulator_version": getattr(automdt, "__version__", "unknown"),
        "observation_space": ppo_sb3.space_to_json(obs_space),
        "action_space": ppo_sb3.space_to_json(act_space),
        "observation_names": list(sim_env.OBS_NAMES),
        "action_head": cfg.action_head,
        "action_names": action_names(cfg.action_head, profile.max_threads),
        "policy_kwargs": policy_kwargs_json,
        "frame_stack": int(cfg.frame_stack),
        "features": list(cfg.features),
        "start_threads": list(start["threads"]),
        "start": start,
        "numpy_weights": ppo_sb3.numpy_weights_metadata(weight_names),
        "k": float(k),
        "max_threads": int(profile.max_threads),
        "interval_s": float(profile.interval_s),
        "random_profiles": bool(random_profiles),
        "randomize": float(randomize),
        "random_start": bool(random_start),
        "changes": None if changes is None else changes.to_dict(),
        "noise": noise,
        "profile": None if random_profiles else profile.to_dict(include_samples=False),
        "seed": int(seed),
        "init_from": None if init_from is None else str(init_from),
        "init_from_sha256": None if init_from is None else init.metadata.get("sha256"),
        "timesteps": trained,
        "timesteps_budget": int(timesteps),
        "best_timesteps": int(state["best_ts"]),
        "wall_s": round(wall_s, 3),
        "wall_s_to_target": None if state["t_target"] is None else round(state["t_target"], 3),
        "stop_reason": state["stop"],
        "target_fraction": target_fraction,
        "select_from": float(select_from),
        "fraction_of_oracle": float(state["best"]),
        "min_fraction_of_oracle": float(best_eval["min"]),
        "per_profile_fraction": best_eval["per_profile"],
        "eval_profiles": {name: p.to_dict(include_samples=False) for name, p in eval_profiles},
        "eval_steps": int(eval_steps),
        "hyperparameters": {**asdict(cfg), "net_arch": list(cfg.net_arch), "features": list(cfg.features),
                            "chunk_range": None if cfg.chunk_range is None else list(cfg.chunk_range),
                            "start_mix": None if cfg.start_mix is None else list(cfg.start_mix)},
        "versions": _versions(),
        "sha256": ppo_mod.sha256_file(model_path),
    }
    tmp = Path(str(meta_path) + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=False) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, meta_path)
    _write_curve(curve, csv_path, png_path, target_fraction,
                 title=("random profiles" if random_profiles else "one profile") + f", seed {seed}")
    if tensorboard_log is not None:
        model.logger.close()
    train_env.close()
    return TrainReport(
        model_path=model_path, metadata_path=meta_path, curve_csv=csv_path, curve_png=png_path,
        timesteps=trained, wall_s=wall_s, fraction_of_oracle=float(state["best"]),
        per_profile_fraction=dict(best_eval["per_profile"]), reached_target=bool(reached),
        stop_reason=state["stop"], best_timesteps=int(state["best_ts"]),
        wall_s_to_target=state["t_target"], curve=tuple(curve), metadata=meta,
    )


def _linear(start: float, end: float) -> Any:
    """SB3 schedule: ``start`` at the beginning (progress_remaining 1) to ``end`` at the end."""

    def schedule(progress_remaining: float) -> float:
        return end + (start - end) * progress_remaining

    return schedule


def _policy_start(profile: Profile, k: float, random_profiles: bool) -> Dict[str, Any]:
    """The metadata's ``start``: a policy trained on one profile starts at that profile's oracle
    triple (:func:`automdt.simulator.oracle.oracle`); a general one at (1, 1, 1)."""
    if random_profiles:
        return {"threads": [1, 1, 1], "source": "policy"}
    from automdt.simulator.oracle import oracle

    return {"threads": [int(x) for x in oracle(profile, k).threads], "source": "profile"}


def _policy_input_vec_env_class() -> Any:
    from stable_baselines3.common.vec_env import VecEnvWrapper

    from automdt.agents.ppo_sb3 import simulator_spaces
    from automdt.simulator.pipeline import PolicyInput

    class PolicyInputVecEnv(VecEnvWrapper):
        """The simulator's encodings through :class:`automdt.simulator.pipeline.PolicyInput` (derived
        features, frame stack): the very code :class:`automdt.agents.ppo.PPOPolicy` runs live.

        Stateful features and stacks follow each env's episodes as the live policy follows a
        transfer: a terminal observation still belongs to the old episode, the observation
        returned with ``done`` starts the new one (``VecFrameStack``'s semantics).
        """

        def __init__(self, venv: Any, features: Sequence[str], max_threads: int, frame_stack: int = 1) -> None:
            self.pipeline = PolicyInput(venv.num_envs, max_threads, features, frame_stack)
            super().__init__(venv, observation_space=simulator_spaces(frame_stack, features)[0])

        def reset(self) -> np.ndarray:
            return self.pipeline.reset(self.venv.reset())

        def step_wait(self) -> Any:
            obs, rew, done, infos = self.venv.step_wait()
            terminal = {int(i): infos[i]["terminal_observation"] for i in np.flatnonzero(done)
                        if "terminal_observation" in infos[i]}
            x, term = self.pipeline.step(obs, done, terminal)
            for i, t in term.items():
                infos[i]["terminal_observation"] = t
            return x, rew, done, infos

    return PolicyInputVecEnv


def PolicyInputVecEnv(venv: Any, features: Sequence[str], max_threads: int, frame_stack: int = 1) -> Any:
    """An SB3 ``VecEnvWrapper`` applying the policy's input pipeline (see the class above)."""
    return _policy_input_vec_env_class()(venv, features, max_threads, frame_stack)


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
                 title: str) -> None:
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
    ax.plot(ts, [p.fraction_of_oracle for p in curve], marker=".", label="mean fraction of oracle")
    if any(p.min_fraction_of_oracle != p.fraction_of_oracle for p in curve):
        ax.plot(ts, [p.min_fraction_of_oracle for p in curve], linestyle="--", label="worst profile")
    if target is not None:
        ax.axhline(target, color="grey", linewidth=0.8, linestyle=":", label=f"target {target:g}")
    ax.set_xlabel("timesteps")
    ax.set_ylabel("utility / oracle utility")
    ax.set_ylim(0.0, 1.05)
    ax.set_title(f"PPO learning curve ({title})")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(png_path)
