"""stable-baselines3 ``VecEnv`` adapter over :class:`~automdt.simulator.vector.BatchedBufferSim`.

SB3 does not accept Gymnasium vector envs (SB3 issues #1608, #1568). Its convention: a finished
environment is reset within the same ``step_wait``, the returned observation is the new
episode's first one, and the finished episode's last observation is in
``infos[i]["terminal_observation"]``; time-limit ends carry ``infos[i]["TimeLimit.truncated"] =
True`` so PPO bootstraps their value. This module is the only one in the simulator that imports
stable-baselines3, and only when it is imported itself.

Example::

    from automdt.simulator.sb3 import BatchedSimVecEnv
    from stable_baselines3.common.vec_env import VecMonitor
    venv = VecMonitor(BatchedSimVecEnv(num_envs=64, random_profiles=True, seed=0))
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np
from gymnasium import spaces

try:
    from stable_baselines3.common.vec_env.base_vec_env import (
        VecEnv,
        VecEnvIndices,
        VecEnvStepReturn,
        VecEnvWrapper,
    )
except ImportError as e:  # pragma: no cover - exercised only without SB3
    raise ImportError(
        "automdt.simulator.sb3 needs stable-baselines3; run `pip install stable-baselines3==2.9.2`"
    ) from e

from automdt.simulator.contract import feature_dim
from automdt.simulator.env import make_observation_space
from automdt.simulator.pipeline import PolicyInput
from automdt.simulator.vector import BatchedBufferSim

__all__ = ["BatchedSimVecEnv", "ControllerVecEnv", "PolicyInputVecEnv", "policy_observation_space"]


class BatchedSimVecEnv(VecEnv):
    """SB3 ``VecEnv`` running :class:`BatchedBufferSim` (same-step autoreset, SB3 semantics).

    :param num_envs: number of environments (ignored when ``sim`` is given).
    :param sim: an existing :class:`BatchedBufferSim` (must have ``autoreset=True``); else one is
        built from ``num_envs`` and ``sim_kwargs``.
    :param info_keywords: per-env metrics to copy into each info dict (from ``threads``,
        ``throughput_bps``, ``buffer_fill``, ``utility``); empty by default because building
        dicts for thousands of envs per step is the costliest part of the adapter.
    :param sim_kwargs: arguments of :class:`BatchedBufferSim` (``profile``, ``k``,
        ``episode_steps``, ``randomize``, ``random_profiles``, ``random_start``, ``noise``,
        ``seed``, ...).
    """

    def __init__(
        self,
        num_envs: int = 1,
        sim: BatchedBufferSim | None = None,
        info_keywords: Sequence[str] = (),
        **sim_kwargs: Any,
    ) -> None:
        if sim is None:
            sim = BatchedBufferSim(num_envs, autoreset=True, **sim_kwargs)
        else:
            assert not sim_kwargs, "pass either sim or its keyword arguments, not both"
            assert sim.autoreset, "BatchedSimVecEnv needs a BatchedBufferSim with autoreset=True"
        self.sim = sim
        self.render_mode = None
        self.info_keywords = tuple(info_keywords)
        self._actions: np.ndarray | None = None
        super().__init__(sim.num_envs, sim.single_observation_space, sim.single_action_space)

    # ------------------------------------------------------------------ core
    def reset(self) -> np.ndarray:
        seeds = self._seeds
        seed: Any = None if all(s is None for s in seeds) else list(seeds)
        options = self._options[0] if self._options and self._options[0] else None
        obs, _ = self.sim.reset(seed=seed, options=options)
        self.reset_infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        self._reset_seeds()
        self._reset_options()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions)

    def step_wait(self) -> VecEnvStepReturn:
        assert self._actions is not None, "step_async must be called before step_wait"
        obs, reward, terminated, truncated, infos = self.sim.step(self._actions)
        self._actions = None
        dones = terminated | truncated
        out: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for key in self.info_keywords:
            vals = infos[key]
            for i in range(self.num_envs):
                out[i][key] = vals[i]
        if dones.any():
            final = infos["final_obs"]
            for i in np.flatnonzero(dones).tolist():
                out[i]["terminal_observation"] = final[i]
                out[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
        return obs, reward.astype(np.float32), dones, out

    def close(self) -> None:
        self.sim.close()

    def seed(self, seed: int | None = None) -> Sequence[int | None]:
        """Store ``seed + i`` for env ``i``; applied at the next :meth:`reset` (SB3 semantics)."""
        return super().seed(seed)

    # ------------------------------------------------------------------ attributes
    def _indices(self, indices: VecEnvIndices) -> list[int]:
        return list(self._get_indices(indices))

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Attributes shared by all environments (``render_mode``, ``profile``, ``k``, ...)."""
        if attr_name == "render_mode":
            value: Any = None
        else:
            value = getattr(self.sim, attr_name)
        return [value for _ in self._indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        idx = self._indices(indices)
        if len(idx) != self.num_envs:
            raise NotImplementedError("BatchedSimVecEnv attributes are shared; set them for all envs")
        setattr(self.sim, attr_name, value)

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None,
                   **method_kwargs: Any) -> list[Any]:
        result = getattr(self.sim, method_name)(*method_args, **method_kwargs)
        return [result for _ in self._indices(indices)]

    def env_is_wrapped(self, wrapper_class: type, indices: VecEnvIndices = None) -> list[bool]:
        return [False for _ in self._indices(indices)]

    def get_images(self) -> Sequence[np.ndarray | None]:
        return [None for _ in range(self.num_envs)]

    def _get_indices(self, indices: VecEnvIndices) -> Iterable[int]:
        if indices is None:
            return range(self.num_envs)
        if isinstance(indices, int):
            return [indices]
        return indices


