"""``automdt train --profile P``: train the learned part of a tuned policy, validate it, write it.

1. **Train** (:func:`learn`): PPO (stable-baselines3) on simulated transfers near P
   (:mod:`automdt.agents.neighbourhood`: the fit's uncertainty, noise, and in half of them a change
   after the exploration). In every interval the capacity controller proposes, the network picks
   per stage one of :data:`automdt.agents.tuned.CHOICES`, and the shield (the same object as in a
   transfer) filters the result. The reward is the interval's utility as a fraction of the oracle's
   on the path in force, counted on what reached the destination
   (:func:`automdt.agents.neighbourhood.delivered_utility`: a staging buffer filled by surplus
   threads earns nothing). The output layer starts with "capacity" ahead, so training starts from the
   default controller.
2. **Validate** (:func:`validate`): on validation paths near P drawn from a stream training never
   saw (the explored path unchanged and each change), each candidate runs under the shield beside
   the default controller with the same noise: the network, the profile's start alone, and
   nothing (the default controller itself).
3. **Choose** (:func:`choose`): the best candidate whose mean is at least the default's on the
   unchanged path and at least the default's minus :data:`GATE_TOLERANCE` on the changed ones. The
   default itself always qualifies, so a written file is never chosen worse than not training.
4. **Write** (:func:`automdt.agents.tuned.write_tuned`): the zip (numpy weights) and the sidecar
   (what it was trained on, the validation figures, the choice).
"""
from __future__ import annotations

import csv
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

from automdt.agents import neighbourhood as NB
from automdt.agents import tuned as T
from automdt.agents.families import Episode
from automdt.agents.shield import Shield
from automdt.policy_contract import K_DEFAULT, Triple
from automdt.simulator.profile import Profile

DEFAULT_TIMESTEPS = 120_000
"""Intervals of training when no budget is given (about two minutes on two cores)."""
GATE_TOLERANCE = 0.005
"""How far below the default's mean a candidate may score on the changed validation paths (their
noise; the unchanged path allows nothing)."""
VALIDATION_PER_KIND = 8
"""Validation paths of each kind (the unchanged path and every change of :data:`automdt.agents.neighbourhood.DRIFTS`)."""
VALIDATION_REPS = 2
"""Noise draws per validation path."""
VALIDATION_SEED = 0x7A11D
"""Root seed of the validation paths (training's paths come from ``seed + 1``)."""
NET_ARCH = [64, 64]


@dataclass
class Prior:
    """What the explored profile says the path needs: its optimum counts, per-thread rates and
    rate, and the band in which a network trained near it is trusted (:func:`automdt.agents.neighbourhood.trust`)."""

    threads: Triple
    tpt: List[float]
    rate: float
    trust: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, profile: Profile, k: float = K_DEFAULT) -> "Prior":
        from automdt.simulator.oracle import oracle

        best = oracle(profile, k)
        return cls(best.threads, [float(s.tpt) for s in profile.stages], float(best.throughput_bps), NB.trust(profile))

    def policy(self, actor: Any = None, start: str = "prior", max_threads: int = 32, k: float = K_DEFAULT) -> T.TunedPolicy:
        return T.TunedPolicy(self.threads, self.tpt, self.rate, actor, start=start, max_threads=max_threads, k=k,
                             trust=T.parse_trust(self.trust) if self.trust else None)


@dataclass
class Report:
    """What :func:`train_tuned` did: the file, the choice, the validation figures, the budget."""

    model_path: str
    learned: str
    validation: Dict[str, Dict[str, float]]
    timesteps: int
    wall_s: float
    stop_reason: str
    fraction_on_profile: float
    curve_csv: str
    meta: Dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------- training
