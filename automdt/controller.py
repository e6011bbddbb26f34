"""The one place where a policy meets the live engine.

Every ``interval_s`` the controller turns the engine counters of both ends (the sender engine's
:class:`~automdt.transfer_engine.SenderStats`, the receiver's
:class:`~automdt.transfer_engine.ReceiverStats` from its last ``status`` reply) into an
:class:`~automdt.policy_contract.Observation` (what the simulator also produces), asks the policy
for the next (read, net, write) thread counts, applies them (read and net on the local sender
engine, write through the control channel to the receiver), and writes one
:class:`~automdt.interval.IntervalRecord` as a JSON line to the interval log. The thread counts
it observes and logs are the ones the engines report (``threads_target``: after the receiver's
own clamp), not the ones it asked for. Its first log line (``"start"``) says where the thread
counts started and why (:mod:`automdt.start`).
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, NamedTuple, Optional, Sequence, Tuple

from automdt.interval import IntervalRecord
from automdt.policy_contract import STAGES, Observation, Policy, PolicyBase, Triple, as_policy, clamp_triple

log = logging.getLogger("automdt.controller")

MAX_POLICY_FAILURES = 3
"""Intervals in a row in which the policy raises or returns no valid triple before the controller
hands the run to the shield's fallback controller for good."""


@dataclass(frozen=True)
class ControllerSettings:
    """How the controller treats the edges of a run (recorded in the interval log's ``start``
    record; experiments change them to measure what they are worth, ``automdt transfer`` uses the
    defaults).

    :param early_intervals: the first intervals of a policy that takes a start, as fractions of
        ``interval_s`` (:data:`EARLY_INTERVALS`; ``()`` none); baselines never get them.
    :param end_hold: hold the counts while what is left to write would be written within one
        interval (the change could not pay back what it costs).
    :param warm_hold: hold a start from the job's history until the pipeline delivers.
    :param tail_hold: hold the counts once the source is read to the end, for policies that do not
        say they act there (``asked_in_tail``: the capacity controller and the shield's fallback
        do; a learned policy never saw a source that has ended).
    """

    early_intervals: Tuple[float, ...] = (0.5, 0.5)
    end_hold: bool = True
    warm_hold: bool = True
    tail_hold: bool = True

    def to_dict(self) -> Dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

if TYPE_CHECKING:
    from automdt.transfer_engine.engine import BufferStats, ReceiverStats, SenderStats


