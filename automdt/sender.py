"""The source side of a transfer: scan, handshake, plan, then drive the engine to completion.

:func:`run_transfer` is what ``automdt transfer`` (and ``automdt explore``) call. It talks to a
receiver over the control channel (:mod:`automdt.protocol`), feeds files to the sender engine in
a bounded window, re-queues chunks the receiver found corrupt or missing, lets the
:class:`~automdt.controller.Controller` set the thread counts every interval, and returns a
:class:`Summary`.
"""
from __future__ import annotations

import logging
import os
import re
import socket
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, List, Optional, Tuple

import zmq

from automdt import errors, interrupts, protocol
from automdt.agents.static import StaticPolicy
from automdt.controller import Controller, ControllerSettings, Progress
from automdt.errors import AutomdtError, Interrupted
from automdt.interval import IntervalRecord
from automdt.manifest import Manifest, file_digest, scan, shard_manifest

if TYPE_CHECKING:
    from automdt.transfer_engine import ReceiverStats

log = logging.getLogger(__name__)

MANIFEST_BATCH = 2000
"""Files per ``manifest`` request (and directories per one)."""
ACTIVATE_BATCH = 512
"""Most files per ``activate`` request (the default window in one request)."""
DIGEST_BATCH = 500
"""Files per ``digest`` request of ``--verify``."""
DIGEST_TIMEOUT_S = 300.0
"""Least reply timeout of a ``digest`` request (the receiver reads every file it names)."""
HANDSHAKE_TIMEOUT_S = 10.0
"""Most time the probe and the hello may take (a live receiver answers at once)."""
CLOSE_TIMEOUT_S = 5.0
"""Reply timeout of the ``close`` at shutdown."""
DURABLE_CLOSE_TIMEOUT_S = 900.0
"""Reply timeout of the ``close`` that waits for the durable point (``--fsync end``: the receiver
writes back everything cached for the destination's filesystem first)."""
BACKLOG_CHUNKS = 2
"""Chunks read and waiting for a network thread at which the sender tells the receiver it has a
backlog (``poll``'s ``backlog``): a sender its source holds back rarely has two waiting."""
LOOP_PAUSE_FIRST_S = 0.002
LOOP_PAUSE_MAX_S = 0.02
LOOP_PAUSE_GROWTH = 0.1
"""The control loop pauses 2 ms at first, growing by 0.1 s per second of loop to 20 ms within
0.2 s: a small transfer ends (and the next run starts) without waiting out full pauses."""
SWEEP_QUIET_S = 0.3
"""Both ends idle this long with files incomplete: ask the receiver which chunks are missing."""
MAX_SWEEPS_PER_FILE = 20
"""Sweeps that find chunks of one file missing before the run ends (exit 5; a re-run resumes)."""
SUMMARY_ERRORS_MAX = 100
"""Error lines the summary keeps (the log file gets every one)."""
SUMMARY_PATHS_MAX = 1000
"""Paths a summary list keeps (``dry_run_files``, ``differences``, ``unreadable``)."""
RECEIVER_PREFIX = "receiver: "
"""How :class:`automdt.protocol.ControlClient` prefixes a receiver's error reply."""
LOCAL_MIN_MEMORY = 1 << 20
"""Least staging buffer of the receiver a local transfer embeds."""


