"""The shield: a small monitor between any policy and the thread counts it sets.

A policy can come to rest far below what the path delivers (every stage cut to a few threads,
both buffers full, after the bottleneck moved). The shield compares the delivered rate (the write
stage's) with the best rate the transfer *held* (two intervals in a row) within :data:`MEMORY`
intervals. When it stays below :data:`LOW` of it for :data:`PATIENCE` intervals while the busiest
stage could use more threads (busy, below the bound), :class:`Fallback` sets the counts for
:data:`HOLD` intervals, as Canopy falls back to Cubic: every stage gets the threads that carry that
rate at its latest rate per busy thread (the path as it is now, after a change), plus
:data:`HEADROOM`. Otherwise the policy's choice stands; the policy observes every
interval either way. The shield reads only the :class:`~automdt.policy_contract.Observation`, so
one object wraps a policy in training (:class:`automdt.agents.shield_env.ShieldWrapper`) and in a
transfer; observations without busy thread-seconds pass through.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Any, Deque, Dict, List, Optional

from automdt.policy_contract import BUSY, Features, Observation, PolicyBase, PolicyWrapper, Triple, clamp_triple

LOW = 0.7
"""Share of the best held rate below which the delivered rate is far too low."""
PATIENCE = 2
"""Intervals in a row far too low before the shield takes over (one can be a change settling)."""
HOLD = 3
"""Intervals the fallback drives once the shield takes over."""
MEMORY = 10
"""Intervals over which the best held rate is remembered."""
HEADROOM = 0.2
"""Extra share of the target rate the fallback provisions for (noise and chunk lumps)."""
MIN_BUSY_S = 0.25
"""Busy thread-seconds a stage needs in an interval before its rate per busy thread counts."""


class Fallback(PolicyBase):
    """The controller the shield hands over to, and the controller's choice when a policy keeps
    failing: every stage gets the threads for ``1 + HEADROOM`` times the best held rate."""

    name = "fallback"

    def features(self) -> Features:
        """It is asked in a run's tail: it sizes the writers that drain the buffers."""
        return Features(asked_in_tail=True)

    def __init__(self, max_threads: int = 32) -> None:
        self.reset(max_threads)

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        self.max_threads = int(max_threads)
        self.delivered: Deque[float] = deque(maxlen=MEMORY + 1)
        self.per_thread: List[float] = [0.0, 0.0, 0.0]
        self.threads: Triple = (1, 1, 1)
        return self.threads

    def observe(self, obs: Observation) -> None:
        """Remember the interval's delivered rate and each stage's rate per busy thread."""
        self.threads = tuple(int(n) for n in obs.threads)  # type: ignore[assignment]
        self.delivered.append(max(0.0, float(obs.throughput_bps[2])))
        for s in range(3):
            busy = obs.busy_s[s] if obs.busy_s is not None else 0.0
            if busy >= MIN_BUSY_S:
                self.per_thread[s] = obs.throughput_bps[s] * obs.interval_s / busy

    def best_held(self) -> float:
        """The best rate delivered in two intervals in a row within :data:`MEMORY` intervals."""
        d = list(self.delivered)
        return max((min(a, b) for a, b in zip(d, d[1:])), default=0.0)

    def rate(self, s: int) -> float:
        """Stage ``s``'s latest rate per busy thread (bytes/s; the path as it is now), 0 when unknown."""
        return self.per_thread[s]

    def choose(self) -> Triple:
        """The counts that carry the best held rate with :data:`HEADROOM` (a stage whose rate per
        thread is unknown doubles)."""
        target = (1.0 + HEADROOM) * self.best_held()
        out = []
        for s in range(3):
            rate = self.rate(s)
            out.append(math.ceil(target / rate) if rate > 0.0 and target > 0.0 else 2 * self.threads[s])
        return clamp_triple(out, self.max_threads)

    def act(self, obs: Observation) -> Triple:
        self.observe(obs)
        return self.choose()


class Shield(PolicyWrapper):
    """Wraps ``policy`` (any :class:`~automdt.policy_contract.Policy`; ``None`` when only :meth:`filter` is used, as the
    training wrapper does) and overrides it while the transfer sits far below its best held rate.
    Every hook of the policy (its start, whether it is asked in the tail, a start given from
    outside) passes through unchanged (:class:`~automdt.policy_contract.PolicyWrapper`); its
    annotation gains ``shield`` when the shield acted.

    ``note`` says what the shield did in the last interval (``""``, ``"takeover"``,
    ``"fallback"``) for the interval log.
    """

    def __init__(self, policy: Any = None, max_threads: int = 32) -> None:
        if policy is not None:
            super().__init__(policy)
            self.name = f"shield:{self.policy.name}"
        else:
            self.policy = None  # type: ignore[assignment]
            self.name = "shield"
        self.fallback = Fallback(max_threads)
        self.reset_state(max_threads)

    def reset_state(self, max_threads: int) -> None:
        self.fallback.reset(max_threads)
        self.short = 0
        self.hold = 0
        self.note = ""

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        self.reset_state(max_threads)
        return self.policy.reset(max_threads, seed)

    def annotation(self) -> Dict[str, Any]:
        """The policy's annotation for the interval log, with ``shield`` when the shield acted."""
        inner = self.policy.annotation() if self.policy is not None else {}
        return dict(inner, shield=self.note) if self.note else dict(inner)

    def act(self, obs: Observation) -> Triple:
        return self.filter(obs, self.policy.act(obs))

    def filter(self, obs: Observation, proposed: Triple) -> Triple:
        """The counts to run next, given the policy's ``proposed`` ones after ``obs``."""
        fb = self.fallback
        fb.observe(obs)
        self.note = ""
        if obs.busy_s is None or obs.wait_s is None:
            return proposed
        best = fb.best_held()
        recent = list(fb.delivered)[-2:]
        low = best > 0.0 and sum(recent) / len(recent) < LOW * best
        self.short = self.short + 1 if low and self._could_add(obs) else 0
        if self.hold == 0 and self.short >= PATIENCE:
            self.hold, self.short, self.note = HOLD, 0, "takeover"
        if self.hold > 0:
            self.hold -= 1
            self.note = self.note or "fallback"
            return fb.choose()
        return proposed

    def _could_add(self, obs: Observation) -> bool:
        """The busiest stage is busy and below the thread bound."""
        assert obs.busy_s is not None and obs.wait_s is not None
        util = [b / (b + w) if b + w > 0 else 0.0 for b, w in zip(obs.busy_s, obs.wait_s)]
        s = max(range(3), key=lambda i: util[i])
        return util[s] >= BUSY and obs.threads[s] < self.fallback.max_threads
