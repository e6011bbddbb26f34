"""Top-down knee search with commit, hold and re-explore, after adaptiSeq's ``topdown`` controller.

adaptiSeq tunes one worker count: it starts at the cap, halves the count while the halved count
measures clearly better (more than ``threshold``, 10%), commits to the best count, then holds it
and only watches: every check compares the delivered rate with a smoothed baseline
(``baseline = 0.8 baseline + 0.2 sample``), and two checks in a row more than ``redo`` (35%) below
it start the search again from the cap.

On the modular data path the one count drives all three stages, ``(c, c, c)``, as a monolithic
tool's concurrency does. A measurement is the mean of ``window`` intervals after ``settle``
intervals that let a change settle. "Better" is judged on the utility every other controller
maximises, ``sum_i t_i / K^c`` (with only the throughput, the cap would always win a path that is
not throttled by concurrency, and every thread would be kept).
"""
from __future__ import annotations

from typing import List, Optional

from automdt.policy_contract import K_DEFAULT, Observation, PolicyBase, Triple, clamp_triple, finite

THRESHOLD = 0.10
"""A halved count must measure this share better than the best so far for the search to go on."""
REDO = 0.35
"""A check this share below the held baseline counts as low; two in a row re-explore."""
EWMA = 0.2
"""Weight of a new check in the held baseline."""


class TopDownPolicy(PolicyBase):
    """adaptiSeq's top-down knee search on one concurrency for all three stages.

    :param k: thread-cost base of the utility that judges a count.
    :param threshold: relative gain a halved count needs to continue the search.
    :param redo: relative drop below the baseline that counts as a low check.
    :param settle: intervals after a change that are not measured.
    :param window: intervals averaged into one measurement (and one check while holding).
    :param max_threads: default cap until :meth:`reset` gives one.
    """

    name = "topdown"

    def __init__(self, k: float = K_DEFAULT, threshold: float = THRESHOLD, redo: float = REDO,
                 settle: int = 1, window: int = 1, max_threads: Optional[int] = None) -> None:
        if settle < 0 or window < 1 or not 0.0 < redo < 1.0 or threshold < 0.0:
            raise ValueError("topdown: settle >= 0, window >= 1, 0 < redo < 1, threshold >= 0")
        self.k, self.threshold, self.redo = float(k), float(threshold), float(redo)
        self.settle, self.window = int(settle), int(window)
        self._cap = int(max_threads or 32)
        self.reset(self._cap)

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        self._cap = int(max_threads)
        self._explore(self._cap)
        return self._triple()

    def start_from(self, threads: Triple) -> None:
        """A transfer that starts at ``threads`` searches down from their largest count."""
        self._explore(max(int(x) for x in threads))

    def _explore(self, count: int) -> None:
        self.count = max(1, min(count, self._cap))
        self.best: Optional[tuple[int, float]] = None  # (count, measured utility)
        self.exploring = True
        self._samples: List[float] = []
        self._skip = self.settle
        self.baseline = 0.0
        self._low = 0

    def _triple(self) -> Triple:
        return clamp_triple((self.count,) * 3, self._cap)

    def _measure(self, value: float) -> Optional[float]:
        """The mean of ``window`` intervals after ``settle`` skipped ones, or None until then."""
        if self._skip > 0:
            self._skip -= 1
            return None
        self._samples.append(value)
        if len(self._samples) < self.window:
            return None
        mean = sum(self._samples) / len(self._samples)
        self._samples = []
        return mean

    def act(self, obs: Observation) -> Triple:
        if self.exploring:
            util = sum(finite(t) / self.k ** n for t, n in zip(obs.throughput_bps, obs.threads))
            measured = self._measure(util)
            if measured is not None:
                self._search_step(measured)
            return self._triple()
        rate = self._measure(finite(obs.throughput_bps[2]))
        if rate is None:
            return self._triple()
        if self.baseline <= 0.0:
            self.baseline = rate
        elif rate < (1.0 - self.redo) * self.baseline:
            self._low += 1
            if self._low >= 2:
                self._explore(self._cap)
        else:
            self._low = 0
            self.baseline = (1.0 - EWMA) * self.baseline + EWMA * rate
        return self._triple()

    def _search_step(self, measured: float) -> None:
        """One probe's verdict: go lower while clearly better, otherwise commit to the best."""
        if self.best is None:
            self.best = (self.count, measured)
        elif measured > self.best[1] * (1.0 + self.threshold):
            self.best = (self.count, measured)
        else:
            if measured > self.best[1]:
                self.best = (self.count, measured)
            self._commit()
            return
        if self.count <= 1:
            self._commit()
            return
        self.count //= 2
        self._skip = self.settle

    def _commit(self) -> None:
        assert self.best is not None
        self.count = self.best[0]
        self.exploring = False
        self._skip = self.settle
        self.baseline = 0.0
        self._low = 0
