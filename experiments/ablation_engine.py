"""The engine half of the ablation: every controller on held-out real engine paths, repeated.

``python -m automdt.experiments.ablation_engine [--paths A,B] [--policies X,Y] [--reps 3] [--quick]``
(the ``ablation`` experiment of ``python -m automdt.experiments`` calls :func:`run_ablation_engine`).

**Paths** (:func:`engine_paths`, data: one :class:`EnginePath` each, none of them the read-, net- or
write-bound 80 MB/s scenarios the other experiments tune on). Every transfer copies a dataset sized
to last about :data:`NOMINAL_S` seconds at the path's achievable rate, to completion, from a fresh
sender process (:class:`~automdt.experiments.realpaths.PathSession`: real TCP to an ``automdt
receive`` process; in network namespaces where the path has a link):

=======================  ===================================================================================
``mb-read-write``        loopback, engine throttle schedule: read-bound (6 MB/s per read thread, 48 MB/s)
                         for 8 s, then write-bound (7 MB/s per write thread, 56 MB/s)
``mb-net-read``          net-bound (4 MB/s per connection, 40 MB/s) for 7 s, then read-bound (3 MB/s per
                         read thread, 30 MB/s)
``two-limits``           read and write both cap the path at 36 MB/s (4 and 9 MB/s per thread)
``throttle-link-change`` net 5 MB/s per connection, 50 MB/s in total; the total halves at 6 s and recovers
                         at 12 s (a throttle schedule: the engine's own limits)
``net-rtt20``            realpaths' 40 MB/s ``tc tbf`` link with 20 ms RTT and 256 KiB per connection
                         (only with ``--paths``: :data:`DEFAULT_PATHS`)
``net-rtt80``            the same with 80 ms RTT (3.3 MB/s per connection)
``link-steps``           a 36 MB/s ``tc tbf`` link, 30 ms RTT, 256 KiB per connection (8.7 MB/s each),
                         dropped to 12 MB/s at 6 s and back at 12 s (``tc qdisc change``)
``cpu``                  realpaths' CPU quota: the receiver in a cgroup v1 ``cpu`` group (5% of one core)
``disk``                 realpaths' real disk: 1 GB in 10,000 files under ``/var/tmp``, evicted from the page
                         cache before every copy (``posix_fadvise``), written with ``--fsync file``
``static-ratio``         3 MB/s per read thread (45 MB/s), 25 MB/s per connection, 12 MB/s per write thread
=======================  ===================================================================================

**Achievable rate** of a phase (:attr:`EnginePath.yardstick`): ``throttle``: ``min`` over the
stages of ``min(max_threads * per_thread, total)``; ``link``: the ``tc`` rate times the goodput
efficiency of a calibration transfer (static 2,16,2, alone on the full link); ``grid``: the
empirical grid search of :func:`automdt.experiments.real.grid_search` (``real``'s empirical oracle;
``--grid small``: its coarse form), the best triple's verified rate.

**Controllers** (label, policy spec): ``default`` (the registry's ``default``: what ``automdt
transfer`` runs without ``--policy``), ``ppo`` (the shipped network, bare), ``shield:ppo``, ``model``, ``shield:model``,
``marlin``, ``falcon``, ``heuristic`` (given the path's RTT, link rate, mean file size and count),
``topdown``, and ``best-static``: on throttle paths each stage's largest per-phase optimum of the
simulator's oracle (:func:`automdt.experiments.changing.throttle_optimum`), on link paths the
same from the link rate and window/RTT, on grid paths the grid's triple (written to
``grid-<path>.json``; ``--grid-from DIR`` reuses an earlier run's). ``--policies`` takes labels
or any registry spec (``static:2,2,2``, ``LABEL=SPEC`` to name one); a spec that
:func:`automdt.agents.registry.check_spec` refuses is skipped with its reason in the results.

**Repetitions** are interleaved: on each path (paths in sequence) every controller's first
transfer, then every controller's second, ...; repetition ``k`` starts ``k`` places further down the
controller list, so that no controller always runs first after the set-up.

**Metrics** of every transfer (:func:`transfer_metrics`): completion time; for each change, the
seconds from the change to the end of the first interval that starts after it, reaches 90% of the
new achievable rate and whose mean over three intervals does too
(:func:`automdt.experiments.changing.time_to_fraction`), and the same counted in control intervals
(the intervals that start after the change, up to that one); the number of *low* intervals
(delivered below 50% of the phase's achievable rate while some stage ran below ``max_threads``
and at least one interval's worth of data was left to write) and the longest run of consecutive
low intervals; the mean threads per stage. Per path and controller: medians over the repetitions,
and completion ratios ``marlin / controller`` and ``model / controller`` (above 1: faster).

**Targets** (:data:`TARGETS`), checked per controller on the medians: back to 90% within
:data:`RECOVERY_INTERVALS` intervals after every change; no run of low intervals longer than
:data:`LOW_MAX_INTERVALS`; completion at least :data:`MARLIN_RATIO` times Marlin's over the changing
paths (the sums of the medians); at least :data:`MODEL_RATIO` times the model-based controller's on
every path.

**Outputs** in ``runs/ablation-engine-<time>/`` (``--out``): ``ablation-engine.json`` (config: paths
as data, controllers and specs, repetitions, git commit, ``uname -a``, CPU count, date, the load
average before each path; every transfer's row; the per path and controller medians; the targets),
``ablation-engine.csv`` (one line per transfer), ``ablation-engine.md`` (:func:`engine_tables`),
``intervals.csv`` (every control interval of every transfer), ``logs/`` (the controllers' interval
logs), ``work/`` (each sender's config, output and log). The JSON is rewritten after every path, so
an interrupted run keeps what it measured. Datasets live in ``/dev/shm`` (the disk path: ``/var/tmp``)
and are removed at the end, like every namespace, cgroup and process the run created.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from automdt.experiments.ablation import DEFAULT_CONTROLLERS  # one list for both halves
from automdt.policy_contract import STAGES
from automdt.experiments import metrics as M
from automdt.experiments.changing import (ChangingScenario, calibrate_goodput, changing_transfer,
                                          throttle_optimum, time_to_fraction)
from automdt.experiments.real import LOOPBACK_BPS, LOOPBACK_RTT_S, grid_search, load_average
from automdt.experiments.realpaths import PathSession, RealScenario, real_scenarios
from automdt.experiments.runner import RunDir, _json_default, git_info, ppo_default_info
from automdt.experiments.scenarios import DEFAULT_CHUNK, DEFAULT_INTERVAL_S, DEFAULT_MEMORY, MB

KiB = 1024
NAME = "ablation-engine"
NOMINAL_S = 16.0
"""Seconds a path's dataset lasts at its achievable rate (the brief: 15-25 s per transfer)."""
DISK_DATASET_BYTES = 1000 * MB
DISK_FILES = 10_000
"""The real-disk path's dataset: 1 GB in 100 kB files, each fsync'ed at the destination. On these
VMs large files move at the CPU's rate (a 1 GB copy lasts 2-3 s, under three intervals); small
fsync'ed files make the copy last 9-15 s, and more write threads make it slower, not faster.
``--quick`` scales the bytes like the times (the file count stays)."""
QUICK_SCALE = 0.3
"""``--quick`` multiplies every time (dataset length, change times) by this."""
REPS = 3

