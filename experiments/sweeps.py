"""Sweeps: Optuna studies over PPO and reward settings, and scenario x policy x seed grids
through submitit.

``python -m automdt.experiments tune`` is ``automdt tune`` (:mod:`automdt.tune`, part of the
installed package, re-exported here).

``python -m automdt.experiments grid`` runs every (scenario, policy, seed) cell in the simulator
as a submitit job: its local executor (separate processes) here, Slurm where a controller answers ``sinfo``
(``--executor auto``), so a grid runs side by side instead of one cell after another. Results:
``grid.csv``, ``results.md`` and ``config.json`` in the run directory.

Exit codes: 0 done; 2 bad option, or a storage that cannot be opened (unreachable, missing
directory, missing database driver); 1 a grid job failed or could not be submitted.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from automdt import errors
from automdt.policy_contract import K_DEFAULT
from automdt.errors import AutomdtError
from automdt.lazy import need
from automdt.tune import (  # noqa: F401  (re-exported: their old home)
    SEARCH_SPACE_VERSION, add_tune_arguments, open_storage, print_tune, suggest_config, tune)

# ------------------------------------------------------------------------------------- grids
def run_cell(scenario: str, policy: str, seed: int, steps: int = 60, k: float = K_DEFAULT, noise: float = 0.03
             ) -> Dict[str, Any]:
    """One grid cell in the simulator (a submitit job: module-level, picklable arguments)."""
    import socket

    from automdt.agents.registry import make_policy
    from automdt.experiments.scenarios import SCENARIOS
    from automdt.simulator.oracle import evaluate_policy_in_sim

    t0 = time.monotonic()
    sc = SCENARIOS[scenario]
    prof = sc.profile(noise=noise)
    kw = {"profile": prof} if policy == "oracle" else {}
    pol = make_policy(policy, max_threads=prof.max_threads, **kw)
    traj = evaluate_policy_in_sim(pol, prof, steps=steps, seed=seed, k=k)
    return {"scenario": scenario, "policy": policy, "seed": seed,
            "fraction_of_oracle": round(float(traj.fraction_of_oracle), 4),
            "throughput_MBps": round(float(traj.mean_throughput_bps) / 1e6, 2),
            "settled_threads": "%d,%d,%d" % tuple(int(x) for x in traj.settled_threads),
            "oracle_threads": "%d,%d,%d" % tuple(int(x) for x in traj.oracle.threads),
            "seconds": round(time.monotonic() - t0, 2), "host": socket.gethostname(), "pid": os.getpid()}


def grid(scenarios: Sequence[str], policies: Sequence[str], seeds: Sequence[int], out_dir: str,
         executor: str = "auto", parallel: int = 2, steps: int = 60, k: float = K_DEFAULT,
         timeout_min: int = 30) -> List[Dict[str, Any]]:
    """Run every (scenario, policy, seed) through submitit; write grid.csv, results.md, config.json."""
    submitit = need("submitit", "a grid")

    from automdt.experiments.scenarios import SCENARIOS

    bad = [s for s in scenarios if s not in SCENARIOS]
    if bad:
        raise AutomdtError(f"unknown scenario {bad[0]!r} (one of {', '.join(SCENARIOS)})", errors.USAGE)
    from automdt.agents.registry import make_policy

    for pol in policies:  # a typo fails here, in one line, not in N jobs
        try:
            make_policy(pol, max_threads=32, **({"profile": SCENARIOS[scenarios[0]].profile()} if pol == "oracle" else {}))
        except (ValueError, ImportError, FileNotFoundError) as e:
            raise AutomdtError(f"--policies: {str(e).splitlines()[0]}", errors.USAGE) from None
    if not scenarios or not policies or not seeds:
        raise AutomdtError("--scenarios, --policies and --seeds must not be empty", errors.USAGE)
    if executor not in ("auto", "local", "slurm", "debug"):
        raise AutomdtError(f"--executor {executor}: one of auto, local, slurm, debug", errors.USAGE)
    cluster = _cluster(executor)
    os.makedirs(out_dir, exist_ok=True)
    ex = submitit.AutoExecutor(folder=os.path.join(out_dir, "submitit", "%j"), cluster=cluster)
    ex.update_parameters(timeout_min=timeout_min, slurm_array_parallelism=parallel, name="automdt-grid")
    cells = [(s, p, int(seed)) for s in scenarios for p in policies for seed in seeds]
    results: List[Dict[str, Any]] = []
    t0 = time.monotonic()
    # Slurm limits concurrency itself (array parallelism); the local executor would start every
    # job at once, so it gets them in waves of `parallel`
    wave = len(cells) if ex.cluster == "slurm" else max(1, parallel)
    for i in range(0, len(cells), wave):
        part = cells[i:i + wave]
        try:
            jobs = ex.map_array(run_cell, [c[0] for c in part], [c[1] for c in part], [c[2] for c in part],
                                [steps] * len(part), [k] * len(part))
        except Exception as e:  # e.g. sbatch present but no Slurm controller answering
            first = (str(e).strip().splitlines() or [type(e).__name__])[-1][:200]
            raise AutomdtError(f"cannot submit the grid to the {ex.cluster} executor: {first} "
                               f"(--executor local runs it here)", errors.ERROR) from None
        for j in jobs:
            try:
                results.append(j.result())
            except Exception as e:  # submitit re-raises the job's error with its log paths
                raise AutomdtError(f"grid job {j.job_id} failed: {str(e).strip().splitlines()[-1][:200]} "
                                   f"(logs in {out_dir}/submitit/)", errors.ERROR) from None
    wall = time.monotonic() - t0
    _write_grid(out_dir, results, scenarios, policies, seeds, steps, k, ex.cluster, parallel, wall)
    return results


def _cluster(executor: str) -> str:
    """The submitit cluster for ``--executor`` (``auto``: Slurm when a controller answers, since
    ``sbatch`` alone may be an unconfigured install; else local)."""
    import shutil

    cluster = executor
    if executor == "auto":
        import subprocess

        try:
            up = shutil.which("sinfo") is not None and subprocess.run(
                ["sinfo", "-h"], capture_output=True, timeout=15).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            up = False
        cluster = "slurm" if up else "local"
    if cluster == "slurm" and shutil.which("sbatch") is None:
        raise AutomdtError("--executor slurm: sbatch not found (use local or auto)", errors.USAGE)
    return cluster


def _write_grid(out_dir: str, results: List[Dict[str, Any]], scenarios: Sequence[str], policies: Sequence[str],
                seeds: Sequence[int], steps: int, k: float, cluster: str, parallel: int, wall: float) -> None:
    """``grid.csv``, ``results.md`` (mean and minimum fraction of the oracle per scenario and
    policy) and ``config.json`` (with the command that reruns the grid)."""
    import csv

    cells = len(scenarios) * len(policies) * len(seeds)
    with open(os.path.join(out_dir, "grid.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(results[0]))
        w.writeheader()
        w.writerows(results)
    lines = [f"# grid: {cells} cells through submitit ({cluster} executor) in {wall:.1f} s", "",
             "| scenario | policy | mean fraction of the oracle | min | settled (seed 0) |", "|---|---|---|---|---|"]
    for s in scenarios:
        for p in policies:
            rows = [r for r in results if r["scenario"] == s and r["policy"] == p]
            fr = [r["fraction_of_oracle"] for r in rows]
            lines.append(f"| {s} | {p} | {sum(fr) / len(fr):.3f} | {min(fr):.3f} | {rows[0]['settled_threads']} |")
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump({"scenarios": list(scenarios), "policies": list(policies), "seeds": list(seeds), "steps": steps,
                   "k": k, "executor": cluster, "parallel": parallel, "seconds": round(wall, 2),
                   "rerun": ["python", "-m", "automdt.experiments", "grid", "--scenarios", ",".join(scenarios),
                             "--policies", ",".join(policies), "--seeds", ",".join(map(str, seeds)),
                             "--steps", str(steps)]}, f, indent=2)


# -------------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m automdt.experiments", description="Sweeps (Optuna) and grids (submitit).")
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser("tune", help="run trials of a shared Optuna study over PPO and reward settings")
    add_tune_arguments(t)
    g = sub.add_parser("grid", help="scenario x policy x seed in the simulator through submitit")
    g.add_argument("--scenarios", default="read-bound,net-bound,write-bound")
    g.add_argument("--policies", default="ppo,marlin,falcon,globus,heuristic,model")
    g.add_argument("--seeds", default="0,1,2")
    g.add_argument("--steps", type=int, default=60, help="control intervals per cell (default 60)")
    g.add_argument("--executor", default="auto",
                   help="auto (Slurm if a controller answers `sinfo`, else local), local, slurm, debug")
    g.add_argument("--parallel", type=int, default=os.cpu_count() or 2, help="cells at once (default: cores)")
    g.add_argument("--out", default=None, help="run directory (default runs/grid-<time>)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        if a.what == "tune":
            print_tune(tune(a), a.json)
            return 0
        try:
            seeds = [int(x) for x in a.seeds.split(",") if x.strip()]
        except ValueError:
            raise AutomdtError(f"--seeds {a.seeds}: expected integers like 0,1,2", errors.USAGE) from None
        out = a.out or os.path.join("runs", time.strftime("grid-%Y%m%d-%H%M%S"))
        from automdt.experiments.run import _policy_list

        rows = grid([x.strip() for x in a.scenarios.split(",") if x.strip()], _policy_list(a.policies), seeds, out,
                    a.executor, max(1, a.parallel), a.steps)
        print(f"grid: {len(rows)} cells; {out}/results.md")
        return 0
    except AutomdtError as e:
        print(f"automdt: {e.message}", file=sys.stderr)
        return e.code
