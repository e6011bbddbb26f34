"""The source side of a transfer: scan, handshake, plan, then drive the engine to completion.

:func:`run_transfer` is what ``automdt transfer`` (and ``automdt explore``) call. It talks to a
receiver over the control channel (:mod:`automdt.protocol`), feeds files to the sender engine in
a bounded window, re-queues chunks the receiver found corrupt or missing, lets the
:class:`~automdt.controller.Controller` set the thread counts every interval, and returns a
:class:`Summary`.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import zmq

from automdt import errors, interrupts, protocol
from automdt.controller import Controller
from automdt.errors import AutomdtError, Interrupted
from automdt.manifest import Manifest, file_digest, scan, shard_manifest

log = logging.getLogger(__name__)

MANIFEST_BATCH = 2000
ACTIVATE_BATCH = 256


@dataclass
class TransferOptions:
    """Options of one transfer (the CLI builds this from its flags).

    :param policy: a :class:`~automdt.agents.base.Policy`; ``None`` means static ``threads``.
    :param threads: initial/static (read, net, write) thread counts.
    :param memory: bytes per staging buffer (sender and receiver each).
    :param chunk_size: bytes per chunk.
    :param throttle: ``{stage: (thread_bps, total_bps)}`` emulated bottlenecks (0 = none).
    :param secret: shared secret bytes, or None.
    :param checksum: decide what to skip by content digest instead of size+mtime.
    :param interval_s: control interval.
    :param max_threads: per-stage upper bound.
    :param log_path: per-interval JSON-lines log file.
    :param max_duration_s: stop cleanly after this long (exit 10; the next run resumes).
    :param fsync: ``none``, ``file`` or ``dir`` durability on the receiver.
    :param chunk_retries: re-sends of one chunk before the file is an integrity failure.
    :param timeout_s: control-channel reply timeout.
    :param stall_s: abort with the network code when nothing moves for this long.
    :param progress: callback ``(summary_so_far, controller)`` called every tick (display).
    :param window_files: files active (open on the receiver) at once.
    :param fault_corrupt: test hook: the first N frames are corrupted on the wire.
    """

    policy: Any = None
    threads: Tuple[int, int, int] = (4, 4, 4)
    memory: int = 256 << 20
    chunk_size: int = 4 << 20
    throttle: Dict[str, Tuple[float, float]] = field(default_factory=dict)
    secret: Optional[bytes] = None
    checksum: bool = False
    interval_s: float = 1.0
    max_threads: int = 32
    log_path: Optional[str] = None
    max_duration_s: Optional[float] = None
    fsync: str = "none"
    chunk_retries: int = 5
    timeout_s: float = 30.0
    stall_s: float = 120.0
    progress: Optional[Callable[["Summary", Controller], None]] = None
    window_files: int = 512
    fault_corrupt: int = 0
    sndbuf: int = 0
    dry_run: bool = False
    """Plan only: report what would move (same summary), change nothing on the destination."""
    retries: int = 2
    """Whole-run retries after a network failure (each retry resumes; rclone's ``--retries``)."""
    retry_sleep_s: float = 2.0
    """Pause before a retry."""
    verify: bool = False
    """After the transfer, compare every file's content digest on both ends (exit 11 on a difference)."""
    verify_only: bool = False
    """Transfer nothing; only compare digests (``automdt verify``)."""
    encrypt: bool = False
    """CURVE on the control channel and TLS 1.3 on the data connections (needs ``secret``)."""
    scratch: bool = False
    """The destination subdirectory is ``automdt explore``'s scratch: the receiver empties it when the
    session opens and removes it when the session closes."""
    data_endpoint_hook: Optional[Callable[[str, int], Tuple[str, int]]] = None
    """Test hook: maps the receiver's announced data endpoint (e.g. to a fault-injecting proxy)."""
    throttle_schedule: Any = None
    """A :class:`automdt.throttle.ThrottleSchedule` (``--throttle @FILE``): limits that change during
    the run; replaces ``throttle``. Read and network limits apply on this engine, write limits are
    sent to the receiver (``poll {write_throttle}``)."""
    schedule_t0: Optional[float] = None
    """``time.monotonic()`` origin of the schedule's ``at`` times; None: the start of :func:`run_transfer`."""
    shard: Optional[Tuple[int, int]] = None
    """``(I, N)``: move only shard I of N of the source tree (:func:`automdt.manifest.shard_of`)."""
    start_threads: Optional[Tuple[int, int, int]] = None
    """``--threads`` given with a policy: the counts the policy starts from (:mod:`automdt.start`)."""
    history: Any = None
    """The job's :class:`automdt.history.JobRecord` (its last run), for the start; None: none or off."""


@dataclass
class Summary:
    """What a run did; printed as JSON by ``--json``."""

    files_total: int = 0
    files_transferred: int = 0
    files_skipped: int = 0
    files_failed: int = 0
    bytes: int = 0
    bytes_total: int = 0
    bytes_to_send: int = 0
    seconds: float = 0.0
    chunks_resent: int = 0
    integrity_failures: int = 0
    entries_skipped: int = 0
    entries_unreadable: int = 0
    """Source entries that could not be read (directories that cannot be listed, entries that
    cannot be stat'ed, empty files that cannot be opened); each is also in ``errors`` (exit 6)."""
    exit_code: int = 0
    attempts: int = 1
    """Runs made (1 + network retries)."""
    threads: Dict[str, int] = field(default_factory=dict)
    errors: List[str] = field(default_factory=list)
    encrypted: bool = False
    """The data connections (and the control channel) were encrypted."""
    verified: Optional[int] = None
    """With ``--verify``: files whose content digest matched on both ends."""
    differences: Optional[List[str]] = None
    """With ``--verify``: ``missing: path`` / ``differs: path`` lines."""
    unreadable: Optional[List[str]] = None
    """With ``--verify``: ``unreadable: path (source|destination): why`` lines."""
    dry_run_files: Optional[List[str]] = None
    """With ``--dry-run``: the files that would be sent (first 1000)."""
    shard: Optional[str] = None
    """With ``--shard``: ``"I/N"`` (the file counts are this shard's)."""
    history: List[Dict[str, Any]] = field(default_factory=list, repr=False)
    """The controller's interval records (not part of the JSON summary)."""
    retryable: bool = field(default=True, repr=False)
    """A network failure worth retrying (not part of the JSON summary)."""
    start: Optional[Dict[str, Any]] = None
    """Where the thread counts started and why (the interval log's ``start``; :mod:`automdt.start`)."""

    def as_dict(self) -> Dict[str, Any]:
        d = dict(self.__dict__)
        d.pop("history", None)
        d.pop("retryable", None)
        for k in ("dry_run_files", "verified", "differences", "unreadable", "shard", "start"):
            if d[k] is None:
                d.pop(k)
        d["bytes_per_second"] = round(self.bytes / self.seconds, 1) if self.seconds > 0 else 0.0
        d["seconds"] = round(self.seconds, 3)
        return d


class _StaticPolicy:
    """Fixed thread counts (the ``--threads`` default when no policy is given)."""

    def __init__(self, triple):
        self.triple = tuple(triple)
        self.name = "static:" + ",".join(str(int(n)) for n in self.triple)

    def reset(self, max_threads, seed=None):
        return self.triple

    def act(self, obs):
        return self.triple


_REMOTE = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})(/.*)?$")


