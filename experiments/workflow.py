"""``python -m automdt.experiments workflow``: does ``explore -> train -> transfer`` pay, in the simulator?

For held-out paths (the ablation's generator, :func:`automdt.experiments.ablation.held_out_cases`,
with a seed of its own, :data:`SEED`; training never sees them) in the families ``static``,
``two-stage``, ``contention`` and ``noise``:

1. the *explored* profile is the true path measured with an error (every stage's per-thread
   rate and bandwidth off by a log-normal factor of :data:`FIT_ERROR`, as a fit is);
2. ``automdt train --profile`` trains a file on it (:func:`automdt.agents.tuned_training.train_tuned`,
   its defaults);
3. the file (under the shield, as ``--policy FILE.zip`` runs it) and the default controller run on
   the *true* path, unchanged, and on the true path changing after the exploration, with the
   ablation's held-out changes (``moving``: the bottleneck moves to another stage once or twice;
   ``link``: the network drops to 25-60% and recovers; ``competing``: 4-32 connections of another
   transfer share the network for a while), with :data:`REPS` noise draws each.

Scores are fractions of the oracle over whole episodes (the start counts: a trained file starts at
the explored optimum), each interval's utility counted on what reached the destination
(:func:`automdt.agents.neighbourhood.delivered_utility`: bytes parked in a staging buffer earn
nothing), as training and validation count it. The results file ``workflow-sim.json`` holds every row and the summary; the
targets: trained at least the default + 0.03 on the path as explored, at least the default - 0.005
when it changes.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from automdt.agents.families import Episode, network_change
from automdt.experiments import ablation as AB
from automdt.simulator.profile import Profile, StageProfile

SEED = 20_261_128
"""Seed of this experiment's held-out paths (the ablation uses another)."""
FAMILIES = ("static", "two-stage", "contention", "noise")
CHANGES = ("moving", "link", "competing")
FIT_ERROR = 0.08
"""Relative std of the explored profile's error against the true path."""
REPS = 3
CHANGES_PER_PATH = 2
"""Changed runs of each kind per path."""


def explored(true: Profile, rng: np.random.Generator) -> Profile:
    """The profile an exploration of ``true`` could write: values off by :data:`FIT_ERROR`, spreads recorded."""
    st = []
    for s in true.stages:
        tpt = s.tpt * math.exp(rng.normal(0.0, FIT_ERROR))
        bw = max(tpt, s.bandwidth * math.exp(rng.normal(0.0, FIT_ERROR)))
        st.append(StageProfile(tpt, bw, tpt_spread=FIT_ERROR, bandwidth_spread=FIT_ERROR,
                               contention=s.contention, coherency=s.coherency))
    return true.replace(read=st[0], net=st[1], write=st[2], meta={"generator": "workflow-explored"})


def changed(true: Profile, kind: str, rng: np.random.Generator, steps: int = AB.STEPS) -> List[Tuple[int, Profile]]:
    """The ablation's held-out changes (see the module docstring) applied to ``true``."""
    m = true.max_threads
    if kind == "moving":
        neck = int(np.argmin(true.peak_capacities()))
        at = sorted(int(x) for x in rng.choice(np.arange(5, steps - 10), size=int(rng.integers(1, 3)), replace=False))
        out = []
        for a in at:
            neck = int(rng.choice([s for s in range(3) if s != neck]))
            rate = true.achievable_bps * math.exp(rng.uniform(math.log(0.5), math.log(2.0)))
            st = AB._stages(rng, m, rate, [neck])
            out.append((a, true.replace(read=st[0], net=st[1], write=st[2])))
        return out
    a = int(rng.integers(5, steps - 25))
    b = a + int(rng.integers(8, 21))
    return [(a, true.replace(net=network_change(true, kind, rng, drop=(0.25, 0.6), connections=(4, 33)))), (b, true)]


