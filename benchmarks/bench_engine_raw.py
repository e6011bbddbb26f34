"""Raw loopback throughput of the C engine: a Sender and a Receiver in one process.

Source and destination files live on tmpfs (/dev/shm), so the numbers measure the engine
(pread, XXH3, TCP loopback, recv, pwrite) and not a disk. Destination files are written once
before timing, so timed runs overwrite resident pages (fresh page-cache pages from the host
cost 5-10x more on these VMs). One engine pair per configuration stays up for the whole run
(slots are allocated once and reused); configurations are interleaved and the median of
the repetitions is reported, with the process CPU time per GB (user + system), which is a
steadier figure than wall-clock GB/s on a shared machine.

    .venv/bin/python benchmarks/bench_engine_raw.py                   # 1 and 4 MiB chunks
    .venv/bin/python benchmarks/bench_engine_raw.py --chunk-mib 2 --threads 2 2 2 --reps 7
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import tempfile
import time
from typing import Any

from automdt.transfer_engine import Receiver, Sender, _engine


def fill(path: str, size: int, block: bytes) -> None:
    with open(path, "wb") as fh:
        left = size
        while left > 0:
            fh.write(block[: min(left, len(block))])
            left -= len(block)


class Pair:
    def __init__(self, chunk: int, memory: int, threads: list[int], root: str, nfiles: int, size: int) -> None:
        tok = os.urandom(32)
        self.rx = Receiver("127.0.0.1", 0, tok, chunk, memory, threads=threads[2])
        self.tx = Sender("127.0.0.1", self.rx.port, tok, chunk, memory, threads=(threads[0], threads[1]))
        self.root, self.nfiles, self.size = root, nfiles, size
        self.fds = [os.open(os.path.join(root, f"d{i}"), os.O_WRONLY) for i in range(nfiles)]
        self.next_id = 0

    def run(self) -> tuple[float, float]:
        """One transfer of every file: (GB/s, CPU seconds per GB)."""
        ids = list(range(self.next_id, self.next_id + self.nfiles))
        self.next_id += self.nfiles
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        for i, fid in enumerate(ids):
            src = os.path.join(self.root, f"s{i}")
            self.rx.add_file(fid, self.fds[i], -1, self.size)
            self.tx.add_file(fid, src, self.size, os.stat(src).st_mtime_ns)
        done = 0
        deadline = t0 + 120
        while done < len(ids):
            done += sum(1 for e in self.rx.events() if e[0] == "file_done")
            if time.perf_counter() > deadline:
                raise RuntimeError("transfer did not finish in 120 s")
            time.sleep(0.001)
        dt = time.perf_counter() - t0
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        for fid in ids:
            self.rx.remove_file(fid)
        gb = self.nfiles * self.size / 1e9
        cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        return gb / dt, cpu / gb

    def close(self) -> None:
        self.tx.close()
        self.rx.close()
        for fd in self.fds:
            os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--total-mib", type=int, default=1024, help="bytes moved per run")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--chunk-mib", type=float, nargs="+", default=[1, 4])
    ap.add_argument("--threads", type=int, nargs=3, default=[1, 1, 1], metavar=("R", "N", "W"))
    ap.add_argument("--memory-mib", type=int, default=32, help="each staging buffer")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", metavar="FILE", help="write the figures as a results file (automdt-results/1)")
    args = ap.parse_args()

    root = tempfile.mkdtemp(prefix="amdt-bench-", dir="/dev/shm")
    pairs: dict[int, Any] = {}
    try:
        size = args.total_mib * (1 << 20) // args.files
        block = os.urandom(1 << 20)
        for i in range(args.files):
            fill(os.path.join(root, f"s{i}"), size, block)
            fill(os.path.join(root, f"d{i}"), size, b"\0" * len(block))
        for c in args.chunk_mib:
            chunk = int(c * (1 << 20))
            pairs[chunk] = Pair(chunk, args.memory_mib << 20, args.threads, root, args.files, size)
            pairs[chunk].run()  # warm-up: slots allocated, connections up
        results: dict[int, list[tuple[float, float]]] = {c: [] for c in pairs}
        for _ in range(args.reps):
            for c, p in pairs.items():  # interleaved
                results[c].append(p.run())
        print(f"hash: {_engine.HASH_IMPL}; {args.total_mib} MiB per run in {args.files} files; "
              f"threads r/n/w {args.threads}; buffers {args.memory_mib} MiB; {os.cpu_count()} CPUs, "
              f"load {os.getloadavg()[0]:.2f}")
        for c, rs in results.items():
            gbps = [r[0] for r in rs]
            cpu = [r[1] for r in rs]
            print(f"chunk {c / (1 << 20):5.2f} MiB: median {statistics.median(gbps):.2f} GB/s "
                  f"[{', '.join(f'{x:.2f}' for x in gbps)}], CPU {statistics.median(cpu):.2f} s/GB")
        if args.json:
            import results_file

            rows = [{"chunk": f"{c / (1 << 20):g} MiB", "gbps": round(statistics.median(r[0] for r in rs), 3),
                     "cpu": round(statistics.median(r[1] for r in rs), 3),
                     "runs": ", ".join(f"{r[0]:.2f}" for r in rs)} for c, rs in results.items()]
            results_file.write(args.json, "The C engine alone", (
                f"{args.total_mib} MiB per run in {args.files} files, threads r/n/w {args.threads}, buffers "
                f"{args.memory_mib} MiB, hash {_engine.HASH_IMPL}, medians of {args.reps} interleaved runs"), [
                results_file.table("raw", "GB/s and CPU-seconds per GB",
                                   [("chunk", "chunk"), ("gbps", "median GB/s"), ("cpu", "median CPU s/GB"),
                                    ("runs", "GB/s per run")], rows)])
    finally:
        for p in pairs.values():
            p.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
