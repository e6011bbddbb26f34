"""The destination side: a control server (pyzmq ROUTER) with one session per sender.

``automdt receive`` runs :class:`ReceiverServer` in the foreground; ``automdt transfer SRC DIR``
runs one embedded in the sending process over loopback. Each session owns one engine
:class:`~automdt.transfer_engine.Receiver` (its own data port), plans what must move (skip
complete files, resume partial ones from their journals), opens partial files only when the
sender activates them (a bounded window, so a tree of a million files never holds a million
descriptors), and renames each file into place once the engine reports every chunk written and
verified. Message flow: ``automdt/PROTOCOL.md``.
"""
from __future__ import annotations

import errno
import hmac
import ipaddress
import logging
import os
import shutil
import socket
import stat
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import zmq

from automdt import errors, journal, protocol
from automdt.manifest import file_digest
from automdt.paths import SCRATCH_PREFIX, SafeRoot, UnsafePath, check_relpath, temp_names

log = logging.getLogger(__name__)

MIN_CHUNK = 4 << 10
MAX_CHUNK = 64 << 20
MAX_ACTIVE_FILES = 4096


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@dataclass
class _File:
    id: int
    path: str
    parts: Tuple[str, ...]
    size: int
    mtime_ns: int
    mode: int
    source_id: str = ""
    digest: str = ""
    data_fd: int = -1
    journal_fd: int = -1
    active: bool = False
    partial: bool = False
    """The plan found a partial (``.part``) to resume; without one, activation creates afresh."""
    _temp: Optional[Tuple[str, str]] = None

    def temp_names(self) -> Tuple[str, str]:
        """The partial's and journal's names (hashed once per file)."""
        if self._temp is None:
            self._temp = temp_names(self.path)
        return self._temp


