"""A model-based controller that measures each stage's capacity curve from the engine's counters.

The engine counts, per stage, the bytes moved and the thread-seconds spent busy. Their ratio is the
rate of one busy thread, so ``n * bytes / busy`` is what the stage's ``n`` threads carry when they
all work: its capacity at ``n``, measured in every interval, whether or not the stage limited the
transfer, with no isolation probe (the model-based controller of Jung et al. probes each stage in
turn instead). A stage busy for :data:`BUSY` of its thread-seconds measured its capacity exactly; a
stage that waited on a buffer measured an upper bound (a total limit binds only when the threads
press on it). An interval in which a stage's count changed is not a sample of it: the engine counts
a chunk when it is done, so threads that just started have nothing counted yet and threads that
left add the chunks they finished; for the same reason the transfer's first interval is no sample.

Each stage keeps its samples by thread count (forgotten after :data:`MEMORY` intervals, all dropped
when a count measures :data:`CHANGE` away from what it carried before: the path changed) and
builds a capacity curve from them:

* where ``c(n) = min(a n, B)`` fits the counts' means within the measured noise, that line (a
  plateau ``B`` needs exact counts that carry clearly less than the line: threads sharing a total
  limit); without a plateau the line rises up to :data:`GROW` times the largest count;
* otherwise (contention, a link shared with another transfer) the samples themselves: between two
  counts the smaller count's rate per thread up to the larger count's capacity (optimism that tries
  fewer threads; a measurement corrects it), below the smallest count a step down (at least one
  thread, down to :data:`PROBE` times fewer) when the next count carried no more, and above the
  largest count the last measured rise per thread, up to :data:`GROW` times that count while no
  plateau was seen and :data:`PROBE` times it after (optimism that explores upward until the
  plateau shows). A count measured rarely counts :data:`OPTIMISM` standard errors above its mean
  when the controller looks for the fewest threads that carry a rate.

Every interval the controller solves the curves as the oracle does with known ones: among the
rates ``R`` they can carry, the one that maximises the utility ``R * sum_i K^-n_i(R)``, with
``n_i(R)`` the fewest threads of stage ``i`` carrying ``R`` plus a margin of its measured noise
(:data:`MARGIN` to :data:`MAX_MARGIN`) on every stage but the one whose plateau is lowest. It keeps
the current counts unless the solution's predicted utility is :data:`HYSTERESIS` better.
"""
from __future__ import annotations

import bisect
import math
from typing import Dict, List, Optional, Tuple

from automdt.policy_contract import BUSY, K_DEFAULT, Features, Observation, OwnStart, PolicyBase, Triple, clamp_triple, finite

MIN_BUSY_S = 0.01
"""Busy thread-seconds a stage needs in an interval before its sample counts."""
MEMORY = 80
"""Intervals after which a capacity sample is forgotten."""
GROW = 4.0
"""Exploration above the largest measured count reaches this multiple of it (no plateau seen)."""
PROBE = 1.25
"""Exploration step above the largest measured count once a plateau was seen, and below the
smallest one when counts are level (at least one thread)."""
CHANGE = 0.4
"""A sample this far (relative) from its count's remembered capacity means the path changed."""
MARGIN = 0.03
"""Least spare capacity each stage is given over the target rate (relative)."""
OPTIMISM = 2.0
"""Standard errors of a count's mean capacity by which it may carry a rate (see :meth:`_Stage.curve`)."""
MAX_MARGIN = 0.2
"""Most spare capacity a stage is given over the target rate (relative), however noisy."""
HYSTERESIS = 0.003
"""Relative gain in predicted utility below which the counts stay."""
START = (8, 8, 8)
"""The counts of the first interval: enough threads to measure every stage."""