def make_vec_env(new_agent: Callable[[], T.TunedPolicy], sample: Callable[[np.random.Generator], Episode],
                 num_envs: int, seed: int, k: float = K_DEFAULT, *, obs_dim: int = T.FRAME_DIM * T.FRAME_STACK,
                 choices: int = len(T.CHOICES), shadow: Optional[Callable[[int], Any]] = None) -> Any:
    """An SB3 ``VecEnv`` of ``num_envs`` simulated transfers: each episode drawn by ``sample``, each
    driven by an agent from ``new_agent`` (a :class:`~automdt.agents.tuned.TunedPolicy`, or a
    subclass with ``obs_dim`` inputs and ``choices`` per stage, whose network is the one being
    trained) under the shield.

    With ``shadow`` (a factory of a baseline policy for a thread bound), every episode runs a
    second time beside the agent's, on the same path with the same noise, driven by that baseline
    under the shield, and the reward is the interval's advantage over it (both as fractions of the
    oracle): what the network adds, with the path's difficulty taken out."""
    from automdt.simulator.env import BufferSimEnv
    from automdt.simulator.sb3 import ControllerVecEnv

    def _episode_env(ep: Episode) -> Any:
        return BufferSimEnv(ep.profile, k=k, episode_steps=NB.STEPS, random_start=False, chunk_bytes=ep.chunk_bytes)

    def _change_path(env: Any, ep: Episode, step: int) -> None:
        for at, prof in ep.events:
            if at == step:
                env.set_path(prof)

    class TunedVecEnv(ControllerVecEnv):
        def __init__(self) -> None:
            super().__init__(num_envs, obs_dim, [choices] * 3)
            self.rng = np.random.default_rng(seed)
            self.agents = [new_agent() for _ in range(num_envs)]
            self.shields = [Shield(None) for _ in range(num_envs)]
            self.envs: List[Any] = [None] * num_envs
            self.episodes: List[Any] = [None] * num_envs
            self.steps = [0] * num_envs
            self.returns = [0.0] * num_envs
            self.best: List[Dict[int, float]] = [{} for _ in range(num_envs)]
            """Per env, the oracle's utility of each profile of its episode (keyed by id while the episode holds them)."""
            self.finished: List[float] = []
            self.shadows: List[Any] = [None] * num_envs
            """Per env, the baseline's (policy, env, last observation), with ``shadow``."""

        def new_episode(self, i: int) -> np.ndarray:
            ep = sample(self.rng)
            m = ep.profile.max_threads
            env = _episode_env(ep)
            start = self.agents[i].reset(m)
            self.shields[i].reset_state(m)
            noise_seed = int(self.rng.integers(1 << 30))
            _, info = env.reset(seed=noise_seed, options={"threads": start})
            self.envs[i], self.episodes[i], self.steps[i], self.returns[i] = env, ep, 0, 0.0
            self.best[i] = {}
            if shadow is not None:
                base = Shield(shadow(m), max_threads=m)
                twin = _episode_env(ep)
                _, twin_info = twin.reset(seed=noise_seed, options={"threads": base.reset(m)})
                self.shadows[i] = [base, twin, twin_info["observation"]]
            return np.asarray(self.agents[i].observe(info["observation"]), dtype=np.float32)

        def step_one(self, i: int, action: np.ndarray) -> Tuple[np.ndarray, float, bool]:
            env, ep, agent = self.envs[i], self.episodes[i], self.agents[i]
            assert agent.obs is not None
            threads = self.shields[i].filter(agent.obs, agent.choose([int(a) for a in action]))
            _change_path(env, ep, self.steps[i])
            p = ep.profile_at(self.steps[i])
            best = self.best[i]
            if id(p) not in best:
                best[id(p)] = NB.oracle_delivered(p, k)
            _, _, _, truncated, info = env.step_threads(threads)
            r = NB.delivered_utility(info, k) / best[id(p)]
            self.returns[i] += r
            reward = r
            if shadow is not None:
                base, twin, twin_obs = self.shadows[i]
                twin_threads = base.act(twin_obs)
                _change_path(twin, ep, self.steps[i])
                _, _, _, _, twin_info = twin.step_threads(tuple(int(x) for x in twin_threads))
                self.shadows[i][2] = twin_info["observation"]
                reward = r - NB.delivered_utility(twin_info, k) / best[id(p)]
            self.steps[i] += 1
            if truncated:
                self.finished.append(self.returns[i] / self.steps[i])
            return np.asarray(agent.observe(info["observation"]), dtype=np.float32), reward, bool(truncated)

    return TunedVecEnv()


