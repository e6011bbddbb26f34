"""A floor under a learned policy: it does not sit below the rate it already reached while the stage
that limits the transfer could add threads, and it does not rest at a balanced point short of
what more threads on every busy stage would carry.

The shipped PPO policy settles well on most paths, but on the engine it sometimes comes to rest
below capacity: on issue 10's read-bound path (10 MB/s per reader, 80 MB/s achievable) it held
6 readers at 58 MB/s for 15 intervals after reaching 83 MB/s, its readers 100% busy and the
network and write threads waiting for data. Nothing in that state is ambiguous, so a small rule
catches it rather than another training round: a :class:`FloorGuard` watches the delivered rate
(the write stage's throughput) against the best the transfer held for two intervals in a row,
and when it stays below
:data:`SHORTFALL` of it for :data:`PATIENCE` intervals in a row (or falls below :data:`SEVERE` of
it in one) it raises every *limiting* stage
(busy at least :data:`BUSY` of its thread-seconds, and itself carrying less than
:data:`SHORTFALL` of the best rate: a busy stage that carries it is not where it is lost) to the
threads that carry the best rate at that stage's measured rate per busy thread. It cuts only to undo its own moves and to trim a
stage with threads to spare behind a limit (below); the policy's choices stand otherwise.

The best rate can be one the path no longer gives (a buffer that drained faster than the source
refills it, a path that slowed down, a total limit that more threads cannot lift). So every raise
is checked: if the next :data:`JUDGE` intervals do not deliver, on average, at least :data:`PAY`
of the expected gain, the best rate is taken down to what the path delivers and the raise is undone
(the raised stages go back to their counts before it, the floors are dropped): the guard does
not leave threads on a path that cannot use them. A floor that paid
stays under the policy's choices (the policy that settled too low would otherwise go back) until
the stage shows spare threads (utilization below :data:`SPARE` for :data:`PATIENCE` intervals).

A policy can also come to rest where every stage carries the same rate, each one busy: in the
simulator the shipped policy held (11, 2, 13) at 0.69 of the oracle's utility on a held-out
random profile, and 9-10 connections where 13 do on the held-out network-bound path. No rate
fell, so the floor above never acts; after :data:`PROBE_AFTER` steady intervals with at least
:data:`PROBE_STAGES` stages busy, the guard *probes*: :data:`PROBE_SHARE` more threads on each
busy stage, judged like a raise (kept if it brings :data:`PAY` of the expected gain, undone
otherwise, and a stage whose probe did not pay is not probed again in the transfer).

Neither move touches a stage whose rate per busy thread has fallen below :data:`DILUTED` of the
best it held: a total limit shares the same rate out over more threads (writers under an
80 MB/s cap at 5 MB/s each where they once did 10), and every such thread looks busy and short.

Behind such a limit the policy itself over-provisions: every thread it adds looks busy, so
nothing it observes says the thread was useless (on the engine's network-bound path, 80 MB/s in
total at 10 MB/s per connection, it added connections one at a time to 14-18 where 8 carry the
rate; in the simulator, started at 14 or 32 connections, it stays there). After
:data:`PROBE_AFTER` intervals at :data:`SHORTFALL` or more of the best rate (and not before the
:data:`TRIM_AFTER`-th) the guard *trims* a busy stage the evidence says has threads to spare: to the
need at the best rate per busy thread it held plus one, back over threads the policy added without
gain, a :data:`TRIM_SHARE` more after a cut that held, or, with no evidence either way, by
:data:`TRIM_SURPLUS` once on a count at rest; and caps the policy's choice there (a *ceiling*).
A cut waits :data:`PROBE_AFTER` intervals after a raise's or probe's verdict: the rate it must
hold is the median of that many intervals, and a trial's short ones would lower it.
Each cut is judged: kept if the next :data:`JUDGE` intervals hold :data:`STEADY` of the delivered
rate and the last of them is not short (for readers, their own rate too: a full buffer hides their
cut); otherwise, after one
interval if it lost more, the stage goes back to its count before the cut, capped there, and is not
trimmed again. A stage whose cut held is not probed. A ceiling is lifted when, the stage busy, the
transfer delivers :data:`LIFT` times what it did when the ceiling was set, for :data:`PATIENCE`
intervals (the limit went away: the path may give more), or when a raise needs more threads
there; a stage at its ceiling whose intervals come short in lumps gets one thread over it, once.

A stage can also be short while the delivered rate stays within :data:`SHORTFALL` of the best: on
the engine's read-bound path 2 writers wrote 70-74 MB/s of the 80 the network brought for 12
intervals, the receiver buffer filling. When the buffer in front of a busy network or write stage
grew in each of the last :data:`RISE` intervals while the stage upstream carried :data:`RISE_GAP`
more, the guard gives the stage the threads for that rate (a *rise*, judged like a probe; one that
does not pay is undone and not tried again from that count).

A stage held back by a full buffer after it (readers by the sender buffer, connections by the
receiver buffer) waits for room, so it is not busy and the trim above never sees it (10 to 13
readers on the engine's issue path where 8 carry the rate): after :data:`PROBE_AFTER` intervals
with the buffer :data:`FULL`, it is cut to its need at its recent rate per busy thread plus one,
judged by its own rate. A cut that did not hold goes back by the threads its loss takes, plus one
when that is half a thread or more (so a cut of :data:`TRIM_SURPLUS` that lost a thread's rate
goes back to where it was). While a cut is on trial the other stages keep their counts.

The guard reads only the :class:`~automdt.policy_contract.Observation` (throughputs, threads,
busy thread-seconds), which the simulator and the live engine both produce, so ``simulate`` and
``transfer`` run the same rule. Observations without busy thread-seconds pass unchanged.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, List, Optional, Tuple

from automdt.simulator.types import Observation, Triple

SHORTFALL = 0.9
"""An interval delivering less than this share of the best rate so far is short (the issue's
90% of the achievable rate)."""
PATIENCE = 2
"""Short intervals in a row before the guard raises a stage (one can be a thread change settling,
or noise: a 4 MiB chunk more or less is 5% of an interval at 80 MB/s)."""
SEVERE = 0.75
"""An interval below this share of the best rate is a fall, not noise: the guard acts at once."""
BUSY = 0.9
"""Share of a stage's thread-seconds spent busy from which it counts as limiting."""
SPARE = 0.6
"""Below this utilization a stage has threads to spare: its floor is released after
:data:`PATIENCE` such intervals."""
DILUTED = 0.75
"""A stage whose rate per busy thread fell below this share of the best it held is shared out by a
total limit (more threads only split the same rate): the guard neither raises nor probes it."""
MIN_BUSY_S = 0.25
"""Busy thread-seconds a stage needs in an interval before its per-thread rate is trusted."""
JUDGE = 2
"""Intervals after a raise in which it must pay."""
PAY = 0.5
"""Share of the expected gain a raise must bring within :data:`JUDGE` intervals."""
STEADY = 0.95
"""Intervals at or above this share of the best rate are steady."""
PROBE_AFTER = 3
"""Steady intervals in a row before the guard probes the limiting stage with more threads."""
PROBE_STAGES = 2
"""Stages that must be busy before a probe: a path where one stage limits and the others wait
is what the policy was trained to settle; several busy stages at once is where it came to rest
short (a balanced point, each stage carrying the same rate)."""
PROBE_SHARE = 0.25
"""A probe adds this share of the stage's threads (at least one)."""
TRIM_SURPLUS = 2
"""Threads above what a busy stage's flow needs at its best rate per busy thread from which the
guard trims it straight to that need plus one (one more is the settling tolerance the issue
allows); also the fewest threads a trial cut takes away."""
TRIM_SHARE = 1 / 4
"""A trial cut takes this share of a busy stage's threads (at least :data:`TRIM_SURPLUS`): a cut
that loses rate from ``g`` threads leaves ``g`` within ``max(2, g / 4) - 1`` of the need, so
within one up to 11."""
TRIM_MIN = 4
"""A stage with fewer threads is not trimmed."""
TRIM_AFTER = 6
"""Intervals a transfer runs before the first cut (the ramp's bursts set no steady rate)."""
LIFT = 1.15
FULL = 0.9
"""A buffer at least this full in each of the last :data:`PROBE_AFTER` intervals holds the stage
that fills it back (the sender buffer the readers, the receiver buffer the network): it waits for
room, so it is not busy, and what it needs is measured by its rate per busy thread
(:meth:`FloorGuard._trim_waiting`)."""
RISE = 3
"""Intervals in a row over which the buffer in front of a busy network or write stage must have
grown before the guard gives that stage threads for the rate that fills it."""
RISE_GAP = 0.05
"""The stage upstream of such a buffer must have carried at least this share more than the stage
(medians of the last :data:`PROBE_AFTER` intervals): a fill that creeps up by a chunk is noise."""
"""A busy stage under a ceiling while the transfer delivers this much more than when the ceiling
was set is no longer held by the limit that set it: the ceiling goes."""


