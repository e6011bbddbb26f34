"""Sweeps: Optuna studies over PPO and reward settings, and scenario x policy x seed grids
through submitit.

``automdt tune`` (= ``python -m automdt.experiments tune``) runs trials of an Optuna study in the
simulator: each trial trains PPO (:func:`automdt.agents.training.train`) with sampled
hyperparameters and reward shaping for ``--timesteps`` steps and scores the best network as its
fraction of the oracle's utility (maximised). The study lives in ``--storage``: an SQLite (or any
SQLAlchemy) URL such as ``sqlite:///sweep.db``, or Optuna's journal file (``journal:PATH``, or a
path ending in ``.log``/``.journal``), which needs no database server and works on a shared
file system. Any number of processes or nodes started with the same ``--storage`` and
``--study-name`` work on one study, as rl-zoo3 does; trials report every evaluation so a
median pruner stops hopeless ones early.

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
from typing import Any, Dict, List, Optional, Sequence, Tuple

from automdt import errors
from automdt.errors import AutomdtError

SEARCH_SPACE_VERSION = 1
"""Recorded in the study; bump when :func:`suggest_config` changes what it samples."""


def _need(module: str) -> Any:
    """Import an optional dependency of the ``sweeps`` extra, or exit 2 saying how to get it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise AutomdtError(f"this needs {module.split('.')[0]} (pip install 'automdt[sweeps]'; `make setup` "
                           f"installs it)", errors.USAGE) from None


# ----------------------------------------------------------------------------------- storage
def open_storage(url: str) -> Any:
    """An Optuna storage for ``url`` (see the module docstring); AutomdtError(2) if it cannot be used."""
    optuna = _need("optuna")
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    if not url or not url.strip():
        raise AutomdtError("--storage: empty storage URL", errors.USAGE)
    url = url.strip()
    try:
        if url.startswith("journal:") or (("://" not in url) and url.endswith((".log", ".journal"))):
            path = url[len("journal:"):] if url.startswith("journal:") else url
            d = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(d):
                raise AutomdtError(f"--storage {url}: directory {d} does not exist", errors.USAGE)
            return JournalStorage(JournalFileBackend(path))
        if "://" not in url:
            raise AutomdtError(f"--storage {url}: expected a database URL (sqlite:///sweep.db) or journal:PATH",
                               errors.USAGE)
        if url.startswith("sqlite:///"):
            d = os.path.dirname(os.path.abspath(url[len("sqlite:///"):]))
            if not os.path.isdir(d):
                raise AutomdtError(f"--storage {url}: directory {d} does not exist", errors.USAGE)
        # several processes share an SQLite file: wait for its lock instead of failing at once
        kw = {"connect_args": {"timeout": 60}} if url.startswith("sqlite:") else {"pool_pre_ping": True}
        for attempt in range(10):
            try:
                return optuna.storages.RDBStorage(url, engine_kwargs=kw)
            except Exception as e:
                # two processes creating a new database's tables at once: the loser sees
                # "already exists" (or a lock); the schema is there a moment later
                text = str(e)
                racing = ("already exists", "locked", "UNIQUE constraint", "Duplicate")
                if attempt == 9 or not any(x in text for x in racing):
                    raise
                time.sleep(0.2 + 0.1 * attempt)
    except AutomdtError:
        raise
    except Exception as e:  # driver missing, host unreachable, bad URL: one line, exit 2
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise AutomdtError(f"--storage {url}: cannot open the study storage: {type(e).__name__}: {first[:200]}",
                           errors.USAGE) from None


# ----------------------------------------------------------------------------------- tuning
def suggest_config(trial: Any) -> Tuple[Any, Dict[str, Any]]:
    """PPO hyperparameters and training-reward settings for one trial (rl-zoo3-like ranges)."""
    from automdt.agents.training import PPOConfig

    arch = trial.suggest_categorical("net_arch", ["32x32", "64x64", "128x128"])
    cfg = PPOConfig(
        learning_rate=trial.suggest_float("learning_rate", 1e-4, 3e-3, log=True),
        n_steps=trial.suggest_categorical("n_steps", [16, 32, 64]),
        batch_size=trial.suggest_categorical("batch_size", [256, 512, 1024]),
        n_epochs=trial.suggest_int("n_epochs", 3, 10),
        gamma=trial.suggest_float("gamma", 0.85, 0.99),
        gae_lambda=trial.suggest_float("gae_lambda", 0.8, 0.98),
        clip_range=trial.suggest_categorical("clip_range", [0.1, 0.2, 0.3]),
        ent_coef=trial.suggest_float("ent_coef", 1e-4, 5e-2, log=True),
        net_arch=tuple(int(x) for x in arch.split("x")),
        reward=trial.suggest_categorical("reward", ["measured", "steady"]),
        reward_k=trial.suggest_float("reward_k", 1.02, 1.12),
        surplus_penalty=trial.suggest_float("surplus_penalty", 0.0, 0.05),
        change_penalty=trial.suggest_float("change_penalty", 0.0, 0.02),
    )
    return cfg, dict(trial.params)


