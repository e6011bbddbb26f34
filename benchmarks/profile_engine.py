#!/usr/bin/env python3
"""Where a transfer's CPU goes: `perf` profiles of `automdt transfer`, broken down per activity.

One profiled run of the CLI (after one untimed warm-up), tmpfs to tmpfs, in one or both of:
  local   `automdt transfer SRC DSTDIR` (receiver in the same process, the local link;
          --extra='--switch=local_link=0': loopback TCP)
  netns   `automdt receive` in namespace B, `automdt transfer SRC 10.77.0.2:PORT` in namespace A,
          over a veth pair without a rate limit (automdt.experiments.netns)
  gridftp the peer measured the same way between the same namespaces: `globus-url-copy -fast
          -cc 4 -p 4` in A to `globus-gridftp-server` in B (client and server profiled apart)

Each process is sampled with `perf record -g` (cpu-clock; this VM has no hardware counters) and
every sample is put in one activity by its kernel call chain (the system call it is in) or its
user-space symbol: read (pread of the source), hash (sender), send, receive, TCP input, verify,
write, page-cache allocation, journal, wake-ups, per-file system calls, Python, ... An activity's
CPU-seconds per GB is its share of the samples times the process's CPU time (getrusage /
/proc/PID/stat) divided by the GB moved. A second run under `perf stat` counts context
switches, migrations and page faults; `--strace` adds a third run under `strace -c -f` for
system-call counts (strace slows the run a lot: counts only, no times).

    .venv/bin/python benchmarks/profile_engine.py                          # large, local + netns
    .venv/bin/python benchmarks/profile_engine.py --dataset small --mode local --strace
    .venv/bin/python benchmarks/profile_engine.py --threads 2,2,2 --extra=--encrypt --json out.json
    .venv/bin/python benchmarks/profile_engine.py --mode netns,gridftp --prefix amdt-n-   # side by side

Needs root (perf, namespaces) and Debian's linux-perf (and strace for --strace). Datasets are
random data in /dev/shm/amdt-prof-<pid>/ (or --data-dir, kept), removed at exit with the
namespaces (amdt-prof-A/B-<pid>-<tag>; --prefix changes "amdt-prof-") and every process started,
each ended by its PID.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Dict, List, Optional, Sequence, Set, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from automdt.experiments.netns import NetnsPair, netns_available  # noqa: E402

MiB = 1 << 20
DATASETS = {"large": (8, 256 * MiB), "small": (2000, MiB), "tiny": (20000, 64 << 10)}

# ------------------------------------------------------------------ classification
# Activities in print order. "receive" is the recv() system call (TCP receive queue -> user
# copy); "TCP input" is the softirq work of the receiving side (on loopback and veth it runs
# in the sender's send() call, on the same CPU).
ACTIVITIES = [
    "read (pread of the source)",
    "hash (sender)",
    "send (TCP output)",
    "TCP input (softirq)",
    "receive (recv)",
    "verify (receiver hash)",
    "hash (caller unknown)",
    "write (copy into page cache)",
    "page-cache allocation",
    "journal (write)",
    "wake-ups, waits, scheduling",
    "per-file system calls",
    "memory mapping",
    "page faults",
    "TLS / OpenSSL (also hashlib)",
    "engine bookkeeping (user)",
    "libc (memcpy, e.g. OpenSSL's into slots; locks)",
    "Python (start-up, control loop, session)",
    "control channel (zmq)",
    "GridFTP user space (globus libraries)",
    "other kernel",
    "other",
]

_SYSCALL = re.compile(r"^(?:__x64_sys_|__do_sys_|__se_sys_|ksys_|__sys_|___sys_|____sys_)(\w+)$")
# system calls whose __x64_sys_ frame the compiler inlined: their first own frame names them
_INLINED = {"do_writev": "writev", "do_readv": "readv"}
_PER_FILE = {"openat", "openat2", "open", "close", "close_range", "newfstatat", "newfstat", "fstat", "statx",
             "renameat", "renameat2", "rename", "unlinkat", "unlink", "ftruncate", "truncate", "fchmod",
             "fchmodat", "utimensat", "getdents64", "mkdirat", "mkdir", "fsync", "fdatasync", "lseek",
             "fchown", "fadvise64", "fallocate", "readlinkat", "newlstat", "newstat", "faccessat2",
             "access", "fcntl", "flock", "linkat", "symlinkat", "sync_file_range"}
_WAITS = {"futex", "poll", "ppoll", "epoll_wait", "epoll_pwait", "select", "pselect6", "nanosleep",
          "clock_nanosleep", "sched_yield", "wait4"}
_MMAP = {"mmap", "mmap_pgoff", "munmap", "mprotect", "brk", "madvise", "mremap"}
_SCHED = {"__schedule", "schedule", "try_to_wake_up", "finish_task_switch", "finish_task_switch.isra.0",
          "wake_up_q", "__wake_up_common", "futex_wake", "futex_wait", "schedule_timeout",
          "__wake_up_sync_key", "sock_def_readable", "sk_stream_write_space", "ttwu_do_activate",
          "dequeue_task_fair", "enqueue_task_fair", "pick_next_task_fair", "update_curr"}
_PAGE_ALLOC = {"shmem_alloc_and_add_folio", "shmem_alloc_folio", "shmem_add_to_page_cache",
               "__filemap_add_folio", "filemap_add_folio", "folio_batch_move_lru", "__folio_batch_add_and_move",
               "mem_cgroup_charge", "__mem_cgroup_charge", "shmem_inode_acct_blocks", "clear_page_erms",
               "clear_page_rep", "clear_page_orig"}
_FILE_READ = {"shmem_file_read_iter", "filemap_read", "generic_file_read_iter"}
_FILE_WRITE = {"shmem_file_write_iter", "generic_perform_write", "__generic_file_write_iter",
               "generic_file_write_iter"}
_RX_SOFTIRQ = {"net_rx_action", "process_backlog", "__netif_receive_skb", "tcp_v4_rcv", "tcp_v6_rcv",
               "ip_rcv", "ipv6_rcv", "__napi_poll"}


def classify(frames: List[Tuple[str, str]]) -> str:
    """frames: [(symbol, dso)] leaf first. Returns one of ACTIVITIES."""
    if not frames:
        return "other"
    syms = [s for s, _ in frames]
    leaf_sym, leaf_dso = frames[0]
    user = [(s, d) for s, d in frames if "kernel" not in d]
    syscall = None
    for s in reversed(syms):  # the outermost system-call frame
        m = _SYSCALL.match(s)
        if m or s in _INLINED:
            syscall = m.group(1) if m else _INLINED[s]
            break
    in_engine = any(s.startswith("amdt_") for s, _ in user)
    if "kernel" not in leaf_dso:
        return _user_activity(syms, leaf_sym, leaf_dso, in_engine)
    symset = set(syms)
    if syscall is not None:
        return _syscall_activity(syscall, symset, in_engine, bool(user))
    if symset & {"exc_page_fault", "asm_exc_page_fault", "handle_mm_fault"}:
        return "page faults"
    if symset & _RX_SOFTIRQ:
        return "TCP input (softirq)"
    if symset & _SCHED:
        return "wake-ups, waits, scheduling"
    return "other kernel"


def _syscall_activity(syscall: str, symset: Set[str], in_engine: bool, has_user: bool) -> str:
    """The activity of a kernel sample inside system call ``syscall`` (``symset``: its stack)."""
    if syscall in _WAITS or symset & _SCHED:
        return "wake-ups, waits, scheduling"
    if syscall in ("pread64", "preadv", "preadv2"):
        return "read (pread of the source)"
    if syscall in ("sendmsg", "sendto", "sendfile64", "sendfile", "sendmmsg", "splice", "vmsplice"):
        if syscall in ("splice", "vmsplice") and "skb_splice_bits" in symset:
            return "receive (recv)"
        if syscall in ("splice",) and ({"iter_file_splice_write", "splice_to_pipe"} & symset) \
                and not ({"tcp_sendmsg", "tcp_sendmsg_locked"} & symset):
            return "write (copy into page cache)" if "iter_file_splice_write" in symset else "read (pread of the source)"
        if symset & _RX_SOFTIRQ:
            return "TCP input (softirq)"
        return "send (TCP output)"
    if syscall in ("recvfrom", "recvmsg", "recvmmsg"):
        return "receive (recv)"
    if syscall in ("pwrite64", "pwritev", "pwritev2", "copy_file_range"):
        return "page-cache allocation" if symset & _PAGE_ALLOC else "write (copy into page cache)"
    if syscall in ("write", "writev"):
        if symset & {"tcp_sendmsg", "tcp_sendmsg_locked", "sock_write_iter"}:
            return "TCP input (softirq)" if symset & _RX_SOFTIRQ else "send (TCP output)"
        if symset & {"sock_read_iter", "tcp_recvmsg"}:
            return "receive (recv)"
        if in_engine or not has_user:
            return "journal (write)"
        if symset & _PAGE_ALLOC:  # a data write() of another program (GridFTP's server)
            return "page-cache allocation"
        if symset & _FILE_WRITE:
            return "write (copy into page cache)"
        return "other kernel"
    if syscall in ("read", "readv"):
        if symset & {"tcp_recvmsg", "sock_read_iter"}:
            return "receive (recv)"
        if symset & _FILE_READ:  # a data read() of another program (GridFTP's client)
            return "read (pread of the source)"
        return "other kernel"
    if syscall in _PER_FILE:
        return "per-file system calls"
    if syscall in _MMAP:
        return "memory mapping"
    return "other kernel"


def _user_activity(syms: List[str], leaf_sym: str, leaf_dso: str, in_engine: bool) -> str:
    """The activity of a user-space sample (its leaf ``leaf_sym`` in ``leaf_dso``)."""
    if leaf_sym.startswith(("XXH", "amdt_avx2_", "amdt_lib_", "amdt_hash")) or "xxhash" in leaf_dso:
        if any(s.startswith(("amdt_read", "amdt_reader")) for s in syms):
            return "hash (sender)"
        if any(s.startswith(("amdt_conn_body", "amdt_writer")) for s in syms):
            return "verify (receiver hash)"
        return "hash (caller unknown)"
    if "libcrypto" in leaf_dso or "libssl" in leaf_dso:
        return "TLS / OpenSSL (also hashlib)"
    if "_engine" in leaf_dso or in_engine:
        return "engine bookkeeping (user)"
    if "globus" in leaf_dso:
        return "GridFTP user space (globus libraries)"
    if "libzmq" in leaf_dso or "zmq" in leaf_dso:
        return "control channel (zmq)"
    if "libc.so" in leaf_dso or "libc-" in leaf_dso:
        return "libc (memcpy, e.g. OpenSSL's into slots; locks)"
    if "python" in leaf_dso or "site-packages" in leaf_dso or "ld-linux" in leaf_dso \
            or leaf_dso.endswith(".so") or "[unknown]" in leaf_dso:
        return "Python (start-up, control loop, session)"
    return "other"


def perf_samples(data: str, pids: Optional[Sequence[int]] = None) -> Counter:
    """Activity -> sample count of a perf.data file (optionally only the given PIDs)."""
    p = subprocess.run(["perf", "script", "-i", data, "-F", "pid,ip,sym,dso"], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True, errors="replace")
    counts: Counter = Counter()
    want = set(pids) if pids else None
    frames: List[Tuple[str, str]] = []
    pid = None

    def flush() -> None:
        if pid is not None and (want is None or pid in want):
            counts[classify(frames)] += 1

    for line in p.stdout.splitlines():
        if not line.strip():
            continue
        if not line.startswith("\t"):  # a sample's header ("  PID"), then its frames (tab first)
            flush()
            frames = []
            try:
                pid = int(line.split()[0])
            except ValueError:
                pid = None
            continue
        parts = line.strip().split(None, 1)
        rest = parts[1] if len(parts) > 1 else ""
        m = re.match(r"^(.*) \((.*)\)$", rest)
        sym, dso = (m.group(1), m.group(2)) if m else (rest, "")
        sym = re.sub(r"\+0x[0-9a-f]+$", "", sym)
        frames.append((sym, dso))
    flush()
    return counts


# ------------------------------------------------------------------ processes and data
STARTED: Dict[int, subprocess.Popen] = {}


def start(argv: Sequence[str], **kw) -> subprocess.Popen:
    p = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, **kw)
    STARTED[p.pid] = p
    return p


def stop(p: subprocess.Popen, sig: int = signal.SIGTERM, grace: float = 10.0) -> None:
    if p.poll() is None:
        try:
            p.send_signal(sig)
            p.wait(grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(grace)
    STARTED.pop(p.pid, None)


def proc_cpu(pid: int) -> float:
    """utime + stime of the whole process (exited threads included), seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def generate(root: str, nfiles: int, size: int) -> str:
    import numpy as np

    path = os.path.join(root, f"{nfiles}x{size}")
    stamp = path + ".complete"
    if os.path.exists(stamp):
        return path
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    gen = np.random.SFC64(nfiles * 1000003 + size)
    width = len(str(nfiles - 1))
    for i in range(nfiles):
        with open(os.path.join(path, f"f{i:0{width}d}.bin"), "wb") as f:
            f.write(memoryview(gen.random_raw((size + 7) // 8)).cast("B")[:size])
    open(stamp, "w").close()
    return path


def automdt() -> List[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "automdt")
    return [exe] if os.access(exe, os.X_OK) else [sys.executable, "-m", "automdt"]


def run_wait(argv: Sequence[str], timeout: float) -> Tuple[int, float, float, str]:
    """Run to completion: (exit code, wall s, 0.0, stdout); CPU time comes from children_cpu()."""
    t0 = time.perf_counter()
    p = start(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(p, signal.SIGKILL)
        raise
    wall = time.perf_counter() - t0
    STARTED.pop(p.pid, None)
    if p.returncode != 0:
        sys.stderr.write(err.decode(errors="replace")[-2000:])
    return p.returncode, wall, 0.0, out.decode(errors="replace")


def children_cpu() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def breakdown(parts: Sequence[Tuple[str, str, float]], gb: float) -> Dict:
    """(who, perf.data, CPU seconds) per process -> CPU-s/GB per activity: each activity's share
    of the process's samples times its CPU seconds (of an unprofiled run), over the GB moved."""
    total: Dict[str, float] = Counter()
    per_proc: Dict[str, Dict[str, float]] = {}
    for who, data, cpu in parts:
        counts = perf_samples(data)
        n = sum(counts.values()) or 1
        per_proc[who] = {k: cpu * v / n / gb for k, v in counts.items()}
        for k, v in per_proc[who].items():
            total[k] += v
    return {"breakdown_cpu_s_per_gb": dict(total), "breakdown_per_process": per_proc}


# ------------------------------------------------------------------ one profile
class Setup:
    """Where a transfer runs: local mode, or a receiver in namespace B."""

    def __init__(self, mode: str, scratch: str, extra: Sequence[str], prefix: str = "amdt-prof-") -> None:
        self.mode, self.scratch, self.extra, self.prefix = mode, scratch, list(extra), prefix
        self.link: Optional[NetnsPair] = None
        self.rx: Optional[subprocess.Popen] = None
        self.dst = os.path.join(scratch, f"dst-{mode}")

    def __enter__(self) -> "Setup":
        if self.mode == "netns":
            self.link = NetnsPair(rate=None, prefix=self.prefix).open()
            secret = os.path.join(self.scratch, "secret")
            if not os.path.exists(secret):
                with open(os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                    f.write(os.urandom(32).hex() + "\n")
            os.makedirs(self.dst, exist_ok=True)
            self.port = 47101
            enc = ["--encrypt"] if "--encrypt" in self.extra else []
            self.rx_log = open(os.path.join(self.scratch, "receiver.log"), "wb")
            self.rx = start(self.link.exec_argv("b", automdt() + [
                "receive", "--listen", f"{self.link.addr_b}:{self.port}", "--root", self.dst,
                "--secret-file", secret, "--idle-timeout", "300"] + enc), stdout=self.rx_log, stderr=subprocess.STDOUT)
            self.extra += ["--secret-file", secret]
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                ok = subprocess.run(self.link.exec_argv("a", [sys.executable, "-c",
                                    f"import socket; socket.create_connection(('{self.link.addr_b}', {self.port}), 1)"]),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
                if ok:
                    break
                time.sleep(0.2)
        return self

    def __exit__(self, *exc) -> None:
        if self.rx is not None:
            stop(self.rx)
        if self.link is not None:
            self.link.close()
        shutil.rmtree(self.dst, ignore_errors=True)

    def clear(self) -> None:
        if self.mode == "netns":
            for e in os.listdir(self.dst):
                p = os.path.join(self.dst, e)
                shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)
        else:
            shutil.rmtree(self.dst, ignore_errors=True)

    def argv(self, src: str, threads: Optional[str], wrap: Sequence[str] = ()) -> List[str]:
        dest = f"{self.link.addr_b}:{self.port}" if self.link else self.dst
        cmd = automdt() + ["transfer", src, dest, "--json"] + (["--threads", threads] if threads else []) + self.extra
        cmd = list(wrap) + cmd
        return self.link.exec_argv("a", cmd) if self.link else cmd


def profile(mode: str, src: str, nbytes: int, threads: Optional[str], extra: Sequence[str], scratch: str,
            do_strace: bool, freq: int, prefix: str = "amdt-prof-") -> Dict:
    out: Dict = {"mode": mode, "threads": threads, "extra": list(extra)}
    gb = nbytes / 1e9
    timeout = 120 + nbytes / 20e6
    with Setup(mode, scratch, extra, prefix) as st:
        # warm-up (untimed): slots, page cache, the receiver's first session
        st.clear()
        rc, _, _, so = run_wait(st.argv(src, threads), timeout)
        if rc != 0:
            raise RuntimeError(f"warm-up transfer failed (exit {rc}): {so[-300:]}")

        # 1. perf record
        st.clear()
        data_tx = os.path.join(scratch, f"perf-{mode}-tx.data")
        data_rx = os.path.join(scratch, f"perf-{mode}-rx.data")
        rxperf = None
        rx_cpu0 = 0.0
        if st.rx is not None:
            rx_cpu0 = proc_cpu(st.rx.pid)
            rxperf = start(["perf", "record", "-g", "-F", str(freq), "-p", str(st.rx.pid), "-o", data_rx],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.5)
        c0 = children_cpu()
        rc, wall, _, so = run_wait(st.argv(src, threads, ["perf", "record", "-g", "-F", str(freq), "-o", data_tx, "--"]), timeout)
        tx_cpu = children_cpu() - c0  # perf itself included: corrected below with perf's own share
        rx_cpu = 0.0
        if rxperf is not None:
            rx_cpu = proc_cpu(st.rx.pid) - rx_cpu0
            stop(rxperf, signal.SIGINT, 30)
        if rc != 0:
            raise RuntimeError(f"profiled transfer failed (exit {rc})")
        summary = json.loads(so.strip().splitlines()[-1])
        out["seconds_inprocess"] = summary["seconds"]
        out["wall_s"] = wall

        # 2. perf stat (context switches, migrations, page faults) and the CPU time without perf
        st.clear()
        stat_tx = os.path.join(scratch, f"stat-{mode}-tx.csv")
        stat_rx = os.path.join(scratch, f"stat-{mode}-rx.csv")
        events = "task-clock,context-switches,cpu-migrations,page-faults"
        rxstat = None
        if st.rx is not None:
            rx_cpu0 = proc_cpu(st.rx.pid)
            rxstat = start(["perf", "stat", "-x,", "-e", events, "-p", str(st.rx.pid), "-o", stat_rx],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.5)
        c0 = children_cpu()
        rc, wall2, _, so = run_wait(st.argv(src, threads, ["perf", "stat", "-x,", "-e", events, "-o", stat_tx, "--"]), timeout)
        cpu_tx_plain = children_cpu() - c0
        cpu_rx_plain = 0.0
        if rxstat is not None:
            cpu_rx_plain = proc_cpu(st.rx.pid) - rx_cpu0
            stop(rxstat, signal.SIGINT, 30)
        stats = {"sender" if mode == "netns" else "process": _read_stat(stat_tx)}
        if rxstat is not None:
            stats["receiver"] = _read_stat(stat_rx)
        out["perf_stat"] = stats
        out["wall_s_stat_run"] = wall2
        out["cpu_s"] = {"sender" if mode == "netns" else "process": cpu_tx_plain}
        if mode == "netns":
            out["cpu_s"]["receiver"] = cpu_rx_plain
        total_cpu = cpu_tx_plain + cpu_rx_plain
        out["cpu_s_per_gb"] = total_cpu / gb
        del tx_cpu, rx_cpu

        # 3. the breakdown: sample shares of the profiled run x the CPU seconds of the plain run
        parts = [("sender" if mode == "netns" else "process", data_tx, cpu_tx_plain)]
        if mode == "netns":
            parts.append(("receiver", data_rx, cpu_rx_plain))
        out.update(breakdown(parts, gb))

        # 4. strace: system-call counts
        if do_strace and shutil.which("strace"):
            st.clear()
            sfile = os.path.join(scratch, f"strace-{mode}.txt")
            rc, _, _, _ = run_wait(st.argv(src, threads, ["strace", "-c", "-f", "-o", sfile, "--"]), timeout * 4)
            out["syscalls_sender_side" if mode == "netns" else "syscalls"] = _read_strace(sfile)
        st.clear()
    return out


def profile_gridftp(src: str, nbytes: int, scratch: str, freq: int, prefix: str, cc: int = 4, par: int = 4) -> Dict:
    """The peer measured the same way: `globus-url-copy -fast -cc CC -p P` in namespace A to a
    `globus-gridftp-server` in namespace B (anonymous, setuid nobody), one warm-up, then one run
    with the client under `perf record -g` and the server (and the session process it forks)
    under `perf record -g -p`, and one unprofiled run for the CPU seconds (client: rusage;
    server: its own and its reaped children's CPU)."""
    import pwd

    out: Dict = {"mode": f"netns gridftp -cc {cc} -p {par}", "threads": None, "extra": []}
    gb = nbytes / 1e9
    nobody = pwd.getpwnam("nobody").pw_uid
    dst = os.path.join(scratch, "dst-gridftp")
    link = NetnsPair(rate=None, prefix=prefix).open()
    srv = None
    try:
        srv_log = open(os.path.join(scratch, "gridftp.log"), "wb")
        srv = start(link.exec_argv("b", ["globus-gridftp-server", "-aa", "-anonymous-user", "nobody", "-p", "47102",
                                         "-control-interface", link.addr_b, "-data-interface", link.addr_b,
                                         "-home-dir", "/"]), stdout=srv_log, stderr=subprocess.STDOUT)
        time.sleep(1.0)

        def fresh() -> None:
            shutil.rmtree(dst, ignore_errors=True)
            os.makedirs(dst)
            os.chown(dst, nobody, -1)

        def srv_cpu() -> float:
            with open(f"/proc/{srv.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")

        def settle() -> None:
            end = time.monotonic() + 10
            while time.monotonic() < end:
                kids = subprocess.run(["pgrep", "-P", str(srv.pid)], stdout=subprocess.PIPE, text=True).stdout
                if not kids.strip():
                    return
                time.sleep(0.05)

        def argv(wrap: Sequence[str] = ()) -> List[str]:
            return link.exec_argv("a", list(wrap) + ["globus-url-copy", "-cc", str(cc), "-p", str(par), "-fast", "-r",
                                                      f"file://{src}/", f"ftp://{link.addr_b}:47102{dst}/"])

        timeout = 120 + nbytes / 20e6
        fresh()
        rc, _, _, _ = run_wait(argv(), timeout)
        if rc != 0:
            raise RuntimeError(f"GridFTP warm-up failed (exit {rc})")
        settle()
        # 1. perf record, client and server
        fresh()
        data_tx = os.path.join(scratch, "perf-gridftp-tx.data")
        data_rx = os.path.join(scratch, "perf-gridftp-rx.data")
        rxperf = start(["perf", "record", "-g", "-F", str(freq), "-p", str(srv.pid), "-o", data_rx],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        rc, wall, _, _ = run_wait(argv(["perf", "record", "-g", "-F", str(freq), "-o", data_tx, "--"]), timeout)
        settle()
        stop(rxperf, signal.SIGINT, 30)
        if rc != 0:
            raise RuntimeError(f"profiled GridFTP transfer failed (exit {rc})")
        out["wall_s"] = wall
        out["seconds_inprocess"] = wall
        # 2. CPU seconds without perf
        fresh()
        s0, c0 = srv_cpu(), children_cpu()
        rc, wall2, _, _ = run_wait(argv(), timeout)
        settle()
        cpu_tx, cpu_rx = children_cpu() - c0, srv_cpu() - s0
        out["wall_s_stat_run"] = wall2
        out["cpu_s"] = {"client": cpu_tx, "server": cpu_rx}
        out["cpu_s_per_gb"] = (cpu_tx + cpu_rx) / gb
        out["perf_stat"] = {}
        out.update(breakdown([("client", data_tx, cpu_tx), ("server", data_rx, cpu_rx)], gb))
    finally:
        if srv is not None:
            stop(srv)
        link.close()
        shutil.rmtree(dst, ignore_errors=True)
    return out


def _read_stat(path: str) -> Dict[str, float]:
    res = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.strip().split(",")
                if len(parts) >= 3 and parts[0] and not line.startswith("#"):
                    try:
                        res[parts[2]] = float(parts[0])
                    except ValueError:
                        pass
    except FileNotFoundError:
        pass
    return res


def _read_strace(path: str) -> Dict[str, int]:
    res = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 5 and parts[0][0].isdigit() and not line.startswith("100"):
                try:
                    calls = int(parts[3])
                except ValueError:
                    continue
                res[parts[-1]] = calls
    return res


# ------------------------------------------------------------------ main
def report(res: Dict, gb: float) -> None:
    mode = res["mode"]
    b = res["breakdown_cpu_s_per_gb"]
    total = res["cpu_s_per_gb"]
    cpu = res["cpu_s"]
    print(f"  {mode}: {total:.2f} CPU-s/GB ({', '.join(f'{k} {v:.2f} s' for k, v in cpu.items())}); "
          f"in-process {res['seconds_inprocess']:.2f} s, wall {res['wall_s']:.2f} s (under perf record)")
    for k in ACTIVITIES:
        if b.get(k, 0) >= 0.005:
            per = res["breakdown_per_process"]
            split = ""
            if len(per) > 1:
                split = "  (" + ", ".join(f"{w} {per[w].get(k, 0):.2f}" for w in per) + ")"
            print(f"    {k:<44} {b[k]:6.3f}{split}")
    for who, st in res["perf_stat"].items():
        cs = st.get("context-switches", 0)
        print(f"    perf stat {who}: {cs / gb:,.0f} context switches/GB, {st.get('cpu-migrations', 0) / gb:,.0f} "
              f"migrations/GB, {st.get('page-faults', 0) / gb:,.0f} page faults/GB")
    for key in ("syscalls", "syscalls_sender_side"):
        if key in res:
            top = sorted(res[key].items(), key=lambda kv: -kv[1])[:12]
            print(f"    system calls per GB ({key}): " + ", ".join(f"{k} {v / gb:,.0f}" for k, v in top))


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default="local,netns",
                    help="local, netns, gridftp (the peer between the same namespaces, -cc 4 -p 4; "
                         "comma list)")
    ap.add_argument("--dataset", default="large", choices=sorted(DATASETS),
                    help="large 8 x 256 MiB, small 2000 x 1 MiB, tiny 20000 x 64 KiB")
    ap.add_argument("--threads", default="4,4,4", help="--threads of the transfer ('' = the default policy)")
    ap.add_argument("--extra", action="append", default=[], help="one more argument for `automdt transfer`")
    ap.add_argument("--strace", action="store_true", help="also count system calls (strace -c -f)")
    ap.add_argument("--freq", type=int, default=997, help="perf sampling frequency (Hz)")
    ap.add_argument("--data-dir", help="keep/reuse datasets here (default: a scratch directory, removed)")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--prefix", default="amdt-prof-",
                    help="name prefix of the namespaces and the /dev/shm scratch directory (default amdt-prof-)")
    args = ap.parse_args(argv)
    if shutil.which("perf") is None:
        print("perf not found: apt-get install -y linux-perf", file=sys.stderr)
        return 2
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    for m in ("netns", "gridftp"):
        if m in modes and not netns_available()[0]:
            print(f"{m} skipped: {netns_available()[1]}")
            modes.remove(m)
    if "gridftp" in modes and shutil.which("globus-url-copy") is None:
        print("gridftp skipped: globus-url-copy not installed")
        modes.remove("gridftp")
    scratch = tempfile.mkdtemp(prefix=f"{args.prefix}{os.getpid()}-", dir="/dev/shm")
    os.chmod(scratch, 0o755)
    results = []
    try:
        nfiles, size = DATASETS[args.dataset]
        root = args.data_dir or os.path.join(scratch, "data")
        os.makedirs(root, exist_ok=True)
        src = generate(root, nfiles, size)
        gb = nfiles * size / 1e9
        print(f"profile: {args.dataset} ({nfiles} x {size // 1024} KiB = {gb:.2f} GB), threads "
              f"{args.threads or 'default policy'}, extra {args.extra}, load {os.getloadavg()[0]:.1f}, "
              f"{time.strftime('%Y-%m-%d %H:%M')}")
        for mode in modes:
            if mode == "gridftp":
                res = profile_gridftp(src, nfiles * size, scratch, args.freq, args.prefix)
            else:
                res = profile(mode, src, nfiles * size, args.threads or None, args.extra, scratch, args.strace,
                              args.freq, args.prefix)
            res["dataset"] = args.dataset
            results.append(res)
            report(res, gb)
        print(f"load average now {os.getloadavg()[0]:.1f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)
    finally:
        for p in list(STARTED.values()):
            stop(p)
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
