"""Model-based tuning after Jung, Kettimuthu & Vishwanath (Argonne): fit component models, solve
for the flow.

Jung et al. model every component of an end-to-end transfer (disks, compute, NICs/TCP) as an
edge with a bandwidth function of its number of parallel flows, fit those functions from a few
subsystem tests, and solve a flow problem for the largest end-to-end rate and the number of
flows that achieve it. On the modular data path the graph is a chain of three edges, read ->
network -> write, joined by the two staging buffers, so the flow problem reduces to

    maximise R  subject to  R <= c_i(n_i),  1 <= n_i <= max_threads,  i in {read, net, write}

whose optimum is ``R* = min_i c_i(max_threads)``; among the thread counts that reach it the
policy takes the fewest, ``n_i* = min{n : c_i(n) >= (1 - slack) R*}`` (``slack``, 2% by
default, the price of one thread at K = 1.02, absorbs measurement noise).

Stage models: first ``c_i(n) = min(a_i n, b_i)`` (per-thread rate ``a_i``, ceiling ``b_i``:
Jung's TCP edge ``min{NC, alpha n}``); a stage whose measured capacity then falls short of that
line is refit, with the concave utilisation form ``B n / (n + gamma)`` (Jung's disk edge: the
utilisation ``1 / (1 + gamma / L)`` of ``L`` requesters times the array's bandwidth; least
squares on ``1/c = 1/B + (gamma/B)(1/n)``).

**Fitting online.** A stage's measured throughput equals its capacity only when it was neither
starved (its input buffer ran empty) nor blocked (its output buffer ran full); otherwise it is a
lower bound. The policy therefore probes so that each stage in turn is the bottleneck:

1. ``(lo, G, G)``, ``(G, lo, G)``, ``(G, G, lo)``: one stage at ``lo`` threads (1 by default)
   and the others generous (``G = max_threads`` by default); the starved stage is uncensored and
   gives ``a_i = t_i / lo``;
2. ``(G, G, G)`` for ``settle`` intervals: the bottleneck stage is uncensored and gives the
   largest achievable rate ``R*``.

``a_i`` is the largest ``t/n`` among uncensored samples (a lower bound from censored ones when
there is none); censored stages are taken to be able to reach ``a_i G``.

**Refining and adapting.** Jung et al. solve once, offline. Here, while running the solution,
a stage that is uncensored and more than ``shortfall_tol`` below the planned rate for
``confirm`` intervals in a row is measured once more alone at ``probe_low`` threads (one
interval) and refit from that and its recent samples (concave when they show saturation, else
its current per-thread rate), then given more threads, at most ``max_refines`` times per probe; a shortfall that refits cannot fix (stage at ``max_threads``,
no uncensored stage, refits used up) for ``patience`` intervals starts a new probe, as does
``reprobe_every`` (optional).
"""
from __future__ import annotations

import math
from collections import deque
from typing import Deque, List, Optional, Tuple

import numpy as np

from automdt.agents.marlin import finite
from automdt.policy_contract import Observation, PolicyBase, Triple, clamp_triple

STARVED_FILL = 0.05
"""A buffer at or below this fill at the end of an interval starved its consumer."""
BLOCKED_FILL = 0.95
"""A buffer at or above this fill at the end of an interval blocked its producer."""
MAX_SAMPLES = 256
"""Samples kept per stage."""
RECENT_SAMPLES = 4
"""Uncensored samples of the running phase a stage is refit from (with a fresh low probe)."""


def fit_concave(samples: List[Tuple[int, float]]) -> Optional[Tuple[float, float]]:
    """Least-squares fit of ``c(n) = B n / (n + gamma)`` to ``(n, c)`` samples.

    Fits ``1/c = p + q / n`` (``B = 1/p``, ``gamma = q/p``); returns ``(B, gamma)``, or ``None``
    with fewer than two distinct ``n`` or no saturation in the data (``p <= 0`` or ``q <= 0``).
    """
    pts = [(n, c) for n, c in samples if n > 0 and c > 0]
    if len({n for n, _ in pts}) < 2:
        return None
    x = np.array([1.0 / n for n, _ in pts])
    y = np.array([1.0 / c for _, c in pts])
    q, p = np.polyfit(x, y, 1)
    if not (p > 0 and q > 0 and math.isfinite(p) and math.isfinite(q)):
        return None
    return 1.0 / p, q / p