@dataclass
class TransferOptions:
    """Options of one transfer (the CLI builds this from its flags).

    :param policy: a :class:`~automdt.policy_contract.Policy`; ``None`` means static ``threads``
        (:class:`automdt.agents.static.StaticPolicy`).
    :param fallback: ``fallback(max_threads)`` builds the controller that drives the rest of the
        run when the policy keeps failing (the CLI gives the shield's,
        :class:`automdt.agents.shield.Fallback`); None: the counts stay.
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
    fallback: Any = None
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
    fsync: str = "end"
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
    local_link: bool = True
    """A local destination: the sender engine hands each chunk's buffer to the in-process receiver
    (the local link; no socket, no copy between the ends). With the link, ``encrypt`` is dropped
    (nothing leaves the process; the summary says ``"encrypted": false``). Off (False, or the
    switch ``local_link=0``: :mod:`automdt.transfer_engine.switches`) or with ``data_endpoint_hook``:
    loopback TCP, as to a remote receiver (TLS with ``encrypt``)."""
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
    controller_settings: Optional[ControllerSettings] = None
    """How the controller treats the edges of the run (:class:`automdt.controller.ControllerSettings`:
    early intervals, end hold, warm hold); None: the defaults, what ``automdt transfer`` runs.
    Experiments and benchmarks set it to measure what each edge is worth."""


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
    bytes_reused: int = 0
    """Bytes of the files to send that partial files on the destination already held (journaled
    by an earlier, interrupted run and re-verified there), so they were not sent again."""
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
    link: str = ""
    """How chunks went to the receiver: ``"tcp"`` (data connections), ``"local"`` (a local destination:
    the in-process receiver took each chunk's buffer, no socket); empty when no engine ran."""
    verified: Optional[int] = None
    """With ``--verify``: files whose content digest matched on both ends."""
    differences: Optional[List[str]] = None
    """With ``--verify``: ``missing: path`` / ``differs: path`` lines."""
    unreadable: Optional[List[str]] = None
    """With ``--verify``: ``unreadable: path (source|destination): why`` lines."""
    dry_run_files: Optional[List[str]] = None
    """With ``--dry-run``: the files that would be sent (the first ``SUMMARY_PATHS_MAX``)."""
    shard: Optional[str] = None
    """With ``--shard``: ``"I/N"`` (the file counts are this shard's)."""
    history: List[IntervalRecord] = field(default_factory=list, repr=False)
    """The controller's interval records (not part of the JSON summary)."""
    final_record: Optional[IntervalRecord] = field(default=None, repr=False)
    """The run's last, partial interval (``"final": true`` in the log; not part of the JSON summary)."""
    retryable: bool = field(default=True, repr=False)
    """A network failure worth retrying (not part of the JSON summary)."""
    reused_by_file: Dict[int, int] = field(default_factory=dict, repr=False)
    """``bytes_reused`` per file id (not part of the JSON summary): a retry within the run counts
    each file as its first activation found it."""
    start: Optional[Dict[str, Any]] = None
    """Where the thread counts started and why (the interval log's ``start``; :mod:`automdt.start`)."""

    def as_dict(self) -> Dict[str, Any]:
        d = dict(self.__dict__)
        for k in ("history", "final_record", "retryable", "reused_by_file"):
            d.pop(k, None)
        for k in ("dry_run_files", "verified", "differences", "unreadable", "shard", "start"):
            if d[k] is None:
                d.pop(k)
        d["bytes_per_second"] = round(self.bytes / self.seconds, 1) if self.seconds > 0 else 0.0
        d["seconds"] = round(self.seconds, 3)
        return d


_REMOTE = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})(/.*)?$")


def names_a_host(dest: str) -> bool:
    """Whether ``dest`` is written as a receiver's address, by rsync's and scp's rule: a colon
    before the first slash (or a leading ``[`` of an IPv6 address). ``./name:x`` and ``/data/a:b``
    are local directories; ``host:5000/run``, ``host:/run`` and ``host:5000:run`` name a host."""
    return dest.startswith("[") or ":" in dest.split("/", 1)[0]


def parse_dest(dest: str) -> Tuple[Optional[Tuple[str, int]], str]:
    """``HOST:PORT[/subdir]`` -> ((host, port), subdir); a local directory -> (None, path).

    Raises ``ValueError`` for a destination written as a host (:func:`names_a_host`) that is not
    ``HOST:PORT[/SUBDIR]``: it is never taken for a local directory of that name (an scp habit,
    ``host:/run13``, would otherwise fill the source's disk), whether or not such a directory exists."""
    if not names_a_host(dest):
        return None, dest
    m = _REMOTE.match(dest)
    if m is None:
        raise ValueError(_not_an_address(dest))
    host = m.group(1).strip("[]")
    return (host, int(m.group(2))), (m.group(3) or "").strip("/")


def _not_an_address(dest: str) -> str:
    """Why ``dest`` is no ``HOST:PORT[/SUBDIR]``, and what was probably meant."""
    host, _, rest = dest.partition(":")
    if dest.startswith("["):
        host, _, rest = dest[1:].partition("]")
        host, rest = f"[{host}]", rest[1:] if rest.startswith(":") else rest
    port, sep, tail = re.match(r"(\d*)([:/]?)(.*)$", rest, re.S).groups()  # type: ignore[union-attr]
    if not port:
        hint = f"no port after '{host}:'; give the receiver's --listen port, e.g. {host}:5000/{rest.strip('/') or 'SUBDIR'}"
    elif sep == ":":
        hint = f"a colon after the port: did you mean {host}:{port}/{tail}?"
    else:
        hint = "expected HOST:PORT[/SUBDIR]"
    return (f"destination {dest!r} is not HOST:PORT[/SUBDIR] of a receiver ({hint}); for a local directory "
            f"whose name has a colon, write ./{dest}")


