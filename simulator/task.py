"""The simulated task: every setting of a simulated transfer apart from its path profile.

:class:`SimTask` is the one definition of these settings and of their defaults. The single
environment (:class:`~automdt.simulator.env.BufferSimEnv`), the batched one
(:class:`~automdt.simulator.vector.BatchedBufferSim`) and their common core take one, or its
fields as keyword arguments::

    from automdt.simulator import BufferSimEnv, SimTask

    env = BufferSimEnv(profile, SimTask(episode_steps=60, random_start=False, chunk_bytes=4 << 20))
    env = BufferSimEnv(profile, episode_steps=60, random_start=False, chunk_bytes=4 << 20)  # the same

Every value is checked when the task is made (``ValueError`` naming the field), so a bad setting
fails where it is written, also under ``python -O``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from automdt.policy_contract import K_DEFAULT

MAX_NOISE = 0.5
"""Largest per-interval capacity noise (relative std) a task may ask for."""


@dataclass(frozen=True)
class SimTask:
    """What a simulated transfer is, apart from its profile (see the module docstring)."""

    k: float = K_DEFAULT
    """Utility base per thread (``sum_i t_i / k**n_i``; 1.02 as in Falcon, Marlin and AutoMDT)."""
    episode_steps: int = 30
    """Control intervals per episode (the environments truncate after them)."""
    randomize: float = 0.0
    """Relative spread of each stage's TPT and bandwidth, redrawn at each reset (uniform in
    ``[1 - s, 1 + s]``): robustness to fit errors. In ``[0, 1)``."""
    random_profiles: bool = False
    """A fresh random profile (:meth:`~automdt.simulator.profile.Profile.random`) at each reset:
    a general policy's training. Only the given profile's thread bound and interval are used."""
    random_start: bool = True
    """Random start thread counts and buffer fills; else (1, 1, 1) and empty buffers, where a
    transfer starts."""
    noise: Optional[float] = None
    """Relative std of the per-interval capacity noise, in ``[0, MAX_NOISE]``; None: the profile's own."""
    substeps: int = 1
    """Sub-steps of the buffer dynamics per interval."""
    bound_penalty: float = 0.0
    """Reward penalty per stage at the thread bound."""
    chunk_bytes: Optional[float] = None
    """Chunk size of the engine's counters (bytes; 0: fluid counters); None: the profile's
    ``meta["chunk_bytes"]``, else fluid."""
    chunk_range: Optional[Tuple[float, float]] = None
    """Per episode, a chunk of ``ratio * (slowest per-thread rate) * interval``, the ratio
    log-uniform in this range (training over the engine's chunk effects); None: ``chunk_bytes``."""
    start_mix: Optional[Tuple[float, float, float]] = None
    """Weights of cold, random and draining starts (:meth:`automdt.simulator.dynamics.SimCore._mixed_start`),
    drawn per episode; None: ``random_start`` decides."""
    changes: Any = None
    """A :class:`~automdt.simulator.changes.ProfileChanges`: the profile may change at random steps
    of an episode (a moving bottleneck); None: every episode keeps its profile."""

    def __post_init__(self) -> None:
        if not (self.k > 0):
            raise ValueError(f"k must be > 0 (the papers use 1.02), got {self.k}")
        if not (self.episode_steps >= 1):
            raise ValueError(f"episode_steps must be >= 1, got {self.episode_steps}")
        if not (0.0 <= self.randomize < 1.0):
            raise ValueError(f"randomize is a relative spread in [0, 1), got {self.randomize}")
        if not (self.noise is None or 0.0 <= self.noise <= MAX_NOISE):
            raise ValueError(f"noise is a relative std in [0, {MAX_NOISE}], got {self.noise}")
        if not (self.substeps >= 1):
            raise ValueError(f"substeps must be >= 1, got {self.substeps}")
        if not (self.bound_penalty >= 0.0):
            raise ValueError(f"bound_penalty must be >= 0, got {self.bound_penalty}")
        if not (self.chunk_bytes is None or self.chunk_bytes >= 0.0):
            raise ValueError(f"chunk_bytes must be >= 0, got {self.chunk_bytes}")
        if not (self.chunk_range is None or 0.0 < self.chunk_range[0] <= self.chunk_range[1]):
            raise ValueError(f"bad chunk_range {self.chunk_range!r}")
        mix = self.start_mix
        if mix is not None and not (len(mix) == 3 and all(x >= 0 for x in mix) and sum(mix) > 0):
            raise ValueError(f"bad start_mix {mix!r}")

    def replace(self, **changes: Any) -> "SimTask":
        """A copy with ``changes`` (field names of :class:`SimTask`; ``TypeError`` for another name)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def of(cls, task: Optional["SimTask"] = None, **settings: Any) -> "SimTask":
        """``task`` (or the defaults) with ``settings`` applied: what the environments take."""
        base = cls() if task is None else task
        return base.replace(**settings) if settings else base