class ModelBasedPolicy(PolicyBase):
    """Fit a capacity model per stage from a few probes, run the max-flow solution.

    :param probe_low: thread count of the stage being measured in the isolation probes.
    :param probe_high: thread count of the other stages during probes; ``None`` for
        ``max_threads``.
    :param settle: intervals of the all-high probe (the last one sets ``R*``).
    :param slack: fraction of ``R*`` the solution may give up to save threads.
    :param shortfall_tol: relative shortfall of a stage below the planned rate that counts.
    :param confirm: consecutive short intervals of a stage before it is refit.
    :param max_refines: refits per probe before a shortfall counts as drift.
    :param patience: consecutive drifting intervals before probing again.
    :param reprobe_every: probe again after this many intervals of running the solution;
        ``None`` never.
    :param starved_fill: buffer fill at or below which the consumer counts as starved.
    :param blocked_fill: buffer fill at or above which the producer counts as blocked.
    :param max_threads: default upper bound until :meth:`reset` gives one.
    """

    name = "model"

    def __init__(
        self,
        probe_low: int = 1,
        probe_high: Optional[int] = None,
        settle: int = 2,
        slack: float = 0.02,
        shortfall_tol: float = 0.15,
        confirm: int = 2,
        max_refines: int = 3,
        patience: int = 3,
        reprobe_every: Optional[int] = None,
        starved_fill: float = STARVED_FILL,
        blocked_fill: float = BLOCKED_FILL,
        max_threads: Optional[int] = None,
    ) -> None:
        if probe_low < 1 or settle < 1 or patience < 1 or confirm < 1 or max_refines < 0:
            raise ValueError("model: probe_low, settle, confirm and patience must be >= 1, max_refines >= 0")
        if not 0.0 <= slack < 1.0 or not 0.0 < shortfall_tol < 1.0:
            raise ValueError("model: slack must be in [0, 1) and shortfall_tol in (0, 1)")
        if reprobe_every is not None and reprobe_every < 1:
            raise ValueError("model: reprobe_every must be >= 1 or None")
        self.probe_low = int(probe_low)
        self.probe_high = probe_high
        self.settle = int(settle)
        self.slack = float(slack)
        self.shortfall_tol = float(shortfall_tol)
        self.confirm = int(confirm)
        self.max_refines = int(max_refines)
        self.patience = int(patience)
        self.reprobe_every = reprobe_every
        self.starved_fill = float(starved_fill)
        self.blocked_fill = float(blocked_fill)
        self._max = max_threads
        self.solution: Optional[Triple] = None
        self.planned_rate = 0.0

    # ----------------------------------------------------------------------------------------
    def _high(self) -> int:
        assert self._max is not None
        high = self._max if self.probe_high is None else int(self.probe_high)
        return max(1, min(high, self._max))

    def _probe_plan(self) -> List[Triple]:
        lo, hi = min(self.probe_low, self._high()), self._high()
        plan = [(lo, hi, hi), (hi, lo, hi), (hi, hi, lo)]
        plan += [(hi, hi, hi)] * self.settle
        return plan

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        self._max = int(max_threads)
        self._start_probe()
        return self._current

    def _start_probe(self) -> None:
        # Per stage: (threads, throughput, uncensored) samples, newest last; a new probe starts
        # a new model, since conditions changed.
        self.samples: List[Deque[Tuple[int, float, bool]]] = [deque(maxlen=MAX_SAMPLES) for _ in range(3)]
        self.a: List[float] = [0.0, 0.0, 0.0]
        self.b: List[Optional[float]] = [None, None, None]
        self.concave: List[Optional[Tuple[float, float]]] = [None, None, None]
        self._plan = self._probe_plan()
        self._step = 0
        assert self._max is not None, "reset() sets max_threads"
        self._current: Triple = clamp_triple(self._plan[0], self._max)
        self._short = [0, 0, 0]
        self._recent: List[Deque[Tuple[int, float]]] = [deque(maxlen=RECENT_SAMPLES) for _ in range(3)]
        self._drift = 0
        self._checking: Optional[int] = None
        self._refines = 0
        self._running = 0
        self.solution = None
        self.planned_rate = 0.0

    def start_from(self, threads: Triple) -> None:
        """The probe plan's first interval runs at ``threads`` (``--threads`` with ``--policy
        model``): its samples are recorded with those counts, and the plan goes on from there."""
        limit = self._max if self._max is not None else max(int(x) for x in threads)
        self._current = clamp_triple(threads, limit)

    @property
    def probing(self) -> bool:
        """True while the policy is still running its probe plan."""
        return self.solution is None

    # ----------------------------------------------------------------------------------------
    def uncensored(self, obs: Observation) -> Tuple[bool, bool, bool]:
        """Which stages ran at capacity: neither starved by an empty input buffer nor blocked by a
        full output buffer at the end of the interval."""
        s = min(finite(obs.buffer_fill[0]), 1.0)
        r = min(finite(obs.buffer_fill[1]), 1.0)
        read_ok = s < self.blocked_fill
        net_ok = s > self.starved_fill and r < self.blocked_fill
        write_ok = r > self.starved_fill
        return read_ok, net_ok, write_ok

    def _record(self, obs: Observation, threads: Triple) -> None:
        ok = self.uncensored(obs)
        for i in range(3):
            self.samples[i].append((int(threads[i]), finite(obs.throughput_bps[i]), ok[i]))

    def _fit_rate(self, i: int) -> float:
        """Per-thread rate ``a_i``: best ``t/n`` of uncensored samples, else of any sample."""
        clean = [t / n for n, t, ok in self.samples[i] if ok and n > 0 and t > 0]
        if clean:
            return max(clean)
        rough = [t / n for n, t, _ in self.samples[i] if n > 0 and t > 0]
        return max(rough) if rough else 0.0

    def stage_threads(self, i: int, target: float) -> int:
        """Fewest threads for which stage ``i``'s fitted model reaches ``target`` bytes/s."""
        assert self._max is not None
        if self.concave[i] is not None:
            big_b, gamma = self.concave[i]  # type: ignore[misc]
            if target >= big_b:
                return self._max
            return max(1, math.ceil(gamma * target / (big_b - target) - 1e-9))
        a = self.a[i]
        if a <= 0.0:
            return self._max
        return max(1, math.ceil(target / a - 1e-9))

    def fit(self, last: Observation, threads: Triple) -> Tuple[float, Triple]:
        """Fit the linear-ceiling model of each stage from the samples and solve; ``(R*, n*)``."""
        assert self._max is not None
        ok = self.uncensored(last)
        caps = []
        for i in range(3):
            a = self._fit_rate(i)
            self.a[i] = a
            t = finite(last.throughput_bps[i])
            linear = a * threads[i]
            if ok[i]:
                cap = t  # ran at capacity with threads[i] threads
                self.b[i] = t if t < (1.0 - self.slack) * linear else None
            else:
                cap = max(t, linear)  # censored: capacity is at least t, at most a * n
            caps.append(cap)
        rate = min(caps)
        if rate <= 0.0:
            # Nothing moved: no model to solve; keep the generous probe setting.
            return 0.0, clamp_triple((self._high(),) * 3, self._max)
        target = (1.0 - self.slack) * rate
        return rate, clamp_triple([self.stage_threads(i, target) for i in range(3)], self._max)

    def _refit(self, i: int, fresh: Optional[Tuple[int, float]]) -> None:
        """Refit stage ``i`` from a fresh ``probe_low`` measurement and its recent running samples:
        concave through them when that fits (saturation visible), else the current per-thread
        rate. Recent samples only, so that a change of conditions replaces the probe's numbers."""
        pts = [(n, t) for n, t in self._recent[i] if t > 0]
        if fresh is not None and fresh[1] > 0:
            pts.append(fresh)
        self.concave[i] = fit_concave(pts)
        if self.concave[i] is None and self._recent[i]:
            n, t = self._recent[i][-1]
            if t > 0:
                self.a[i] = t / n

    # ----------------------------------------------------------------------------------------
    def act(self, obs: Observation) -> Triple:
        if self._max is None:
            self.reset(obs.max_threads)
        assert self._max is not None
        ran = self._current
        self._record(obs, ran)

        if self.solution is None:  # probing
            self._step += 1
            if self._step < len(self._plan):
                self._current = clamp_triple(self._plan[self._step], self._max)
                return self._current
            rate, sol = self.fit(obs, ran)
            self.solution = sol
            self.planned_rate = (1.0 - self.slack) * rate
            self._current = sol
            return sol

        target = self.planned_rate
        t = [finite(x) for x in obs.throughput_bps]
        ok = self.uncensored(obs)

        if self._checking is not None:  # the interval that re-measured one stage at probe_low
            i = self._checking
            self._checking = None
            self._refit(i, (int(ran[i]), t[i]) if ok[i] else None)
            new = list(self.solution)
            new[i] = min(self._max, max(self.stage_threads(i, target), self.solution[i] + 1))
            self._refines += 1
            self._recent[i].clear()
            self.solution = self._current = clamp_triple(new, self._max)
            return self._current

        self._running += 1
        if self.reprobe_every is not None and self._running >= self.reprobe_every:
            self._start_probe()
            return self._current
        if target <= 0.0:
            return self._current
        for i in range(3):
            if ok[i]:
                self._recent[i].append((int(ran[i]), t[i]))
        floor = (1.0 - self.shortfall_tol) * target
        short = [ok[i] and t[i] < floor for i in range(3)]
        self._short = [self._short[i] + 1 if short[i] else 0 for i in range(3)]
        if self._refines < self.max_refines:
            candidates = [i for i in range(3) if self._short[i] >= self.confirm and ran[i] < self._max]
            if candidates:
                # Re-measure the shortest stage alone at probe_low threads for one interval.
                i = min(candidates, key=lambda j: t[j])
                self._short = [0, 0, 0]
                self._drift = 0
                self._checking = i
                check = list(self.solution)
                check[i] = min(self.probe_low, self._max)
                self._current = clamp_triple(check, self._max)
                return self._current
        if min(t) < floor:
            self._drift += 1
            if self._drift >= self.patience:
                self._start_probe()
        else:
            self._drift = 0
        return self._current