class Controller:
    """Drives a policy at a fixed interval.

    :param policy: any :class:`~automdt.policy_contract.Policy`.
    :param apply: called with the new triple whenever the policy chooses one.
    :param interval_s: control interval in seconds.
    :param max_threads: upper bound for each stage.
    :param log_file: open text file for the per-interval JSON lines, or None.
    :param start: where to start (:func:`automdt.start.choose_start`); None: the policy's own.
    :param bound: threads per stage the dataset can use (:func:`automdt.start.dataset_bound`):
        applied to the choices of policies that take a start (PPO) for the whole run.
    :param write_max: the receiver's bound on write threads (``max_threads`` of its ``opened``
        reply): the write count the controller applies never exceeds it.
    :param early_intervals: lengths in seconds of the first intervals (each at most ``interval_s``),
        after which every interval is ``interval_s`` long; None: :func:`default_early_intervals`.
    :param settings: the run's :class:`ControllerSettings` (default: the defaults).

    A policy that raises, or returns something that is not a triple of counts, does not end the
    transfer: the counts stay, one warning per kind of failure names the policy and the error, and
    after :data:`MAX_POLICY_FAILURES` failing intervals in a row the ``fallback`` controller (the
    sender gives the shield's, :class:`automdt.agents.shield.Fallback`) drives the rest of the run;
    without one the counts stay.

    The policy's optional hooks are those of :class:`~automdt.policy_contract.PolicyBase`: where it
    starts (:mod:`automdt.start`), whether it is asked in a run's tail, a start given from outside,
    its annotation for the interval log. A policy with only ``reset`` and ``act`` gets their defaults
    (:func:`~automdt.policy_contract.as_policy`).
    """

    def __init__(self, policy: Policy, apply: Callable[[Triple], None], interval_s: float = 1.0,
                 max_threads: int = 32, log_file: Any = None, start: Any = None, bound: Optional[int] = None,
                 write_max: Optional[int] = None, early_intervals: Optional[Sequence[float]] = None,
                 settings: Optional[ControllerSettings] = None,
                 fallback: Optional[Callable[[int], PolicyBase]] = None):
        self.settings = settings or ControllerSettings()
        self.policy = as_policy(policy)
        self.features = self.policy.features()
        self.fallback = fallback
        self.apply = apply
        self.interval_s = interval_s
        self.max_threads = max_threads
        self.log_file = log_file
        self.start_choice = start
        self.limit = max_threads
        if bound is not None and start is not None and start.source != "threads":
            from automdt.start import takes_start

            if takes_start(self.policy):
                self.limit = max(1, min(max_threads, int(bound)))
        self.write_max = max(1, int(write_max)) if write_max else None
        self.share: Optional[Tuple[int, int]] = None
        """The receiver's share for this run, ``(network threads, write threads)``
        (:meth:`set_share`); None: no share known (a local run, an older receiver)."""
        if early_intervals is None:
            early_intervals = default_early_intervals(policy, interval_s, self.settings.early_intervals)
        self.early_intervals: Tuple[float, ...] = tuple(min(float(x), interval_s) for x in early_intervals)
        """Lengths of the first intervals, before the steady ``interval_s``."""
        self.threads: Triple = (1, 1, 1)
        """The counts applied last (what the engines were asked for)."""
        self.t0 = time.monotonic()
        self._last_t = self.t0
        self._last: Optional[Tuple[int, int, int]] = None
        self._last_busy: Optional[StageSeconds] = None
        self._last_tcp: Tuple[int, int] = (0, 0)
        self._raw: Tuple[Tuple[int, int, int], StageSeconds] = ((0, 0, 0), StageSeconds())
        self._cpu = (time.process_time(), time.monotonic())
        self.history: list[IntervalRecord] = []
        self.last_record: Optional[IntervalRecord] = None
        self.start_record: Optional[Dict[str, Any]] = None
        self._warm = False
        self._t_base = 0.0
        self.tail = False
        """The source is read to the end (the last :class:`Progress` given to :meth:`tick`): the
        buffers drain and the policy is no longer asked."""
        self.to_deliver: Optional[int] = None
        """Bytes the run has still to write at the destination (the last :class:`Progress`; None:
        unknown). While they would be written within one ``interval_s`` at the last interval's
        write rate, the policy is not asked either (:meth:`tick`: the run is ending; ``end_hold``
        of :class:`ControllerSettings`)."""
        self.end_hold = self.settings.end_hold
        self.failures: Dict[str, int] = {}
        """Failed intervals of the policy by kind of failure (``"ValueError"``, ``"bad triple"``)."""
        self._failing = 0
        self.annotations: Dict[str, Any] = {}
        """Fields added to every interval record from now on (the sender sets ``throttle``, the
        throttle spec in force at the end of the interval)."""
        self.start_notes: Dict[str, Any] = {}
        """Fields added to the ``start`` record (the sender sets ``chunk_bytes``, the run's chunk size)."""

    def _clamp(self, t: Any, limit: int) -> Triple:
        r, n, w = clamp_triple(t, limit)
        if self.write_max is not None:
            w = min(w, self.write_max)
        if self.share is not None:
            n, w = min(n, self.share[0]), min(w, self.share[1])
        return r, n, w

    def set_share(self, connections: int, write_threads: int) -> None:
        """Keep the network and write counts within the receiver's share of its budget
        (``--total-connections``, ``--total-threads``, divided among the jobs it serves): the
        counts the policy asks for are clamped to it from now on, and counts already running
        above a smaller share come down at once, before the policy is next asked."""
        share = (max(1, int(connections)), max(1, int(write_threads)))
        if share == self.share:
            return
        self.share = share
        if self.start_record is not None:  # started: bring what runs within it
            held = self._clamp(self.threads, self.max_threads)
            if held != self.threads:
                self.threads = held
                self.apply(held)

    def start(self) -> Triple:
        """Reset the policy, apply the start triple, and log where it came from.

        A warm start from the job's history (:data:`WARM_SOURCES`; ``warm_hold`` of
        :class:`ControllerSettings`) is held through the first ``interval_s`` and until the
        receiver has written something: the policy sees those intervals (its state follows them),
        but they only say that the pipeline is still filling, and acting on them would throw away
        the knowledge the start carries."""
        own = self._clamp(self.policy.reset(self.max_threads), self.max_threads)
        if self.start_choice is None:
            self.threads = own
            record = {"threads": dict(zip(STAGES, self.threads)), "source": "policy"}
        else:
            self.threads = self._clamp(self.start_choice.threads, self.max_threads)
            self.policy.start_from(self.threads)
            record = dict(self.start_choice.log_record(), threads=dict(zip(STAGES, self.threads)))
        self.apply(self.threads)
        self.t0 = self._last_t = time.monotonic()
        self.start_record = {"t": 0.0, "start": dict(record, **self.start_notes), "policy": self._name(),
                             "controller": dict(self.settings.to_dict(), early_intervals_s=list(self.early_intervals))}
        self._warm = (self.settings.warm_hold and self.start_choice is not None
                      and self.start_choice.source in WARM_SOURCES)
        if self.log_file is not None:
            self.log_file.write(json.dumps(self.start_record) + "\n")
            self.log_file.flush()
        return self.threads

    def _cpu_percent(self) -> float:
        """This process's CPU time (all threads) since the last call, in percent of one core (what
        ``psutil.Process().cpu_percent()`` reports, without importing psutil on the transfer path)."""
        cpu, wall = time.process_time(), time.monotonic()
        last_cpu, last_wall = self._cpu
        self._cpu = (cpu, wall)
        return round(100.0 * (cpu - last_cpu) / (wall - last_wall), 1) if wall > last_wall else 0.0

    def _name(self) -> str:
        return self.policy.name

    def next_interval_s(self) -> float:
        """Length of the interval now running: the next of :attr:`early_intervals`, then
        ``interval_s``."""
        k = len(self.history)
        return self.early_intervals[k] if k < len(self.early_intervals) else self.interval_s

    def due(self, now: Optional[float] = None) -> bool:
        return (time.monotonic() if now is None else now) - self._last_t >= self.next_interval_s()

    def tick(self, sender_stats: "SenderStats", receiver_stats: Optional["ReceiverStats"],
             now: Optional[float] = None, loss: Optional[float] = None,
             final: bool = False, progress: Optional["Progress"] = None) -> Optional[IntervalRecord]:
        """Called often; acts once an interval has passed. Returns the interval record if it acted.

        ``receiver_stats``: the receiver's last counters, None before its first ``status`` reply.
        ``progress``: where the run is as its sender sees it (:class:`Progress`), kept as
        :attr:`tail` and :attr:`to_deliver`; None keeps the last one.
        ``loss`` overrides the network loss ratio, which is otherwise the share of TCP segments
        the data connections retransmitted in the interval (the sender's TCP_INFO counters).
        ``final``: the run ended; the partial interval since the last record goes to the log file
        only (``"final": true``; the policy is not asked, :attr:`history` keeps whole intervals),
        so the log covers the whole run even when its end moved faster than one interval.

        In the run's tail (:attr:`tail`: every byte of the source has been read; what is left
        drains from the staging buffers) the record carries ``"tail": true``, and the counts hold
        unless the policy says it acts there (``asked_in_tail``; ``tail_hold`` of
        :class:`ControllerSettings`): the readers have nothing left to read, so what the interval
        measures is not a path a learned policy has seen, while a controller that fits each stage
        from its own counters still sizes the writers that drain the buffers. A dataset that fits
        in the staging buffers is read in the first interval, so its whole run is tail (the
        ``start`` record says so). The counts hold a little earlier, while what is left to
        *write* (:attr:`to_deliver`) would be written within one ``interval_s`` at this interval's
        write rate (``"ending": true``; ``end_hold`` of :class:`ControllerSettings`): a change then
        has no time to pay back what it costs, since new threads start with an empty pipeline."""
        now = time.monotonic() if now is None else now
        if progress is not None:
            self.tail, self.to_deliver = progress.tail, progress.to_deliver
        measured = self._measure(sender_stats, receiver_stats, now, loss, final)
        if measured is None:
            return None
        obs, delivered = measured
        ending = (self.end_hold and self.to_deliver is not None and obs.throughput_bps[2] > 0
                  and self.to_deliver < obs.throughput_bps[2] * self.interval_s)
        ann = dict(self.annotations)
        held_tail = self.tail and self.settings.tail_hold and not self.features.asked_in_tail
        if self.tail and not final:
            ann["tail"] = True
        if final:
            new = obs.threads
        elif held_tail or ending:
            new = self.threads
            if ending and not self.tail:
                ann["ending"] = True
        else:
            new = self._ask(obs, ann)
            if self._warm and (delivered == 0 or now - self._t_base < self.interval_s - 1e-3):
                new = self.threads  # a warm start holds while the pipeline fills (see :meth:`start`)
        record = self._record(obs, now, new, final, ann)
        if new != self.threads and not final:
            self.apply(new)
            self.threads = new
        if not final:
            self.history.append(record)
            self.last_record = record
        if self.log_file is not None:
            self.log_file.write(json.dumps(record.to_json()) + "\n")
            self.log_file.flush()
        return record

    def _measure(self, sender_stats: "SenderStats", receiver_stats: Optional["ReceiverStats"], now: float,
                 loss: Optional[float], final: bool) -> Optional[Tuple[Observation, int]]:
        """The interval that ended at ``now`` as an :class:`Observation` (its raw counters in
        :attr:`_raw` for the record) and the bytes written so far; None until an interval is over."""
        tcp = (int(sender_stats.tcp_segs_out), int(sender_stats.tcp_retrans))
        counted = (sender_stats.read.bytes, sender_stats.net.bytes,
                   receiver_stats.write.bytes if receiver_stats is not None else 0)
        busy = _busy(sender_stats, receiver_stats)
        if self._last is None or self._last_busy is None:
            self._last, self._last_busy, self._last_t, self._last_tcp = counted, busy, now, tcp
            self._t_base = now
            return None
        dt = now - self._last_t
        # a final interval shorter than 50 ms is dropped (its rates are noise), unless the run
        # recorded no interval at all: then it is the run's only measurement
        floor = (0.05 if self.history else 0.0) if final else self.next_interval_s()
        if dt <= 0 or dt < floor:
            return None
        moved = (counted[0] - self._last[0], counted[1] - self._last[1], counted[2] - self._last[2])
        d = busy.since(self._last_busy)
        self._last, self._last_busy, self._last_t = counted, busy, now
        if loss is None:
            segs, retrans = tcp[0] - self._last_tcp[0], tcp[1] - self._last_tcp[1]
            loss = min(1.0, retrans / segs) if segs > 0 and retrans > 0 else 0.0
        self._last_tcp = tcp
        rbuf = receiver_stats.buffer if receiver_stats is not None else None
        busy_s, wait_s = stage_times(d)
        self._raw = (moved, d)
        obs = Observation(threads=self.running(sender_stats, receiver_stats),
                          throughput_bps=(moved[0] / dt, moved[1] / dt, moved[2] / dt),
                          buffer_fill=(_frac(sender_stats.buffer), _frac(rbuf)), interval_s=dt,
                          max_threads=self.max_threads, loss=loss,
                          buffer_bytes=(int(sender_stats.buffer.capacity_bytes), int(rbuf.capacity_bytes) if rbuf else 0),
                          busy_s=busy_s, wait_s=wait_s)
        return obs, counted[2]

    def _record(self, obs: Observation, now: float, new: Triple, final: bool, ann: Dict[str, Any]) -> IntervalRecord:
        """The interval's log record: what ran, what it moved, the raw counters, the next counts."""
        moved, d = self._raw
        tput, fill = obs.throughput_bps, obs.buffer_fill
        return IntervalRecord(
            t=round(now - self.t0, 3),
            threads=obs.threads,
            throughput=(round(tput[0], 1), round(tput[1], 1), round(tput[2], 1)),
            buffer=(round(fill[0], 4), round(fill[1], 4)),
            cpu=self._cpu_percent(),
            loss=round(float(obs.loss), 6),
            policy=self._name(),
            next_threads=new,
            # raw counters of the interval, for exploration and profile fitting
            bytes=moved,
            busy_s=(round(d.busy_read, 4), round(d.busy_net, 4), round(d.busy_write, 4)),
            wait_s=(round(d.wait_read, 4), round(d.wait_net, 4), round(d.wait_write, 4)),
            recv_wait_s=round(d.recv_wait, 4),
            interval_s=round(obs.interval_s, 4),
            throttle=ann.pop("throttle", None),
            final=final,
            extra=ann,
        )

    def _ask(self, obs: Observation, ann: Dict[str, Any]) -> Triple:
        """The policy's counts for the next interval (its annotation goes to ``ann``); the current
        counts when it fails (see the class docstring)."""
        try:
            proposed = self.policy.act(obs)
        except Exception as e:  # a policy of one's own may fail in any way: the transfer goes on
            self._failed(type(e).__name__, str(e).splitlines()[0] if str(e) else "", ann)
            return self.threads
        try:
            new = self._clamp(proposed, self.limit)
        except (TypeError, ValueError, OverflowError):
            self._failed("bad triple", f"{proposed!r:.60}", ann)
            return self.threads
        self._failing = 0
        ann.update(self.policy.annotation())
        return new

    def _failed(self, kind: str, detail: str, ann: Dict[str, Any]) -> None:
        if kind not in self.failures:
            log.warning("policy %s failed (%s%s); the thread counts stay %s", self._name(), kind,
                        f": {detail}" if detail else "", ",".join(map(str, self.threads)))
        self.failures[kind] = self.failures.get(kind, 0) + 1
        self._failing += 1
        ann["policy_error"] = f"{kind}: {detail}" if detail else kind
        if self._failing >= MAX_POLICY_FAILURES and self.fallback is not None:
            failed = self._name()
            self.policy = self.fallback(self.max_threads)
            self.features = self.policy.features()
            self.policy.name = f"fallback (policy {failed} failed)"
            self.limit = self.max_threads
            log.warning("policy %s failed %d intervals in a row; the shield's fallback controller drives the rest "
                        "of the run", failed, self._failing)
            ann["policy_error"] += f"; fallback after {self._failing} failures"
            self._failing = 0

    def running(self, sender_stats: "SenderStats", receiver_stats: Optional["ReceiverStats"]) -> Triple:
        """The thread counts the engines run (their ``threads_target``): the sender's read and
        network pools, the receiver's write pool (after its own clamp). A count an engine does not
        report (0; no receiver reply yet) is the one last applied."""
        asked = self.threads
        write = receiver_stats.write.threads_target if receiver_stats is not None else 0
        return (int(sender_stats.read.threads_target) or asked[0], int(sender_stats.net.threads_target) or asked[1],
                int(write) or asked[2])