RECOVERY_FRACTION = 0.9
RECOVERY_HOLD = 3
RECOVERY_INTERVALS = 3
"""Target: back to 90% of the new achievable rate within this many control intervals of a change."""
LOW_FRACTION = 0.5
LOW_MAX_INTERVALS = 3
"""Target: no run of consecutive intervals below 50% of the achievable rate longer than this."""
MARLIN_RATIO = 1.3
"""Target: completion at least this many times faster than Marlin over the changing paths."""
MODEL_RATIO = 1.0
"""Target: completion at least as fast as the model-based controller on every path."""
TARGETS = {
    "recovery": f"back to {RECOVERY_FRACTION:.0%} of the new achievable rate within {RECOVERY_INTERVALS} "
                "intervals after every change (median over repetitions, every changing path)",
    "low_stretch": f"no run longer than {LOW_MAX_INTERVALS} intervals below {LOW_FRACTION:.0%} of the "
                   "achievable rate while a stage could add threads (median, every path)",
    "vs_marlin": f"completion at least {MARLIN_RATIO:g}x Marlin's over the changing paths (sums of the medians)",
    "vs_model": f"completion at least {MODEL_RATIO:g}x the model-based controller's on every path (medians)",
}

QUICK_CONTROLLERS = ("marlin", "best-static")
QUICK_PATHS = ("mb-read-write", "static-ratio")
DEFAULT_PATHS = ("mb-read-write", "mb-net-read", "two-limits", "throttle-link-change", "net-rtt80", "link-steps", "cpu",
                 "disk", "static-ratio")
"""The paths a run takes without ``--paths``: all but ``net-rtt20`` (a window-limited link like
``net-rtt80``'s that needs 4 connections, as ``link-steps`` needs 5: 10 minutes more for little)."""


# ---------------------------------------------------------------------------------------------
# paths
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EnginePath:
    """One held-out path: how it is built and what changes on it (``scenario``), and how its
    achievable rate and best static triple are known (``yardstick``)."""

    name: str
    family: str
    """``moving-bottleneck``, ``two-limits``, ``link-change``, ``rtt``, ``cpu``, ``disk``, ``static``."""
    scenario: ChangingScenario
    yardstick: str
    """``throttle`` (analytic from the engine throttles), ``link`` (tc rate x calibrated goodput) or
    ``grid`` (an empirical grid search on the path)."""
    expected_bps: float = 0.0
    """``grid`` paths: the rate the dataset is sized for (the grid measures the achievable rate)."""

    @property
    def changing(self) -> bool:
        return bool(self.scenario.change_times)

    @property
    def phase_starts(self) -> List[float]:
        return [0.0] + self.scenario.change_times

    def dataset_bytes(self) -> int:
        """Bytes that last ``scenario.nominal_s`` at the path's (expected) achievable rates."""
        if self.yardstick == "grid":
            return int(self.expected_bps * self.scenario.nominal_s)
        return self.scenario.dataset_bytes(0.95)

    def to_dict(self) -> Dict[str, Any]:
        d = {"name": self.name, "family": self.family, "yardstick": self.yardstick, "changing": self.changing,
             "expected_bps": self.expected_bps or None, "dataset_bytes": self.dataset_bytes()}
        return d | {"scenario": self.scenario.to_dict()}


def _spec(read: Tuple[float, float], net: Tuple[float, float], write: Tuple[float, float]) -> str:
    """A throttle spec from (per thread, total) MB/s per stage."""
    parts = []
    for s, (t, tot) in zip(STAGES, (read, net, write)):
        parts += [f"{s}.thread={t:g}M", f"{s}.total={tot:g}M"]
    return ",".join(parts)


