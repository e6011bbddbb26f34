"""Wall time for :func:`automdt.agents.training.train` to reach 95% of the oracle's utility.

Usage::

    .venv/bin/python benchmarks/bench_train.py [--seeds 0 1 2] [--target 0.95] [--max-seconds 300]

Trains one policy per hand-written path (:func:`~automdt.agents.training.bottleneck_profiles`:
read-, network- and write-bound) and seed as ``automdt train --profile`` does (fine-tuning the
shipped default, judged from several starts: :func:`~automdt.agents.training.profile_settings`),
or from scratch with :class:`~automdt.agents.training.PPOConfig`'s defaults (``--scratch``, judged
from (1, 1, 1) only), with early stopping at ``--target``, and prints per run: wall seconds to the target (or "not reached" within
``--max-seconds``), timesteps, the saved network's fraction of the oracle (the mean utility of
the last 30 of 60 intervals from (1, 1, 1), divided by the oracle's) and the thread counts it
settles on next to the oracle's. A median over seeds closes each path. Wall times include the
periodic evaluations and depend on the load of the (shared) machine; the load average is
printed with them.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from automdt.agents.training import bottleneck_profiles, evaluate, profile_settings, train  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--max-seconds", type=float, default=300.0)
    ap.add_argument("--profiles", nargs="+", default=None, help="subset of read-bound net-bound write-bound")
    ap.add_argument("--scratch", action="store_true", help="train from scratch (PPOConfig defaults), not as the CLI")
    ap.add_argument("--json", metavar="FILE", help="write the figures as a results file (automdt-results/1)")
    args = ap.parse_args(argv)

    import torch

    from automdt.agents.ppo import PPOPolicy

    print(f"# {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"load average {os.getloadavg()[0]:.2f} at start")
    print(f"# target {args.target} of the oracle, stop after {args.max_seconds:.0f} s")
    print(f"{'path':<12} {'seed':>4} {'to target':>10} {'timesteps':>10} {'fraction':>8}  {'settled':<12} {'oracle':<12} load")
    profiles = [(n, p) for n, p in bottleneck_profiles() if not args.profiles or n in args.profiles]
    failures = 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="automdt-bench-train-") as tmp:
        for name, prof in profiles:
            times = []
            for seed in args.seeds:
                t0 = time.perf_counter()
                rep = train(prof, os.path.join(tmp, f"{name}-{seed}.zip"), seed=seed, progress=False,
                            target_fraction=args.target, max_seconds=args.max_seconds,
                            **({} if args.scratch else profile_settings()))
                wall = time.perf_counter() - t0
                res = evaluate(PPOPolicy.load(rep.model_path), [(name, prof)], steps=60, seed=0)
                reached = rep.wall_s_to_target is not None
                if reached:
                    times.append(rep.wall_s_to_target)
                else:
                    failures += 1
                shown = f"{rep.wall_s_to_target:>9.1f}s" if reached else f"{'not reached':>10}"
                print(f"{name:<12} {seed:>4} {shown} {rep.timesteps:>10} {res['per_profile'][name]:>8.3f}  "
                      f"{str(res['settled'][name]):<12} {str(res['oracle'][name]):<12} {os.getloadavg()[0]:.2f}"
                      f"  (run {wall:.1f} s incl. saving)", flush=True)
                rows.append({"path": name, "seed": seed, "to_target": round(rep.wall_s_to_target, 2) if reached else None,
                             "timesteps": rep.timesteps, "fraction": round(res["per_profile"][name], 4),
                             "settled": str(res["settled"][name]), "oracle": str(res["oracle"][name])})
            if len(args.seeds) > 1 and times:
                print(f"{name:<12} median {statistics.median(times):.1f} s to target over {len(times)} of "
                      f"{len(args.seeds)} seeds")
    if args.json:
        import results_file

        results_file.write(args.json, "PPO training to a target", (
            f"target {args.target} of the oracle, at most {args.max_seconds:.0f} s, torch {torch.__version__}, "
            + ("from scratch" if args.scratch else "as `automdt train --profile`")), [
            results_file.table("train", "Seconds to the target (empty: not reached)",
                               [("path", "path"), ("seed", "seed"), ("to_target", "s to target"),
                                ("timesteps", "timesteps"), ("fraction", "fraction of the oracle"),
                                ("settled", "settled"), ("oracle", "oracle")], rows)])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
