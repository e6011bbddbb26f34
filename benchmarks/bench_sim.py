"""Simulator throughput: single-env and batched env-steps per second.

Usage::

    .venv/bin/python benchmarks/bench_sim.py [--num-envs 4096] [--steps 300] [--repeats 5]

Prints the median of ``--repeats`` timed runs (after a warm-up) for: the single
``BufferSimEnv`` (Gymnasium API, info dicts included), ``BatchedBufferSim.step`` (numpy,
same-step autoreset, random profiles) and the SB3 adapter ``BatchedSimVecEnv``.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from automdt.simulator.env import BufferSimEnv  # noqa: E402
from automdt.simulator.vector import BatchedBufferSim  # noqa: E402


def bench_single(steps: int) -> float:
    env = BufferSimEnv(random_profiles=True, episode_steps=30)
    env.reset(seed=0)
    acts = np.random.default_rng(0).integers(0, 5, (1024, 3))
    t0 = time.perf_counter()
    for i in range(steps):
        _, _, term, trunc, _ = env.step(acts[i % 1024])
        if term or trunc:
            env.reset()
    return steps / (time.perf_counter() - t0)


def bench_batched(num_envs: int, steps: int, substeps: int = 1) -> float:
    sim = BatchedBufferSim(num_envs, random_profiles=True, episode_steps=30, seed=0, substeps=substeps)
    sim.reset()
    acts = np.random.default_rng(0).integers(0, 5, (16, num_envs, 3))
    t0 = time.perf_counter()
    for i in range(steps):
        sim.step(acts[i % 16])
    return num_envs * steps / (time.perf_counter() - t0)


def bench_sb3(num_envs: int, steps: int) -> float:
    from automdt.simulator.sb3 import BatchedSimVecEnv

    venv = BatchedSimVecEnv(num_envs, random_profiles=True, episode_steps=30, seed=0)
    venv.reset()
    acts = np.random.default_rng(0).integers(0, 5, (16, num_envs, 3))
    t0 = time.perf_counter()
    for i in range(steps):
        venv.step(acts[i % 16])
    return num_envs * steps / (time.perf_counter() - t0)


def median_of(fn, repeats: int, *args) -> tuple[float, float, float]:
    fn(*args)  # warm-up
    xs = [fn(*args) for _ in range(repeats)]
    return statistics.median(xs), min(xs), max(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-envs", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=300, help="batched steps per timed run")
    ap.add_argument("--single-steps", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-sb3", action="store_true", help="skip the SB3 adapter (avoids importing torch)")
    ap.add_argument("--json", metavar="FILE", help="write the figures as a results file (automdt-results/1)")
    args = ap.parse_args()
    print(f"python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} CPUs "
          f"(shared machine: figures vary run to run)")
    rows = [("BufferSimEnv (single)", median_of(bench_single, args.repeats, args.single_steps))]
    rows.append((f"BatchedBufferSim num_envs={args.num_envs}",
                 median_of(bench_batched, args.repeats, args.num_envs, args.steps)))
    rows.append((f"BatchedBufferSim num_envs={args.num_envs} substeps=10",
                 median_of(bench_batched, args.repeats, args.num_envs, max(1, args.steps // 3), 10)))
    if not args.no_sb3:
        rows.append((f"BatchedSimVecEnv (SB3) num_envs={args.num_envs}",
                     median_of(bench_sb3, args.repeats, args.num_envs, args.steps)))
    for name, (med, lo, hi) in rows:
        print(f"{name:48s} {med:>14,.0f} env-steps/s  (min {lo:,.0f}, max {hi:,.0f})")
    if args.json:
        import results_file

        results_file.write(args.json, "Simulator steps per second", f"medians of {args.repeats} timed runs", [
            results_file.table("sim", "Environment steps per second",
                               [("config", "configuration"), ("median", "median env-steps/s"),
                                ("min", "min"), ("max", "max")],
                               [{"config": n, "median": round(m), "min": round(lo), "max": round(hi)}
                                for n, (m, lo, hi) in rows])])


if __name__ == "__main__":
    main()
