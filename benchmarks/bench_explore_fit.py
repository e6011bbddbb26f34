"""How close `automdt explore` gets to known throttle rates on the real engine.

Usage::

    .venv/bin/python benchmarks/bench_explore_fit.py [--seeds 3] [--chunk-size 1048576]

Two throttled paths (the ones in tests/automdt/test_explore.py): ``scaled`` (write 5 MB/s per
thread up to 40 MB/s, read and network 20 MB/s up to 100 MB/s, 16 threads, 30 s) and
``throttled`` (read 25/150, net 40/120, write 15/90 MB/s, 8 threads, 40 s). For every seed and
stage it prints the relative error of the fitted per-thread throughput (TPT) and bandwidth (B),
fitted from the same samples with and without the explorer's ``inflight_bytes`` correction
(chunks the threads that started in an interval still held at its end). Datasets live in
/dev/shm and are removed after each run. About 80 s per seed and path pair.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from automdt.explore import explore  # noqa: E402
from automdt.sender import TransferOptions  # noqa: E402
from automdt.simulator.fit import fit_profile  # noqa: E402
from automdt.simulator.profile import STAGES  # noqa: E402

MB = 1_000_000
PATHS = {  # name: (per-thread and total rate per stage, max threads, seconds, files of 8 MiB)
    "scaled": ({"read": (20 * MB, 100 * MB), "net": (20 * MB, 100 * MB), "write": (5 * MB, 40 * MB)}, 16, 30.0, 48),
    "throttled": ({"read": (25 * MB, 150 * MB), "net": (40 * MB, 120 * MB), "write": (15 * MB, 90 * MB)}, 8, 40.0, 40),
}


def run(name: str, seed: int, chunk: int) -> list:
    rates, max_threads, seconds, files = PATHS[name]
    d = tempfile.mkdtemp(dir="/dev/shm", prefix="automdt-bench-fit-")
    try:
        src = os.path.join(d, "src")
        os.makedirs(src)
        for i in range(files):
            with open(os.path.join(src, f"f{i:02d}.bin"), "wb") as f:
                f.write(os.urandom(8 << 20))
        throttle = {s: (float(t), float(b)) for s, (t, b) in rates.items()}
        opts = TransferOptions(memory=32 << 20, chunk_size=chunk, throttle=throttle, interval_s=1.0,
                               max_threads=max_threads)
        res = explore(src, os.path.join(d, "dst"), seconds, opts, seed=seed)
        plain = [{k: v for k, v in s.items() if k != "inflight_bytes"} for s in res["samples"]]
        without = fit_profile(plain, interval_s=1.0, buffers=(opts.memory, opts.memory), max_threads=max_threads)
        rows = []
        for s, got, raw in zip(STAGES, res["profile"].stages, without.stages):
            tpt, bw = rates[s]
            rows.append({"path": name, "seed": seed, "stage": s, "tpt": f"{got.tpt / tpt - 1:+.1%}",
                         "tpt_without": f"{raw.tpt / tpt - 1:+.1%}", "b": f"{got.bandwidth / bw - 1:+.1%}"})
            print(f"{name:<9} {seed:>4} {s:<5}  TPT {got.tpt / tpt - 1:+7.1%} (without {raw.tpt / tpt - 1:+7.1%})"
                  f"   B {got.bandwidth / bw - 1:+7.1%} (without {raw.bandwidth / bw - 1:+7.1%})", flush=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3, help="seeds per path (default 3)")
    ap.add_argument("--chunk-size", type=int, default=1 << 20, help="engine chunk size (default 1 MiB)")
    ap.add_argument("--paths", default="scaled,throttled", help="comma-separated: scaled, throttled")
    ap.add_argument("--json", metavar="FILE", help="write the figures as a results file (automdt-results/1)")
    a = ap.parse_args()
    print(f"{'path':<9} {'seed':>4} stage  relative error of the fit")
    print("(B of a stage that never limited the path is a bound, raised above the bottleneck's)")
    rows = []
    for name in a.paths.split(","):
        for seed in range(a.seeds):
            rows += run(name, seed, a.chunk_size)
    if a.json:
        import results_file

        results_file.write(a.json, "How close `automdt explore` gets to known throttle rates",
                           f"{a.seeds} seeds per path, {a.chunk_size} B chunks", [
                               results_file.table("fit", "Relative error of the fitted rates",
                                                  [("path", "path"), ("seed", "seed"), ("stage", "stage"),
                                                   ("tpt", "TPT"), ("tpt_without", "TPT without the in-flight estimate"),
                                                   ("b", "bandwidth")], rows,
                                                  ["The bandwidth of a stage that never limited the path is a bound."])])
    return 0


if __name__ == "__main__":
    sys.exit(main())
