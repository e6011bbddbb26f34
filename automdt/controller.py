"""The one place where a policy meets the live engine.

Every ``interval_s`` the controller turns the engine counters of both ends into an
:class:`~automdt.simulator.types.Observation` (what the simulator also produces), asks the
policy for the next (read, net, write) thread counts, applies them (read and net on the local
sender engine, write through the control channel to the receiver), and writes one JSON line to
the interval log. Its first log line (``"start"``) says where the thread counts started and why
(:mod:`automdt.start`).
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable, Dict, Optional, Tuple

from automdt.agents.base import Policy, clamp_triple
from automdt.simulator.types import Observation, Triple


def _stage(stats: Any, name: str) -> Dict[str, float]:
    s = getattr(stats, name)
    return s if isinstance(s, dict) else s._asdict()


class Controller:
    """Drives a policy at a fixed interval.

    :param policy: any :class:`~automdt.agents.base.Policy`.
    :param apply: called with the new triple whenever the policy chooses one.
    :param interval_s: control interval in seconds.
    :param max_threads: upper bound for each stage.
    :param log_file: open text file for the per-interval JSON lines, or None.
    :param start: where to start (:func:`automdt.start.choose_start`); None: the policy's own.
    :param bound: threads per stage the dataset can use (:func:`automdt.start.dataset_bound`):
        applied to the choices of policies that take a start (PPO) for the whole run.
    """

    def __init__(self, policy: Policy, apply: Callable[[Triple], None], interval_s: float = 1.0,
                 max_threads: int = 32, log_file=None, start=None, bound: Optional[int] = None):
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
        self.threads: Triple = (1, 1, 1)
        self.t0 = time.monotonic()
        self._last_t = self.t0
        self._last: Optional[Tuple[float, float, float]] = None
        self._last_busy: Optional[Tuple[float, ...]] = None
        self._last_tcp: Tuple[int, int] = (0, 0)
        self._cpu = (time.process_time(), time.monotonic())
        self.history: list = []
        self.last_record: Optional[Dict[str, Any]] = None
        self.start_record: Optional[Dict[str, Any]] = None
        self.annotations: Dict[str, Any] = {}
        """Fields added to every interval record from now on (the sender sets ``throttle``, the
        throttle spec in force at the end of the interval)."""

    def start(self) -> Triple:
        """Reset the policy, apply the start triple, and log where it came from."""
        own = clamp_triple(self.policy.reset(self.max_threads), self.max_threads)
        if self.start_choice is None:
            self.threads = own
            record = {"threads": dict(zip(("read", "net", "write"), self.threads)), "source": "policy"}
        else:
            self.threads = clamp_triple(self.start_choice.threads, self.max_threads)
            hook = getattr(self.policy, "start_from", None)
            if hook is not None:
                hook(self.threads)
            record = self.start_choice.log_record()
        self.apply(self.threads)
        self.t0 = self._last_t = time.monotonic()
        self.start_record = {"t": 0.0, "start": record, "policy": self._name()}
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

    def due(self, now: Optional[float] = None) -> bool:
        return (time.monotonic() if now is None else now) - self._last_t >= self.interval_s

    def tick(self, sender_stats: Any, receiver_stats: Dict[str, Any], now: Optional[float] = None,
             loss: Optional[float] = None, final: bool = False) -> Optional[Dict[str, Any]]:
        """Called often; acts once an interval has passed. Returns the interval record if it acted.

        ``loss`` overrides the network loss ratio, which is otherwise the share of TCP segments
        the data connections retransmitted in the interval (the sender's TCP_INFO counters).
        ``final``: the run ended; the partial interval since the last record goes to the log file
        only (``"final": true``; the policy is not asked, :attr:`history` keeps whole intervals),
        so the log covers the whole run even when its end moved faster than one interval."""
        tcp = (int(getattr(sender_stats, "tcp_segs_out", 0)), int(getattr(sender_stats, "tcp_retrans", 0)))
        now = time.monotonic() if now is None else now
        read_b = _stage(sender_stats, "read")["bytes"]
        net_b = _stage(sender_stats, "net")["bytes"]
        write_b = receiver_stats["write"]["bytes"] if receiver_stats else 0
        busy = _busy(sender_stats, receiver_stats)
        if self._last is None or self._last_busy is None:
            self._last = (read_b, net_b, write_b)
            self._last_busy = busy
            self._last_t = now
            self._last_tcp = tcp
            return None
        dt = now - self._last_t
        if dt < (0.05 if final else self.interval_s):
            return None
        moved = (read_b - self._last[0], net_b - self._last[1], write_b - self._last[2])
        tput = (moved[0] / dt, moved[1] / dt, moved[2] / dt)
        d = [b - a for a, b in zip(self._last_busy, busy)]
        self._last, self._last_busy, self._last_t = (read_b, net_b, write_b), busy, now
        if loss is None:
            segs, retrans = tcp[0] - self._last_tcp[0], tcp[1] - self._last_tcp[1]
            loss = min(1.0, retrans / segs) if segs > 0 and retrans > 0 else 0.0
        self._last_tcp = tcp
        sbuf = _stage(sender_stats, "buffer")
        rbuf = receiver_stats.get("buffer", {}) if receiver_stats else {}
        fill = (_frac(sbuf), _frac(rbuf))
        busy_s, wait_s = stage_times(d)
        obs = Observation(threads=self.threads, throughput_bps=tput, buffer_fill=fill, interval_s=dt,
                          max_threads=self.max_threads, loss=loss,
                          buffer_bytes=(int(sbuf.get("capacity_bytes", 0)), int(rbuf.get("capacity_bytes", 0))),
                          busy_s=busy_s, wait_s=wait_s)
        new = self.threads if final else clamp_triple(self.policy.act(obs), self.limit)
        record = {
            "t": round(now - self.t0, 3),
            "threads": dict(zip(("read", "net", "write"), self.threads)),
            "throughput": dict(zip(("read", "net", "write"), (round(x, 1) for x in tput))),
            "buffer": {"sender": round(fill[0], 4), "receiver": round(fill[1], 4)},
            "cpu": self._cpu_percent(),
            "loss": round(loss, 6),
            "policy": self._name(),
            "next_threads": dict(zip(("read", "net", "write"), new)),
            # raw counters of the interval, for exploration and profile fitting
            "bytes": dict(zip(("read", "net", "write"), moved)),
            "busy_s": {"read": round(d[0], 4), "net": round(d[1], 4), "write": round(d[2], 4)},
            "wait_s": {"read": round(d[3], 4), "net": round(d[4], 4), "write": round(d[5], 4)},
            "recv_wait_s": round(d[6], 4),
            "interval_s": round(dt, 4),
        }
        record.update(self.annotations)
        if final:
            record["final"] = True
        if new != self.threads:
            self.apply(new)
            self.threads = new
        if not final:
            self.history.append(record)
            self.last_record = record
        if self.log_file is not None:
            self.log_file.write(json.dumps(record) + "\n")
            self.log_file.flush()
        return record


def _busy(sender_stats: Any, receiver_stats: Dict[str, Any]) -> Tuple[float, ...]:
    """(busy r, n, w, wait r, n, w, receiver recv-stage wait) thread-seconds so far."""
    r, n = _stage(sender_stats, "read"), _stage(sender_stats, "net")
    w = (receiver_stats or {}).get("write", {})
    rv = (receiver_stats or {}).get("recv", {})
    return (r["busy_s"], n["busy_s"], w.get("busy_s", 0.0), r["wait_s"], n["wait_s"], w.get("wait_s", 0.0),
            rv.get("wait_s", 0.0))


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


def _frac(buf: Dict[str, Any]) -> float:
    cap = buf.get("capacity_bytes", 0) or 0
    return min(1.0, max(0.0, buf.get("fill_bytes", 0) / cap)) if cap else 0.0