def engine_paths(quick: bool = False, max_threads: int = 32) -> Dict[str, EnginePath]:
    """The held-out engine paths by name (``quick``: every time scaled by :data:`QUICK_SCALE`)."""
    k = QUICK_SCALE if quick else 1.0
    nominal = NOMINAL_S * k
    loop = RealScenario("loop", "loop", "loopback, engine throttles", max_threads=max_threads, dataset_bytes=0,
                        n_files=16)

    def throttled(name: str, family: str, description: str, phases: Sequence[Tuple[float, str]]) -> EnginePath:
        ph = tuple((a * k, s) for a, s in phases)
        optima = tuple(throttle_optimum(s, max_threads) for _, s in ph)
        cs = ChangingScenario(name, description, loop, throttle_phases=ph, phase_optima=optima, nominal_s=nominal)
        return EnginePath(name, family, cs, "throttle")

    fast = (25, 150)
    out = [
        throttled("mb-read-write", "moving-bottleneck",
                  f"loopback; read-bound (6 MB/s per read thread, 48 MB/s) until {8 * k:g} s, then write-bound "
                  "(7 MB/s per write thread, 56 MB/s)",
                  [(0.0, _spec((6, 48), fast, fast)), (8.0, _spec(fast, fast, (7, 56)))]),
        throttled("mb-net-read", "moving-bottleneck",
                  f"loopback; net-bound (4 MB/s per connection, 40 MB/s) until {7 * k:g} s, then read-bound "
                  "(3 MB/s per read thread, 30 MB/s)",
                  [(0.0, _spec((20, 120), (4, 40), (20, 120))), (7.0, _spec((3, 30), (20, 120), (20, 120)))]),
        throttled("two-limits", "two-limits",
                  "loopback; read and write both cap the path at 36 MB/s (4 MB/s per read thread, 9 MB/s per "
                  "write thread)", [(0.0, _spec((4, 36), fast, (9, 36)))]),
        throttled("throttle-link-change", "link-change",
                  f"loopback; net 5 MB/s per connection, 50 MB/s in total; the total halves at {6 * k:g} s and "
                  f"recovers at {12 * k:g} s (engine throttles)",
                  [(0.0, _spec(fast, (5, 50), fast)), (6.0, _spec(fast, (5, 25), fast)),
                   (12.0, _spec(fast, (5, 50), fast))]),
    ]
    real = real_scenarios()
    for rtt in ("net-rtt20", "net-rtt80"):
        p = real[rtt].scaled(max_threads=max_threads, dataset_bytes=0)
        cs = ChangingScenario(rtt, p.description, p, nominal_s=nominal)
        out.append(EnginePath(rtt, "rtt", cs, "grid", expected_bps=36 * MB))
    link = RealScenario("link", "net", "36 MB/s tbf link, 30 ms RTT, 256 KiB per connection in flight",
                        link_bps=36 * MB, rtt_s=0.030, window=256 * KiB, max_threads=max_threads, dataset_bytes=0,
                        n_files=16)
    per_conn = link.window / link.rtt_s
    conns = [int(math.ceil(r / per_conn)) for r in (36 * MB, 12 * MB, 36 * MB)]
    out.append(EnginePath("link-steps", "link-change", ChangingScenario(
        "link-steps", f"{link.description}; the link drops to 12 MB/s at {6 * k:g} s and recovers at {12 * k:g} s "
        "(tc qdisc change)", link, rate_events=((6.0 * k, 12 * MB), (12.0 * k, 36 * MB)),
        phase_optima=tuple((2, c, 2) for c in conns), nominal_s=nominal), "link"))
    cpu = real["cpu"].scaled(max_threads=max_threads, dataset_bytes=0)
    out.append(EnginePath("cpu", "cpu", ChangingScenario("cpu", cpu.description, cpu, nominal_s=nominal), "grid",
                          expected_bps=55 * MB))
    disk = real["disk"].scaled(max_threads=max_threads, dataset_bytes=0, n_files=DISK_FILES,
                               description="cold reads of 100 kB files from the real disk (posix_fadvise "
                               "DONTNEED before every copy), writes to the real disk with --fsync file")
    out.append(EnginePath("disk", "disk", ChangingScenario("disk", disk.description, disk, nominal_s=nominal), "grid",
                          expected_bps=DISK_DATASET_BYTES / NOMINAL_S))
    out.append(throttled("static-ratio", "static",
                         "loopback; 3 MB/s per read thread (45 MB/s), 25 MB/s per connection, 12 MB/s per write "
                         "thread", [(0.0, _spec((3, 45), (25, 200), (12, 200)))]))
    return {p.name: p for p in out}




# ---------------------------------------------------------------------------------------------
# metrics (pure functions of a transfer's interval rows)
# ---------------------------------------------------------------------------------------------
def phase_index(t: float, starts: Sequence[float]) -> int:
    """The phase (0 from the start, one more after each change) that time ``t`` falls in."""
    i = 0
    for j, s in enumerate(starts):
        if t >= s:
            i = j
    return i


def recovery(rows: Sequence[Dict[str, Any]], change_t: float, achievable: Optional[float],
             end_t: Optional[float] = None, frac: float = RECOVERY_FRACTION, hold: int = RECOVERY_HOLD
             ) -> Tuple[Optional[float], Optional[int]]:
    """(seconds, control intervals) from a change back to ``frac`` of ``achievable``.

    Seconds: :func:`~automdt.experiments.changing.time_to_fraction` (the end of the first interval
    that starts after the change, reaches the level and holds it on average over ``hold``
    intervals). Intervals: how many intervals starting after the change end by then (the first full
    one after the change is 1). ``(None, None)`` when the level is not reached before ``end_t``."""
    secs = time_to_fraction(rows, change_t, achievable, end_t, frac, hold)
    if secs is None:
        return None, None
    n = sum(1 for r in rows if float(r["t"]) - float(r.get("interval_s") or 1.0) >= change_t - 0.05
            and float(r["t"]) <= change_t + secs + 1e-9)
    return secs, n


def low_intervals(rows: Sequence[Dict[str, Any]], starts: Sequence[float], achievable: Sequence[Optional[float]],
                  max_threads: int, total_bytes: Optional[int] = None, frac: float = LOW_FRACTION) -> List[bool]:
    """Per interval: delivered below ``frac`` of its phase's achievable rate (the phase its middle falls
    in) while some stage ran below ``max_threads`` and, when ``total_bytes`` is given, at least one
    interval's worth of data at that rate was left to write when it began (the last chunks of a
    dataset drain at whatever rate their threads have: more threads cannot help there)."""
    out = []
    written = 0.0
    for r in rows:
        dt = float(r.get("interval_s") or 1.0)
        ach = achievable[min(phase_index(float(r["t"]) - dt / 2, starts), len(achievable) - 1)]
        room = any(int(r[f"threads_{s}"]) < max_threads for s in STAGES)
        left = total_bytes is None or (total_bytes - written) >= (ach or 0.0) * dt
        out.append(bool(ach and float(r["tput_write"]) < frac * ach and room and left))
        written += float(r.get("bytes_write") or float(r["tput_write"]) * dt)
    return out


def longest_run(flags: Sequence[bool]) -> int:
    """The longest run of consecutive True values."""
    best = cur = 0
    for f in flags:
        cur = cur + 1 if f else 0
        best = max(best, cur)
    return best