def parse_dest(dest: str) -> Tuple[Optional[Tuple[str, int]], str]:
    """``HOST:PORT[/subdir]`` -> ((host, port), subdir); a local directory -> (None, path)."""
    m = _REMOTE.match(dest)
    if m and not os.path.exists(dest):
        host = m.group(1).strip("[]")
        return (host, int(m.group(2))), (m.group(3) or "").strip("/")
    return None, dest


def check_dest(dest: str) -> None:
    """Raise ``ValueError`` for a destination no receiver would accept: an empty one, a port out of
    range, or a remote subdirectory that is absolute, has ``..``/empty components and the like
    (the receiver refuses those too; checking here makes it a usage error before any work)."""
    from automdt.paths import UnsafePath, check_relpath

    if not dest or not dest.strip():
        raise ValueError("empty destination")
    remote, where = parse_dest(dest)
    if remote is None:
        return
    if not 1 <= remote[1] <= 65535:
        raise ValueError(f"destination {dest}: port {remote[1]} outside 1..65535")
    if where:
        try:
            check_relpath(where)
        except UnsafePath as e:
            raise ValueError(f"destination {dest}: subdirectory {where!r} refused ({str(e).split(': ', 1)[-1]})") from None


Stop = Interrupted
"""Raised in the main thread by the first SIGINT/SIGTERM (:mod:`automdt.interrupts`)."""