class SessionError(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


class Session:
    """One sender's transfer into ``root``/``subdir``."""

    def __init__(self, server: "ReceiverServer", ident: bytes, peer: str = ""):
        self.server = server
        self.ident = ident
        self.sid = ident.hex()
        """The whole routing id in hex (ZeroMQ's ids share their first bytes: never cut it)."""
        self.peer = peer
        self.t_open = 0.0
        self.files_failed = 0
        self.bytes_written = 0
        self.took_over: set = set()
        self.state = "new"
        self.client_nonce = ""
        self.server_nonce = protocol.nonce()
        self.token = b""
        self.engine: Any = None
        self.root: Optional[SafeRoot] = None
        self.base: Tuple[str, ...] = ()
        self.chunk_size = 0
        self.fsync = "none"
        self.checksum = False
        self.files: Dict[int, _File] = {}
        self.done: List[int] = []
        self.bad: List[List[int]] = []
        self.file_errors: List[List[Any]] = []
        self.fatal: Optional[Tuple[int, str]] = None
        self.last_seen = time.monotonic()
        self.bytes_needed = 0
        self.dry_run = False
        self.scratch = False
        self.n_active = 0
        """Files open and registered with the engine now (kept as a count: the activation limit
        is checked once per file, and counting 20,000 files each time was quadratic)."""
        self.files_completed = 0
        """Files renamed into place (or created empty) by this session (for metrics)."""
        self.chunks_missing = 0
        """Chunks the sender was told to send again after a lost connection (for metrics)."""

    # ----------------------------------------------------------------- messages
    def handle(self, msg: Dict[str, Any]) -> Dict[str, Any]:
        self.last_seen = time.monotonic()
        kind = msg["type"]
        if kind == "hello":
            return self._hello(msg)
        if kind == "auth":
            return self._auth(msg)
        if self.state not in ("authed", "open"):
            raise SessionError("not authenticated", errors.FATAL)
        if kind == "open":
            return self._open(msg)
        if self.state != "open":
            raise SessionError(f"{kind!r} before 'open'", errors.USAGE)
        handler = {
            "manifest": self._manifest,
            "activate": self._activate,
            "poll": self._poll,
            "missing": self._missing,
            "fail": self._fail,
            "digest": self._digest,
            "close": self._close_msg,
        }.get(kind)
        if handler is None:
            raise SessionError(f"unknown message type {kind!r}", errors.USAGE)
        return handler(msg)

    def _hello(self, msg):
        if self.state != "new":
            raise SessionError("repeated hello", errors.USAGE)
        if msg.get("version") != protocol.VERSION:
            raise SessionError(f"protocol version {msg.get('version')!r} not supported (this receiver speaks {protocol.VERSION})", errors.USAGE)
        self.client_nonce = str(msg.get("nonce", ""))[:128]
        self.state = "challenged"
        return {"type": "challenge", "nonce": self.server_nonce, "auth": self.server.secret is not None}

    def _auth(self, msg):
        if self.state != "challenged":
            raise SessionError("auth out of order", errors.USAGE)
        secret = self.server.secret
        reply: Dict[str, Any] = {"type": "welcome"}
        if secret is not None:
            want = protocol.mac(secret, "client", self.server_nonce, self.client_nonce)
            if not hmac.compare_digest(str(msg.get("mac", "")), want):
                self.server.auth_failures += 1
                raise SessionError("authentication failed: wrong secret", errors.FATAL)
            reply["mac"] = protocol.mac(secret, "server", self.client_nonce, self.server_nonce)
            self.token = protocol.data_token(secret, self.server_nonce, self.client_nonce)
        else:
            self.token = os.urandom(32)
            reply["token"] = self.token.hex()
        self.state = "authed"
        return reply

    def _open(self, msg):
        if self.state != "authed":
            raise SessionError("repeated open", errors.USAGE)
        from automdt.transfer_engine import Receiver

        srv = self.server
        encrypt = msg.get("encrypt") is True
        if srv.encrypt and not encrypt:
            raise SessionError("this receiver requires encryption (use --encrypt)", errors.USAGE)
        if encrypt and srv.secret is None:
            raise SessionError("encryption needs a shared secret on both ends (--secret-file)", errors.USAGE)
        subdir = msg.get("subdir") or ""
        try:
            self.base = check_relpath(subdir) if subdir else ()
        except UnsafePath as e:
            raise SessionError(f"destination subdirectory refused: {e}", errors.USAGE) from e
        self.scratch = msg.get("scratch") is True
        if self.scratch and not (self.base and self.base[-1].startswith(SCRATCH_PREFIX)):
            raise SessionError(f"a scratch subdirectory must be named {SCRATCH_PREFIX}*", errors.USAGE)
        chunk = int(msg.get("chunk_size", 4 << 20))
        if not MIN_CHUNK <= chunk <= MAX_CHUNK:
            raise SessionError(f"chunk size {chunk} outside [{MIN_CHUNK}, {MAX_CHUNK}]", errors.USAGE)
        memory = max(chunk, min(int(msg.get("memory", srv.max_memory)), srv.max_memory))
        self.chunk_size = chunk
        self.fsync = msg.get("fsync", "none") if msg.get("fsync") in ("none", "file", "dir") else "none"
        self.checksum = bool(msg.get("checksum", False))
        self.dry_run = bool(msg.get("dry_run", False))
        self.root = SafeRoot(srv.root, max_cached=srv.dir_cache)
        try:
            if self.scratch:
                self._remove_scratch()  # left by an exploration that was killed: start empty
            self.root.dir_fd(self.base, create=not self.dry_run)
        except FileNotFoundError:
            if not self.dry_run:
                raise
        except UnsafePath as e:
            raise SessionError(str(e), errors.FILES_FAILED) from e
        wt = msg.get("write_throttle") or [0, 0]
        key = protocol.data_key(srv.secret, self.server_nonce, self.client_nonce) if encrypt else None
        self.engine = Receiver(srv.host, 0, self.token, chunk, memory, max_threads=srv.max_threads,
                               write_throttle=(int(wt[0]), int(wt[1])), rcvbuf=int(msg.get("rcvbuf", 0)),
                               tls_key=key)
        self.engine.set_threads(srv.clamp_threads(int(msg.get("write_threads", 1))))
        self.state = "open"
        self.t_open = time.monotonic()
        log.info("session %s%s opened: into %s%s (chunk %d, buffer %d bytes%s%s)", self.sid,
                 f" from {self.peer}" if self.peer else "", srv.root, "/" + "/".join(self.base) if self.base else "",
                 chunk, memory, ", encrypted" if encrypt else "", ", dry run" if self.dry_run else "")
        return {"type": "opened", "data_port": self.engine.port, "chunk_size": chunk, "memory": memory,
                "max_threads": srv.max_threads, "encrypted": encrypt, "runtime_throttle": True}

    @property
    def dest(self) -> SafeRoot:
        """The destination root (from ``open`` until the session closes)."""
        if self.root is None:
            raise SessionError("the session is not open", errors.USAGE)
        return self.root

    def _manifest(self, msg):
        plan = []
        root = self.root
        for d in msg.get("dirs", []):
            try:
                parts = check_relpath(d)
                if not self.dry_run:
                    root.dir_fd(self.base + parts, create=True)
            except UnsafePath as ex:
                raise SessionError(f"refused: {ex}", errors.FILES_FAILED) from ex
        entries = msg.get("files", [])
        if len(self.files) + len(entries) > self.server.max_files:
            raise SessionError(f"manifest over the receiver's limit of {self.server.max_files} files", errors.USAGE)
        for e in entries:
            try:
                parts = check_relpath(e.get("path"))
                fid, size, mtime, mode = int(e["id"]), int(e["size"]), int(e["mtime_ns"]), int(e.get("mode", 0o644))
            except UnsafePath as ex:
                raise SessionError(f"refused: {ex}", errors.FILES_FAILED) from ex
            except (KeyError, TypeError, ValueError):
                raise SessionError(f"malformed manifest entry {str(e)[:80]}", errors.USAGE) from None
            if size < 0 or fid < 0 or fid >= 2**32 or fid in self.files:
                raise SessionError(f"malformed manifest entry {str(e)[:80]}", errors.USAGE)
            f = _File(fid, e["path"], self.base + parts, size, mtime, mode & 0o777,
                      str(e.get("source_id", ""))[:64], str(e.get("digest") or "")[:64] if self.checksum else "")
            try:
                action = self._plan_file(f, e.get("digest"))
            except UnsafePath as ex:
                self._file_error([fid, errors.FILES_FAILED, f"{f.path}: {ex}"])
                action = "fail"
            except OSError as ex:
                code = errors.FATAL if ex.errno in (errno.ENOSPC, errno.EDQUOT) else errors.FILES_FAILED
                action = "fail"
                self._file_error([fid, code, f"{f.path}: {ex.strerror}"])
                if code == errors.FATAL:
                    raise SessionError(f"{f.path}: {ex.strerror}", code) from ex
            if action == "send" and not self.dry_run:
                self.files[fid] = f
                self.bytes_needed += size - self._partial_bytes(f)
            plan.append([fid, action])
        if not self.dry_run:
            self._check_space()
        return {"type": "plan", "files": plan}

    def _file_error(self, entry: List[Any]) -> None:
        """Report ``[file id, exit code, message]`` to the sender at its next poll."""
        self.file_errors.append(entry)
        self.files_failed += 1

    def _partial_bytes(self, f: _File) -> int:
        """Bytes a resumable partial of ``f`` already holds on disk (0 if none)."""
        try:
            dfd = self.dest.dir_fd(f.parts[:-1], create=False)
            st = os.stat(f.temp_names()[0], dir_fd=dfd, follow_symlinks=False)
        except (OSError, UnsafePath):
            return 0
        f.partial = True  # whatever it is: activation looks at it before creating afresh
        return min(f.size, st.st_blocks * 512) if stat.S_ISREG(st.st_mode) else 0

    def _check_space(self) -> None:
        try:
            st = os.statvfs(self.dest.fd)
        except OSError:
            return
        free = st.f_bavail * st.f_frsize
        if self.bytes_needed > free * 1.0 + 0:
            need = self.bytes_needed
            self.dest.remove_created()  # no empty tree left behind by a refused transfer
            raise SessionError(f"not enough space: destination {self.server.root} has {free} bytes free, "
                               f"the transfer needs up to {need}", errors.FATAL)

    def _plan_file(self, f: _File, digest: Optional[str]) -> str:
        try:
            dfd = self.dest.dir_fd(f.parts[:-1], create=not self.dry_run)
        except FileNotFoundError:
            return "send"  # dry run: the directory does not exist yet
        name = f.parts[-1]
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None:
            if stat.S_ISDIR(st.st_mode):
                raise UnsafePath("destination exists as a directory")
            if stat.S_ISREG(st.st_mode) and st.st_size == f.size:
                if self.checksum and digest:
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                    try:
                        same = file_digest(f"/proc/self/fd/{fd}") == digest
                    finally:
                        os.close(fd)
                    if same:
                        return "skip"
                elif not self.checksum and st.st_mtime_ns == f.mtime_ns:
                    return "skip"
        if f.size == 0 and not self.dry_run:
            self._write_empty(f, dfd, name)
            return "done"
        return "send"

    def _write_empty(self, f: _File, dfd: int, name: str) -> None:
        tmp, jname = temp_names(f.path)
        _unlink(tmp, dfd)
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            os.fchmod(fd, f.mode)
            os.utime(fd, ns=(f.mtime_ns, f.mtime_ns))
            if self.fsync != "none":
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        _unlink(jname, dfd)
        self.files_completed += 1

    def _activate(self, msg):
        out = []
        for fid in msg.get("ids", []):
            f = self.files.get(int(fid))
            if f is None or f.active:
                raise SessionError(f"activate: unknown or active file id {fid}", errors.USAGE)
            if self.n_active >= MAX_ACTIVE_FILES:
                raise SessionError(f"more than {MAX_ACTIVE_FILES} files active at once", errors.USAGE)
            try:
                ranges = self._open_partial(f)
            except UnsafePath as ex:
                self._file_error([f.id, errors.FILES_FAILED, f"{f.path}: {ex}"])
                out.append([f.id, "fail", []])
                continue
            except OSError as ex:
                code = errors.FATAL if ex.errno in (errno.ENOSPC, errno.EDQUOT) else errors.FILES_FAILED
                self._file_error([f.id, code, f"{f.path}: {ex.strerror}"])
                out.append([f.id, "fail", []])
                continue
            if not ranges:
                self._finalize(f)
                out.append([f.id, "done", []])
            else:
                out.append([f.id, "send", ranges])
        return {"type": "activated", "files": out}

    def _open_partial(self, f: _File) -> List[List[int]]:
        """Open (or resume) the partial file; register it with the engine; return ranges to send."""
        dfd = self.dest.dir_fd(f.parts[:-1])
        tmp, jname = f.temp_names()
        cs = self.chunk_size
        nchunks = (f.size + cs - 1) // cs
        fp = journal.fingerprint(f.path, f.size, f.mtime_ns, cs, f.source_id, f.digest)
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        done: List[int] = []
        data_fd = jfd = -1
        self.server.claim(self, f)
        try:
            if not f.partial:  # nothing to resume when the plan ran: create (below)
                raise FileNotFoundError
            data_fd = os.open(tmp, flags, dir_fd=dfd)
            jfd = os.open(jname, flags | os.O_APPEND, dir_fd=dfd)
            euid = os.geteuid()
            for fd in (data_fd, jfd):
                st = os.fstat(fd)
                # only a regular file we created ourselves, with no other name (a hard link
                # planted at the partial's name would make us write outside the root)
                if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != euid:
                    raise FileNotFoundError
            done = journal.verified_chunks(data_fd, jfd, fp, f.size, cs)
            if not done:
                raise FileNotFoundError  # nothing reusable: start afresh
        except OSError:  # missing, a symlink (ELOOP), untrusted or stale: start afresh
            for fd in (data_fd, jfd):
                if fd >= 0:
                    os.close(fd)
            data_fd = jfd = -1
            data_fd = _create(tmp, dfd, flags)  # (anything left under the name is unlinked first)
            try:
                jfd = _create(jname, dfd, flags | os.O_APPEND)
                os.write(jfd, journal.header(fp, cs))
                os.ftruncate(data_fd, f.size)
            except OSError:
                os.close(data_fd)
                if jfd >= 0:
                    os.close(jfd)
                raise
            done = []
        f.data_fd, f.journal_fd, f.active = data_fd, jfd, True
        self.n_active += 1
        if len(done) == nchunks:
            return []
        if not done:
            self.engine.add_file(f.id, data_fd, jfd, f.size)
            return [[0, f.size]]
        self.engine.add_file(f.id, data_fd, jfd, f.size, journal.bitmap(done, nchunks))
        return _missing_ranges(done, nchunks, cs, f.size)

    def _finalize(self, f: _File) -> None:
        """All chunks written and verified: set metadata, (fsync,) rename into place."""
        dfd = self.dest.dir_fd(f.parts[:-1])
        tmp, jname = f.temp_names()
        os.fchmod(f.data_fd, f.mode)
        os.utime(f.data_fd, ns=(f.mtime_ns, f.mtime_ns))
        if self.fsync in ("file", "dir"):
            os.fsync(f.data_fd)
        self._release(f)
        os.rename(tmp, f.parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)
        _unlink(jname, dfd)
        if self.fsync == "dir":
            os.fsync(dfd)
        del self.files[f.id]
        self.done.append(f.id)
        self.files_completed += 1

    def _release(self, f: _File) -> None:
        self.server.unclaim(self, f)
        if f.active and self.engine is not None:
            try:
                self.engine.remove_file(f.id)
            except (KeyError, ValueError):
                pass
        for fd in (f.data_fd, f.journal_fd):
            if fd >= 0:
                os.close(fd)
        f.data_fd = f.journal_fd = -1
        if f.active:
            self.n_active -= 1
        f.active = False

    def _poll(self, msg):
        if "write_threads" in msg and msg["write_threads"] is not None:
            self.engine.set_threads(self.server.clamp_threads(int(msg["write_threads"])))
        if msg.get("write_throttle") is not None:  # a throttle schedule's entry became due
            t, total = (max(0, int(x)) for x in msg["write_throttle"])
            self.engine.set_throttle("write", t, total)
        self.pump()
        st = self.engine.stats()
        reply = {
            "type": "status",
            "stats": _stats_dict(st),
            "done": self.done,
            "bad": self.bad,
            "errors": self.file_errors,
            "fatal": list(self.fatal) if self.fatal else None,
            "now": time.monotonic(),
        }
        self.done, self.bad, self.file_errors = [], [], []
        return reply

    def _missing(self, msg):
        out = {}
        for fid in msg.get("ids", []):
            f = self.files.get(int(fid))
            if f is not None and f.active:
                out[str(f.id)] = [list(r) for r in self.engine.missing(f.id)]
                self.chunks_missing += sum(-(-r[1] // self.chunk_size) for r in out[str(f.id)])
        return {"type": "missing", "files": out}

    def _fail(self, msg):
        discard = msg.get("discard") is True
        for fid in msg.get("ids", []):
            f = self.files.pop(int(fid), None)
            if f is not None:
                self._release(f)  # the partial and its journal stay for a later run ...
                self.files_failed += 1
                if discard:  # ... unless the source is gone or unreadable: then they are debris
                    self._discard_partial(f)
        return {"type": "ok"}

    def _discard_partial(self, f: _File) -> None:
        try:
            dfd = self.dest.dir_fd(f.parts[:-1], create=False)
        except (OSError, UnsafePath):
            return
        for name in temp_names(f.path):
            try:
                _unlink(name, dfd)
            except OSError:
                pass

    def _digest(self, msg):
        """Content digests (automdt.verify) of destination files, for ``verify``."""
        from automdt.verify import chunked_digest_fd

        out: Dict[str, Optional[str]] = {}
        unreadable: Dict[str, str] = {}  # present but not readable (None in ``digests`` too)
        for path in msg.get("paths", [])[:1000]:
            out[path] = None
            try:
                parts = self.base + check_relpath(path)
                dfd = self.root.dir_fd(parts[:-1], create=False)
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
        return {"type": "digests", "digests": out, "unreadable": unreadable}

    def _close_msg(self, msg):
        self.pump()
        self.close()
        return {"type": "closed"}

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
                except OSError as ex:
                    code = errors.FATAL if ex.errno in (errno.ENOSPC, errno.EDQUOT) else errors.FILES_FAILED
                    self._file_error([f.id, code, f"{f.path}: rename: {ex.strerror}"])
                    self._release(f)
                    self.files.pop(f.id, None)
            elif kind == "chunk_bad":
                self.bad.append([ev[1], ev[2], ev[3]])
            elif kind == "write_error":
                f = self.files.get(ev[1])
                name = f.path if f else f"file #{ev[1]}"
                code = errors.FATAL if ev[2] in (errno.ENOSPC, errno.EDQUOT) else errors.FILES_FAILED
                msg = f"{name}: {ev[3] if len(ev) > 3 else os.strerror(ev[2])}"
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
        if self.engine is not None:
            try:
                self.bytes_written = int(_stats_dict(self.engine.stats()).get("write", {}).get("bytes", 0))
            except Exception:  # totals are a courtesy; the close must happen
                pass
            self.engine.close()
            self.engine = None
        if self.state == "open":
            log.info("session %s %s: %d files completed, %d failed, %d left partial; %d bytes written in %.1f s",
                     self.sid, why, self.files_completed, self.files_failed, partial, self.bytes_written,
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


def _missing_ranges(done: List[int], nchunks: int, cs: int, size: int) -> List[List[int]]:
    have = set(done)
    out: List[List[int]] = []
    for i in range(nchunks):
        if i in have:
            continue
        off = i * cs
        ln = min(cs, size - off)
        if out and out[-1][0] + out[-1][1] == off:
            out[-1][1] += ln
        else:
            out.append([off, ln])
    return out


def _trim_slot_cache() -> None:
    if "automdt.transfer_engine" in sys.modules:  # only once an engine ran (never imports it)
        sys.modules["automdt.transfer_engine"].trim_cache(60.0)


def _create(name: str, dfd: int, flags: int) -> int:
    """Create ``name`` (0600, O_EXCL) in ``dfd``; whatever already has that name (a stale partial,
    a planted symlink or hard link) is unlinked first and never opened."""
    try:
        return os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dfd)
    except FileExistsError:
        _unlink(name, dfd)
        return os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dfd)


def _unlink(name: str, dfd: int) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass


def _peer(frame) -> str:
    """The sender's address as ZeroMQ saw it ("" if unknown)."""
    try:
        return str(frame.get("Peer-Address") or "")
    except (zmq.ZMQError, AttributeError, TypeError, KeyError):
        return ""


def _stats_dict(st) -> Dict[str, Any]:
    """Engine receiver stats as plain JSON."""
    d = st._asdict()
    return {k: (v._asdict() if hasattr(v, "_asdict") else v) for k, v in d.items()}


class ReceiverServer:
    """The control server: authenticates senders and runs their sessions.

    :param root: destination root directory (must exist).
    :param host: address to listen on (control and data ports).
    :param port: control port (0 picks a free one; see :attr:`port`).
    :param secret: shared secret; required to listen on a non-loopback address.
    :param max_threads: clamp for every write-thread count a sender or policy asks for.
    :param max_memory: clamp for each session's receiver staging buffer, bytes.
    :param idle_timeout_s: a session silent this long is closed (its partial files stay).
    """

    def __init__(self, root: str, host: str = "127.0.0.1", port: int = 0, secret: Optional[bytes] = None,
                 max_threads: int = 64, max_memory: int = 1 << 30, idle_timeout_s: float = 60.0,
                 max_files: int = 10_000_000, max_sessions: int = 16, encrypt: bool = False,
                 metrics: Any = None):
        if not os.path.isdir(root):
            raise errors.AutomdtError(f"{root}: destination root is not a directory", errors.DIR_NOT_FOUND)
        if secret is None and not is_loopback(host):
            raise errors.AutomdtError(
                f"refusing to listen on non-loopback address {host} without --secret-file", errors.USAGE)
        if encrypt and secret is None:
            raise errors.AutomdtError("--encrypt needs --secret-file (the keys derive from the shared secret)",
                                      errors.USAGE)
        self.root = os.path.abspath(root)
        self.host = host
        self.secret = secret
        self.encrypt = encrypt
        """Every session must encrypt: CURVE on the control channel, TLS on the data connections."""
        self.max_threads = max_threads
        self.max_memory = max_memory
        self.idle_timeout_s = idle_timeout_s
        self.max_files = max_files
        self.max_sessions = max_sessions
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.dir_cache = max(8, min(256, (soft if soft > 0 else 1024) // 16))
        """Directory descriptors each session keeps open (bounded by the open-files limit)."""
        self.max_pending = 64
        """Sessions still in their handshake; past this the oldest is dropped."""
        self.handshake_timeout_s = 10.0
        self.sessions: Dict[bytes, Session] = {}
        self._claims: Dict[Tuple[str, ...], Tuple[Session, _File]] = {}
        self.auth_failures = 0
        self.sessions_total = 0
        self.busy_rejections = 0
        self.metrics = metrics
        """An :class:`automdt.metrics.ReceiverMetrics` to keep up to date, or None."""
        self._ctx = zmq.Context()
        self.sock = self._ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_MESSAGE_BYTES)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        if encrypt and secret is not None:  # (checked above: encryption needs the secret)
            self.sock.curve_publickey, self.sock.curve_secretkey = protocol.curve_server_keys(secret)
            self.sock.curve_server = True
        addr = f"[{host}]" if ":" in host else host
        if ":" in host:
            self.sock.setsockopt(zmq.IPV6, 1)
        try:
            if port:
                self.sock.bind(f"tcp://{addr}:{port}")
                self.port = port
            else:
                self.port = self.sock.bind_to_random_port(f"tcp://{addr}")
        except zmq.ZMQError as e:
            self.sock.close(0)
            self._ctx.term()
            raise errors.AutomdtError(f"cannot listen on {host}:{port}: {e.strerror}", errors.USAGE) from None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        # stop() writes a byte here so that serve_forever's poll returns at once, not on its timeout
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)

    def claim(self, session: "Session", f: _File) -> None:
        """Make ``session`` the only writer of ``f``'s destination. Another session that still
        holds it (e.g. one whose sender died and is retrying) gives it up first: it stops writing
        and never renames it."""
        key = f.parts
        owner = self._claims.get(key)
        if owner is not None and owner[0] is not session:
            other, of = owner
            if other.sid not in session.took_over:  # one line per pair of sessions, not one per file
                session.took_over.add(other.sid)
                log.warning("session %s takes over files of older session %s (first: %s); that one stops "
                            "writing them", session.sid, other.sid, f.path)
            other._release(of)
            other.files.pop(of.id, None)
            other._file_error([of.id, errors.FILES_FAILED, f"{of.path}: taken over by a newer session"])
        self._claims[key] = (session, f)

    def unclaim(self, session: "Session", f: _File) -> None:
        owner = self._claims.get(f.parts)
        if owner is not None and owner[0] is session:
            del self._claims[f.parts]

    def clamp_threads(self, n: int) -> int:
        return max(1, min(int(n), self.max_threads))

    def serve_forever(self, stop: Optional[threading.Event] = None) -> None:
        stop = stop or self._stop
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self._wake_r.fileno(), zmq.POLLIN)
        next_metrics = next_trim = 0.0
        while not stop.is_set():
            if poller.poll(20):
                try:
                    frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:  # the wake-up from stop(): drain it (never spin on a readable fd)
                    try:
                        self._wake_r.recv(64)
                    except OSError:
                        pass
                    continue
                if len(frames) != 2:
                    continue
                self._dispatch(frames[0].bytes, frames[1].bytes, _peer(frames[1]))
            now = time.monotonic()
            for ident, s in list(self.sessions.items()):
                if s.state == "closed":
                    del self.sessions[ident]
                    continue
                try:
                    s.pump()
                except Exception:  # keep serving the others
                    log.exception("session %s failed", s.sid)
                    s.close("failed")
                limit = self.handshake_timeout_s if s.state in ("new", "challenged") else self.idle_timeout_s
                if now - s.last_seen > limit:
                    log.warning("session %s idle for %.0f s: closing it (partial files kept)", s.sid, now - s.last_seen)
                    s.close(f"closed after {now - s.last_seen:.0f} s idle")
            if self.metrics is not None and now >= next_metrics:
                next_metrics = now + 0.25
                self.metrics.update(self)
            if not self.sessions and now >= next_trim:
                next_trim = now + 5.0
                _trim_slot_cache()  # idle: the slot memory a closed session left goes back after 60 s
        self._shutdown()

    def _dispatch(self, ident: bytes, data: bytes, peer: str = "") -> None:
        seq = None
        try:
            msg = protocol.decode(data)
            seq = msg.get("seq")
            s = self.sessions.get(ident)
            if s is None:
                if msg["type"] != "hello":
                    # e.g. the receiver restarted under a running sender: retry (resumes)
                    raise SessionError("no such session (the receiver restarted?); re-run to resume", errors.NETWORK)
                pending = [x for x in self.sessions.values() if x.state in ("new", "challenged")]
                if len(pending) >= self.max_pending:
                    # unauthenticated peers never crowd out others: the oldest pending one goes
                    self._drop(min(pending, key=lambda x: x.last_seen).ident)
                if len(self.sessions) - len(pending) >= self.max_sessions:
                    self.busy_rejections += 1
                    raise SessionError(f"busy: {self.max_sessions} sessions already", errors.NETWORK)
                s = self.sessions[ident] = Session(self, ident, peer)
                self.sessions_total += 1
            reply = s.handle(msg)
        except protocol.ProtocolError as e:
            reply = {"type": "error", "code": errors.USAGE, "message": f"protocol error: {e}"}
            self._drop(ident, reply["message"])
        except SessionError as e:
            reply = {"type": "error", "code": e.code, "message": str(e)}
            if e.code in (errors.FATAL, errors.FILES_FAILED, errors.USAGE):
                self._drop(ident, reply["message"])
        except errors.AutomdtError as e:
            reply = {"type": "error", "code": e.code, "message": e.message}
            self._drop(ident, reply["message"])
        except OSError as e:
            code = errors.FATAL if e.errno in (errno.ENOSPC, errno.EDQUOT) else errors.ERROR
            reply = {"type": "error", "code": code, "message": f"{e.strerror or e}"}
            self._drop(ident, reply["message"])
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError, RecursionError) as e:
            reply = {"type": "error", "code": errors.USAGE, "message": f"bad request: {type(e).__name__}: {str(e)[:200]}"}
            self._drop(ident, reply["message"])
        except Exception as e:  # a bug must not end the daemon: this session alone is dropped
            log.exception("session %s: internal error", ident.hex())
            reply = {"type": "error", "code": errors.ERROR, "message": f"internal error: {type(e).__name__}"}
            self._drop(ident, reply["message"])
        reply["seq"] = seq
        try:
            self.sock.send_multipart([ident, protocol.encode(reply)], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def _drop(self, ident: bytes, why: str = "") -> None:
        s = self.sessions.pop(ident, None)
        if s is not None:
            if why and s.state in ("new", "challenged"):
                log.warning("session %s%s refused: %s", s.sid, f" from {s.peer}" if s.peer else "", why)
            s.close(f"ended: {why}" if why else "dropped")

    def start(self) -> "ReceiverServer":
        """Serve in a background thread (used for local transfers and tests)."""
        self._thread = threading.Thread(target=self.serve_forever, name="automdt-receiver", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout)

    def _shutdown(self) -> None:
        for s in list(self.sessions.values()):
            s.close("closed: the receiver is stopping")
        self.sessions.clear()
        self.sock.close(0)
        self._ctx.term()
        self._wake_r.close()
        self._wake_w.close()
