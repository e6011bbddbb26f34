"""``python -m automdt.experiments real``: every policy on paths whose bottleneck is a real resource.

For each path of :mod:`automdt.experiments.realpaths` (``net-rtt20``, ``net-rtt80``, ``disk``,
``cpu``; ``--scenarios`` picks some):

1. **the empirical oracle**: a coarse grid search of static triples on the same path, as one long
   transfer that holds each triple for a few intervals (:class:`~automdt.experiments.policies.GridPolicy`):
   a 3-D grid (each stage at 1, 4 and 16 threads; each triple held 4 intervals, the first 2 not
   measured), then a line search of each stage from the best grid triple (1, 2, 3, 4, 6, 8, 11,
   16, 23, 32 threads, the others held; then every count between a stage's first good ladder
   point and the one below it), then the fewest threads
   per stage that keep 95% of that stage's best (the median of its three best points, so one
   lucky interval does not set the bar), verified against the best grid triple; the
   oracle is that minimal triple (or the best triple if the minimal one falls more than 5% short),
   recorded with its throughput;
2. **ppo-own**: ``automdt explore`` on the path (random triples, ``--real-explore`` seconds, 60), the
   profile fitted from its samples (USL contention included where the samples show it), a policy
   trained on it (``--own-train``, ``--own-target``);
3. every policy (``ppo`` shipped, ``ppo-own``, ``marlin``, ``falcon``, ``globus``, ``heuristic``,
   ``model``, ``oracle`` = the empirical oracle's triple held fixed) for ``--duration`` seconds
   (default 20), copying the dataset again whenever it runs out (one policy state throughout);
4. **sim-to-real**: each policy run again in the simulator on the explored profile for as many
   intervals, its simulated mean throughput against the measured one.

Results: ``results.md`` (tables, the issue's checks), ``runs.csv``, ``intervals.csv``,
``grid-<scenario>.csv``, ``sim_to_real.csv``, ``real-<scenario>.png`` (threads and stage
throughputs over time), ``real-fraction.png``, ``real-sim-vs-real.png``, ``profiles/`` (explored
profiles), ``policies/`` (ppo-own), ``work/`` (each sender's config, output and log). Paths that
need root (namespaces, cgroups) are skipped with the reason without it. The machine's load
average at the start and end of each path is recorded: on a shared machine the CPU-bound paths
(``cpu``, ``disk``) measure the machine as much as the policies.
"""
from __future__ import annotations

import itertools
import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from automdt.experiments import metrics as M
from automdt.policy_contract import STAGES
from automdt.experiments import plots
from automdt.experiments.realpaths import PathSession, RealScenario, TransferRun, real_scenarios
from automdt.experiments.runner import RunDir, RunResult, git_info, interval_rows, ppo_default_info
from automdt.experiments.scenarios import MB

REAL_POLICIES = ("ppo", "ppo-own", "marlin", "falcon", "globus", "heuristic", "model", "oracle")
QUICK_POLICIES = ("ppo", "marlin", "oracle")
GRID_LEVELS = (1, 4, 16)
LINE_LADDER = (1, 2, 3, 4, 6, 8, 11, 16, 23, 32)
MINIMAL_KEEP = 0.95
"""A stage's minimal count keeps this share of the (robust) best throughput of its line search."""
ORACLE_FALLBACK = 0.95
"""The minimal triple is the oracle unless it verifies more than 5% below the best grid triple."""
LOOPBACK_RTT_S = 0.0002
LOOPBACK_BPS = 1e9