class _Stage:
    """The capacity samples of one stage by thread count: ``{threads: [[capacity bytes/s, age],
    ...]}``, whether any of them was exact, the relative noise of repeated samples, and the
    intervals since a plateau was last seen (``None``: never)."""

    def __init__(self) -> None:
        self.table: Dict[int, List[List[float]]] = {}
        self.exact: Dict[int, bool] = {}
        self.noise = 0.05
        self.saturated_age: Optional[int] = None
        self.fitted: Optional[Tuple[float, float]] = None
        """The ``min(a n, B)`` fit of the last :meth:`curve`, when that shape holds."""

    def mean(self, n: int) -> float:
        caps = self.table[n]
        return sum(c for c, _ in caps) / len(caps)

    def add(self, n: int, cap: float, exact: bool) -> None:
        for caps in self.table.values():
            for e in caps:
                e[1] += 1
        self.table = {k: [e for e in v if e[1] <= MEMORY] for k, v in self.table.items()}
        self.table = {k: v for k, v in self.table.items() if v}
        if self.saturated_age is not None:
            self.saturated_age += 1
        if n in self.table:
            dev = abs(cap - self.mean(n)) / max(self.mean(n), cap, 1.0)
            if dev > max(CHANGE, 3.0 * self.noise):
                self.table, self.exact, self.saturated_age = {}, {}, None  # the path changed under this stage
            else:
                self.noise = 0.9 * self.noise + 0.1 * dev * 1.25  # mean absolute deviation -> std
        self.table.setdefault(n, []).append([cap, 0])
        self.exact[n] = self.exact.get(n, False) or exact

    def fit_line(self) -> Optional[Tuple[float, float]]:
        """``(a, B)`` of ``c(n) = min(a n, B)`` fitted to the counts' mean capacities (weighted by
        their samples), or None when that shape misses them by more than the noise (contention,
        a concave share). ``B`` is infinite when no count reached a plateau; when every count is on
        it, the knee is put a step below the smallest count (optimism that tries fewer threads)."""
        pts = sorted((n, self.mean(n), len(v)) for n, v in self.table.items())
        if not pts or pts[-1][1] <= 0.0:
            return None
        best: Optional[Tuple[float, float, float]] = None
        for k in range(len(pts), -1, -1):  # the first k counts on the line, the others on the plateau
            lin, flat = pts[:k], pts[k:]
            if not all(self.exact.get(n, False) for n, _, _ in flat):
                continue  # only a stage that was busy all the time shows its plateau
            a = sum(w * n * c for n, c, w in lin) / sum(w * n * n for n, _, w in lin) if lin else 0.0
            b = sum(w * c for _, c, w in flat) / sum(w for _, _, w in flat) if flat else math.inf
            if not lin:
                n0 = flat[0][0]
                a = b / max(1.0, min(n0 - 1.0, n0 / PROBE))
            tol = max(2.0 * self.noise, MARGIN)
            if a <= 0.0 or (lin and flat and (a * lin[-1][0] > b * (1.0 + tol) or flat[0][1] > a * flat[0][0] * (1.0 - tol))):
                continue  # a plateau needs counts that carry clearly less than the line (diluted threads)
            err = sum(w * ((c - min(a * n, b)) / max(c, 1.0)) ** 2 for n, c, w in pts) / sum(w for *_, w in pts)
            if best is None or err < best[2]:
                best = (a, b, err)
        if best is None or math.sqrt(best[2]) > max(2.0 * self.noise, MARGIN):
            return None
        return best[0], best[1]

    def curve(self, m: int, z: float = 0.0) -> List[float]:
        """Capacity at 1..m threads (index 0: one thread), made monotone (the best of fewer). A
        measured count contributes its mean plus ``z`` standard errors: with ``z > 0``, a count
        measured rarely may still carry a rate that a count measured often carries (optimism in the
        face of noise, so that fewer threads keep being tried)."""
        pts = sorted((n, self.mean(n) * (1.0 + z * self.noise / math.sqrt(len(v))), self.exact.get(n, False))
                     for n, v in self.table.items())
        if not pts:
            return [math.inf] * m
        line = self.fitted = self.fit_line()
        if line is not None:
            a, b = line
            reach = pts[-1][0] if math.isfinite(b) else max(pts[-1][0] + 1, int(GROW * pts[-1][0]))
            return [min(a * min(n, reach), b) for n in range(1, m + 1)]
        best = max(c / n for n, c, _ in pts)
        if best <= 0.0:
            return [0.0] * m
        n_hi, c_hi, exact_hi = pts[-1]
        tol = max(2.0 * self.noise, MARGIN)
        slope = best
        flat = False
        if len(pts) > 1:  # what the largest count added over the best of fewer threads
            n_pr, c_pr = max(((n, c) for n, c, _ in pts[:-1]), key=lambda p: p[1])
            flat = exact_hi and c_hi <= c_pr * (1.0 + tol)
            slope = min(best, max(c_hi - c_pr, 0.0) / (n_hi - n_pr)) if n_hi > n_pr else best
        if flat:
            self.saturated_age = 0
            reach = n_hi
        elif self.saturated_age is None:
            reach = max(n_hi + 1, int(GROW * n_hi))
        else:
            reach = max(n_hi + 1, int(PROBE * n_hi))
        # no gain from the smallest measured count to the next: the stage saturates at or below the
        # smallest count (or contention lowers it), so fewer threads are worth a try
        level = len(pts) > 1 and pts[1][1] <= pts[0][1] * (1.0 + tol)
        out, j, run = [], 0, 0.0
        for n in range(1, m + 1):
            while j + 1 < len(pts) and pts[j + 1][0] <= n:
                j += 1
            n0, c0, _ = pts[j]
            if n < pts[0][0]:  # below the smallest count: a step down on the trend, when level
                n0, c0 = pts[0][0], pts[0][1]
                fall = (c0 - pts[1][1]) / (pts[1][0] - n0) if level else 0.0
                step = level and (n * PROBE >= n0 or n == n0 - 1)
                c = c0 + max(fall, 0.0) * (n0 - n) if step else c0 * n / n0
            elif j + 1 < len(pts):  # the rate per thread of n0 until the capacity of n1 is reached
                c = max(c0, min(c0 * n / n0, pts[j + 1][1]))
            else:
                c = c_hi + slope * (min(n, reach) - n_hi)
            run = max(run, c)
            out.append(run)
        return out


