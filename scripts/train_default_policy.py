#!/usr/bin/env python3
"""Train the shipped default PPO policy: ``automdt/data/default_policy.zip`` and its ``.json``.

One command, from the repository root::

    .venv/bin/python scripts/train_default_policy.py

It trains one general policy over randomised path profiles (``random_profiles=True``: every
episode draws a new read-, network- or write-bound path from :meth:`Profile.random`, with 10%
jitter of the per-thread rates and bandwidths), with the engine's chunk effects in the simulator,
episodes that start cold, at random, or with a full sender buffer that the chosen threads may
drain, a fixed seed and a fixed timestep budget and no wall-clock stop, so the same command on the
same software stack gives the same network (``policy.pth`` and the numpy weights bit for bit).
It then scores the policy on hand-written read-, network- and write-bound paths it never saw
(:func:`automdt.agents.training.bottleneck_profiles`) and, with the engine's chunk effects, on the
paths issue 10 names (:func:`automdt.experiments.behaviour.sim_paths`: ramp, sustained share,
settling), prints the tables and records them in the metadata sidecar under ``held_out`` and
``behaviour``. About 15-25 minutes on two shared CPU cores.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "automdt" / "data" / "default_policy.zip"
SEED = 0
TIMESTEPS = 6_000_000


def default_config():
    """Hyperparameters of the shipped general policy (:func:`automdt.agents.training.shipped_config`,
    where the reasons for each line are; ``automdt train --profile`` fine-tunes with the same).
    ``main`` also keeps only networks from the last quarter of the budget (``train(select_from=0.75)``)."""
    from automdt.agents.training import shipped_config

    return shipped_config()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"policy file (default: {DEFAULT_OUT})")
    ap.add_argument("--timesteps", type=int, default=TIMESTEPS, help=f"training budget (default: {TIMESTEPS})")
    ap.add_argument("--seed", type=int, default=SEED, help=f"seed (default: {SEED})")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="also stop after this much wall time (the result then depends on the machine)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)

    from automdt.agents.ppo import PPOPolicy, policy_metadata, write_policy_metadata
    from automdt.agents.training import bottleneck_profiles, evaluate, train
    from automdt.simulator.profile import Profile

    t0 = time.perf_counter()
    rep = train(Profile.default(), args.out, timesteps=args.timesteps, seed=args.seed, random_profiles=True,
                randomize=0.1, target_fraction=None, max_seconds=args.max_seconds, select_from=0.75,
                progress=not args.no_progress, config=default_config())
    print(f"trained {rep.timesteps} timesteps in {rep.wall_s:.0f} s ({rep.stop_reason}); best network at "
          f"{rep.best_timesteps} timesteps: {rep.fraction_of_oracle:.3f} of the oracle on "
          f"{len(rep.per_profile_fraction)} held-out random profiles (worst "
          f"{min(rep.per_profile_fraction.values()):.3f})")

    policy = PPOPolicy.load(rep.model_path)
    held_out = {}
    print(f"\n{'held-out path':<13} {'seed':>4} {'fraction':>8}  {'settled':<12} {'oracle':<12}")
    for seed in range(3):
        res = evaluate(policy, bottleneck_profiles(), steps=60, seed=seed)
        for name, frac in res["per_profile"].items():
            held_out.setdefault(name, []).append(
                {"seed": seed, "fraction_of_oracle": round(frac, 4), "settled_threads": list(res["settled"][name]),
                 "oracle_threads": list(res["oracle"][name])})
            print(f"{name:<13} {seed:>4} {frac:>8.3f}  {str(res['settled'][name]):<12} {str(res['oracle'][name]):<12}")

    behaviour = behaviour_table(policy)

    meta = policy_metadata(rep.model_path)
    meta["held_out"] = {"profiles": "automdt.agents.training.bottleneck_profiles()", "steps": 60, "results": held_out}
    meta["behaviour"] = behaviour
    meta["command"] = "scripts/train_default_policy.py " + " ".join(argv if argv is not None else sys.argv[1:])
    meta_path = write_policy_metadata(rep.model_path, meta)
    print(f"\nwrote {rep.model_path} ({rep.model_path.stat().st_size // 1024} KiB), {meta_path.name}, "
          f"{rep.curve_csv.name}, {rep.curve_png.name} in {time.perf_counter() - t0:.0f} s")
    return 0


def behaviour_table(policy) -> dict:
    """Ramp, sustained share and settling in the simulator with the engine's chunk effects, from the
    policy's own start and from a full sender buffer on the issue's path (2 seeds each)."""
    from automdt.experiments.behaviour import sim_episode, sim_paths, summarize

    out = {}
    print(f"\n{'path (simulator, chunk effects)':<32} {'ramp':>4} {'sustained':>9} {'dip':>3} {'holds':>5}  settled (min95)")
    for name, path in sim_paths().items():
        runs = [sim_episode(policy, path, steps=40, seed=seed) for seed in range(2)]
        if name == "issue-read-bound":
            runs += [sim_episode(policy, path, steps=40, start=(16, 5, 2), seed=seed, buffer_fill=(0.95, 0.0))
                     for seed in range(2)]
        s = summarize(runs)
        s["settled"] = [list(r["settled"]) for r in runs]
        s["min95"] = list(runs[0]["min95"])
        out[name] = s
        print(f"{name:<32} {s['ramp_worst']:>4.0f} {s['sustained_min']:>9.2f} {s['longest_dip']:>3d} "
              f"{s['holds']:>2d}/{s['runs']:<2d}  {runs[0]['settled']} ({runs[0]['min95']})")
    return {"paths": "automdt.experiments.behaviour.sim_paths()", "steps": 40, "seeds": [0, 1], "results": out}


if __name__ == "__main__":
    sys.exit(main())