def interrupted(code: int) -> str:
    """The summary's error line for an interrupt (130: SIGINT, 143: SIGTERM)."""
    name = {130: "SIGINT", 143: "SIGTERM"}.get(code, f"signal {code - 128}")
    return f"interrupted by {name}: partial files and journals kept; re-run to resume"


def run_transfer(src: str, dest: str, opts: TransferOptions) -> Summary:
    """Transfer the tree ``src`` to ``dest`` (local directory or ``HOST:PORT[/subdir]``).

    A run that ends with the network exit code (receiver unreachable, connection lost, receiver
    restarted) is retried ``opts.retries`` times; each retry resumes from the journals.
    """
    t0 = time.monotonic()
    if opts.throttle_schedule is not None and opts.schedule_t0 is None:
        from dataclasses import replace

        opts = replace(opts, schedule_t0=t0)  # retries continue the same schedule
    moved = resent = 0
    attempt = 0
    summary = Summary()
    with interrupts.handling():
        try:
            while True:
                summary = _run_once(src, dest, opts)
                moved += summary.bytes
                resent += summary.chunks_resent
                if summary.exit_code != errors.NETWORK or attempt >= opts.retries or not summary.retryable:
                    break
                attempt += 1
                log.warning("%s; retry %d of %d in %.0f s", summary.errors[-1] if summary.errors else "network error",
                            attempt, opts.retries, opts.retry_sleep_s)
                time.sleep(opts.retry_sleep_s)
        except Interrupted as e:  # before or between the attempts' own handling (scan, start-up, retry pause)
            summary.exit_code = e.code
        code = interrupts.pending() or (summary.exit_code if summary.exit_code in (130, 143) else None)
        if code is not None:  # also a signal that arrived during a (shielded) shutdown
            summary.exit_code = code
            if not any(e.startswith("interrupted") for e in summary.errors):
                summary.errors.append(interrupted(code))
    summary.bytes, summary.chunks_resent, summary.attempts = moved, resent, attempt + 1
    summary.seconds = time.monotonic() - t0
    if opts.shard is not None:
        summary.shard = f"{int(opts.shard[0])}/{int(opts.shard[1])}"
    return summary


def _run_once(src: str, dest: str, opts: TransferOptions) -> Summary:
    t_start = time.monotonic()
    manifest = scan(src)
    if opts.shard is not None:
        manifest = shard_manifest(manifest, *opts.shard)
    remote, where = parse_dest(dest)
    server = None
    secret = opts.secret
    if remote is None and opts.dry_run and not os.path.isdir(where):
        # nothing exists yet: everything would be sent, and nothing is created
        summary = Summary(files_total=len(manifest.files), bytes_total=manifest.total_bytes,
                          bytes_to_send=manifest.total_bytes, entries_skipped=len(manifest.skipped),
                          dry_run_files=[f.path for f in manifest.files][:1000])
        summary.exit_code = errors.worst(_scan_errors(manifest, summary))
        summary.seconds = time.monotonic() - t_start
        return summary
    if remote is None:
        from automdt.receiver import ReceiverServer

        if opts.verify_only and not os.path.isdir(where):  # verify compares; it never creates
            raise AutomdtError(f"{where}: destination {'is not a directory' if os.path.exists(where) else 'not found'}",
                               errors.DIR_NOT_FOUND)
        try:
            os.makedirs(where, exist_ok=True)
        except OSError as e:
            raise AutomdtError(f"{where}: cannot create destination: {e.strerror}", errors.DIR_NOT_FOUND) from None
        secret = os.urandom(32)
        server = ReceiverServer(where, "127.0.0.1", 0, secret=secret, max_threads=max(64, opts.max_threads),
                                max_memory=max(opts.memory, 1 << 20), encrypt=opts.encrypt).start()
        host, port, subdir = "127.0.0.1", server.port, ""
    else:
        (host, port), subdir = remote, where
        if opts.encrypt and not secret:
            raise AutomdtError("--encrypt needs --secret-file (the keys derive from the shared secret)", errors.USAGE)
    try:
        return _Transfer(manifest, host, port, subdir, secret, opts, t_start).run()
    finally:
        if server is not None:
            with interrupts.shielded():
                server.stop()


