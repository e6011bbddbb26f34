"""``automdt tune``: trials of an Optuna study over PPO and reward settings in the simulator.

Each trial trains PPO (:func:`automdt.agents.training.train`) with sampled hyperparameters and
reward shaping for ``--timesteps`` steps and scores the best network as its fraction of the
oracle's utility (maximised). The study lives in ``--storage``: an SQLite (or any SQLAlchemy) URL
such as ``sqlite:///sweep.db``, or Optuna's journal file (``journal:PATH``, or a path ending in
``.log``/``.journal``), which needs no database server and works on a shared file system. Any
number of processes or nodes started with the same ``--storage`` and ``--study-name`` work on one
study, as rl-zoo3 does; trials report every evaluation so a median pruner stops hopeless ones
early.

It needs the ``train`` and ``sweeps`` extras (torch, stable-baselines3, gymnasium; optuna); the
command says which one is missing (exit 2). ``python -m automdt.experiments tune`` (a checkout)
is the same command.

Exit codes: 0 done; 2 bad option, or a storage that cannot be opened (unreachable, missing
directory, missing database driver).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any, Dict, List, Tuple

from automdt import errors
from automdt.policy_contract import K_DEFAULT
from automdt.errors import AutomdtError
from automdt.lazy import need

SEARCH_SPACE_VERSION = 1
"""Recorded in the study; bump when :func:`suggest_config` changes what it samples."""


# ----------------------------------------------------------------------------------- storage
def open_storage(url: str) -> Any:
    """An Optuna storage for ``url`` (see the module docstring); AutomdtError(2) if it cannot be used."""
    optuna = need("optuna", "tune")
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

    optuna = need("optuna", "tune")

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
        study.set_user_attr("objective", f"fraction of the oracle's utility (k={args.k:g}) of the best network")
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
    p.add_argument("--k", type=A.number(1.0, 2.0, what="a utility base"), default=K_DEFAULT,
                   help=f"utility base per thread of the score, 1..2 (default {K_DEFAULT:g})")
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
