"""The receiver's fair share (on by default; ``automdt receive --no-fair-share`` turns it off):
sessions that want more get equal receiving rates.

Jobs that share one bottleneck (a link, the receiver's disk) do not share it evenly by
themselves: TCP divides a full FIFO link per connection and favours the connections that were
there first, and every job's controller tunes for its own transfer. The connection share
(``--total-connections``) gives each job the same number of connections; this gives each the same
rate.

Every :data:`PERIOD_S` the daemon measures what each open session received over the last
:data:`WINDOW_S`, and divides what they received together at best over the last :data:`PEAK_S`
(the bottleneck's capacity) as water fills vessels (:func:`caps`). A session that uses less than an
even share and either reports no backlog (no chunks read and waiting for a network thread: its
source holds it back; ``poll``'s ``backlog``) or is held back elsewhere keeps what it uses; the
others are paced to an even share of the rest plus :data:`HEADROOM`. The pace is the engine's
receiving limit: each piece of a chunk is read off its connection at the end of its turn on the
session's clock, and TCP's flow control slows the sender. A session above its share is held to
it, and the capacity it leaves goes to those below, which want more.

The headroom lets the total grow when the bottleneck speeds up; the capacity is a recent best, not
the last total, so a session slow to take up its share does not pull the others' down with it. A
session paced to a share that stays short of it for :data:`STUCK_PERIODS` is held back by its own
path (jobs from several sites into one receiver): it keeps what it gets from then on, and the
others are no longer held to its rate. A lone session, and sessions none of which wants more, are
not limited.
"""
from __future__ import annotations

import collections
import logging
from typing import AbstractSet, Any, Deque, Dict, Hashable, Iterable, Optional, Set, Tuple

PERIOD_S = 1.0
"""Seconds between two divisions of the rate."""
WINDOW_S = 2.0
"""Seconds of received bytes each rate is measured over (several chunks per session even at a
few MB/s each: one chunk more or less moves a 1-s rate by a third)."""
HEADROOM = 0.05
"""Fraction above an even share that each session with a backlog may receive."""
SHORT = 0.8
"""A session paced to a share and receiving less than this fraction of it is short of it."""
STUCK_PERIODS = 8
"""Periods in a row short of its share after which a session counts as held back elsewhere (its
own path or source; one that the others' limits would help catches up sooner), until it
receives a share again."""
PEAK_S = 10.0
"""Seconds over which the best total rate counts as the bottleneck's capacity: shares follow a
bottleneck that slows within this long, and a session that cannot take up its share at once
(TCP ramps up) does not drag the others' shares down with it."""

log = logging.getLogger("automdt.receiver")


def caps(rates: Dict[Hashable, Optional[float]], backlog: Dict[Hashable, bool], capacity: float,
         elsewhere: AbstractSet[Hashable] = frozenset()) -> Dict[Hashable, int]:
    """Each session's receiving limit, bytes/s (0: none), from its measured rate (None: it has
    not run a whole window yet), whether its sender has a backlog, what all sessions received
    together at best lately (``capacity``), and the sessions found to be held back elsewhere
    (``elsewhere``: :class:`FairShare` finds them).

    The level is filled as water fills vessels: a session that uses less than an even share and
    either has no backlog or is held back elsewhere keeps what it uses, unlimited; the others
    share what is left evenly, plus the headroom, whether or not they report a backlog (one using
    more than its share is not held back by its source below it). A session not measured yet
    counts for its share at once, so the others make room as soon as it joins, and is not limited
    itself while it starts. Nothing is limited unless two sessions or more share the level and
    one of them waits for more.
    """
    measured = {k: r for k, r in rates.items() if r is not None}
    sharing, left = set(rates), capacity
    while sharing:
        level = max(left, 0.0) / len(sharing)
        content = {k for k in sharing & set(measured)
                   if (not backlog.get(k) or k in elsewhere) and measured[k] < level}
        if not content:
            break
        sharing -= content
        left -= sum(measured[k] for k in content)
    waiting = any(k not in measured or backlog.get(k) for k in sharing)
    if len(sharing) < 2 or not waiting:
        return {k: 0 for k in rates}
    cap = max(1, int(max(left, 0.0) / len(sharing) * (1.0 + HEADROOM)))
    return {k: cap if k in sharing and k in measured else 0 for k in rates}