class CapacityPolicy(PolicyBase):
    """Measure every stage's capacity curve from busy-time counters, run the utility optimum.

    :param k: thread-cost base of the utility.
    :param start: the first interval's counts.
    :param max_threads: default bound until :meth:`reset` gives one.
    """

    name = "capacity"

    def __init__(self, k: float = K_DEFAULT, start: Triple = START, max_threads: Optional[int] = None) -> None:
        self.k = float(k)
        self.start_threads: Triple = clamp_triple(start, 1 << 30)
        self.reset(int(max_threads or 32))

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        self.max_threads = int(max_threads)
        self.stages = [_Stage(), _Stage(), _Stage()]
        self.current = clamp_triple(self.start_threads, self.max_threads)
        self._last: Optional[Tuple[int, ...]] = None
        return self.current

    def features(self) -> Features:
        """It takes a start (a job's history, or ``start_threads``) and acts in a run's tail
        too: the writers that drain the buffers are sized from their own counters."""
        return Features(start=OwnStart(self.start_threads, "policy"), asked_in_tail=True)

    def start_from(self, threads: Triple) -> None:
        self.current = clamp_triple(threads, self.max_threads)

    def observe(self, obs: Observation) -> None:
        """Add the interval's capacity samples (stages without busy-time counters are skipped)."""
        last, self._last = self._last, tuple(int(n) for n in obs.threads)
        if obs.busy_s is None or obs.wait_s is None:
            return
        for s in range(3):
            n, busy, wait = int(obs.threads[s]), finite(obs.busy_s[s]), finite(obs.wait_s[s])
            if busy < MIN_BUSY_S or last is None or last[s] != n:
                # the first interval and one whose count changed count the busy time of threads that
                # started with nothing in progress (or the chunks of threads that left), not their work
                continue
            # a stage that worked but finished no chunk measured nothing carried: a sample of 0
            cap = n * finite(obs.throughput_bps[s]) * obs.interval_s / busy
            self.stages[s].add(n, cap, busy >= BUSY * (busy + wait))

    def solve(self) -> Tuple[Triple, float, float]:
        """The utility-optimal counts on the measured curves, their predicted utility and the
        predicted utility of the current counts."""
        m = self.max_threads
        means = [st.curve(m) for st in self.stages]
        curves = [st.curve(m, OPTIMISM) if st.fitted is None else c for st, c in zip(self.stages, means)]
        margins = [min(max(MARGIN, 1.0 * st.noise), MAX_MARGIN) for st in self.stages]
        top = min(c[-1] for c in means)
        neck = min(range(3), key=lambda i: means[i][-1])  # the stage whose plateau sets the top rate
        pen = [self.k ** -n for n in range(m + 1)]
        rates = sorted({r for c in means for r in c if r <= top and math.isfinite(r)} | {top})
        best: Tuple[float, Triple] = (-1.0, self.current)
        for rate in rates:
            if not math.isfinite(rate) or rate <= 0.0:
                continue
            counts = []
            for s, (c, mg) in enumerate(zip(curves, margins)):
                if not self.stages[s].table:  # not measured yet: keep its count
                    counts.append(self.current[s])
                    continue
                want = rate if s == neck else min(rate * (1.0 + mg), c[-1])
                counts.append(min(m, bisect.bisect_left(c, want * (1.0 - 1e-9)) + 1))
            util = rate * sum(pen[n] for n in counts)
            if util > best[0]:
                best = (util, tuple(counts))  # type: ignore[assignment]
        rate = min(c[n - 1] for c, n, st in zip(means, self.current, self.stages) if st.table)
        now = rate * sum(pen[n] for n in self.current) if math.isfinite(rate) else 0.0
        return best[1], best[0], now

    def act(self, obs: Observation) -> Triple:
        self.observe(obs)
        self.current = clamp_triple(obs.threads, self.max_threads)
        if not any(st.table for st in self.stages):
            return self.current
        new, util, now = self.solve()
        if util > (1.0 + HYSTERESIS) * now:
            self.current = clamp_triple(new, self.max_threads)
        return self.current