def _objective(args: argparse.Namespace, profile: Any, workdir: str):
    import socket

    import optuna

    from automdt.agents.training import train

    def objective(trial: Any) -> float:
        cfg, _ = suggest_config(trial)
        trial.set_user_attr("host", socket.gethostname())
        trial.set_user_attr("pid", os.getpid())

        def report(ts: int, frac: float) -> bool:
            trial.report(frac, ts)
            return bool(trial.should_prune())

        out = os.path.join(args.keep or workdir, f"{args.study_name}-trial{trial.number}.zip")
        rep = train(profile, out, timesteps=args.timesteps, seed=args.seed + trial.number, k=args.k,
                    random_profiles=args.random_profiles, progress=False, target_fraction=None,
                    config=cfg, eval_hook=report, max_seconds=args.trial_seconds)
        trial.set_user_attr("timesteps", rep.timesteps)
        trial.set_user_attr("wall_s", round(rep.wall_s, 2))
        trial.set_user_attr("min_fraction_of_oracle", round(float(rep.metadata.get("min_fraction_of_oracle", 0)), 4))
        if args.keep:
            trial.set_user_attr("policy", str(rep.model_path))
        if rep.stop_reason == "hook":
            raise optuna.TrialPruned(f"pruned at {rep.curve[-1].timesteps} steps")
        return float(rep.fraction_of_oracle)

    return objective