def run_path(case: Any, out_dir: str, timesteps: Optional[int], paths_seed: int = SEED, seed: int = 0
             ) -> List[Dict[str, Any]]:
    """Train a file for one held-out path's explored profile (training seed ``seed``), then score
    it and the default; ``paths_seed`` (the held-out paths' seed) also draws the fit's error and
    the changes."""
    from automdt.agents.neighbourhood import run_episode
    from automdt.agents.registry import make_policy
    from automdt.agents.tuned_training import train_tuned

    rng = np.random.default_rng([paths_seed, zlib.crc32(case.name.encode())])
    true = case.profile
    prof = explored(true, rng)
    path = os.path.join(out_dir, f"{case.name}.zip")
    t0 = time.monotonic()
    if os.path.exists(path):  # --policies DIR of an earlier run: score that file again, untrained
        from automdt.agents.tuned import load_tuned

        meta = load_tuned(path).metadata
        training = meta.get("training") or {}
        learned, steps, train_s = str(meta["learned"]), training.get("timesteps"), float(training.get("wall_s", 0.0))
    else:
        rep = train_tuned(prof, path, timesteps=timesteps, seed=seed)
        learned, steps, train_s = rep.learned, rep.timesteps, time.monotonic() - t0
    runs: List[Tuple[str, Episode]] = [("explored", Episode("explored", true, [], case.chunk_bytes))]
    for kind in CHANGES:
        for i in range(CHANGES_PER_PATH):
            runs.append((kind, Episode(kind, true, changed(true, kind, rng), case.chunk_bytes)))
    rows = []
    for label, spec in (("trained", path), ("default", "default")):
        for j, (kind, ep) in enumerate(runs):
            for r in range(REPS):
                fr = run_episode(make_policy(spec, true.max_threads), ep, seed=97 * j + r)
                rows.append({"path": case.name, "family": case.family, "run": kind, "index": j, "rep": r,
                             "controller": label, "whole": float(np.mean(fr)),
                             "scored": float(np.mean(fr[AB.SCORE_FROM:])), "first": float(fr[0])})
    for row in rows:
        row.update(learned=learned, train_s=round(train_s, 1), timesteps=steps)
    return rows


