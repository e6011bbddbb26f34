"""Throttle schedules: ``--throttle @FILE`` changes the emulated bottlenecks while a run goes on.

A schedule file is a YAML (or JSON) list of entries, each ``{at: SECONDS, throttle: SPEC}``::

    # read-bound for 30 s, then write-bound, then no limits from 60 s on
    - {at: 0,  throttle: "read.thread=10M,read.total=80M"}
    - {at: 30, throttle: "write.thread=10M,write.total=80M"}
    - {at: 60, throttle: ""}

``SPEC`` is what ``--throttle`` takes (:func:`automdt.units.parse_throttle`); every entry
*replaces* the whole set of limits, so a stage an entry does not name runs unlimited from then on
and an empty ``SPEC`` (or ``null``) lifts every limit. ``at`` counts seconds from the start of the
run (``automdt transfer``: from the start of the command, retries included; ``automdt explore``:
from the start of the exploration, all its rounds included); entries must be in increasing
order of ``at``. Before the first entry's time nothing is throttled.

Each entry takes effect at its time on the end that owns the stage: read and network limits on
the sender's engine, write limits on the receiver's, sent over the control channel
(``poll {write_throttle}``, ``automdt/PROTOCOL.md``). The interval log records the spec in force
(``throttle``) in every record.

A malformed file is a usage error (exit 2) with one line that names the file and the entry.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from automdt.units import STAGES, parse_throttle

Throttle = Dict[str, Tuple[float, float]]
"""``{stage: (thread_bps, total_bps)}`` as :func:`automdt.units.parse_throttle` returns it."""

NO_LIMITS: Throttle = {s: (0.0, 0.0) for s in STAGES}


class ScheduleError(ValueError):
    """A schedule file (or list) is malformed; the message names the source and the entry."""


@dataclass(frozen=True)
class ScheduleEntry:
    """One entry: from ``at_s`` seconds on, the limits of ``spec`` (parsed in ``throttle``)."""

    at_s: float
    spec: str
    throttle: Throttle

    def to_dict(self) -> Dict[str, Any]:
        return {"at": self.at_s, "throttle": self.spec}


@dataclass(frozen=True)
class ThrottleSchedule:
    """A validated list of :class:`ScheduleEntry`, in increasing ``at_s``."""

    entries: Tuple[ScheduleEntry, ...]
    source: str = "schedule"

    def __post_init__(self) -> None:
        if not self.entries:
            raise ScheduleError(f"{self.source}: the schedule has no entries")

    # -------------------------------------------------------------- queries
    def index_at(self, elapsed_s: float) -> int:
        """Index of the entry in force ``elapsed_s`` seconds into the run (-1: none yet)."""
        idx = -1
        for i, e in enumerate(self.entries):
            if e.at_s <= elapsed_s:
                idx = i
            else:
                break
        return idx

    def at(self, elapsed_s: float) -> Tuple[str, Throttle]:
        """``(spec, limits)`` in force ``elapsed_s`` seconds into the run."""
        i = self.index_at(elapsed_s)
        if i < 0:
            return "", dict(NO_LIMITS)
        e = self.entries[i]
        return e.spec, dict(e.throttle)

    def limits_stage(self, stage: str) -> bool:
        """Whether any entry limits ``stage``."""
        return any(any(v > 0 for v in e.throttle[stage]) for e in self.entries)

    @property
    def end_s(self) -> float:
        """Time of the last entry."""
        return self.entries[-1].at_s

    def to_list(self) -> List[Dict[str, Any]]:
        return [e.to_dict() for e in self.entries]

    def describe(self) -> str:
        """One line: ``0 s: read.thread=10M; 30 s: (none)``."""
        return "; ".join(f"{e.at_s:g} s: {e.spec or '(none)'}" for e in self.entries)

    # -------------------------------------------------------------- construction
    @classmethod
    def from_list(cls, items: Any, source: str = "schedule") -> "ThrottleSchedule":
        """Validate a list of ``{at, throttle}`` mappings (what the YAML file holds)."""
        if isinstance(items, dict) and "schedule" in items and len(items) == 1:
            items = items["schedule"]
        if not isinstance(items, list):
            raise ScheduleError(f"{source}: expected a list of {{at: SECONDS, throttle: SPEC}} entries, "
                                f"got {type(items).__name__}")
        if not items:
            raise ScheduleError(f"{source}: the schedule has no entries")
        out: List[ScheduleEntry] = []
        for i, item in enumerate(items, 1):
            where = f"{source}: entry {i}"
            if not isinstance(item, dict):
                raise ScheduleError(f"{where}: expected a mapping {{at: SECONDS, throttle: SPEC}}, got {item!r}")
            unknown = sorted(str(k) for k in item if k not in ("at", "throttle"))
            if unknown:
                raise ScheduleError(f"{where}: unknown key(s) {unknown}; an entry has only 'at' and 'throttle'")
            if "at" not in item:
                raise ScheduleError(f"{where}: 'at' (seconds from the start) is missing")
            if "throttle" not in item:
                raise ScheduleError(f"{where} (at: {item['at']}): 'throttle' is missing (use \"\" to lift every limit)")
            at = item["at"]
            if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at) or at < 0:
                raise ScheduleError(f"{where}: 'at' must be a number of seconds >= 0, got {at!r}")
            where = f"{where} (at: {at:g})"
            spec = item["throttle"]
            if spec is None:
                spec = ""
            if not isinstance(spec, str):
                raise ScheduleError(f"{where}: 'throttle' must be a string like \"read.thread=10M,net.total=80M\", "
                                    f"got {spec!r}")
            try:
                limits = parse_throttle(spec)
            except ValueError as e:
                raise ScheduleError(f"{where}: {e}") from None
            if out and float(at) <= out[-1].at_s:
                raise ScheduleError(f"{where}: entries must be in increasing order of 'at' "
                                    f"(the previous entry is at {out[-1].at_s:g})")
            out.append(ScheduleEntry(float(at), spec.strip(), limits))
        return cls(tuple(out), source)

    @classmethod
    def load(cls, path: str) -> "ThrottleSchedule":
        """Read a YAML or JSON schedule file (see the module docstring)."""
        import yaml

        try:
            with open(path) as f:
                text = f.read()
        except FileNotFoundError:
            raise ScheduleError(f"{path}: throttle schedule not found") from None
        except OSError as e:
            raise ScheduleError(f"{path}: cannot read the throttle schedule ({e.strerror or e})") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise ScheduleError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None
        if data is None:
            raise ScheduleError(f"{path}: the schedule file is empty")
        return cls.from_list(data, source=path)

    def save(self, path: str) -> None:
        """Write the schedule as YAML (loadable by :meth:`load`)."""
        import yaml

        with open(path, "w") as f:
            yaml.safe_dump(self.to_list(), f, sort_keys=False, default_flow_style=False)


def parse_throttle_option(text: Optional[str]) -> Tuple[Throttle, Optional[ThrottleSchedule]]:
    """``--throttle`` as given: ``SPEC`` -> (limits, None); ``@FILE`` -> (no limits, schedule).

    :raises ValueError: (:class:`ScheduleError` for schedules) with a one-line message.
    """
    raw = (text or "").strip()
    if raw.startswith("@"):
        path = os.path.expanduser(raw[1:].strip())
        if not path:
            raise ScheduleError("--throttle @FILE needs a file name after '@'")
        return dict(NO_LIMITS), ThrottleSchedule.load(path)
    return parse_throttle(raw), None


def format_throttle(limits: Throttle) -> str:
    """The canonical ``--throttle`` spec of a limits dict (``""`` when nothing is limited)."""
    parts = []
    for s in STAGES:
        t, total = limits.get(s, (0.0, 0.0))
        if t:
            parts.append(f"{s}.thread={_si(t)}")
        if total:
            parts.append(f"{s}.total={_si(total)}")
    return ",".join(parts)


def _si(x: float) -> str:
    for unit, f in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if x >= f and abs(x / f - round(x / f, 3)) < 1e-9:
            v = round(x / f, 3)
            return f"{int(v) if v == int(v) else v}{unit}"
    return str(int(x)) if x == int(x) else repr(float(x))


@dataclass
class ScheduleClock:
    """Follows a schedule during a run: :meth:`due` returns the entry that became due, once.

    :param schedule: the schedule.
    :param t0: the run's origin (``time.monotonic()`` seconds).
    """

    schedule: ThrottleSchedule
    t0: float = field(default_factory=time.monotonic)
    applied: int = -1

    def elapsed(self, now: Optional[float] = None) -> float:
        return (time.monotonic() if now is None else now) - self.t0

    def current(self, now: Optional[float] = None) -> Tuple[str, Throttle]:
        """The spec in force now (without marking anything applied)."""
        return self.schedule.at(self.elapsed(now))

    def due(self, now: Optional[float] = None) -> Optional[Tuple[str, Throttle]]:
        """The limits to apply if the entry in force changed since the last call, else None."""
        i = self.schedule.index_at(self.elapsed(now))
        if i == self.applied:
            return None
        self.applied = i
        if i < 0:
            return "", dict(NO_LIMITS)
        e = self.schedule.entries[i]
        return e.spec, dict(e.throttle)

    def mark_applied(self, now: Optional[float] = None) -> Tuple[str, Throttle]:
        """Mark the entry in force now as applied and return it (for the initial set-up)."""
        self.applied = self.schedule.index_at(self.elapsed(now))
        return self.current(now)


def schedule_from_phases(phases: Sequence[Tuple[float, str]], source: str = "scenario") -> ThrottleSchedule:
    """A schedule from ``[(at_s, spec), ...]`` (experiments build theirs this way)."""
    return ThrottleSchedule.from_list([{"at": a, "throttle": s} for a, s in phases], source)