WARM_SOURCES = ("history",)
"""Start sources (:data:`automdt.start.SOURCES`) held while the pipeline fills
(:meth:`Controller.start`): the job's history, the path's own measured triple. Other starts are
acted on at once: the policy's first move adds whatever the pipeline's start-up needs."""

EARLY_INTERVALS: Tuple[float, ...] = ControllerSettings().early_intervals
"""The first intervals of a policy that takes a start, as fractions of ``interval_s``: two half
intervals, then steady ones, so that a start's first move is answered within the first steady
interval."""


def default_early_intervals(policy: Any, interval_s: float,
                            fractions: Sequence[float] = EARLY_INTERVALS) -> Tuple[float, ...]:
    """The early intervals the controller uses unless told: ``fractions`` of ``interval_s`` for
    policies that take a start (:func:`automdt.start.takes_start`), none for the baselines (their
    papers' fixed intervals)."""
    from automdt.start import takes_start

    if not takes_start(policy):
        return ()
    return tuple(min(1.0, float(f)) * interval_s for f in fractions if float(f) > 0)


class Progress(NamedTuple):
    """Where a run is, as its sender sees it, for :meth:`Controller.tick`."""

    tail: bool
    """Every byte of the source has been read; what is left drains from the staging buffers."""
    to_deliver: Optional[int]
    """Bytes still to write at the destination (None: unknown, no receiver counters yet)."""


