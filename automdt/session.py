"""One sender's session on the receiver: the handshake and the message handlers.

A :class:`Session` is the orchestration layer (rclone's ``fs/sync`` to the single-file operations
of :mod:`automdt.partial`): it runs the handshake state machine, plans each manifest entry
(skip, create empty, send), activates files in a bounded window (each one a
:class:`~automdt.partial.PartialFile` registered with the session's engine), pumps the engine's
events (rename completed files into place, collect bad chunks and errors for the next poll) and
counts what it did in an :class:`Accounting`. :class:`automdt.receiver.ReceiverServer` routes
messages to sessions. Message flow: ``automdt/PROTOCOL.md``.

States::

    new --hello--> challenged --auth--> authed --open--> open --close (or drop, idle)--> closed
"""
from __future__ import annotations

import errno
import hmac
import logging
import os
import shutil
import stat
import time
from dataclasses import dataclass
from typing import AbstractSet, Any, Callable, Dict, List, Optional, Tuple

from automdt import durable, errors, journal, protocol
from automdt.partial import PartialFile, missing_ranges, need_transfer
from automdt.paths import SCRATCH_PREFIX, SafeRoot, UnsafePath, check_relpath, check_writable, where_beneath
from automdt.transfer_engine import SESSION_CHUNK_SIZE_MAX, SESSION_CHUNK_SIZE_MIN

log = logging.getLogger("automdt.receiver")  # the daemon's one log (the name operators filter on)

MIN_CHUNK, MAX_CHUNK = SESSION_CHUNK_SIZE_MIN, SESSION_CHUNK_SIZE_MAX
MAX_ACTIVE_FILES = 4096
LISTING_NAMES_MAX = 200_000
"""Directory entries a session keeps from the listings its plan takes (one listing per directory
instead of a ``stat`` of each file's name and partial's name); past this it ``stat``s."""

DIRECTORY_ERROR = -1
"""The file id of an error (``status.errors``) about a directory rather than a file."""

HANDSHAKE_STATES = ("new", "challenged")
"""States of a session that has not proven the secret yet (bounded and timed out separately)."""


