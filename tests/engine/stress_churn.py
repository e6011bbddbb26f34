"""Churn/close stress of the engine, run in a subprocess by test_stress.py.

Each round builds a Sender/Receiver pair, moves files while thread counts and throttles
change at random, then closes the engines at a random moment (often mid-transfer, in either
order, or by dropping the last reference so dealloc closes them). The last round runs to
completion and checks the copy. Prints "OK <rounds>" at the end; a deadlock shows up as the
parent's timeout.
"""
from __future__ import annotations

import gc
import os
import random
import sys
import tempfile
import time

from automdt.transfer_engine import Receiver, Sender


def one_round(rng: random.Random, root: str, finish: bool) -> None:
    chunk = rng.choice([4096, 16384, 65536])
    memory = chunk * rng.randint(1, 12)
    tok = os.urandom(32)
    rx = Receiver("127.0.0.1", 0, tok, chunk, memory, max_threads=6, threads=rng.randint(0, 3))
    tx = Sender("127.0.0.1", rx.port, tok, chunk, memory, max_threads=6,
                threads=(rng.randint(0, 3), rng.randint(0, 3)))
    files = {}
    fds = []
    for fid in range(rng.randint(1, 6)):
        data = rng.randbytes(rng.randint(1, 6 * chunk))
        src = os.path.join(root, f"s{fid}")
        with open(src, "wb") as fh:
            fh.write(data)
        dst = os.path.join(root, f"d{fid}")
        fd = os.open(dst, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        fds.append(fd)
        rx.add_file(fid, fd, -1, len(data))
        tx.add_file(fid, src, len(data), os.stat(src).st_mtime_ns)
        files[fid] = (dst, data)
    t_end = time.monotonic() + rng.uniform(0.0, 0.25)
    while time.monotonic() < t_end:
        tx.set_threads(rng.randint(0, 6), rng.randint(0, 6))
        rx.set_threads(rng.randint(0, 6))
        if rng.random() < 0.2:
            tx.set_throttle(rng.choice(["read", "net"]), rng.choice([0, 1 << 20, 4 << 20]), 0)
        if rng.random() < 0.2:
            rx.set_throttle("write", rng.choice([0, 2 << 20]), 0)
        tx.stats()
        rx.stats()
        if rng.random() < 0.1:
            for fid in files:
                for off, ln in rx.missing(fid)[:2]:
                    tx.requeue(fid, off, ln)
        time.sleep(rng.uniform(0, 0.01))
    if finish:
        tx.set_throttle("read", 0, 0)
        tx.set_throttle("net", 0, 0)
        rx.set_throttle("write", 0, 0)
        tx.set_threads(2, 2)
        rx.set_threads(2)
        done: set[int] = set()
        deadline = time.monotonic() + 20
        while len(done) < len(files):
            done |= {e[1] for e in rx.events() if e[0] == "file_done"}
            if time.monotonic() > deadline:
                raise SystemExit(f"FAIL: only {sorted(done)} of {sorted(files)} done")
            time.sleep(0.005)
        for fid, (dst, data) in files.items():
            with open(dst, "rb") as fh:
                if fh.read() != data:
                    raise SystemExit(f"FAIL: file {fid} differs")
    how = rng.choice(["tx_first", "rx_first", "dealloc"])
    if how == "tx_first":
        tx.close()
        rx.close()
    elif how == "rx_first":
        rx.close()
        tx.close()
    else:
        del tx, rx
        gc.collect()
    for fd in fds:
        os.close(fd)


def main() -> None:
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    budget_s = float(sys.argv[2]) if len(sys.argv) > 2 else 6.0
    rng = random.Random(seed)
    t_end = time.monotonic() + budget_s
    rounds = 0
    with tempfile.TemporaryDirectory(prefix="amdt-stress-") as root:
        while time.monotonic() < t_end:
            one_round(rng, root, finish=False)
            rounds += 1
        one_round(rng, root, finish=True)
        rounds += 1
    print(f"OK {rounds}")


if __name__ == "__main__":
    main()