def _utilization(obs: Observation, s: int) -> float:
    """Share of stage ``s``'s thread-seconds spent busy in the interval."""
    assert obs.busy_s is not None
    n, dt = int(obs.threads[s]), float(obs.interval_s)
    return float(obs.busy_s[s]) / (n * dt) if n > 0 and dt > 0 else 0.0


def _per_thread(obs: Observation, s: int) -> float:
    """Stage ``s``'s rate per busy thread (bytes/s); 0 when it was busy too little to trust."""
    assert obs.busy_s is not None
    busy = float(obs.busy_s[s])
    return float(obs.throughput_bps[s]) * float(obs.interval_s) / busy if busy >= MIN_BUSY_S else 0.0


class FloorGuard:
    """Raise the limiting stages when the delivered rate stays below what the transfer reached,
    probe a balanced rest, trim a stage with threads to spare behind a limit.

    :param max_threads: upper bound of every stage.
    """

    def __init__(self, max_threads: int = 32) -> None:
        self.max_threads = int(max_threads)
        self.reset(max_threads)

    def reset(self, max_threads: Optional[int] = None) -> None:
        """Start a new transfer."""
        if max_threads is not None:
            self.max_threads = int(max_threads)
        self.best = 0.0
        """The best delivered rate (bytes/s) the transfer held for two intervals in a row (a single
        interval can be a buffer draining) and the path still gives."""
        self.last: Optional[float] = None
        self.short = 0
        self.short_sum = 0.0
        self.judged: List[float] = []
        self.floors: List[int] = [0, 0, 0]
        self.spare = [0, 0, 0]
        self._judging: Optional[Tuple[int, float, float, Tuple[int, int, int], Tuple[int, int, int]]] = None
        """(intervals left, rate before the raise, the rate it should give, floors before it, the
        counts to go back to if it does not pay (0: a stage it did not raise))."""
        self.raises = 0
        """Raises so far (for logs and tests)."""
        self.note: Optional[str] = None
        """What the last call did, for the interval log (``guard``): ``"raise"``, ``"probe"``,
        ``"rise"`` or ``"trim"`` (decided now), ``"trial:raise"``/``"trial:probe"``/``"trial:rise"``/``"trial:trim"`` (the interval
        that ended ran one, being judged), with ``",undo"`` when it did not pay; None: nothing."""
        self.steady = 0
        self.rate_ref = [0.0, 0.0, 0.0]
        """Per stage, the best rate per busy thread (bytes/s) it held for two intervals in a row."""
        self.probe_blocked = [False, False, False]
        """Stages a probe did not pay for: not probed again in this transfer."""
        self._probing: Optional[Tuple[int, ...]] = None
        self.probes = 0
        """Probes so far (for logs and tests)."""
        self.ceilings: List[int] = [0, 0, 0]
        """Per stage, the most threads the policy may run there after a trim (0: no ceiling)."""
        self.trim_blocked = [False, False, False]
        """Stages a trim did not pay for: not trimmed again in this transfer."""
        self.lift = [0, 0, 0]
        self.lumps: List[List[bool]] = [[], [], []]
        """Per stage, whether each recent interval was short while the stage sat at its cap."""
        self.spared = [False, False, False]
        """Stages given one thread over their cap for the lumps of too few threads (once)."""
        self.ceiling_rate = [0.0, 0.0, 0.0]
        """Per stage, the delivered rate when its ceiling was set."""
        self.recent_stage: List[Tuple[float, ...]] = []
        """Each stage's rate in the last :data:`PROBE_AFTER` intervals (the last is the delivered rate)."""
        self.judged_stage: List[float] = []
        """The cut stage's own rate in each interval of a cut's trial, as a share of its rate before."""
        self._trimming: Optional[Tuple[int, int, float, float, int]] = None
        """(the stage cut, its count before, the delivered rate before the cut, the stage's own rate
        before it, its floor before it)."""
        self.trims = 0
        """Trims so far (for logs and tests)."""
        self.intervals = 0
        self.calm = 0
        """Intervals in a row at or above :data:`SHORTFALL` of the best rate (a cut needs
        :data:`PROBE_AFTER` of them)."""
        self._ceilings_before: List[int] = [0, 0, 0]
        self.futile = [0, 0, 0]
        """Per stage, threads added while the rate held that brought no gain (the evidence that a
        limit shares the stage's rate out)."""
        self.probed = [False, False, False]
        """Stages whose floor a probe set (a probe during the ramp's rise can seem to pay)."""
        self.rest = [0, 0, 0]
        """Per stage, intervals in a row its count stayed the same."""
        self.checked = [False, False, False]
        """Stages cut at least once in this transfer (the check without evidence is made once)."""
        self.cut_held = [False, False, False]
        """Stages a cut took threads from without losing rate: cut again after the next steady run."""
        self._prev_threads: Optional[Tuple[int, int, int]] = None
        self._held: Tuple[int, int, int] = (0, 0, 0)
        """The counts when the cut on trial was decided: the other stages keep at least these while
        it is judged (one change at a time)."""
        self.fills: List[Tuple[float, float]] = []
        """The (sender, receiver) buffer fills of the last :data:`RISE` + 1 intervals."""
        self.recent_per_thread: List[Tuple[float, ...]] = []
        """Each stage's rate per busy thread in the last :data:`PROBE_AFTER` intervals (0: busy too little)."""
        self._chain = True
        """Whether the cut on trial may be followed by a deeper one if it holds (not after a cut to a
        need measured with the stage's own rate per busy thread)."""
        self.rise_blocked = [0, 0, 0]
        """Per stage, the count from which a rise did not pay (0: none): no rise from it or above."""
        self._rising = False
        """The trial being judged is a rise (a probe of one stage, blocked from its count if undone)."""
        self.rises = 0
        """Rises so far (for logs and tests)."""
        self.recent_threads: List[Tuple[int, int, int]] = []
        """The counts that ran in the last :data:`PROBE_AFTER` intervals (the run's tail keeps the
        network and write threads each held through them)."""

    def __call__(self, obs: Observation, proposed: Triple) -> Triple:
        """The counts to run next: ``proposed`` (the policy's choice), raised or cut where the guard
        acts (or, when its last move did not pay, that move undone)."""
        self.note = None
        if obs.busy_s is None:
            return proposed
        delivered = float(obs.throughput_bps[2])
        self.intervals += 1
        last, self.last = self.last, delivered
        self.recent_stage = (self.recent_stage + [tuple(float(x) for x in obs.throughput_bps)])[-PROBE_AFTER:]
        self.fills = (self.fills + [(float(obs.buffer_fill[0]), float(obs.buffer_fill[1]))])[-(RISE + 1):]
        self.recent_per_thread = (self.recent_per_thread + [tuple(_per_thread(obs, i) for i in range(3))])[-PROBE_AFTER:]
        ran = (int(obs.threads[0]), int(obs.threads[1]), int(obs.threads[2]))
        self.recent_threads = (self.recent_threads + [ran])[-PROBE_AFTER:]
        self._learn_rates()
        self._count_futile(obs, delivered)
        self._release_spare(obs)
        self._lift_ceilings(obs, delivered)
        if self._trimming is not None:
            after = self._after_trim(obs, delivered, proposed)
            if after is not None:
                return after
        if self._judging is not None:
            kind = "rise" if self._rising else "probe" if self._probing else "raise"
            verdict = self._judge(delivered)
            self.note = f"trial:{kind}"  # the interval that ended ran the raise or probe
            if verdict == "judging":
                return self._floored(proposed)
            # a cut's baseline is the last PROBE_AFTER intervals: none of them may be a trial (after a
            # probe undone on the engine's read-bound path its two short intervals made 74 MB/s of 80
            # the rate to hold, and a cut of readers to 7, where 8 carry the rate, held that)
            self.calm = 0
            if verdict is not None:  # did not pay: back to the counts before the raise
                self._block_trial(verdict)
                self.note = f"trial:{kind},undo"
                return tuple(min(p, u) if u else p for p, u in zip(proposed, verdict))  # type: ignore[return-value]
            self._probing, self._rising = None, False
        if last is not None:
            self.best = max(self.best, min(last, delivered))
        if delivered >= SHORTFALL * self.best:
            self.short, self.short_sum = 0, 0.0
            self._holding(obs, proposed, delivered)
            return self._floored(proposed)
        self.steady = self.calm = 0
        self.short += 1
        self.short_sum += delivered
        if self.short < PATIENCE and delivered >= SEVERE * self.best:
            return self._floored(proposed)
        before = list(self.floors)
        self._ceilings_before = list(self.ceilings)
        undo = [0, 0, 0]
        for s in range(3):
            need = self._need(obs, s)
            if need > max(proposed[s], self.floors[s]) and self._short_itself(s):
                self.floors[s], self.probed[s] = need, False
                if self.ceilings[s] and need > self.ceilings[s]:
                    self.ceilings[s] = 0  # the rate needs more threads there than the trim left
                undo[s] = max(int(obs.threads[s]), int(proposed[s]))
        if any(undo):
            self.raises += 1
            self._judging = (JUDGE, self.short_sum / self.short, self.best, (before[0], before[1], before[2]),
                             (undo[0], undo[1], undo[2]))
            self.note = "raise"
            self.short, self.short_sum, self.judged = 0, 0.0, []
        return self._floored(proposed)

    def _block_trial(self, undo: Tuple[int, ...]) -> None:
        """A probe or rise did not pay: its stages are not probed again, or get no rise again from
        the count it started at (``undo``)."""
        for i in self._probing or ():
            if self._rising:
                self.rise_blocked[i] = int(undo[i])
            else:
                self.probe_blocked[i] = True
        self._probing, self._rising = None, False

    def _after_trim(self, obs: Observation, delivered: float, proposed: Triple) -> Optional[Triple]:
        """While a cut is judged: the counts to run (capped by its ceiling), or after a cut that
        lost rate the counts it goes back to; None once it held (the guard goes on as usual)."""
        undo = self._judge_trim(obs, delivered)
        self.note = "trial:trim"
        if undo == "judging":
            return self._floored(proposed)
        if undo is None:
            return None
        self.note = "trial:trim,undo"
        return self._floored((max(proposed[0], undo[0]), max(proposed[1], undo[1]), max(proposed[2], undo[2])))

    def _holding(self, obs: Observation, proposed: Triple, delivered: float) -> None:
        """The rate holds: after :data:`PROBE_AFTER` such intervals a cut where the evidence says a
        stage has threads to spare; else, after as many steady ones, a probe."""
        self.calm += 1
        self.steady = self.steady + 1 if delivered >= STEADY * self.best else 0
        if self._rise(obs, proposed, delivered):
            return
        if self.calm >= PROBE_AFTER and self.intervals >= TRIM_AFTER and self._trim(obs, proposed):
            return
        if self.steady >= PROBE_AFTER:
            self._probe(obs, proposed, delivered)

    def _probe(self, obs: Observation, proposed: Triple, delivered: float) -> None:
        """Steady: try :data:`PROBE_SHARE` more threads on every stage that limits (busy at least
        :data:`BUSY`; on a balanced path all three); kept if the rate rises by :data:`PAY` of the
        expected gain, undone otherwise (and those stages are not probed again). Finds the threads
        a policy that settled short never tried; a stage held by a total limit costs one probe."""
        assert obs.busy_s is not None
        self.steady = 0
        before = list(self.floors)
        undo = [0, 0, 0]
        ratio = float("inf")
        util = [_utilization(obs, i) for i in range(3)]
        if sum(u >= BUSY for u in util) < PROBE_STAGES:
            return
        for s in range(3):
            n = max(int(obs.threads[s]), int(proposed[s]), self.floors[s])
            if (self.probe_blocked[s] or util[s] < BUSY or n >= self.max_threads
                    or self._diluted(s, _per_thread(obs, s))):
                continue
            m = min(self.max_threads, n + max(1, math.ceil(PROBE_SHARE * n)))
            undo[s], self.floors[s], self.probed[s] = n, m, True
            ratio = min(ratio, m / n)
        if not any(undo):
            return
        self.probes += 1
        self._begin_trial("probe", delivered, delivered * ratio, before, undo)

    def _begin_trial(self, kind: str, delivered: float, expected: float, before: List[int], undo: List[int]) -> None:
        """Judge a probe or rise (``kind``) of the stages ``undo`` names (their counts to go back
        to) over the next :data:`JUDGE` intervals, against ``delivered`` now and the ``expected``
        rate; ``before``: the floors to restore if it does not pay."""
        self._probing, self._rising = tuple(i for i in range(3) if undo[i]), kind == "rise"
        self.note = kind if self.note is None else f"{self.note},{kind}"
        self._judging = (JUDGE, delivered, expected, (before[0], before[1], before[2]), (undo[0], undo[1], undo[2]))
        self.judged = []

    def _rise(self, obs: Observation, proposed: Triple, delivered: float) -> bool:
        """The buffer in front of a busy network or write stage grew in each of the last :data:`RISE`
        intervals while the stage upstream carried :data:`RISE_GAP` more than it: the stage is
        short of the rate that reaches it, though the delivered rate is still within
        :data:`SHORTFALL` of the best (on the engine's read-bound path 2 writers wrote 70-74 MB/s
        of the 80 the network brought, the receiver buffer filling, for 12 intervals). Give it the
        threads for that rate at its present rate per thread, judged like a probe (kept if the rate
        rises by :data:`PAY` of the gain expected, up to what the stage upstream carried); one
        that does not pay is undone, and the stage gets no rise from that count up again. A stage
        whose rate per thread fell is not left out (as raises and probes leave it): at 250 MB/s 2
        writers fell from 116 to 87 MB/s each while the receiver buffer filled, and a trial costs
        no rate.
        Returns whether it rose (the write stage is looked at first: its rate is the delivered one)."""
        if self.intervals < PROBE_AFTER or len(self.fills) <= RISE:
            return False
        for s in (2, 1):
            fill = [f[s - 1] for f in self.fills]
            if not all(a < b for a, b in zip(fill, fill[1:])):
                continue
            n = max(int(obs.threads[s]), int(proposed[s]), self.floors[s])
            if (n >= self.max_threads or (self.rise_blocked[s] and n >= self.rise_blocked[s])
                    or (self.ceilings[s] and n >= self.ceilings[s]) or _utilization(obs, s) < BUSY):
                continue
            up = statistics.median(r[s - 1] for r in self.recent_stage)
            own = statistics.median(r[s] for r in self.recent_stage)
            if own <= 0 or up < (1 + RISE_GAP) * own:
                continue
            m = min(self.max_threads, n + max(1, math.ceil(n * (up / own - 1) - 0.05)))
            before = list(self.floors)
            undo = [0, 0, 0]
            undo[s], self.floors[s], self.probed[s] = n, m, False
            self.rises += 1
            self.steady = 0
            self._begin_trial("rise", delivered, min(up, delivered * m / n), before, undo)
            return True
        return False

    def _count_futile(self, obs: Observation, delivered: float) -> None:
        """Threads a stage gained while the rate held count as futile unless the rate rose by
        :data:`PAY` of what they would carry at the stage's current rate per thread."""
        now = (int(obs.threads[0]), int(obs.threads[1]), int(obs.threads[2]))
        prev, self._prev_threads = self._prev_threads, now
        if prev is None or self.best <= 0:
            return
        for s in range(3):
            added = now[s] - prev[s]
            self.rest[s] = self.rest[s] + 1 if added == 0 else 0
            if added < 0:
                self.futile[s] = max(0, self.futile[s] + added)
            elif added > 0 and self.calm > 0:
                gain = delivered >= self.best * (1 + PAY * added / max(1, prev[s]))
                self.futile[s] += 0 if gain else added

    def _trim(self, obs: Observation, proposed: Triple) -> bool:
        """Steady: cut a busy stage (at least :data:`TRIM_MIN` threads, not blocked, carrying what
        is delivered) that the evidence says has threads to spare: :data:`TRIM_SURPLUS` or more
        above what its flow needs at the best rate per busy thread it held (cut to that need plus
        one), threads added without gain (:data:`TRIM_SURPLUS` or more: back to the count before
        them, :data:`TRIM_SHARE` at most), a cut before that held (:data:`TRIM_SHARE` more), or
        else once, on a count at rest that no raise of the guard measured, :data:`TRIM_SURPLUS`;
        every cut takes at least :data:`TRIM_SURPLUS`. Cap it there while the cut is judged.
        Returns whether it cut (then no probe this interval)."""
        best: Optional[Tuple[int, int, int]] = None
        would = self._floored(proposed)
        # a burst (a buffer draining) is not the rate, nor a lump the rate held for one interval only
        delivered_before = min(self.best, statistics.median(r[2] for r in self.recent_stage))
        for s in range(3):
            n = max(int(obs.threads[s]), would[s])
            if self.trim_blocked[s] or n < TRIM_MIN or _utilization(obs, s) < BUSY:
                continue
            if statistics.median(r[s] for r in self.recent_stage) < STEADY * delivered_before:
                continue  # it carries less than is delivered: a buffer drains, it is short, not spare
            ref = self.rate_ref[s]
            flow = min(float(obs.throughput_bps[s]), float(obs.throughput_bps[2]))  # a lump of chunks is no flow
            need = math.ceil(flow / ref) if ref > 0 else n
            cuts = []
            if n - (need + 1) >= TRIM_SURPLUS:
                cuts.append(need + 1)  # to the need at the best rate per thread it held
            quarter = n - max(TRIM_SURPLUS, int(TRIM_SHARE * n))
            if self.futile[s] >= TRIM_SURPLUS:
                # back to before the threads added in vain, a quarter at most (a ramp's adds can look vain
                # against a best a draining buffer set)
                cuts.append(max(int(obs.threads[s]) - self.futile[s], quarter))
            if self.cut_held[s]:
                cuts.append(quarter)  # the last cut held: a quarter more
            measured = self.floors[s] and not self.probed[s]  # a raise set it from a measured need
            if (not cuts and not self.checked[s] and not measured and self.rest[s] >= PROBE_AFTER
                    and int(obs.threads[s]) == would[s]):
                cuts.append(n - TRIM_SURPLUS)  # no evidence either way, a count at rest: is it within one?
            cuts = [c for c in cuts if n - c >= TRIM_SURPLUS]
            if cuts and (best is None or n > best[1]):
                best = (s, n, max(1, min(cuts)))
        self._chain = True
        if best is None:
            best = self._trim_waiting(obs, would, delivered_before)
            self._chain = best is None
        if best is None:
            return False
        s, n, m = best
        floor = self.floors[s]
        self.ceilings[s], self.floors[s], self.futile[s], self.checked[s] = m, 0, 0, True
        self.steady = self.calm = 0
        self.trims += 1
        own = min(delivered_before, statistics.median(r[s] for r in self.recent_stage))  # readers may run ahead
        self._trimming = (s, n, delivered_before, own, floor)
        self._held = (int(obs.threads[0]), int(obs.threads[1]), int(obs.threads[2]))
        self.judged, self.judged_stage = [], []
        self.note = "trim" if self.note is None else f"{self.note},trim"
        return True

    def _trim_waiting(self, obs: Observation, would: Triple, delivered_before: float) -> Optional[Tuple[int, int, int]]:
        """Readers held back by a full sender buffer, or connections by a full receiver buffer (at
        least :data:`FULL` in each of the last :data:`PROBE_AFTER` intervals), wait for room, so
        they are not busy and the trim of busy stages does not see them: on the engine's issue path
        10 to 13 readers stayed where 8 carry the 80 MB/s. The need is the delivered rate at the
        stage's rate per busy thread (the median of the last :data:`PROBE_AFTER` intervals, not the
        best it held: after a cut from 32 readers that one counted the chunks of the threads cut,
        and a cut to it lost 11%); cut to that need plus one (a tenth of a thread under it is a
        lump), by one thread or more. Judged by the stage's own rate as well (the full buffer hides
        the cut from the delivered rate); one that holds is not taken further. Returns (stage,
        count, cut) or None; the readers first."""
        for s in (0, 1):
            n = max(int(obs.threads[s]), would[s])
            if (self.trim_blocked[s] or n < TRIM_MIN or len(self.fills) < PROBE_AFTER
                    or any(f[s] < FULL for f in self.fills[-PROBE_AFTER:])):
                continue
            rates = [r[s] for r in self.recent_per_thread]
            if len(rates) < PROBE_AFTER or min(rates) <= 0:
                continue
            need = max(1, math.ceil(delivered_before / statistics.median(rates) - 0.1))
            if n - (need + 1) >= 1:
                return (s, n, need + 1)
        return None

    def _judge_trim(self, obs: Observation, delivered: float) -> Any:
        """``"judging"`` until :data:`JUDGE` intervals ran with the cut (one, if the delivered
        rate, or a cut of readers' own, fell below :data:`SHORTFALL` of the rate before it: one
        interval within a twentieth of it is a lump of chunks as often as a loss, and on the
        engine a cut of 11 readers to the 9 that carry the rate, undone after one interval at
        0.949, left the readers at 11); then None if the delivered rate held :data:`STEADY` of it on
        average, its last interval not short (the first can hold the cut threads' last chunks) and, for readers, their own rate in the last interval :data:`STEADY` of theirs
        before (at most the delivered rate) (the readers' own rate shows a cut of readers while a
        full buffer still feeds the network; the first interval still has the cut readers' chunks,
        and both come in chunk-sized lumps: on the engine's issue path 8 readers, which carry the
        80 MB/s, read 74 in a trial's first interval): the ceiling stays and the stage is not
        probed again. Else the count to go back to (:meth:`_back_to`), capped there
        (and the stage is not trimmed again)."""
        assert self._trimming is not None
        s, n, before, before_s, floor = self._trimming
        held = delivered / before if before > 0 else 1.0
        own = float(obs.throughput_bps[s]) / before_s if before_s > 0 else 1.0
        self.judged.append(held)
        self.judged_stage.append(own)
        by_own = s == 0 or not self._chain  # readers, or a stage cut while it waited on a full buffer
        if len(self.judged) < JUDGE and held >= SHORTFALL and (not by_own or own >= SHORTFALL):
            return "judging"
        self._trimming = None
        own_held = not by_own or self.judged_stage[-1] >= STEADY  # the first interval still has the cut threads' chunks
        # and the last interval not short: on the engine's write-bound path a cut of 9 writers to 7
        # delivered 86 MB/s of 80 in its first interval (the cut threads' chunks landing) and 69 in
        # its second; the mean held, and a raise came two short intervals later
        if sum(self.judged) / len(self.judged) >= STEADY and own_held and self.judged[-1] >= SHORTFALL:
            self.probe_blocked[s] = True
            self.cut_held[s] = self._chain  # the next may take more (the best rate per thread may be a shared-out one)
            self.ceiling_rate[s] = before
            return None
        self.trim_blocked[s] = True
        # back by the threads that carry what the cut lost, at the best rate per busy thread the stage
        # held (the rate per thread the cut showed is no guide: the cut threads' chunks land in it),
        # and one more, at most to n; capped there, and a raise that needs more lifts the cap
        back = self._back_to(s, n, before, before_s)
        self.ceilings[s], self.floors[s], self.ceiling_rate[s] = back, min(floor, back), before
        if back >= n:
            self.spared[s] = True  # n carried the rate before the cut: short lumps there want no thread more
        undo = [0, 0, 0]
        undo[s] = back
        return tuple(undo)

    def _back_to(self, s: int, n: int, before: float, before_s: float) -> int:
        """The count a cut of stage ``s`` from ``n`` that did not hold goes back to: the cut count
        plus the threads that carry the rate it lost (the delivered rate's mean share over the
        trial, for readers also their own rate's last share) at the stage's best rate per busy
        thread, plus one if that is half a thread or more, at most ``n`` (so a cut of
        :data:`TRIM_SURPLUS` that lost a thread's rate goes back to ``n``, which its loss shows to
        be within one of the need; one that lost a lump, 4 MB/s of 80 at 10 per thread, to one
        thread over the cut: 10 writers cut to the 8 that carry the rate, undone at a mean of 0.95
        of it, had gone back to 10); ``n`` when that rate is unknown. A deeper cut
        (a quarter, or to the need at a rate per thread a total limit shared out) does not undo
        what its loss shows was spare: 16 writers cut to 12 that lost 20 MB/s at 10 per writer go
        back to 15."""
        cut, ref = self.ceilings[s], self.rate_ref[s]
        lost = before * (1.0 - sum(self.judged) / len(self.judged))
        if s == 0 or not self._chain:
            lost = max(lost, before_s * (1.0 - self.judged_stage[-1]))
        if ref <= 0 or not 0 < cut < n:
            return n
        threads = lost / ref
        margin = 1 if threads >= 0.5 else 0  # under half a thread lost: the one thread back carries twice that
        return min(n, cut + margin + max(1, math.ceil(threads - 0.05)))  # a twentieth of a thread is noise

    def end_trials(self, current: Triple) -> Triple:
        """The run's tail began (nobody asks the guard again): a cut still on trial is undone,
        ``current`` with the cut stage back at its count before the cut; and the network and write
        stages, which drain the buffers there, keep at least the count each ran in every one of the
        last :data:`PROBE_AFTER` intervals (on the engine's write-bound path the policy took one of
        the 8 writers that carry the rate away in the interval before the tail, and the tail held 7
        at 62-79 MB/s of 80 for six intervals, with no floor to raise them; a ramp's passing counts
        are not kept)."""
        out = [int(x) for x in current]
        if len(self.recent_threads) >= PROBE_AFTER:
            for s in (1, 2):
                out[s] = max(out[s], min(t[s] for t in self.recent_threads))
        if self._trimming is not None:
            s, n = self._trimming[0], self._trimming[1]
            self._trimming = None
            self.ceilings[s] = 0
            out[s] = max(out[s], n)
        return (out[0], out[1], out[2])

    def _lift_ceilings(self, obs: Observation, delivered: float) -> None:
        for s in range(3):
            full = (self.ceilings[s] and _utilization(obs, s) >= BUSY
                    and delivered >= LIFT * self.ceiling_rate[s] > 0)
            self.lift[s] = self.lift[s] + 1 if full else 0
            if self.lift[s] >= PATIENCE:
                self.ceilings[s] = 0
            # at its cap, busy: short intervals come from the lumps of too few threads (chunks end
            # together); PATIENCE of them within 2 * PROBE_AFTER intervals give the stage one more
            at_cap = bool(self.ceilings[s] and self._trimming is None and int(obs.threads[s]) >= self.ceilings[s]
                          and _utilization(obs, s) >= BUSY)
            self.lumps[s] = (self.lumps[s] + [at_cap and delivered < SHORTFALL * self.best])[-2 * PROBE_AFTER:]
            if at_cap and not self.spared[s] and sum(self.lumps[s]) >= PATIENCE and self.ceilings[s] < self.max_threads:
                self.ceilings[s] += 1
                self.floors[s] = max(self.floors[s], self.ceilings[s])
                self.spared[s] = True

    def _short_itself(self, s: int) -> bool:
        """Stage ``s`` carried less than :data:`SHORTFALL` of the best rate in the median of the last
        :data:`PROBE_AFTER` intervals. A busy stage that carries the rate is not where it is lost (on
        the engine's read-bound path 9 readers read 80 MB/s under a total limit while 2 writers wrote
        70: a raise of every busy stage gave the readers a tenth they could not use, and kept it)."""
        return statistics.median(r[s] for r in self.recent_stage) < SHORTFALL * self.best

    def _need(self, obs: Observation, s: int) -> int:
        """Threads stage ``s`` needs to carry the best rate, if it limits the transfer; else 0. At
        this interval's rate per busy thread, counting no more than was delivered: a stage ahead of
        a buffer moves more than reaches the destination (in the simulator 6 readers read 12 MB/s
        each while 62 were delivered, and a raise to the 7 that rate would need did not pay)."""
        per_thread = _per_thread(obs, s)
        if _utilization(obs, s) < BUSY or per_thread <= 0 or self._diluted(s, per_thread):
            return 0
        own, delivered = float(obs.throughput_bps[s]), float(obs.throughput_bps[2])
        carried = per_thread * min(1.0, delivered / own) if own > 0 and delivered > 0 else per_thread
        return min(self.max_threads, math.ceil(self.best / carried))

    def _learn_rates(self) -> None:
        """Raise each stage's :attr:`rate_ref` to the rate per busy thread it held in the last two
        intervals (:attr:`recent_per_thread`)."""
        if len(self.recent_per_thread) >= 2:
            last, now = self.recent_per_thread[-2], self.recent_per_thread[-1]
            self.rate_ref = [max(r, min(a, b)) for r, a, b in zip(self.rate_ref, now, last)]

    def _diluted(self, s: int, per_thread: float) -> bool:
        """Stage ``s`` runs below :data:`DILUTED` of its best rate per busy thread: a total limit
        shares its rate out, and more threads would not raise it."""
        return per_thread < DILUTED * self.rate_ref[s]

    def _judge(self, delivered: float) -> Any:
        """Weigh the last raise with this interval's rate: ``"judging"`` until :data:`JUDGE`
        intervals ran with it, then None if their mean rate brought :data:`PAY` of the expected
        gain (its floors stay), else the counts to go back to (0: a stage it did not raise)."""
        assert self._judging is not None
        left, before, expected, floors, undo = self._judging
        self.judged.append(delivered)
        if len(self.judged) < left:
            return "judging"
        self._judging = None
        got = sum(self.judged) / len(self.judged)
        if got >= before + PAY * (expected - before):
            return None
        # it did not pay: the best rate is not there to reach; forget it and undo the raise (a rise
        # was not made for the best rate: the stage it gave threads to was not the one short). Never
        # up: a probe's rate before is the interval's, and a buffer's burst (109 MB/s on the
        # experiments' read-bound path, 80 achievable) made it the best, every interval then short,
        # and a raise to the 13 readers 109 would take
        if not self._rising:
            self.best = min(self.best, max(got, before))
        self.floors = list(floors)
        if self._probing is None:
            self.ceilings = list(self._ceilings_before)  # a raise that lifted a ceiling and did not pay
        return undo

    def _release_spare(self, obs: Observation) -> None:
        for s in range(3):
            self.spare[s] = self.spare[s] + 1 if _utilization(obs, s) < SPARE else 0
            if self.spare[s] >= PATIENCE:
                self.floors[s] = 0

    def _floored(self, proposed: Triple) -> Triple:
        """``proposed`` raised to the floors and cut to the ceilings; while a cut is on trial the
        other stages keep at least their counts when it was decided (on the engine's read-bound path
        the policy took a writer away in the interval the floor cut 13 readers to 10: the two
        writers' 75 MB/s failed the readers' cut, which went back to 13 for the rest of the run)."""
        r, n, w = (min(self.max_threads, c or self.max_threads, max(int(p), f))
                   for p, f, c in zip(proposed, self.floors, self.ceilings))
        if self._trimming is not None:
            s = self._trimming[0]
            r, n, w = (x if i == s else max(x, h) for i, (x, h) in enumerate(zip((r, n, w), self._held)))
        return (r, n, w)
