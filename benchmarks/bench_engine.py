#!/usr/bin/env python3
"""Transfer-engine benchmark: AutoMDT against iperf3, rsync and GridFTP on one machine.

Sections (``--only NAME[,NAME]``):
  link      two network namespaces joined by a tc-limited veth pair (default 5 Gbit/s):
            `automdt receive` in B, `automdt transfer` in A, tmpfs to tmpfs, against iperf3
            with the same number of parallel streams on the same link (target >= 0.95x)
  loopback  local mode (`automdt transfer SRC DESTDIR`, one process: the local link),
            tmpfs to tmpfs, against iperf3 -c 127.0.0.1 with the same streams, default
            128 KiB writes and -l 1M (target >= 0.5x)
  datasets  8 x 512 MiB and 2000 x 1 MiB files, tmpfs to tmpfs on loopback, against the rsync
            daemon and GridFTP (globus-gridftp-server + globus-url-copy), each tool at the best
            of a few settings
  memory    peak RSS of the transferring process against the staging-buffer caps
  encrypt   the cost of --encrypt (TLS 1.3 data connections, CURVE control channel): plain vs
            encrypted on loopback TCP (both ends in one process, --switch local_link=0; CPU-bound:
            Gbit/s and CPU-seconds per GB) and on a 1 Gbit/s veth link between two namespaces

Every figure is a median of --reps repetitions (default 3) run interleaved with the peer's
(ours, peer, ours, peer, ...) after one untimed warm-up run of each, because the machine is
shared and noisy. Datasets are random data generated once in /dev/shm and removed at the end
(kept with --keep). Only loopback and namespaces this script creates are used; every process it
starts is ended by PID, and the namespaces, servers and temporary files are removed on exit.

    .venv/bin/python benchmarks/bench_engine.py                     # everything (make bench)
    .venv/bin/python benchmarks/bench_engine.py --quick --reps 1    # small sizes, a smoke run
    .venv/bin/python benchmarks/bench_engine.py --only datasets --json out.json
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import re
import json
import os
import platform
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from itertools import zip_longest
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from automdt.experiments.metrics import median  # noqa: E402,F401  (bench_datapath imports it from here)
from automdt.experiments.netns import NetnsPair, netns_available, rate_bits, reap_stale  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
SECTIONS = ("link", "loopback", "datasets", "memory", "encrypt")
SHM = "/dev/shm"


# The source folders of the installed packages (pyproject.toml [tool.setuptools.package-dir]).
PACKAGE_DIRS = ("automdt", "agents", "simulator", "transfer_engine", "experiments")


def ensure_bytecode() -> None:
    """Compile the package's bytecode, as an installation does (`make setup` runs the same). A shell
    with PYTHONDONTWRITEBYTECODE=1 never writes .pyc files, so every run of an edited tree would
    compile its changed modules again (about 0.1 s of start-up here): not what a user's run costs."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = [os.path.join(root, d) for d in PACKAGE_DIRS if os.path.isdir(os.path.join(root, d))]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *dirs], stdout=subprocess.DEVNULL, check=False)


def automdt_argv() -> List[str]:
    """The command a user types (the venv's console script), after :func:`ensure_bytecode`."""
    ensure_bytecode()
    exe = os.path.join(os.path.dirname(sys.executable), "automdt")
    return [exe] if os.access(exe, os.X_OK) else [sys.executable, "-m", "automdt"]


def say(msg: str = "") -> None:
    print(msg, flush=True)


def gbit(nbytes: float, seconds: float) -> float:
    return nbytes * 8 / seconds / 1e9 if seconds > 0 else 0.0


def fmt_size(n: int) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"


# ---------------------------------------------------------------------- processes
_LIBC = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:
    _LIBC.prctl(1, signal.SIGTERM, 0, 0, 0)   # 1 = PR_SET_PDEATHSIG


class Procs:
    """Every process this script starts, so that each is ended by its own PID."""

    def __init__(self) -> None:
        self.live: Dict[int, subprocess.Popen] = {}
        self.lock = threading.Lock()

    def start(self, argv: Sequence[str], **kw) -> subprocess.Popen:
        # PR_SET_PDEATHSIG: servers get SIGTERM if this script dies without its clean-up (SIGKILL,
        # OOM killer). Popen is only called from the main thread, whose exit is what it watches.
        p = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent, **kw)
        with self.lock:
            self.live[p.pid] = p
        return p

    def forget(self, p: subprocess.Popen) -> None:
        with self.lock:
            self.live.pop(p.pid, None)

    def stop(self, p: subprocess.Popen, grace: float = 5.0) -> None:
        """SIGTERM the process and the children it forked (by PID), SIGKILL what is left."""
        kids = []
        try:
            import psutil

            kids = psutil.Process(p.pid).children(recursive=True)
        except Exception:
            pass
        if p.poll() is None:
            try:
                p.terminate()
                p.wait(grace)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(grace)
            except ProcessLookupError:
                pass
        for k in kids:
            try:
                k.terminate()
                k.wait(grace)
            except Exception:
                try:
                    k.kill()
                except Exception:
                    pass
        self.forget(p)

    def stop_all(self) -> None:
        for p in list(self.live.values()):
            self.stop(p, grace=3.0)


PROCS = Procs()