class SessionError(Exception):
    """A request the session refuses: the error reply carries ``code``."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


@dataclass
class Accounting:
    """What one session did, for its closing log line and the metrics (rclone's ``accountValues``)."""

    files_completed: int = 0
    """Files renamed into place (or created empty)."""
    files_failed: int = 0
    """Files that failed on this end or that the sender gave up."""
    chunks_missing: int = 0
    """Chunks the sender was told to send again after a lost connection."""
    bytes_needed: int = 0
    """Bytes the plan expects to write (checked against the free space)."""
    bytes_written: int = 0
    """Bytes the write stage wrote, taken when the engine closes."""


class FinalizeError(Exception):
    """Sealing, fsyncing or renaming a complete file failed: ``step`` says which, ``error`` is the
    :class:`OSError`."""

    def __init__(self, step: str, error: OSError) -> None:
        super().__init__(f"{step}: {error.strerror}")
        self.step = step
        self.error = error


class Deferred:
    """A reply that takes long to make (the durable point's ``syncfs``): the server runs ``make``
    in a thread and sends what it returns (or the :class:`SessionError` it raises) when done."""

    def __init__(self, make: Callable[[], protocol.Message]) -> None:
        self.make = make


def _durable_point(dfd: int, marks: List[str], idle: List[str], sid: str, since_ns: int) -> protocol.Message:
    """``syncfs`` the destination's filesystem, then remove the markers; a failure leaves a marker
    that makes the next run re-check everything this one wrote (the write-back error is reported
    once: a second ``syncfs`` would succeed over the lost data)."""
    try:
        t0 = time.monotonic()
        try:
            durable.syncfs(dfd)
        except OSError as e:
            try:
                durable.write_marker(dfd, sid, since_ns, lost=True)
            except OSError:
                pass
            raise SessionError(f"the data did not reach the disk (syncfs: {e.strerror}); run the same command "
                               "again to send what was at risk", errors.FATAL) from None
        this_boot = durable.boot_id()
        settled = [name for name, boot, _ in durable.read_markers(dfd, idle) if boot and boot == this_boot]
        durable.remove(dfd, marks + settled)
        log.info("session %s on disk (syncfs %.2f s)", sid, time.monotonic() - t0)
        return protocol.Closed()
    finally:
        os.close(dfd)


class Session:
    """One sender's transfer into ``root``/``subdir``.

    :param server: the :class:`automdt.receiver.ReceiverServer` (its settings, claims and metrics).
    :param ident: the sender's ZeroMQ routing id.
    :param peer: the sender's address, for the log.
    """

    def __init__(self, server: Any, ident: bytes, peer: str = ""):
        self.server = server
        self.ident = ident
        self.sid = ident.hex()
        """The whole routing id in hex (ZeroMQ's ids share their first bytes: never cut it)."""
        self.peer = peer
        self.state = "new"
        self.last_seen = time.monotonic()
        self.t_open = 0.0
        # handshake
        self.client_nonce = ""
        self.server_nonce = protocol.nonce()
        self.token = b""
        # what ``open`` set up
        self.engine: Any = None
        self.backlog = False
        """The sender's last word on whether data waits to be sent (``poll``'s ``backlog``)."""
        self.memory_asked = self.memory_now = 0
        """The staging buffer the sender asked for (clamped by ``--max-memory``), and what the
        receiver's budget gives it now."""
        self.threads_asked = 1
        """The write threads the sender last asked for."""
        self.share: Any = None
        """This session's share of the receiver's budget (:class:`automdt.receiver.Share`), set
        by :meth:`apply_share`; ``status`` replies carry its connections and write threads."""
        self.root: Optional[SafeRoot] = None
        self.base: Tuple[str, ...] = ()
        self.chunk_size = 0
        self.fsync = "none"
        self.checksum = False
        self.dry_run = False
        self.scratch = False
        # durability (automdt.durable)
        self.marker: Optional[str] = None
        """This session's marker in its destination directory, while what it wrote may not be on disk."""
        self.stale_markers: List[str] = []
        """Markers of an earlier boot found at open: removed at this session's durable point."""
        self.marked_ns = 0
        self.planned = False
        """A manifest was planned: every file at risk in it was checked."""
        self.at_risk_since: Optional[int] = None
        """Files changed since this time (ns) may have lost data to a power cut: they are resent."""
        # files
        self.files: Dict[int, PartialFile] = {}
        """Planned files still to complete (active or not)."""
        self.n_active = 0
        """Files open and registered with the engine now (kept as a count: the activation limit
        is checked once per file, and counting the files each time would make a large tree's
        plan quadratic in its file count)."""
        self.took_over: set = set()
        """Sessions this one took files over from (logged once each)."""
        self._listings: Dict[Tuple[str, ...], Optional[AbstractSet[str]]] = {}
        """Entries of each destination directory the plan looked at, when listed (:meth:`_listing`)."""
        self._listing_budget = LISTING_NAMES_MAX
        self._fresh_dirs: set = set()
        """Directories this session created (empty when created: no listing needed)."""
        self._created_seen = 0
        # reported at the next poll
        self.done: List[int] = []
        self.bad: List[List[int]] = []
        self.file_errors: List[List[Any]] = []
        self.fatal: Optional[Tuple[int, str]] = None
        self.accounting = Accounting()
        self._handlers: Dict[str, Callable[[Any], protocol.Message]] = {
            "hello": self._hello, "auth": self._auth, "open": self._open, "manifest": self._manifest,
            "activate": self._activate, "poll": self._poll, "missing": self._missing, "fail": self._fail,
            "digest": self._digest, "close": self._close_msg,
        }

    # ----------------------------------------------------------------- messages
    def handle(self, msg: Dict[str, Any]) -> protocol.Message:
        """Answer one decoded request (:func:`automdt.protocol.decode`); raises :class:`SessionError`."""
        self.last_seen = time.monotonic()
        kind = msg["type"]
        self._check_state(kind)
        request = protocol.REQUESTS.get(kind)
        if request is None:
            raise SessionError(f"unknown message type {kind!r}", errors.USAGE)
        return self._handlers[kind](request.from_dict(msg))

    def _check_state(self, kind: str) -> None:
        """The handshake state machine: which request may come in which state."""
        if kind == "hello":
            if self.state != "new":
                raise SessionError("repeated hello", errors.USAGE)
        elif kind == "auth":
            if self.state != "challenged":
                raise SessionError("auth out of order", errors.USAGE)
        elif self.state not in ("authed", "open"):
            raise SessionError("not authenticated", errors.FATAL)
        elif kind == "open":
            if self.state != "authed":
                raise SessionError("repeated open", errors.USAGE)
        elif self.state != "open":
            raise SessionError(f"{kind!r} before 'open'", errors.USAGE)

    def _hello(self, req: protocol.Hello) -> protocol.Challenge:
        if req.version != protocol.VERSION:
            raise SessionError(f"protocol version {req.version!r} not supported (this receiver speaks {protocol.VERSION})", errors.USAGE)
        self.client_nonce = req.nonce[:128]
        self.state = "challenged"
        return protocol.Challenge(self.server_nonce, self.server.secret is not None)

    def _auth(self, req: protocol.Auth) -> protocol.Welcome:
        secret = self.server.secret
        reply = protocol.Welcome()
        if secret is not None:
            want = protocol.mac(secret, "client", self.server_nonce, self.client_nonce)
            if req.mac is None:
                self.server.auth_failures += 1
                raise SessionError("authentication failed: the sender gave no secret (it has no --secret-file)",
                                   errors.FATAL)
            if not hmac.compare_digest(req.mac, want):
                self.server.auth_failures += 1
                raise SessionError("authentication failed: wrong secret", errors.FATAL)
            reply.mac = protocol.mac(secret, "server", self.client_nonce, self.server_nonce)
            self.token = protocol.data_token(secret, self.server_nonce, self.client_nonce)
        else:
            self.token = os.urandom(32)
            reply.token = self.token.hex()
        self.state = "authed"
        return reply

    def _open(self, req: protocol.Open) -> protocol.Opened:
        from automdt.transfer_engine import Receiver

        srv = self.server
        encrypt = req.encrypt
        if srv.encrypt and not encrypt:
            raise SessionError("this receiver requires encryption (use --encrypt)", errors.USAGE)
        if encrypt and srv.secret is None:
            raise SessionError("encryption needs a shared secret on both ends (--secret-file)", errors.USAGE)
        try:
            self.base = check_relpath(req.subdir) if req.subdir else ()
        except UnsafePath as e:
            raise SessionError(f"destination subdirectory refused: {e}", errors.USAGE) from e
        self.scratch = req.scratch
        if self.scratch and not (self.base and self.base[-1].startswith(SCRATCH_PREFIX)):
            raise SessionError(f"a scratch subdirectory must be named {SCRATCH_PREFIX}*", errors.USAGE)
        chunk = req.chunk_size
        if not MIN_CHUNK <= chunk <= MAX_CHUNK:
            raise SessionError(f"chunk size {chunk} outside [{MIN_CHUNK}, {MAX_CHUNK}]", errors.USAGE)
        memory = max(chunk, min(srv.max_memory if req.memory is None else req.memory, srv.max_memory))
        self.chunk_size = chunk
        self.fsync = req.fsync
        self.checksum = req.checksum
        self.dry_run = req.dry_run
        self._open_destination(where_beneath(srv.root, self.base))
        if not self.dry_run and not self.scratch:
            self._settle_markers()
        key = protocol.data_key(srv.secret, self.server_nonce, self.client_nonce) if encrypt else None
        wt = (self._thread_limit(int(req.write_throttle[0])), int(req.write_throttle[1]))
        self.memory_asked, self.threads_asked = memory, int(req.write_threads)
        self.memory_now = max(chunk, min(memory, srv.shares(joining=1).memory))
        self.engine = Receiver(srv.host, 0, self.token, chunk, self.memory_now, max_threads=srv.max_threads,
                               write_throttle=wt, rcvbuf=req.rcvbuf or 0, tls_key=key, write_shared=srv.disk)
        self.apply_share(srv.shares())
        if self.fsync != "none" and not self.dry_run:
            # the write-back starts as chunks land, so the durable point at the end (or each
            # file's fsync) waits for what is left, not for everything
            self.engine.set_write_behind(True)
        self.state = "open"
        self.t_open = time.monotonic()
        log.info("session %s%s opened: into %s%s (chunk %d, buffer %d bytes%s%s)", self.sid,
                 f" from {self.peer}" if self.peer else "", srv.root, "/" + "/".join(self.base) if self.base else "",
                 chunk, memory, ", encrypted" if encrypt else "", ", dry run" if self.dry_run else "")
        return protocol.Opened(self.engine.port, chunk, memory, srv.max_threads, encrypt, runtime_throttle=True,
                               share=self._share_reply())

    def _thread_limit(self, asked: int) -> int:
        """A write thread's rate limit: the sender's, within the receiver's emulated disk's
        (0: none)."""
        disk = self.server.disk_thread_bps
        return min(x for x in (asked, disk) if x) if asked or disk else 0

    def apply_share(self, share: Any) -> None:
        """Hold this session to its share of the receiver's budget (a
        :class:`automdt.receiver.Share` from :meth:`automdt.receiver.ReceiverServer.shares`): the
        staging buffer and write threads its sender asks for, never more than the share; the
        share's connections reach the sender with the next ``status``."""
        self.share = share
        if self.engine is None:
            return
        mem = max(self.chunk_size, min(self.memory_asked, share.memory))
        if mem != self.memory_now:
            self.engine.set_memory(mem)
            self.memory_now = mem
        self.engine.set_threads(self.server.clamp_threads(min(self.threads_asked, share.threads)))

    def _share_reply(self) -> Optional[List[int]]:
        """``[connections, write threads]`` of the session's share, for ``opened`` and ``status``."""
        if self.share is None:
            return None
        return [int(self.share.connections), self.server.clamp_threads(self.share.threads)]

    def _open_destination(self, where: str) -> None:
        """Open the root and the session's subdirectory (created unless a dry run) and make sure a
        file can be created there: a destination nothing can be written to is refused at once, with
        its path (exit 3; a full one 7), rather than file by file."""
        srv = self.server
        try:
            self.root = SafeRoot(srv.root, max_cached=srv.dir_cache)
        except OSError as e:
            raise SessionError(f"destination {srv.root}: {(e.strerror or 'no such directory').lower()}",
                               errors.DIR_NOT_FOUND) from None
        try:
            if self.scratch:
                self._remove_scratch()  # left by an exploration that was killed: start empty
            dfd = self.dest.dir_fd(self.base, create=not self.dry_run)
        except FileNotFoundError:
            if self.dry_run:
                return  # nothing to create in a dry run: every file would be sent
            raise SessionError(f"destination {where}: no such directory", errors.DIR_NOT_FOUND) from None
        except UnsafePath as e:
            raise SessionError(str(e), errors.FILES_FAILED) from e
        except OSError as e:  # EACCES on a component, EROFS... (ENOSPC: 7)
            raise SessionError(f"destination {where}: cannot open or create it: {e.strerror}",
                               errors.from_oserror(e, errors.DIR_NOT_FOUND)) from None
        if self.dry_run:
            return
        try:
            check_writable(dfd)
        except OSError as e:
            raise SessionError(f"destination {where}: not writable: {e.strerror}",
                               errors.from_oserror(e, errors.DIR_NOT_FOUND)) from None

    def _settle_markers(self) -> None:
        """Settle the markers earlier sessions left here (:mod:`automdt.durable`): one of this
        boot is made good with one ``syncfs``; one of an earlier boot makes every file changed
        since its time count as not complete."""
        dfd = self.dest.dir_fd(self.base)
        live = {durable.MARKER_PREFIX + s.sid for s in self.server.sessions.values() if s is not self and s.files}
        where = self._where(self.base)
        try:
            found = durable.read_markers(dfd, os.listdir(dfd), skip=live)
            this_boot = durable.boot_id()
            settled = [name for name, boot, _ in found if boot and boot == this_boot]
            earlier = [(name, t) for name, boot, t in found if not boot or boot != this_boot]
            if settled:
                durable.syncfs(dfd)  # what they wrote is still in this boot's cache: on disk now
                durable.remove(dfd, settled)
        except OSError as e:
            raise SessionError(f"destination {where}: cannot settle what an earlier run left unsynced: {e.strerror}",
                               errors.from_oserror(e, errors.FATAL)) from None
        self.stale_markers = [name for name, _ in earlier]
        self.at_risk_since = min(t for _, t in earlier) if earlier else None
        if self.at_risk_since is not None:
            log.warning("session %s found that a run into %s lost power (or its machine crashed) before its data "
                        "reached the disk: files changed since then are sent again", self.sid, where)

    def _mark(self) -> None:
        """Write this session's marker before its first file data (:mod:`automdt.durable`); again
        if a session that settled the directory removed it since."""
        if self.dry_run or self.scratch or self.root is None or self.fsync in ("file", "dir"):
            return  # file, dir: each file is on disk before its rename, so none is at risk
        dfd = self.dest.dir_fd(self.base)
        try:
            if self.marker is not None:
                try:
                    os.stat(self.marker, dir_fd=dfd, follow_symlinks=False)
                    return
                except FileNotFoundError:
                    pass
            else:
                self.marked_ns = time.time_ns()
            self.marker = durable.write_marker(dfd, self.sid, self.marked_ns)
        except OSError as e:
            raise SessionError(f"destination {self._where(self.base)}: cannot record what is not on disk yet: "
                               f"{e.strerror}", errors.from_oserror(e, errors.FATAL)) from None

    def _where(self, parts: Tuple[str, ...]) -> str:
        """The receiver's path of ``parts`` (beneath its root), for error messages."""
        return where_beneath(self.server.root, parts)

    @property
    def dest(self) -> SafeRoot:
        """The destination root (from ``open`` until the session closes)."""
        if self.root is None:
            raise SessionError("the session is not open", errors.USAGE)
        return self.root

    # ----------------------------------------------------------------- planning
    def _manifest(self, req: protocol.Manifest) -> protocol.Plan:
        plan: List[Tuple[int, str]] = []
        self._make_dirs(req.dirs)
        entries = req.files
        if len(self.files) + len(entries) > self.server.max_files:
            raise SessionError(f"manifest over the receiver's limit of {self.server.max_files} files", errors.USAGE)
        for wire in entries:  # one by one: a malformed entry ends the plan there
            try:
                parts = check_relpath(wire.get("path"))
                entry = protocol.ManifestEntry.from_dict(wire)
            except UnsafePath as ex:
                raise SessionError(f"refused: {ex}", errors.FILES_FAILED) from ex
            except (KeyError, TypeError, ValueError):
                raise SessionError(f"malformed manifest entry {str(wire)[:80]}", errors.USAGE) from None
            fid, size = entry.id, entry.size
            if size < 0 or fid < 0 or fid >= 2**32 or fid in self.files:
                raise SessionError(f"malformed manifest entry {str(wire)[:80]}", errors.USAGE)
            f = PartialFile(fid, entry.path, self.base + parts, size, entry.mtime_ns, entry.mode & 0o777,
                            entry.source_id, (entry.digest or "")[:64] if self.checksum else "")
            partial = 0
            try:
                action, partial = self._plan_file(f, entry.digest)
            except UnsafePath as ex:
                self._file_error([fid, errors.FILES_FAILED, f"{f.path}: {ex}"])
                action = "fail"
            except OSError as ex:
                code = errors.from_oserror(ex)
                action = "fail"
                self._file_error([fid, code, f"{f.path}: {ex.strerror} (in {self._where(f.parts[:-1])})"])
                if code == errors.FATAL:
                    raise SessionError(f"{f.path}: {ex.strerror}", code) from ex
            if action == "send" and not self.dry_run:
                self.files[fid] = f
                self.accounting.bytes_needed += size - partial
            plan.append((fid, action))
        if not self.dry_run:
            self._check_space()
        self.planned = True
        return protocol.Plan(plan)

    def _make_dirs(self, dirs: List[str]) -> None:
        """Create the sender's directories (parents first; none in a dry run). A name that would
        escape ends the session (exit 6); a directory that cannot be created fails alone, reported
        with the next status (its files fail as they are planned); a full destination is fatal."""
        root = self.dest
        for d in dirs:
            try:
                parts = check_relpath(d)
            except UnsafePath as ex:
                raise SessionError(f"refused: {ex}", errors.FILES_FAILED) from ex
            if self.dry_run:
                continue
            try:
                root.dir_fd(self.base + parts, create=True)
            except UnsafePath as ex:
                raise SessionError(f"refused: {ex}", errors.FILES_FAILED) from ex
            except OSError as ex:  # this directory (and what the sender puts in it) fails; the rest goes on
                code = errors.from_oserror(ex)
                why = f"{d}: cannot create directory {self._where(self.base + parts)}: {ex.strerror}"
                if code == errors.FATAL:
                    raise SessionError(why, code) from ex
                self.file_errors.append([DIRECTORY_ERROR, code, why])

    def _plan_file(self, f: PartialFile, digest: Optional[str]) -> Tuple[str, int]:
        """``skip`` (the destination matches), ``done`` (created empty now) or ``send``, with the
        bytes a resumable partial of a file to send already holds on disk (0 if none)."""
        parts = f.parts[:-1]
        try:
            dfd = self.dest.dir_fd(parts, create=not self.dry_run)
        except FileNotFoundError:
            return "send", 0  # dry run: the directory does not exist yet
        names = self._listing(parts, dfd)
        if names is not None:
            f.see_listing(names)
        at_risk = self.at_risk_since is not None and durable.changed_since(dfd, f.parts[-1], self.at_risk_since)
        if not at_risk and not need_transfer(dfd, f, self.checksum, digest, names):
            return "skip", 0
        if f.size == 0 and not self.dry_run:
            f.create_empty(dfd, fsync=self.fsync != "none")
            self.accounting.files_completed += 1
            return "done", 0
        if self.dry_run or (names is not None and not f.partial):
            return "send", 0
        if self.at_risk_since is not None and durable.changed_since(dfd, f.temp_names()[0], self.at_risk_since):
            # written after the last durable point: its journal may vouch for chunks the disk
            # lost (or, after a failed write-back, for pages the cache still holds): sent whole
            f.partial = False  # open() creates afresh, unlinking what has the names
            return "send", 0
        return "send", f.partial_bytes(dfd)

    def _listing(self, parts: Tuple[str, ...], dfd: int) -> Optional[AbstractSet[str]]:
        """The entries of destination directory ``parts`` (open as ``dfd``), listed once per
        session: the plan looks names up here instead of ``stat``ing two names per file. None
        (``stat`` each name) past :data:`LISTING_NAMES_MAX` entries or when it cannot be listed.
        A directory this session created is empty. Like a ``stat``, a listing is what the
        directory held when the plan looked; the partial is created with ``O_EXCL`` and the
        destination replaced by ``rename`` whatever appeared since."""
        if parts in self._listings:
            return self._listings[parts]
        created = self.dest.created
        if len(created) != self._created_seen:
            self._fresh_dirs.update(created[self._created_seen:])
            self._created_seen = len(created)
        names: Optional[AbstractSet[str]] = None
        if parts in self._fresh_dirs:
            names = frozenset()
        elif self._listing_budget > 0:
            found: List[str] = []
            try:
                with os.scandir(dfd) as it:
                    for e in it:
                        found.append(e.name)
                        if len(found) > self._listing_budget:
                            break
            except OSError:
                found = []
            else:
                if len(found) <= self._listing_budget:
                    names = frozenset(found)
            self._listing_budget -= len(found)
        self._listings[parts] = names
        return names

    def _space_note(self) -> str:
        """`` (destination D: F MB free, this run has N MB left to write)`` for a full disk's error."""
        try:
            st = os.statvfs(self.dest.fd)
            written = int(self.engine.stats().write.bytes) if self.engine is not None else 0
        except (OSError, AttributeError):
            return ""
        left = max(0, self.accounting.bytes_needed - written)
        return (f" (destination {self._where(self.base)}: {st.f_bavail * st.f_frsize / 1e6:.1f} MB free, "
                f"this run has {left / 1e6:.1f} MB left to write)")

    def _check_space(self) -> None:
        try:
            st = os.statvfs(self.dest.fd)
        except OSError:
            return
        free = st.f_bavail * st.f_frsize
        need = self.accounting.bytes_needed
        if need > free:
            self.dest.remove_created()  # no empty tree left behind by a refused transfer
            raise SessionError(f"not enough space: destination {self.server.root} has {free} bytes free, "
                               f"the transfer needs up to {need}", errors.FATAL)

    def _file_error(self, entry: List[Any]) -> None:
        """Report ``[file id, exit code, message]`` to the sender at its next poll."""
        self.file_errors.append(entry)
        self.accounting.files_failed += 1

    # ----------------------------------------------------------------- partial files
    def _activate(self, req: protocol.Activate) -> protocol.Activated:
        self._mark()
        out: List[Tuple[int, str, List[List[int]]]] = []
        for fid in req.ids:
            f = self.files.get(fid)
            if f is None or f.active:
                raise SessionError(f"activate: unknown or active file id {fid}", errors.USAGE)
            if self.n_active >= MAX_ACTIVE_FILES:
                raise SessionError(f"more than {MAX_ACTIVE_FILES} files active at once", errors.USAGE)
            try:
                ranges = self._open_partial(f)
            except (UnsafePath, OSError) as ex:
                code = errors.from_oserror(ex, writing=True) if isinstance(ex, OSError) else errors.FILES_FAILED
                why = f"cannot write it in {self._where(f.parts[:-1])}: {ex.strerror}" if isinstance(ex, OSError) else ex
                self._file_error([f.id, code, f"{f.path}: {why}"])
                self._release(f)
                self.files.pop(f.id, None)
                out.append((f.id, "fail", []))
                continue
            if not ranges:
                self._finalize(f)
                out.append((f.id, "done", []))
            else:
                out.append((f.id, "send", ranges))
        return protocol.Activated(out)

    def _open_partial(self, f: PartialFile) -> List[List[int]]:
        """Open (or resume) the partial file; register it with the engine; return ranges to send."""
        dfd = self.dest.dir_fd(f.parts[:-1])
        cs = self.chunk_size
        nchunks = f.chunks(cs)
        self.server.claim(self, f)
        done = f.open(dfd, cs)
        self.n_active += 1
        if len(done) == nchunks:
            return []
        if not done:
            self.engine.add_file(f.id, f.data_fd, f.journal_fd, f.size)
            return [[0, f.size]]
        self.engine.add_file(f.id, f.data_fd, f.journal_fd, f.size, journal.bitmap(done, nchunks))
        return missing_ranges(done, nchunks, cs, f.size)

    def _finalize(self, f: PartialFile) -> None:
        """All chunks written and verified: set metadata, (fsync,) rename into place. A failure
        raises :class:`FinalizeError` naming the step."""
        fsync = self.fsync in ("file", "dir")
        step = "fsync" if fsync else "seal"
        try:
            dfd = self.dest.dir_fd(f.parts[:-1])
            f.seal(fsync=fsync)
            self._release(f)
            step = "rename"
            f.rename_into_place(dfd, fsync_dir=self.fsync == "dir")
        except OSError as ex:
            raise FinalizeError(step, ex) from ex
        del self.files[f.id]
        self.done.append(f.id)
        self.accounting.files_completed += 1

    def _release(self, f: PartialFile) -> None:
        """Stop writing ``f``: unregister it from the engine and close its descriptors (its partial
        and journal stay on disk)."""
        self.server.unclaim(self, f)
        if f.active and self.engine is not None:
            try:
                self.engine.remove_file(f.id)
            except (KeyError, ValueError):
                pass
        if f.close():
            self.n_active -= 1

    def give_up(self, f: PartialFile, why: str) -> None:
        """Another session takes ``f``'s destination over: stop writing it, never rename it, and
        report it failed (``why``) to this session's sender."""
        self._release(f)
        self.files.pop(f.id, None)
        self._file_error([f.id, errors.FILES_FAILED, f"{f.path}: {why}"])

    def _discard_partial(self, f: PartialFile) -> None:
        try:
            dfd = self.dest.dir_fd(f.parts[:-1], create=False)
        except (OSError, UnsafePath):
            return
        f.discard(dfd)

    # ----------------------------------------------------------------- during the transfer
    def _poll(self, req: protocol.Poll) -> protocol.Status:
        if req.write_threads is not None:
            self.threads_asked = int(req.write_threads)
            self.apply_share(self.server.shares())
        if req.backlog is not None:
            self.backlog = req.backlog
        if req.write_throttle is not None:  # a throttle schedule's entry became due
            t, total = (max(0, x) for x in req.write_throttle)
            self.engine.set_throttle("write", self._thread_limit(t), total)
        self.pump()
        st = self.engine.stats()
        reply = protocol.Status(st.to_json(), self.done, self.bad, self.file_errors,
                                list(self.fatal) if self.fatal else None, time.monotonic(), self._share_reply())
        self.done, self.bad, self.file_errors = [], [], []
        return reply

    def _missing(self, req: protocol.Missing) -> protocol.MissingRanges:
        out: Dict[str, List[List[int]]] = {}
        for fid in req.ids:
            f = self.files.get(fid)
            if f is not None and f.active:
                ranges = [list(r) for r in self.engine.missing(f.id)]
                out[str(f.id)] = ranges
                self.accounting.chunks_missing += sum(-(-r[1] // self.chunk_size) for r in ranges)
        return protocol.MissingRanges(out)

    def _fail(self, req: protocol.Fail) -> protocol.Ok:
        for fid in req.ids:
            f = self.files.pop(fid, None)
            if f is not None:
                self._release(f)  # the partial and its journal stay for a later run ...
                self.accounting.files_failed += 1
                if req.discard:  # ... unless the source is gone or unreadable: then they are debris
                    self._discard_partial(f)
        return protocol.Ok()

    def _digest(self, req: protocol.Digest) -> protocol.Digests:
        """Content digests (automdt.verify) of destination files, for ``verify``."""
        from automdt.verify import chunked_digest_fd

        out: Dict[str, Optional[str]] = {}
        unreadable: Dict[str, str] = {}  # present but not readable (None in ``digests`` too)
        for path in req.paths:
            out[path] = None
            try:
                parts = self.base + check_relpath(path)
                dfd = self.dest.dir_fd(parts[:-1], create=False)
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except UnsafePath as e:
                unreadable[path] = str(e)
                continue
            except OSError as e:
                unreadable[path] = "a symlink (not followed)" if e.errno == errno.ELOOP else (e.strerror or str(e)).lower()
                continue
            try:
                st = os.fstat(fd)
                if stat.S_ISREG(st.st_mode):
                    out[path] = chunked_digest_fd(fd, st.st_size, self.chunk_size)
            except OSError as e:
                unreadable[path] = (e.strerror or str(e)).lower()
            finally:
                os.close(fd)
        return protocol.Digests(out, unreadable)

    def _close_msg(self, req: protocol.Close) -> Any:
        """Close; with ``--fsync end`` the reply waits for the durable point (:class:`Deferred`)."""
        self.pump()
        if self.root is None or self.dry_run or self.scratch:
            self.close()
            return protocol.Closed()
        dfd = os.dup(self.dest.dir_fd(self.base))
        # the stale markers go once this session has planned its files (those at risk were resent)
        stale = self.stale_markers if self.planned else []
        own = [self.marker] if self.marker is not None else []
        # after a syncfs the markers of this boot's sessions that no longer write are settled too
        idle = [durable.MARKER_PREFIX + s.sid for s in self.server.sessions.values() if s is not self and not s.files]
        mode = self.fsync
        self.marker = None  # close() leaves it to this reply
        self.close()
        if mode == "end" and own:
            return Deferred(lambda: _durable_point(dfd, own + stale, idle, self.sid, self.marked_ns))
        try:
            # file, dir: no marker of its own (every file was fsynced before its rename); none:
            # this marker stays until a later session of this boot syncs (it now covers what the
            # stale ones did); a session that wrote nothing has no marker
            durable.remove(dfd, stale)
        except OSError:
            pass
        finally:
            os.close(dfd)
        return protocol.Closed()

    # ------------------------------------------------------------------ engine
    def pump(self) -> None:
        """Drain engine events: finalize completed files, collect bad chunks and errors."""
        if self.engine is None:
            return
        for ev in self.engine.events():
            kind = ev[0]
            if kind == "file_done":
                f = self.files.get(ev[1])
                if f is None:
                    continue
                try:
                    self._finalize(f)
                except FinalizeError as ex:
                    code = errors.from_oserror(ex.error, writing=True)
                    self._file_error([f.id, code, f"{f.path}: {ex.step}: {ex.error.strerror}"])
                    self._release(f)
                    self.files.pop(f.id, None)
                    if ex.step == "fsync":
                        # Linux marks the pages clean after a failed write-back: a rerun would
                        # re-hash the page cache, not the disk, and trust the partial. It goes.
                        self._discard_partial(f)
            elif kind == "chunk_bad":
                self.bad.append([ev[1], ev[2], ev[3]])
            elif kind == "write_error":
                f = self.files.get(ev[1])
                name = f.path if f else f"file #{ev[1]}"
                code = errors.from_oserror(ev[2], writing=True)
                msg = f"{name}: {ev[3] if len(ev) > 3 else os.strerror(ev[2])}"
                if ev[2] in errors.DESTINATION_FULL_ERRNOS:
                    msg += self._space_note()
                if code == errors.FATAL and self.fatal is None:
                    self.fatal = (code, msg)
                elif code != errors.FATAL:
                    self._file_error([ev[1], code, msg])
            else:
                log.warning("session %s: %s", self.sid, " ".join(str(x) for x in ev[1:]))

    def _remove_scratch(self) -> None:
        """Remove this session's scratch directory (never following a symlink: ``rmtree`` by fd)."""
        parent = self.dest.dir_fd(self.base[:-1], create=False)
        try:
            shutil.rmtree(self.base[-1], dir_fd=parent)
        except FileNotFoundError:
            pass

    def close(self, why: str = "closed by the sender") -> None:
        if self.state == "closed":
            return
        partial = len(self.files)
        for f in list(self.files.values()):
            self._release(f)
        self.files.clear()
        if self.server.metrics is not None:
            self.server.metrics.session_closed(self)
        acct = self.accounting
        if self.engine is not None:
            try:
                acct.bytes_written = int(self.engine.stats().write.bytes)
            except Exception:  # totals are a courtesy; the close must happen
                pass
            self.engine.close()
            self.engine = None
        if self.state == "open":
            log.info("session %s %s: %d files completed, %d failed, %d left partial; %d bytes written in %.1f s",
                     self.sid, why, acct.files_completed, acct.files_failed, partial, acct.bytes_written,
                     time.monotonic() - self.t_open)
        if self.root is not None:
            if self.scratch:
                try:
                    self._remove_scratch()
                except (OSError, UnsafePath) as e:
                    log.warning("session %s: cannot remove scratch %s: %s", self.sid, "/".join(self.base), e)
            self.root.close()
            self.root = None
        self.state = "closed"
