"""The shield in training: a Gymnasium wrapper that puts :class:`~automdt.agents.shield.Shield`
between a policy's actions and the simulated transfer.

The same :class:`Shield` object decides in training and in a transfer: here the counts an action
means (:meth:`automdt.simulator.env.BufferSimEnv.threads_for`) go through
:meth:`Shield.filter` with the last observation, as :meth:`Shield.act` does with a policy's
choice on the live engine; ``info["shield"]`` says when the shield took over. This module imports
gymnasium; the transfer path imports :mod:`automdt.agents.shield` only.
"""
from __future__ import annotations

from typing import Any

import gymnasium as gym

from automdt.agents.shield import Shield


class ShieldWrapper(gym.Wrapper):
    """Wraps a :class:`~automdt.simulator.env.BufferSimEnv` (or a wrapper of one).

    :param env: the simulated transfer.
    :param shield: the shield to use (default: a new one for the env's thread bound).
    """

    def __init__(self, env: gym.Env, shield: Shield | None = None) -> None:
        super().__init__(env)
        base: Any = env.unwrapped
        self.shield = shield if shield is not None else Shield(None, base.max_threads)
        self._obs: Any = None

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        obs, info = self.env.reset(**kwargs)
        self.shield.reset_state(self.env.unwrapped.max_threads)  # type: ignore[attr-defined]
        self._obs = info["observation"]
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        base: Any = self.env.unwrapped
        threads = self.shield.filter(self._obs, base.threads_for(action))
        obs, reward, terminated, truncated, info = base.step_threads(threads)
        info["shield"] = self.shield.note
        self._obs = info["observation"]
        return obs, reward, terminated, truncated, info