def tune(args: argparse.Namespace) -> Dict[str, Any]:
    """Run ``args.trials`` trials of the study; returns a JSON-able summary of the whole study."""
    import shutil
    import tempfile

    optuna = _need("optuna")

    if args.trials < 1 or args.timesteps < 1:
        raise AutomdtError("--trials and --timesteps must be at least 1", errors.USAGE)
    if not args.study_name or not args.study_name.strip():
        raise AutomdtError("--study-name must not be empty", errors.USAGE)
    if args.keep and not os.path.isdir(args.keep):
        raise AutomdtError(f"--keep {args.keep}: not a directory", errors.USAGE)
    profile = _profile(args)
    storage = open_storage(args.storage)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=args.sampler_seed, n_startup_trials=args.startup_trials)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=args.startup_trials, n_warmup_steps=1)
    try:
        study = optuna.create_study(study_name=args.study_name, storage=storage, direction="maximize",
                                    sampler=sampler, pruner=pruner, load_if_exists=True)
    except Exception as e:
        raise AutomdtError(f"--storage {args.storage}: cannot open study {args.study_name!r}: "
                           f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}", errors.USAGE) from None
    if study.directions[0] != optuna.study.StudyDirection.MAXIMIZE:
        raise AutomdtError(f"study {args.study_name!r} exists and minimises; use another --study-name", errors.USAGE)
    if "search_space_version" not in study.user_attrs:
        study.set_user_attr("search_space_version", SEARCH_SPACE_VERSION)
        study.set_user_attr("objective", "fraction of the oracle's utility (k=%g) of the best network" % args.k)
    workdir = tempfile.mkdtemp(prefix="amdt-tune-")
    t0 = time.monotonic()
    mine: List[int] = []
    try:
        study.optimize(_objective(args, profile, workdir), n_trials=args.trials, timeout=args.timeout,
                       callbacks=[lambda st, tr: mine.append(tr.number)], gc_after_trial=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    out: Dict[str, Any] = {
        "study_name": args.study_name, "storage": args.storage, "trials_this_process": len(mine),
        "trial_numbers_this_process": mine, "trials_total": len(trials), "trials_complete": len(complete),
        "trials_pruned": sum(t.state == optuna.trial.TrialState.PRUNED for t in trials),
        "seconds": round(time.monotonic() - t0, 1),
    }
    if complete:
        best = study.best_trial
        out.update(best_trial=best.number, best_value=round(float(best.value), 4), best_params=best.params)
    return out


def _profile(args: argparse.Namespace) -> Any:
    from automdt.simulator.profile import Profile, ProfileError

    if getattr(args, "profile", None):
        try:
            return Profile.load(args.profile)
        except FileNotFoundError:
            raise AutomdtError(f"{args.profile}: profile not found", errors.USAGE) from None
        except ProfileError as e:
            raise AutomdtError(str(e), errors.USAGE) from None
    return Profile.default()


def add_tune_arguments(p: argparse.ArgumentParser) -> None:
    from automdt import cli_args as A

    p.add_argument("--storage", required=True, metavar="URL", type=A.nonempty,
                   help="study storage shared by every process: sqlite:///sweep.db (or another SQLAlchemy URL), "
                        "or journal:PATH (Optuna's journal file, no server)")
    p.add_argument("--study-name", required=True, metavar="NAME", type=A.nonempty,
                   help="the study (created if missing)")
    p.add_argument("--trials", type=A.integer(1), default=10, help="trials this process runs (default 10)")
    p.add_argument("--timesteps", type=A.integer(1), default=50_000, help="training steps per trial (default 50000)")
    p.add_argument("--profile", metavar="PROFILE.yaml", type=A.nonempty,
                   help="path profile to train and score on (default: built-in)")
    p.add_argument("--random-profiles", action="store_true", help="train on randomised profiles, score on held-out ones")
    p.add_argument("--k", type=A.number(1.0, 2.0, what="a utility base"), default=1.02,
                   help="utility base per thread of the score, 1..2 (default 1.02)")
    p.add_argument("--seed", type=A.integer(0), default=0, help="training seed of trial 0 (trial n uses seed + n)")
    p.add_argument("--sampler-seed", type=A.integer(0), default=None,
                   help="seed of this process's TPE sampler (default: random, so processes explore differently)")
    p.add_argument("--startup-trials", type=A.integer(0), default=4, help="random trials before TPE and pruning (default 4)")
    p.add_argument("--timeout", type=A.seconds(), default=None, metavar="SECONDS", help="stop starting trials after this long")
    p.add_argument("--trial-seconds", type=A.seconds(), default=None, metavar="SECONDS", help="wall-time cap of one trial")
    p.add_argument("--keep", metavar="DIR", type=A.nonempty, help="keep every trial's policy zip in DIR (an existing directory)")
    p.add_argument("--json", action="store_true", help="print the study summary as JSON")


def print_tune(out: Dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(out))
        return
    print(f"study {out['study_name']}: {out['trials_this_process']} trials here, {out['trials_total']} in the study "
          f"({out['trials_complete']} complete, {out['trials_pruned']} pruned) in {out['seconds']} s")
    if "best_trial" in out:
        print(f"best: trial {out['best_trial']}, {out['best_value']:.1%} of the oracle, {json.dumps(out['best_params'])}")


# ------------------------------------------------------------------------------------- grids
def run_cell(scenario: str, policy: str, seed: int, steps: int = 60, k: float = 1.02, noise: float = 0.03
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
         executor: str = "auto", parallel: int = 2, steps: int = 60, k: float = 1.02,
         timeout_min: int = 30) -> List[Dict[str, Any]]:
    """Run every (scenario, policy, seed) through submitit; write grid.csv, results.md, config.json."""
    import csv
    import shutil

    submitit = _need("submitit")

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
    cluster = executor
    if executor == "auto":  # Slurm when a controller answers (sbatch alone may be an unconfigured install)
        import subprocess

        try:
            up = shutil.which("sinfo") is not None and subprocess.run(
                ["sinfo", "-h"], capture_output=True, timeout=15).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            up = False
        cluster = "slurm" if up else "local"
    if cluster == "slurm" and shutil.which("sbatch") is None:
        raise AutomdtError("--executor slurm: sbatch not found (use local or auto)", errors.USAGE)
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
    with open(os.path.join(out_dir, "grid.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(results[0]))
        w.writeheader()
        w.writerows(results)
    lines = [f"# grid: {len(cells)} cells through submitit ({ex.cluster} executor) in {wall:.1f} s", "",
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
                   "k": k, "executor": ex.cluster, "parallel": parallel, "seconds": round(wall, 2),
                   "rerun": ["python", "-m", "automdt.experiments", "grid", "--scenarios", ",".join(scenarios),
                             "--policies", ",".join(policies), "--seeds", ",".join(map(str, seeds)),
                             "--steps", str(steps)]}, f, indent=2)
    return results


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