def check_dest(dest: str) -> None:
    """Raise ``ValueError`` for a destination no receiver would accept: an empty one, one written
    as a host that is not ``HOST:PORT[/SUBDIR]`` (:func:`parse_dest`), a port out of range, or a
    remote subdirectory that is absolute, has ``..``/empty components and the like (the receiver
    refuses those too; checking here makes it a usage error before any work)."""
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
        opts = replace(opts, schedule_t0=t0)  # retries continue the same schedule
    moved = resent = 0
    reused: Dict[int, int] = {}
    attempt = 0
    summary = Summary()
    with interrupts.handling():
        try:
            while True:
                summary = _run_once(src, dest, opts)
                moved += summary.bytes
                resent += summary.chunks_resent
                for fid, n in summary.reused_by_file.items():  # what a retry reuses of its own run is no reuse
                    reused.setdefault(fid, n)
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
    summary.bytes_reused = sum(reused.values())
    summary.seconds = time.monotonic() - t0
    if opts.shard is not None:
        summary.shard = "{}/{}".format(*opts.shard)
    return summary


def local_link_on(opts: TransferOptions) -> bool:
    """A local destination takes the local link (unless turned off, or a test hook maps the data
    endpoint); then ``--encrypt`` is dropped, as nothing leaves the process."""
    from automdt.transfer_engine import switches

    return opts.local_link and opts.data_endpoint_hook is None and switches.current().local_link


def _run_once(src: str, dest: str, opts: TransferOptions) -> Summary:
    t_start = time.monotonic()
    manifest = scan(src)
    if opts.shard is not None:
        manifest = shard_manifest(manifest, *opts.shard)
    try:
        remote, where = parse_dest(dest)
    except ValueError as e:
        raise AutomdtError(str(e), errors.USAGE) from None
    server = None
    secret = opts.secret
    if remote is None and opts.dry_run and not os.path.isdir(where):
        # nothing exists yet: everything would be sent, and nothing is created
        summary = Summary(files_total=len(manifest.files), bytes_total=manifest.total_bytes,
                          bytes_to_send=manifest.total_bytes, entries_skipped=len(manifest.skipped),
                          dry_run_files=[f.path for f in manifest.files][:SUMMARY_PATHS_MAX])
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
        if opts.encrypt and local_link_on(opts):
            # Nothing leaves the process (rsync's local copy does not go through ssh either):
            # the local link, unencrypted, and the summary says so ("link": "local", "encrypted": false).
            log.debug("local destination: the local link carries the chunks; --encrypt has nothing to protect")
            opts = replace(opts, encrypt=False)
        secret = os.urandom(32)
        memory, threads = max(opts.memory, LOCAL_MIN_MEMORY), max(64, opts.max_threads)
        server = ReceiverServer(where, "127.0.0.1", 0, secret=secret, max_threads=threads, max_memory=memory,
                                encrypt=opts.encrypt, embedded=True, total_memory=memory,
                                total_threads=threads, total_connections=threads).start()
        host, port, subdir = "127.0.0.1", server.port, ""
    else:
        (host, port), subdir = remote, where
        if opts.encrypt and not secret:
            raise AutomdtError("--encrypt needs --secret-file (the keys derive from the shared secret)", errors.USAGE)
    try:
        return _Transfer(manifest, host, port, subdir, secret, opts, t_start, local_server=server).run()
    finally:
        if server is not None:
            with interrupts.shielded():
                server.stop()