class StageSeconds(NamedTuple):
    """Thread-seconds the engines counted, per stage: busy and waiting on a staging buffer, and the
    receiving connections' wait for a slot (``recv_wait``). Totals so far (:func:`_busy`), or one
    interval's differences (:meth:`since`)."""

    busy_read: float = 0.0
    busy_net: float = 0.0
    busy_write: float = 0.0
    wait_read: float = 0.0
    wait_net: float = 0.0
    wait_write: float = 0.0
    recv_wait: float = 0.0

    def since(self, earlier: "StageSeconds") -> "StageSeconds":
        """The counts between ``earlier`` and these."""
        return StageSeconds(*(float(b) - float(a) for a, b in zip(earlier, self)))


def _busy(sender_stats: "SenderStats", receiver_stats: Optional["ReceiverStats"]) -> StageSeconds:
    """The engines' thread-seconds so far (the write stage's are 0 before the receiver's first reply)."""
    r, n = sender_stats.read, sender_stats.net
    if receiver_stats is None:
        return StageSeconds(r.busy_s, n.busy_s, 0.0, r.wait_s, n.wait_s, 0.0, 0.0)
    w, rv = receiver_stats.write, receiver_stats.recv
    return StageSeconds(r.busy_s, n.busy_s, w.busy_s, r.wait_s, n.wait_s, w.wait_s, rv.wait_s)


def stage_times(d: StageSeconds) -> Tuple[Tuple[float, float, float], Tuple[float, float, float]]:
    """Busy and waiting thread-seconds per stage (read, net, write) for the policy, from one
    interval's counts ``d``.

    A network thread that a full receiver buffer holds back is blocked in ``send`` and so counts
    as busy on the sender; the receiving connection waits for a slot meanwhile (``recv wait``).
    That time is moved from the network's busy to its waiting time, so that a stage held back by a
    buffer reads as waiting on both ends, as in the simulator.
    """
    recv_wait = min(max(d.recv_wait, 0.0), max(d.busy_net, 0.0))
    busy = (max(d.busy_read, 0.0), max(d.busy_net, 0.0) - recv_wait, max(d.busy_write, 0.0))
    wait = (max(d.wait_read, 0.0), max(d.wait_net, 0.0) + recv_wait, max(d.wait_write, 0.0))
    return busy, wait


def _frac(buf: Optional["BufferStats"]) -> float:
    cap = buf.capacity_bytes if buf is not None else 0
    return min(1.0, max(0.0, buf.fill_bytes / cap)) if buf is not None and cap else 0.0