def summarize(rows: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Per run kind (``explored``, the changes, ``changed`` over them) and family: the trained
    file's and the default's mean whole-episode fraction, the paired difference with a bootstrap
    interval over paths, and the worst path's difference."""
    def per_path(kinds: Sequence[str], fams: Sequence[str], label: str) -> Dict[str, float]:
        acc: Dict[str, List[float]] = {}
        for r in rows:
            if r["run"] in kinds and r["family"] in fams and r["controller"] == label:
                acc.setdefault(r["path"], []).append(r["whole"])
        return {p: float(np.mean(v)) for p, v in acc.items()}

    out: Dict[str, Any] = {}
    fams_all = [f for f in FAMILIES if any(r["family"] == f for r in rows)]
    for kinds_name, kinds in (("explored", ["explored"]), ("changed", list(CHANGES)),
                              *((c, [c]) for c in CHANGES)):
        out[kinds_name] = {}
        for fam in [*fams_all, "all"]:
            fams = fams_all if fam == "all" else [fam]
            a, b = per_path(kinds, fams, "trained"), per_path(kinds, fams, "default")
            common = sorted(set(a) & set(b))
            if not common:
                continue
            d = np.array([a[p] - b[p] for p in common])
            out[kinds_name][fam] = {"n": len(common), "trained": float(np.mean([a[p] for p in common])),
                                    "default": float(np.mean([b[p] for p in common])), "diff": float(d.mean()),
                                    "diff_ci": AB.bootstrap(d, np.mean), "worst_diff": float(d.min())}
    learned: Dict[str, int] = {}
    for p in {r["path"]: r["learned"] for r in rows}.values():
        learned[p] = learned.get(p, 0) + 1
    out["learned"] = learned
    out["train_s_median"] = float(np.median([r["train_s"] for r in {r["path"]: r for r in rows}.values()]))
    return out


def tables(path: str) -> str:
    """Markdown tables of a ``workflow-sim.json`` results file."""
    with open(path) as f:
        data = json.load(f)
    s, c = data["summary"], data["config"]
    lines = [f"Workflow in the simulator: {c['paths']} held-out paths (seed {c['seed']}), each explored with a "
             f"{c['fit_error']:.0%} fit error, trained with `automdt train --profile` defaults (median "
             f"{s['train_s_median']:.0f} s), run under the shield beside the default, {c['reps']} noise draws; "
             f"{c['date']}, commit {c['commit']}. Fraction of the oracle (delivered utility) over whole episodes; "
             f"difference [95% CI] "
             f"over paths. Learned part written: "
             + ", ".join(f"{k} {v}" for k, v in sorted(s["learned"].items())) + ".", ""]
    targets = [("explored", "all", 0.03, "trained >= default + 0.03 on the path as explored"),
               ("changed", "all", -0.005, "trained >= default - 0.005 when the path changes")]
    lines += ["| target | met | measured |", "|---|---|---|"]
    for kind, fam, margin, text in targets:
        e = s.get(kind, {}).get(fam)
        if e:
            lines.append(f"| {text} | {'yes' if e['diff'] >= margin else 'no'} | {e['trained']:.3f} vs "
                         f"{e['default']:.3f} ({e['diff']:+.3f}) |")
    lines += ["", "| run | family | paths | trained | default | difference [95% CI] | worst path |", "|---|---|---|---|---|---|---|"]
    for kind, fams in s.items():
        if not isinstance(fams, dict) or kind == "learned":
            continue
        for fam, e in fams.items():
            lines.append(f"| {kind} | {fam} | {e['n']} | {e['trained']:.3f} | {e['default']:.3f} | {e['diff']:+.3f} "
                         f"[{e['diff_ci'][0]:+.3f}, {e['diff_ci'][1]:+.3f}] | {e['worst_diff']:+.3f} |")
    return "\n".join(lines) + "\n"


def _one(job: Tuple[Any, str, Optional[int], int]) -> List[Dict[str, Any]]:
    return run_path(*job)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--per-family", type=int, default=3, help="held-out paths per family (default 3: 12 paths)")
    p.add_argument("--timesteps", type=int, default=None, help="training budget per path (default: train's)")
    p.add_argument("--workers", type=int, default=2, help="paths trained at once (default 2)")
    p.add_argument("--out", default="runs", help="parent directory of the run directory (default runs)")
    p.add_argument("--seed", type=int, default=SEED, help=f"seed of the held-out paths (default {SEED}; another "
                   "seed draws a fresh set, to confirm a change chosen on this one)")
    p.add_argument("--policies", metavar="DIR", help="keep the trained files in DIR; a path whose file is there "
                   "already is scored with it, not trained again (a change of a rule at run time, measured on the "
                   "same files, without training's noise)")


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m automdt.experiments workflow", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    a = p.parse_args(argv)
    out_dir = os.path.join(a.out, "workflow-" + time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out_dir, exist_ok=True)
    cases = AB.held_out_cases(a.per_family, seed=a.seed, families=FAMILIES)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        if a.policies:
            os.makedirs(a.policies, exist_ok=True)
        jobs = [(c, a.policies or tmp, a.timesteps, a.seed) for c in cases]
        if a.workers <= 1:
            rows = [r for j in jobs for r in _one(j)]
        else:
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(a.workers) as pool:
                rows = [r for out in pool.map(_one, jobs) for r in out]
    config = {"paths": len(cases), "seed": a.seed, "families": list(FAMILIES), "changes": list(CHANGES),
              "fit_error": FIT_ERROR, "reps": REPS, "timesteps": a.timesteps, "policies": a.policies, "date": time.strftime("%Y-%m-%d"),
              "commit": AB._commit(), "seconds": round(time.monotonic() - t0, 1)}
    path = os.path.join(out_dir, "workflow-sim.json")
    with open(path, "w") as f:
        json.dump({"config": config, "summary": summarize(rows), "rows": rows}, f, indent=1)
    print(tables(path))
    print(f"workflow: {out_dir}")
    return 0


# ---------------------------------------------------------------------------------- the engine
EXPLORE_S = 30.0
"""Seconds of ``automdt explore`` on each engine path (an operator's short exploration, ``--duration 30``)."""
PREDICT_STEPS = 30
"""Intervals of ``automdt simulate`` per controller on the explored profile."""


def explore_and_train_engine(ep: Any, ps: Any, opts: Any, rd: Any, controllers: Sequence[Tuple[str, str]]
                             ) -> Dict[str, Any]:
    """On an engine path of :mod:`automdt.experiments.ablation_engine` (set up in ``ps``): explore it
    as its first phase for ``opts.explore_s`` seconds, train a file with ``automdt train --profile``
    defaults, and record what the simulator predicts on the explored profile for the file and every
    controller. Returns the record; ``policy`` is the trained file (absent when a step failed)."""
    from automdt.agents.registry import make_policy
    from automdt.agents.tuned_training import train_tuned
    from automdt.simulator.oracle import evaluate_policy_in_sim
    from automdt.simulator.profile import Profile

    os.makedirs(rd.file("profiles"), exist_ok=True)
    os.makedirs(rd.file("policies"), exist_ok=True)
    prof_path = rd.file(f"profiles/{ep.name}.yaml")
    sched = ep.scenario.schedule()
    r = ps.run("explore", "explore", mode="explore", duration_s=float(opts.explore_s), rounds=True,
               profile_out=prof_path, schedule=sched[:1] if sched else None)
    if r.error or not os.path.exists(prof_path):
        return {"error": f"exploration failed: {r.error or 'no profile'}"}
    prof = Profile.load(prof_path)
    out: Dict[str, Any] = {"explore": {"intervals": len(r.rows), "seconds": round(r.wall_s, 1),
                                       "profile": f"profiles/{ep.name}.yaml",
                                       "achievable_bps": prof.achievable_bps}}
    pol = rd.file(f"policies/{ep.name}.zip")
    t0 = time.monotonic()
    rep = train_tuned(prof, pol, seed=opts.seed, profile_path=prof_path)
    out["train"] = {"seconds": round(time.monotonic() - t0, 1), "timesteps": rep.timesteps, "learned": rep.learned,
                    "validation": rep.meta["validation"]["scores"]}
    out["policy"] = pol
    out["predicted"] = {}
    for lab, spec in [*controllers, ("trained", pol)]:
        try:
            p = make_policy("default" if spec == "default" else spec, prof.max_threads)
        except (ValueError, ImportError, TypeError):
            continue
        traj = evaluate_policy_in_sim(p, prof, steps=PREDICT_STEPS, seed=0)
        out["predicted"][lab] = {"fraction_of_oracle": round(float(traj.fraction_of_oracle), 4),
                                 "throughput_bps": float(traj.mean_throughput_bps)}
    opts.log(f"    explored {len(r.rows)} intervals ({prof.achievable_bps / 1e6:.1f} MB/s achievable in the fit); "
             f"trained in {out['train']['seconds']:.0f} s: learned {rep.learned}")
    return out


def engine_workflow_tables(json_path: str) -> str:
    """The workflow table of an engine ablation run with ``--trained``: per path the trained file's
    and the default's median completion, their ratio, the trained file's first interval against
    the achievable rate, and the simulator's predictions on the explored profile."""
    with open(json_path) as f:
        doc = json.load(f)
    lines = ["| path | default (s) | trained (s) | trained / default | trained: intervals to 90% of achievable | "
             "learned | predicted on the explored profile: default / trained (fraction of its oracle) |",
             "|---|---|---|---|---|---|---|"]
    worst = 0.0
    by = {(d["path"], d["controller"]): d for d in doc.get("summary") or []}
    for name, info in doc.get("paths", {}).items():
        wf = info.get("workflow") or {}
        med = {lab: d for (p, lab), d in by.items() if p == name}
        d, t = (med.get("default") or {}).get("completion_s"), (med.get("trained") or {}).get("completion_s")
        if d is None or t is None:
            lines.append(f"| {name} | {d} | {t} | - | - | {wf.get('error', '')} | |")
            continue
        worst = max(worst, t / d)
        first = (med.get("trained") or {}).get("to90_start_intervals")
        pred = wf.get("predicted", {})
        pd_, pt = (pred.get("default") or {}).get("fraction_of_oracle"), (pred.get("trained") or {}).get("fraction_of_oracle")
        lines.append(f"| {name} | {d:.1f} | {t:.1f} | {t / d:.3f} | {'-' if first is None else f'{first:g}'} | "
                     f"{wf.get('train', {}).get('learned', '-')} | {pd_} / {pt} |")
    lines.append("")
    lines.append(f"Target: trained at most 1.03x the default on every path: {'met' if worst <= 1.03 else 'missed'} "
                 f"(worst {worst:.3f}).")
    return "\n".join(lines) + "\n"
