"""Numbers computed from the controller's interval records of one run.

Every record (``Summary.history``; one per control interval) is flattened by :func:`flatten` into
a row with ``t`` (seconds since the controller started, at the end of the interval),
``threads_{read,net,write}``, ``tput_{read,net,write}`` (bytes/s), ``buf_{sender,receiver}``,
``cpu`` and the raw counters. The *delivered* throughput of an interval is the write stage's:
bytes that reached the destination disk.

Definitions used in every table:

* **convergence time** (``conv_s``): the end ``t`` of the first interval whose delivered
  throughput is at least ``frac`` (0.9) of the scenario's achievable throughput and from which the
  mean over ``hold`` (3) intervals is too ("reached and held"); ``None`` when never;
* **after convergence**: the intervals after that one (after the first half of the run when the
  run never converged, flagged ``converged=False``);
* **stability**: the standard deviation and the spread (max - min) of each stage's thread count
  after convergence, and how often the triple changed;
* **bottleneck hold**: the fraction of intervals after convergence whose bottleneck-stage thread
  count is within one of the minimum that achieves the throughput.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from automdt.interval import as_record
from automdt.policy_contract import STAGES


def flatten(rec: Any) -> Dict[str, Any]:
    """One controller record (an :class:`~automdt.interval.IntervalRecord`, or its JSON object as
    the sender processes of the experiments write it) -> one flat CSV row."""
    r = as_record(rec)
    row: Dict[str, Any] = {"t": r.t, "interval_s": r.interval_s}
    for s, v in zip(STAGES, r.threads):
        row[f"threads_{s}"] = v
    for s, v in zip(STAGES, r.next_threads or r.threads):
        row[f"next_{s}"] = v
    for s, v in zip(STAGES, r.throughput):
        row[f"tput_{s}"] = v
    row["buf_sender"], row["buf_receiver"] = r.buffer
    row["cpu"] = r.cpu
    row["loss"] = r.loss
    for key in ("bytes", "busy_s", "wait_s"):
        for s, v in zip(STAGES, getattr(r, key)):
            row[f"{key}_{s}"] = v
    return row


def _arr(rows: Sequence[Dict[str, Any]], key: str) -> np.ndarray:
    return np.array([float(r[key]) if r.get(key) not in (None, "") else np.nan for r in rows], dtype=np.float64)


def convergence_time(rows: Sequence[Dict[str, Any]], achievable_bps: float, frac: float = 0.9,
                     hold: int = 3) -> Optional[float]:
    """See the module docstring; ``None`` when the delivered throughput never reached and held."""
    idx = convergence_index(rows, achievable_bps, frac, hold)
    return None if idx is None else float(rows[idx]["t"])


def convergence_index(rows: Sequence[Dict[str, Any]], achievable_bps: float, frac: float = 0.9,
                      hold: int = 3) -> Optional[int]:
    x = _arr(rows, "tput_write")
    thr = frac * achievable_bps
    n = len(x)
    for i in range(n):
        if x[i] < thr:
            continue
        window = x[i:i + hold]
        if len(window) < min(hold, 2) and n > 1:
            return None  # too close to the end to tell whether it held
        if np.nanmean(window) >= thr:
            return i
    return None


def run_metrics(rows: Sequence[Dict[str, Any]], achievable_bps: float, bottleneck: str,
                min_threads: Dict[str, int], frac: float = 0.9, hold: int = 3) -> Dict[str, Any]:
    """Throughput, convergence, stability and thread use of one run (see the module docstring)."""
    out: Dict[str, Any] = {"intervals": len(rows)}
    if not rows:
        return out | {"converged": False, "conv_s": None}
    x = _arr(rows, "tput_write")
    th = np.stack([_arr(rows, f"threads_{s}") for s in STAGES], axis=1)
    out["mean_delivered_bps"] = float(np.nanmean(x))
    out["mean_delivered_frac"] = float(np.nanmean(x) / achievable_bps)
    out["peak_delivered_bps"] = float(np.nanmax(x))
    out["mean_total_threads"] = float(th.sum(axis=1).mean())
    for j, s in enumerate(STAGES):
        out[f"mean_threads_{s}"] = float(th[:, j].mean())
    cpu = _arr(rows, "cpu")
    out["mean_cpu_pct_intervals"] = float(np.nanmean(cpu)) if np.isfinite(cpu).any() else None
    idx = convergence_index(rows, achievable_bps, frac, hold)
    out["converged"] = idx is not None
    out["conv_s"] = None if idx is None else float(rows[idx]["t"])
    start = idx + 1 if idx is not None else len(rows) // 2
    after = th[start:] if start < len(rows) else th[-1:]
    xa = x[start:] if start < len(rows) else x[-1:]
    out["after_intervals"] = int(len(after))
    out["after_mean_delivered_bps"] = float(np.nanmean(xa))
    out["after_mean_total_threads"] = float(after.sum(axis=1).mean())
    for j, s in enumerate(STAGES):
        col = after[:, j]
        out[f"after_median_{s}"] = float(np.median(col))
        out[f"after_std_{s}"] = float(col.std())
        out[f"after_spread_{s}"] = int(col.max() - col.min())
    out["after_std_sum"] = float(sum(out[f"after_std_{s}"] for s in STAGES))
    changes = int((np.abs(np.diff(after, axis=0)).sum(axis=1) > 0).sum()) if len(after) > 1 else 0
    out["after_changes"] = changes
    b = STAGES.index(bottleneck)
    nb = min_threads[bottleneck]
    out["bottleneck_within1_frac"] = float((np.abs(after[:, b] - nb) <= 1).mean())
    others = [j for j in range(3) if j != b]
    out["others_after_median_max"] = float(max(np.median(after[:, j]) for j in others))
    return out


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index ``(sum x)^2 / (n sum x^2)``: 1 is perfectly fair, 1/n the worst."""
    v = np.asarray(values, dtype=np.float64)
    s2 = float((v ** 2).sum())
    return float(v.sum() ** 2 / (len(v) * s2)) if s2 > 0 else float("nan")


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """``a / b``, or ``None`` when either is missing or ``b`` is 0."""
    if a is None or b is None:
        return None
    try:
        if not (math.isfinite(a) and math.isfinite(b)) or b == 0:
            return None
    except TypeError:
        return None
    return float(a) / float(b)


def median(xs: Sequence[float]) -> float:
    """The median of ``xs``; NaN for none (a benchmark row whose runs all failed)."""
    return statistics.median(xs) if len(xs) else float("nan")


def mb(x: Optional[float]) -> str:
    """Bytes/s (or bytes) as MB (10^6) with one decimal; ``-`` for None."""
    return "-" if x is None else f"{x / 1e6:.1f}"


def fmt(x: Any, digits: int = 2, unit: str = "") -> str:
    """Format a number for a markdown table (``-`` for missing)."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (int, np.integer)):
        return f"{int(x)}{unit}"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if not math.isfinite(v):
        return "-"
    return f"{v:.{digits}f}{unit}"


def md_table(header: Sequence[str], rows: List[Sequence[Any]]) -> str:
    """A GitHub markdown table (cells already formatted or formatted with :func:`fmt`)."""
    def cell(c: Any) -> str:
        return (c if isinstance(c, str) else fmt(c)).replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(cell(c) for c in r) + " |")
    return "\n".join(lines)