class _Transfer:
    """One attempt of a transfer: handshake, plan, then the control loop (:meth:`_transfer`) until
    every planned file is complete or failed. Every attribute is set here; the handshake and the
    loop fill them in."""

    def __init__(self, manifest: Manifest, host: str, port: int, subdir: str, secret: Optional[bytes],
                 opts: TransferOptions, t_start: float, local_server: Any = None):
        self.m = manifest
        self.local_server = local_server
        """The in-process :class:`~automdt.receiver.ReceiverServer` of a local transfer, else None."""
        self.host, self.port, self.subdir = host, port, subdir
        self.secret = secret
        self.o = opts
        self.t_start = t_start
        self.summary = Summary(files_total=len(manifest.files), bytes_total=manifest.total_bytes,
                               entries_skipped=len(manifest.skipped))
        self.codes: List[int] = _scan_errors(manifest, self.summary)
        # what the handshake agreed (see _handshake)
        self.opened = False
        """The receiver opened a session (closed again at shutdown)."""
        self.transferred = False
        """The control loop ended with every planned file complete or failed (not interrupted)."""
        self.token = b""
        """The data connections' token."""
        self.tls_key: Optional[bytes] = None
        self.data_host, self.data_port = host, 0
        self.chunk_size = opts.chunk_size
        """The chunk size the receiver accepted."""
        self.policy: Any = None
        # files
        self.pending: Deque[int] = deque()
        """Planned files not yet activated (manifest indices)."""
        self.active: Dict[int, float] = {}
        """Files open on the receiver and fed to the engine, with when they were activated."""
        self.pending_bytes = 0
        """Sizes of the files in :attr:`pending`: with :attr:`bytes_queued`, less what the receiver
        wrote, what the run has still to deliver (:attr:`Controller.to_deliver`)."""
        self.bytes_queued = 0
        """Bytes of the ranges fed to the engine: once no file is pending and the readers have read
        as much, the source is read to the end and the run is in its tail (:attr:`Controller.tail`)."""
        self.retries: Dict[Tuple[int, int], int] = {}
        """Checksum failures per ``(file, offset)`` chunk."""
        self.sweeps: Dict[int, int] = {}
        """Sweeps that found chunks of a file missing."""
        # the engine and its control
        self.engine: Any = None
        self.controller: Optional[Controller] = None
        self.receiver_stats: Optional[ReceiverStats] = None
        """The receiver's counters from its last ``status`` reply (None before the first)."""
        self.receiver_max_threads: Optional[int] = None
        self.share: Optional[List[int]] = None
        """The receiver's share for this run, ``[connections, write threads]`` (its budget
        divided among the jobs it serves; None: it sends none)."""
        """The receiver clamps write threads to this (its ``--max-threads``, from ``opened``)."""
        self.write_threads_sent: Optional[int] = None
        self.want_write: Optional[int] = None
        self.clock: Any = None
        """A :class:`automdt.throttle.ScheduleClock` with ``--throttle @FILE``, else None."""
        self.limits: Dict[str, Tuple[float, float]] = {k: _pair(v) for k, v in (opts.throttle or {}).items()}
        if opts.throttle_schedule is not None:
            from automdt.throttle import ScheduleClock

            self.clock = ScheduleClock(opts.throttle_schedule, opts.schedule_t0 or t_start)
            self.limits = self.clock.current()[1]
        self.write_limit_sent = _pair(self.limits.get("write", (0, 0)))
        self.want_write_limit = self.write_limit_sent
        self.backlog = self.backlog_sent = False
        """Whether chunks wait for a network thread (from the loop's stats), and what the
        receiver was told last (``poll``'s ``backlog``)."""
        # progress of the control loop (see _watch)
        self.loop_start = 0.0
        self.last_written = -1
        """The receiver's written bytes at the last change."""
        self.last_progress = 0.0
        """When they last changed (the stall clock)."""
        self.quiet_since: Optional[float] = None
        """Since when the sender has nothing in flight and the receiver nothing buffered."""
        # the control channel, last (nothing above may fail with it open); run() closes it
        self.ctx = zmq.Context()
        self.ctl = protocol.ControlClient(self.ctx, host, port, timeout_s=opts.timeout_s,
                                          curve_secret=secret if opts.encrypt else None)

    # ------------------------------------------------------------------ helpers
    def fail(self, code: int, message: str) -> None:
        self.codes.append(code)
        if len(self.summary.errors) < SUMMARY_ERRORS_MAX:
            self.summary.errors.append(message)
        # the summary's errors are printed once at the end; the --log-file gets them as they happen
        log.info("%s", message)

    def run(self) -> Summary:
        log_file = None
        try:
            try:
                log_file = _open_log(self.o.log_path)
                self._handshake()
                if not self.o.verify_only:
                    self._plan()
                    self._transfer(log_file)
                    self.transferred = True
                if self.o.verify or self.o.verify_only:
                    self._verify()
            except Interrupted as s:
                self.codes.append(s.code)
                self.summary.errors.append(interrupted(s.code))
            except AutomdtError as e:
                message = e.message
                if self.local_server is not None and message.startswith(RECEIVER_PREFIX):
                    message = message[len(RECEIVER_PREFIX):]  # no receiver the user started: the destination's own words
                if not self.summary.errors or self.summary.errors[-1] != message:
                    self.summary.errors.append(message)
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
                self.ctx.term()
        self.summary.seconds = time.monotonic() - self.t_start
        if self.controller is not None:
            self.summary.history = self.controller.history
            self.summary.start = (self.controller.start_record or {}).get("start")
        code = interrupts.pending()
        self.summary.exit_code = code if code is not None else errors.worst(self.codes)
        return self.summary

    def _shutdown(self) -> None:
        """Stop the engine and close the session on the receiver (it then keeps the partial files).
        With ``--fsync end`` the receiver answers at its durable point: a run that succeeded so
        far fails if the data did not reach the disk."""
        if self.engine is not None:
            self.engine.close()
        durable = self.o.fsync == "end" and self.transferred and not self.o.dry_run
        try:
            if self.opened:
                self.ctl.call(protocol.Close(), timeout_s=DURABLE_CLOSE_TIMEOUT_S if durable else CLOSE_TIMEOUT_S)
        except AutomdtError as e:
            if durable and interrupts.pending() is None:
                message = e.message[len(RECEIVER_PREFIX):] if e.message.startswith(RECEIVER_PREFIX) else e.message
                where = self.local_server.root if self.local_server is not None else f"{self.host}:{self.port}"
                self.fail(e.code, f"{where}: {message}")

    def _probe(self) -> None:
        """Fail at once when nothing listens at the receiver's address (ZeroMQ would retry the
        connection silently until the hello times out). A refused connection on loopback is not
        retried: no receiver runs on this machine."""
        timeout_s = min(self.o.timeout_s, HANDSHAKE_TIMEOUT_S)
        try:
            mech = protocol.probe_mechanism(self.host, self.port, timeout_s)
        except OSError as e:
            if isinstance(e, ConnectionRefusedError) and protocol.is_loopback(self.host):
                self.summary.retryable = False
            why = "connection refused" if isinstance(e, ConnectionRefusedError) else \
                "no answer" if isinstance(e, socket.timeout) else (e.strerror or str(e)).lower()
            hint = "is `automdt receive` running there?" if not isinstance(e, socket.gaierror) else \
                f"for a local directory of that name write ./{self.host}:{self.port}"
            raise AutomdtError(f"receiver {self.host}:{self.port} unreachable ({why}; {hint})", errors.NETWORK) from None
        if mech is None:  # a live receiver's I/O thread answers at once, however busy it is
            raise AutomdtError(f"receiver {self.host}:{self.port} unreachable (it accepted the connection but sent "
                               f"no greeting within {timeout_s:.0f} s: stopped, or not an automdt "
                               "receiver)", errors.NETWORK)
        if mech in ("NULL", "CURVE") and (mech == "CURVE") != self.o.encrypt:
            why = "it does not use --encrypt (this sender does)" if self.o.encrypt else \
                "it requires --encrypt (this sender does not use it)"
            raise AutomdtError(f"receiver {self.host}:{self.port} refuses this control channel: {why}", errors.FATAL)

    def _handshake(self) -> None:
        self._probe()
        cn = protocol.nonce()
        try:
            ch = self.ctl.call(protocol.Hello(protocol.VERSION, cn), timeout_s=min(self.o.timeout_s, HANDSHAKE_TIMEOUT_S))
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
        sn = ch.nonce
        if ch.auth and not self.secret:
            try:  # an auth without a secret: the receiver logs why this sender went away
                self.ctl.call(protocol.Auth(None), timeout_s=min(self.o.timeout_s, HANDSHAKE_TIMEOUT_S))
            except AutomdtError:
                pass
            raise AutomdtError(f"receiver {self.host}:{self.port} requires a shared secret (--secret-file)", errors.FATAL)
        if self.secret and not ch.auth:
            raise AutomdtError(f"receiver {self.host}:{self.port} does not authenticate; refusing to send with --secret-file", errors.FATAL)
        w = self.ctl.call(protocol.Auth(protocol.mac(self.secret, "client", sn, cn) if self.secret else None))
        self.ctl.stop_monitor()
        if self.secret:
            import hmac as _hmac

            if not _hmac.compare_digest(w.mac or "", protocol.mac(self.secret, "server", cn, sn)):
                raise AutomdtError(f"receiver {self.host}:{self.port} failed to prove the shared secret", errors.FATAL)
            self.token = protocol.data_token(self.secret, sn, cn)
        else:
            self.token = bytes.fromhex(w.token or "")
        self.policy = self.o.policy or StaticPolicy(*self.o.threads)
        r = self.ctl.call(protocol.Open(
            subdir=self.subdir, chunk_size=self.o.chunk_size, memory=self.o.memory, write_threads=self.o.threads[2],
            checksum=self.o.checksum, fsync=self.o.fsync, write_throttle=self.write_limit_sent,
            dry_run=self.o.dry_run, encrypt=self.o.encrypt, scratch=self.o.scratch))
        if r.encrypted != self.o.encrypt:
            raise AutomdtError(f"receiver {self.host}:{self.port} does not support encryption", errors.FATAL)
        if (self.clock is not None and self.o.throttle_schedule.limits_stage("write")
                and not r.runtime_throttle):
            raise AutomdtError(f"receiver {self.host}:{self.port} cannot change write limits during a run "
                               "(an older version); the throttle schedule limits the write stage", errors.USAGE)
        self.tls_key = protocol.data_key(self.secret, sn, cn) if self.o.encrypt and self.secret else None
        self.summary.encrypted = self.o.encrypt
        self.opened = True
        self.data_host, self.data_port = self.host, r.data_port
        if self.o.data_endpoint_hook is not None:
            self.data_host, self.data_port = self.o.data_endpoint_hook(self.host, self.data_port)
        self.chunk_size = r.chunk_size
        self.receiver_max_threads = r.max_threads or None
        self.share = r.share

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
            self.ctl.call(protocol.Manifest([], dirs[i:i + MANIFEST_BATCH]))
        for i in range(0, len(files), MANIFEST_BATCH):
            batch = files[i:i + MANIFEST_BATCH]
            plan = self.ctl.call(protocol.Manifest([_entry(f) for f in batch], []))
            for fid, action in plan.files:
                f = files[fid]
                if action == "skip":
                    self.summary.files_skipped += 1
                elif action == "done":
                    self.summary.files_transferred += 1
                elif action == "send":
                    self.pending.append(fid)
                    self.pending_bytes += f.size
                    self.summary.bytes_to_send += f.size
                else:
                    self.summary.files_failed += 1
        if self.summary.files_failed or self.m.dirs:
            # why files (or directories) failed comes with a status: take it now, whether or not
            # anything is left to send (a run whose every file failed must not end with exit 0)
            self._poll()

    def _verify(self) -> None:
        """Compare content digests of every source file with the destination's; what either side
        cannot read is reported as such (``unreadable``), never as identical nor as a difference."""
        from automdt.verify import chunked_digest, compare

        src: Dict[str, Optional[str]] = {}
        dst: Dict[str, Optional[str]] = {}
        unreadable = [f"unreadable: {p} (source): {why}" for p, why, _ in self.m.unreadable]
        files = self.m.files
        for i in range(0, len(files), DIGEST_BATCH):
            batch = files[i:i + DIGEST_BATCH]
            ask = []
            for f in batch:
                try:
                    src[f.path] = chunked_digest(f.abspath, self.chunk_size)
                    ask.append(f.path)
                except OSError as e:
                    unreadable.append(f"unreadable: {f.path} (source): {(e.strerror or str(e)).lower()}")
            if not ask:
                continue
            r = self.ctl.call(protocol.Digest(ask), timeout_s=max(self.o.timeout_s, DIGEST_TIMEOUT_S))
            dst.update(r.digests)
            for p, why in r.unreadable.items():
                if p in src:
                    del src[p]
                    unreadable.append(f"unreadable: {p} (destination): {why}")
        diffs = compare(src, dst)
        self.summary.verified = len(src) - len(diffs)
        self.summary.differences = diffs[:SUMMARY_PATHS_MAX]
        self.summary.unreadable = unreadable[:SUMMARY_PATHS_MAX]
        if diffs:
            self.fail(errors.INTEGRITY, f"verify: {len(diffs)} of {len(files)} files differ ({diffs[0]}...)")
        if unreadable:
            self.fail(errors.FILES_FAILED, f"verify: {len(unreadable)} entries could not be read ({unreadable[0]}...)")

    # ----------------------------------------------------------------- the loop
    def _transfer(self, log_file) -> None:
        """Send the planned files: one turn of the loop follows the throttle schedule, activates
        files into the window, polls the receiver, handles the engine's events, watches for
        stalls and lost chunks, and lets the controller set the thread counts."""
        if self.o.dry_run:
            self.summary.files_transferred = 0
            self.summary.dry_run_files = [self.m.files[i].path for i in self.pending][:SUMMARY_PATHS_MAX]
            return
        if not self.pending:
            return
        self._start_engine()
        ctrl = self._start_controller(log_file)
        self.loop_start = self.last_progress = time.monotonic()
        deadline = self.t_start + self.o.max_duration_s if self.o.max_duration_s else None
        while self.pending or self.active:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                self.fail(errors.MAX_DURATION, f"--max-duration reached after {now - self.t_start:.1f} s; partial files kept, re-run to resume")
                return
            if self.clock is not None:
                self._follow_schedule(ctrl, now)
            self._poll()  # first: the files it reports done make room that _activate fills at once
            self._activate()
            self._engine_events()
            st = self.engine.stats()
            self.backlog = st.buffer.slots_ready >= BACKLOG_CHUNKS  # told with the next poll
            written = self._watch(st, now)
            rx = self.receiver_stats
            progress = Progress(tail=not self.pending and st.read.bytes >= self.bytes_queued,
                                to_deliver=None if rx is None else
                                max(0, self.bytes_queued + self.pending_bytes - rx.write.bytes))
            ctrl.tick(st, rx, now, progress=progress)
            self._report(ctrl, written)
            time.sleep(self._pause(now))
        self._poll()  # the last word: errors of files that failed as they were activated, the final counters
        # the last, partial interval
        self.summary.final_record = ctrl.tick(self.engine.stats(), self.receiver_stats, time.monotonic(), final=True)

    def _start_engine(self) -> None:
        """The sender engine, connected to the receiver's data port with the limits in force."""
        from automdt.transfer_engine import Sender

        if self.clock is not None:
            spec, self.limits = self.clock.mark_applied()
            self.want_write_limit = _pair(self.limits["write"])
        th = self.limits
        self.engine = Sender(self.data_host, self.data_port, self.token, self.chunk_size, self.o.memory,
                             max_threads=max(self.o.max_threads, 1),
                             read_throttle=_ints(th.get("read", (0, 0))), net_throttle=_ints(th.get("net", (0, 0))),
                             sndbuf=self.o.sndbuf, fault_corrupt=self.o.fault_corrupt, tls_key=self.tls_key,
                             local=self._local_receiver())
        self.summary.link = "local" if self.engine.local else "tcp"

    def _local_receiver(self) -> Any:
        """The engine of this transfer's session in the in-process receiver, for the local link; None:
        connect over TCP (a remote destination, ``--encrypt``, a test's endpoint hook, or the link
        turned off)."""
        srv = self.local_server
        if srv is None or self.o.encrypt or not local_link_on(self.o):
            return None
        for session in list(srv.sessions.values()):  # the server thread owns the dict: a snapshot
            if session.token == self.token and session.engine is not None:
                return session.engine
        return None

    def _start_controller(self, log_file) -> Controller:
        """The controller: read and network counts go to the engine, the write count to the next poll."""

        def apply(t):
            self.engine.set_threads(t[0], t[1])
            self.want_write = t[2]

        ctrl = self.controller = Controller(self.policy, apply, self.o.interval_s, self.o.max_threads, log_file,
                                            write_max=self.receiver_max_threads, settings=self.o.controller_settings,
                                            fallback=self.o.fallback, **self._start())
        if self.clock is not None or any(any(v) for v in self.limits.values()):
            from automdt.throttle import format_throttle

            ctrl.annotations["throttle"] = format_throttle(self.limits)
        ctrl.start_notes["chunk_bytes"] = self.chunk_size
        if self.share:
            ctrl.set_share(*self.share)
            connections, writers = self.share
            if connections < self.o.max_threads or (self.receiver_max_threads or writers) > writers:
                ctrl.start_notes["receiver_share"] = list(self.share)  # it bounds this run
        to_send = sum(self.m.files[i].size for i in self.pending)
        if 0 < to_send <= self.o.memory:
            ctrl.start_notes["fits_in_buffers"] = (
                "the data to send fits in the staging buffers: the source is read within the first interval, "
                "every interval after it is the run's tail (\"tail\": true) and the policy is not asked")
        from automdt.transfer_engine import switches

        if switches.current().changed():  # comparison settings of the data path (--switch)
            ctrl.start_notes["switches"] = switches.current().changed()
        ctrl.start()
        return ctrl

    def _watch(self, st, now: float) -> int:
        """Track the receiver's written bytes (returned); sweep for lost chunks when both ends are
        idle, abort (exit 5) when nothing was written for ``stall_s``."""
        rx = self.receiver_stats
        written = rx.write.bytes if rx is not None else 0
        if written != self.last_written:
            self.last_written, self.last_progress, self.quiet_since = written, now, None
        # Sweep: the sender has handed everything to the kernel and the receiver is drained,
        # yet files are incomplete: ask which chunks are missing and send them again.
        if self.active and st.chunks_pending == 0 and rx is not None and rx.buffer.fill_bytes == 0:
            self.quiet_since = self.quiet_since or now
            if now - self.quiet_since > SWEEP_QUIET_S:
                self._sweep()
                self.quiet_since = None
        if now - self.last_progress > self.o.stall_s:
            raise AutomdtError(f"no progress for {self.o.stall_s:.0f} s (receiver {self.host}:{self.port}); re-run to resume", errors.NETWORK)
        return written

    def _report(self, ctrl: Controller, written: int) -> None:
        """The summary so far, and the progress display."""
        self.summary.bytes = written
        self.summary.threads = dict(zip(("read", "net", "write"), ctrl.threads))
        if self.o.progress:
            self.o.progress(self.summary, ctrl)

    def _pause(self, now: float) -> float:
        """The pause before the next turn: short at first, so that a small transfer ends (and the
        next run starts) without waiting out full pauses."""
        return min(LOOP_PAUSE_MAX_S, LOOP_PAUSE_FIRST_S + LOOP_PAUSE_GROWTH * (now - self.loop_start))

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
        self.want_write_limit = _pair(limits["write"])
        self.limits = limits
        from automdt.throttle import format_throttle

        ctrl.annotations["throttle"] = format_throttle(limits)
        log.info("throttle schedule at %.1f s: %s", self.clock.elapsed(now), spec or "(no limits)")

    def _activate(self) -> None:
        """Open pending files on the receiver while the window has room; feed them to the engine."""
        room = self.o.window_files - len(self.active)
        if room <= 0 or not self.pending:
            return
        ids = [self.pending.popleft() for _ in range(min(room, ACTIVATE_BATCH, len(self.pending)))]
        self.pending_bytes -= sum(self.m.files[i].size for i in ids)
        reply = self.ctl.call(protocol.Activate(ids))
        for fid, action, ranges in reply.files:
            f = self.m.files[fid]
            if action == "done":  # every chunk was on the destination already
                self.summary.files_transferred += 1
                self._reused(fid, f.size)
            elif action == "send":
                self._reused(fid, f.size - sum(int(r[1]) for r in ranges))
                try:
                    self.engine.add_file(fid, f.abspath, f.size, f.mtime_ns, [tuple(r) for r in ranges])
                except OSError as e:
                    self._source_failed(fid, errors.from_oserror(e, source=True), f"{f.path}: {(e.strerror or str(e)).lower()}")
                    continue
                except ValueError as e:
                    self._source_failed(fid, errors.SOURCE_CHANGED, f"{f.path}: {e}")
                    continue
                self.active[fid] = time.monotonic()
                self.bytes_queued += sum(int(r[1]) for r in ranges)
            else:
                self.summary.files_failed += 1

    def _reused(self, fid: int, nbytes: int) -> None:
        if nbytes > 0:
            self.summary.reused_by_file[fid] = nbytes
            self.summary.bytes_reused += nbytes

    def _poll(self) -> None:
        """Send a changed write count or write limit; take the receiver's counters, completed
        files, bad chunks (re-sent, up to ``chunk_retries`` each) and errors."""
        req = protocol.Poll()
        if self.want_write is not None and self.want_write != self.write_threads_sent:
            req.write_threads = self.want_write
            self.write_threads_sent = self.want_write
        if self.want_write_limit != self.write_limit_sent:
            req.write_throttle = _ints(self.want_write_limit)
            self.write_limit_sent = self.want_write_limit
        if self.backlog != self.backlog_sent:
            req.backlog = self.backlog_sent = self.backlog
        from automdt.transfer_engine import ReceiverStats

        r = self.ctl.call(req)
        self.receiver_stats = ReceiverStats.from_json(r.stats) if r.stats else None
        if r.share and r.share != self.share:
            self.share = r.share
            if self.controller is not None:
                self.controller.set_share(*r.share)
        for fid in r.done:
            if self.active.pop(fid, None) is not None:
                self.summary.files_transferred += 1
        for fid, off, ln in r.bad:
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
        for fid, code, text in r.errors:
            if fid in self.active:
                self._receiver_failed(fid, int(code), text, tell=False)
            else:
                self.fail(int(code), text)
        if r.fatal:
            code, text = r.fatal
            raise AutomdtError(text, int(code))

    def _engine_events(self) -> None:
        for ev in self.engine.events():
            if ev[0] == "file_error":
                fid = ev[1]
                f = self.m.files[fid]
                self._source_failed(fid, errors.from_oserror(ev[2], source=True), f"{f.path}: {ev[3]}")
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
            self.pending_bytes -= self.m.files[fid].size
        if was_active and self.engine is not None:
            try:
                self.engine.cancel_file(fid)  # its queued chunks are dropped, nothing more is sent
            except (KeyError, RuntimeError):
                pass
        self.summary.files_failed += 1
        self.fail(code, message)
        if tell:
            self.ctl.call(protocol.Fail([fid], discard))

    def _sweep(self) -> None:
        """Ask the receiver which chunks of the active files it lacks (lost with a broken
        connection) and queue them again; a file that keeps losing chunks ends the run (exit 5)."""
        ids = list(self.active)
        r = self.ctl.call(protocol.Missing(ids))
        for sid, ranges in r.files.items():
            fid = int(sid)
            if not ranges or fid not in self.active:
                continue
            self.sweeps[fid] = self.sweeps.get(fid, 0) + 1
            if self.sweeps[fid] > MAX_SWEEPS_PER_FILE:
                raise AutomdtError(f"{self.m.files[fid].path}: chunks keep getting lost on the way; re-run to resume", errors.NETWORK)
            cs = self.chunk_size
            for off, ln in ranges:
                for o in range(off, off + ln, cs):
                    self.engine.requeue(fid, o, min(cs, off + ln - o))


def _entry(f) -> protocol.ManifestEntry:
    """The manifest entry of a source :class:`automdt.manifest.FileEntry`."""
    return protocol.ManifestEntry(f.id, f.path, f.size, f.mtime_ns, f.mode, f.source_id, f.digest)


def _scan_errors(manifest: Manifest, summary: Summary) -> List[int]:
    """Put what the scan could not read into ``summary`` (count and errors); return their codes."""
    summary.entries_unreadable = len(manifest.unreadable)
    for path, why, _code in manifest.unreadable[:SUMMARY_ERRORS_MAX]:
        summary.errors.append(f"{path}: {why}")
    if len(manifest.unreadable) > SUMMARY_ERRORS_MAX:
        summary.errors.append(f"... and {len(manifest.unreadable) - SUMMARY_ERRORS_MAX} more unreadable source entries")
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


def _pair(limits) -> Tuple[float, float]:
    """A stage's ``(thread_bps, total_bps)`` as given (a schedule's lists, the CLI's tuples)."""
    return limits[0], limits[1]