class _Transfer:
    def __init__(self, manifest: Manifest, host: str, port: int, subdir: str, secret: Optional[bytes],
                 opts: TransferOptions, t_start: float):
        self.m = manifest
        self.host, self.port, self.subdir = host, port, subdir
        self.secret = secret
        self.o = opts
        self.t_start = t_start
        self.summary = Summary(files_total=len(manifest.files), bytes_total=manifest.total_bytes,
                               entries_skipped=len(manifest.skipped))
        self.codes: List[int] = _scan_errors(manifest, self.summary)
        self.retries: Dict[Tuple[int, int], int] = {}
        self.active: Dict[int, float] = {}
        self.pending: Deque[int] = deque()
        self.sweeps: Dict[int, int] = {}
        self.engine: Any = None
        self.receiver_stats: Dict[str, Any] = {}
        self.write_threads_sent: Optional[int] = None
        self.want_write: Optional[int] = None
        self.clock: Any = None
        self.limits: Dict[str, Tuple[float, float]] = {k: (v[0], v[1]) for k, v in (opts.throttle or {}).items()}
        if opts.throttle_schedule is not None:
            from automdt.throttle import ScheduleClock

            self.clock = ScheduleClock(opts.throttle_schedule, opts.schedule_t0 or t_start)
            self.limits = self.clock.current()[1]
        self.write_limit_sent = tuple(self.limits.get("write", (0, 0)))
        self.want_write_limit = self.write_limit_sent

    # ------------------------------------------------------------------ helpers
    def fail(self, code: int, message: str) -> None:
        self.codes.append(code)
        if len(self.summary.errors) < 100:
            self.summary.errors.append(message)
        # the summary's errors are printed once at the end; the --log-file gets them as they happen
        log.info("%s", message)

    def run(self) -> Summary:
        ctx = zmq.Context()
        self.ctl = protocol.ControlClient(ctx, self.host, self.port, timeout_s=self.o.timeout_s,
                                          curve_secret=self.secret if self.o.encrypt else None)
        log_file = None
        try:
            try:
                log_file = _open_log(self.o.log_path)
                self._handshake()
                if not self.o.verify_only:
                    self._plan()
                    self._transfer(log_file)
                if self.o.verify or self.o.verify_only:
                    self._verify()
            except Interrupted as s:
                self.codes.append(s.code)
                self.summary.errors.append(interrupted(s.code))
            except AutomdtError as e:
                if not self.summary.errors or self.summary.errors[-1] != e.message:
                    self.summary.errors.append(e.message)
                self.codes.append(e.code)
            except OSError as e:  # not a user's error, yet no reason to lose the summary
                self.fail(errors.ERROR, f"{e.filename + ': ' if e.filename else ''}{e.strerror or e}")
            finally:
                with interrupts.shielded():  # a second signal must not cut the shutdown short
                    self._shutdown()
        finally:
            with interrupts.shielded():
                if log_file:
                    log_file.close()
                self.ctl.close()
                ctx.term()
        self.summary.seconds = time.monotonic() - self.t_start
        if getattr(self, "controller", None) is not None:
            self.summary.history = self.controller.history
            self.summary.start = (self.controller.start_record or {}).get("start")
        code = interrupts.pending()
        self.summary.exit_code = code if code is not None else errors.worst(self.codes)
        return self.summary

    def _shutdown(self) -> None:
        """Stop the engine and close the session on the receiver (it then keeps the partial files)."""
        if self.engine is not None:
            self.engine.close()
        try:
            if getattr(self, "opened", False):
                self.ctl.request({"type": "close"}, timeout_s=5)
        except AutomdtError:
            pass

    def _probe(self) -> None:
        """Fail at once when nothing listens at the receiver's address (ZeroMQ would retry the
        connection silently until the hello times out). A refused connection on loopback is not
        retried: no receiver runs on this machine."""
        try:
            mech = protocol.probe_mechanism(self.host, self.port, min(self.o.timeout_s, 10))
        except OSError as e:
            if isinstance(e, ConnectionRefusedError) and _is_loopback(self.host):
                self.summary.retryable = False
            why = "connection refused" if isinstance(e, ConnectionRefusedError) else \
                "no answer" if isinstance(e, socket.timeout) else (e.strerror or str(e)).lower()
            raise AutomdtError(f"receiver {self.host}:{self.port} unreachable ({why}; is `automdt receive` "
                               "running there?)", errors.NETWORK) from None
        if mech is None:  # a live receiver's I/O thread answers at once, however busy it is
            raise AutomdtError(f"receiver {self.host}:{self.port} unreachable (it accepted the connection but sent "
                               f"no greeting within {min(self.o.timeout_s, 10):.0f} s: stopped, or not an automdt "
                               "receiver)", errors.NETWORK)
        if mech in ("NULL", "CURVE") and (mech == "CURVE") != self.o.encrypt:
            why = "it does not use --encrypt (this sender does)" if self.o.encrypt else \
                "it requires --encrypt (this sender does not use it)"
            raise AutomdtError(f"receiver {self.host}:{self.port} refuses this control channel: {why}", errors.FATAL)

    def _handshake(self) -> None:
        self._probe()
        cn = protocol.nonce()
        try:
            ch = self.ctl.request({"type": "hello", "version": protocol.VERSION, "nonce": cn},
                                  timeout_s=min(self.o.timeout_s, 10))
        except protocol.HandshakeFailed as e:
            if e.mismatch:
                why = "it does not use --encrypt (this sender does)" if self.o.encrypt else \
                    "it requires --encrypt (this sender does not use it)"
                raise AutomdtError(f"receiver {self.host}:{self.port} refuses this control channel: {why}",
                                   errors.FATAL) from None
            raise AutomdtError(f"receiver {self.host}:{self.port} refused the encrypted control channel: "
                               "the shared secret differs", errors.FATAL) from None
        except AutomdtError as e:
            if e.code == errors.NETWORK:
                why = "its secret differs, or it is overloaded" if self.o.encrypt else "it is overloaded"
                raise AutomdtError(f"receiver {self.host}:{self.port} unreachable (no answer to hello: {why})",
                                   errors.NETWORK) from None
            raise
        sn = str(ch.get("nonce", ""))
        if ch.get("auth") and not self.secret:
            raise AutomdtError(f"receiver {self.host}:{self.port} requires a shared secret (--secret-file)", errors.FATAL)
        if self.secret and not ch.get("auth"):
            raise AutomdtError(f"receiver {self.host}:{self.port} does not authenticate; refusing to send with --secret-file", errors.FATAL)
        req = {"type": "auth"}
        if self.secret:
            req["mac"] = protocol.mac(self.secret, "client", sn, cn)
        w = self.ctl.request(req)
        self.ctl.stop_monitor()
        if self.secret:
            import hmac as _hmac

            if not _hmac.compare_digest(str(w.get("mac", "")), protocol.mac(self.secret, "server", cn, sn)):
                raise AutomdtError(f"receiver {self.host}:{self.port} failed to prove the shared secret", errors.FATAL)
            self.token = protocol.data_token(self.secret, sn, cn)
        else:
            self.token = bytes.fromhex(str(w.get("token", "")))
        policy = self.o.policy or _StaticPolicy(self.o.threads)
        self.policy = policy
        r = self.ctl.request({
            "type": "open", "subdir": self.subdir, "chunk_size": self.o.chunk_size, "memory": self.o.memory,
            "write_threads": self.o.threads[2], "checksum": self.o.checksum, "fsync": self.o.fsync,
            "write_throttle": list(self.write_limit_sent), "dry_run": self.o.dry_run,
            "encrypt": self.o.encrypt, **({"scratch": True} if self.o.scratch else {}),
        })
        if bool(r.get("encrypted")) != self.o.encrypt:
            raise AutomdtError(f"receiver {self.host}:{self.port} does not support encryption", errors.FATAL)
        if (self.clock is not None and self.o.throttle_schedule.limits_stage("write")
                and not r.get("runtime_throttle")):
            raise AutomdtError(f"receiver {self.host}:{self.port} cannot change write limits during a run "
                               "(an older version); the throttle schedule limits the write stage", errors.USAGE)
        self.tls_key = protocol.data_key(self.secret, sn, cn) if self.o.encrypt and self.secret else None
        self.summary.encrypted = self.o.encrypt
        self.opened = True
        self.data_host, self.data_port = self.host, int(r["data_port"])
        if self.o.data_endpoint_hook is not None:
            self.data_host, self.data_port = self.o.data_endpoint_hook(self.host, self.data_port)
        self.chunk_size = int(r["chunk_size"])

    def _plan(self) -> None:
        files = self.m.files
        if self.o.checksum:
            for f in files:
                try:
                    f.digest = file_digest(f.abspath)
                except OSError as e:
                    f.digest = None
                    log.warning("%s: cannot checksum: %s", f.path, e.strerror)
        dirs = self.m.dirs
        for i in range(0, len(dirs), MANIFEST_BATCH):  # directories first, in batches (parents first)
            self.ctl.request({"type": "manifest", "files": [], "dirs": dirs[i:i + MANIFEST_BATCH]})
        for i in range(0, len(files), MANIFEST_BATCH):
            batch = files[i:i + MANIFEST_BATCH]
            reply = self.ctl.request({"type": "manifest", "files": [f.wire() for f in batch], "dirs": []})
            for fid, action in reply["files"]:
                f = files[fid]
                if action == "skip":
                    self.summary.files_skipped += 1
                elif action == "done":
                    self.summary.files_transferred += 1
                elif action == "send":
                    self.pending.append(fid)
                    self.summary.bytes_to_send += f.size
                else:
                    self.summary.files_failed += 1
            self._take_errors(reply.get("errors"))

    def _verify(self) -> None:
        """Compare content digests of every source file with the destination's; what either side
        cannot read is reported as such (``unreadable``), never as identical nor as a difference."""
        from automdt.verify import chunked_digest, compare

        src: Dict[str, Optional[str]] = {}
        dst: Dict[str, Optional[str]] = {}
        unreadable = [f"unreadable: {p} (source): {why}" for p, why, _ in self.m.unreadable]
        files = self.m.files
        for i in range(0, len(files), 500):
            batch = files[i:i + 500]
            ask = []
            for f in batch:
                try:
                    src[f.path] = chunked_digest(f.abspath, self.chunk_size)
                    ask.append(f.path)
                except OSError as e:
                    unreadable.append(f"unreadable: {f.path} (source): {(e.strerror or str(e)).lower()}")
            if not ask:
                continue
            r = self.ctl.request({"type": "digest", "paths": ask}, timeout_s=max(self.o.timeout_s, 300))
            dst.update(r.get("digests", {}))
            for p, why in (r.get("unreadable") or {}).items():
                if p in src:
                    del src[p]
                    unreadable.append(f"unreadable: {p} (destination): {why}")
        diffs = compare(src, dst)
        self.summary.verified = len(src) - len(diffs)
        self.summary.differences = diffs[:1000]
        self.summary.unreadable = unreadable[:1000]
        if diffs:
            self.fail(errors.INTEGRITY, f"verify: {len(diffs)} of {len(files)} files differ ({diffs[0]}...)")
        if unreadable:
            self.fail(errors.FILES_FAILED, f"verify: {len(unreadable)} entries could not be read ({unreadable[0]}...)")

    def _take_errors(self, errs) -> None:
        for _fid, code, msg in errs or []:
            self.fail(int(code), msg)

    # ----------------------------------------------------------------- the loop
    def _transfer(self, log_file) -> None:
        if self.o.dry_run:
            self.summary.files_transferred = 0
            self.summary.dry_run_files = [self.m.files[i].path for i in self.pending][:1000]
            return
        if not self.pending:
            return
        from automdt.transfer_engine import Sender

        if self.clock is not None:
            spec, self.limits = self.clock.mark_applied()
            self.want_write_limit = tuple(self.limits["write"])
        th = self.limits
        self.engine = Sender(self.data_host, self.data_port, self.token, self.chunk_size, self.o.memory,
                             max_threads=max(self.o.max_threads, 1),
                             read_throttle=_ints(th.get("read", (0, 0))), net_throttle=_ints(th.get("net", (0, 0))),
                             sndbuf=self.o.sndbuf, fault_corrupt=self.o.fault_corrupt, tls_key=self.tls_key)

        def apply(t):
            self.engine.set_threads(t[0], t[1])
            self.want_write = t[2]

        ctrl = self.controller = Controller(self.policy, apply, self.o.interval_s, self.o.max_threads, log_file,
                                            **self._start())
        if self.clock is not None or any(any(v) for v in self.limits.values()):
            from automdt.throttle import format_throttle

            ctrl.annotations["throttle"] = format_throttle(self.limits)
        ctrl.start()
        loop_start = last_progress = time.monotonic()
        last_written = -1
        quiet_since: Optional[float] = None
        deadline = self.t_start + self.o.max_duration_s if self.o.max_duration_s else None
        while self.pending or self.active:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                self.fail(errors.MAX_DURATION, f"--max-duration reached after {now - self.t_start:.1f} s; partial files kept, re-run to resume")
                return
            if self.clock is not None:
                self._follow_schedule(ctrl, now)
            self._activate()
            self._poll()
            self._engine_events()
            st = self.engine.stats()
            written = self.receiver_stats.get("write", {}).get("bytes", 0)
            if written != last_written:
                last_written, last_progress, quiet_since = written, now, None
            # Sweep: the sender has handed everything to the kernel and the receiver is drained,
            # yet files are incomplete: ask which chunks are missing and send them again.
            rbuf = self.receiver_stats.get("buffer", {})
            if self.active and st.chunks_pending == 0 and rbuf.get("fill_bytes", 1) == 0:
                quiet_since = quiet_since or now
                if now - quiet_since > 0.3:
                    self._sweep()
                    quiet_since = None
            if now - last_progress > self.o.stall_s:
                raise AutomdtError(f"no progress for {self.o.stall_s:.0f} s (receiver {self.host}:{self.port}); re-run to resume", errors.NETWORK)
            ctrl.tick(st, self.receiver_stats, now)
            self.summary.bytes = written
            self.summary.threads = dict(zip(("read", "net", "write"), ctrl.threads))
            if self.o.progress:
                self.o.progress(self.summary, ctrl)
            # poll every 2 ms at first, easing to every 20 ms within 0.2 s: a small transfer ends
            # (and the next run starts) without waiting out fixed 20 ms pauses
            time.sleep(min(0.02, 0.002 + 0.1 * (now - loop_start)))
        ctrl.tick(self.engine.stats(), self.receiver_stats, time.monotonic(), final=True)  # the last, partial interval

    def _start(self) -> Dict[str, Any]:
        """The controller's ``start`` and ``bound`` (:mod:`automdt.start`): the dataset bound counts
        the chunks of the files this run sends."""
        from automdt.start import choose_start, chunks_to_move, dataset_bound

        bound = dataset_bound(chunks_to_move((self.m.files[i].size for i in self.pending), self.chunk_size),
                              self.o.max_threads)
        start = choose_start(self.policy, self.o.max_threads, explicit=self.o.start_threads,
                             history=self.o.history, bound=bound)
        return {"start": start, "bound": bound}

    def _follow_schedule(self, ctrl: Controller, now: float) -> None:
        """Apply the schedule's entry that became due: read/net here, write via the next poll."""
        due = self.clock.due(now)
        if due is None:
            return
        spec, limits = due
        for stage in ("read", "net"):
            if tuple(limits[stage]) != tuple(self.limits.get(stage, (0, 0))):
                t, total = _ints(limits[stage])
                self.engine.set_throttle(stage, t, total)
        self.want_write_limit = tuple(limits["write"])
        self.limits = limits
        from automdt.throttle import format_throttle

        ctrl.annotations["throttle"] = format_throttle(limits)
        log.info("throttle schedule at %.1f s: %s", self.clock.elapsed(now), spec or "(no limits)")

    def _activate(self) -> None:
        room = self.o.window_files - len(self.active)
        if room <= 0 or not self.pending:
            return
        ids = [self.pending.popleft() for _ in range(min(room, ACTIVATE_BATCH, len(self.pending)))]
        reply = self.ctl.request({"type": "activate", "ids": ids})
        for fid, action, ranges in reply["files"]:
            f = self.m.files[fid]
            if action == "done":
                self.summary.files_transferred += 1
            elif action == "send":
                try:
                    self.engine.add_file(fid, f.abspath, f.size, f.mtime_ns, [tuple(r) for r in ranges])
                except OSError as e:
                    self._source_failed(fid, source_error_code(e.errno), f"{f.path}: {(e.strerror or str(e)).lower()}")
                    continue
                except ValueError as e:
                    self._source_failed(fid, errors.SOURCE_CHANGED, f"{f.path}: {e}")
                    continue
                self.active[fid] = time.monotonic()
            else:
                self.summary.files_failed += 1

    def _poll(self) -> None:
        msg: Dict[str, Any] = {"type": "poll"}
        if self.want_write is not None and self.want_write != self.write_threads_sent:
            msg["write_threads"] = self.want_write
            self.write_threads_sent = self.want_write
        if self.want_write_limit != self.write_limit_sent:
            msg["write_throttle"] = [int(self.want_write_limit[0]), int(self.want_write_limit[1])]
            self.write_limit_sent = self.want_write_limit
        r = self.ctl.request(msg)
        self.receiver_stats = r.get("stats") or {}
        for fid in r.get("done", []):
            if self.active.pop(fid, None) is not None:
                self.summary.files_transferred += 1
        for fid, off, ln in r.get("bad", []):
            key = (fid, off)
            self.retries[key] = self.retries.get(key, 0) + 1
            if fid not in self.active:
                continue
            if self.retries[key] > self.o.chunk_retries:
                self.summary.integrity_failures += 1
                self._receiver_failed(fid, errors.INTEGRITY,
                                      f"{self.m.files[fid].path}: chunk at offset {off} failed its checksum "
                                      f"{self.retries[key]} times; not renamed into place")
                continue
            self.summary.chunks_resent += 1
            self.engine.requeue(fid, off, ln)
        for fid, code, msg_ in r.get("errors", []):
            if fid in self.active:
                self._receiver_failed(fid, int(code), msg_, tell=False)
            else:
                self.fail(int(code), msg_)
        if r.get("fatal"):
            code, text = r["fatal"]
            raise AutomdtError(text, int(code))

    def _engine_events(self) -> None:
        for ev in self.engine.events():
            if ev[0] == "file_error":
                fid = ev[1]
                f = self.m.files[fid]
                self._source_failed(fid, source_error_code(ev[2]), f"{f.path}: {ev[3]}")
            elif ev[0] == "conn_error":
                log.warning("data connection: %s", ev[2])

    def _source_failed(self, fid: int, code: int, message: str) -> None:
        """The source file vanished, changed or cannot be read: its partial on the receiver is
        useless (a new version gets a new fingerprint), so the receiver removes it."""
        self._receiver_failed(fid, code, message, discard=True)

    def _receiver_failed(self, fid: int, code: int, message: str, tell: bool = True, discard: bool = False) -> None:
        was_active = self.active.pop(fid, None) is not None
        if not was_active and fid in self.pending:
            self.pending.remove(fid)
        if was_active and self.engine is not None:
            try:
                self.engine.cancel_file(fid)  # its queued chunks are dropped, nothing more is sent
            except (KeyError, RuntimeError):
                pass
        self.summary.files_failed += 1
        self.fail(code, message)
        if tell:
            self.ctl.request({"type": "fail", "ids": [fid], **({"discard": True} if discard else {})})

    def _sweep(self) -> None:
        ids = list(self.active)
        r = self.ctl.request({"type": "missing", "ids": ids})
        for sid, ranges in r.get("files", {}).items():
            fid = int(sid)
            if not ranges or fid not in self.active:
                continue
            self.sweeps[fid] = self.sweeps.get(fid, 0) + 1
            if self.sweeps[fid] > 20:
                raise AutomdtError(f"{self.m.files[fid].path}: chunks keep getting lost on the way; re-run to resume", errors.NETWORK)
            cs = self.chunk_size
            for off, ln in ranges:
                for o in range(off, off + ln, cs):
                    self.engine.requeue(fid, o, min(cs, off + ln - o))