def transfer_metrics(rows: Sequence[Dict[str, Any]], change_t: Sequence[float], achievable: Sequence[Optional[float]],
                     max_threads: int, total_bytes: Optional[int] = None) -> Dict[str, Any]:
    """Recovery after each change, low intervals and mean threads of one transfer (module docstring).

    :param rows: the transfer's flattened interval rows (:func:`automdt.experiments.metrics.flatten`).
    :param change_t: the change times on the rows' clock.
    :param achievable: the achievable rate of each phase (one more than changes).
    """
    starts = [0.0] + list(change_t)
    out: Dict[str, Any] = {"intervals": len(rows)}
    last_t = float(rows[-1]["t"]) if rows else 0.0
    secs, ivs = recovery(rows, 0.0, achievable[0], starts[1] if len(starts) > 1 else None)
    out["to90_start_s"], out["to90_start_intervals"] = secs, ivs
    rec_s: List[Optional[float]] = []
    rec_n: List[Optional[int]] = []
    reached: List[bool] = []
    for i, c in enumerate(change_t):
        end = starts[i + 2] if i + 2 < len(starts) else None
        s, n = recovery(rows, c, achievable[i + 1] if i + 1 < len(achievable) else None, end)
        rec_s.append(s)
        rec_n.append(n)
        reached.append(c < last_t)
    out["recovery_s"], out["recovery_intervals"], out["change_reached"] = rec_s, rec_n, reached
    judged = [n for n, ok in zip(rec_n, reached) if ok]
    out["worst_recovery_intervals"] = (None if any(n is None for n in judged) else max(judged)) if judged else None
    out["recovered_all"] = (all(n is not None and n <= RECOVERY_INTERVALS for n in judged)) if judged else None
    low = low_intervals(rows, starts, achievable, max_threads, total_bytes)
    out["low_intervals"] = int(sum(low))
    out["longest_low_run"] = longest_run(low)
    for s in STAGES:
        out[f"mean_threads_{s}"] = float(np.mean([float(r[f"threads_{s}"]) for r in rows])) if rows else None
    out["mean_threads_total"] = (sum(out[f"mean_threads_{s}"] for s in STAGES) if rows else None)
    return out


def _median(xs: Sequence[Optional[float]]) -> Optional[float]:
    v = [float(x) for x in xs if x is not None]
    return float(np.median(v)) if v else None


def summarize(transfers: Sequence[Dict[str, Any]], paths: Dict[str, Dict[str, Any]], labels: Sequence[str]
              ) -> Tuple[List[Dict[str, Any]], Dict[str, Dict[str, Any]]]:
    """Per path and controller medians over the repetitions, and each controller's targets.

    A transfer that did not complete counts with the time it was given (a lower bound of its
    completion time, flagged ``incomplete``)."""
    summary: List[Dict[str, Any]] = []
    for pname, pinfo in paths.items():
        for lab in labels:
            rs = [t for t in transfers if t["path"] == pname and t["controller"] == lab]
            if not rs:
                continue
            d: Dict[str, Any] = {"path": pname, "controller": lab, "changing": bool(pinfo.get("changing")),
                                 "reps": len(rs), "completed": sum(1 for t in rs if t["completed"]),
                                 "completion_s": _median([t["completion_s"] for t in rs]),
                                 "completion_min_s": min((t["completion_s"] for t in rs if t["completion_s"] is not None),
                                                         default=None),
                                 "completion_max_s": max((t["completion_s"] for t in rs if t["completion_s"] is not None),
                                                         default=None)}
            nchg = len(pinfo.get("change_times") or [])
            d["recovery_intervals"] = [_median([_worst(t["recovery_intervals"][i]) for t in rs
                                                if t["change_reached"][i]]) for i in range(nchg)]
            d["recovery_s"] = [_median([t["recovery_s"][i] if t["recovery_s"][i] is not None else math.inf
                                        for t in rs if t["change_reached"][i]]) for i in range(nchg)]
            d["change_reached_reps"] = [sum(1 for t in rs if t["change_reached"][i]) for i in range(nchg)]
            d["worst_recovery_intervals"] = _median([_worst(t["worst_recovery_intervals"]) for t in rs
                                                     if t["recovered_all"] is not None])
            d["recovered_all_reps"] = sum(1 for t in rs if t["recovered_all"])
            d["longest_low_run"] = _median([t["longest_low_run"] for t in rs])
            d["to90_start_intervals"] = _median([_worst(t.get("to90_start_intervals")) for t in rs])
            d["low_intervals"] = _median([t["low_intervals"] for t in rs])
            for s in STAGES + ("total",):
                d[f"mean_threads_{s}"] = _median([t[f"mean_threads_{s}"] for t in rs])
            summary.append(d)
    by = {(d["path"], d["controller"]): d for d in summary}
    for d in summary:
        m = by.get((d["path"], "marlin"))
        o = by.get((d["path"], "model"))
        d["vs_marlin"] = M.ratio(m["completion_s"], d["completion_s"]) if m else None
        d["vs_model"] = M.ratio(o["completion_s"], d["completion_s"]) if o else None
    targets: Dict[str, Dict[str, Any]] = {}
    for lab in labels:
        mine = [d for d in summary if d["controller"] == lab]
        if not mine:
            continue
        chg = [d for d in mine if d["changing"]]
        t: Dict[str, Any] = {}
        w = [d["worst_recovery_intervals"] for d in chg]
        t["recovery"] = {"pass": all(x is not None and x <= RECOVERY_INTERVALS for x in w) if chg else None,
                         "detail": {d["path"]: d["worst_recovery_intervals"] for d in chg}}
        t["low_stretch"] = {"pass": all(d["longest_low_run"] is not None and d["longest_low_run"] <= LOW_MAX_INTERVALS
                                        for d in mine),
                            "detail": {d["path"]: d["longest_low_run"] for d in mine}}
        pairs = [(by.get((d["path"], "marlin")), d) for d in chg]
        pairs = [(m, d) for m, d in pairs if m and m["completion_s"] and d["completion_s"]]
        ratio = (M.ratio(sum(m["completion_s"] for m, _ in pairs), sum(d["completion_s"] for _, d in pairs))
                 if pairs and len(pairs) == len(chg) else None)
        t["vs_marlin"] = {"pass": None if ratio is None else ratio >= MARLIN_RATIO, "ratio": ratio,
                          "detail": {d["path"]: d["vs_marlin"] for d in chg}}
        vm = {d["path"]: d["vs_model"] for d in mine}
        t["vs_model"] = {"pass": None if any(v is None for v in vm.values()) or not vm else
                         all(v >= MODEL_RATIO for v in vm.values()), "detail": vm}
        targets[lab] = t
    return _finite(summary), _finite(targets)


