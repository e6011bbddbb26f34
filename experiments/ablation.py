"""``python -m automdt.experiments ablation``: every controller on held-out paths, with intervals.

The simulator half runs each controller on cases drawn from :func:`held_out_cases`, a seeded
generator that training never uses (``automdt.agents`` does not import this module), in families:

==============  ====================================================================================
``static``      broad random paths: one stage limits, the others 1.3-8x faster
``two-stage``   two stages limit at once (bandwidths within 3%)
``contention``  one or two stages whose capacity peaks and falls with more threads (USL sigma, kappa)
``noise``       measurement noise of 12-30% (relative std per interval)
``moving``      the bottleneck moves to another stage once or twice mid-transfer
``link``        the network's bandwidth drops to 25-60% and recovers
``competing``   another transfer with 4-32 connections shares the network stage for a while
==============  ====================================================================================

Every case also draws its staging buffers (32 MiB to 1 GiB each), thread bound (8, 16, 32 or 64),
control interval (0.5-3 s), chunk size (1 or 4 MiB: the engine's counters count whole chunks) and,
outside ``noise``, a noise level of 1-5%. An episode has :data:`STEPS` intervals; changes fall in
``[SCORE_FROM, STEPS - 10)``.

Scores: the **fraction of the oracle** of a run is its utility summed over the scored intervals
``[SCORE_FROM, STEPS)`` over the oracle's utility in force in each of them (the steady-state optimum
of the path at that moment); ``whole`` counts every interval from the first. **Recovery**: intervals
after a change until the delivered rate is back to 90% of the new oracle's rate. **Below half**:
scored intervals delivering less than half of the oracle's rate. Per family and controller the
tables give the mean, 5th percentile and worst over cases (each case the mean of its repetitions),
with bootstrap 95% intervals over cases, and the paired difference to the model-based controller.

With the ``competing`` family, the simulator half also runs :mod:`automdt.experiments.shared_link`:
the competing transfers as controllers of their own (N jobs on one link, with and without the
receiver's connection share), written beside the tables as ``shared-link.md``.

The engine half is :mod:`automdt.experiments.ablation_engine`.
"""
from __future__ import annotations

import json
import math
import os
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

from automdt.agents.families import profile_at
from automdt.policy_contract import STAGES
from automdt.simulator.profile import Profile, StageProfile, capacity_array
from automdt.simulator.oracle import oracle

FAMILIES = ("static", "two-stage", "contention", "noise", "moving", "link", "competing")
MODEL_WRONG = ("noise", "contention", "moving", "link", "competing")
"""Families where the model-based controller's model (a static ``min(n tpt, B)`` path measured
once) is wrong."""
STEPS = 60
"""Intervals per episode."""
SCORE_FROM = 20
"""First scored interval: the cold start is over, changes fall after it."""
HELD_OUT_SEED = 20_261_127
"""Seed of the held-out generator (training draws its own paths from other generators)."""
MiB = 2 ** 20
K = 1.02
DEFAULT_CONTROLLERS = ("default", "capacity", "ppo", "shield:ppo", "model", "shield:model", "marlin", "falcon",
                       "heuristic", "topdown", "best-static")
"""Every controller of the comparison: the default (``shield:capacity``) and its policy bare, the
shipped PPO network bare and shielded, the model-based controller bare and shielded, the papers'
baselines, adaptiSeq's top-down search and the best fixed triple of each path."""


@dataclass
class Case:
    """One held-out path: the profile it starts with and the changes at given intervals."""

    name: str
    family: str
    profile: Profile
    events: List[Tuple[int, Profile]] = field(default_factory=list)
    chunk_bytes: float = MiB
    steps: int = STEPS

    def profile_at(self, step: int) -> Profile:
        """The profile in force during interval ``step`` (0-based)."""
        return profile_at(self.profile, self.events, step)

    def describe(self) -> Dict[str, Any]:
        def stages(p: Profile) -> Dict[str, Any]:
            return {s: st.to_dict() for s, st in zip(STAGES, p.stages)}

        p = self.profile
        return {"name": self.name, "family": self.family, "max_threads": p.max_threads, "interval_s": p.interval_s,
                "buffers": [p.sender_buffer, p.receiver_buffer], "noise": p.noise, "chunk_bytes": self.chunk_bytes,
                "stages": stages(p), "events": [{"at": at, "stages": stages(q)} for at, q in self.events]}


