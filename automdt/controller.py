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
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Sequence, Tuple

from automdt.interval import IntervalRecord
from automdt.policy_contract import STAGES, Observation, Policy, Triple, clamp_triple

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
    """

    def __init__(self, policy: Policy, apply: Callable[[Triple], None], interval_s: float = 1.0,
                 max_threads: int = 32, log_file: Any = None, start: Any = None, bound: Optional[int] = None,
                 write_max: Optional[int] = None, early_intervals: Optional[Sequence[float]] = None):
        self.policy = policy
        self.apply = apply
        self.interval_s = interval_s
        self.max_threads = max_threads
        self.log_file = log_file
        self.start_choice = start
        self.limit = max_threads
        if bound is not None and start is not None and start.source != "threads":
            from automdt.start import takes_start

            if takes_start(policy):
                self.limit = max(1, min(max_threads, int(bound)))
        self.write_max = max(1, int(write_max)) if write_max else None
        if early_intervals is None:
            early_intervals = default_early_intervals(policy, interval_s)
        self.early_intervals: Tuple[float, ...] = tuple(min(float(x), interval_s) for x in early_intervals)
        """Lengths of the first intervals, before the steady ``interval_s``."""
        self.threads: Triple = (1, 1, 1)
        """The counts applied last (what the engines were asked for)."""
        self.t0 = time.monotonic()
        self._last_t = self.t0
        self._last: Optional[Tuple[int, int, int]] = None
        self._last_busy: Optional[Tuple[float, ...]] = None
        self._last_tcp: Tuple[int, int] = (0, 0)
        self._cpu = (time.process_time(), time.monotonic())
        self.history: list[IntervalRecord] = []
        self.last_record: Optional[IntervalRecord] = None
        self.start_record: Optional[Dict[str, Any]] = None
        self._warm = False
        self._t_base = 0.0
        self.tail = False
        """Set by the sender once the source is read to the end: the buffers drain and the policy
        is no longer asked (see :meth:`tick`)."""
        self.to_deliver: Optional[int] = None
        """Set by the sender: bytes the run has still to write at the destination (None: unknown).
        While they would be written within one ``interval_s`` at the last interval's write rate,
        the policy is not asked either (:meth:`tick`: the run is ending; ``AUTOMDT_END_HOLD=0``
        turns that off, for comparisons)."""
        self.end_hold = os.environ.get("AUTOMDT_END_HOLD", "1").strip() not in ("0", "")
        self.annotations: Dict[str, Any] = {}
        """Fields added to every interval record from now on (the sender sets ``throttle``, the
        throttle spec in force at the end of the interval)."""
        self.start_notes: Dict[str, Any] = {}
        """Fields added to the ``start`` record (the sender sets ``chunk_bytes``, the run's chunk size)."""

    def _clamp(self, t: Any, limit: int) -> Triple:
        r, n, w = clamp_triple(t, limit)
        return (r, n, min(w, self.write_max)) if self.write_max is not None else (r, n, w)

    def start(self) -> Triple:
        """Reset the policy, apply the start triple, and log where it came from.

        A warm start from the job's history (:data:`WARM_SOURCES`) is held through the first
        ``interval_s`` and until the receiver has written something: the policy sees those
        intervals (its state follows them), but they only say that the pipeline is still filling (a 4 MiB chunk takes 0.4 s to read at 10 MB/s), and acting on them threw
        away the knowledge the start carries (on issue 10's warm path the shipped policy probed
        every history start to 32 threads after its first half interval)."""
        own = self._clamp(self.policy.reset(self.max_threads), self.max_threads)
        if self.start_choice is None:
            self.threads = own
            record = {"threads": dict(zip(STAGES, self.threads)), "source": "policy"}
        else:
            self.threads = self._clamp(self.start_choice.threads, self.max_threads)
            hook = getattr(self.policy, "start_from", None)
            if hook is not None:
                hook(self.threads)
            record = dict(self.start_choice.log_record(), threads=dict(zip(STAGES, self.threads)))
        self.apply(self.threads)
        self.t0 = self._last_t = time.monotonic()
        self.start_record = {"t": 0.0, "start": dict(record, **self.start_notes), "policy": self._name()}
        self._warm = self.start_choice is not None and self.start_choice.source in WARM_SOURCES
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
        return getattr(self.policy, "name", type(self.policy).__name__)

    def next_interval_s(self) -> float:
        """Length of the interval now running: the next of :attr:`early_intervals`, then
        ``interval_s``."""
        k = len(self.history)
        return self.early_intervals[k] if k < len(self.early_intervals) else self.interval_s

    def due(self, now: Optional[float] = None) -> bool:
        return (time.monotonic() if now is None else now) - self._last_t >= self.next_interval_s()

    def tick(self, sender_stats: "SenderStats", receiver_stats: Optional["ReceiverStats"],
             now: Optional[float] = None, loss: Optional[float] = None,
             final: bool = False) -> Optional[IntervalRecord]:
        """Called often; acts once an interval has passed. Returns the interval record if it acted.

        ``receiver_stats``: the receiver's last counters, None before its first ``status`` reply.
        ``loss`` overrides the network loss ratio, which is otherwise the share of TCP segments
        the data connections retransmitted in the interval (the sender's TCP_INFO counters).
        ``final``: the run ended; the partial interval since the last record goes to the log file
        only (``"final": true``; the policy is not asked, :attr:`history` keeps whole intervals),
        so the log covers the whole run even when its end moved faster than one interval.

        In the run's tail (:attr:`tail`: every byte of the source has been read; what is left
        drains from the staging buffers) the counts hold (the record carries ``"tail": true``):
        no policy was trained on a source that has ended, and the shipped one read the readers'
        silence there as a slow path and cut the writers that were draining the receiver's
        buffer (down to 2 writers for 8 on a write-bound path: dips of 7-8 intervals at the end of
        ``bench_policy.py``'s sustained runs).
        Holding costs nothing: only the buffers' contents are left to move.

        The counts hold the same way a little earlier, while what is left to write
        (:attr:`to_deliver`) would be written within one ``interval_s`` at this interval's write
        rate (the record carries ``"ending": true``): a change then has no time to pay back what
        it costs (new threads start with an empty pipeline). The policy's first call is its
        dearest (the PPO policy imports numpy then: 0.14 CPU-s): a local 2 GB copy between two
        tmpfs directories ends within 1.2 s, and asking the policy after its first half second
        made the default command 0.1 s slower than the same counts held (1.31 against 1.21 s,
        medians of 7, both cores busy). What is left to *write*, not to read: when the path turns
        write-bound, the readers finish early into the buffers, and the writers must still be
        added."""
        tcp = (int(sender_stats.tcp_segs_out), int(sender_stats.tcp_retrans))
        now = time.monotonic() if now is None else now
        counted = (sender_stats.read.bytes, sender_stats.net.bytes,
                   receiver_stats.write.bytes if receiver_stats is not None else 0)
        busy = _busy(sender_stats, receiver_stats)
        if self._last is None or self._last_busy is None:
            self._last, self._last_busy, self._last_t, self._last_tcp = counted, busy, now, tcp
            self._t_base = now
            return None
        dt = now - self._last_t
        if dt < (0.05 if final else self.next_interval_s()):
            return None
        moved = (counted[0] - self._last[0], counted[1] - self._last[1], counted[2] - self._last[2])
        tput = (moved[0] / dt, moved[1] / dt, moved[2] / dt)
        d = [float(b) - float(a) for a, b in zip(self._last_busy, busy)]
        self._last, self._last_busy, self._last_t = counted, busy, now
        if loss is None:
            segs, retrans = tcp[0] - self._last_tcp[0], tcp[1] - self._last_tcp[1]
            loss = min(1.0, retrans / segs) if segs > 0 and retrans > 0 else 0.0
        self._last_tcp = tcp
        rbuf = receiver_stats.buffer if receiver_stats is not None else None
        fill = (_frac(sender_stats.buffer), _frac(rbuf))
        busy_s, wait_s = stage_times(d)
        ran = self.running(sender_stats, receiver_stats)
        ending = (self.end_hold and self.to_deliver is not None and tput[2] > 0
                  and self.to_deliver < tput[2] * self.interval_s)
        obs = Observation(threads=ran, throughput_bps=tput, buffer_fill=fill, interval_s=dt,
                          max_threads=self.max_threads, loss=loss,
                          buffer_bytes=(int(sender_stats.buffer.capacity_bytes), int(rbuf.capacity_bytes) if rbuf else 0),
                          busy_s=busy_s, wait_s=wait_s)
        if final:
            new = ran
        elif self.tail or ending:
            hold = getattr(self.policy, "tail_hold", None)  # a trial the policy still judges ends here
            new = self._clamp(hold(self.threads), self.limit) if callable(hold) else self.threads
        else:
            new = self._clamp(self.policy.act(obs), self.limit)
            if self._warm and (counted[2] == 0 or now - self._t_base < self.interval_s - 1e-3):
                new = self.threads  # a warm start holds while the pipeline fills (see :meth:`start`)
        ann = dict(self.annotations)
        if self.tail and not final:
            ann["tail"] = True
        elif ending and not final:
            ann["ending"] = True
        elif not final:
            ann.update(getattr(self.policy, "annotation", None) or {})
        record = IntervalRecord(
            t=round(now - self.t0, 3),
            threads=ran,
            throughput=(round(tput[0], 1), round(tput[1], 1), round(tput[2], 1)),
            buffer=(round(fill[0], 4), round(fill[1], 4)),
            cpu=self._cpu_percent(),
            loss=round(float(loss), 6),
            policy=self._name(),
            next_threads=new,
            # raw counters of the interval, for exploration and profile fitting
            bytes=moved,
            busy_s=(round(d[0], 4), round(d[1], 4), round(d[2], 4)),
            wait_s=(round(d[3], 4), round(d[4], 4), round(d[5], 4)),
            recv_wait_s=round(d[6], 4),
            interval_s=round(dt, 4),
            throttle=ann.pop("throttle", None),
            final=final,
            extra=ann,
        )
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
(:meth:`Controller.start`): the job's history, the path's own measured triple. A profile start
(the oracle triple of a fitted profile, the fewest threads that carry the rate) is not held: the
policy's move after the first half interval adds the headroom the pipeline's start-up needs
(quiet, 3 rounds: 90% within the first second on all six ramp paths; held, the network-bound
path at 80 MB/s, 8 connections of 10 MB/s, took 2 s)."""

EARLY_INTERVALS: Tuple[float, ...] = (0.5, 0.5)
"""The first intervals of a policy that takes a start (PPO), as fractions of ``interval_s``: two
half intervals, then steady ones. ``AUTOMDT_EARLY_INTERVALS=0`` (or ``""``) turns them off.

Two half intervals let a cold start's first choice (often a probe of a stage to many threads) be
answered within the first steady interval: on the engine (the experiments' read-, network- and
write-bound paths at 80 and 250 MB/s, quiet, 3 rounds) 90% of the achievable rate by 2 s instead of
3 s, and by 1 s with a profile-trained policy. Without the policy's floor
(:class:`~automdt.agents.guard.FloorGuard`) the shipped policy then fell, on the issue's
read-bound path, into a fixed point below capacity in 2 of 4 runs (32 readers and 1 network
thread, or 6 readers where 8 are needed: 63.7 s and 41.2 s instead of 33.6 s), so they were off;
with the floor under it the same path ran 4 of 4 times at capacity after a one-interval dip
(2026-11-24)."""


def default_early_intervals(policy: Any, interval_s: float) -> Tuple[float, ...]:
    """The early intervals the controller uses unless told: :data:`EARLY_INTERVALS` times
    ``interval_s`` for policies that take a start (:func:`automdt.start.takes_start`: PPO), none for
    the baselines (their papers' fixed intervals). The environment variable
    ``AUTOMDT_EARLY_INTERVALS`` overrides the fractions (``0.5,0.5``; ``""`` or ``0``: none), for
    comparisons."""
    from automdt.start import takes_start

    if not takes_start(policy):
        return ()
    env = os.environ.get("AUTOMDT_EARLY_INTERVALS")
    if env is None:
        fractions: Tuple[float, ...] = EARLY_INTERVALS
    else:
        try:
            fractions = tuple(float(x) for x in env.split(",") if x.strip())
        except ValueError:
            raise ValueError(f"AUTOMDT_EARLY_INTERVALS={env!r}: expected fractions such as 0.5,0.5") from None
        fractions = tuple(f for f in fractions if f > 0)
    return tuple(min(1.0, f) * interval_s for f in fractions)


def _busy(sender_stats: "SenderStats", receiver_stats: Optional["ReceiverStats"]) -> Tuple[float, ...]:
    """(busy r, n, w, wait r, n, w, receiver recv-stage wait) thread-seconds so far."""
    r, n = sender_stats.read, sender_stats.net
    if receiver_stats is None:
        return (r.busy_s, n.busy_s, 0.0, r.wait_s, n.wait_s, 0.0, 0.0)
    w, rv = receiver_stats.write, receiver_stats.recv
    return (r.busy_s, n.busy_s, w.busy_s, r.wait_s, n.wait_s, w.wait_s, rv.wait_s)


def stage_times(d: Any) -> Tuple[Tuple[float, float, float], Tuple[float, float, float]]:
    """Busy and waiting thread-seconds per stage (read, net, write) for the policy, from one
    interval's counter deltas ``d`` (the order of :func:`_busy`).

    A network thread that a full receiver buffer holds back is blocked in ``send`` and so counts
    as busy on the sender; the receiving connection waits for a slot meanwhile (``recv wait``).
    That time is moved from the network's busy to its waiting time, so that a stage held back by a
    buffer reads as waiting on both ends, as in the simulator.
    """
    recv_wait = min(max(d[6], 0.0), max(d[1], 0.0))
    busy = (max(d[0], 0.0), max(d[1], 0.0) - recv_wait, max(d[2], 0.0))
    wait = (max(d[3], 0.0), max(d[4], 0.0) + recv_wait, max(d[5], 0.0))
    return busy, wait


def _frac(buf: Optional["BufferStats"]) -> float:
    cap = buf.capacity_bytes if buf is not None else 0
    return min(1.0, max(0.0, buf.fill_bytes / cap)) if buf is not None and cap else 0.0