def _is_loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def source_error_code(err: Optional[int]) -> int:
    """Exit code of a source file that failed with ``errno`` ``err`` while being read: a file that
    vanished or changed (0: no system call failed) is 12, one that cannot be read is 6."""
    return errors.SOURCE_CHANGED if err in (0, errno.ENOENT, errno.ESTALE) else errors.FILES_FAILED


def _scan_errors(manifest: Manifest, summary: Summary) -> List[int]:
    """Put what the scan could not read into ``summary`` (count and errors); return their codes."""
    summary.entries_unreadable = len(manifest.unreadable)
    for path, why, _code in manifest.unreadable[:100]:
        summary.errors.append(f"{path}: {why}")
    if len(manifest.unreadable) > 100:
        summary.errors.append(f"... and {len(manifest.unreadable) - 100} more unreadable source entries")
    return [code for _, _, code in manifest.unreadable]


def _open_log(path: Optional[str]):
    """The interval log (``--log``), opened for appending (the CLI has checked it already)."""
    if not path:
        return None
    try:
        return open(path, "a")
    except OSError as e:
        raise AutomdtError(f"{path}: cannot write the interval log: {e.strerror}", errors.USAGE) from None


def _ints(pair) -> Tuple[int, int]:
    return int(pair[0]), int(pair[1])
