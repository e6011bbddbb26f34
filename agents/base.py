"""The one protocol every policy implements, in the simulator and on the live engine."""
from __future__ import annotations

from typing import Optional, Protocol, runtime_checkable

from automdt.simulator.types import Observation, Triple


@runtime_checkable
class Policy(Protocol):
    """Chooses the next (read, net, write) thread counts after each control interval.

    A policy is stateful at most across one transfer (or one simulated episode): ``reset`` starts
    afresh. ``act`` is called once per interval with what was measured during it and returns the
    thread counts for the next interval, each in ``[1, max_threads]``.
    """

    name: str

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        """Start a new transfer; return the initial thread counts."""
        ...

    def act(self, obs: Observation) -> Triple:
        """Return the thread counts for the next interval."""
        ...


def clamp_triple(t, max_threads: int) -> Triple:
    """Round and clip a triple of thread counts into ``[1, max_threads]``."""
    return tuple(int(min(max(1, round(float(x))), max_threads)) for x in t)  # type: ignore[return-value]