class RunResult:
    def __init__(self, rc: int, wall: float, maxrss_kib: int, cpu_s: float, stdout: str, stderr: str) -> None:
        self.rc, self.wall, self.maxrss_kib, self.cpu_s = rc, wall, maxrss_kib, cpu_s
        self.stdout, self.stderr = stdout, stderr


def run_timed(argv: Sequence[str], timeout: float, scratch: str, cwd: Optional[str] = None) -> RunResult:
    """Run argv to completion (killed after ``timeout`` s): exit code, wall seconds, the
    child's own peak RSS and CPU time (os.wait4 on its PID), stdout and stderr."""
    out_path = os.path.join(scratch, "run.out")
    err_path = os.path.join(scratch, "run.err")
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        t0 = time.perf_counter()
        p = PROCS.start(argv, stdout=out, stderr=err, cwd=cwd)
        box: Dict[str, Any] = {}

        def reap() -> None:
            _, status, ru = os.wait4(p.pid, 0)
            box["t"] = time.perf_counter()
            box["status"], box["ru"] = status, ru

        th = threading.Thread(target=reap, daemon=True)
        th.start()
        th.join(timeout)
        if th.is_alive():
            p.kill()
            th.join(10)
            PROCS.forget(p)
            raise TimeoutError(f"{os.path.basename(argv[0])} did not finish in {timeout:.0f} s")
        PROCS.forget(p)
        p.returncode = os.waitstatus_to_exitcode(box["status"])
    ru = box["ru"]
    with open(out_path, errors="replace") as f:
        stdout = f.read()
    with open(err_path, errors="replace") as f:
        stderr = f.read()
    return RunResult(p.returncode, box["t"] - t0, ru.ru_maxrss, ru.ru_utime + ru.ru_stime, stdout, stderr)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(host: str, port: int, deadline_s: float, proc: subprocess.Popen, ns_argv: Sequence[str] = ()) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}")
        if ns_argv:
            ok = subprocess.run(list(ns_argv) + [sys.executable, "-c",
                                f"import socket; socket.create_connection(('{host}', {port}), 1).close()"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10).returncode == 0
        else:
            try:
                socket.create_connection((host, port), 1).close()
                ok = True
            except OSError:
                ok = False
        if ok:
            return
        time.sleep(0.1)
    raise RuntimeError(f"server on {host}:{port} not ready after {deadline_s:.0f} s")


# ---------------------------------------------------------------------- files
def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


MARGIN = 2 * GiB   # left free for the other users of this machine


def room_for(nbytes: int) -> Tuple[bool, str]:
    """tmpfs pages are RAM: need the bytes in /dev/shm and in MemAvailable, plus MARGIN."""
    free = shutil.disk_usage(SHM).free
    avail = mem_available()
    need = nbytes + MARGIN
    if free < need or avail < need:
        return False, (f"not enough room in {SHM}: need {fmt_size(need)}, {fmt_size(free)} free in {SHM}, "
                       f"{fmt_size(avail)} memory available")
    return True, ""


def tree_stats(root: str) -> Tuple[int, int]:
    n = size = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            n += 1
            size += os.lstat(os.path.join(dirpath, name)).st_size
    return n, size


def fresh_dir(path: str, owner: Optional[int] = None) -> str:
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    if owner is not None:
        os.chown(path, owner, -1)
    return path


def clear_dir(path: str) -> None:
    """Remove what is inside ``path`` (the directory itself stays)."""
    for entry in os.listdir(path):
        p = os.path.join(path, entry)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            os.unlink(p)


@contextlib.contextmanager
def destination(path: str, ds: "Dataset", owner: Optional[int] = None, keep_dir: bool = False):
    """A fresh, empty destination for one run, removed again right after it, so that only one
    destination copy exists at any time; refuses to start when tmpfs/memory has no room for it."""
    if keep_dir:
        clear_dir(path)
    else:
        shutil.rmtree(path, ignore_errors=True)
    ok, why = room_for(ds.total)
    if not ok:
        raise RuntimeError(why)
    if not keep_dir:
        fresh_dir(path, owner)
    try:
        yield path
    finally:
        if keep_dir:
            clear_dir(path)
        else:
            shutil.rmtree(path, ignore_errors=True)


class Dataset:
    def __init__(self, name: str, path: str, nfiles: int, size: int) -> None:
        self.name, self.path, self.nfiles, self.size = name, path, nfiles, size

    @property
    def total(self) -> int:
        return self.nfiles * self.size

    def label(self) -> str:
        return f"{self.nfiles} x {fmt_size(self.size)}"


class Data:
    """Random-data datasets, generated once per run (or reused from --keep) and reused."""

    def __init__(self, root: str, quick: bool) -> None:
        self.root = root
        self.quick = quick
        self.specs = {"large": (4, 16 * MiB) if quick else (8, 512 * MiB),
                      "small": (64, 1 * MiB) if quick else (2000, 1 * MiB)}
        self.sets: Dict[str, Dataset] = {}

    def get(self, name: str) -> Dataset:
        if name in self.sets:
            return self.sets[name]
        nfiles, size = self.specs[name]
        tag = f"{name}-{nfiles}x{size}"
        path = os.path.join(self.root, tag)
        stamp = path + ".complete"
        ds = Dataset(name, path, nfiles, size)
        if not (os.path.exists(stamp) and tree_stats(path) == (nfiles, nfiles * size)):
            ok, why = room_for(2 * ds.total)   # the source and one destination copy
            if not ok:
                raise RuntimeError(why)
            shutil.rmtree(path, ignore_errors=True)
            os.makedirs(path)
            os.chmod(self.root, 0o755)
            t0 = time.perf_counter()
            self._generate(path, nfiles, size)
            with open(stamp, "w") as f:
                f.write("ok\n")
            say(f"  (generated {ds.label()} of random data in {time.perf_counter() - t0:.1f} s)")
        self.sets[name] = ds
        return ds

    def release(self, name: str) -> None:
        """Delete a generated dataset that no later section needs (tmpfs is memory)."""
        ds = self.sets.pop(name, None)
        if ds is not None:
            shutil.rmtree(ds.path, ignore_errors=True)
            try:
                os.unlink(ds.path + ".complete")
            except FileNotFoundError:
                pass

    @staticmethod
    def _generate(path: str, nfiles: int, size: int) -> None:
        import numpy as np

        gen = np.random.SFC64(0xA070D7)   # the fastest numpy generator; the data only needs to be incompressible
        width = len(str(nfiles - 1))
        block = 64 * MiB
        for i in range(nfiles):
            with open(os.path.join(path, f"f{i:0{width}d}.bin"), "wb") as f:
                left = size
                while left > 0:
                    n = min(block, left)
                    f.write(memoryview(gen.random_raw((n + 7) // 8)).cast("B")[:n])
                    left -= n


# ---------------------------------------------------------------------- the tools
def timeout_for(nbytes: int) -> float:
    """Bound on one run: 60 s plus the time at 40 MB/s."""
    return 60 + nbytes / 40e6


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.quick = args.quick
        self.reps = args.reps
        self.scratch = os.path.join(SHM, f"automdt-bench-{os.getpid()}")
        os.makedirs(self.scratch)
        os.chmod(self.scratch, 0o755)
        data_root = args.data_dir or (os.path.join(SHM, "automdt-bench-data") if args.keep
                                      else os.path.join(self.scratch, "data"))
        os.makedirs(data_root, exist_ok=True)
        os.chmod(data_root, 0o755)
        self.data_root = data_root
        self.data = Data(data_root, self.quick)
        self.automdt = automdt_argv()
        self.results: Dict[str, Any] = {}
        self.notes: List[str] = []

    def cleanup(self) -> None:
        PROCS.stop_all()
        shutil.rmtree(self.scratch, ignore_errors=True)
        if not self.args.keep and not self.args.data_dir:
            shutil.rmtree(self.data_root, ignore_errors=True)

    # -- ours
    def ours(self, src: Dataset, dest: str, threads: str, chunk: str = "4Mi", memory: str = "256Mi",
             prefix: Sequence[str] = (), extra: Sequence[str] = (), verify: Optional[str] = None) -> Dict[str, float]:
        argv = list(prefix) + self.automdt + ["transfer", src.path, dest, "--threads", threads,
                                              "--chunk-size", chunk, "--memory", memory, "--json"] + list(extra)
        r = run_timed(argv, timeout_for(src.total), self.scratch)
        last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
        try:
            js = json.loads(last)
        except ValueError:
            raise RuntimeError(f"automdt transfer exit {r.rc}, no JSON summary: {r.stderr.strip()[-400:]}") from None
        if r.rc != 0 or js.get("exit_code") != 0 or js.get("files_transferred") != src.nfiles:
            raise RuntimeError(f"automdt transfer exit {r.rc}: {js.get('errors') or r.stderr.strip()[-400:]}")
        if verify is not None:
            self.check_tree(verify, src, "automdt")
        return {"wall_s": r.wall, "engine_s": js["seconds"], "bytes": js["bytes"],
                "maxrss_kib": r.maxrss_kib, "cpu_s": r.cpu_s}

    def check_tree(self, dest: str, src: Dataset, who: str) -> None:
        got = tree_stats(dest)
        if got != (src.nfiles, src.total):
            raise RuntimeError(f"{who}: destination has {got[0]} files / {got[1]} bytes, "
                               f"expected {src.nfiles} / {src.total}")

    # -- iperf3
    def iperf_client(self, host: str, port: int, streams: int, seconds: float, length: Optional[str] = None,
                     prefix: Sequence[str] = ()) -> float:
        argv = list(prefix) + ["iperf3", "-c", host, "-p", str(port), "-P", str(streams),
                               "-t", f"{seconds:g}", "-J"]
        if not self.quick:
            argv += ["-O", "1"]   # omit the first second (slow start) from the figure
        if length:
            argv += ["-l", length]
        last_err = ""
        for _ in range(3):   # the server takes one test at a time; retry if it is still busy
            r = run_timed(argv, seconds + 30, self.scratch)
            try:
                js = json.loads(r.stdout)
            except ValueError:
                js = {}
            if r.rc == 0 and "end" in js:
                return js["end"]["sum_received"]["bits_per_second"] / 1e9
            last_err = js.get("error") or r.stderr.strip()[-300:]
            time.sleep(1)
        raise RuntimeError(f"iperf3 failed: {last_err}")


# ---------------------------------------------------------------------- helpers for sections
def interleave(ours: List[Any], peers: List[Any]) -> List[Any]:
    out = []
    for a, b in zip_longest(ours, peers):
        if a is not None:
            out.append(a)
        if b is not None:
            out.append(b)
    return out


def measure(bench: Bench, contenders: List[Tuple[str, Callable[[], float]]]) -> Dict[str, List[float]]:
    """One untimed warm-up run of each contender, then --reps rounds in the given (interleaved)
    order. Each callable returns the figure of one run (Gbit/s)."""
    for _, fn in contenders:
        fn()
    samples: Dict[str, List[float]] = {k: [] for k, _ in contenders}
    for _ in range(bench.reps):
        for key, fn in contenders:
            samples[key].append(fn())
    return samples


def verdict(ratio: float, target: float) -> str:
    return f"target >= {target:g}x: {'met' if ratio >= target else 'NOT met'}"


# ---------------------------------------------------------------------- 1. link-limited
def section_link(b: Bench) -> Dict[str, Any]:
    rate = "1gbit" if b.quick else b.args.rate
    ok, why = netns_available()
    if not ok:
        return {"skipped": why}
    if shutil.which("iperf3") is None:
        return {"skipped": "iperf3 not installed (apt-get install -y iperf3)"}
    ds = b.data.get("large")
    ok, why = room_for(ds.total)
    if not ok:
        return {"skipped": why}
    streams_list = [2] if b.quick else [2, 4]
    seconds = 2 if b.quick else 6
    say(f"  link: veth between two namespaces, {b.args.qdisc} {rate} each way; dataset {ds.label()}; "
        f"automdt threads 2,N,2, chunk 4Mi; iperf3 -t {seconds}{'' if b.quick else ' -O 1'}")
    out: Dict[str, Any] = {"rate": rate, "rate_gbit": rate_bits(rate) / 1e9, "qdisc": b.args.qdisc,
                           "dataset": ds.label(), "rows": []}
    try:
        link = NetnsPair(rate=rate, qdisc=b.args.qdisc).open()
    except Exception as e:
        return {"skipped": f"cannot set up namespaces: {e}"}
    servers: List[subprocess.Popen] = []
    try:
        secret = os.path.join(b.scratch, "secret")
        with open(os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        root = fresh_dir(os.path.join(b.scratch, "link-dst"))
        rport, iport = 47001, 47002   # inside namespace B only: nothing else listens there
        rx_log = open(os.path.join(b.scratch, "receiver.log"), "wb")
        rx = PROCS.start(link.exec_argv("b", b.automdt + ["receive", "--listen", f"{link.addr_b}:{rport}",
                                                          "--root", root, "--secret-file", secret,
                                                          "--idle-timeout", "120"]),
                         stdout=rx_log, stderr=subprocess.STDOUT)
        servers.append(rx)
        ip = PROCS.start(link.exec_argv("b", ["iperf3", "-s", "-B", link.addr_b, "-p", str(iport)]),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        servers.append(ip)
        in_a = link.exec_argv("a", [])
        wait_port(link.addr_b, rport, 30, rx, in_a)
        wait_port(link.addr_b, iport, 10, ip, in_a)

        for n in streams_list:
            def ours(n=n) -> float:
                with destination(root, ds, keep_dir=True):   # the receiver's root stays
                    r = b.ours(ds, f"{link.addr_b}:{rport}", f"2,{n},2", prefix=in_a,
                               extra=["--secret-file", secret], verify=root)
                return gbit(r["bytes"], r["engine_s"])

            def peer(n=n) -> float:
                return b.iperf_client(link.addr_b, iport, n, seconds, prefix=in_a)

            s = measure(b, [("automdt", ours), ("iperf3", peer)])
            mo, mp = median(s["automdt"]), median(s["iperf3"])
            row = {"streams": n, "automdt_gbit": mo, "iperf3_gbit": mp, "ratio": mo / mp, "samples": s}
            out["rows"].append(row)
            say(f"  N={n} streams: automdt {mo:.2f} Gbit/s | iperf3 -P {n} {mp:.2f} Gbit/s | "
                f"ratio {mo / mp:.2f}x ({verdict(mo / mp, 0.95)})")
        out["qdisc_stats"] = link.qdisc_show("a").strip()
    finally:
        for p in servers:
            PROCS.stop(p)
        link.close()
    return out


# ---------------------------------------------------------------------- 2. loopback
def section_loopback(b: Bench) -> Dict[str, Any]:
    if shutil.which("iperf3") is None:
        return {"skipped": "iperf3 not installed (apt-get install -y iperf3)"}
    ds = b.data.get("large")
    ok, why = room_for(ds.total)
    if not ok:
        return {"skipped": why}
    streams_list = [2] if b.quick else [2, 4]
    seconds = 1 if b.quick else 4
    say(f"  loopback: local mode (one process, the local link), dataset {ds.label()}; automdt threads 2,N,2, "
        f"chunk 4Mi; iperf3 -c 127.0.0.1 -t {seconds}{'' if b.quick else ' -O 1'}")
    out: Dict[str, Any] = {"dataset": ds.label(), "rows": []}
    port = free_port()
    ip = PROCS.start(["iperf3", "-s", "-B", "127.0.0.1", "-p", str(port)],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port("127.0.0.1", port, 10, ip)
        dest = os.path.join(b.scratch, "loop-dst")
        for n in streams_list:
            def ours(n=n) -> float:
                with destination(dest, ds):
                    r = b.ours(ds, dest, f"2,{n},2", verify=dest)
                return gbit(r["bytes"], r["engine_s"])

            def ip128(n=n) -> float:
                return b.iperf_client("127.0.0.1", port, n, seconds)

            def ip1m(n=n) -> float:
                return b.iperf_client("127.0.0.1", port, n, seconds, length="1M")

            s = measure(b, [("automdt", ours), ("iperf3_128k", ip128), ("iperf3_1m", ip1m)])
            mo, m128, m1m = median(s["automdt"]), median(s["iperf3_128k"]), median(s["iperf3_1m"])
            row = {"streams": n, "automdt_gbit": mo, "iperf3_128k_gbit": m128, "iperf3_1m_gbit": m1m,
                   "ratio_128k": mo / m128, "ratio_1m": mo / m1m, "samples": s}
            out["rows"].append(row)
            say(f"  N={n} streams: automdt {mo:.2f} Gbit/s | iperf3 -P {n} {m128:.2f} Gbit/s (128 KiB writes), "
                f"{m1m:.2f} Gbit/s (-l 1M)")
            say(f"  N={n} ratio vs 128 KiB writes {mo / m128:.2f}x ({verdict(mo / m128, 0.5)}); "
                f"ratio vs -l 1M {mo / m1m:.2f}x ({verdict(mo / m1m, 0.5)})")
        shutil.rmtree(dest, ignore_errors=True)
    finally:
        PROCS.stop(ip)
    return out


# ---------------------------------------------------------------------- 3. datasets vs peers
class Rsync:
    def __init__(self, b: Bench) -> None:
        self.b = b
        self.port = free_port()
        self.dst_root = fresh_dir(os.path.join(b.scratch, "rsync-dst"))
        conf = os.path.join(b.scratch, "rsyncd.conf")
        with open(conf, "w") as f:
            f.write(f"use chroot = false\nuid = root\ngid = root\nmax connections = 8\n"
                    f"log file = {os.path.join(b.scratch, 'rsyncd.log')}\n"
                    f"[src]\n  path = {b.data_root}\n  read only = true\n"
                    f"[dst]\n  path = {self.dst_root}\n  read only = false\n")
        self.proc = PROCS.start(["rsync", "--daemon", "--no-detach", "--address", "127.0.0.1",
                                 "--port", str(self.port), "--config", conf],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port("127.0.0.1", self.port, 10, self.proc)

    def settings(self, ds: Dataset) -> List[Tuple[str, Callable[[], float]]]:
        url = f"rsync://127.0.0.1:{self.port}"
        flags = ["-a", "--whole-file", "--inplace"]
        dst = os.path.join(self.dst_root, "d")
        rel = os.path.relpath(ds.path, self.b.data_root)

        def push() -> float:
            with destination(dst, ds):
                return self._run(["rsync"] + flags + [ds.path + "/", f"{url}/dst/d/"], ds, dst)

        def pull() -> float:
            with destination(dst, ds):
                return self._run(["rsync"] + flags + [f"{url}/src/{rel}/", dst + "/"], ds, dst)

        return [("rsync push -a -W --inplace", push), ("rsync pull -a -W --inplace", pull)]

    def _run(self, argv: List[str], ds: Dataset, dst: str) -> float:
        r = run_timed(argv, timeout_for(ds.total), self.b.scratch)
        if r.rc != 0:
            raise RuntimeError(f"rsync exit {r.rc}: {r.stderr.strip()[-300:]}")
        self.b.check_tree(dst, ds, "rsync")
        return gbit(ds.total, r.wall)

    def close(self) -> None:
        PROCS.stop(self.proc)


class GridFTP:
    """globus-gridftp-server in anonymous clear-text mode on 127.0.0.1 (-aa; as root it needs an
    anonymous user to setuid to, here 'nobody', so the destination directory belongs to it)."""

    def __init__(self, b: Bench) -> None:
        self.b = b
        for tool in ("globus-gridftp-server", "globus-url-copy"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} not installed (apt-get install -y globus-gass-copy-progs "
                                   "globus-gridftp-server-progs)")
        self.uid = pwd.getpwnam("nobody").pw_uid
        self.dst = os.path.join(b.scratch, "gridftp-dst")
        self.port = free_port()
        self.log = open(os.path.join(b.scratch, "gridftp.log"), "wb")
        self.proc = PROCS.start(["globus-gridftp-server", "-aa", "-anonymous-user", "nobody",
                                 "-p", str(self.port), "-control-interface", "127.0.0.1",
                                 "-data-interface", "127.0.0.1", "-home-dir", "/"],
                                stdout=self.log, stderr=subprocess.STDOUT)
        wait_port("127.0.0.1", self.port, 15, self.proc)

    def settings(self, ds: Dataset) -> List[Tuple[str, Callable[[], float]]]:
        url = f"ftp://127.0.0.1:{self.port}"
        out = []
        combos = [(2, 2), (4, 4)] if ds.nfiles <= 16 else [(4, 1), (8, 2)]
        for cc, p in combos:
            def run(cc=cc, p=p) -> float:
                with destination(self.dst, ds, owner=self.uid):
                    argv = ["globus-url-copy", "-cc", str(cc), "-p", str(p), "-fast", "-r",
                            f"file://{ds.path}/", f"{url}{self.dst}/"]
                    r = run_timed(argv, timeout_for(ds.total), self.b.scratch)
                    if r.rc != 0:
                        raise RuntimeError(f"globus-url-copy exit {r.rc}: "
                                           f"{(r.stderr or r.stdout).strip()[-300:]}")
                    self.b.check_tree(self.dst, ds, "globus-url-copy")
                return gbit(ds.total, r.wall)
            out.append((f"globus-url-copy -cc {cc} -p {p} -fast", run))
        return out

    def close(self) -> None:
        PROCS.stop(self.proc)
        self.log.close()
        shutil.rmtree(self.dst, ignore_errors=True)


def section_datasets(b: Bench) -> Dict[str, Any]:
    out: Dict[str, Any] = {"peers_unavailable": {}, "datasets": {}}
    peers: List[Any] = []
    if shutil.which("rsync"):
        try:
            peers.append(Rsync(b))
        except Exception as e:
            out["peers_unavailable"]["rsync"] = str(e)
    else:
        out["peers_unavailable"]["rsync"] = "rsync not installed (apt-get install -y rsync)"
    try:
        peers.append(GridFTP(b))
    except Exception as e:
        out["peers_unavailable"]["gridftp"] = str(e)
    for name, why in out["peers_unavailable"].items():
        say(f"  peer {name} unavailable: {why}")
    threads = ["2,2,2", "2,4,2", "4,4,4"]
    chunks = ["1Mi", "4Mi"]
    say("  tmpfs to tmpfs on loopback; Gbit/s = dataset bytes / wall time of the whole command "
        "(automdt: also in-process time, from its --json 'seconds')")
    try:
        for dname in ("large", "small"):
            ds = b.data.get(dname)
            ok, why = room_for(ds.total)
            if not ok:
                out["datasets"][dname] = {"skipped": why}
                say(f"  {ds.label()}: skipped: {why}")
                continue
            dest = os.path.join(b.scratch, "ds-dst")
            engine: Dict[str, List[float]] = {}
            ours_list = []
            for t in threads:
                for c in chunks:
                    key = f"automdt --threads {t} --chunk-size {c}"
                    engine[key] = []

                    def run(t=t, c=c, key=key) -> float:
                        with destination(dest, ds):
                            r = b.ours(ds, dest, t, chunk=c, verify=dest)
                        engine[key].append(gbit(r["bytes"], r["engine_s"]))
                        return gbit(r["bytes"], r["wall_s"])
                    ours_list.append((key, run))
            peer_list = [s for p in peers for s in p.settings(ds)]
            # warm-up runs also append to engine[...]: drop them below
            s = measure(b, interleave(ours_list, peer_list))
            shutil.rmtree(dest, ignore_errors=True)
            med = {k: median(v) for k, v in s.items()}
            eng = {k: median(v[1:]) for k, v in engine.items()}
            best_ours = max((k for k, _ in ours_list), key=lambda k: med[k])
            res: Dict[str, Any] = {"label": ds.label(), "bytes": ds.total, "median_gbit": med,
                                   "automdt_inprocess_gbit": eng, "samples": s, "best_ours": best_ours}
            say(f"  {ds.label()} ({fmt_size(ds.total)}):")
            for k, _ in ours_list:
                say(f"    {k:<46} {med[k]:6.2f} Gbit/s (in-process {eng[k]:.2f})")
            for k, _ in peer_list:
                say(f"    {k:<46} {med[k]:6.2f} Gbit/s")
            if peer_list:
                best_peer = max((k for k, _ in peer_list), key=lambda k: med[k])
                ratio = med[best_ours] / med[best_peer]
                res.update(best_peer=best_peer, ratio=ratio, ratio_inprocess=eng[best_ours] / med[best_peer])
                say(f"    best automdt: {med[best_ours]:.2f} Gbit/s ({best_ours.split(' ', 1)[1]}); "
                    f"best peer: {med[best_peer]:.2f} Gbit/s ({best_peer})")
                say(f"    ratio automdt/best peer {ratio:.2f}x (in-process time: "
                    f"{eng[best_ours] / med[best_peer]:.2f}x)")
            else:
                say("    no peer available: no ratio")
            out["datasets"][dname] = res
    finally:
        for p in peers:
            p.close()
    return out


# ---------------------------------------------------------------------- 4. memory
def section_memory(b: Bench) -> Dict[str, Any]:
    ds = b.data.get("large")
    ok, why = room_for(ds.total)
    if not ok:
        return {"skipped": why}
    caps = ["16Mi", "64Mi"] if b.quick else ["64Mi", "256Mi"]
    threads = "4,4,4"
    dest = os.path.join(b.scratch, "mem-dst")
    base = run_timed([sys.executable, "-c", "import automdt.cli, automdt.sender, automdt.receiver, "
                      "automdt.transfer_engine"], 60, b.scratch)
    base_mib = base.maxrss_kib / 1024
    say(f"  local mode, dataset {ds.label()}, threads {threads}, chunk 4Mi; peak RSS from wait4() of the "
        f"transferring process; interpreter + imports alone: {base_mib:.0f} MiB")
    rss: Dict[str, List[float]] = {c: [] for c in caps}
    speed: Dict[str, List[float]] = {c: [] for c in caps}

    def mk(cap: str) -> Callable[[], float]:
        def run() -> float:
            with destination(dest, ds):
                r = b.ours(ds, dest, threads, memory=cap, verify=dest)
            rss[cap].append(r["maxrss_kib"] / 1024)
            speed[cap].append(gbit(r["bytes"], r["engine_s"]))
            return r["maxrss_kib"] / 1024
        return run

    measure(b, [(c, mk(c)) for c in caps])
    shutil.rmtree(dest, ignore_errors=True)
    out: Dict[str, Any] = {"dataset": ds.label(), "baseline_rss_mib": base_mib, "rows": []}
    for c in caps:
        cap_mib = 2 * _mib(c)
        peak = max(rss[c])
        row = {"memory": c, "buffers_cap_mib": cap_mib, "peak_rss_mib_max": peak,
               "peak_rss_mib_median": median(rss[c][1:]), "above_baseline_mib": peak - base_mib,
               "ratio_to_cap": (peak - base_mib) / cap_mib, "gbit_median": median(speed[c][1:]),
               "samples_mib": rss[c]}
        out["rows"].append(row)
        say(f"  --memory {c}: peak RSS {peak:.0f} MiB (max of {len(rss[c])} runs), {peak - base_mib:.0f} MiB "
            f"above the interpreter; cap 2 x {c} = {cap_mib:.0f} MiB; (peak - interpreter)/cap "
            f"{(peak - base_mib) / cap_mib:.2f}x; {median(speed[c][1:]):.2f} Gbit/s")
    return out


# ---------------------------------------------------------------------- 5. encryption cost
def section_encrypt(b: Bench) -> Dict[str, Any]:
    ds = b.data.get("large")
    ok, why = room_for(ds.total)
    if not ok:
        return {"skipped": why}
    out: Dict[str, Any] = {"dataset": ds.label(), "rows": []}
    say(f"  plain vs --encrypt, dataset {ds.label()}, chunk 4Mi, interleaved")

    def row(where: str, n: int, s: Dict[str, List[float]], cpu: Dict[str, List[float]],
            cpu_of: str = "both ends") -> None:
        mp, me = median(s["plain"]), median(s["encrypted"])
        cp, ce = median(cpu["plain"]), median(cpu["encrypted"])
        out["rows"].append({"where": where, "cpu_of": cpu_of, "net_threads": n, "plain_gbit": mp, "encrypted_gbit": me,
                            "ratio": me / mp, "plain_cpu_s_per_gb": cp, "encrypted_cpu_s_per_gb": ce,
                            "samples": s, "cpu_samples": cpu})
        say(f"  {where}, threads 2,{n},2: plain {mp:.2f} Gbit/s, encrypted {me:.2f} Gbit/s "
            f"({me / mp:.2f}x); CPU {cp:.2f} -> {ce:.2f} s per GB ({cpu_of})")

    dest = os.path.join(b.scratch, "enc-dst")
    for n in ([2] if b.quick else [2, 4]):
        cpu: Dict[str, List[float]] = {"plain": [], "encrypted": []}

        def run(extra: List[str], key: str, n=n) -> float:
            # a local --encrypt takes the local link unencrypted, as a plain one does: both ends
            # in this process over loopback TCP instead (TLS against plain on the same transport)
            with destination(dest, ds):
                r = b.ours(ds, dest, f"2,{n},2", extra=extra + ["--switch", "local_link=0"], verify=dest)
            cpu[key].append(r["cpu_s"] / (r["bytes"] / 1e9))
            return gbit(r["bytes"], r["engine_s"])

        s = measure(b, [("plain", lambda: run([], "plain")), ("encrypted", lambda: run(["--encrypt"], "encrypted"))])
        for k in cpu:
            cpu[k] = cpu[k][1:]  # drop the warm-up run
        row("loopback", n, s, cpu)
    shutil.rmtree(dest, ignore_errors=True)

    ok, why = netns_available()
    if not ok:
        out["link"] = {"skipped": why}
        return out
    rate = "1gbit"
    link = NetnsPair(rate=rate, qdisc=b.args.qdisc).open()
    servers: List[subprocess.Popen] = []
    try:
        secret = os.path.join(b.scratch, "enc-secret")
        with open(os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        in_a = link.exec_argv("a", [])
        for enc, port in ((False, 47011), (True, 47012)):
            root = fresh_dir(os.path.join(b.scratch, f"enc-root-{int(enc)}"))
            argv = b.automdt + ["receive", "--listen", f"{link.addr_b}:{port}", "--root", root,
                                "--secret-file", secret, "--idle-timeout", "120"] + (["--encrypt"] if enc else [])
            p = PROCS.start(link.exec_argv("b", argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            servers.append(p)
            wait_port(link.addr_b, port, 30, p, in_a)
        cpu = {"plain": [], "encrypted": []}

        def over_link(enc: bool) -> float:
            root = os.path.join(b.scratch, f"enc-root-{int(enc)}")
            key = "encrypted" if enc else "plain"
            with destination(root, ds, keep_dir=True):
                r = b.ours(ds, f"{link.addr_b}:{47012 if enc else 47011}", "2,2,2", prefix=in_a,
                           extra=["--secret-file", secret] + (["--encrypt"] if enc else []), verify=root)
            cpu[key].append(r["cpu_s"] / (r["bytes"] / 1e9))  # sender side only
            return gbit(r["bytes"], r["engine_s"])

        s = measure(b, [("plain", lambda: over_link(False)), ("encrypted", lambda: over_link(True))])
        for k in cpu:
            cpu[k] = cpu[k][1:]
        row(f"veth {rate}", 2, s, cpu, cpu_of="sender process")
    finally:
        for p in servers:
            PROCS.stop(p)
        link.close()
    return out


def _mib(spec: str) -> float:
    return float(spec[:-2]) if spec.endswith("Mi") else float(spec) / MiB


# ---------------------------------------------------------------------- main
TITLES = {
    "link": "1. Link-limited: automdt (two namespaces) vs iperf3 on the same rate-limited veth",
    "loopback": "2. Loopback: automdt local mode vs iperf3 -c 127.0.0.1",
    "datasets": "3. Datasets, tmpfs to tmpfs: automdt vs rsync daemon and GridFTP",
    "memory": "4. Memory: peak RSS vs the staging-buffer caps (two buffers in local mode)",
    "encrypt": "5. Encryption: --encrypt (TLS 1.3 + CURVE) vs plain",
}
NEEDS = {"link": {"large"}, "loopback": {"large"}, "datasets": {"large", "small"}, "memory": {"large"},
         "encrypt": {"large"}}
RUNNERS = {"link": section_link, "loopback": section_loopback, "datasets": section_datasets,
           "memory": section_memory, "encrypt": section_encrypt}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes and short runs (a smoke run)")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions per figure (default 3)")
    ap.add_argument("--only", default="", help=f"comma list of sections: {','.join(SECTIONS)}")
    ap.add_argument("--json", metavar="FILE", help="write every figure (and raw samples) to FILE")
    ap.add_argument("--keep", action="store_true",
                    help=f"keep the generated datasets in {SHM}/automdt-bench-data and reuse them next time")
    ap.add_argument("--data-dir", help="where the datasets live (never removed by the script)")
    ap.add_argument("--rate", default="5gbit", help="link rate of the link section (tc syntax, default 5gbit)")
    ap.add_argument("--qdisc", default="tbf", choices=["tbf", "htb"], help="rate-limiting qdisc (default tbf)")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    wanted = [s.strip() for s in args.only.split(",") if s.strip()] or list(SECTIONS)
    bad = [s for s in wanted if s not in SECTIONS]
    if bad:
        ap.error(f"unknown section(s) {bad}; choose from {','.join(SECTIONS)}")
    args.sections = wanted
    rate_bits(args.rate)
    return args


def reap_stale_runs() -> None:
    """Remove what an earlier run of this script left when it was killed outright: its scratch
    directory (named after its PID) and its namespaces, if that PID is gone."""
    for name in os.listdir(SHM):
        m = re.match(r"^automdt-bench-(\d+)$", name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            shutil.rmtree(os.path.join(SHM, name), ignore_errors=True)
            say(f"(removed {SHM}/{name}, left by a killed run)")
    for ns in reap_stale():
        say(f"(removed namespace {ns}, left by a killed run)")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    reap_stale_runs()

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    t_start = time.perf_counter()
    bench = Bench(args)
    atexit.register(bench.cleanup)
    failed = False
    try:
        say(f"automdt transfer-engine benchmark  {time.strftime('%Y-%m-%d %H:%M:%S')}  "
            f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
            f"{'quick, ' if args.quick else ''}medians of {args.reps} interleaved rep(s) after 1 warm-up")
        for sec in args.sections:
            say()
            say(f"== {TITLES[sec]}")
            t0 = time.perf_counter()
            try:
                res = RUNNERS[sec](bench)
            except (Exception, TimeoutError) as e:
                failed = True
                res = {"error": f"{type(e).__name__}: {e}"}
                say(f"  FAILED: {res['error']}")
            if "skipped" in res:
                say(f"  skipped: {res['skipped']}")
            res["seconds"] = round(time.perf_counter() - t0, 1)
            if not args.keep and not args.data_dir:
                later = args.sections[args.sections.index(sec) + 1:]
                needed = set().union(*(NEEDS[s] for s in later)) if later else set()
                for name in list(bench.data.sets):
                    if name not in needed:
                        bench.data.release(name)
            bench.results[sec] = res
            say(f"  ({res['seconds']:.0f} s)")
        total = time.perf_counter() - t_start
        say()
        say(f"total {total:.0f} s, load average now {os.getloadavg()[0]:.1f}")
        if args.json:
            doc = {"started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - total)),
                   "host": platform.node(), "cpus": os.cpu_count(), "quick": args.quick, "reps": args.reps,
                   "seconds": round(total, 1), "sections": bench.results}
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=2)
            say(f"figures written to {args.json}")
    finally:
        bench.cleanup()
        atexit.unregister(bench.cleanup)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