def learn(new_agent: Callable[[], T.TunedPolicy], sample: Callable[[np.random.Generator], Episode], timesteps: int,
          seed: int = 0, k: float = K_DEFAULT,
          max_seconds: Optional[float] = None, progress: bool = False, tensorboard_log: Optional[str] = None,
          curve: Optional[List[Tuple[int, float, float]]] = None, *, obs_dim: int = T.FRAME_DIM * T.FRAME_STACK,
          choices: int = len(T.CHOICES), shadow: Optional[Callable[[int], Any]] = None,
          keep_bias: float = T.KEEP_BIAS) -> Tuple[Dict[str, Any], int, str]:
    """Train the selector network of the agents ``new_agent`` makes on episodes ``sample`` draws;
    returns (its actor's float32 arrays, timesteps run, why it stopped).

    ``curve`` (if given) receives ``(timesteps, wall seconds, mean fraction of the oracle of the
    episodes finished since the last rollout)`` after every rollout; TensorBoard gets the same
    fraction as ``rollout/fraction_of_oracle``. ``obs_dim``, ``choices`` and ``shadow`` are
    :func:`make_vec_env`'s; ``keep_bias`` is the lead of ``capacity`` when training starts."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)
    num_envs = 16
    venv = make_vec_env(new_agent, sample, num_envs, seed + 1, k, obs_dim=obs_dim, choices=choices, shadow=shadow)
    model = PPO("MlpPolicy", venv, n_steps=64, batch_size=256, n_epochs=5, gamma=0.9, gae_lambda=0.9,
                learning_rate=3e-4, ent_coef=0.003, policy_kwargs={"net_arch": list(NET_ARCH)}, seed=seed,
                device="cpu", verbose=0, tensorboard_log=tensorboard_log)
    if tensorboard_log is None:
        from automdt.agents.callbacks import silence_logger

        silence_logger(model)
    with torch.no_grad():  # start from the default: "capacity" leads on every stage
        bias = model.policy.action_net.bias
        bias.zero_()
        for s in range(3):
            bias[s * choices + T.CAPACITY] = keep_bias
    t0 = time.monotonic()
    state = {"reason": "timesteps"}

    class Budget(BaseCallback):
        def _on_step(self) -> bool:
            if max_seconds is not None and time.monotonic() - t0 > max_seconds:
                state["reason"] = "max_seconds"
                return False
            return True

        def _on_rollout_end(self) -> None:
            if venv.finished:
                fraction = float(np.mean(venv.finished))
                self.logger.record("rollout/fraction_of_oracle", fraction)  # TensorBoard, with --tensorboard
                if curve is not None:
                    curve.append((self.num_timesteps, time.monotonic() - t0, fraction))
                venv.finished.clear()

    model.learn(int(timesteps), callback=Budget(), progress_bar=progress)
    arrays = {name: t.detach().cpu().numpy().astype(np.float32) for name, t in model.policy.state_dict().items()
              if name.startswith("mlp_extractor.policy_net.") or name.startswith("action_net.")}
    return arrays, int(model.num_timesteps), state["reason"]


# ---------------------------------------------------------------------------------- validation
def _shielded(policy: Any, m: int) -> Shield:
    return Shield(policy, max_threads=m)


def candidates(prior: Prior, actor: Any, m: int, k: float = K_DEFAULT) -> Dict[str, Any]:
    """The factories of the validated policies, each under the shield: ``network`` (when there is
    an actor), ``prior`` and ``none`` (the default controller)."""
    out = {"prior": lambda: _shielded(prior.policy(None, "prior", m, k), m),
           "none": lambda: _shielded(prior.policy(None, "default", m, k), m)}
    if actor is not None:
        out = {"network": lambda: _shielded(prior.policy(actor, "prior", m, k), m), **out}
    return out


def validate(profile: Profile, factories: Mapping[str, Any], k: float = K_DEFAULT,
             per_kind: int = VALIDATION_PER_KIND, reps: int = VALIDATION_REPS,
             seed: int = VALIDATION_SEED) -> Dict[str, Dict[str, float]]:
    """Per candidate: the mean fraction of the oracle over whole episodes on the unchanged path
    (``explored``), on the changed ones (``changed``), per change and over all."""
    eps = NB.validation_set(profile, per_kind, seed)
    out: Dict[str, Dict[str, float]] = {}
    for name, make in factories.items():
        by: Dict[str, List[float]] = {}
        for j, ep in enumerate(eps):
            for rep in range(reps):
                fr = NB.run_episode(make(), ep, seed=1000 * j + rep, k=k)
                by.setdefault(ep.family, []).append(float(np.mean(fr)))
        changed = [x for f, v in by.items() if f != "explored" for x in v]
        out[name] = {"explored": float(np.mean(by["explored"])), "changed": float(np.mean(changed)),
                     "all": float(np.mean([x for v in by.values() for x in v])),
                     **{f: float(np.mean(v)) for f, v in by.items() if f != "explored"}}
    return out


def choose(validation: Mapping[str, Mapping[str, float]]) -> str:
    """The candidate to write: the best overall among those at least the default (``none``) on the
    unchanged path and within :data:`GATE_TOLERANCE` of it on the changed paths."""
    ref = validation["none"]
    ok = [name for name, v in validation.items()
          if v["explored"] >= ref["explored"] and v["changed"] >= ref["changed"] - GATE_TOLERANCE]
    return max(ok, key=lambda n: validation[n]["all"])


# ---------------------------------------------------------------------------------- the command
def train_tuned(profile: Profile, out: str, *, timesteps: Optional[int] = None, seed: int = 0, k: float = K_DEFAULT,
                max_seconds: Optional[float] = None, progress: bool = False, tensorboard_log: Optional[str] = None,
                profile_path: Optional[str] = None) -> Report:
    """Train, validate, choose and write a tuned policy for ``profile`` (see the module docstring)."""
    from automdt import __version__

    t0 = time.monotonic()
    prior = Prior.of(profile, k)
    budget = DEFAULT_TIMESTEPS if timesteps is None else int(timesteps)
    curve: List[Tuple[int, float, float]] = []
    arrays, done, reason = learn(lambda: prior.policy(max_threads=profile.max_threads, k=k),
                                 lambda rng: NB.episode(profile, rng), budget, seed=seed, k=k, max_seconds=max_seconds,
                                 progress=progress, tensorboard_log=tensorboard_log, curve=curve)
    from automdt.agents.ppo import ActorMLP

    actor = ActorMLP(arrays, "Tanh", [len(T.CHOICES)] * 3, in_dim=T.FRAME_DIM * T.FRAME_STACK)
    val = validate(profile, candidates(prior, actor, profile.max_threads, k), k=k)
    learned = choose(val)
    curve_csv = os.path.splitext(out)[0] + ".curve.csv"
    with open(curve_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["timesteps", "wall_s", "fraction_of_oracle"])
        w.writerows([(t, round(s, 2), round(x, 4)) for t, s, x in curve])
    explored = (profile.meta or {}).get("explored") or {}
    meta = {
        "learned": learned,
        "prior": {"threads": list(prior.threads), "tpt": prior.tpt, "rate": prior.rate},
        "trust": prior.trust,
        "k": k, "max_threads": profile.max_threads, "frame_stack": T.FRAME_STACK, "choices": list(T.CHOICES),
        "policy_kwargs": {"net_arch": list(NET_ARCH), "activation_fn": "Tanh"},
        "trained_on": {"profile": os.path.abspath(profile_path) if profile_path else None,
                       "src": explored.get("src"), "dest": explored.get("dest"), "explored": explored.get("at"),
                       "stages": {n: s.to_dict() for n, s in zip(("read", "net", "write"), profile.stages)},
                       "interval_s": profile.interval_s, "noise": profile.noise},
        "training": {"timesteps": done, "budget": budget, "stop_reason": reason, "seed": seed,
                     "wall_s": round(time.monotonic() - t0, 1), "neighbourhood": {
                         "drift_share": NB.DRIFT_SHARE, "drifts": list(NB.DRIFTS), "min_spread": NB.MIN_SPREAD,
                         "move_range": NB.MOVE_RANGE, "far_range": list(NB.FAR_RANGE), "trust_sigmas": NB.TRUST_SIGMAS}},
        "validation": {"per_kind": VALIDATION_PER_KIND, "reps": VALIDATION_REPS, "gate_tolerance": GATE_TOLERANCE,
                       "scores": {n: {a: round(b, 4) for a, b in v.items()} for n, v in val.items()}},
        "automdt_version": __version__,
    }
    T.write_tuned(out, meta, arrays if learned == "network" else None)
    return Report(out, learned, val, done, time.monotonic() - t0, reason, val[learned]["explored"], curve_csv, meta)