# ---------------------------------------------------------------------------------- generator
def _logu(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _stages(rng: np.random.Generator, m: int, rate: float, limit: Sequence[int],
            faster: Tuple[float, float] = (1.3, 8.0)) -> List[StageProfile]:
    """Stages where those in ``limit`` cap at ``rate`` (bytes/s) and the others are faster; each
    stage needs between 1 and ``0.9 m`` threads to carry its bandwidth."""
    out = []
    for s in range(3):
        bw = rate * (rng.uniform(1.0, 1.03) if s in limit else _logu(rng, *faster))
        need = _logu(rng, 1.0, 0.9 * m)
        out.append(StageProfile(bw / need, bw))
    return out


def _profile(stages: Sequence[StageProfile], base: Profile) -> Profile:
    return base.replace(read=stages[0], net=stages[1], write=stages[2])


def _case(rng: np.random.Generator, family: str, index: int) -> Case:
    m = int(rng.choice([8, 16, 32, 64]))
    interval = _logu(rng, 0.5, 3.0)
    buffers = [int(_logu(rng, 32 * MiB, 1024 * MiB)) for _ in range(2)]
    noise = rng.uniform(0.12, 0.30) if family == "noise" else rng.uniform(0.01, 0.05)
    chunk = float(rng.choice([1, 4])) * MiB
    rate = _logu(rng, 40e6, 4e9)
    bottleneck = int(rng.integers(3))
    limit = [bottleneck]
    if family == "two-stage":
        limit.append(int(rng.choice([s for s in range(3) if s != bottleneck])))
    if family in ("link", "competing"):
        limit = [1] if rng.random() < 0.6 else limit
    st = _stages(rng, m, rate, limit)
    if family == "contention":
        for s in {bottleneck, int(rng.integers(3))}:
            peak = _logu(rng, 2.0, 0.8 * m)  # threads at the capacity's peak
            kappa = 1.0 / (peak * peak) * rng.uniform(0.3, 1.0)
            st[s] = StageProfile(st[s].tpt, st[s].bandwidth * 4.0, contention=rng.uniform(0.0, 0.1), coherency=kappa)
    base = Profile(read=st[0], net=st[1], write=st[2], sender_buffer=buffers[0], receiver_buffer=buffers[1],
                   interval_s=interval, max_threads=m, noise=noise, meta={"generator": "held-out", "family": family})
    events: List[Tuple[int, Profile]] = []
    if family == "moving":
        at = sorted(int(x) for x in rng.choice(np.arange(SCORE_FROM, STEPS - 10), size=int(rng.integers(1, 3)),
                                               replace=False))
        for a in at:
            bottleneck = int(rng.choice([s for s in range(3) if s != bottleneck]))
            events.append((a, _profile(_stages(rng, m, rate * _logu(rng, 0.5, 2.0), [bottleneck]), base)))
    elif family in ("link", "competing"):
        a = int(rng.integers(SCORE_FROM, STEPS - 25))
        b = a + int(rng.integers(8, 21))
        net = base.net
        if family == "link":
            changed = StageProfile(net.tpt, net.bandwidth * rng.uniform(0.25, 0.6))
        else:  # k connections of another transfer share the link: ours carry B n / (n + k)
            k = int(rng.integers(4, 33))
            changed = StageProfile(min(net.tpt, net.bandwidth / (k + 1)), net.bandwidth * m * 4, contention=1.0 / (k + 1))
        events = [(a, base.replace(net=changed)), (b, base)]
    return Case(f"{family}-{index:03d}", family, base, events, chunk)


def held_out_cases(per_family: int = 45, seed: int = HELD_OUT_SEED,
                   families: Sequence[str] = FAMILIES) -> List[Case]:
    """``per_family`` cases of each family, the same for the same seed (see the module docstring)."""
    cases = []
    for f in families:
        if f not in FAMILIES:
            raise ValueError(f"unknown family {f!r}; valid: {', '.join(FAMILIES)}")
        for i in range(per_family):
            cases.append(_case(np.random.default_rng([seed, FAMILIES.index(f), i]), f, i))
    return cases


# ---------------------------------------------------------------------------------- controllers
def best_static(case: Case) -> Tuple[int, int, int]:
    """The one triple with the most steady-state utility over the scored intervals of ``case``."""
    m = case.profile.max_threads
    n = np.arange(1, m + 1, dtype=np.float64)
    pen = np.power(K, -n)
    total = np.zeros((m, m, m))
    for step in range(SCORE_FROM, case.steps):
        p = case.profile_at(step)
        sig, kap = p.contention_arrays()
        caps = capacity_array(p.tpt_array()[:, None], p.bandwidth_array()[:, None], n[None, :], p.capacity_model,
                              None if sig is None else sig[:, None], None if kap is None else kap[:, None])
        t = np.minimum(np.minimum(caps[0][:, None, None], caps[1][None, :, None]), caps[2][None, None, :])
        total += (t / p.achievable_bps) * (pen[:, None, None] + pen[None, :, None] + pen[None, None, :])
    i = int(np.argmax(total))
    r, rest = divmod(i, m * m)
    a, b = divmod(rest, m)
    return (r + 1, a + 1, b + 1)


def make_controller(label: str, case: Case) -> Any:
    """The policy object for ``label`` on ``case`` (``default`` is what ``automdt transfer``
    runs with no ``--policy``; ``best-static`` the case's best fixed triple; ``residual`` the
    learned residual of :mod:`automdt.experiments.residual`)."""
    from automdt.agents.registry import make_policy
    from automdt.agents.static import StaticPolicy

    m = case.profile.max_threads
    if label in ("capacity-true", "oracle-lag1"):  # privileged: where the headroom is
        from automdt.experiments import headroom

        return headroom.make(label, case)
    if label.startswith("selector:"):  # a general selector file (experiments/selector.py), under the shield
        from automdt.agents.shield import Shield
        from automdt.experiments.selector import load

        return Shield(load(label.split(":", 1)[1], m), max_threads=m)
    if label.startswith("prober:"):  # a general prober file (experiments/prober.py), under the shield
        from automdt.agents.shield import Shield
        from automdt.experiments.prober import load as load_prober

        return Shield(load_prober(label.split(":", 1)[1], m), max_threads=m)
    if label == "residual":  # the learned residual on the capacity controller (experiments/residual.py)
        from automdt.experiments.residual import ResidualPolicy

        return ResidualPolicy(max_threads=m)
    if label == "best-static":
        return StaticPolicy(*best_static(case), name="best-static", max_threads=m)
    if label == "default":
        from automdt.agents.registry import DEFAULT_POLICY

        return make_policy(DEFAULT_POLICY, m)
    return make_policy(label, m)


# ---------------------------------------------------------------------------------- running
def run_case(case: Case, label: str, rep: int, factory: Callable[[str, Case], Any] = make_controller) -> Dict[str, Any]:
    """One episode of controller ``label`` on ``case`` (repetition ``rep`` draws other noise)."""
    from automdt.simulator.env import BufferSimEnv

    policy = factory(label, case)
    start = policy.reset(case.profile.max_threads, rep)
    env = BufferSimEnv(case.profile, k=K, episode_steps=case.steps, random_start=False, chunk_bytes=case.chunk_bytes)
    _, info = env.reset(seed=rep * 1_000_003 + zlib.crc32(case.name.encode()) % 1_000_003,
                        options={"threads": tuple(int(x) for x in start)})
    oracles: Dict[int, Any] = {}
    util, best, rate, ref, threads = [], [], [], [], []
    changes = [at for at, _ in case.events]
    for step in range(case.steps):
        triple = policy.act(info["observation"])
        for at, prof in case.events:
            if at == step:
                env.set_path(prof)
        p = case.profile_at(step)
        key = id(p)
        if key not in oracles:
            oracles[key] = oracle(p, K)
        _, _, _, _, info = env.step_threads(tuple(int(x) for x in triple))
        util.append(info["sim/utility"])
        best.append(oracles[key].utility)
        rate.append(info["sim/write/moved_bps"])
        ref.append(oracles[key].throughput_bps)
        threads.append(info["observation"].threads)
    util_a, best_a, rate_a, ref_a = map(np.asarray, (util, best, rate, ref))
    s = slice(SCORE_FROM, case.steps)
    recovery = []
    for at in changes:
        back = np.flatnonzero(rate_a[at:] >= 0.9 * ref_a[at:])
        recovery.append(int(back[0]) + 1 if back.size else None)
    th = np.asarray(threads, dtype=np.float64)
    return {"case": case.name, "family": case.family, "controller": label, "rep": rep,
            "fraction": float(util_a[s].sum() / best_a[s].sum()),
            "whole": float(util_a.sum() / best_a.sum()),
            "below_half": int((rate_a[s] < 0.5 * ref_a[s]).sum()),
            "recovery": recovery, "mean_threads": [round(float(x), 2) for x in th[s].mean(axis=0)],
            "max_threads": case.profile.max_threads}


def _run_chunk(job: Tuple[List[Case], Sequence[str], int]) -> List[Dict[str, Any]]:
    cases, labels, reps = job
    return [run_case(c, lab, rep) for c in cases for lab in labels for rep in range(reps)]


def run_sim(cases: Sequence[Case], labels: Sequence[str], reps: int = 2, workers: int = 2) -> List[Dict[str, Any]]:
    """Every controller on every case, ``reps`` times; rows as :func:`run_case` returns them."""
    chunks = [(list(cases[i:i + 8]), list(labels), reps) for i in range(0, len(cases), 8)]
    if workers <= 1:
        return [row for ch in chunks for row in _run_chunk(ch)]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers) as pool:
        return [row for out in pool.map(_run_chunk, chunks) for row in out]


