"""What the default durable point costs: ``automdt transfer`` (``--fsync end``, the default) beside
``--fsync none``, ``file`` and ``dir``, wall time with start-up, interleaved.

Datasets (generated in ``/dev/shm``, removed at the end): ``large`` 8 x 256 MiB and ``small``
2,000 x 1 MiB. Destinations: ``tmpfs`` (``/dev/shm``: write-back is free, the cost is the marker and
the call) and ``disk`` (a directory on the filesystem of ``--disk-dir``: with ``end`` the run waits
until the kernel has written the data back, which ``none`` leaves for after the exit). Each
destination is removed after its run, and on the disk the removal is synced before the next one
starts, so no run pays for the one before. Prints the medians and the ratio to ``none``; with
``--json FILE`` writes a results file.

    .venv/bin/python benchmarks/bench_durable.py --json benchmarks/results/durable.json
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402

MiB = 1 << 20
DATASETS = {"large": (8, 256 * MiB), "small": (2000, MiB)}
MODES = ("none", "end", "file", "dir")


def _make(path: str, n: int, size: int) -> None:
    os.makedirs(path)
    block = os.urandom(MiB)
    for i in range(n):
        with open(os.path.join(path, f"f{i:05d}.bin"), "wb") as f:
            for _ in range(size // MiB):
                f.write(block)


def _run(src: str, dest: str, mode: str) -> float:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "automdt", "transfer", src, dest, "--fsync", mode, "--no-history",
                        "--no-lock", "-q"], capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"bench_durable: transfer --fsync {mode} exited {p.returncode}: {p.stderr.strip()[-400:]}")
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--datasets", default="large,small", help="comma list: large,small (default both)")
    ap.add_argument("--targets", default="tmpfs,disk", help="comma list: tmpfs,disk (default both)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list of --fsync settings (default {','.join(MODES)})")
    ap.add_argument("--disk-dir", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="a directory on the disk to write to (default: the checkout)")
    ap.add_argument("--json", metavar="FILE", help="write a results file")
    a = ap.parse_args()
    modes = a.modes.split(",")
    shm = tempfile.mkdtemp(prefix="amdt-durable-", dir="/dev/shm")
    disk = tempfile.mkdtemp(prefix=".amdt-durable-", dir=a.disk_dir)
    rows: List[Dict[str, object]] = []
    samples: Dict[str, Dict[str, List[float]]] = {}
    try:
        for ds in a.datasets.split(","):
            src = os.path.join(shm, ds)
            _make(src, *DATASETS[ds])
            for target in a.targets.split(","):
                base = shm if target == "tmpfs" else disk
                walls: Dict[str, List[float]] = {m: [] for m in modes}
                for rep in range(a.reps):
                    for mode in (modes if rep % 2 == 0 else modes[::-1]):
                        dest = os.path.join(base, f"dest-{mode}")
                        walls[mode].append(_run(src, dest, mode))
                        shutil.rmtree(dest)
                        if target == "disk":
                            os.sync()  # the removal's write-back belongs to no run
                med = {m: statistics.median(v) for m, v in walls.items()}
                key = f"{ds}/{target}"
                samples[key] = walls
                ref = med.get("none")
                for m in modes:
                    rows.append({"dataset": f"{DATASETS[ds][0]} x {DATASETS[ds][1] // MiB} MiB", "target": target,
                                 "fsync": m, "wall_s": round(med[m], 2),
                                 "ratio": round(med[m] / ref, 3) if ref else None})
                print(f"{key}: " + ", ".join(f"{m} {med[m]:.2f} s" + (f" ({med[m] / ref:.3f}x)" if ref else "")
                                              for m in modes), flush=True)
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(disk, ignore_errors=True)
    if a.json:
        cols = [("dataset", "dataset"), ("target", "destination"), ("fsync", "--fsync"), ("wall_s", "wall (s)"),
                ("ratio", "/ none")]
        results_file.write(a.json, "What durability costs", f"local transfers from /dev/shm, medians of {a.reps} "
                           "interleaved rounds, wall time with start-up; the disk is the checkout's filesystem",
                           [results_file.table("durable", "--fsync settings against none", cols, rows)], samples=samples)
    return 0


if __name__ == "__main__":
    sys.exit(main())
