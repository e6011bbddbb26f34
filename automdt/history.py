"""Per-job history: where the last run of the same job settled, so the next run starts there.

An operator's hourly cron or systemd transfer of the same SRC to the same DEST is the same job
every time. After a run, :func:`record_from_intervals` condenses the controller's interval
records into a :class:`JobRecord` (the thread triple the run settled at, the per-thread rates it
measured, its steady throughput), and :func:`save` writes it to
``$XDG_STATE_HOME/automdt/jobs/<job key>.json`` (default ``~/.local/state/automdt/jobs/``)
atomically (a temporary file in the same directory, fsync'ed, then renamed). The next run of the
job loads it (:func:`load`) and starts from it (:mod:`automdt.start`).

The job key is the job lock's (:func:`automdt.lock.job_key`): the same SRC and DEST, plus any
extra parts the lock's identity gains (a shard, for instance), give the same key.

A file that cannot be used (unreadable, truncated, not JSON, another format version, wrong
fields) is never an error: :func:`load` returns no record and a one-line warning, the run starts
cold, and the run's own record replaces the file afterwards (a file of another format version is
first moved aside to ``<file>.other``, so a newer automdt's history is not lost). A run that
measured no full interval (a tiny dataset) leaves the file as it was.

File format (JSON, one object)::

    {"format": "automdt-history/1", "job": "<key>", "src": "/data/out", "dest": "host:5000/run42",
     "updated": 1767225600.0, "runs": 12, "policy": "ppo:default",
     "settled": [8, 4, 3], "rates_bps": [1.0e7, 2.1e7, 2.9e7], "throughput_bps": 8.0e7,
     "intervals": 31, "max_threads": 32, "chunk_bytes": 4194304}

``settled``: the most frequent (read, net, write) triple over the run's second half (the run's
tail, when the source is read and the buffers drain, the last interval before it and the
intervals that tried a probe of the policy's floor left out; ties go to the latest); ``rates_bps``: bytes per busy thread-second of each
stage over the same intervals (the per-thread rates, as ``automdt explore`` measures them), counting
only intervals that ran the stage at the count of the interval before (an interval right after a
change measures the change; :func:`_rate_per_busy_thread`);
``throughput_bps``: the median end-to-end (write) rate over them; ``chunk_bytes``: the chunk size
the run used (0 or absent: not recorded, a file of an earlier release).

The record also sets the next run's chunk size when ``--chunk-size`` is not given
(:func:`chunk_size_for`): a chunk passes a stage whole, so on a slow path a large chunk holds the
first bytes back for a good part of the run's first interval (a thread that moves 10 MB/s needs
0.42 s for a 4 MiB chunk, and the bytes then still have the other two stages to pass).
"""
from __future__ import annotations

import json
import logging
import math
import os
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from automdt.interval import IntervalRecord
from automdt.policy_contract import STAGES

log = logging.getLogger(__name__)

HISTORY_FORMAT = "automdt-history/1"
"""Value of ``format``; a file with another value is from another version and is not used."""

def state_dir() -> Path:
    """``$XDG_STATE_HOME/automdt`` (default ``~/.local/state/automdt``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "automdt"


def history_path(key: str) -> Path:
    """The history file of the job with lock key ``key``."""
    return state_dir() / "jobs" / f"{key}.json"


@dataclass(frozen=True)
class JobRecord:
    """What the last run of a job learned (see the module docstring for the fields)."""

    settled: Tuple[int, int, int]
    rates_bps: Tuple[float, float, float]
    throughput_bps: float
    intervals: int
    policy: str = ""
    max_threads: int = 32
    runs: int = 1
    updated: float = 0.0
    job: str = ""
    src: str = ""
    dest: str = ""
    chunk_bytes: int = 0

    def to_json(self) -> Dict[str, Any]:
        d = asdict(self)
        d["settled"], d["rates_bps"] = list(self.settled), list(self.rates_bps)
        return {"format": HISTORY_FORMAT, **d}

    @classmethod
    def from_json(cls, d: Any) -> "JobRecord":
        """Raises ``ValueError`` (with the reason) unless ``d`` is a valid record of this format."""
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        if d.get("format") != HISTORY_FORMAT:
            raise ValueError(f"format {d.get('format')!r} is not {HISTORY_FORMAT!r} (another automdt version)")
        settled, rates = d.get("settled"), d.get("rates_bps")
        if (not isinstance(settled, list) or len(settled) != 3
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in settled)):
            raise ValueError(f"bad settled {settled!r}")
        if not isinstance(rates, list) or len(rates) != 3 or not all(_nonneg(x) for x in rates):
            raise ValueError(f"bad rates_bps {rates!r}")
        for k in ("throughput_bps", "updated"):
            if not _nonneg(d.get(k, 0.0)):
                raise ValueError(f"bad {k} {d.get(k)!r}")
        for k in ("intervals", "runs", "max_threads", "chunk_bytes"):
            v = d.get(k, 1)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"bad {k} {v!r}")
        return cls(settled=tuple(settled), rates_bps=tuple(float(x) for x in rates),  # type: ignore[arg-type]
                   throughput_bps=float(d.get("throughput_bps", 0.0)), intervals=int(d.get("intervals", 0)),
                   policy=str(d.get("policy", "")), max_threads=int(d.get("max_threads", 32)),
                   runs=int(d.get("runs", 1)), updated=float(d.get("updated", 0.0)), job=str(d.get("job", "")),
                   src=str(d.get("src", "")), dest=str(d.get("dest", "")), chunk_bytes=int(d.get("chunk_bytes", 0)))


def _nonneg(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and 0 <= x < float("inf")


def load(path: Path) -> Tuple[Optional[JobRecord], Optional[str]]:
    """The job's record, or ``(None, warning)`` when there is a file that cannot be used, or
    ``(None, None)`` when there is none. Never raises for a bad file."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"job history {path} unreadable ({e.strerror or e}); starting cold"
    try:
        return JobRecord.from_json(json.loads(raw.decode("utf-8"))), None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors: truncated, not JSON
        return None, f"job history {path} not used ({str(e).splitlines()[0]}); starting cold"