def _finite(x: Any) -> Any:
    """``x`` with every infinite number (a recovery that never happened, in a median) as None."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    if isinstance(x, float) and math.isinf(x):
        return None
    return x


def _worst(n: Optional[float]) -> float:
    """A recovery that never happened counts as infinitely long (it sorts last in a median)."""
    return math.inf if n is None else float(n)


# ---------------------------------------------------------------------------------------------
# controllers
# ---------------------------------------------------------------------------------------------
def controller_list(text: str) -> List[str]:
    """``--policies``: a comma list whose ``static:R,N,W`` (also as ``LABEL=static:R,N,W``) keeps its
    own commas."""
    from automdt.experiments.run import _policy_list

    out: List[str] = []
    for tok in _policy_list(text):
        if tok.isdigit() and out and "=static:" in out[-1].lower() and out[-1].count(",") < 2:
            out[-1] += "," + tok
        else:
            out.append(tok)
    return out


def parse_controllers(tokens: Sequence[str]) -> List[Tuple[str, str]]:
    """``(label, spec)`` pairs from ``--policies`` tokens: a known label, ``LABEL=SPEC`` or a spec
    (labelled by itself)."""
    out = []
    for tok in tokens:
        if "=" in tok:
            lab, spec = tok.split("=", 1)
            out.append((lab.strip(), spec.strip()))
        else:
            out.append((tok, tok))
    return out


def check_controller(label: str, spec: str) -> Optional[str]:
    """None if the controller can run here, else why not (the registry refuses the spec, or the
    shipped PPO network is missing)."""
    from automdt.agents.registry import check_spec

    if label == "best-static":
        return None
    try:
        check_spec(spec)
    except (ValueError, TypeError, ImportError, OSError) as e:
        return f"the policy registry refuses {spec!r}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    if spec.strip().lower() == "ppo":
        info = ppo_default_info()
        if not info.get("available"):
            return str(info.get("reason", "no shipped PPO policy"))
    return None


def controller_spec(label: str, spec: str, ep: EnginePath, ds: Any, best: Optional[Sequence[int]]
                    ) -> Tuple[str, Dict[str, Any]]:
    """The registry spec and keyword arguments of a controller on ``ep`` (``best``: its best static triple)."""
    if label == "best-static":
        if best is None:
            raise RuntimeError("no best static triple (the grid search measured nothing)")
        return "static:%d,%d,%d" % tuple(best), {}
    if spec.strip().lower() == "heuristic":
        p = ep.scenario.path
        bw = p.link_bps or None
        if bw is None and ep.scenario.throttle_phases:
            from automdt.units import parse_throttle

            bw = parse_throttle(ep.scenario.throttle_phases[0][1])["net"][1] or None
        return "heuristic", {"rtt_s": p.rtt_s or LOOPBACK_RTT_S, "bandwidth_bps": float(bw or LOOPBACK_BPS),
                             "avg_file_size": float(ds.avg_file_size), "file_count": len(ds.files)}
    return spec, {}


# ---------------------------------------------------------------------------------------------
# the experiment
# ---------------------------------------------------------------------------------------------
@dataclass
class EngineOptions:
    """What :func:`run_ablation_engine` runs (from :func:`add_engine_arguments`' flags)."""

    out: str = "runs"
    seed: int = 0
    quick: bool = False
    reps: int = REPS
    paths: Optional[Sequence[str]] = None
    policies: Optional[Sequence[str]] = None
    memory: int = DEFAULT_MEMORY
    chunk_size: int = DEFAULT_CHUNK
    interval_s: float = DEFAULT_INTERVAL_S
    max_threads: int = 32
    drop_caches: str = "file"
    grid: str = "full"
    grid_from: Optional[str] = None
    trained: bool = False
    explore_s: float = 30.0
    log: Callable[[str], None] = field(default=lambda s: print(s, flush=True), repr=False)

    def to_dict(self) -> Dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "log"}

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> "EngineOptions":
        names = {f for f in cls.__dataclass_fields__ if f != "log"}
        kw = {k: v for k, v in vars(a).items() if k in names and v is not None}
        if getattr(a, "interval", None) is not None:
            kw["interval_s"] = a.interval
        if getattr(a, "quick", False):
            kw["reps"] = 1
        elif getattr(a, "reps", None) is None:
            kw["reps"] = REPS
        ctl = getattr(a, "controllers", None)  # the shared `ablation` parser's list (both halves)
        if kw.get("policies") is None and isinstance(ctl, str) and not (
                getattr(a, "quick", False) and ctl == ",".join(DEFAULT_CONTROLLERS)):
            kw["policies"] = controller_list(ctl)
        if getattr(a, "out_dir", None):  # `ablation --part all/engine`: beside the simulator half
            kw["out"] = a.out_dir
        return cls(**kw)