def load_average() -> List[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


# ---------------------------------------------------------------------------------------------
# policies on a real path
# ---------------------------------------------------------------------------------------------
class PolicyUnavailable(RuntimeError):
    """The policy cannot run here (e.g. no shipped PPO policy)."""


def policy_spec(label: str, sc: RealScenario, avg_file_size: float, file_count: int,
                oracle: Optional[Sequence[int]] = None, own: Optional[str] = None) -> Tuple[str, Dict[str, Any]]:
    """Registry spec and keyword arguments of a policy label on a real path."""
    if label == "ppo":
        info = ppo_default_info()
        if not info.get("available"):
            raise PolicyUnavailable(info.get("reason", "no shipped PPO policy"))
        return "ppo", {}
    if label == "ppo-own":
        if not own:
            raise PolicyUnavailable("ppo-own: no policy (exploration or training failed)")
        return f"ppo:{own}", {}
    if label == "oracle":
        if oracle is None:
            raise PolicyUnavailable("oracle: the grid search found no triple")
        return "static:%d,%d,%d" % tuple(oracle), {}
    if label == "heuristic":
        return "heuristic", {"rtt_s": sc.rtt_s or LOOPBACK_RTT_S, "bandwidth_bps": sc.link_bps or LOOPBACK_BPS,
                             "avg_file_size": float(avg_file_size), "file_count": int(file_count)}
    return label, {}


def to_result(run: TransferRun, scenario: str, dataset: str, achievable: float, bottleneck: str,
              min_threads: Dict[str, int]) -> RunResult:
    """A sender process's run as the experiments' :class:`RunResult` (metrics against ``achievable``)."""
    met = M.run_metrics(run.rows, achievable, bottleneck, min_threads) if run.rows else {"intervals": 0}
    if run.rows:
        x = np.array([float(r["tput_write"]) for r in run.rows])
        half = x[len(x) // 2:]
        met["second_half_delivered_bps"] = float(np.mean(half))
    # bytes written over the time the copies took (every round's scan-to-done, gaps between rounds
    # excluded): unlike the mean of the interval rates, it counts intervals that stretched (a busy
    # receiver answers late) by their length and the end of each copy (files fsynced and renamed)
    active = float(run.summary.get("seconds_active") or run.summary.get("seconds") or 0.0)
    met["active_delivered_bps"] = float(run.summary.get("bytes") or 0) / active if active > 0 else None
    summary = dict(run.summary)
    summary.setdefault("seconds", run.wall_s)
    exit_code = summary.get("exit_code")
    completed = exit_code == 0 and not summary.get("files_failed")
    return RunResult(scenario=scenario, policy=run.label, dataset=dataset, rows=run.rows, summary=summary,
                     metrics=met, wall_s=run.wall_s, cpu_s=run.sender_cpu_s + run.receiver_cpu_s,
                     completed=completed, error=run.error,
                     extra={"sender_cpu_s": round(run.sender_cpu_s, 3), "receiver_cpu_s": round(run.receiver_cpu_s, 3),
                            "forwarder_cpu_s": round(run.forwarder_cpu_s, 3),
                            "cpu_pct_both_ends": round(100 * (run.sender_cpu_s + run.receiver_cpu_s) / run.wall_s, 1)
                            if run.wall_s > 0 else None})


# ---------------------------------------------------------------------------------------------
# the empirical oracle
# ---------------------------------------------------------------------------------------------
def triple_throughputs(rows: Sequence[Dict[str, Any]], skip: int = 1) -> Dict[Tuple[int, int, int], List[float]]:
    """Delivered throughput samples per held triple, without the first ``skip`` intervals of each
    hold (the transient after a change: buffers and socket queues settle) and of each copy round."""
    out: Dict[Tuple[int, int, int], List[float]] = {}
    prev_t, prev_round, run = None, None, 0
    for r in rows:
        t = (int(r["threads_read"]), int(r["threads_net"]), int(r["threads_write"]))
        rnd = r.get("round", 0)
        run = run + 1 if (t == prev_t and rnd == prev_round) else 0
        if run >= skip:
            out.setdefault(t, []).append(float(r["tput_write"]))
        prev_t, prev_round = t, rnd
    return out


def robust_top(values: Sequence[float]) -> float:
    """The median of the three highest values (the highest of fewer): one lucky one-second burst
    (a token bucket's burst, socket buffers draining) does not set the bar."""
    v = sorted(values)[-3:]
    return float(np.median(v)) if v else 0.0


def minimal_triple(best: Sequence[int], table: Dict[Tuple[int, int, int], float], keep: float = MINIMAL_KEEP
                   ) -> Tuple[int, int, int]:
    """Per stage, the fewest threads whose line-search point (others as in ``best``) keeps
    ``keep`` of that line's :func:`robust_top`; stages without line points keep ``best``'s count."""
    out = list(best)
    for j in range(3):
        line = {t[j]: v for t, v in table.items() if all(t[i] == best[i] for i in range(3) if i != j)}
        if not line:
            continue
        top = robust_top(list(line.values()))
        out[j] = min(n for n, v in line.items() if v >= keep * top)
    return (out[0], out[1], out[2])


def grid_search(ps: PathSession, st: Any, quick: bool, hold: Optional[int] = None) -> Dict[str, Any]:
    """The empirical oracle of the path (module docstring, step 1)."""
    mt = ps.sc.max_threads
    levels = (1, 8) if quick else GRID_LEVELS
    ladder = (1, 4, 16) if quick else LINE_LADDER
    hold = hold or (3 if quick else 4)
    skip = 2
    iv = ps.interval_s
    t0 = time.monotonic()

    def run(tag: str, triples: List[Tuple[int, int, int]], h: int) -> Dict[Tuple[int, int, int], List[float]]:
        dur = len(triples) * h * iv * 1.2 + 6.0
        r = ps.run(tag, "grid", {"triples": [list(t) for t in triples], "hold": h}, duration_s=dur, rounds=True)
        if r.error:
            st.log(f"    {tag}: {r.error}")
        return triple_throughputs(r.rows, min(skip, h - 1))

    coarse = [t for t in itertools.product(levels, levels, levels) if max(t) <= mt]
    samples = run("grid-coarse", coarse, hold)
    means = {t: float(np.mean(v)) for t, v in samples.items() if v}
    if not means:
        return {"error": "the grid measured nothing"}
    # the line search starts from the best-measured grid triple among those within 5% of the
    # robust top with the fewest threads: a single lucky interval does not pick the start
    top0 = robust_top(list(means.values()))
    best0 = min((t for t, v in means.items() if v >= ORACLE_FALLBACK * top0), key=lambda t: (sum(t), -means[t]))
    lines: List[Tuple[int, int, int]] = []
    for j in range(3):
        for v in ladder:
            if v <= mt:
                t = list(best0)
                t[j] = v
                if tuple(t) not in lines:
                    lines.append(tuple(t))  # type: ignore[arg-type]
    line_samples = run("grid-lines", lines, hold)
    for t, v in line_samples.items():
        samples.setdefault(t, []).extend(v)
    line_means = {t: float(np.mean(v)) for t, v in line_samples.items() if v}
    # refine: between a stage's minimal ladder count and the ladder point below it, every count
    # (at most 6), so that the oracle's count is not the ladder's coarseness (11 -> 16)
    rough = minimal_triple(best0, line_means)
    fine: List[Tuple[int, int, int]] = []
    for j in range(3 if not quick else 0):
        below = [v for v in ladder if v < rough[j]]
        if below and rough[j] - max(below) > 1:
            gap = list(range(max(below) + 1, rough[j]))
            for v in sorted(set(gap[int(round(i * (len(gap) - 1) / 5))] for i in range(6)) if len(gap) > 6 else gap):
                t = list(best0)
                t[j] = v
                fine.append(tuple(t))  # type: ignore[arg-type]
    if fine:
        for t, v in run("grid-refine", fine, hold).items():
            samples.setdefault(t, []).extend(v)
            line_samples.setdefault(t, []).extend(v)
        line_means = {t: float(np.mean(v)) for t, v in line_samples.items() if v}
    means = {t: float(np.mean(v)) for t, v in samples.items() if v}
    top = robust_top(list(means.values()))
    # "best": the fewest threads within 5% of the robust top (a triple no other beats clearly)
    best = min((t for t, v in means.items() if v >= ORACLE_FALLBACK * top), key=lambda t: (sum(t), -means[t]))
    minimal = minimal_triple(best0, line_means)
    verify = run("grid-verify", [minimal, best], 6 if not quick else 4)
    v_min = float(np.mean(verify.get(minimal) or [0.0]))
    v_best = float(np.mean(verify.get(best) or [0.0]))
    if minimal == best:
        v_min = v_best = float(np.mean((verify.get(best) or []) + [means[best]]))
    chosen, note = minimal, "the fewest threads per stage keeping 95% of its line search's best"
    if v_best > 0 and v_min < ORACLE_FALLBACK * v_best:
        chosen, note = best, (f"the minimal triple {minimal} verified at {v_min / MB:.1f} MB/s, more than 5% below "
                              f"the best grid triple's {v_best / MB:.1f}: the best triple instead")
    return {
        "triple": list(chosen), "throughput_bps": v_min if chosen == minimal else v_best, "note": note,
        "best_grid_triple": list(best), "best_grid_bps": means[best], "coarse_best": list(best0),
        "minimal_triple": list(minimal), "verified": {"minimal_bps": v_min, "best_bps": v_best},
        "levels": list(levels), "ladder": list(ladder), "hold_intervals": hold, "seconds": time.monotonic() - t0,
        "table": [{"read": t[0], "net": t[1], "write": t[2], "mean_bps": float(np.mean(v)), "samples": len(v)}
                  for t, v in sorted(samples.items()) if v],
    }


def bottleneck_of(oracle_triple: Sequence[int], profile: Any = None) -> str:
    """The path's bottleneck stage: the explored profile's, else the stage the oracle gives the most threads."""
    if profile is not None:
        return str(profile.bottleneck)
    return STAGES[int(np.argmax(oracle_triple))]


# ---------------------------------------------------------------------------------------------
# ppo-own
# ---------------------------------------------------------------------------------------------
def explore_and_train(ps: PathSession, st: Any, rd: RunDir, name: str, changes: Any = None,
                      schedule: Optional[List[Dict[str, Any]]] = None, train_policy: bool = True
                      ) -> Tuple[Optional[str], Optional[Any], Dict[str, Any]]:
    """``automdt explore`` on the path, then (``train_policy``) ``train`` on the fitted profile:
    (policy path, profile, info)."""
    from automdt.agents.training import profile_settings, train
    from automdt.simulator.profile import Profile

    os.makedirs(rd.file("profiles"), exist_ok=True)
    os.makedirs(rd.file("policies"), exist_ok=True)
    prof_path = rd.file(f"profiles/{name}-explored.yaml")
    info: Dict[str, Any] = {}
    seconds = min(st.real_explore_s, 10.0) if st.quick else st.real_explore_s
    r = ps.run("explore", "explore", mode="explore", duration_s=seconds, rounds=True,
               profile_out=prof_path, schedule=schedule)
    if r.error or not os.path.exists(prof_path):
        info["error"] = f"exploration failed: {r.error or 'no profile'}"
        return None, None, info
    prof = Profile.load(prof_path)
    info["explore"] = {"intervals": len(r.rows), "seconds": round(r.wall_s, 1), "profile": f"profiles/{name}-explored.yaml"}
    if not train_policy:
        return None, prof, info
    try:
        rep = train(prof, rd.file(f"policies/{name}-own.zip"), seed=st.seed, target_fraction=st.own_target,
                    max_seconds=st.own_train_s, progress=False, changes=changes, **profile_settings())
    except Exception as e:  # noqa: BLE001 - recorded; the other policies still run
        info["error"] = f"training failed: {e}"
        return None, prof, info
    info["train"] = {"timesteps": rep.timesteps, "seconds": round(rep.wall_s, 1),
                     "fraction_of_oracle": round(rep.fraction_of_oracle, 4), "stop": rep.stop_reason,
                     "changes": None if changes is None else changes.to_dict()}
    st.log(f"    ppo-own: explored {len(r.rows)} intervals; trained {rep.timesteps} steps in {rep.wall_s:.0f} s, "
           f"{rep.fraction_of_oracle:.3f} of the fitted oracle")
    return str(rep.model_path), prof, info


def profile_summary(prof: Any) -> str:
    parts = []
    for name, s in zip(STAGES, prof.stages):
        c = f", USL sigma {s.contention:.3g} kappa {s.coherency:.3g}" if s.has_contention else ""
        parts.append(f"{name} {s.tpt / MB:.1f}/thread up to {s.bandwidth / MB:.0f}{c}")
    return "; ".join(parts) + f" (MB/s); bottleneck {prof.bottleneck}, achievable {prof.achievable_bps / MB:.1f} MB/s"


# ---------------------------------------------------------------------------------------------
# sim-to-real
# ---------------------------------------------------------------------------------------------
def sim_to_real(res: RunResult, spec: str, kwargs: Dict[str, Any], prof: Any, max_threads: int, seed: int
                ) -> Optional[Dict[str, Any]]:
    """The policy on the explored profile in the simulator for as many intervals as the real run."""
    from automdt.agents.registry import make_policy
    from automdt.simulator.oracle import evaluate_policy_in_sim

    if prof is None or not res.rows:
        return None
    pol = make_policy(spec, max_threads, **kwargs)
    traj = evaluate_policy_in_sim(pol, prof, steps=max(2, len(res.rows)), seed=seed)
    real = float(res.metrics.get("active_delivered_bps") or res.metrics.get("mean_delivered_bps") or 0.0)
    sim = float(traj.mean_throughput_bps)
    return {"scenario": res.scenario, "policy": res.policy, "sim_bps": sim, "real_bps": real,
            "ratio": (sim / real) if real > 0 else None, "within_10pct": bool(real > 0 and abs(sim / real - 1) <= 0.10),
            "sim_settled": list(traj.settled_threads), "intervals": len(res.rows)}


# ---------------------------------------------------------------------------------------------
# the experiment
# ---------------------------------------------------------------------------------------------
def load_run_dir(path: str) -> Tuple[Dict[str, Any], List[RunResult]]:
    """``config.json`` and the transfers of an earlier ``real``/``changing`` run directory (rows from
    ``intervals.csv``; ``metrics`` and ``extra`` both hold the run's line of ``runs.csv``)."""
    import json

    from automdt.experiments.runner import read_csv

    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    ivs = read_csv(os.path.join(path, "intervals.csv")) if os.path.exists(os.path.join(path, "intervals.csv")) else []
    out = []
    for r in read_csv(os.path.join(path, "runs.csv")) if os.path.exists(os.path.join(path, "runs.csv")) else []:
        for k, v in list(r.items()):
            if isinstance(v, str) and v[:1] in "[{":
                try:
                    r[k] = json.loads(v)
                except ValueError:
                    pass
        rows = [x for x in ivs if x["scenario"] == r["scenario"] and x["policy"] == r["policy"]]
        out.append(RunResult(scenario=r["scenario"], policy=r["policy"], dataset=r.get("dataset") or "", rows=rows,
                             summary={"seconds": r.get("seconds"), "exit_code": r.get("exit_code")}, metrics=r,
                             wall_s=r.get("wall_s") or 0.0, cpu_s=r.get("cpu_s") or 0.0,
                             completed=bool(r.get("completed")), error=r.get("error") or None, extra=r))
    return cfg, out


def run_real(st: Any) -> Any:
    """The ``real`` experiment (``st``: :class:`automdt.experiments.run.Settings`); ``--from DIR``
    rewrites the tables and plots of an earlier run into a new directory."""
    from automdt.experiments.run import Experiment

    if st.from_dir:
        from automdt.experiments.runner import read_csv

        cfg, results = load_run_dir(st.from_dir)
        rd = RunDir(st.out, "real")
        rd.write_config(cfg | {"from": os.path.abspath(st.from_dir), "original_git": cfg.get("git")})
        s2r_path = os.path.join(st.from_dir, "sim_to_real.csv")
        s2r = read_csv(s2r_path) if os.path.exists(s2r_path) else []
        names = [n for n in cfg["scenarios"]]
        summary = write_real_results(st, rd, names, cfg["policies"], cfg["scenarios"], cfg.get("skipped", {}),
                                     results, s2r, float(cfg.get("duration_s") or 0))
        return Experiment("real", rd.path, results, cfg.get("skipped", {}), summary)

    all_sc = real_scenarios(st.quick)
    names = list(st.scenarios) if st.scenarios else (["net-rtt20"] if st.quick else list(all_sc))
    bad = [n for n in names if n not in all_sc]
    if bad:
        raise SystemExit(f"unknown real scenario(s) {bad}; choose from {list(all_sc)}")
    labels = list(st.policies) if st.policies else list(QUICK_POLICIES if st.quick else REAL_POLICIES)
    duration = st.duration_s or (5.0 if st.quick else 20.0)
    rd = RunDir(st.out, "real")
    st.log(f"[real] {rd.path}: {len(names)} paths x {len(labels)} policies x {duration:g} s")
    cfg: Dict[str, Any] = {
        "seed": st.seed, "settings": st.to_dict(), "duration_s": duration, "policies": labels,
        "options": {"memory": st.memory, "chunk_size": st.chunk_size, "interval_s": st.interval_s},
        "scenarios": {}, "skipped": {}, "ppo_default": ppo_default_info() if "ppo" in labels else None,
        "rerun": "python -m automdt.experiments real" + (" --quick" if st.quick else "")
                 + (f" --scenarios {','.join(names)}" if st.scenarios else "")
                 + (f" --policies {','.join(labels)}" if st.policies else "") + f" --seed {st.seed}",
    }
    rd.write_config(cfg)
    results: List[RunResult] = []
    per: Dict[str, Dict[str, Any]] = {}
    s2r: List[Dict[str, Any]] = []
    for name in names:
        sc = all_sc[name].scaled(max_threads=st.max_threads)
        ok, why = sc.requirements()
        if not ok:
            cfg["skipped"][name] = why
            st.log(f"  {name}: skipped ({why})")
            continue
        info = _run_path(st, rd, name, sc, labels, duration, results, s2r)
        if info.get("error"):
            cfg["skipped"][name] = info["error"]
            continue
        info["load_end"] = load_average()
        per[name] = info
        cfg["scenarios"][name] = info
        rd.update_config(scenarios=cfg["scenarios"], skipped=cfg["skipped"])
    rd.update_config(scenarios=cfg["scenarios"], skipped=cfg["skipped"])
    rd.write_csv("intervals.csv", interval_rows(results))
    rd.write_csv("runs.csv", [r.table_row() for r in results])
    rd.write_csv("sim_to_real.csv", s2r)
    summary = write_real_results(st, rd, names, labels, per, cfg["skipped"], results, s2r, duration)
    return Experiment("real", rd.path, results, cfg["skipped"], summary)


def _run_path(st: Any, rd: RunDir, name: str, sc: Any, labels: Sequence[str], duration: float,
              results: List[RunResult], s2r: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One real path: the oracle's grid, the exploration, then every policy of ``labels`` for
    ``duration`` seconds (their results appended to ``results``, the simulator's predictions for
    them to ``s2r``). Returns the path's section of the run's configuration, or ``{"error": why}``
    when the grid found no oracle."""
    st.log(f"  {name}: {sc.description}")
    info: Dict[str, Any] = {"load_start": load_average(), "skipped_policies": {}}
    with PathSession(sc, rd.file(f"work/{name}"), memory=st.memory, chunk_size=st.chunk_size,
                     interval_s=st.interval_s, drop_caches=st.drop_caches, seed=st.seed, log=st.log) as ps:
        info["path"] = ps.describe()
        ds = ps.dataset
        grid = grid_search(ps, st, st.quick)
        info["oracle"] = grid
        if grid.get("error"):
            return {"error": grid["error"]}
        rd.write_csv(f"grid-{name}.csv", grid["table"])
        st.log(f"    oracle {tuple(grid['triple'])} at {grid['throughput_bps'] / MB:.1f} MB/s "
               f"(best grid {tuple(grid['best_grid_triple'])} {grid['best_grid_bps'] / MB:.1f}; "
               f"{grid['seconds']:.0f} s)")
        # the explored profile serves ppo-own and the sim-to-real report: always explore
        own, prof, oinfo = explore_and_train(ps, st, rd, name, train_policy="ppo-own" in labels)
        info["ppo_own"] = oinfo
        if prof is not None:
            info["explored_profile"] = profile_summary(prof)
            st.log(f"    explored: {info['explored_profile']}")
        oracle = grid["triple"]
        bott = bottleneck_of(oracle, prof)
        info["bottleneck"] = bott
        min_threads = dict(zip(STAGES, (int(x) for x in oracle)))
        achievable = float(grid["throughput_bps"])
        for lab in labels:
            try:
                spec, kw = policy_spec(lab, sc, ds.avg_file_size, len(ds.files), oracle, own)
            except PolicyUnavailable as e:
                info["skipped_policies"][lab] = str(e)
                continue
            run = ps.run(lab, spec, kw, duration_s=duration, rounds=True,
                         log_path=rd.log_path(name, lab))
            res = to_result(run, name, ds.spec.name, achievable, bott, min_threads)
            res.extra.update(spec=spec)
            results.append(res)
            m = res.metrics
            st.log(f"    {lab:9s} {(m.get('active_delivered_bps') or 0) / MB:6.1f} MB/s "
                   f"({(m.get('active_delivered_bps') or 0) / achievable:.2f} of the oracle's grid rate), threads "
                   f"{m.get('after_median_read', 0):.0f},{m.get('after_median_net', 0):.0f},"
                   f"{m.get('after_median_write', 0):.0f}, CPU {res.extra['cpu_pct_both_ends']}%"
                   + (f"  ERROR {res.error}" if res.error else ""))
            if prof is not None:
                try:
                    row = sim_to_real(res, spec, kw, prof, sc.max_threads, st.seed)
                except Exception as e:  # noqa: BLE001
                    row = {"scenario": name, "policy": lab, "error": str(e)}
                if row:
                    s2r.append(row)
    return info


def report_head(title: str, intro: str, st: Any, rd: RunDir, skipped: Dict[str, str], what: str) -> List[str]:
    """The first lines of a ``results.md``: title, what ran, run directory, git (the commit the run
    started from, as ``config.json`` recorded it; ``--from`` runs: the original run's), options,
    what was skipped."""
    import json

    try:
        with open(rd.file("config.json")) as f:
            cfg = json.load(f)
        g = (cfg.get("from_config") or {}).get("git") or cfg.get("original_git") or cfg.get("git") or git_info()
    except (OSError, ValueError):
        g = git_info()
    lines = [f"# {title}", "", intro, "",
             f"- run directory `{rd.path}`; seed {st.seed}; git `{(g.get('commit') or '?')[:12]}`"
             + (" (working tree modified)" if g.get("dirty") else ""),
             f"- engine options: staging buffer {st.memory >> 20} MiB per side, chunk {st.chunk_size >> 10} KiB, "
             f"interval {st.interval_s:g} s, at most {st.max_threads} threads per stage"
             + ("; **quick mode**" if st.quick else ""), ""]
    if skipped:
        lines += [f"{what} not run: " + "; ".join(f"**{k}**: {v}" for k, v in skipped.items()), ""]
    return lines


def check_lines(checks: Sequence[Tuple[str, Optional[bool], str]]) -> List[str]:
    """The issue's checks as markdown list items (PASS / FAIL / n/a)."""
    return (["## The issue's checks", ""]
            + [f"- {'PASS' if ok else ('n/a' if ok is None else 'FAIL')}: {t} ({d})" for t, ok, d in checks] + [""])


def write_real_results(st: Any, rd: RunDir, names: Sequence[str], labels: Sequence[str], per: Dict[str, Dict[str, Any]],
                       skipped: Dict[str, str], results: Sequence[RunResult], s2r: Sequence[Dict[str, Any]],
                       duration: float) -> Dict[str, Any]:
    """``results.md`` and the plots of a real run: one section per path, the fractions of the
    oracle, sim-to-real, the checks; returns the summary the experiment reports."""
    lines = report_head(
        "Real-resource paths",
        "Every policy on paths whose bottleneck is a real resource (no engine rate limit): a `tc tbf` link "
        "between two network namespaces with the delay forwarder's RTT and per-connection window, cold reads "
        "and fsync'ed writes on the real disk, a receiver confined by a cgroup CPU quota "
        "(`experiments/realpaths.py`). The yardstick is the *empirical oracle*: the best static triple of a "
        "grid search on the same path (`experiments/real.py`). Each policy runs for {duration:g} s (the dataset is "
        "copied again when it runs out); throughput = bytes written at the receiver over the copies' own time."
        .format(duration=duration), st, rd, skipped, "Paths")
    checks: List[Tuple[str, Optional[bool], str]] = []
    fractions: Dict[str, List[Optional[float]]] = {lab: [] for lab in labels}
    groups = []
    for name in names:
        if name not in per:
            continue
        info = per[name]
        orc = info["oracle"]
        runs = [r for r in results if r.scenario == name]
        groups.append(name)
        sc = info["path"]["scenario"]
        lines += [f"## {name}", "", f"{sc['description']}. Load average at start / end: "
                  f"{info.get('load_start')} / {info.get('load_end')}.", "",
                  f"Empirical oracle: **{tuple(orc['triple'])}** at **{orc['throughput_bps'] / MB:.1f} MB/s** "
                  f"({orc['note']}); best grid triple {tuple(orc['best_grid_triple'])} at "
                  f"{orc['best_grid_bps'] / MB:.1f} MB/s; {len(orc['table'])} triples in {orc['seconds']:.0f} s "
                  f"(`grid-{name}.csv`). Bottleneck stage: {info.get('bottleneck')}.", ""]
        if info.get("explored_profile"):
            lines += [f"Explored profile (`profiles/{name}-explored.yaml`): {info['explored_profile']}.", ""]
        if info.get("ppo_own", {}).get("error"):
            lines += [f"ppo-own: {info['ppo_own']['error']}", ""]
        if info.get("skipped_policies"):
            lines += ["Policies not run: " + "; ".join(f"**{k}**: {v}" for k, v in info["skipped_policies"].items()), ""]
        ref = oracle_rate(runs, orc)
        lines += _path_table(runs, orc, ref)
        if runs:
            plots.timeseries_grid(rd.file(f"real-{name}.png"), f"{name}: threads and stage throughputs", runs,
                                  orc["throughput_bps"], orc["triple"])
            lines += [f"![{name}](real-{name}.png)", ""]
        for lab in labels:
            r = next((x for x in runs if x.policy == lab), None)
            fractions[lab].append(_frac(r, ref) if r else None)
        b = STAGES.index(info.get("bottleneck", "net"))
        own = next((x for x in runs if x.policy == "ppo-own"), None)
        if own is not None:
            f = _frac(own, ref) or 0.0
            nb = own.metrics.get(f"after_median_{STAGES[b]}")
            ok = f >= 0.95 and nb is not None and nb <= orc["triple"][b] + 1
            checks.append((f"{name}: ppo-own >= 0.95 of the oracle's throughput with at most one {STAGES[b]} thread "
                           f"more than its {orc['triple'][b]}", ok, f"{f:.2f}, {STAGES[b]} threads {M.fmt(nb, 0)}"))
        shipped = next((x for x in runs if x.policy == "ppo"), None)
        if shipped is not None:
            f = _frac(shipped, ref) or 0.0
            checks.append((f"{name}: shipped ppo >= 0.9 of the oracle's throughput", f >= 0.9, f"{f:.2f}"))
    if groups:
        plots.grouped_bars(rd.file("real-fraction.png"), "delivered throughput / empirical oracle's", groups,
                           fractions, "fraction", hline=1.0)
        lines += ["## Throughput as a fraction of the empirical oracle", "", "![fraction](real-fraction.png)", ""]
    lines += _sim_to_real_lines(rd, s2r, checks)
    lines += check_lines(checks)
    rd.write_text("results.md", "\n".join(lines))
    st.log(f"[real] wrote {rd.path}/results.md")
    return {"checks": [{"check": t, "pass": ok, "detail": d} for t, ok, d in checks], "paths": per,
            "sim_to_real": list(s2r)}


def _path_table(runs: Sequence[RunResult], orc: Dict[str, Any], ref: float) -> List[str]:
    """A path's table of the policies that ran on it (``ref``: the oracle run's rate) and its legend."""
    head = ["policy", "MB/s", "of oracle", "interval mean MB/s", "2nd half MB/s", "90% of oracle at s",
            "threads after (r,n,w)", "mean threads (r,n,w)", "CPU % both ends", "forwarder CPU s"]
    rows = []
    for r in runs:
        m = r.metrics
        rows.append([r.policy, M.mb(m.get("active_delivered_bps")), M.fmt(_frac(r, ref), 2),
                     M.mb(m.get("mean_delivered_bps")),
                     M.mb(m.get("second_half_delivered_bps")), M.fmt(m.get("conv_s"), 1),
                     ",".join(M.fmt(m.get(f"after_median_{s}"), 0) for s in STAGES),
                     ",".join(M.fmt(m.get(f"mean_threads_{s}"), 1) for s in STAGES),
                     M.fmt(r.extra.get("cpu_pct_both_ends"), 0), M.fmt(r.extra.get("forwarder_cpu_s"), 1)])
        if r.error:
            rows[-1][0] += f" (error: {r.error[:60]})"
    return [M.md_table(head, rows), "",
            f"MB/s: bytes written over the copies' own time (rounds' gaps excluded); *of oracle*: over the "
            f"`oracle` run's {ref / MB:.1f} MB/s measured the same way (the grid measured "
            f"{orc['throughput_bps'] / MB:.1f}); *interval mean*: the mean of the 1-s interval rates.", ""]


def _sim_to_real_lines(rd: RunDir, s2r: Sequence[Dict[str, Any]], checks: List[Tuple[str, Optional[bool], str]]
                       ) -> List[str]:
    """The sim-to-real section of ``results.md`` (its plot written, its check appended to ``checks``)."""
    lines = ["## Sim-to-real", "",
             "Each policy run in the simulator on the path's explored profile (`automdt explore` + fit, the profile "
             "`ppo-own` trained on) for as many intervals as its real run, from the same start: simulated mean "
             "throughput against the measured one.", ""]
    if s2r:
        head = ["scenario", "policy", "sim MB/s", "real MB/s", "sim / real", "within 10%", "sim settles at"]
        rws = [[d["scenario"], d["policy"], M.mb(d.get("sim_bps")), M.mb(d.get("real_bps")), M.fmt(d.get("ratio"), 2),
                M.fmt(d.get("within_10pct")), str(tuple(d.get("sim_settled") or ())) if d.get("sim_settled") else
                d.get("error", "-")] for d in s2r]
        lines += [M.md_table(head, rws), ""]
        ok_n = sum(1 for d in s2r if d.get("within_10pct"))
        checks.append(("sim-to-real within 10% for every policy and path", ok_n == len(s2r),
                       f"{ok_n} of {len(s2r)}"))
        _sim_plot(rd, s2r)
        lines += ["![sim vs real](real-sim-vs-real.png)", ""]
    else:
        lines += ["Not available: no path was explored (ppo-own not among the policies, or exploration failed).", ""]
    return lines


def oracle_rate(runs: Sequence[RunResult], orc: Dict[str, Any]) -> float:
    """The yardstick rate: the ``oracle`` run's (the grid's triple held for the same duration, measured
    like every policy), else the grid's measurement."""
    o = next((r for r in runs if r.policy == "oracle"), None)
    rate = (o.metrics.get("active_delivered_bps") if o is not None else None) or orc["throughput_bps"]
    return float(rate)


def _frac(r: RunResult, ref: float) -> Optional[float]:
    x = r.metrics.get("active_delivered_bps")
    return None if x is None or not ref else float(x) / ref


def _sim_plot(rd: RunDir, s2r: Sequence[Dict[str, Any]]) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 5))
    ax = fig.subplots()
    pts = [d for d in s2r if d.get("real_bps") and d.get("sim_bps") is not None]
    names = sorted({d["scenario"] for d in pts})
    for i, sc in enumerate(names):
        xs = [d["real_bps"] / MB for d in pts if d["scenario"] == sc]
        ys = [d["sim_bps"] / MB for d in pts if d["scenario"] == sc]
        ax.scatter(xs, ys, label=sc, color=f"C{i}")
        for d in pts:
            if d["scenario"] == sc:
                ax.annotate(d["policy"], (d["real_bps"] / MB, d["sim_bps"] / MB), fontsize=6)
    hi = max([1.0] + [max(d["real_bps"], d["sim_bps"]) / MB for d in pts]) * 1.1
    ax.plot([0, hi], [0, hi], "k-", lw=0.8)
    ax.plot([0, hi], [0, 1.1 * hi], "k:", lw=0.6)
    ax.plot([0, hi], [0, 0.9 * hi], "k:", lw=0.6)
    ax.set_xlabel("measured MB/s")
    ax.set_ylabel("simulated MB/s (explored profile)")
    ax.set_title("sim-to-real (dotted: +-10%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(rd.file("real-sim-vs-real.png"), dpi=90)
