"""Paths whose bottleneck is a real resource, not one of the engine's rate limits.

The bottleneck scenarios (:mod:`automdt.experiments.scenarios`) throttle every stage with the
engine's own limits, which is exactly the simulator's ``min(n * TPT, B)``: simulation and
"reality" agree by construction. Here nothing in the application limits anything:

============  ====================================================================================
``net-rtt20``  sender and receiver in two network namespaces joined by a veth pair; ``tc tbf``
``net-rtt80``  limits the link to 40 MB/s; every connection (the control channel and each data
               connection) goes through a :mod:`~automdt.experiments.delay_forwarder` process
               that adds 20 or 80 ms of round-trip time and lets a connection have at most
               256 KiB in flight (this kernel has no ``netem``): one connection moves at most
               window / RTT (13 MB/s at 20 ms, 3.3 MB/s at 80 ms), so the link needs about 3 or 13
               of them, as a real window-limited TCP path would
``disk``       the dataset lies on the machine's real disk (a temporary directory on ``/``, not
               tmpfs), many 3 MB files, evicted from the page cache before every copy (``posix_fadvise
               DONTNEED`` per file, or ``echo 3 > /proc/sys/vm/drop_caches`` with
               ``--drop-caches all``); the receiver writes to the real disk with ``--fsync file``
``cpu``        the receiver (``automdt receive``, a separate process) is confined to a quarter of
               one core by the cgroup v1 ``cpu`` controller (``cpu.cfs_quota_us`` 25000 of
               ``cpu.cfs_period_us`` 100000): receiving and writing compete for that CPU
============  ====================================================================================

Each path runs one ``automdt receive`` (in the receiver namespace, or in the CPU cgroup) and one
sender process per transfer (:mod:`automdt.experiments.sender_proc`, in the sender namespace
where there is one). :class:`PathSession` sets a path up, runs transfers on it, changes its link
rate (``tc qdisc change``) when a changing scenario asks, and removes everything it created
(namespaces, cgroup, temporary directories, processes by PID) on the way out.

Names of everything created start with ``amdt-i13-`` plus the PID, so concurrent runs by other
users of the machine do not collide.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

from automdt.experiments.fairness import shared_link
from automdt.experiments.netns import NetnsPair, netns_available
from automdt.experiments.scenarios import MB, Dataset, large_dataset

PREFIX = "amdt-i13-"
KiB = 1024
RECEIVER_PORT = 5000
CGROUP_CPU = "/sys/fs/cgroup/cpu"


@dataclass(frozen=True)
class RealScenario:
    """One real-resource path (see the module docstring)."""

    name: str
    kind: str
    """``net``, ``disk``, ``cpu``, or ``loop`` (loopback, limited by the engine's throttles or a
    throttle schedule: the changing suite's moving bottleneck)."""
    description: str
    link_bps: float = 0.0
    """tbf (or htb) rate of the veth link, bytes/s (net)."""
    rtt_s: float = 0.0
    """Round-trip time the delay forwarder adds (net)."""
    window: int = 0
    """Bytes in flight per connection and direction at the forwarder (net)."""
    qdisc: str = "tbf"
    cold: bool = False
    """Evict the source from the page cache before every copy (disk)."""
    fsync: str = "none"
    on_disk: bool = False
    """Dataset and destination on the real disk (a temp dir on ``/``) instead of ``/dev/shm``."""
    cpu_cores: float = 0.0
    """CPU quota of the receiver in cores (cpu)."""
    dataset_bytes: int = int(600 * MB)
    n_files: int = 8
    max_threads: int = 32

    @property
    def per_connection_bps(self) -> Optional[float]:
        """window / RTT: what one connection can move (net), else None."""
        return self.window / self.rtt_s if self.kind == "net" and self.rtt_s > 0 else None

    @property
    def nominal_bps(self) -> Optional[float]:
        """The link rate where the path has one (net), else None (the machine decides)."""
        return self.link_bps if self.kind == "net" else None

    def requirements(self) -> Tuple[bool, str]:
        """(True, "") if this machine and user can build the path, else (False, why)."""
        if self.kind == "net":
            return netns_available()
        if self.kind == "cpu":
            if os.geteuid() != 0:
                return False, "needs root (cgroup v1 cpu controller)"
            if not os.path.exists(os.path.join(CGROUP_CPU, "cpu.cfs_quota_us")):
                return False, f"no cgroup v1 cpu controller at {CGROUP_CPU}"
        return True, ""

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["per_connection_bps"] = self.per_connection_bps
        return d

    def scaled(self, **changes: Any) -> "RealScenario":
        import dataclasses

        return dataclasses.replace(self, **changes)


def real_scenarios(quick: bool = False) -> Dict[str, RealScenario]:
    """The real-resource paths by name (``quick``: smaller datasets for the test suite)."""
    ds = int((200 if quick else 600) * MB)
    out = [
        RealScenario("net-rtt20", "net", "40 MB/s tbf link, 20 ms RTT, 256 KiB per connection in flight "
                     "(13.1 MB/s per connection)", link_bps=40 * MB, rtt_s=0.020, window=256 * KiB,
                     dataset_bytes=ds),
        RealScenario("net-rtt80", "net", "40 MB/s tbf link, 80 ms RTT, 256 KiB per connection in flight "
                     "(3.3 MB/s per connection)", link_bps=40 * MB, rtt_s=0.080, window=256 * KiB,
                     dataset_bytes=ds),
        RealScenario("disk", "disk", "cold reads of 3 MB files from the real disk, writes to the real disk "
                     "with --fsync file", cold=True, fsync="file", on_disk=True,
                     dataset_bytes=int((300 if quick else 1500) * MB), n_files=100 if quick else 500),
        RealScenario("cpu", "cpu", "receiver confined to 5% of one core (cgroup v1 cpu.cfs_quota_us)",
                     cpu_cores=0.05, dataset_bytes=ds),
    ]
    return {s.name: s for s in out}


# ---------------------------------------------------------------------------------------------
# resources
# ---------------------------------------------------------------------------------------------
def net_link(rate_bps: float, qdisc: str = "tbf") -> NetnsPair:
    """A ``net`` path's link: :func:`~automdt.experiments.fairness.shared_link` with a choice of
    qdisc; :meth:`~automdt.experiments.netns.NetnsPair.set_rate` changes its rate at run time."""
    return shared_link(rate_bps, prefix=f"{PREFIX}{uuid.uuid4().hex[:3]}", qdisc=qdisc)


class CpuCgroup:
    """A cgroup v1 ``cpu`` group with a CFS quota of ``cores`` (a context manager)."""

    PERIOD_US = 100_000

    def __init__(self, cores: float) -> None:
        self.path = os.path.join(CGROUP_CPU, f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:6]}")
        self.cores = float(cores)

    def __enter__(self) -> "CpuCgroup":
        os.mkdir(self.path)
        try:
            self._write("cpu.cfs_period_us", self.PERIOD_US)
            self._write("cpu.cfs_quota_us", int(self.cores * self.PERIOD_US))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _write(self, name: str, value: Any) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(f"{value}\n")

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the group."""
        self._write("cgroup.procs", pid)

    def stat(self) -> Dict[str, int]:
        """``cpu.stat`` (nr_periods, nr_throttled, throttled_time)."""
        out: Dict[str, int] = {}
        try:
            with open(os.path.join(self.path, "cpu.stat")) as f:
                for line in f:
                    k, v = line.split()
                    out[k] = int(v)
        except OSError:
            pass
        return out

    def close(self) -> None:
        """Move any process left back to the root group and remove the group."""
        if not os.path.isdir(self.path):
            return
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                pids = [line.strip() for line in f if line.strip()]
            for pid in pids:
                try:
                    with open(os.path.join(CGROUP_CPU, "cgroup.procs"), "w") as g:
                        g.write(pid + "\n")
                except OSError:
                    pass
            os.rmdir(self.path)
        except OSError:
            pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 if it is gone)."""
    from automdt.experiments.sender_proc import _cpu_of

    return _cpu_of(pid)


