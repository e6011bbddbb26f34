"""Issue 10 part B's sections of ``benchmarks/bench_policy.py``: sustained, ramp, completion, sim.

Run them with ``.venv/bin/python benchmarks/bench_policy.py --only sustained,ramp,completion,sim``.

Each section is a function ``section_<name>(ctx) -> dict of figures`` using the context of
``bench_policy.py`` (``ctx.dataset``, ``ctx.transfer``, ``ctx.path``, ``ctx.reps``, ``ctx.env``,
``ctx.automdt``); it prints its figures and the issue's target. Definitions (interval counts,
sustained share, dips, settling) are those of :mod:`automdt.experiments.behaviour`.

* ``sustained``: the default command (shipped policy, default 256 MiB buffers and 4 MiB chunks)
  on issue 10's read-bound path and on the experiments' read-, network- and write-bound shapes
  (80 MB/s), 26 x 100 MB (>= 30 s at the achievable rate); from each run's ``--log``: the share
  of intervals at >= 90% of the achievable rate after the first one, the longest dip, the ramp;
  ``--policy marlin`` on the issue's path in the same rounds. Target: sustained >= 0.9 everywhere.
* ``ramp``: cold start (no history, shipped default) on the experiments' three scenarios (their
  128 MiB buffers and 1 MiB chunks) at 80 and at 250 MB/s: intervals to 90% of the achievable
  rate, target <= 2; warm start with a policy trained on the scenario's profile
  (``automdt train --profile``): target 1.
* ``completion``: ``python -m automdt.experiments completion --policies default,marlin``: Marlin's
  time over the default's on every scenario and dataset; target >= 1.3.
* ``sim``: the shipped default's fraction of the oracle on 30 held-out random profiles (target
  >= 0.95), ``automdt train --profile`` on the three scenario profiles (target >= 0.95 in under a
  minute), and the simulator's view of ramp/sustained/settling on the same paths (engine chunk
  effects on).
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, List, Sequence, Tuple

from automdt.experiments.metrics import median

MB = 1_000_000
MiB = 1 << 20


def say(msg: str = "") -> None:
    print(msg, flush=True)


def _read_log(path: str) -> List[Dict[str, Any]]:
    """Every line of an interval log (``--log``): the ``start`` line, then one per interval."""
    with open(path) as f:
        return [json.loads(x) for x in f if x.strip()]


def log_metrics(lines: List[Dict[str, Any]], achievable_bps: float, min95: Sequence[int], bottleneck: int,
                drop_tail: int = 1, interval_s: float = 1.0) -> Dict[str, Any]:
    """:func:`automdt.experiments.behaviour.metrics_of` on the lines of an interval log (the last
    ``drop_tail`` intervals are the dataset's end, not the policy's doing), with ``start``: the
    log's ``start`` record (where the thread counts started and why; None if the log has none).
    The ramp is counted in steady intervals of time (``interval_s``, the run's ``--interval``) from
    the log's ``t``, so shorter early intervals do not count as whole ones."""
    from automdt.experiments.behaviour import metrics_of

    intervals = [r for r in lines if "throughput" in r]
    body = intervals[:-drop_tail] if len(intervals) > drop_tail + 2 else intervals
    delivered = [r["throughput"]["write"] for r in body]
    threads = [[r["threads"][s] for s in ("read", "net", "write")] for r in body]
    m = metrics_of(delivered, threads, achievable_bps, min95, bottleneck, ends_s=[float(r["t"]) for r in body],
                   interval_s=interval_s)
    m["start"] = next((r["start"] for r in lines if "start" in r), None)
    return m


def start_label(start: Any) -> str:
    """``"cold 4,2,8"``: an interval log's ``start`` record in a table cell (``"?"``: no record)."""
    if not start:
        return "?"
    t = start.get("threads", {})
    return f"{start.get('source', '?')} {','.join(str(t.get(s, '?')) for s in ('read', 'net', 'write'))}"


def throttle_spec(throttle: Dict[str, Tuple[float, float]]) -> str:
    """The ``--throttle`` spec of a path's limits (:func:`automdt.throttle.format_throttle`)."""
    from automdt.throttle import format_throttle

    return format_throttle(throttle)


def _paths_default_buffers() -> Dict[str, Any]:
    from automdt.experiments.behaviour import scenario_path
    from automdt.experiments.parity import ISSUE_PATH

    out = {"issue-read-bound": ISSUE_PATH}
    for b in ("read", "net", "write"):
        out[f"{b}-bound"] = scenario_path(b, memory=256 * MiB, chunk_size=4 * MiB)  # the CLI's defaults
    return out


def _fresh_history(ctx: Any) -> None:
    shutil.rmtree(ctx.env["XDG_STATE_HOME"], ignore_errors=True)


# ------------------------------------------------------------------------------ sustained
def section_sustained(ctx: Any) -> Dict[str, Any]:
    from automdt.experiments.behaviour import bottleneck_index, min_threads_95

    reps = max(1, min(ctx.reps, 3))
    ds = ctx.dataset("sustained", 26, 100 * MB)
    dest = ctx.path("dst-sustained")
    paths = _paths_default_buffers()
    runs: Dict[str, List[Dict[str, Any]]] = {}
    for rep in range(reps):
        for name, path in paths.items():
            policies = [("default", [])] + ([("marlin", ["--policy", "marlin"])] if name == "issue-read-bound" else [])
            for label, extra in policies:
                _fresh_history(ctx)
                log = ctx.path(f"sustained-{name}-{label}-{rep}.jsonl")
                r = ctx.transfer(ds, dest, "--throttle", throttle_spec(path.throttle), "--log", log, *extra,
                                 timeout=600)
                m = log_metrics(_read_log(log), path.achievable_bps, min_threads_95(path), bottleneck_index(path))
                m["wall_s"] = r.wall
                runs.setdefault(f"{name}/{label}", []).append(m)
                say(f"  {name:17s} {label:7s} rep {rep}: {r.wall:5.1f} s, ramp {m['ramp_intervals']} intervals, "
                    f"sustained {m['sustained']:.2f}, longest dip {m['longest_dip']}, settled {m['settled']} "
                    f"(min95 {m['min95']}), start {start_label(m['start'])}")
    shutil.rmtree(dest, ignore_errors=True)
    out: Dict[str, Any] = {"dataset": f"{ds.nfiles} x {ds.size // MB} MB", "reps": reps, "paths": {}}
    say()
    say(f"  {'path/policy':26s} {'wall s':>7s} {'sustained (min)':>16s} {'dip':>4s} {'ramp':>5s}  settled")
    ok = True
    for key, ms in runs.items():
        s = {"wall_s": median([m["wall_s"] for m in ms]), "sustained_median": median([m["sustained"] for m in ms]),
             "sustained_min": min(m["sustained"] for m in ms), "longest_dip": max(m["longest_dip"] for m in ms),
             "ramp_median": median([m["ramp_intervals"] or 99 for m in ms]),
             "settled": [m["settled"] for m in ms], "runs": ms}
        out["paths"][key] = s
        if key.endswith("/default"):
            ok &= s["sustained_min"] >= 0.9
        say(f"  {key:26s} {s['wall_s']:7.1f} {s['sustained_median']:8.2f} ({s['sustained_min']:.2f}) "
            f"{s['longest_dip']:4d} {s['ramp_median']:5.0f}  {s['settled']}")
    d, mr = out["paths"].get("issue-read-bound/default"), out["paths"].get("issue-read-bound/marlin")
    if d and mr:
        out["issue_path_marlin_over_default"] = mr["wall_s"] / d["wall_s"]
        say(f"  issue's path: marlin {mr['wall_s']:.1f} s / default {d['wall_s']:.1f} s = "
            f"{out['issue_path_marlin_over_default']:.2f}x")
    out["target_met"] = bool(ok)
    say(f"  target: >= 90% of the intervals at >= 90% of the achievable rate after first reaching it, "
        f"every path: {'met' if ok else 'NOT met'}")
    return out


# ------------------------------------------------------------------------------ ramp
def _write_profile(path: Any, where: str) -> str:
    path.profile().save(where)
    return where


def section_ramp(ctx: Any) -> Dict[str, Any]:
    from automdt.experiments.behaviour import bottleneck_index, min_threads_95, scenario_path

    reps = max(1, min(ctx.reps, 3))
    out: Dict[str, Any] = {"cold": {}, "warm": {}, "reps": reps}
    cases = [(f"{b}-bound" + ("" if rate == 80 else f"-{rate}"), b, rate) for rate in (80, 250)
             for b in ("read", "net", "write")]
    data = {80: ctx.dataset("ramp80", 8, 80 * MB), 250: ctx.dataset("ramp250", 10, 200 * MB)}
    dest = ctx.path("dst-ramp")
    trained: Dict[str, str] = {}
    for name, b, rate in cases:  # warm start: a policy trained on the path's profile
        path = scenario_path(b, rate * MB)
        prof = _write_profile(path, ctx.path(f"{name}.yaml"))
        pol = ctx.path(f"{name}-policy.zip")
        t0 = time.perf_counter()
        p = subprocess.run(ctx.automdt + ["train", "--profile", prof, "-o", pol, "--no-progress"], env=ctx.env,
                           capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            raise RuntimeError(f"automdt train --profile {name}: exit {p.returncode}: {p.stderr.strip()[-300:]}")
        trained[name] = pol
        say(f"  trained {name}: {time.perf_counter() - t0:.0f} s")
    for rep in range(reps):
        for name, b, rate in cases:
            path = scenario_path(b, rate * MB)
            common = ["--throttle", throttle_spec(path.throttle), "--memory", str(path.memory),
                      "--chunk-size", str(path.chunk_size)]
            for kind, extra in (("cold", []), ("warm", ["--policy", trained[name]])):
                _fresh_history(ctx)
                log = ctx.path(f"ramp-{name}-{kind}-{rep}.jsonl")
                ctx.transfer(data[rate], dest, *common, "--log", log, *extra, timeout=600)
                m = log_metrics(_read_log(log), path.achievable_bps, min_threads_95(path), bottleneck_index(path))
                out[kind].setdefault(name, []).append(m)
                t90 = m["seconds_to_threshold"]
                say(f"  {name:14s} {kind}: 90% in interval {m['ramp_intervals']} "
                    f"({'never' if t90 is None else f'{t90:.2f} s'}), start {start_label(m['start'])}, "
                    f"sustained {m['sustained']:.2f}, settled {m['settled']}")
    shutil.rmtree(dest, ignore_errors=True)
    say()
    summary = {}
    for kind, target in (("cold", 2), ("warm", 1)):
        say(f"  {kind} start (target: 90% within {target} interval{'s' if target > 1 else ''}):")
        met = True
        for name, ms in out[kind].items():
            ramps = [m["ramp_intervals"] or 99 for m in ms]
            med = median(ramps)
            met &= med <= target
            summary[f"{kind}/{name}"] = {"ramp_median": med, "ramps": ramps}
            say(f"    {name:14s} median {med:.0f}  ({', '.join(str(x) for x in ramps)})")
        summary[f"{kind}_target_met"] = met
        say(f"    {'met' if met else 'NOT met'}")
    out["summary"] = summary
    return out


# ------------------------------------------------------------------------------ completion
def section_completion(ctx: Any) -> Dict[str, Any]:
    reps = max(1, min(ctx.reps, 3))
    ratios: Dict[str, List[float]] = {}
    times: Dict[str, Dict[str, List[float]]] = {}
    for rep in range(reps):
        outdir = ctx.path(f"completion-{rep}")
        argv = [sys.executable, "-m", "automdt.experiments", "completion", "--policies", "default,marlin", "--seed",
                str(rep), "--out", outdir]
        p = subprocess.run(argv, env=ctx.env, capture_output=True, text=True, timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"experiments completion: exit {p.returncode}: {p.stderr.strip()[-300:]}")
        run = [d for d in os.listdir(outdir) if d.startswith("completion-")][0]
        with open(os.path.join(outdir, run, "runs.csv")) as f:
            rows = list(csv.DictReader(f))
        by: Dict[Tuple[str, str], Dict[str, float]] = {}
        for r in rows:
            by.setdefault((r["scenario"], r["dataset"].split("-")[0]), {})[r["policy"]] = float(r["seconds"])
        for (sc, dsname), t in sorted(by.items()):
            key = f"{sc}/{dsname}"
            if "default" in t and "marlin" in t:
                ratios.setdefault(key, []).append(t["marlin"] / t["default"])
                times.setdefault(key, {"default": [], "marlin": []})
                times[key]["default"].append(t["default"])
                times[key]["marlin"].append(t["marlin"])
        shutil.rmtree(outdir, ignore_errors=True)
    say(f"  {'scenario/dataset':24s} {'default s':>9s} {'marlin s':>9s} {'marlin/default':>15s}")
    ok = True
    out: Dict[str, Any] = {"reps": reps, "runs": {}}
    for key, rs in ratios.items():
        med = median(rs)
        ok &= med >= 1.3
        out["runs"][key] = {"default_s": times[key]["default"], "marlin_s": times[key]["marlin"], "ratio_median": med}
        say(f"  {key:24s} {median(times[key]['default']):9.2f} {median(times[key]['marlin']):9.2f} {med:15.2f}  "
            f"({', '.join(f'{x:.2f}' for x in rs)})")
    out["target_met"] = bool(ok and ratios)
    say(f"  target: Marlin/default completion time >= 1.3 everywhere: {'met' if out['target_met'] else 'NOT met'}")
    return out


# ------------------------------------------------------------------------------ sim
def section_sim(ctx: Any) -> Dict[str, Any]:
    import numpy as np

    from automdt.agents.registry import make_policy
    from automdt.agents.training import evaluate, held_out_random_profiles
    from automdt.experiments.behaviour import scenario_path, sim_episode, sim_paths, summarize

    out: Dict[str, Any] = {}
    profiles = held_out_random_profiles(30)
    for spec in ("default", "ppo"):  # the shipped default, and the PPO network beside it
        res = evaluate(make_policy(spec, 32), profiles, steps=60, seed=0)
        fr = np.array(list(res["per_profile"].values()))
        key = "held_out_random" if spec == "default" else f"held_out_random_{spec}"
        out[key] = {"policy": spec, "mean": float(fr.mean()), "min": float(fr.min()), "profiles": len(fr),
                    "per_profile": res["per_profile"]}
        say(f"  --policy {spec} on 30 held-out random profiles: {fr.mean():.3f} of the oracle (worst {fr.min():.3f})"
            + (f"; target >= 0.95: {'met' if fr.mean() >= 0.95 else 'NOT met'}" if spec == "default" else ""))

    out["train"] = {}
    for b in ("read", "net", "write"):
        path = scenario_path(b)
        prof = _write_profile(path, ctx.path(f"sim-{b}.yaml"))
        dest = ctx.path(f"sim-{b}-policy.zip")
        t0 = time.perf_counter()
        p = subprocess.run(ctx.automdt + ["train", "--profile", prof, "-o", dest, "--no-progress"], env=ctx.env,
                           capture_output=True, text=True, timeout=900)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            raise RuntimeError(f"automdt train: exit {p.returncode}: {p.stderr.strip()[-300:]}")
        with open(dest + ".json") as f:
            meta = json.load(f)
        out["train"][b] = {"command_wall_s": wall, "fraction_of_oracle": meta["fraction_of_oracle"],
                           "wall_s_to_target": meta.get("wall_s_to_target"), "timesteps": meta["timesteps"]}
        say(f"  automdt train --profile {b}-bound: {meta['fraction_of_oracle']:.3f} of the oracle, "
            f"target reached after {meta.get('wall_s_to_target')} s, command {wall:.0f} s; target >= 0.95 in < 60 s: "
            f"{'met' if meta['fraction_of_oracle'] >= 0.95 and wall < 60 else 'NOT met'}")

    out["behaviour"] = {}
    pol = make_policy("default", 32)
    say("  in the simulator (engine chunk effects on, 2% noise), 40 intervals, starts (1,1,1), (2,2,2), (4,4,4), "
        "the policy's own, 2 seeds each:")
    for name, path in sim_paths().items():
        runs = []
        for start in [(1, 1, 1), (2, 2, 2), (4, 4, 4), None]:
            for seed in range(2):
                runs.append(sim_episode(pol, path, steps=40, start=start, seed=seed))
        if name == "issue-read-bound":  # the drain the issue saw: 16 readers, the sender buffer full
            for seed in range(2):
                runs.append(sim_episode(pol, path, steps=40, start=(16, 5, 2), seed=seed, buffer_fill=(0.95, 0.0)))
        s = summarize(runs)
        s["settled"] = [r["settled"] for r in runs]
        out["behaviour"][name] = s
        say(f"    {name:18s} ramp median {s['ramp_median']:.0f} (worst {s['ramp_worst']:.0f}, <=2 in "
            f"{s['ramp_within_2']}/{s['runs']}), sustained min {s['sustained_min']:.2f}, longest dip "
            f"{s['longest_dip']}, holds {s['holds']}/{s['runs']}, settled {runs[0]['settled']} "
            f"(min95 {runs[0]['min95']})")
    return out


SECTIONS = {"sustained": section_sustained, "ramp": section_ramp, "completion": section_completion,
            "sim": section_sim}