class _Rate:
    """Bytes received by one session: its rate over the last :data:`WINDOW_S`."""

    def __init__(self) -> None:
        self.samples: Deque[Tuple[float, int]] = collections.deque()

    def add(self, now: float, received: int) -> Optional[float]:
        self.samples.append((now, received))
        while len(self.samples) > 2 and now - self.samples[1][0] >= WINDOW_S:
            self.samples.popleft()
        t0, b0 = self.samples[0]
        return (received - b0) / (now - t0) if now - t0 >= WINDOW_S * 0.9 else None


class FairShare:
    """The daemon's side: :meth:`step` every :data:`PERIOD_S` with the open sessions."""

    def __init__(self) -> None:
        self._rates: Dict[Hashable, _Rate] = {}
        self._caps: Dict[Hashable, int] = {}
        self._totals: Deque[Tuple[float, float]] = collections.deque()
        """(time, all sessions' rate together) over the last PEAK_S."""
        self._short: Dict[Hashable, int] = {}
        """Periods in a row each session received less than SHORT of its limit."""
        self._elsewhere: Set[Hashable] = set()
        """Sessions held back elsewhere: they keep what they use."""
        self._next = 0.0

    def step(self, sessions: Iterable[Any], now: float) -> None:
        """Measure and pace the open ones of ``sessions`` (objects with ``ident``, ``state``,
        ``engine`` and ``backlog``) when a period has passed."""
        if now < self._next:
            return
        self._next = now + PERIOD_S
        live = {s.ident: s for s in sessions if s.state == "open" and s.engine is not None and not s.engine.closed}
        for gone in set(self._rates) - set(live):
            del self._rates[gone]
            self._caps.pop(gone, None)
            self._short.pop(gone, None)
            self._elsewhere.discard(gone)
        rates = {k: self._rates.setdefault(k, _Rate()).add(now, s.engine.stats().recv.bytes)
                 for k, s in live.items()}
        self._totals.append((now, sum(r or 0.0 for r in rates.values())))
        while now - self._totals[0][0] > PEAK_S:
            self._totals.popleft()
        self._find_held_elsewhere(rates)
        limits = caps(rates, {k: bool(s.backlog) for k, s in live.items()}, max(t for _, t in self._totals),
                      self._elsewhere)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("fair share: %s", ", ".join(
                f"{live[k].sid[-6:]} {(r or 0) / 1e6:.1f} MB/s{' backlog' if live[k].backlog else ''}"
                f"{' elsewhere' if k in self._elsewhere else ''} limit {limits[k] / 1e6:.1f}" for k, r in rates.items()))
        for k, cap in limits.items():
            if cap != self._caps.get(k, 0):
                live[k].engine.set_throttle("recv", 0, cap)
                self._caps[k] = cap

    def _find_held_elsewhere(self, rates: Dict[Hashable, Optional[float]]) -> None:
        """A session paced to a share that stays short of it for STUCK_PERIODS is held back by
        something else than the shared bottleneck; one held back elsewhere that receives an even
        share of the last limit again is not."""
        shares = [c for c in self._caps.values() if c]
        share = max(shares) / (1.0 + HEADROOM) if shares else 0.0
        for k, r in rates.items():
            cap = self._caps.get(k, 0)
            if k in self._elsewhere:
                if r is not None and share and r >= SHORT * share:
                    self._elsewhere.discard(k)
                continue
            short = bool(cap) and r is not None and r < SHORT * cap
            self._short[k] = self._short.get(k, 0) + 1 if short else 0
            if self._short[k] >= STUCK_PERIODS:
                self._elsewhere.add(k)
                self._short[k] = 0
