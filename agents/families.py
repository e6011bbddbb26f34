"""The paths controllers are trained and tuned on: seeded families of simulated transfers.

Training (``automdt train``) and the tuning of any controller's constants draw their episodes
here. The ablation (:mod:`automdt.experiments.ablation`) judges on a separate held-out generator
with its own ranges and seed, which nothing in :mod:`automdt.agents` imports.

Families (:data:`FAMILIES`): ``static`` (one stage limits), ``two-stage`` (two within 5%),
``contention`` (capacity that peaks and falls with more threads), ``noise`` (10-25% per-interval
noise), ``moving`` (every stage rescaled at one or two random intervals: the bottleneck may move),
``link`` (the network's bandwidth drops to 20-70% and recovers), ``competing`` (2-40 connections of
another transfer share the network for a while). Every episode also draws its thread bound
(16-48), control interval (0.6-2.5 s), staging buffers (48-768 MiB), chunk size (0.5, 2 or 8 MiB)
and noise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Sequence, Tuple

import numpy as np

from automdt.simulator.profile import Profile, StageProfile

FAMILIES = ("static", "two-stage", "contention", "noise", "moving", "link", "competing")
MiB = 2 ** 20
STEPS = 60


@dataclass
class Episode:
    """One training path: its first profile, the changes at given intervals, the chunk size."""

    family: str
    profile: Profile
    events: List[Tuple[int, Profile]] = field(default_factory=list)
    chunk_bytes: float = MiB

    def profile_at(self, step: int) -> Profile:
        return profile_at(self.profile, self.events, step)


def profile_at(first: Profile, events: Sequence[Tuple[int, Profile]], step: int) -> Profile:
    """The profile in force during interval ``step`` (0-based) of a path that starts as ``first``
    and changes at the intervals of ``events``."""
    prof = first
    for at, p in events:
        if step >= at:
            prof = p
    return prof


def _logu(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _stages(rng: np.random.Generator, m: int, rate: float, limit: Sequence[int]) -> List[StageProfile]:
    out = []
    for s in range(3):
        bw = rate * (rng.uniform(1.0, 1.05) if s in limit else _logu(rng, 1.2, 12.0))
        out.append(StageProfile(bw / _logu(rng, 0.8, 1.1 * m), bw))
    return out


def network_change(base: Profile, kind: str, rng: np.random.Generator, drop: Tuple[float, float] = (0.2, 0.7),
                   connections: Tuple[int, int] = (2, 41)) -> StageProfile:
    """The network stage of ``base`` after a change: ``link``, its bandwidth times a factor drawn
    from ``drop``; ``competing``, another transfer's ``k`` connections (drawn from ``connections``,
    upper end excluded) share it, so that ours carry ``B n / (n + k)``."""
    net = base.net
    if kind == "link":
        return StageProfile(net.tpt, net.bandwidth * rng.uniform(*drop))
    k = int(rng.integers(*connections))
    return StageProfile(min(net.tpt, net.bandwidth / (k + 1)), net.bandwidth * 4 * base.max_threads,
                        contention=1.0 / (k + 1))


def episode(rng: np.random.Generator, family: str, steps: int = STEPS) -> Episode:
    """One episode of ``family`` drawn from ``rng``."""
    m = int(rng.choice([16, 24, 32, 48]))
    interval = rng.uniform(0.6, 2.5)
    buffers = [int(_logu(rng, 48 * MiB, 768 * MiB)) for _ in range(2)]
    noise = rng.uniform(0.10, 0.25) if family == "noise" else rng.uniform(0.0, 0.08)
    chunk = float(rng.choice([0.5, 2.0, 8.0])) * MiB
    rate = _logu(rng, 20e6, 8e9)
    bott = int(rng.integers(3))
    limit = [bott] + ([int(rng.choice([s for s in range(3) if s != bott]))] if family == "two-stage" else [])
    if family in ("link", "competing") and rng.random() < 0.7:
        limit = [1]
    st = _stages(rng, m, rate, limit)
    if family == "contention":
        s = bott if rng.random() < 0.7 else int(rng.integers(3))
        peak = _logu(rng, 1.5, m)
        if rng.random() < 0.5:
            st[s] = StageProfile(st[s].tpt, st[s].bandwidth * 3, coherency=1.0 / peak ** 2)
        else:
            st[s] = StageProfile(st[s].tpt, st[s].bandwidth, contention=rng.uniform(0.05, 0.3))
    base = Profile(read=st[0], net=st[1], write=st[2], sender_buffer=buffers[0], receiver_buffer=buffers[1],
                   interval_s=interval, max_threads=m, noise=noise, meta={"generator": "training", "family": family})
    events: List[Tuple[int, Profile]] = []
    if family == "moving":
        for a in sorted({int(x) for x in rng.integers(10, steps - 8, size=int(rng.integers(1, 3)))}):
            f = [_logu(rng, 0.3, 3.0) for _ in range(3)]
            events.append((a, base.replace(**{name: StageProfile(x.tpt * g, x.bandwidth * g)
                                              for name, x, g in zip(("read", "net", "write"), base.stages, f)})))
    elif family in ("link", "competing"):
        a = int(rng.integers(10, steps - 20))
        b = a + int(rng.integers(6, 25))
        events = [(a, base.replace(net=network_change(base, family, rng))), (min(b, steps - 1), base)]
    return Episode(family, base, events, chunk)


def episodes(count: int, seed: int, families: Sequence[str] = FAMILIES) -> List[Episode]:
    """``count`` episodes cycling through ``families``, reproducible from ``seed``."""
    rng = np.random.default_rng(seed)
    return [episode(rng, families[i % len(families)]) for i in range(count)]
