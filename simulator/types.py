"""Types shared by the simulator, the policies and the live controller.

An :class:`Observation` is what a policy sees after one control interval, in physical units,
whether it comes from the simulator or from the live engine's counters. Policies normalise it
themselves (the PPO agent through :class:`automdt.simulator.env.ObservationEncoder`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

Triple = Tuple[int, int, int]
"""Thread counts (read, network, write)."""


@dataclass(frozen=True)
class Observation:
    """One control interval, as measured.

    :param threads: thread counts (read, net, write) that were active during the interval.
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
