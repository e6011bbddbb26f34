"""One control interval of a live transfer, as the controller measured it: :class:`IntervalRecord`.

The controller (:mod:`automdt.controller`) makes one record per interval; it is a line of the
interval log (``--log``, format in ``docs/formats/interval-log.md``), the input of the job history
(:func:`automdt.history.record_from_intervals`), of exploration's profile-fitting samples
(:meth:`IntervalRecord.to_sample`, read by :mod:`automdt.simulator.fit` and written by
:func:`automdt.simulator.profile.write_samples`) and of the experiments' tables
(:func:`automdt.experiments.metrics.flatten`). :meth:`IntervalRecord.to_json` is the log line's
object, key for key and value for value; :meth:`IntervalRecord.from_json` reads one back (keys
it does not know are kept in :attr:`IntervalRecord.extra` and written back after the known ones).

Standard library only, like :mod:`automdt.policy_contract`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

from automdt.policy_contract import STAGES, Triple

Floats3 = Tuple[float, float, float]

MIN_BUSY_FRACTION = 0.2
"""A stage's interval is usable for the fit only if its threads were busy at least this fraction
of the time (:meth:`IntervalRecord.to_sample`)."""


def _stages(values: Any) -> Dict[str, Any]:
    return dict(zip(STAGES, values))


def _triple(d: Any, conv: Any, default: Any = 0) -> Any:
    d = d or {}
    return tuple(conv(d.get(s, default)) for s in STAGES)


@dataclass(frozen=True)
class IntervalRecord:
    """One control interval.

    :param t: seconds since the controller started, at the end of the interval.
    :param threads: thread counts (read, net, write) that ran during the interval (as the engines
        report them).
    :param throughput: bytes/s each stage moved.
    :param buffer: fill fractions (sender, receiver) at the end of the interval.
    :param cpu: this process's CPU time in the interval, percent of one core.
    :param loss: share of TCP segments the data connections retransmitted.
    :param policy: the policy's name.
    :param next_threads: what the policy chose for the next interval (in the last, partial
        interval: the threads it ran with).
    :param bytes: payload bytes each stage moved in the interval.
    :param busy_s: thread-seconds each stage spent working.
    :param wait_s: thread-seconds each stage spent waiting on a staging buffer.
    :param recv_wait_s: thread-seconds the receiving connections waited for room in the receiver
        buffer.
    :param interval_s: the interval's length, seconds.
    :param throttle: the throttle spec in force at the end of the interval (``""``: no limits),
        None when the run has no throttle.
    :param final: the run's last, partial interval.
    :param extra: other keys (the experiments add ``round``, ``t_round``), written after the rest.
    """

    t: float
    threads: Triple
    throughput: Floats3 = (0.0, 0.0, 0.0)
    buffer: Tuple[float, float] = (0.0, 0.0)
    cpu: float = 0.0
    loss: float = 0.0
    policy: str = ""
    next_threads: Optional[Triple] = None
    bytes: Tuple[int, int, int] = (0, 0, 0)
    busy_s: Floats3 = (0.0, 0.0, 0.0)
    wait_s: Floats3 = (0.0, 0.0, 0.0)
    recv_wait_s: float = 0.0
    interval_s: float = 1.0
    throttle: Optional[str] = None
    final: bool = False
    extra: Dict[str, Any] = field(default_factory=dict, compare=False)

    def to_json(self) -> Dict[str, Any]:
        """The interval log's JSON object (``docs/formats/interval-log.md``)."""
        d: Dict[str, Any] = {
            "t": self.t,
            "threads": _stages(self.threads),
            "throughput": _stages(self.throughput),
            "buffer": {"sender": self.buffer[0], "receiver": self.buffer[1]},
            "cpu": self.cpu,
            "loss": self.loss,
            "policy": self.policy,
            "next_threads": _stages(self.next_threads if self.next_threads is not None else self.threads),
            "bytes": _stages(self.bytes),
            "busy_s": _stages(self.busy_s),
            "wait_s": _stages(self.wait_s),
            "recv_wait_s": self.recv_wait_s,
            "interval_s": self.interval_s,
        }
        if self.throttle is not None:
            d["throttle"] = self.throttle
        d.update(self.extra)
        if self.final:
            d["final"] = True
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "IntervalRecord":
        """Read a log line's object back. Missing counters read as 0 (records of older versions).

        :raises ValueError: ``d`` is not an interval record (no ``threads``; e.g. the log's first,
            ``start`` line).
        """
        if not isinstance(d, Mapping) or not isinstance(d.get("threads"), Mapping):
            raise ValueError("not an interval record (no 'threads')")
        known = set(cls.__dataclass_fields__) - {"extra"}
        buf = d.get("buffer") or {}
        nxt = d.get("next_threads")
        return cls(
            t=float(d.get("t", 0.0)),
            threads=_triple(d["threads"], int, 1),
            throughput=_triple(d.get("throughput"), float),
            buffer=(float(buf.get("sender", 0.0)), float(buf.get("receiver", 0.0))),
            cpu=float(d.get("cpu", 0.0) or 0.0),
            loss=float(d.get("loss", 0.0) or 0.0),
            policy=str(d.get("policy", "")),
            next_threads=_triple(nxt, int, 1) if isinstance(nxt, Mapping) else None,
            bytes=_triple(d.get("bytes"), int),
            busy_s=_triple(d.get("busy_s"), float),
            wait_s=_triple(d.get("wait_s"), float),
            recv_wait_s=float(d.get("recv_wait_s", 0.0) or 0.0),
            interval_s=float(d.get("interval_s", 1.0) or 1.0),
            throttle=d.get("throttle"),
            final=bool(d.get("final", False)),
            extra={k: v for k, v in d.items() if k not in known},
        )

    def to_sample(self, prev: Optional["IntervalRecord"] = None,
                  chunk_size: Optional[int] = None) -> Dict[str, Any]:
        """This interval as a profile-fitting sample (:mod:`automdt.simulator.fit`; the format of a
        profile's ``samples``: :func:`automdt.simulator.profile.write_samples`).

        The network stage is unusable for an interval in which the receiving threads spent much
        time waiting for room in the receiver buffer: the sender's ``send()`` then blocks on a full
        TCP window (counted busy by the sender) although the network itself is idle.

        A stage is marked unusable for an interval (bytes 0) when its thread count went *down* at
        the start of it (its exiting threads finish the chunk they hold, so the interval carries
        bytes of more threads than it lists), or when its threads were busy less than a fifth of
        the time. ``moved`` keeps every stage's bytes: what a stage moved is a lower bound of what
        it can move, which is all the fit can say about a stage that never limited the path.

        With ``chunk_size``, ``inflight_bytes`` estimates what the threads that started in this
        interval (all of them in a transfer's first interval, ``prev`` None) had in progress at its
        end: half a chunk each (:mod:`automdt.simulator.fit` explains the correction).
        """
        busy = list(self.busy_s)
        nbytes = list(self.bytes)
        # While the receiving threads wait for room in the receiver buffer, the sender's send()
        # blocks on a full TCP window and counts as busy although the network is idle: such an
        # interval says nothing about the network's capacity.
        if self.recv_wait_s > MIN_BUSY_FRACTION * self.threads[1] * self.interval_s:
            nbytes[1] = 0
        if prev is not None:
            for i in range(3):
                if self.threads[i] < prev.threads[i]:
                    nbytes[i] = 0
        # A stage whose threads spent most of the interval waiting on a buffer ran at its capacity
        # only in short bursts: its busy-time estimate is too noisy to use.
        for i in range(3):
            if busy[i] < MIN_BUSY_FRACTION * self.threads[i] * self.interval_s:
                nbytes[i] = 0
        sample: Dict[str, Any] = {
            "t": self.t,
            "threads": list(self.threads),
            "bytes": nbytes,
            "moved": list(self.bytes),
            "busy_s": busy,
            "wait_s": list(self.wait_s),
            "interval_s": self.interval_s,
            "buffer": list(self.buffer),
        }
        if chunk_size:
            started = [max(0, self.threads[i] - (prev.threads[i] if prev is not None else 0)) for i in range(3)]
            sample["inflight_bytes"] = [k * chunk_size / 2 for k in started]
        return sample


def as_record(rec: Any) -> IntervalRecord:
    """``rec`` as an :class:`IntervalRecord`: itself, or read from its JSON object (a ``--log``
    line, a record that crossed a process boundary)."""
    return rec if isinstance(rec, IntervalRecord) else IntervalRecord.from_json(rec)
