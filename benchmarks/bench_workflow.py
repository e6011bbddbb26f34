"""The operator's workflow as typed: ``automdt explore`` -> ``automdt train --profile`` ->
``automdt transfer --policy FILE.zip``, beside ``automdt transfer`` with the default, wall time.

Two throttled loopback paths (the engine's ``--throttle``), each explored as its first phase:

* ``static``: write-bound the whole time (7 MB/s per writer, 48 MB/s);
* ``drift``: read-bound (6 MB/s per reader, 48 MB/s) while explored; during the transfer the
  bottleneck moves to the network (4 MB/s per connection, 48 MB/s) after ``--drift-at`` seconds:
  the same rate is achievable throughout, so the ideal time is the dataset over 48 MB/s.

Per path: ``explore --duration 30``, ``train --profile`` at its defaults, then ``--reps`` rounds of
the two transfers, interleaved (the order alternates), each a fresh command into an empty
destination with ``--no-history --no-lock`` (the default would otherwise start from the previous
run's triple). Wall time includes start-up. Prints the medians and their ratio and, with
``--json FILE``, writes a results file. The dataset lives in ``/dev/shm`` and is removed.

    .venv/bin/python benchmarks/bench_workflow.py --json benchmarks/results/workflow.json
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

MB = 1_000_000
AUTOMDT = [sys.executable, "-m", "automdt"]
PATHS = {
    "static": ("write.thread=7M,write.total=48M", None),
    "drift": ("read.thread=6M,read.total=48M", "net.thread=4M,net.total=48M"),
}


def run(args: List[str], timeout: float = 900.0) -> float:
    """Run one automdt command; returns its wall seconds (start-up included)."""
    t0 = time.monotonic()
    p = subprocess.run([*AUTOMDT, *args], capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"bench_workflow: `automdt {' '.join(args)}` exited {p.returncode}: {p.stderr.strip()[-500:]}")
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=16, help="files in the dataset (default 16)")
    ap.add_argument("--file-mb", type=int, default=60, help="MB per file (default 60: 960 MB, 20 s at 48 MB/s)")
    ap.add_argument("--reps", type=int, default=3, help="interleaved rounds per path (default 3)")
    ap.add_argument("--explore-s", type=float, default=30.0, help="explore --duration (default 30)")
    ap.add_argument("--drift-at", type=float, default=3.0, help="seconds into the transfer the drift path moves (default 3)")
    ap.add_argument("--paths", default="static,drift", help="comma list of paths (default static,drift)")
    ap.add_argument("--json", metavar="FILE", help="write a results file")
    a = ap.parse_args()
    base = tempfile.mkdtemp(prefix="amdt-wf-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    rows: List[Dict[str, object]] = []
    raw: Dict[str, Dict[str, List[float]]] = {}
    try:
        src = os.path.join(base, "src")
        os.makedirs(src)
        block = os.urandom(1 << 20)
        for i in range(a.files):
            with open(os.path.join(src, f"f{i:03d}.bin"), "wb") as f:
                for _ in range(a.file_mb * MB // len(block)):
                    f.write(block)
                f.write(block[: a.file_mb * MB % len(block)])
        size = a.files * a.file_mb * MB
        for name in a.paths.split(","):
            first, later = PATHS[name]
            sched = os.path.join(base, f"{name}.yaml")
            with open(sched, "w") as f:
                f.write(f"- {{at: 0, throttle: '{first}'}}\n")
                if later:
                    f.write(f"- {{at: {a.drift_at}, throttle: '{later}'}}\n")
            prof, pol = os.path.join(base, f"{name}-path.yaml"), os.path.join(base, f"{name}-policy.zip")
            explore_s = run(["explore", src, os.path.join(base, f"{name}-explore"), "--duration", str(a.explore_s),
                             "--throttle", first, "-o", prof, "-q"])
            shutil.rmtree(os.path.join(base, f"{name}-explore"), ignore_errors=True)
            train_s = run(["train", "--profile", prof, "-o", pol, "--no-progress"])
            walls: Dict[str, List[float]] = {"default": [], "trained": []}
            for rep in range(a.reps):
                order = ["default", "trained"] if rep % 2 == 0 else ["trained", "default"]
                for lab in order:
                    dest = os.path.join(base, f"{name}-{lab}-{rep}")
                    extra = ["--policy", pol] if lab == "trained" else []
                    walls[lab].append(run(["transfer", src, dest, "--throttle", f"@{sched}", "--no-history",
                                           "--no-lock", "-q", *extra]))
                    shutil.rmtree(dest, ignore_errors=True)
            d, t = statistics.median(walls["default"]), statistics.median(walls["trained"])
            raw[name] = walls
            rows.append({"path": name, "explore_s": round(explore_s, 1), "train_s": round(train_s, 1),
                         "ideal_s": round(size / (48 * MB), 1), "default_s": round(d, 2), "trained_s": round(t, 2),
                         "ratio": round(t / d, 3)})
            print(f"{name}: explore {explore_s:.0f} s, train {train_s:.0f} s; transfer medians default {d:.2f} s, "
                  f"trained {t:.2f} s ({t / d:.3f}x); ideal {size / (48 * MB):.1f} s", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if a.json:
        cols = [("path", "path"), ("explore_s", "explore (s)"), ("train_s", "train (s)"), ("ideal_s", "ideal (s)"),
                ("default_s", "transfer, default (s)"), ("trained_s", "transfer --policy FILE.zip (s)"),
                ("ratio", "trained / default")]
        results_file.write(a.json, "The operator's workflow as typed", f"{a.files} x {a.file_mb} MB in /dev/shm, "
                           f"throttled loopback, medians of {a.reps} interleaved rounds, wall time with start-up",
                           [results_file.table("workflow", "explore -> train -> transfer against the default", cols, rows)],
                           samples=raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