# ---------------------------------------------------------------------------------- statistics
def _p5(x: np.ndarray) -> float:
    return float(np.percentile(x, 5))


def bootstrap(x: np.ndarray, stat: Callable[[np.ndarray], float], n: int = 2000, seed: int = 0) -> Tuple[float, float]:
    """The 95% percentile-bootstrap interval of ``stat`` over resamples of ``x``."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(n, len(x)))
    vals = np.array([stat(x[i]) for i in idx])
    return float(np.percentile(vals, 2.5)), float(np.percentile(vals, 97.5))


def per_case(rows: Sequence[Dict[str, Any]], key: str = "fraction") -> Dict[Tuple[str, str], Dict[str, float]]:
    """``{(family, controller): {case: mean of key over its repetitions}}``."""
    acc: Dict[Tuple[str, str], Dict[str, List[float]]] = {}
    for r in rows:
        acc.setdefault((r["family"], r["controller"]), {}).setdefault(r["case"], []).append(float(r[key]))
    return {k: {c: float(np.mean(v)) for c, v in d.items()} for k, d in acc.items()}


def summarize(rows: Sequence[Dict[str, Any]], reference: str = "model") -> Dict[str, Any]:
    """Per family (and ``all``) and controller: mean, 5th percentile, worst with intervals, the
    paired difference to ``reference``, recovery and below-half counts."""
    cases = per_case(rows)
    families = [f for f in FAMILIES if any(k[0] == f for k in cases)]
    labels = list(dict.fromkeys(r["controller"] for r in rows))
    out: Dict[str, Any] = {}
    for fam in [*families, "all"]:
        fams = families if fam == "all" else [fam]
        out[fam] = {}
        for lab in labels:
            vals = {f"{f}/{c}": v for f in fams for c, v in cases.get((f, lab), {}).items()}
            if not vals:
                continue
            x = np.array(list(vals.values()))
            entry = {"n": len(x), "mean": float(x.mean()), "mean_ci": bootstrap(x, np.mean),
                     "p5": _p5(x), "p5_ci": bootstrap(x, _p5), "worst": float(x.min())}
            ref = {f"{f}/{c}": v for f in fams for c, v in cases.get((f, reference), {}).items()}
            common = sorted(set(vals) & set(ref))
            if lab != reference and common:
                d = np.array([vals[c] - ref[c] for c in common])
                entry["diff_vs_" + reference] = float(d.mean())
                entry["diff_ci"] = bootstrap(d, np.mean)
            sel = [r for r in rows if r["controller"] == lab and r["family"] in fams]
            rec = [x for r in sel for x in r["recovery"]]
            if rec:
                entry["recovery_median"] = float(np.median([x if x is not None else STEPS for x in rec]))
                entry["recovery_within_3"] = float(np.mean([x is not None and x <= 3 for x in rec]))
            entry["below_half_mean"] = float(np.mean([r["below_half"] for r in sel]))
            entry["mean_threads"] = [round(float(v), 2) for v in np.mean([r["mean_threads"] for r in sel], axis=0)]
            out[fam][lab] = entry
    return out


def sim_tables(path: str) -> str:
    """Markdown tables of an ``ablation-sim.json`` results file (the docs include them)."""
    with open(path) as f:
        data = json.load(f)
    summ = data["summary"]
    lines = [f"Simulator ablation: {data['config']['cases']} held-out cases x {data['config']['reps']} repetitions, "
             f"{data['config']['date']}, commit {data['config']['commit']}. Fraction of the oracle over intervals "
             f"{SCORE_FROM}-{STEPS}: mean [95% CI] / 5th percentile [95% CI] / worst; difference to `model` "
             f"[95% CI]; recovery: median intervals back to 90% after a change (share within 3).", ""]
    targets = sim_targets(summ)
    if targets:
        lines += ["**Targets (`default`)**", "", "| target | met | measured |", "|---|---|---|"]
        lines += [f"| {t} | {'yes' if ok else 'no'} | {m} |" for t, ok, m in targets] + [""]
    for fam, entries in summ.items():
        lines += [f"**{fam}**", "", "| controller | mean | 5th pct | worst | vs model | recovery | below half |",
                  "|---|---|---|---|---|---|---|"]
        for lab, e in sorted(entries.items(), key=lambda kv: -kv[1]["mean"]):
            diff = (f"{e['diff_vs_model']:+.3f} [{e['diff_ci'][0]:+.3f}, {e['diff_ci'][1]:+.3f}]"
                    if "diff_vs_model" in e else "")
            rec = (f"{e['recovery_median']:.0f} ({e['recovery_within_3']:.0%})" if "recovery_median" in e else "")
            lines.append(f"| {lab} | {e['mean']:.3f} [{e['mean_ci'][0]:.3f}, {e['mean_ci'][1]:.3f}] | "
                         f"{e['p5']:.3f} [{e['p5_ci'][0]:.3f}, {e['p5_ci'][1]:.3f}] | {e['worst']:.3f} | {diff} | "
                         f"{rec} | {e['below_half_mean']:.1f} |")
        lines.append("")
    return "\n".join(lines)


def sim_targets(summary: Dict[str, Any], label: str = "default", reference: str = "model") -> List[Tuple[str, bool, str]]:
    """The simulator targets for ``label``: ``(target, met, measured)`` rows. The default reaches
    0.99 of the oracle on the mean over all families and 0.95 at the 5th percentile; on every
    family at least ``reference``'s mean; where the reference's model is wrong
    (:data:`MODEL_WRONG`), 0.03 above it with intervals that do not overlap."""
    out: List[Tuple[str, bool, str]] = []
    every = summary.get("all", {})
    if label not in every:
        return out
    e = every[label]
    out.append(("mean over all families >= 0.99", e["mean"] >= 0.99, f"{e['mean']:.3f}"))
    out.append(("5th percentile over all families >= 0.95", e["p5"] >= 0.95, f"{e['p5']:.3f}"))
    for fam, entries in summary.items():
        if fam == "all" or label not in entries or reference not in entries:
            continue
        me, ref = entries[label], entries[reference]
        out.append((f"{fam}: mean >= {reference}'s", me["mean"] >= ref["mean"], f"{me['mean']:.3f} vs {ref['mean']:.3f}"))
        if fam in MODEL_WRONG:
            ok = me["mean"] >= ref["mean"] + 0.03 and me["mean_ci"][0] > ref["mean_ci"][1]
            out.append((f"{fam}: mean >= {reference}'s + 0.03, intervals apart", ok,
                        f"{me['mean'] - ref['mean']:+.3f}; [{me['mean_ci'][0]:.3f}, {me['mean_ci'][1]:.3f}] vs "
                        f"[{ref['mean_ci'][0]:.3f}, {ref['mean_ci'][1]:.3f}]"))
    return out


def _commit() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)), check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_sim_results(out_dir: str, cases: Sequence[Case], rows: Sequence[Dict[str, Any]], reps: int,
                      seconds: float) -> str:
    """``ablation-sim.json`` (config, every row, the summary), ``ablation-sim.csv`` and
    ``ablation-sim.md`` in ``out_dir``; returns the JSON's path."""
    import csv

    os.makedirs(out_dir, exist_ok=True)
    config = {"cases": len(cases), "reps": reps, "steps": STEPS, "score_from": SCORE_FROM, "seed": HELD_OUT_SEED,
              "families": sorted({c.family for c in cases}, key=FAMILIES.index), "k": K,
              "date": time.strftime("%Y-%m-%d"), "commit": _commit(), "seconds": round(seconds, 1),
              "machine": f"{os.uname().sysname} {os.uname().machine}, {os.cpu_count()} cores"}
    path = os.path.join(out_dir, "ablation-sim.json")
    with open(path, "w") as f:
        json.dump({"config": config, "summary": summarize(rows), "rows": list(rows),
                   "cases": [c.describe() for c in cases]}, f, indent=1)
    with open(os.path.join(out_dir, "ablation-sim.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(out_dir, "ablation-sim.md"), "w") as f:
        f.write(sim_tables(path))
    return path


# ---------------------------------------------------------------------------------- command line
def build_parser() -> Any:
    """``python -m automdt.experiments ablation``'s options (the engine half adds its own)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m automdt.experiments ablation",
                                description="Every controller on held-out simulated paths (the simulator half) and on "
                                            "held-out engine paths (the engine half), with repetitions and intervals; "
                                            "results as JSON/CSV plus generated Markdown tables.")
    p.add_argument("--part", choices=("sim", "engine", "all"), default="sim",
                   help="which half to run (default sim: minutes; engine: about an hour, needs root for its "
                        "namespace, CPU-quota and disk paths)")
    p.add_argument("--out", default="runs", help="parent directory of the run directory (default runs)")
    p.add_argument("--controllers", default=",".join(DEFAULT_CONTROLLERS),
                   help="comma list of controllers: policy specs, default and best-static (default: %(default)s)")
    p.add_argument("--per-family", type=int, default=45, help="simulated cases per family (default 45: 315 cases)")
    p.add_argument("--families", default=",".join(FAMILIES), help="comma list of families (default: all)")
    p.add_argument("--reps", type=int, default=3, help="repetitions per case, other noise (default 3)")
    p.add_argument("--workers", type=int, default=max(1, min(4, os.cpu_count() or 1)),
                   help="simulator processes (default: up to 4 cores)")
    p.add_argument("--quick", action="store_true", help="2 cases per family, 1 repetition (a smoke run)")
    try:
        from automdt.experiments.ablation_engine import add_engine_arguments
    except ImportError:  # the engine half is not installed
        pass
    else:
        add_engine_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ablation; prints the run directory and the tables."""
    import signal
    import sys
    import threading

    a = build_parser().parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        # SIGTERM unwinds like Ctrl-C: the engine half's receivers, datasets and namespaces go
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    out_dir = os.path.join(a.out, "ablation-" + time.strftime("%Y%m%d-%H%M%S"))
    if a.part in ("sim", "all"):
        labels = [x.strip() for x in a.controllers.split(",") if x.strip()]
        from automdt.agents.registry import check_spec

        for lab in labels:
            if lab not in ("default", "best-static", "residual", "capacity-true", "oracle-lag1") \
                    and not lab.startswith(("selector:", "prober:")):
                try:
                    check_spec(lab)
                except ValueError as e:
                    print(f"ablation: {e}", file=sys.stderr)
                    return 2
        per, reps = (2, 1) if a.quick else (a.per_family, a.reps)
        cases = held_out_cases(per, families=[f.strip() for f in a.families.split(",") if f.strip()])
        t0 = time.monotonic()
        rows = run_sim(cases, labels, reps=reps, workers=a.workers)
        path = write_sim_results(out_dir, cases, rows, reps, time.monotonic() - t0)
        print(sim_tables(path))
        if "competing" in {c.family for c in cases}:  # the competing transfer, reacting: N jobs on one link
            from automdt.experiments import shared_link

            shared = shared_link.shared_cases(1 if a.quick else 12)
            t0 = time.monotonic()
            shared_rows = shared_link.run_all(shared, reps=1 if a.quick else 2)
            print(shared_link.write_results(out_dir, shared, shared_rows, 1 if a.quick else 2, time.monotonic() - t0))
    if a.part in ("engine", "all"):
        from automdt.experiments.ablation_engine import run_ablation_engine

        a.out_dir = out_dir
        run_ablation_engine(a)
    print(f"ablation: {out_dir}")
    return 0
