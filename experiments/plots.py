"""Matplotlib figures of the experiments; every function writes one PNG and returns its path.

The figures are :class:`matplotlib.figure.Figure` objects rendered by the Agg canvas, without
pyplot: nothing here selects or changes the process's matplotlib backend (a notebook keeps its
inline backend), and no window ever opens.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import numpy as np
from matplotlib.figure import Figure

STAGE_COLORS = {"read": "tab:red", "net": "tab:green", "write": "tab:blue"}
POLICY_COLORS = {
    "ppo": "tab:blue", "marlin": "tab:orange", "falcon": "tab:green", "globus": "tab:red",
    "static": "tab:purple", "heuristic": "tab:brown", "model": "tab:pink", "oracle": "tab:gray",
}
MB = 1e6


def _subplots(nrows: int, ncols: int, figsize, **kw):
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, squeeze=False, **kw)


def _save(fig: Figure, path: str) -> str:
    fig.tight_layout(rect=(0, 0, 1, 0.97) if fig._suptitle is not None else None)
    fig.savefig(path, dpi=90)
    return path


def _col(rows: Sequence[Dict[str, Any]], key: str) -> np.ndarray:
    return np.array([float(r[key]) if r.get(key) is not None else np.nan for r in rows])


def _color(policy: str, i: int) -> str:
    return POLICY_COLORS.get(policy, f"C{i % 10}")


def run_end(run: Any) -> float:
    """Seconds from the run's start to its end: the summary's ``seconds`` (its last, partial
    interval is in no record: a run stopped by ``--max-duration`` ends up to an interval after its
    last record), never before the last record."""
    t = _col(run.rows, "t")
    last = float(t[-1]) if len(t) else 0.0
    try:
        end = float((getattr(run, "summary", None) or {}).get("seconds") or 0.0)
    except (TypeError, ValueError):
        end = 0.0
    return max(end, last)


def _mark_ends(axes_rows: Sequence[Sequence[Any]], runs: Sequence[Any]) -> None:
    """Show every run to its end: the x axis reaches the longest run's end, and a dash-dot line
    marks where each one ended (what follows its last record was not measured)."""
    ends = [run_end(r) for r in runs]
    if not ends or max(ends) <= 0:
        return
    for row, end in zip(axes_rows, ends):
        for ax in row:
            ax.axvline(end, color="k", ls="-.", lw=0.7)
            ax.set_xlim(0.0, max(ends) * 1.02)


def timeseries_grid(path: str, title: str, runs: Sequence[Any], achievable_bps: float,
                    optimum: Sequence[int]) -> str:
    """One row per run: thread counts (left) and stage throughputs (right) over time, to the end
    of the run (dash-dot: where it ended; after its last interval record nothing was measured).

    ``runs``: objects with ``policy`` and ``rows`` (flattened interval records), and ``summary``
    (its ``seconds``: the run's end).
    """
    n = max(1, len(runs))
    fig, axes = _subplots(n, 2, (11, 2.1 * n + 0.8), sharex=True)
    _mark_ends(axes, runs)
    for i, r in enumerate(runs):
        ax_t, ax_x = axes[i]
        _threads_and_rates(ax_t, ax_x, r.rows)
        for s, opt in zip(("read", "net", "write"), optimum):
            ax_t.axhline(opt, color=STAGE_COLORS[s], ls=":", lw=0.8)
        ax_x.axhline(achievable_bps / MB, color="k", ls="--", lw=0.8, label="achievable")
        ax_x.axhline(0.9 * achievable_bps / MB, color="k", ls=":", lw=0.6)
        conv = getattr(r, "metrics", {}).get("conv_s")
        if conv is not None:
            ax_x.axvline(conv, color="gray", lw=0.8)
        ax_t.set_ylabel(f"{r.policy}\nthreads")
        ax_x.set_ylabel("MB/s")
        ax_t.set_ylim(bottom=0)
        ax_x.set_ylim(bottom=0)
        if i == 0:
            ax_t.set_title("thread counts (dotted: minimal optimum; dash-dot: run ended)")
            ax_x.set_title("stage throughput (dashed: achievable, dotted: 90%)")
            ax_t.legend(loc="upper right", fontsize=7, ncol=3)
            ax_x.legend(loc="lower right", fontsize=7, ncol=4)
    axes[-1][0].set_xlabel("seconds")
    axes[-1][1].set_xlabel("seconds")
    fig.suptitle(title)
    return _save(fig, path)


def _threads_and_rates(ax_t, ax_x, rows: Sequence[Dict[str, Any]]) -> None:
    """Each stage's thread count (left axes) and throughput (right axes) over time."""
    t = _col(rows, "t")
    for s, dy in zip(("read", "net", "write"), (0.12, 0.0, -0.12)):
        # threads of the interval ending at t (step "pre"), from t = 0; offset so equal counts stay visible
        n = _col(rows, f"threads_{s}")
        tt = np.concatenate([[0.0], t]) if len(t) else t
        nn = np.concatenate([n[:1], n]) if len(n) else n
        ax_t.step(tt, nn + dy, where="pre", color=STAGE_COLORS[s], label=s, lw=1.5)
        ax_x.plot(t, _col(rows, f"tput_{s}") / MB, color=STAGE_COLORS[s], label=s, lw=1.2)


def delivered_overlay(path: str, panels: Sequence[Dict[str, Any]]) -> str:
    """One panel per scenario: delivered (write) throughput of every policy over time, to the end
    of the longest run (dash-dot, in the policy's colour: where each run ended).

    ``panels``: ``{"title", "achievable_bps", "runs": [...]}``.
    """
    n = max(1, len(panels))
    fig, axes = _subplots(1, n, (5.2 * n, 3.6))
    for ax, p in zip(axes[0], panels):
        for i, r in enumerate(p["runs"]):
            ax.plot(_col(r.rows, "t"), _col(r.rows, "tput_write") / MB, label=r.policy, color=_color(r.policy, i),
                    lw=1.4)
            ax.axvline(run_end(r), color=_color(r.policy, i), ls="-.", lw=0.7)  # where this run ended
        if p["runs"]:
            ax.set_xlim(0.0, max(run_end(r) for r in p["runs"]) * 1.02)
        ax.axhline(p["achievable_bps"] / MB, color="k", ls="--", lw=0.8)
        ax.axhline(0.9 * p["achievable_bps"] / MB, color="k", ls=":", lw=0.8)
        ax.set_title(p["title"])
        ax.set_xlabel("seconds")
        ax.set_ylabel("delivered MB/s")
        ax.set_ylim(bottom=0)
    axes[0][0].plot([], [], color="k", ls="-.", lw=0.7, label="run ended")
    axes[0][0].legend(fontsize=7)
    return _save(fig, path)


def grouped_bars(path: str, title: str, groups: Sequence[str], series: Dict[str, Sequence[Optional[float]]],
                 ylabel: str, hline: Optional[float] = None) -> str:
    """Bars: one group per entry of ``groups``, one bar per series (policy); missing values skipped."""
    fig, axs = _subplots(1, 1, (max(6.0, 1.6 * len(groups) + 2), 3.8))
    ax = axs[0][0]
    names = list(series)
    width = 0.8 / max(1, len(names))
    x = np.arange(len(groups))
    for i, name in enumerate(names):
        vals = np.array([np.nan if v is None else float(v) for v in series[name]])
        ax.bar(x + (i - (len(names) - 1) / 2) * width, vals, width, label=name, color=_color(name, i))
    if hline is not None:
        ax.axhline(hline, color="k", ls="--", lw=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=min(4, len(names)))
    return _save(fig, path)


def fairness_plot(path: str, title: str, pairs: Sequence[Dict[str, Any]], link_bps: float) -> str:
    """One row per pair: delivered throughput (left) and thread counts (right) of both transfers."""
    n = max(1, len(pairs))
    fig, axes = _subplots(n, 2, (11, 2.4 * n + 0.8))
    for i, p in enumerate(pairs):
        ax_x, ax_t = axes[i]
        for j, tr in enumerate(p["transfers"]):
            t = np.array([r["t_abs"] for r in tr["rows"]])
            ax_x.plot(t, np.array([r["tput_write"] for r in tr["rows"]]) / MB, label=tr["name"], color=f"C{j}")
            for s, ls in (("read", ":"), ("net", "-"), ("write", "--")):
                ax_t.step(t, [r[f"threads_{s}"] for r in tr["rows"]], where="post", color=f"C{j}", ls=ls,
                          label=f"{tr['name']} {s}")
        ax_x.axhline(link_bps / MB, color="k", ls="--", lw=0.8)
        ax_x.axhline(link_bps / 2 / MB, color="k", ls=":", lw=0.6)
        ax_x.set_ylabel(f"{p['policy']}\ndelivered MB/s")
        ax_t.set_ylabel("threads")
        ax_x.set_ylim(bottom=0)
        ax_t.set_ylim(bottom=0)
        if i == 0:
            ax_x.legend(fontsize=7)
            ax_t.legend(fontsize=6, ncol=2)
    axes[-1][0].set_xlabel("seconds")
    axes[-1][1].set_xlabel("seconds")
    fig.suptitle(title)
    return _save(fig, path)


def changing_timeseries(path: str, title: str, runs: Sequence[Any], changes: Sequence[float],
                        phases: Sequence[Dict[str, Any]]) -> str:
    """One row per run of a changing path: thread counts (left) and stage throughputs (right), with
    the path's changes (vertical lines, in each run's own clock: ``run.extra["change_t"]`` when
    set, else ``changes``) and each phase's achievable rate (dashed steps; ``phases``: ``{"start_s",
    "achievable_bps"}``)."""
    n = max(1, len(runs))
    fig, axes = _subplots(n, 2, (11, 2.1 * n + 0.8), sharex=True)
    for i, r in enumerate(runs):
        t = _col(r.rows, "t")
        ax_t, ax_x = axes[i]
        cts = (getattr(r, "extra", {}) or {}).get("change_t") or list(changes)
        _threads_and_rates(ax_t, ax_x, r.rows)
        starts = [0.0] + list(cts)
        end = float(t[-1]) if len(t) else (starts[-1] + 10.0)
        for j, ph in enumerate(phases):
            a = ph.get("achievable_bps")
            if a is None or j >= len(starts):
                continue
            hi = starts[j + 1] if j + 1 < len(starts) else max(end, starts[j])
            ax_x.hlines(a / MB, starts[j], hi, colors="k", linestyles="--", lw=0.8)
            ax_x.hlines(0.9 * a / MB, starts[j], hi, colors="k", linestyles=":", lw=0.6)
        for c in cts:
            ax_t.axvline(c, color="gray", lw=0.8)
            ax_x.axvline(c, color="gray", lw=0.8)
        ax_t.set_ylabel(f"{r.policy}\nthreads")
        ax_x.set_ylabel("MB/s")
        ax_t.set_ylim(bottom=0)
        ax_x.set_ylim(bottom=0)
        if i == 0:
            ax_t.set_title("thread counts (grey: the path changes)")
            ax_x.set_title("stage MB/s (dashed: achievable, dotted: 90%)")
            ax_t.legend(loc="upper right", fontsize=7, ncol=3)
            ax_x.legend(loc="lower right", fontsize=7, ncol=3)
    axes[-1][0].set_xlabel("seconds")
    axes[-1][1].set_xlabel("seconds")
    fig.suptitle(title)
    return _save(fig, path)
