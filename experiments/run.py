"""One command per experiment: ``python -m automdt.experiments <name> [options]``.

=============  ==================================================================================
bottlenecks    every policy on the read-, network- and write-bound scenarios for a fixed time:
               thread counts and stage throughputs over time (one PNG per scenario), a table
               per scenario, PPO vs Marlin ratios
convergence    the tuning policies on the three scenarios: seconds to 90% of the achievable
               throughput, and the stability of the thread counts after it (``--from DIR``
               recomputes it from an earlier ``bottlenecks``/``convergence`` run instead)
completion     completion time of a large-file and a mixed-size dataset, every policy, every
               scenario; PPO vs Marlin and vs Globus-like
fairness       two transfers competing for one rate-limited link between two network namespaces
               (see :mod:`automdt.experiments.fairness`); skipped, with the reason, without root
cost           CPU (process CPU seconds over wall time, both ends: the receiver is embedded)
               and threads per policy (``--from DIR`` recomputes from an earlier run)
real           every policy on paths whose bottleneck is a real resource (a tc link with RTT and
               window, the real disk, a CPU-quota cgroup), against the empirical oracle of a grid
               search on the same path, with a sim-to-real report
               (:mod:`automdt.experiments.real`); paths needing root are skipped without it
changing       every policy on paths that change during the transfer (a bottleneck that moves,
               a link that halves and recovers, a transfer that joins and leaves):
               seconds to 90% of the new achievable rate, completion time
               (:mod:`automdt.experiments.changing`)
all            bottlenecks, convergence (from the bottlenecks run), completion, cost (from the
               bottlenecks run) and fairness
=============  ==================================================================================

Each run writes ``<out>/<name>-<timestamp>/`` (``--out``, default ``runs``): ``config.json``
(seed, scenarios with throttles and analytic profiles, datasets, options, policy specs, the
PPO policy file's hash, git commit), ``intervals.csv`` (every control interval of every
transfer), ``runs.csv`` (one line per transfer with its metrics), PNG plots, ``results.md``
(markdown tables), ``logs/*.jsonl`` (the controller's interval logs) and ``profiles/*.yaml``
(the scenarios as simulator profiles). ``--quick`` shrinks everything to well under a minute.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from automdt.experiments import metrics as M
from automdt.policy_contract import STAGES
from automdt.experiments import plots
from automdt.experiments.runner import (ALL_POLICIES, PolicyUnavailable, RunDir, RunResult, Scratch,
                                        build_policy, interval_rows, policy_spec, ppo_default_info, read_csv,
                                        run_one)
from automdt.experiments.scenarios import (DEFAULT_CHUNK, DEFAULT_INTERVAL_S, DEFAULT_MEMORY, MB, Dataset,
                                           DatasetSpec, Scenario, bottleneck_scenarios, large_dataset,
                                           mixed_dataset)

EXPERIMENTS = ("bottlenecks", "convergence", "completion", "fairness", "cost", "real", "changing")
TUNERS = ("ppo", "marlin", "falcon", "heuristic", "model")
CONV_TICK_SLACK_S = 0.15
"""Interval ends lag the whole seconds by the controller's tick (20 ms sleeps plus the poll round
trip): the 5th interval ends at ~5.02-5.10 s. The 5-second check allows that much."""
"""Policies that change thread counts at run time (the ones convergence is about)."""


@dataclass
class Settings:
    """Options shared by the experiments (the command-line flags)."""

    out: str = "runs"
    seed: int = 0
    quick: bool = False
    scenarios: Optional[Sequence[str]] = None
    policies: Optional[Sequence[str]] = None
    duration_s: Optional[float] = None
    rate_bps: float = 80 * MB
    memory: int = DEFAULT_MEMORY
    chunk_size: int = DEFAULT_CHUNK
    interval_s: float = DEFAULT_INTERVAL_S
    max_threads: int = 32
    data_dir: Optional[str] = None
    keep_data: bool = False
    from_dir: Optional[str] = None
    own_explore_s: float = 20.0
    own_train_s: float = 180.0
    own_target: float = 0.98
    drop_caches: str = "file"
    throttle: Optional[str] = None
    real_explore_s: float = 60.0
    log: Callable[[str], None] = field(default=lambda s: print(s, flush=True), repr=False)

    def to_dict(self) -> Dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "log"}


@dataclass
class Experiment:
    """What an experiment wrote (``path``) and computed."""

    name: str
    path: str
    results: List[RunResult]
    skipped: Dict[str, str]
    summary: Dict[str, Any] = field(default_factory=dict)

    def results_md(self) -> str:
        with open(os.path.join(self.path, "results.md")) as f:
            return f.read()


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def _scenarios(st: Settings, quick_default: Sequence[str]) -> List[Scenario]:
    allsc = bottleneck_scenarios(st.rate_bps, st.max_threads)
    names = list(st.scenarios) if st.scenarios else (list(quick_default) if st.quick else list(allsc))
    bad = [n for n in names if n not in allsc]
    if bad:
        raise SystemExit(f"unknown scenario(s) {bad}; choose from {list(allsc)}")
    return [allsc[n] for n in names]


def _policies(st: Settings, default: Sequence[str], quick_default: Sequence[str], probe: Scenario
              ) -> Tuple[List[str], Dict[str, str]]:
    labels = list(st.policies) if st.policies else list(quick_default if st.quick else default)
    ok, skipped = [], {}
    for lab in labels:
        if lab == "ppo-own":
            ok.append(lab)
            continue
        try:
            build_policy(lab, probe, None, st.memory, st.max_threads)
            ok.append(lab)
        except PolicyUnavailable as e:
            skipped[lab] = str(e)
            st.log(f"  skipping policy {lab}: {e}")
    return ok, skipped


def _fixed_dataset(st: Settings, duration_s: float) -> DatasetSpec:
    """Enough data that no policy runs out within ``duration_s`` (reads may run ahead by the buffers)."""
    total = int(st.rate_bps * duration_s * 1.15 + 2 * st.memory + 16 * MB)
    return large_dataset(total, n_files=8, seed=st.seed)


def _policy_config(labels: Sequence[str], scenarios: Sequence[Scenario], datasets: Sequence[Dataset] = ()
                   ) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for lab in labels:
        if lab == "ppo-own":
            out[lab] = {"spec": "ppo:<runs/.../policies/<scenario>-own.zip>",
                        "note": "explore on the scenario, train in the simulator, then transfer"}
            continue
        per = {}
        for sc in scenarios:
            spec, kw = policy_spec(lab, sc, datasets[0] if datasets else None)
            if lab == "oracle":
                kw = {"threads": list(sc.optimum)}
            per[sc.name] = {"spec": spec, "kwargs": kw}
        out[lab] = per
    return out


def _base_config(st: Settings, scenarios: Sequence[Scenario], labels: Sequence[str], skipped: Dict[str, str],
                 extra: Dict[str, Any], rd: RunDir) -> None:
    prof_dir = os.path.join(rd.path, "profiles")
    os.makedirs(prof_dir, exist_ok=True)
    for sc in scenarios:
        sc.profile(st.memory, st.interval_s).save(os.path.join(prof_dir, f"{sc.name}.yaml"))
    cfg = {
        "seed": st.seed,
        "settings": st.to_dict(),
        "options": {"memory": st.memory, "chunk_size": st.chunk_size, "interval_s": st.interval_s,
                    "max_threads": st.max_threads},
        "scenarios": {sc.name: sc.to_dict() | {"oracle_threads": list(sc.oracle_threads(st.memory)),
                                               "profile_file": f"profiles/{sc.name}.yaml"} for sc in scenarios},
        "policies": _policy_config(labels, scenarios),
        "skipped_policies": skipped,
        "ppo_default": ppo_default_info() if ("ppo" in labels or "ppo" in skipped) else None,
        "rerun": "python -m automdt.experiments " + " ".join(_rerun_args(rd.experiment, st)),
    }
    rd.write_config(cfg | extra)


def _rerun_args(name: str, st: Settings) -> List[str]:
    a = [name, "--seed", str(st.seed)]
    if st.quick:
        a.append("--quick")
    if st.scenarios:
        a += ["--scenarios", ",".join(st.scenarios)]
    if st.policies:
        a += ["--policies", ",".join(st.policies)]
    if st.duration_s:
        a += ["--duration", str(st.duration_s)]
    if st.rate_bps != 80 * MB:
        a += ["--rate", str(st.rate_bps)]
    if st.from_dir:
        a += ["--from", st.from_dir]
    return a


def _header(title: str, rd: RunDir, st: Settings, scenarios: Sequence[Scenario], skipped: Dict[str, str],
            what: str) -> List[str]:
    from automdt.experiments.runner import git_info

    g = git_info()
    lines = [f"# {title}", "", what, "",
             f"- run directory: `{rd.path}`; seed {st.seed}; git `{(g.get('commit') or '?')[:12]}`"
             + (" (working tree modified)" if g.get("dirty") else ""),
             f"- engine options: staging buffer {st.memory >> 20} MiB per side, chunk {st.chunk_size >> 10} KiB, "
             f"control interval {st.interval_s:g} s, at most {st.max_threads} threads per stage"
             + ("; **quick mode** (short runs, fewer policies: a smoke test of the set-up; runs this short "
                "cannot converge, so the checks read n/a; run without --quick for results)" if st.quick else ""),
             "", "| scenario | throttles (per thread / total, bytes/s) | achievable | minimal optimum (r, n, w) | "
             "simulator oracle |", "|---|---|---|---|---|"]
    for sc in scenarios:
        lines.append(f"| {sc.name} | `{sc.throttle_spec()}` | {sc.achievable_bps / MB:.0f} MB/s | "
                     f"{sc.optimum} | {tuple(sc.oracle_threads(st.memory))} |")
    if skipped:
        lines += ["", "Policies not run: " + "; ".join(f"**{k}**: {v}" for k, v in skipped.items())]
    lines.append("")
    return lines


def _own_policies(st: Settings, scenarios: Sequence[Scenario], scratch: Scratch, rd: RunDir,
                  skipped: Dict[str, str]) -> Dict[str, str]:
    """For ``ppo-own``: explore each scenario, train a policy on the fitted profile, return paths.

    A scenario whose exploration or training fails gets no ``ppo-own`` run; the reason goes into
    ``skipped`` (``ppo-own/<scenario>``) and so into ``config.json`` and ``results.md``.
    """
    import shutil

    from automdt.agents.training import profile_settings, train
    from automdt.explore import explore
    from automdt.sender import TransferOptions

    out: Dict[str, str] = {}
    pol_dir = os.path.join(rd.path, "policies")
    os.makedirs(pol_dir, exist_ok=True)
    spec = _fixed_dataset(st, st.own_explore_s)
    ds = spec.generate(scratch.data)
    for sc in scenarios:
        st.log(f"  ppo-own: exploring {sc.name} for {st.own_explore_s:.0f} s")
        dest = os.path.join(scratch.dest, f"explore-{sc.name}")
        opts = TransferOptions(memory=st.memory, chunk_size=st.chunk_size, interval_s=st.interval_s,
                               max_threads=st.max_threads, throttle={k: tuple(v) for k, v in sc.throttle.items()},
                               log_path=rd.log_path(sc.name, "explore"))
        try:
            res = explore(ds.path, dest, st.own_explore_s, opts, seed=st.seed)
        except Exception as e:  # noqa: BLE001 - recorded, the other policies still run
            skipped[f"ppo-own/{sc.name}"] = f"exploration failed: {e}"
            st.log(f"  ppo-own: {sc.name}: exploration failed: {e}")
            continue
        finally:
            shutil.rmtree(dest, ignore_errors=True)
        prof = res["profile"]
        prof.save(os.path.join(rd.path, "profiles", f"{sc.name}-explored.yaml"))
        st.log(f"  ppo-own: training on the explored {sc.name} profile (at most {st.own_train_s:.0f} s)")
        try:
            rep = train(prof, os.path.join(pol_dir, f"{sc.name}-own.zip"), seed=st.seed,
                        target_fraction=st.own_target, max_seconds=st.own_train_s, progress=False,
                        **profile_settings())
        except Exception as e:  # noqa: BLE001
            skipped[f"ppo-own/{sc.name}"] = f"training failed: {e}"
            continue
        st.log(f"  ppo-own: {sc.name}: {rep.timesteps} steps, {rep.wall_s:.0f} s, "
               f"{rep.fraction_of_oracle:.3f} of the oracle ({rep.stop_reason})")
        out[sc.name] = str(rep.model_path)
    rd.update_config(skipped_policies=skipped, own_policies={k: os.path.relpath(v, rd.path) for k, v in out.items()})
    return out


def _run_matrix(st: Settings, rd: RunDir, scratch: Scratch, scenarios: Sequence[Scenario], labels: Sequence[str],
                datasets: Sequence[Dataset], duration_s: Optional[float], own: Dict[str, str]) -> List[RunResult]:
    from automdt.agents.registry import make_policy

    results = []
    for sc in scenarios:
        for ds in datasets:
            for lab in labels:
                pol = None
                if lab == "ppo-own":
                    if sc.name not in own:
                        continue
                    pol = make_policy(f"ppo:{own[sc.name]}", st.max_threads)
                r = run_one(lab, sc, ds, scratch.dest, duration_s=duration_s, memory=st.memory,
                            chunk_size=st.chunk_size, interval_s=st.interval_s, max_threads=st.max_threads,
                            log_path=rd.log_path(sc.name, ds.spec.kind, lab), seed=st.seed, policy=pol)
                m = r.metrics
                conv = m.get("conv_s")
                st.log(f"  {sc.name:11s} {ds.spec.kind:5s} {lab:9s} {r.summary['seconds']:6.1f} s  "
                       f"{(m.get('mean_delivered_bps') or 0) / MB:6.1f} MB/s  conv "
                       f"{'-' if conv is None else f'{conv:.1f}'} s  threads "
                       f"{_triple_cell(r, sc.achievable_bps)}" + (f"  ERROR {r.error}" if r.error else ""))
                results.append(r)
    return results


def _by(results: Sequence[RunResult], scenario: str, policy: str, dataset: Optional[str] = None
        ) -> Optional[RunResult]:
    for r in results:
        if r.scenario == scenario and r.policy == policy and (dataset is None or r.dataset == dataset):
            return r
    return None


def _ppo_labels(results: Sequence[RunResult]) -> List[str]:
    """PPO policies of a run: ``ppo`` (shipped), ``ppo-own``, ``ppo:PATH`` / ``*.zip``, in that order."""
    have = list(dict.fromkeys(r.policy for r in results))
    first = [p for p in ("ppo", "ppo-own") if p in have]
    return first + [p for p in have if p not in first and (p.startswith("ppo:") or p.endswith(".zip"))]


CONV_HOLD = 3
"""Intervals a convergence must hold (:func:`automdt.experiments.metrics.run_metrics`'s ``hold``)."""


def _after(r: RunResult, achievable_bps: float) -> List[Dict[str, Any]]:
    """The interval rows "after convergence", as :func:`~automdt.experiments.metrics.run_metrics`
    takes them: after the convergence interval, else the run's second half (else its last row)."""
    rows = r.rows
    idx = M.convergence_index(rows, achievable_bps, hold=CONV_HOLD)
    start = idx + 1 if idx is not None else len(rows) // 2
    return list(rows[start:] if start < len(rows) else rows[-1:])


def _most_run_triple(r: RunResult, achievable_bps: float) -> Optional[Tuple[int, int, int]]:
    """The (read, net, write) triple that ran the most intervals after convergence (ties: the
    latest), or None without intervals. Unlike per-stage medians it is a triple that ran."""
    from collections import Counter

    triples = [tuple(int(float(row[f"threads_{s}"])) for s in STAGES) for row in _after(r, achievable_bps)]
    if not triples:
        return None
    counts = Counter(triples)
    best = max(counts.values())
    return next(t for t in reversed(triples) if counts[t] == best)  # type: ignore[return-value]


def _triple_cell(r: RunResult, achievable_bps: float) -> str:
    t = _most_run_triple(r, achievable_bps)
    return "-" if t is None else ",".join(str(x) for x in t)


def _conv_cell(r: RunResult, achievable_bps: float) -> str:
    """Seconds to 90% held (``conv_s``); "too short" when the run reached 90% only in its last
    intervals, too few to tell whether it held; "never" when it did not reach 90%."""
    m = r.metrics
    if m.get("converged"):
        return M.fmt(m.get("conv_s"), 2)
    thr = 0.9 * achievable_bps
    n = len(r.rows)
    late = any(float(row["tput_write"]) >= thr for row in r.rows[max(0, n - CONV_HOLD + 1):])
    return "too short" if late else "never"


# ---------------------------------------------------------------------------------------------
# PPO vs Marlin (the figures) for fixed-duration runs
# ---------------------------------------------------------------------------------------------
MIN_CHECK_RUN_S = 10.0
"""Runs shorter than this cannot show 90% within 5 s held for 3 intervals and a settled period
after it: their checks read n/a (quick mode's 3-5 s runs), not FAIL."""


def ppo_vs_marlin(results: Sequence[RunResult], scenarios: Sequence[Scenario], duration: Optional[float] = None
                  ) -> Tuple[List[str], Dict[str, Any]]:
    """Markdown lines and numbers: convergence seconds, throughput ratio, threads, stability, checks
    (n/a for runs shorter than :data:`MIN_CHECK_RUN_S`)."""
    lines: List[str] = ["## PPO vs Marlin", ""]
    nums: Dict[str, Any] = {}
    ppos = _ppo_labels(results)
    if not ppos or not any(r.policy == "marlin" for r in results):
        lines += ["Not available: this run has no " + ("PPO" if not ppos else "Marlin") + " transfers.", ""]
        return lines, nums
    head = ["scenario", "policy", "conv s", "Marlin conv s", "conv speed-up (Marlin/PPO)",
            "throughput ratio (PPO/Marlin)", "mean threads r,n,w (PPO)", "mean threads r,n,w (Marlin)",
            "total threads PPO / Marlin", "thread std after conv PPO / Marlin"]
    rows = []
    checks = []
    for sc in scenarios:
        mar = _by(results, sc.name, "marlin")
        for p in ppos:
            pr = _by(results, sc.name, p)
            if pr is None or mar is None:
                continue
            a, b = pr.metrics, mar.metrics
            conv_ratio = M.ratio(b.get("conv_s"), a.get("conv_s"))
            tput_ratio = M.ratio(a.get("mean_delivered_bps"), b.get("mean_delivered_bps"))
            nums[f"{sc.name}/{p}"] = {"ppo_conv_s": a.get("conv_s"), "marlin_conv_s": b.get("conv_s"),
                                      "conv_speedup": conv_ratio, "throughput_ratio": tput_ratio,
                                      "ppo_total_threads": a.get("mean_total_threads"),
                                      "marlin_total_threads": b.get("mean_total_threads"),
                                      "ppo_std_sum": a.get("after_std_sum"), "marlin_std_sum": b.get("after_std_sum")}
            rows.append([sc.name, p, _conv_cell(pr, sc.achievable_bps), _conv_cell(mar, sc.achievable_bps),
                         M.fmt(conv_ratio, 2) if conv_ratio else ("PPO only" if a.get("converged") else "-"),
                         M.fmt(tput_ratio, 2),
                         ",".join(f"{a.get(f'mean_threads_{s}', 0):.1f}" for s in ("read", "net", "write")),
                         ",".join(f"{b.get(f'mean_threads_{s}', 0):.1f}" for s in ("read", "net", "write")),
                         f"{a.get('mean_total_threads', 0):.1f} / {b.get('mean_total_threads', 0):.1f}",
                         f"{a.get('after_std_sum', 0):.2f} / {b.get('after_std_sum', 0):.2f}"])
            nb, no = sc.min_bottleneck_threads, max(v for k, v in sc.min_threads.items() if k != sc.bottleneck)
            conv = a.get("conv_s")
            med_b = a.get(f"after_median_{sc.bottleneck}")
            most = _most_run_triple(pr, sc.achievable_bps)
            checks += [
                # "within 5 s" on the controller's 1 s grid: reached by the end of the 5th interval (which ends
                # a few tens of ms after 5.00 s: the loop ticks every 20 ms)
                (f"{sc.name}/{p}: 90% of {sc.achievable_bps / MB:.0f} MB/s within 5 s (by the end of the 5th interval)",
                 conv is not None and conv <= 5.0 + CONV_TICK_SLACK_S, f"conv {M.fmt(conv, 2)} s"),
                (f"{sc.name}/{p}: {sc.bottleneck} threads within one of {nb} after convergence",
                 a.get("converged") and med_b is not None and abs(med_b - nb) <= 1,
                 f"median {M.fmt(med_b, 1)}, most run {most[STAGES.index(sc.bottleneck)] if most else '-'}, "
                 f"{100 * (a.get('bottleneck_within1_frac') or 0):.0f}% of intervals within one"),
                (f"{sc.name}/{p}: other stages low (median <= {2 * no}, twice their minimum {no})",
                 (a.get("others_after_median_max") or 99) <= 2 * no, f"largest median {M.fmt(a.get('others_after_median_max'), 1)}"),
                (f"{sc.name}/{p}: thread counts vary less than Marlin's after convergence",
                 (a.get("after_std_sum") or 0) < (b.get("after_std_sum") or 0),
                 f"sum of per-stage std {a.get('after_std_sum', 0):.2f} vs {b.get('after_std_sum', 0):.2f}"),
            ]
    lines.append(M.md_table(head, rows))
    lines += ["", "The papers report 7 s (AutoMDT) against 62 s (Marlin) to converge and 1.23-1.33x Marlin's "
              "throughput. Throughput ratio = mean delivered throughput over the whole run (ramp included).", "",
              "### The issue's checks (one run per scenario)", ""]
    if duration is not None and duration < MIN_CHECK_RUN_S:
        why = (f"runs of {duration:g} s are too short to converge and settle; the checks need at least "
               f"{MIN_CHECK_RUN_S:g} s (run without --quick)")
        lines += [f"**Not checked:** {why}.", ""]
        checks = [(t, None, f"{d}; {duration:g} s runs") for t, _, d in checks]
    else:
        checks = [(t, bool(ok), d) for t, ok, d in checks]
    lines += [_check_line(t, ok, d) for t, ok, d in checks]
    lines.append("")
    nums["checks"] = [{"check": t, "pass": ok, "detail": d} for t, ok, d in checks]
    return lines, nums


# ---------------------------------------------------------------------------------------------
# bottlenecks
# ---------------------------------------------------------------------------------------------
def bottlenecks(st: Settings) -> Experiment:
    """Every policy on every bottleneck scenario for a fixed time."""
    if st.from_dir:
        return _from_dir("bottlenecks", st)
    duration = st.duration_s or (3.0 if st.quick else 15.0)
    scenarios = _scenarios(st, ("read-bound", "net-bound", "write-bound"))
    labels, skipped = _policies(st, ALL_POLICIES, ("ppo", "marlin", "oracle"), scenarios[0])
    rd, results = _fixed_time_runs("bottlenecks", st, scenarios, labels, skipped, duration)
    return _write_timeseries_experiment("bottlenecks", st, rd, scenarios, labels, skipped, results, duration)


def _fixed_time_runs(name: str, st: Settings, scenarios: Sequence[Scenario], labels: Sequence[str],
                     skipped: Dict[str, str], duration: float) -> Tuple[RunDir, List[RunResult]]:
    """Every policy on every scenario for ``duration`` seconds of one generated dataset (and the
    ``ppo-own`` policies explored and trained first when asked for); the run directory and results."""
    rd = RunDir(st.out, name)
    st.log(f"[{name}] {rd.path}: {len(scenarios)} scenarios x {len(labels)} policies x {duration:g} s")
    spec = _fixed_dataset(st, duration)
    with Scratch(st.data_dir, st.keep_data) as scratch:
        ds = spec.generate(scratch.data)
        _base_config(st, scenarios, labels, skipped,
                     {"duration_s": duration, "dataset": ds.to_dict(), "policies": _policy_config(labels, scenarios, [ds])},
                     rd)
        own = _own_policies(st, scenarios, scratch, rd, skipped) if "ppo-own" in labels else {}
        results = _run_matrix(st, rd, scratch, scenarios, labels, [ds], duration, own)
    return rd, results


def _write_timeseries_experiment(name: str, st: Settings, rd: RunDir, scenarios: Sequence[Scenario],
                                 labels: Sequence[str], skipped: Dict[str, str], results: Sequence[RunResult],
                                 duration: float) -> Experiment:
    rd.write_csv("intervals.csv", interval_rows(results))
    rd.write_csv("runs.csv", [r.table_row() for r in results])
    what = {"bottlenecks": f"Every policy on each bottleneck scenario for {duration:g} s (real engine, local link, "
                           "engine throttles). Throughput = delivered (write-stage) bytes per second.",
            "convergence": f"The tuning policies on each scenario for {duration:g} s: time to reach and hold 90% of "
                           "the achievable throughput, and how still the thread counts are after it."}[name]
    lines = _header(name.capitalize(), rd, st, scenarios, skipped, what)
    for sc in scenarios:
        runs = [r for r in results if r.scenario == sc.name]
        if not runs:
            continue
        png = f"{name}-{sc.name}.png"
        plots.timeseries_grid(rd.file(png), f"{sc.name}: {sc.description}", runs, sc.achievable_bps, sc.optimum)
        lines += [f"## {sc.name}", "", f"![{sc.name}]({png})", ""]
        head = ["policy", "delivered MB/s (mean)", "% of achievable", "conv s (90%)", "threads after conv (most run r,n,w)",
                "mean total threads", "thread std after conv (r,n,w)", "spread (r,n,w)", "changes",
                f"{sc.bottleneck} within 1 of {sc.min_bottleneck_threads}", "CPU %"]
        rows = []
        for r in runs:
            m = r.metrics
            rows.append([r.policy, M.mb(m.get("mean_delivered_bps")), M.fmt(100 * (m.get("mean_delivered_frac") or 0), 0),
                         _conv_cell(r, sc.achievable_bps), _triple_cell(r, sc.achievable_bps),
                         M.fmt(m.get("mean_total_threads"), 1),
                         ",".join(M.fmt(m.get(f"after_std_{s}"), 1) for s in ("read", "net", "write")),
                         ",".join(M.fmt(m.get(f"after_spread_{s}"), 0) for s in ("read", "net", "write")),
                         M.fmt(m.get("after_changes"), 0), M.fmt(100 * (m.get("bottleneck_within1_frac") or 0), 0) + "%",
                         M.fmt(100 * r.cpu_s / r.wall_s if r.wall_s else None, 0)])
        lines += [M.md_table(head, rows), ""]
    panels = [{"title": sc.name, "achievable_bps": sc.achievable_bps, "runs": [r for r in results if r.scenario == sc.name]}
              for sc in scenarios]
    plots.delivered_overlay(rd.file(f"{name}-delivered.png"), panels)
    lines += [f"![delivered throughput]({name}-delivered.png)", ""]
    if name == "convergence":
        groups = [sc.name for sc in scenarios]
        series = {lab: [(_by(results, g, lab).metrics.get("conv_s") if _by(results, g, lab) else None) for g in groups]
                  for lab in labels}
        plots.grouped_bars(rd.file("convergence-seconds.png"), "seconds to 90% of the achievable (missing: never)",
                           groups, series, "seconds", hline=5.0)
        lines += ["![convergence seconds](convergence-seconds.png)", ""]
    pv, nums = ppo_vs_marlin(results, scenarios, duration)
    lines += pv
    lines += ["Definitions: *conv s* = end of the first interval whose delivered throughput is >= 90% of the "
              "achievable and whose mean over the next 3 intervals is too (seconds since the controller started); "
              "*too short* = it reached 90% only in the run's last intervals, too few to tell whether it held; "
              "*after conv* = the intervals after it (the second half of the run when it never converged); "
              "*most run* = the (read, net, write) triple that ran the most of those intervals (the latest of "
              "equals): a triple the policy really ran, where per-stage medians of two counts are a midpoint; "
              "*changes* = intervals after which the triple changed; *CPU %* = process CPU seconds (sender and "
              "embedded receiver) over wall seconds, in % of one core.", ""]
    rd.write_text("results.md", "\n".join(lines))
    st.log(f"[{name}] wrote {rd.path}/results.md")
    return Experiment(name, rd.path, list(results), skipped, {"ppo_vs_marlin": nums})


# ---------------------------------------------------------------------------------------------
# convergence
# ---------------------------------------------------------------------------------------------
def convergence(st: Settings) -> Experiment:
    """Seconds to 90% of the achievable throughput and stability after it, for the tuning policies."""
    if st.from_dir:
        return _from_dir("convergence", st)
    duration = st.duration_s or (5.0 if st.quick else 20.0)
    scenarios = _scenarios(st, ("read-bound",))
    labels, skipped = _policies(st, TUNERS, ("ppo", "marlin", "falcon"), scenarios[0])
    rd, results = _fixed_time_runs("convergence", st, scenarios, labels, skipped, duration)
    return _write_timeseries_experiment("convergence", st, rd, scenarios, labels, skipped, results, duration)


def load_runs(path: str, rate_bps: float = 80 * MB, max_threads: int = 32
              ) -> Tuple[List[RunResult], List[Scenario], Dict[str, Any]]:
    """Read a run directory back (``intervals.csv``, ``runs.csv``, ``config.json``); metrics recomputed."""
    import json

    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    scs: List[Scenario] = []
    for name, d in cfg.get("scenarios", {}).items():
        thr = {s: tuple(v) for s, v in d["throttle"].items()}
        scs.append(Scenario(name, d["bottleneck"], thr, d.get("description", ""), int(d.get("max_threads", max_threads))))
    by_sc = {s.name: s for s in scs}
    ivs = read_csv(os.path.join(path, "intervals.csv"))
    runs = read_csv(os.path.join(path, "runs.csv"))
    out = []
    for r in runs:
        key = (r["scenario"], r["policy"], r["dataset"])
        rows = [x for x in ivs if (x["scenario"], x["policy"], x["dataset"]) == key]
        sc = by_sc[r["scenario"]]
        met = M.run_metrics(rows, sc.achievable_bps, sc.bottleneck, sc.min_threads)
        summary = {"seconds": r.get("seconds") or 0.0, "bytes": r.get("bytes"), "exit_code": r.get("exit_code")}
        out.append(RunResult(scenario=r["scenario"], policy=r["policy"], dataset=r["dataset"], rows=rows,
                             summary=summary, metrics=met, wall_s=r.get("wall_s") or 0.0, cpu_s=r.get("cpu_s") or 0.0,
                             completed=bool(r.get("completed")), error=r.get("error") or None))
    return out, scs, cfg


def _from_dir(name: str, st: Settings) -> Experiment:
    results, scenarios, cfg = load_runs(st.from_dir)  # type: ignore[arg-type]
    if st.scenarios:
        scenarios = [s for s in scenarios if s.name in st.scenarios]
    labels = list(dict.fromkeys(r.policy for r in results))
    if st.policies:
        labels = [p for p in labels if p in st.policies]
    elif name == "convergence":
        labels = [p for p in labels if p in TUNERS or p.startswith("ppo")]
    results = [r for r in results if r.policy in labels and r.scenario in {s.name for s in scenarios}]
    rd = RunDir(st.out, name)
    skipped = cfg.get("skipped_policies", {})
    duration = float(cfg.get("duration_s") or 0)
    st.log(f"[{name}] recomputed from {st.from_dir} into {rd.path}")
    st2 = Settings(**{**st.__dict__, "seed": int(cfg.get("seed", st.seed))})
    _base_config(st2, scenarios, labels, skipped, {"from": os.path.abspath(st.from_dir), "from_config": cfg,
                                                   "duration_s": duration}, rd)
    if name in ("convergence", "bottlenecks"):
        return _write_timeseries_experiment(name, st2, rd, scenarios, labels, skipped, results, duration)
    if name == "completion":
        rd.write_csv("intervals.csv", interval_rows(results))
        rd.write_csv("runs.csv", [r.table_row() for r in results])
        return _write_completion(st2, rd, scenarios, labels, skipped, results, cfg["datasets"])
    return _write_cost(st2, rd, scenarios, labels, skipped, results, duration)


# ---------------------------------------------------------------------------------------------
# completion
# ---------------------------------------------------------------------------------------------
def completion(st: Settings) -> Experiment:
    """Completion time of a large-file and a mixed-size dataset for every policy and scenario."""
    if st.from_dir:
        return _from_dir("completion", st)
    scenarios = _scenarios(st, ("write-bound",))
    labels, skipped = _policies(st, ALL_POLICIES, ("ppo", "marlin", "globus", "oracle"), scenarios[0])
    # ~6 s at the achievable rate each (quick: ~1.5 s); the mix is the slides' shape (scenarios.py).
    secs = st.duration_s or (1.5 if st.quick else 6.0)
    total = int(st.rate_bps * secs)
    specs = [large_dataset(total, n_files=2 if st.quick else 4, seed=st.seed),
             mixed_dataset(total, n_files=40 if st.quick else 100, seed=st.seed)]
    rd = RunDir(st.out, "completion")
    st.log(f"[completion] {rd.path}: {len(scenarios)} scenarios x {len(labels)} policies x 2 datasets of "
           f"{total / MB:.0f} MB")
    with Scratch(st.data_dir, st.keep_data) as scratch:
        dss = [s.generate(scratch.data) for s in specs]
        datasets = [d.to_dict() for d in dss]
        _base_config(st, scenarios, labels, skipped,
                     {"datasets": datasets, "policies": _policy_config(labels, scenarios, dss),
                      "seconds_at_achievable": secs}, rd)
        own = _own_policies(st, scenarios, scratch, rd, skipped) if "ppo-own" in labels else {}
        results = _run_matrix(st, rd, scratch, scenarios, labels, dss, None, own)
    rd.write_csv("intervals.csv", interval_rows(results))
    rd.write_csv("runs.csv", [r.table_row() for r in results])
    return _write_completion(st, rd, scenarios, labels, skipped, results, datasets)


def _check_line(text: str, ok: Optional[bool], detail: str) -> str:
    """A checklist line: ``ok`` True/False, or None for a check that does not apply."""
    if ok is None:
        return f"- [-] {text}: n/a ({detail})"
    return f"- [{'x' if ok else ' '}] {text}: {'PASS' if ok else 'FAIL'} ({detail})"


def _write_completion(st: Settings, rd: RunDir, scenarios: Sequence[Scenario], labels: Sequence[str],
                      skipped: Dict[str, str], results: Sequence[RunResult], datasets: Sequence[Dict[str, Any]]
                      ) -> Experiment:
    """Tables, plot and checks of a completion run (``datasets``: the ``config.json`` entries)."""
    dsl = [{"name": d["spec"]["name"], "kind": d["spec"]["kind"], "files": int(d["files"]),
            "total": int(d["total_bytes"]), "classes": (d.get("info") or {}).get("classes", {})} for d in datasets]
    large = next(d for d in dsl if d["kind"] == "large")
    mixed = next(d for d in dsl if d["kind"] == "mixed")
    lines = _header("Completion time", rd, st, scenarios, skipped,
                    f"Each policy copies a large-file dataset ({large['files']} x {large['total'] / large['files'] / MB:.0f} MB) "
                    f"and a mixed-size dataset ({mixed['files']} files, the slides' mix scaled to {mixed['total'] / MB:.0f} MB; "
                    "see `config.json`) from scratch; completion time = the transfer's wall time (scan, handshake and "
                    "ramp included).")
    lines += ["Mixed dataset classes: " + "; ".join(f"{k}: {v['files']} files, {v['bytes'] / MB:.1f} MB"
                                                     for k, v in mixed["classes"].items()), ""]
    head = ["scenario", "dataset", "policy", "seconds", "MB/s", "x ideal time", "mean threads r,n,w", "mean total threads",
            "completed"]
    rows = []
    groups, series = [], {lab: [] for lab in labels}
    for sc in scenarios:
        for d in dsl:
            ideal = d["total"] / sc.achievable_bps
            groups.append(f"{sc.name}\n{d['kind']}")
            for lab in labels:
                r = _by(results, sc.name, lab, d["name"])
                series[lab].append(r.summary["seconds"] if r else None)
                if r is None:
                    continue
                secs_r = r.summary["seconds"]
                rows.append([sc.name, d["kind"], lab, M.fmt(secs_r, 2), M.mb(d["total"] / secs_r if secs_r else None),
                             M.fmt(secs_r / ideal, 2),
                             ",".join(M.fmt(r.metrics.get(f"mean_threads_{s}"), 1) for s in ("read", "net", "write")),
                             M.fmt(r.metrics.get("mean_total_threads"), 1), r.completed])
    plots.grouped_bars(rd.file("completion-seconds.png"), "completion time (lower is better)", groups, series, "seconds")
    lines += ["![completion](completion-seconds.png)", "", M.md_table(head, rows), ""]
    ratio_lines, nums = _completion_ratios(st, scenarios, dsl, results)
    lines += ratio_lines
    rd.write_text("results.md", "\n".join(lines))
    st.log(f"[completion] wrote {rd.path}/results.md")
    return Experiment("completion", rd.path, list(results), skipped,
                      {"ratios": nums, "kinds": {d["name"]: d["kind"] for d in dsl}})


def _completion_ratios(st: Settings, scenarios: Sequence[Scenario], dsl: Sequence[Dict[str, Any]],
                       results: Sequence[RunResult]) -> Tuple[List[str], Dict[str, Any]]:
    """The completion run's section comparing each PPO policy with Marlin and Globus-like, with
    the checks; returns its lines and the figures (with ``checks``) for the experiment's summary."""
    lines = ["## PPO vs Marlin and Globus-like", ""]
    nums: Dict[str, Any] = {}
    ppos = _ppo_labels(results)
    checks: List[Tuple[str, Optional[bool], str]] = []
    if not ppos:
        lines += ["Not available: this run has no PPO transfers.", ""]
    else:
        head = ["scenario", "dataset", "policy", "PPO s", "Marlin s", "Marlin/PPO", "Globus s", "Globus/PPO",
                "threads PPO / Marlin / Globus"]
        rws = []
        for sc in scenarios:
            gl_opt = _globus_is_optimal(sc, st)
            for d in dsl:
                mar = _by(results, sc.name, "marlin", d["name"])
                glo = _by(results, sc.name, "globus", d["name"])
                for p in ppos:
                    pr = _by(results, sc.name, p, d["name"])
                    if pr is None:
                        continue
                    ps = pr.summary["seconds"]
                    ms = mar.summary["seconds"] if mar else None
                    gs = glo.summary["seconds"] if glo else None
                    rm, rg = M.ratio(ms, ps), M.ratio(gs, ps)
                    tp = pr.metrics.get("mean_total_threads")
                    tm = mar.metrics.get("mean_total_threads") if mar else None
                    tg = glo.metrics.get("mean_total_threads") if glo else None
                    tag = f"{sc.name}/{d['kind']}/{p}"
                    nums[tag] = {"ppo_s": ps, "marlin_s": ms, "globus_s": gs, "marlin_over_ppo": rm,
                                 "globus_over_ppo": rg, "threads": [tp, tm, tg]}
                    rws.append([sc.name, d["kind"], p, M.fmt(ps, 2), M.fmt(ms, 2), M.fmt(rm, 2), M.fmt(gs, 2),
                                M.fmt(rg, 2), f"{M.fmt(tp, 1)} / {M.fmt(tm, 1)} / {M.fmt(tg, 1)}"])
                    if mar:
                        checks.append((f"{tag}: >= 1.2x faster than Marlin", (rm or 0) >= 1.2, f"{M.fmt(rm, 2)}x"))
                    if glo:
                        if gl_opt:
                            checks.append((f"{tag}: faster than Globus-like (4,32,4), which already reaches the "
                                           "achievable rate on this path", None, f"{M.fmt(rg, 2)}x"))
                        else:
                            checks.append((f"{tag}: faster than Globus-like", (rg or 0) > 1.0, f"{M.fmt(rg, 2)}x"))
                    if mar and glo:
                        checks.append((f"{tag}: fewer total threads than Marlin and Globus-like",
                                       tp is not None and tm is not None and tg is not None and tp < tm and tp < tg,
                                       f"{M.fmt(tp, 1)} vs {M.fmt(tm, 1)} and {M.fmt(tg, 1)}"))
        lines += [M.md_table(head, rws), "", "The slides report AutoMDT finishing 1.33x (large files) and 1.23x (mixed) "
                  "faster than Marlin on a 1 TB dataset; these datasets last seconds, so the ramp-up weighs more.", "",
                  "### The issue's checks", ""]
        lines += [_check_line(t, ok, dd) for t, ok, dd in checks]
        lines.append("")
        nums["checks"] = [{"check": t, "pass": ok, "detail": dd} for t, ok, dd in checks]
    return lines, nums


def _globus_is_optimal(sc: Scenario, st: Settings) -> bool:
    from automdt.agents.static import GLOBUS_CONCURRENCY as cc, GLOBUS_PARALLELISM as p

    prof = sc.profile(st.memory)
    t = tuple(min(x, sc.max_threads) for x in (cc, cc * p, cc))
    return prof.steady_throughput(t) >= sc.achievable_bps * 0.999


# ---------------------------------------------------------------------------------------------
# cost
# ---------------------------------------------------------------------------------------------
def cost(st: Settings) -> Experiment:
    """CPU and threads per policy (fixed-length runs on the scenarios)."""
    if st.from_dir:
        return _from_dir("cost", st)
    duration = st.duration_s or (3.0 if st.quick else 10.0)
    scenarios = _scenarios(st, ("read-bound",))
    labels, skipped = _policies(st, ALL_POLICIES, ("oracle", "globus", "marlin"), scenarios[0])
    rd, results = _fixed_time_runs("cost", st, scenarios, labels, skipped, duration)
    rd.write_csv("intervals.csv", interval_rows(results))
    rd.write_csv("runs.csv", [r.table_row() for r in results])
    return _write_cost(st, rd, scenarios, labels, skipped, results, duration)


def _write_cost(st: Settings, rd: RunDir, scenarios: Sequence[Scenario], labels: Sequence[str],
                skipped: Dict[str, str], results: Sequence[RunResult], duration: float) -> Experiment:
    if not os.path.exists(rd.file("runs.csv")):
        rd.write_csv("intervals.csv", interval_rows(results))
        rd.write_csv("runs.csv", [r.table_row() for r in results])
    lines = _header("CPU cost and threads", rd, st, scenarios, skipped,
                    f"Fixed-length runs ({duration:g} s). *CPU %*: process CPU seconds (sender and the embedded "
                    "receiver: both ends) over wall seconds, % of one core; *CPU s/GB*: CPU seconds per GB "
                    "delivered; *thread-s/GB*: the sum over intervals of read+net+write threads x interval length, "
                    "per GB delivered. The machine is shared: differences under ~30% are noise.")
    head = ["scenario", "policy", "delivered MB/s", "CPU %", "CPU s/GB", "mean threads r,n,w", "mean total threads",
            "thread-s/GB"]
    rows = []
    groups = [sc.name for sc in scenarios]
    cpu_series: Dict[str, List[Optional[float]]] = {lab: [] for lab in labels}
    thr_series: Dict[str, List[Optional[float]]] = {lab: [] for lab in labels}
    per_policy: Dict[str, Dict[str, List[float]]] = {}
    for sc in scenarios:
        for lab in labels:
            r = _by(results, sc.name, lab)
            if r is None:
                cpu_series[lab].append(None)
                thr_series[lab].append(None)
                continue
            delivered = sum(float(x.get("bytes_write") or 0) for x in r.rows) or float(r.summary.get("bytes") or 0)
            gb = delivered / 1e9
            cpu_pct = 100.0 * r.cpu_s / r.wall_s if r.wall_s else None
            tsec = sum((float(x["threads_read"]) + float(x["threads_net"]) + float(x["threads_write"]))
                       * float(x.get("interval_s") or st.interval_s) for x in r.rows)
            cpu_series[lab].append(cpu_pct)
            thr_series[lab].append(r.metrics.get("mean_total_threads"))
            pp = per_policy.setdefault(lab, {"cpu_pct": [], "threads": [], "cpu_s_per_gb": []})
            if cpu_pct is not None:
                pp["cpu_pct"].append(cpu_pct)
            pp["threads"].append(r.metrics.get("mean_total_threads") or 0.0)
            if gb > 0:
                pp["cpu_s_per_gb"].append(r.cpu_s / gb)
            rows.append([sc.name, lab, M.mb(r.metrics.get("mean_delivered_bps")), M.fmt(cpu_pct, 0),
                         M.fmt(r.cpu_s / gb if gb > 0 else None, 1),
                         ",".join(M.fmt(r.metrics.get(f"mean_threads_{s}"), 1) for s in ("read", "net", "write")),
                         M.fmt(r.metrics.get("mean_total_threads"), 1), M.fmt(tsec / gb if gb > 0 else None, 0)])
    plots.grouped_bars(rd.file("cost-cpu.png"), "CPU (% of one core, both ends)", groups, cpu_series, "CPU %")
    plots.grouped_bars(rd.file("cost-threads.png"), "mean total threads (read + net + write)", groups, thr_series,
                       "threads")
    lines += [M.md_table(head, rows), "", "![cpu](cost-cpu.png)", "", "![threads](cost-threads.png)", "",
              "## Per policy (mean over scenarios)", ""]
    agg = []
    for lab, d in per_policy.items():
        mean = lambda v: sum(v) / len(v) if v else None  # noqa: E731
        agg.append([lab, M.fmt(mean(d["cpu_pct"]), 0), M.fmt(mean(d["cpu_s_per_gb"]), 1), M.fmt(mean(d["threads"]), 1)])
    lines += [M.md_table(["policy", "CPU %", "CPU s/GB", "mean total threads"], agg), ""]
    rd.write_text("results.md", "\n".join(lines))
    st.log(f"[cost] wrote {rd.path}/results.md")
    return Experiment("cost", rd.path, list(results), skipped, {"per_policy": per_policy})


# ---------------------------------------------------------------------------------------------
# fairness
# ---------------------------------------------------------------------------------------------
def fairness(st: Settings) -> Experiment:
    from automdt.experiments.fairness import run_fairness

    return run_fairness(st)


def real(st: Settings) -> Experiment:
    from automdt.experiments.real import run_real

    return run_real(st)


def changing(st: Settings) -> Experiment:
    from automdt.experiments.changing import run_changing

    return run_changing(st)


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------
def _csv_list(s: str) -> List[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _policy_list(s: str) -> List[str]:
    """Comma list of policy labels; ``static:R,N,W`` keeps its own commas."""
    out: List[str] = []
    for tok in (x.strip() for x in s.split(",")):
        if not tok:
            continue
        if tok.isdigit() and out and out[-1].lower().startswith("static:") and out[-1].count(",") < 2:
            out[-1] += "," + tok
        else:
            out.append(tok)
    return out


def _size(s: str) -> int:
    from automdt.units import parse_size

    try:
        v = int(parse_size(s))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if v < 4096:
        raise argparse.ArgumentTypeError(f"bad size {s!r}: must be at least 4Ki")
    return v


def build_parser() -> argparse.ArgumentParser:
    from automdt import cli_args as A

    p = A.Parser(prog="python -m automdt.experiments", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Experiments: " + ", ".join(EXPERIMENTS) + ", all. Policies: "
                                       + ", ".join(ALL_POLICIES) + ", ppo-own (explore + train per scenario), "
                                       "or any registry spec (static:R,N,W, ppo:PATH).")
    p.add_argument("experiment", choices=[*EXPERIMENTS, "all"])
    p.add_argument("--out", default="runs", help="parent directory of the run directories (default runs)")
    p.add_argument("--seed", type=A.integer(0), default=0, help="seed of datasets and policies (default 0)")
    p.add_argument("--quick", action="store_true", help="short runs and fewer policies (well under a minute)")
    p.add_argument("--scenarios", type=_csv_list, help="comma list: read-bound,net-bound,write-bound (real: net-rtt20,net-rtt80,disk,cpu; changing: moving-bottleneck,link-halves,competing-transfer,schedule)")
    p.add_argument("--policies", type=_policy_list, help="comma list of policy labels (default: the experiment's)")
    p.add_argument("--duration", type=A.seconds(), help="seconds per transfer (completion: seconds of data at the "
                   "achievable rate per dataset)")
    p.add_argument("--rate", type=A.number(0.0, lo_open=True, what="a rate in bytes/s"), default=80 * MB, help="bottleneck rate in bytes/s (default 80e6)")
    p.add_argument("--memory", type=_size, default=DEFAULT_MEMORY, help="staging buffer per side (default 128Mi)")
    p.add_argument("--chunk-size", type=_size, default=DEFAULT_CHUNK, help="chunk size (default 1Mi)")
    p.add_argument("--interval", type=A.seconds(0.1, lo_open=False, hi=3600), default=DEFAULT_INTERVAL_S, help="control interval, s (default 1)")
    p.add_argument("--max-threads", type=A.integer(1, 1024), default=32, help="per-stage thread cap (default 32)")
    p.add_argument("--data-dir", help="keep and re-use generated datasets here (default: a temp dir in /dev/shm, "
                   "removed at the end)")
    p.add_argument("--keep-data", action="store_true", help="do not remove the generated datasets")
    p.add_argument("--from", dest="from_dir", help="bottlenecks/convergence/completion/cost/real/changing: recompute the tables and plots "
                   "from an earlier run directory (no transfers)")
    p.add_argument("--own-explore", type=A.seconds(), default=20.0, help="ppo-own: exploration seconds per scenario")
    p.add_argument("--own-train", type=A.seconds(), default=180.0, help="ppo-own: training wall-time budget per scenario")
    p.add_argument("--own-target", type=A.number(0.0, 1.0, lo_open=True, what="a fraction"), default=0.98,
                   help="ppo-own: stop training at this fraction of the fitted profile's oracle (default 0.98; "
                   "`automdt train` stops at 0.95, where a few surplus threads still cost little)")
    p.add_argument("--real-explore", type=float, default=60.0,
                   help="real, changing: seconds of `automdt explore` on each path (for ppo-own and the "
                   "sim-to-real report; default 60: a real path's connections and disks need longer than the "
                   "throttled scenarios' 20)")
    p.add_argument("--drop-caches", choices=["file", "all"], default="file",
                   help="real: how the disk path evicts its dataset before every copy: file (posix_fadvise "
                   "DONTNEED on each file, the default: nothing else on the machine is affected) or all "
                   "(echo 3 > /proc/sys/vm/drop_caches, as root: for a quiet machine)")
    p.add_argument("--throttle", metavar="@FILE", help="changing: add the scenario 'schedule', loopback with this "
                   "throttle schedule (a YAML list of {at: SECONDS, throttle: SPEC}, as `automdt transfer "
                   "--throttle @FILE` takes it)")
    return p


EXPERIMENT_HELP = {
    "bottlenecks": "Every policy on the read-, network- and write-bound scenarios (real engine, local link, "
                   "engine throttles) for 15 s each (--quick: 3 s, policies ppo, marlin, oracle). Writes per-scenario "
                   "time series plots, a delivered-throughput overlay, intervals.csv, runs.csv and results.md with "
                   "the PPO-vs-Marlin checks (90% within 5 s, bottleneck threads, stability; n/a for runs under "
                   f"{MIN_CHECK_RUN_S:g} s).",
    "convergence": "The tuning policies (" + ", ".join(TUNERS) + ") on the read-bound scenario for 20 s each "
                   "(--quick: 5 s; ppo, marlin, falcon): seconds to 90% of the achievable throughput and how still "
                   "the thread counts are afterwards. Same outputs as bottlenecks plus convergence-seconds.png.",
    "completion": "Completion time of a large-file and a mixed-size dataset (about 6 s of data at the achievable "
                  "rate each; --quick: 1.5 s; --duration sets the seconds of data) on the write-bound scenario, "
                  "for every policy (--quick: ppo, marlin, globus, oracle), with the speed-up checks against "
                  "Marlin and the Globus-like setting.",
    "fairness": "Two transfers of one policy sharing a tc-limited veth link between two network namespaces "
                "(needs root; skipped with the reason otherwise): a 40 s window (--quick: 10 s), the second "
                "transfer joining at a quarter of it; Jain's index, link utilisation and loss.",
    "cost": "CPU seconds and threads per policy on the read-bound scenario, 10 s runs (--quick: 3 s; oracle, "
            "globus, marlin).",
    "real": "Every policy on paths the engine does not throttle: a delayed link (20 and 80 ms RTT, the project's "
            "delay forwarder), the real disk, a CPU quota; each beside an empirical grid of static triples.",
    "changing": "Every policy on paths that change during the transfer: a moving bottleneck, a link that halves, a "
                "competing transfer, or a throttle schedule of one's own (--throttle @FILE).",
    "all": "bottlenecks, then convergence and cost computed from its runs (--from), completion and fairness.",
}


def experiment_help(name: str) -> str:
    """``python -m automdt.experiments NAME --help``: what NAME runs, then the options."""
    p = build_parser()
    p.prog = f"python -m automdt.experiments {name}"
    p.usage = f"{p.prog} [options]"
    p.description = EXPERIMENT_HELP.get(name, "")
    p.epilog = ("Outputs go to OUT/" + (name if name != "all" else "<experiment>") + "-<time>/ (config.json has "
                "the command that re-runs it). " + (p.epilog or ""))
    return p.format_help()


def settings_from_args(a: argparse.Namespace) -> Settings:
    return Settings(out=a.out, seed=a.seed, quick=a.quick, scenarios=a.scenarios, policies=a.policies,
                    duration_s=a.duration, rate_bps=a.rate, memory=a.memory, chunk_size=a.chunk_size,
                    interval_s=a.interval, max_threads=a.max_threads, data_dir=a.data_dir, keep_data=a.keep_data,
                    from_dir=a.from_dir, own_explore_s=a.own_explore, own_train_s=a.own_train,
                    own_target=a.own_target, drop_caches=a.drop_caches, throttle=a.throttle,
                    real_explore_s=a.real_explore)


RUNNERS: Dict[str, Callable[[Settings], Experiment]] = {
    "bottlenecks": bottlenecks, "convergence": convergence, "completion": completion, "fairness": fairness,
    "cost": cost, "real": real, "changing": changing,
}


def run_all(st: Settings) -> List[Experiment]:
    out = [bottlenecks(st)]
    st_from = Settings(**{**st.__dict__, "from_dir": out[0].path})
    out.append(convergence(st_from))
    out.append(cost(st_from))
    out.append(completion(st))
    out.append(fairness(st))
    return out


ENGINE_EXPERIMENTS = {
    "bottlenecks": "every policy on read-, network- and write-bound scenarios",
    "convergence": "seconds to 90% of the achievable rate, and how still the counts stay",
    "completion": "completion time of a large-file and a mixed-size dataset",
    "fairness": "two transfers of one policy sharing a rate-limited link (root)",
    "cost": "CPU seconds and threads per policy",
    "real": "paths the engine does not throttle: delayed links, the real disk, a CPU quota",
    "changing": "paths that change during the transfer",
    "all": "bottlenecks, convergence, cost, completion and fairness",
}
"""One line each for ``--help`` of :data:`RUNNERS` and ``all`` (``NAME --help`` says more)."""

MODULE_EXPERIMENTS: Dict[str, Tuple[str, bool, str]] = {
    "ablation": ("ablation", False, "every controller on held-out families of simulated paths and on engine paths"),
    "ablation-engine": ("ablation_engine", False, "the engine half of the ablation alone (--trained: the operator's "
                        "workflow on every engine path)"),
    "workflow": ("workflow", False, "explore -> train -> the trained file beside the default, in the simulator"),
    "residual": ("residual", False, "a learned residual on the capacity controller: train, then score"),
    "selector": ("selector", False, "a general learned selector on the capacity controller: train, then score"),
    "prober": ("prober", False, "a general learned prober on the capacity controller, trained on its advantage "
               "over the default: train, then score"),
    "parity": ("parity", False, "the same path and thread schedule in the simulator and on the engine"),
    "shared-link": ("shared_link", False, "several jobs with their own controllers on one simulated link, with "
                    "and without the receiver's connection share"),
    "rao": ("rao", False, "Rao et al.'s concave-convex throughput profiles against RTT"),
    "tune": ("sweeps", True, "an Optuna study over PPO and reward settings (shared storage)"),
    "grid": ("sweeps", True, "scenario x policy x seed in the simulator through submitit"),
}
"""The experiments with a command line of their own: name -> (module of ``automdt.experiments``
whose ``main(argv)`` runs it, whether that ``main`` takes the name too, one line for ``--help``).
``python -m automdt.experiments NAME ...`` runs each; the others are :data:`RUNNERS`."""


def overview() -> str:
    """What ``python -m automdt.experiments`` (no experiment, or ``--help`` first) prints."""
    lines = ["usage: python -m automdt.experiments EXPERIMENT [options]   (EXPERIMENT --help for its options)", "",
             "experiments on the real engine (shared options):"]
    lines += [f"  {n:16s} {h}" for n, h in ENGINE_EXPERIMENTS.items()]
    lines += ["", "experiments with options of their own:"]
    lines += [f"  {n:16s} {h}" for n, (_, _, h) in MODULE_EXPERIMENTS.items()]
    return "\n".join(lines) + "\n"


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def main(argv: Optional[Sequence[str]] = None) -> int:
    import signal

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(overview(), end="")
        return 0 if args else 2
    if args[0] in MODULE_EXPERIMENTS:
        import importlib

        module, with_name, _ = MODULE_EXPERIMENTS[args[0]]
        run_main = importlib.import_module(f"automdt.experiments.{module}").main
        return int(run_main(args if with_name else args[1:]) or 0)
    named = [x for x in args if x in RUNNERS or x == "all"]
    if named and any(x in ("-h", "--help") for x in args):
        try:
            print(experiment_help(named[0]))
            sys.stdout.flush()
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    a = build_parser().parse_args(args)
    st = settings_from_args(a)
    if threading_main():
        # SIGTERM unwinds like Ctrl-C, so temporary datasets, destinations and namespaces are removed
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    t0 = time.monotonic()
    try:
        if a.experiment == "all":
            exps = run_all(st)
        else:
            exps = [RUNNERS[a.experiment](st)]
    except KeyboardInterrupt as e:
        print(f"interrupted: {e}; partial run directory kept, temporary data removed", file=sys.stderr)
        return 130
    for e in exps:
        print(f"{e.name}: {e.path}")
    print(f"done in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
