#!/usr/bin/env python3
"""The receiving session's per-file CPU: plan, activation and rename into place of many new files.

Calls the handlers of one :class:`automdt.session.Session` in this process (no sender, no data:
the files are empty partials), with the message sizes the sender uses (manifest batches of 2000,
activate batches of 512), into a fresh directory tree in /dev/shm, and prints the median thread
CPU of each step over --reps runs. It isolates the Python and system-call work per file that the
receiver's control thread does during a transfer of many small files (issue 11):

    .venv/bin/python benchmarks/bench_session.py                     # 20,000 files, 5 runs
    PYTHONPATH=/path/to/other/tree .venv/bin/python benchmarks/bench_session.py   # another build
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Dict, List

from automdt import protocol
from automdt.receiver import ReceiverServer
from automdt.session import Session

MANIFEST_BATCH, ACTIVATE_BATCH, PER_DIR = 2000, 512, 1000


def one_run(root: str, nfiles: int, size: int) -> Dict[str, float]:
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    srv = ReceiverServer(root)
    s = Session(srv, b"bench")
    s.handle({"type": "hello", "version": protocol.VERSION, "nonce": "n"})
    s.handle({"type": "auth"})
    s.handle(protocol.Open(chunk_size=4 << 20, memory=64 << 20, write_threads=2).to_dict())
    ndirs = -(-nfiles // PER_DIR)
    s.handle({"type": "manifest", "files": [], "dirs": [f"d{i:04d}" for i in range(ndirs)]})
    files = [{"id": i, "path": f"d{i // PER_DIR:04d}/f{i:07d}.bin", "size": size, "mtime_ns": 10**18,
              "mode": 0o644, "source_id": "1:2"} for i in range(nfiles)]
    out = {"plan": 0.0, "activate": 0.0, "rename": 0.0}
    c = time.thread_time()
    for i in range(0, nfiles, MANIFEST_BATCH):
        s.handle({"type": "manifest", "files": files[i:i + MANIFEST_BATCH], "dirs": []})
    out["plan"] = time.thread_time() - c
    for i in range(0, nfiles, ACTIVATE_BATCH):
        ids = list(range(i, min(nfiles, i + ACTIVATE_BATCH)))
        c0 = time.thread_time()
        s.handle({"type": "activate", "ids": ids})
        c1 = time.thread_time()
        for fid in ids:  # what the engine's file_done events lead to
            s._finalize(s.files[fid])
        out["activate"] += c1 - c0
        out["rename"] += time.thread_time() - c1
    s.close()
    srv._shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=20000, help="new files per run (default 20000)")
    ap.add_argument("--size", type=int, default=64 << 10, help="their size in bytes (default 64 KiB)")
    ap.add_argument("--reps", type=int, default=5, help="runs; medians are printed (default 5)")
    ap.add_argument("--json", metavar="FILE", help="write the figures as a results file (automdt-results/1)")
    a = ap.parse_args()
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    top = tempfile.mkdtemp(prefix="amdt-bench-session-", dir=base)
    try:
        runs: List[Dict[str, float]] = [one_run(os.path.join(top, "dst"), a.files, a.size) for _ in range(a.reps)]
    finally:
        shutil.rmtree(top, ignore_errors=True)
    print(f"receiver thread CPU for {a.files} new files of {a.size} bytes, median of {a.reps}: " + ", ".join(
        f"{k} {statistics.median(r[k] for r in runs):.3f} s" for k in ("plan", "activate", "rename")))
    if a.json:
        import results_file

        results_file.write(a.json, "The receiving session's CPU per file",
                           f"{a.files} new files of {a.size} bytes, medians of {a.reps} runs", [
                               results_file.table("session", "Receiver thread CPU-seconds",
                                                  [("step", "step"), ("seconds", "CPU s (median)")],
                                                  [{"step": k, "seconds": round(statistics.median(r[k] for r in runs), 4)}
                                                   for k in ("plan", "activate", "rename")])])


if __name__ == "__main__":
    main()
