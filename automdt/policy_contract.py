"""The policy contract: what a policy sees (:class:`Observation`), what it returns (:data:`Triple`),
the protocol it implements (:class:`Policy`) and :func:`clamp_triple`.

This module is the seam between the policies (``automdt.agents``), the simulator
(``automdt.simulator``) and the live controller (:mod:`automdt.controller`). It uses the standard
library only, so a transfer imports neither the simulator package nor any ML framework to speak
it; ``automdt.simulator.types`` and ``automdt.agents.base`` re-export its names.

An :class:`Observation` is what a policy sees after one control interval, in physical units,
whether it comes from the simulator or from the live engines' counters. Policies normalise it
themselves (the PPO agent through :class:`automdt.simulator.pipeline.ObservationEncoder`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Protocol, Tuple, runtime_checkable

Triple = Tuple[int, int, int]
"""Thread counts (read, network, write)."""

STAGES = ("read", "net", "write")
"""The three stages, in the order of every triple."""

K_DEFAULT = 1.02
"""Thread-cost base of the utility ``sum_i t_i / K^n_i`` (AutoMDT, Marlin and Falcon use 1.02)."""


@dataclass(frozen=True)
class Observation:
    """One control interval, as measured.

    :param threads: thread counts (read, net, write) that ran during the interval (on the live
        engine: the counts the engines report, after any clamp of theirs).
    :param throughput_bps: bytes/s moved by each stage (read, net, write) during the interval.
    :param buffer_fill: fill fractions 0..1 of the (sender, receiver) staging buffers at the end
        of the interval.
    :param interval_s: length of the interval in seconds.
    :param max_threads: upper bound of every stage's thread count.
    :param loss: optional network loss ratio (TCP retransmits / segments sent) in the interval,
        0 when unknown; used by the Falcon/Marlin network utility.
    :param buffer_bytes: capacities (sender, receiver) of the staging buffers in bytes.
    :param busy_s: thread-seconds each stage (read, net, write) spent working in the interval
        (throttle sleeps included; the network's time blocked by a full receiver buffer is not
        busy), or None when unknown.
    :param wait_s: thread-seconds each stage spent waiting on a staging buffer (readers on a full
        sender buffer, the network on an empty sender or a full receiver buffer, writers on an
        empty receiver buffer), or None when unknown.
    """

    threads: Triple
    throughput_bps: Tuple[float, float, float]
    buffer_fill: Tuple[float, float]
    interval_s: float = 1.0
    max_threads: int = 32
    loss: float = 0.0
    buffer_bytes: Tuple[int, int] = (0, 0)
    busy_s: Optional[Tuple[float, float, float]] = None
    wait_s: Optional[Tuple[float, float, float]] = None
    extra: dict = field(default_factory=dict, compare=False)


@runtime_checkable
class Policy(Protocol):
    """Chooses the next (read, net, write) thread counts after each control interval.

    A policy is stateful at most across one transfer (or one simulated episode): ``reset`` starts
    afresh. ``act`` is called once per interval with what was measured during it and returns the
    thread counts for the next interval, each in ``[1, max_threads]``.

    A policy may also have ``start_from(triple)``: the controller calls it after ``reset`` when the
    transfer starts elsewhere than ``reset`` said (``--threads`` given with ``--policy``, a job's
    history), so that the policy's own state starts there too.
    """

    name: str

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        """Start a new transfer; return the initial thread counts."""
        ...

    def act(self, obs: Observation) -> Triple:
        """Return the thread counts for the next interval."""
        ...


def clamp_triple(t: Iterable[Any], max_threads: int) -> Triple:
    """Round and clip a triple of thread counts into ``[1, max_threads]``."""
    r, n, w = (int(min(max(1, round(float(x))), max_threads)) for x in t)
    return (r, n, w)


def finite(x: Any) -> float:
    """``x`` as a float, with NaN/inf/negative measurements read as 0."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return 0.0
    return v if math.isfinite(v) and v > 0.0 else 0.0