def machine_info() -> Dict[str, Any]:
    try:
        uname = subprocess.run(["uname", "-a"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        uname = " ".join(platform.uname())
    return {"uname": uname, "cpus": os.cpu_count(), "python": sys.version.split()[0]}


def yardstick(ep: EnginePath, ps: PathSession, opts: EngineOptions, rd: RunDir) -> Dict[str, Any]:
    """The achievable rate per phase and the best static triple of ``ep`` (set up in ``ps``)."""
    cs = ep.scenario
    if ep.yardstick == "throttle":
        return {"achievable_bps": cs.phase_nominals(), "best_static": list(cs.oracle_static()),
                "phase_optima": [list(t) for t in cs.phase_optima], "source": "simulator oracle per throttle phase"}
    if ep.yardstick == "link":
        cal = calibrate_goodput(ps, opts.quick)
        return {"achievable_bps": cs.phase_nominals(cal["goodput_efficiency"]), "best_static": list(cs.oracle_static()),
                "phase_optima": [list(t) for t in cs.phase_optima], "calibration": cal,
                "source": "link rate x calibrated goodput; window/RTT per connection"}
    cached = os.path.join(opts.grid_from, f"grid-{ep.name}.json") if opts.grid_from else None
    if cached and os.path.exists(cached):
        with open(cached) as f:
            grid = json.load(f)
        grid["cached_from"] = os.path.abspath(cached)
    else:
        grid = grid_search(ps, argparse.Namespace(log=opts.log), quick=opts.quick or opts.grid == "small")
    with open(rd.file(f"grid-{ep.name}.json"), "w") as f:
        json.dump(grid, f, indent=1)
    if grid.get("error"):
        return {"achievable_bps": [None], "best_static": None, "grid": grid, "source": "empirical grid (failed)"}
    v = grid.get("verified") or {}
    ach = max(float(grid["throughput_bps"]), float(v.get("best_bps") or 0.0))
    return {"achievable_bps": [ach], "best_static": list(grid["triple"]), "grid_file": f"grid-{ep.name}.json",
            "grid": {k: grid[k] for k in ("triple", "throughput_bps", "note", "best_grid_triple", "best_grid_bps",
                                          "verified", "seconds") if k in grid}
            | ({"cached_from": grid["cached_from"]} if "cached_from" in grid else {}),
            "source": "empirical grid search on the path (real.grid_search, "
                      + ("small" if grid.get("levels") == [1, 8] else "full") + ")"}


def _path_for(ep: EnginePath, opts: EngineOptions) -> RealScenario:
    nbytes = ep.dataset_bytes()
    return ep.scenario.path.scaled(dataset_bytes=max(nbytes, 16 * MB), max_threads=opts.max_threads)


def run_path(ep: EnginePath, controllers: Sequence[Tuple[str, str]], opts: EngineOptions, rd: RunDir,
             transfers: List[Dict[str, Any]], intervals: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Set ``ep`` up, measure its yardstick, run every controller ``opts.reps`` times (interleaved)."""
    log = opts.log
    path = _path_for(ep, opts)
    info: Dict[str, Any] = {"path": ep.to_dict(), "changing": ep.changing, "change_times": ep.scenario.change_times,
                            "load_before": load_average(), "started": _now(), "skipped_controllers": {}}
    log(f"  {ep.name}: {ep.scenario.description}")
    t0 = time.monotonic()
    with PathSession(path, rd.file(f"work/{ep.name}"), memory=opts.memory, chunk_size=opts.chunk_size,
                     interval_s=opts.interval_s, drop_caches=opts.drop_caches, seed=opts.seed, log=log) as ps:
        ds = ps.dataset
        assert ds is not None
        info["dataset"] = ds.to_dict()
        info["session"] = {k: v for k, v in ps.describe().items() if k not in ("scenario", "dataset")}
        y = yardstick(ep, ps, opts, rd)
        info.update(y)
        ach = y["achievable_bps"]
        log(f"    achievable {[None if a is None else round(a / MB, 1) for a in ach]} MB/s, best static "
            f"{y['best_static']}, dataset {ds.total_bytes / MB:.0f} MB")
        slowest = min((a for a in ach if a), default=None)
        timeout = 4.0 * (ds.total_bytes / slowest if slowest else ep.scenario.nominal_s) + 40.0
        controllers = list(controllers)
        if opts.trained:  # the operator's workflow: explore this path, train a file, run it beside the others
            from automdt.experiments.workflow import explore_and_train_engine

            info["workflow"] = explore_and_train_engine(ep, ps, opts, rd, controllers)
            if info["workflow"].get("policy"):
                controllers.append(("trained", info["workflow"]["policy"]))
        for rep in range(opts.reps):
            shift = rep % max(1, len(controllers))
            for lab, spec0 in list(controllers[shift:]) + list(controllers[:shift]):
                try:
                    spec, kw = controller_spec(lab, spec0, ep, ds, y["best_static"])
                except RuntimeError as e:
                    info["skipped_controllers"][lab] = str(e)
                    continue
                load = load_average()
                run, change_t, events = changing_transfer(ps, ep.scenario, lab, spec, kw, timeout,
                                                          rd.log_path(ep.name, lab, f"rep{rep + 1}"))
                completed = run.summary.get("exit_code") == 0 and not run.summary.get("files_failed")
                m = transfer_metrics(run.rows, change_t, ach, opts.max_threads, ds.total_bytes)
                row: Dict[str, Any] = {"path": ep.name, "family": ep.family, "changing": ep.changing,
                                       "controller": lab, "spec": spec, "rep": rep + 1,
                                       "completed": bool(completed),
                                       "completion_s": (float(run.summary["seconds"]) if run.summary.get("seconds")
                                                        is not None else round(run.wall_s, 3)),
                                       "bytes": run.summary.get("bytes"), "error": run.error or (
                                           None if completed else f"exit {run.summary.get('exit_code')}"),
                                       "change_t": [round(x, 3) for x in change_t], "load_before": load,
                                       "start": run.summary.get("start"), "events": events} | m
                transfers.append(row)
                for r in run.rows:
                    intervals.append({"path": ep.name, "controller": lab, "rep": rep + 1} | r)
                log(f"    rep {rep + 1} {lab:13s} {row['completion_s']:6.1f} s"
                    + ("" if completed else " (did not complete)")
                    + (f", back to 90% in {m['recovery_intervals']} intervals" if ep.changing else "")
                    + f", longest low run {m['longest_low_run']}, threads "
                    + ",".join(M.fmt(m.get(f"mean_threads_{s}"), 1) for s in STAGES)
                    + (f"  ERROR {run.error}" if run.error else ""))
    info["seconds"] = round(time.monotonic() - t0, 1)
    return info


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def write_outputs(rd: RunDir, doc: Dict[str, Any], transfers: Sequence[Dict[str, Any]],
                  intervals: Sequence[Dict[str, Any]]) -> str:
    """Recompute the medians and targets and (re)write the JSON, CSVs and the markdown tables."""
    labels = [lab for lab, _ in doc["config"]["controllers"]]
    labels += [lab for lab in dict.fromkeys(t["controller"] for t in transfers) if lab not in labels]  # "trained"
    doc["summary"], doc["targets"] = summarize(transfers, doc["paths"], labels)
    doc["transfers"] = list(transfers)
    path = rd.file(f"{NAME}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, default=_json_default)
        f.write("\n")
    os.replace(tmp, path)
    rd.write_csv(f"{NAME}.csv", [{k: v for k, v in t.items() if k != "events"} for t in transfers])
    rd.write_csv("intervals.csv", intervals)
    text = engine_tables(path)
    if any(p.get("workflow") for p in doc["paths"].values()):
        from automdt.experiments.workflow import engine_workflow_tables

        text += "\n**The operator's workflow (explore -> train -> transfer with the file)**\n\n" + engine_workflow_tables(path)
    rd.write_text(f"{NAME}.md", text)
    return path


def run_ablation_engine(args: Any) -> str:
    """Run the engine ablation (``args``: the namespace of :func:`add_engine_arguments`' flags, or an
    :class:`EngineOptions`); returns the run directory."""
    opts = args if isinstance(args, EngineOptions) else EngineOptions.from_args(args)
    all_paths = engine_paths(opts.quick, opts.max_threads)
    names = list(opts.paths) if opts.paths else list(QUICK_PATHS if opts.quick else DEFAULT_PATHS)
    bad = [n for n in names if n not in all_paths]
    if bad:
        raise SystemExit(f"unknown engine path(s) {', '.join(bad)}; choose from {', '.join(all_paths)}")
    if opts.reps < 1:
        raise SystemExit("--reps must be at least 1")
    wanted = parse_controllers(opts.policies or (QUICK_CONTROLLERS if opts.quick else DEFAULT_CONTROLLERS))
    controllers, skipped = [], {}
    for lab, spec in wanted:
        why = check_controller(lab, spec)
        if why is None:
            controllers.append((lab, spec))
        else:
            skipped[lab] = why
            opts.log(f"  skipping controller {lab}: {why}")
    rd = RunDir(opts.out, NAME)
    g = git_info()
    rerun = (f"python -m automdt.experiments.ablation_engine --paths {','.join(names)} --reps {opts.reps} "
             f"--policies {','.join(lab if spec == lab else f'{lab}={spec}' for lab, spec in wanted)}"
             f" --seed {opts.seed}" + (" --quick" if opts.quick else ""))
    config = {"experiment": NAME, "date": _now(), "git": g, "machine": machine_info(), "options": opts.to_dict(),
              "paths": {n: all_paths[n].to_dict() for n in names}, "controllers": [list(c) for c in controllers],
              "skipped_controllers": skipped, "reps": opts.reps, "targets": TARGETS,
              "ppo_default": ppo_default_info(), "rerun": rerun}
    rd.write_config(config)
    doc: Dict[str, Any] = {"config": config, "paths": {}, "skipped_paths": {}}
    transfers: List[Dict[str, Any]] = []
    intervals: List[Dict[str, Any]] = []
    opts.log(f"[{NAME}] {rd.path}: {len(names)} paths x {len(controllers)} controllers x {opts.reps} reps")
    for n in names:
        ep = all_paths[n]
        ok, why = ep.scenario.path.requirements()
        if not ok:
            doc["skipped_paths"][n] = why
            opts.log(f"  {n}: skipped ({why})")
            continue
        try:
            doc["paths"][n] = run_path(ep, controllers, opts, rd, transfers, intervals)
        except Exception as e:  # noqa: BLE001 - a path that cannot be set up is recorded; the others run
            doc["skipped_paths"][n] = f"{type(e).__name__}: {e}"
            opts.log(f"  {n}: failed ({doc['skipped_paths'][n]})")
        finally:
            write_outputs(rd, doc, transfers, intervals)
    path = write_outputs(rd, doc, transfers, intervals)
    opts.log(f"[{NAME}] wrote {path} and {NAME}.md")
    return rd.path


# ---------------------------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------------------------
def _n(x: Any, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "never"
    return M.fmt(x, digits)


def _recovery_cell(d: Dict[str, Any], i: int) -> str:
    """``intervals (seconds)`` of change ``i``: ``never`` when the median repetition did not get back
    within the phase, ``n/a`` when no repetition lasted until the change."""
    if not d["change_reached_reps"][i]:
        return "n/a"
    n, s = d["recovery_intervals"][i], d["recovery_s"][i]
    return "never" if n is None else f"{_n(n, 0)} ({_n(s)})"


def _min_ratio(detail: Dict[str, Optional[float]]) -> str:
    v = [x for x in detail.values() if x is not None]
    return f" (lowest {min(v):.2f}x)" if v else ""


def _ok(p: Optional[bool]) -> str:
    return "n/a" if p is None else ("PASS" if p else "FAIL")


def engine_tables(json_path: str) -> str:
    """Markdown tables of an ``ablation-engine.json``: one table per path (medians over the
    repetitions), then the targets per controller."""
    with open(json_path) as f:
        doc = json.load(f)
    cfg = doc["config"]
    g = cfg.get("git") or {}
    mach = cfg.get("machine") or {}
    lines = ["# Engine ablation", "",
             f"{len(doc.get('paths', {}))} held-out paths x {len(cfg['controllers'])} controllers x {cfg['reps']} "
             f"interleaved repetitions (medians over the repetitions; `experiments/ablation_engine.py`). "
             f"git `{(g.get('commit') or '?')[:12]}`" + (" (working tree modified)" if g.get("dirty") else "")
             + f"; {cfg.get('date')}; {mach.get('cpus')} CPUs; `{mach.get('uname', '')}`.", ""]
    if cfg.get("options", {}).get("quick"):
        lines += ["**Quick mode**: short datasets, a smoke test, not a measurement.", ""]
    if cfg.get("skipped_controllers"):
        lines += ["Controllers not run: " + "; ".join(f"**{k}**: {v}" for k, v in cfg["skipped_controllers"].items()),
                  ""]
    if doc.get("skipped_paths"):
        lines += ["Paths not run: " + "; ".join(f"**{k}**: {v}" for k, v in doc["skipped_paths"].items()), ""]
    summary = doc.get("summary") or []
    for name, info in doc.get("paths", {}).items():
        p = info["path"]
        ach = info.get("achievable_bps") or []
        lines += [f"## {name} ({p['family']})", "",
                  f"{p['scenario']['description']}. Achievable per phase "
                  f"{[None if a is None else round(a / MB, 1) for a in ach]} MB/s ({info.get('source')}); best static "
                  f"triple {info.get('best_static')}; changes at {info.get('change_times')} s; dataset "
                  f"{(info.get('dataset') or {}).get('total_bytes', 0) / MB:.0f} MB; load average before "
                  f"{info.get('load_before')}.", ""]
        if info.get("skipped_controllers"):
            lines += ["Not run here: " + "; ".join(f"**{k}**: {v}" for k, v in info["skipped_controllers"].items()), ""]
        nchg = len(info.get("change_times") or [])
        head = (["controller", "completion s (min-max)", "vs marlin", "vs model"]
                + [f"change {i + 1}: intervals (s) to 90%" for i in range(nchg)]
                + ["longest low run", "low intervals", "mean threads r,n,w", "completed"])
        rows = []
        for d in (x for x in summary if x["path"] == name):
            rows.append([d["controller"], f"{_n(d['completion_s'])} ({_n(d['completion_min_s'])}-"
                         f"{_n(d['completion_max_s'])})", _n(d["vs_marlin"], 2), _n(d["vs_model"], 2)]
                        + [_recovery_cell(d, i) for i in range(nchg)]
                        + [_n(d["longest_low_run"], 0), _n(d["low_intervals"], 0),
                           ",".join(_n(d[f"mean_threads_{s}"]) for s in STAGES), f"{d['completed']}/{d['reps']}"])
        lines += [M.md_table(head, rows), ""]
    lines += ["## Targets", "", "Per controller, on the medians over the repetitions: "
              + "; ".join(f"**{k}**: {v}" for k, v in TARGETS.items()) + ".", ""]
    trows = []
    for lab, t in (doc.get("targets") or {}).items():
        trows.append([lab, _ok(t["recovery"]["pass"]), _ok(t["low_stretch"]["pass"]),
                      _ok(t["vs_marlin"]["pass"]) + ("" if t["vs_marlin"]["ratio"] is None else f" ({t['vs_marlin']['ratio']:.2f}x)"),
                      _ok(t["vs_model"]["pass"]) + _min_ratio(t["vs_model"]["detail"])])
    lines += [M.md_table(["controller", "recovery", "low stretch", "vs marlin (changing paths)", "vs model (every path)"],
                         trows), "",
              "Completion: seconds of the transfer (scan to done); vs marlin / vs model: that controller's median "
              "completion over this one's (above 1: faster). Change *k*: control intervals (seconds) from the change "
              f"to {RECOVERY_FRACTION:.0%} of the new achievable rate, held over {RECOVERY_HOLD} intervals "
              "(`never`: not within the phase). Low: delivered below "
              f"{LOW_FRACTION:.0%} of the achievable rate while a stage could add threads.", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------
def add_engine_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the engine ablation's flags to ``parser`` (flags it already has, e.g. ``--out``,
    ``--seed``, ``--quick`` of a shared parser, are kept as they are)."""
    from automdt.experiments.run import _csv_list

    have = set(getattr(parser, "_option_string_actions", {}))

    def add(flag: str, **kw: Any) -> None:
        if flag not in have:
            parser.add_argument(flag, **kw)

    add("--out", default="runs", help="parent directory of the run directory (default runs)")
    add("--seed", type=int, default=0, help="seed of the datasets and policies (default 0)")
    add("--quick", action="store_true",
        help=f"a smoke test: paths {','.join(QUICK_PATHS)}, controllers {','.join(QUICK_CONTROLLERS)}, 1 repetition, "
             f"every time x{QUICK_SCALE:g} (a few seconds per transfer)")
    add("--reps", type=int, default=None, help=f"repetitions per path and controller, interleaved (default {REPS}; "
        "--quick: 1 whatever this says)")
    add("--paths", type=_csv_list, default=None,
        help="comma list of engine paths: " + ",".join(engine_paths()) + " (default: all but net-rtt20)")
    add("--policies", type=controller_list, default=None,
        help="comma list of controllers: labels (" + ",".join(DEFAULT_CONTROLLERS) + ", the default list), "
             "registry specs (static:R,N,W keeps its commas) or LABEL=SPEC; a spec the policy registry refuses "
             "is skipped with the reason")
    add("--interval", type=float, default=None, help=f"control interval, seconds (default {DEFAULT_INTERVAL_S:g})")
    add("--max-threads", type=int, default=None, help="upper bound of each stage's threads (default 32)")
    add("--drop-caches", choices=["file", "all"], default=None,
        help="how the disk path evicts its dataset before every copy: file (posix_fadvise, default) or all "
             "(echo 3 > /proc/sys/vm/drop_caches)")
    add("--grid", choices=["full", "small"], default=None,
        help="the empirical grid of the rtt, cpu and disk paths: full (real.py's empirical oracle: each stage at "
             "1, 4, 16 threads, lines at 1-32 threads, refined; about 5 minutes a path; the default) or small "
             "(1 and 8, lines at 1, 4, 16; about 1.5 minutes, coarse: the best static triple may be far from best)")
    add("--trained", action="store_true", default=None,
        help="the operator's workflow on every path: explore it (its first phase) for --explore-seconds, train a "
             "file with `automdt train --profile` defaults and run it as controller 'trained'; records what the "
             "simulator predicts on the explored profile for every controller")
    add("--explore-seconds", dest="explore_s", type=float, default=None,
        help="seconds of exploration per path with --trained (default 30)")
    add("--grid-from", metavar="DIR", default=None,
        help="reuse the empirical grids (grid-<path>.json) of an earlier ablation-engine run directory")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    import signal

    p = argparse.ArgumentParser(prog="python -m automdt.experiments.ablation_engine",
                                description=(__doc__ or "").split("\n\n")[0])
    add_engine_arguments(p)
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    t0 = time.monotonic()
    try:
        out = run_ablation_engine(a)
    except KeyboardInterrupt:
        print("interrupted: partial results kept, temporary data removed", file=sys.stderr)
        return 130
    print(f"{NAME}: {out}")
    print(f"done in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
