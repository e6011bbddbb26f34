"""Yardstick policies of the real- and changing-path experiments (not tuners).

* :class:`GridPolicy`: holds each triple of a list for ``hold`` intervals, in order (the grid
  search of the empirical oracle runs as one long transfer instead of one transfer per triple);
* :class:`PhasedStatic`: a static triple per phase of a changing path, switched at the phases'
  wall-clock times (the changing suite's oracle: it knows the future, no tuner does);
* :class:`Continuing`: wraps a policy so that a transfer made of several rounds (the dataset is
  copied again when it runs out) keeps one policy state instead of restarting it every round.

All derive from :class:`automdt.policy_contract.PolicyBase` (``reset(max_threads, seed) ->
triple``, ``act(observation) -> triple``, and the hooks the controller reads).
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, List, Optional, Sequence, Tuple

from automdt.policy_contract import Features, PolicyBase, PolicyWrapper

Triple = Tuple[int, int, int]


def _triple(t: Sequence[int]) -> Triple:
    r, n, w = (int(x) for x in t)
    return (r, n, w)


class GridPolicy(PolicyBase):
    """Each triple of ``triples`` for ``hold`` intervals, then the last one for good.

    :attr:`done` turns True once every triple had its ``hold`` intervals.
    """

    def __init__(self, triples: Sequence[Sequence[int]], hold: int = 3, max_threads: Optional[int] = None):
        if not triples:
            raise ValueError("GridPolicy needs at least one triple")
        if hold < 1:
            raise ValueError("hold must be >= 1")
        self.triples: List[Triple] = [_triple(t) for t in triples]
        self.hold = int(hold)
        self.name = f"grid:{len(self.triples)}x{self.hold}"
        self._i = 0
        self._held = 0

    @property
    def done(self) -> bool:
        return self._i >= len(self.triples) - 1 and self._held >= self.hold

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        self._i, self._held = 0, 0
        return self.triples[0]

    def act(self, obs: Any) -> Triple:
        self._held += 1
        if self._held >= self.hold and self._i < len(self.triples) - 1:
            self._i += 1
            self._held = 0
        return self.triples[self._i]


class PhasedStatic(PolicyBase):
    """A fixed triple per phase: ``phases = [(start_s, triple), ...]`` from ``origin_wall`` (``time.time()``).

    Before ``origin_wall`` is given (``None``) the clock starts at :meth:`reset`. It is asked in a
    run's tail too: a change can come after the source is read to the end (a read limit lifted lets
    the buffers take the rest at once), and the yardstick follows its phases to the end.
    """

    def __init__(self, phases: Sequence[Tuple[float, Sequence[int]]], origin_wall: Optional[float] = None,
                 max_threads: Optional[int] = None):
        if not phases:
            raise ValueError("PhasedStatic needs at least one phase")
        self.phases = sorted((float(a), _triple(t)) for a, t in phases)
        self.origin = origin_wall
        self.name = "oracle-phases"

    def _now(self) -> Triple:
        el = time.time() - (self.origin or time.time())
        cur = self.phases[0][1]
        for at, t in self.phases:
            if el >= at:
                cur = t
        return cur

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        if self.origin is None:
            self.origin = time.time()
        return self._now()

    def act(self, obs: Any) -> Triple:
        return self._now()

    def features(self) -> Features:
        return Features(asked_in_tail=True)


class Continuing(PolicyWrapper):
    """``inner`` reset once; later rounds' resets continue from the last triple it chose.

    Its start is its ``reset`` (no job history or own start moves it between rounds); the other
    hooks (acting in the tail, annotations) are the inner policy's.
    """

    def __init__(self, inner: Any):
        super().__init__(inner)
        self.inner = inner
        self._last: Optional[Triple] = None

    @property
    def done(self) -> bool:
        """The inner policy's ``done`` (a :class:`GridPolicy` that held every triple), else False."""
        return bool(getattr(self.inner, "done", False))

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        if self._last is None:
            self._last = _triple(self.policy.reset(max_threads, seed))
        return self._last

    def act(self, obs: Any) -> Triple:
        self._last = _triple(self.policy.act(obs))
        return self._last

    def features(self) -> Features:
        return replace(self.policy.features(), start=None)