def save(path: Path, record: JobRecord) -> None:
    """Write ``record`` atomically (same-directory temporary file, fsync, rename; directory 0700).

    A file of another format version is moved aside to ``<file>.other`` first. Raises ``OSError``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(old, dict) and str(old.get("format", "")).startswith("automdt-history/") \
                and old.get("format") != HISTORY_FORMAT:
            os.replace(path, path.with_name(path.name + ".other"))
    except (OSError, ValueError, UnicodeDecodeError):
        pass
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(record.to_json(), f)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def record_from_intervals(records: Sequence[Any], *, policy: str = "", max_threads: int = 32,
                          previous: Optional[JobRecord] = None, job: str = "", src: str = "",
                          dest: str = "", chunk_bytes: int = 0) -> Optional[JobRecord]:
    """Condense a run's interval records (the controller's :class:`~automdt.interval.IntervalRecord`
    list, or the ``--log`` lines' objects) into a :class:`JobRecord`; ``None`` when the run measured
    no full interval. Objects that are no interval record (the log's ``start`` line) are skipped."""
    recs = [r if isinstance(r, IntervalRecord) else IntervalRecord.from_json(r) for r in records
            if isinstance(r, IntervalRecord) or isinstance(r, dict) and "threads" in r and "bytes" in r]
    if not recs:
        return None
    # left out: the tail (the source read, the buffers draining) and intervals the shield drove
    body = [r for r in recs if not r.extra.get("tail") and not r.extra.get("shield")]
    recs_used = body if len(body) >= 3 else recs
    window = recs_used[:-1] if len(recs_used) >= 3 else recs_used  # the last one usually drains already
    window = window[len(window) // 2:]
    triples = [r.threads for r in window]
    counts = Counter(triples)
    best = max(counts.values())
    settled = next(t for t in reversed(triples) if counts[t] == best)  # ties: the latest
    rates = [_rate_per_busy_thread(recs, window, i) for i in range(len(STAGES))]
    tput = statistics.median(r.throughput[2] for r in window)
    return JobRecord(settled=settled, rates_bps=tuple(rates), throughput_bps=float(tput),  # type: ignore[arg-type]
                     intervals=len(recs), policy=policy, max_threads=int(max_threads),
                     runs=(previous.runs + 1) if previous else 1, updated=time.time(), job=job, src=src, dest=dest,
                     chunk_bytes=int(chunk_bytes))


def _rate_per_busy_thread(recs: Sequence[IntervalRecord], window: Sequence[IntervalRecord], stage: int) -> float:
    """Bytes per busy thread-second of ``stage``, from the intervals that ran it at the count of
    the interval before: those of ``window``, else those of the whole run before its tail, else
    ``window`` as it is.

    An interval right after the count changed measures the change, not the threads: a chunk's
    bytes count when it ends, and a thread holds a chunk for ``chunk / rate`` seconds (0.42 s for
    4 MiB at 10 MB/s). After a cut, the chunks of the leaving threads end in the next interval and
    count for fewer threads, so the bytes per busy thread-second read well above the threads' rate;
    after a raise the new threads are busy before their first chunk counts, so they read below it.
    A short job's window may hold such intervals and no other; a rate read from them would start
    the next run with too few threads on one stage and too many on another, hence the fallback to
    the intervals of the whole run that held the count."""
    held = {id(b) for a, b in zip(recs, recs[1:]) if a.threads[stage] == b.threads[stage]}
    for rs in ([r for r in window if id(r) in held], [r for r in recs if id(r) in held and not r.extra.get("tail")], window):
        busy = sum(r.busy_s[stage] for r in rs)
        if busy > 0:
            return sum(float(r.bytes[stage]) for r in rs) / busy
    return 0.0


def update(path: Path, records: Sequence[Any], *, previous: Optional[JobRecord], **kw: Any) -> Optional[str]:
    """After a run: save its record (if it measured an interval). Returns a warning if the file
    could not be written (the run's result is unaffected)."""
    rec = record_from_intervals(records, previous=previous, **kw)
    if rec is None:
        return None
    try:
        save(path, rec)
    except OSError as e:
        return f"job history {path} not written ({e.strerror or e})"
    return None


def start_threads(record: JobRecord) -> Tuple[int, int, int]:
    """Where the job's next run starts: the triple the last run settled at, each stage raised to
    the threads that carry that run's throughput at the stage's measured rate per busy thread
    (``ceil(throughput / rate - 0.1)``), and every stage that used at least :data:`FULLY_USED`
    of its threads given one thread over that.

    A run that settled one thread short while a draining buffer hid it (a short job after a probe
    filled the sender buffer: fewer readers than the throughput needs at their rate, while the
    buffer made up the difference) starts with the thread it lacked; a stage that waited for
    others has a high rate per busy thread and keeps its settled count. The thread over is for the
    run's first second, while the pipeline fills: with exactly the threads the rate needs, the
    chunks still in flight keep the first interval below the rate, and one thread more makes up for
    them. It goes to every fully used stage, not only to one: a stage held by a total limit uses
    all its threads too (each one's rate is the limit shared), and which of two such stages limits
    cannot be told from rates."""
    out = []
    for settled, rate in zip(record.settled, record.rates_bps):
        if rate <= 0:
            out.append(int(settled))
            continue
        need = record.throughput_bps / rate
        n = max(int(settled), math.ceil(need - 0.1))
        if need >= FULLY_USED * settled:
            n = max(n, math.ceil(need - 0.1) + 1)
        out.append(min(int(record.max_threads), max(int(settled), n)))
    return (out[0], out[1], out[2])


FULLY_USED = 0.9
"""Share of its settled threads a stage's throughput needs (at its rate per busy thread) from which
:func:`start_threads` gives it a thread more."""

FILL_SHARE = 0.25
"""Share of the control interval one chunk may take to pass the three stages (:func:`chunk_size_for`)."""

CHUNK_FLOOR = 1 << 20
"""The smallest chunk size :func:`chunk_size_for` picks (small files are whole chunks anyway)."""


def chunk_size_for(record: JobRecord, default: int, interval_s: float) -> int:
    """The chunk size of the job's next run when the user gave none: ``default`` halved (down to
    :data:`CHUNK_FLOOR`) until one chunk passes a thread of each stage, at the last run's rates per
    busy thread, within :data:`FILL_SHARE` of ``interval_s``.

    A chunk's bytes move on when the whole chunk is read (then sent, then written), so the first
    bytes reach the destination after ``chunk * sum(1 / rate)``. Where the threads move tens of
    MB/s that is most of a second for a 4 MiB chunk, and the run's first interval delivers well
    below the path's rate; a quarter of the size passes in a quarter of the time. Where they move
    hundreds of MB/s (a local copy, a fast link) a 4 MiB chunk passes in a few hundredths of a
    second and the size stays the default.

    The last run's own chunk size is kept while it passes within 1.5 times the share and its double
    would not pass within the share divided by 1.5, so that rates that move a little from run to
    run do not change the size back and forth. A change costs a resume little: a partial file's
    journal serves any chunk size (:mod:`automdt.journal`), so a smaller size sends nothing
    journaled again, and a larger one only the chunks of the new size that a gap in the journaled
    ranges cuts."""
    per_byte = sum(1.0 / r for r in record.rates_bps if r > 0)
    if per_byte <= 0:
        return int(default)
    budget = FILL_SHARE * float(interval_s)
    floor = min(int(default), CHUNK_FLOOR)
    prev = int(record.chunk_bytes)
    if floor <= prev <= default and prev * per_byte <= 1.5 * budget \
            and (prev >= default or 2 * prev * per_byte > budget / 1.5):
        return prev
    size = int(default)
    while size > floor and size * per_byte > budget:
        size = max(floor, size // 2)
    return size


def summary(record: JobRecord) -> Dict[str, Any]:
    """The parts of a record the interval log's ``start`` line shows."""
    return {"settled": list(record.settled), "rates_bps": [round(x, 1) for x in record.rates_bps],
            "throughput_bps": round(record.throughput_bps, 1), "runs": record.runs, "policy": record.policy,
            "updated": record.updated}


__all__: List[str] = ["HISTORY_FORMAT", "JobRecord", "history_path", "load", "save", "record_from_intervals",
                      "state_dir", "update", "summary", "start_threads", "chunk_size_for"]