def policy_observation_space(features: Sequence[str] = (), frame_stack: int = 1) -> spaces.Box:
    """The network's observation space: one frame is the simulator's encoding followed by the
    derived ``features``; with ``frame_stack`` > 1 that many frames side by side, oldest first (as
    :class:`automdt.simulator.pipeline.FrameStack`). It does not depend on the profile."""
    obs = make_observation_space()
    extra = feature_dim(features)
    if extra:
        obs = spaces.Box(low=np.concatenate([obs.low, np.zeros(extra, np.float32)]),
                         high=np.concatenate([obs.high, np.ones(extra, np.float32)]), dtype=obs.dtype)
    if frame_stack > 1:
        obs = spaces.Box(low=np.tile(obs.low, frame_stack), high=np.tile(obs.high, frame_stack), dtype=obs.dtype)
    return obs


class PolicyInputVecEnv(VecEnvWrapper):
    """The simulator's encodings through :class:`automdt.simulator.pipeline.PolicyInput` (derived
    features, frame stack): the very code :class:`automdt.agents.ppo.PPOPolicy` runs live.

    Stateful features and stacks follow each env's episodes as the live policy follows a
    transfer: a terminal observation still belongs to the old episode, the observation
    returned with ``done`` starts the new one (``VecFrameStack``'s semantics).
    """

    def __init__(self, venv: VecEnv, features: Sequence[str], max_threads: int, frame_stack: int = 1) -> None:
        self.pipeline = PolicyInput(venv.num_envs, max_threads, features, frame_stack)
        super().__init__(venv, observation_space=policy_observation_space(features, frame_stack))

    def reset(self) -> np.ndarray:
        return self.pipeline.reset(self.venv.reset())

    def step_wait(self) -> VecEnvStepReturn:
        obs, rew, done, infos = self.venv.step_wait()
        terminal = {int(i): infos[i]["terminal_observation"] for i in np.flatnonzero(done)
                    if "terminal_observation" in infos[i]}
        x, term = self.pipeline.step(obs, done, terminal)
        for i, t in term.items():
            infos[i]["terminal_observation"] = t
        return x, rew, done, infos


class ControllerVecEnv(VecEnv):
    """A ``VecEnv`` of simulated transfers stepped one by one, for a network that acts *through*
    a Python controller (a selector or a residual on a controller's proposal): the controller
    measures each interval and turns the network's action into thread counts, so the episodes
    cannot be one numpy batch.

    Subclasses implement :meth:`new_episode` (start episode ``i``; return the network's first
    input) and :meth:`step_one` (apply ``action`` to episode ``i`` for one interval; return the
    next input, the reward and whether the episode ended). Ended episodes restart within the same
    ``step_wait`` (SB3's convention, with ``terminal_observation`` and ``TimeLimit.truncated``).
    """

    def __init__(self, num_envs: int, obs_dim: int, nvec: Sequence[int]) -> None:
        super().__init__(num_envs, spaces.Box(-10.0, 10.0, (int(obs_dim),), np.float32),
                         spaces.MultiDiscrete([int(n) for n in nvec]))
        self._actions: np.ndarray = np.zeros((num_envs, len(nvec)), dtype=np.int64)

    def new_episode(self, i: int) -> np.ndarray:
        raise NotImplementedError

    def step_one(self, i: int, action: np.ndarray) -> tuple[np.ndarray, float, bool]:
        raise NotImplementedError

    def reset(self) -> np.ndarray:
        return np.stack([self.new_episode(i) for i in range(self.num_envs)]).astype(np.float32)

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        obs, rewards, dones, infos = [], [], [], []
        for i, action in enumerate(self._actions):
            o, r, done = self.step_one(i, action)
            info: dict[str, Any] = {}
            if done:
                info = {"terminal_observation": o, "TimeLimit.truncated": True}
                o = self.new_episode(i)
            obs.append(o)
            rewards.append(r)
            dones.append(done)
            infos.append(info)
        return np.stack(obs).astype(np.float32), np.asarray(rewards, dtype=np.float32), np.asarray(dones), infos

    def close(self) -> None:
        pass

    def seed(self, seed: int | None = None) -> Sequence[int | None]:
        return [None] * self.num_envs

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return [None] * self.num_envs

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        pass

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None,
                   **method_kwargs: Any) -> list[Any]:
        return [None] * self.num_envs

    def env_is_wrapped(self, wrapper_class: type, indices: VecEnvIndices = None) -> list[bool]:
        return [False] * self.num_envs