def _stop(p: Optional[subprocess.Popen], timeout: float = 10.0) -> None:
    """End one process we started, by PID: SIGTERM, then SIGKILL."""
    if p is None or p.poll() is not None:
        return
    try:
        os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(5)


# ---------------------------------------------------------------------------------------------
# one path, set up
# ---------------------------------------------------------------------------------------------
@dataclass
class TransferRun:
    """What one sender process did on a path."""

    label: str
    rows: List[Dict[str, Any]]
    summary: Dict[str, Any]
    wall_s: float
    sender_cpu_s: float
    receiver_cpu_s: float
    forwarder_cpu_s: float
    wall_t0: Optional[float]
    error: Optional[str]
    out: Dict[str, Any]


class PathSession:
    """Set up a :class:`RealScenario` (a context manager) and run transfers on it.

    :param scenario: the path.
    :param workdir: where configs, logs and outputs of the sender processes go (kept).
    :param memory, chunk_size, interval_s: engine options of every transfer.
    :param drop_caches: ``file`` or ``all`` for cold scenarios.
    :param data_root: override of where the dataset and the destination live.
    """

    def __init__(self, scenario: RealScenario, workdir: str, *, memory: int, chunk_size: int, interval_s: float,
                 drop_caches: str = "file", data_root: Optional[str] = None, seed: int = 0,
                 log=lambda s: None) -> None:
        self.sc = scenario
        self.workdir = workdir
        self.memory, self.chunk_size, self.interval_s = int(memory), int(chunk_size), float(interval_s)
        self.drop_caches = drop_caches
        self.seed = seed
        self.log = log
        base = data_root or ("/var/tmp" if scenario.on_disk else _shm_or_tmp())
        self.root = tempfile.mkdtemp(prefix=f"{PREFIX}{scenario.name}-", dir=base)
        self.link: Optional[NetnsPair] = None
        self.cgroup: Optional[CpuCgroup] = None
        self.receiver: Optional[subprocess.Popen] = None
        self.dataset: Optional[Dataset] = None
        self._n = 0
        self.events: List[Dict[str, Any]] = []
        self._senders: List[subprocess.Popen] = []

    # -------------------------------------------------------------- set-up / tear-down
    def __enter__(self) -> "PathSession":
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _setup(self) -> None:
        sc = self.sc
        os.makedirs(self.workdir, exist_ok=True)
        spec = large_dataset(sc.dataset_bytes, n_files=sc.n_files, seed=self.seed)
        self.dataset = spec.generate(os.path.join(self.root, "data"))
        self.recv_root = os.path.join(self.root, "recv")
        os.makedirs(self.recv_root)
        self.secret = os.path.join(self.root, "secret")
        with open(self.secret, "w") as f:
            f.write(os.urandom(32).hex())
        os.chmod(self.secret, 0o600)
        if sc.kind == "net":
            self.link = net_link(sc.link_bps, sc.qdisc)
            self.link.__enter__()
            host, port = self.link.addr_b, RECEIVER_PORT
        else:
            host, port = "127.0.0.1", _free_port()
        if sc.kind == "cpu":
            self.cgroup = CpuCgroup(sc.cpu_cores).__enter__()
        self.dest = f"{host}:{port}"
        argv = [sys.executable, "-m", "automdt", "receive", "--listen", self.dest, "--root", self.recv_root,
                "--secret-file", self.secret, "--idle-timeout", "600", "--max-threads", str(max(64, sc.max_threads))]
        if self.link is not None:
            argv = ["ip", "netns", "exec", self.link.ns_b] + argv
        self._rlog = open(os.path.join(self.workdir, "receiver.log"), "ab")
        self.receiver = subprocess.Popen(argv, stdout=self._rlog, stderr=subprocess.STDOUT, start_new_session=True)
        if self.cgroup is not None:
            self.cgroup.add(self.receiver.pid)
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            if self.receiver.poll() is not None:
                raise RuntimeError(f"receiver exited {self.receiver.returncode}: {self._receiver_log()[-500:]}")
            if "receiving into" in self._receiver_log():
                return
            time.sleep(0.1)
        raise RuntimeError("receiver did not start: " + self._receiver_log()[-500:])

    def _receiver_log(self) -> str:
        try:
            with open(os.path.join(self.workdir, "receiver.log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def close(self) -> None:
        for p in self._senders:  # senders still running (the experiment was interrupted): by PID
            _stop(p, 15.0)
        self._senders.clear()
        _stop(self.receiver)
        self.receiver = None
        if getattr(self, "_rlog", None) is not None:
            self._rlog.close()
            self._rlog = None
        if self.cgroup is not None:
            self.cgroup.close()
            self.cgroup = None
        if self.link is not None:
            self.link.close()
            self.link = None
        shutil.rmtree(self.root, ignore_errors=True)

    def describe(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"scenario": self.sc.to_dict(), "root": self.root, "receiver": self.dest,
                             "dataset": self.dataset.to_dict() if self.dataset else None}
        if self.link is not None:
            d["link"] = self.link.describe()
        if self.cgroup is not None:
            d["cgroup"] = {"path": self.cgroup.path, "quota_us": int(self.sc.cpu_cores * CpuCgroup.PERIOD_US),
                           "period_us": CpuCgroup.PERIOD_US}
        return d

    # -------------------------------------------------------------- runs
    def receiver_cpu_s(self) -> float:
        return proc_cpu_s(self.receiver.pid) if self.receiver is not None else 0.0

    def set_rate(self, rate_bps: float) -> None:
        """Change the link rate now (net paths)."""
        assert self.link is not None, "set_rate needs a network path"
        self.link.set_rate(rate_bps)
        self.events.append({"wall": time.time(), "event": "rate", "rate_bps": rate_bps})

    def start(self, label: str, policy: str, policy_kwargs: Optional[Dict[str, Any]] = None, *,
              duration_s: float, rounds: bool = False, mode: str = "transfer", subdir: Optional[str] = None,
              schedule: Optional[List[Dict[str, Any]]] = None, origin_wall: Optional[float] = None,
              profile_out: Optional[str] = None, max_threads: Optional[int] = None,
              log_path: Optional[str] = None, start_wall: Optional[float] = None) -> "_Pending":
        """Start one sender process (returns at once; :meth:`_Pending.wait` collects it)."""
        self._n += 1
        sub = subdir or f"t{self._n}"
        cfg = {
            "src": self.dataset.path, "dest": f"{self.dest}/{sub}", "policy": policy,
            "policy_kwargs": policy_kwargs or {}, "secret_file": self.secret, "mode": mode,
            "memory": self.memory, "chunk_size": self.chunk_size, "interval_s": self.interval_s,
            "max_threads": int(max_threads or self.sc.max_threads), "max_duration_s": float(duration_s),
            "rounds": rounds, "dest_local_root": os.path.join(self.recv_root, sub), "fsync": self.sc.fsync,
            "cold": self.drop_caches if self.sc.cold else None, "log_path": log_path, "seed": self.seed,
            "throttle_schedule": schedule, "origin_wall": origin_wall, "profile_out": profile_out,
            "start_wall": start_wall,
        }
        if self.sc.kind == "net":
            # the window caps what a connection has in flight; the sender's send buffer and the
            # forwarder's receive buffer are capped to it too, so that no hidden megabytes of
            # socket buffer on the loopback hop make the network look faster than the path
            cfg["forward"] = {"delay_ms": self.sc.rtt_s * 1e3, "window": self.sc.window, "rcvbuf": self.sc.window}
            cfg["sndbuf"] = self.sc.window
        tag = f"{self._n:03d}-{_safe(label)}"
        cfg_path = os.path.join(self.workdir, f"{tag}.json")
        out_path = os.path.join(self.workdir, f"{tag}.out.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        argv = [sys.executable, "-m", "automdt.experiments.sender_proc", cfg_path, out_path]
        if self.link is not None:
            argv = ["ip", "netns", "exec", self.link.ns_a] + argv
        logf = open(out_path + ".log", "ab")
        try:
            p = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            logf.close()
        self._senders = [x for x in self._senders if x.poll() is None] + [p]
        return _Pending(self, label, p, out_path, cfg, time.monotonic(), self.receiver_cpu_s(), sub)

    def run(self, label: str, policy: str, policy_kwargs: Optional[Dict[str, Any]] = None, **kw: Any) -> TransferRun:
        """:meth:`start` and wait."""
        return self.start(label, policy, policy_kwargs, **kw).wait()


@dataclass
class _Pending:
    session: PathSession
    label: str
    proc: subprocess.Popen
    out_path: str
    cfg: Dict[str, Any]
    t0: float
    rcpu0: float
    subdir: str

    def wait(self, extra_s: float = 90.0) -> TransferRun:
        from automdt.experiments.metrics import flatten

        try:
            self.proc.wait(float(self.cfg["max_duration_s"]) + extra_s)
        except subprocess.TimeoutExpired:
            _stop(self.proc, 15.0)
        except BaseException:  # interrupted: the sender (and its forwarders) go too
            _stop(self.proc, 15.0)
            raise
        wall = time.monotonic() - self.t0
        rcpu = self.session.receiver_cpu_s() - self.rcpu0
        shutil.rmtree(os.path.join(self.session.recv_root, self.subdir), ignore_errors=True)
        try:
            with open(self.out_path) as f:
                out = json.load(f)
        except (OSError, ValueError) as e:
            tail = ""
            try:
                with open(self.out_path + ".log", errors="replace") as f:
                    tail = f.read()[-400:]
            except OSError:
                pass
            out = {"error": f"no result ({e}); exit {self.proc.returncode}: {tail}", "history": [], "summary": {}}
        rows = []
        for rec in out.get("history", []):
            row = flatten(rec)
            row["round"] = rec.get("round", 0)
            row["throttle"] = rec.get("throttle")
            rows.append(row)
        return TransferRun(self.label, rows, out.get("summary") or {}, wall, float(out.get("cpu_s") or 0.0), rcpu,
                           float(out.get("forwarder_cpu_s") or 0.0), out.get("wall_t0"), out.get("error"), out)

    def stop(self) -> None:
        _stop(self.proc, 15.0)

    def wait_started(self, timeout: float = 60.0) -> float:
        """The wall-clock origin of the transfer (``time.time()``), once the sender is about to start it."""
        deadline = time.monotonic() + timeout
        path = self.out_path + ".started"
        while time.monotonic() < deadline:
            try:
                with open(path) as f:
                    text = f.read().strip()
                if text:
                    return float(text)
            except (OSError, ValueError):
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"sender {self.label} exited {self.proc.returncode} before starting")
            time.sleep(0.05)
        raise RuntimeError(f"sender {self.label} did not start within {timeout:.0f} s")


def _shm_or_tmp() -> str:
    from automdt.experiments.scenarios import default_data_root

    return default_data_root()


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in s)[:40]
