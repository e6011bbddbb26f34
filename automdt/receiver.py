"""The destination side: a control server (pyzmq ROUTER) with one session per sender.

``automdt receive`` runs :class:`ReceiverServer` in the foreground; ``automdt transfer SRC DIR``
runs one embedded in the sending process (its engine takes the chunks over the local link:
transfer_engine/PROTOCOL.md, "The local link"). The server authenticates nothing
itself: it routes each sender's messages to its :class:`~automdt.session.Session` (the handshake,
planning and message handlers), bounds how many sessions exist, makes sure one destination file
has one writer at a time (:meth:`ReceiverServer.claim`), pumps every session's engine events and
closes idle sessions. Each session owns one engine :class:`~automdt.transfer_engine.Receiver`
(its own data port) and one :class:`~automdt.partial.PartialFile` per file it writes.
Message flow: ``automdt/PROTOCOL.md``.
"""
from __future__ import annotations

import collections
import errno
import logging
import os
import socket
import sys
import threading
import time
from typing import Any, Dict, NamedTuple, Optional, Tuple

import zmq

from automdt import errors, protocol
from automdt.partial import PartialFile
from automdt.protocol import is_loopback
from automdt.session import HANDSHAKE_STATES, Deferred, Session, SessionError

TOTAL_MEMORY = 4 << 30
"""Staging memory of all sessions of one receiver together (``--total-memory``), bytes."""
TOTAL_THREADS = 256
"""Write threads of all sessions of one receiver together (``--total-threads``)."""
TOTAL_CONNECTIONS = 64
"""Data connections of all sessions of one receiver together (``--total-connections``): the
senders' network threads, one TCP connection each. Twice a sender's default thread bound (32), so
that one or two jobs never feel it and more divide it."""


class Share(NamedTuple):
    """One open session's share of the receiver's budget (:meth:`ReceiverServer.shares`)."""

    memory: int
    """Staging buffer, bytes."""
    threads: int
    """Write threads."""
    connections: int
    """Data connections, that is the sender's network threads (its controller is told in every
    ``status`` reply and keeps its network count within it)."""


__all__ = ["ReceiverServer", "Share", "Session", "SessionError", "is_loopback"]

log = logging.getLogger(__name__)


def _trim_slot_cache() -> None:
    if "automdt.transfer_engine" in sys.modules:  # only once an engine ran (never imports it)
        sys.modules["automdt.transfer_engine"].trim_cache(60.0)


def _peer(frame) -> str:
    """The sender's address as ZeroMQ saw it ("" if unknown)."""
    try:
        return str(frame.get("Peer-Address") or "")
    except (zmq.ZMQError, AttributeError, TypeError, KeyError):
        return ""


def check_root(root: str, writable: bool = True, what: str = "destination root") -> None:
    """Raise :class:`~automdt.errors.AutomdtError` (exit 3) unless ``root`` is an existing
    directory and, with ``writable``, this process can create files in it (a probe file, created and
    removed: :func:`automdt.paths.check_writable`)."""
    from automdt.paths import check_writable

    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        why = "no such directory" if e.errno == errno.ENOENT else "not a directory" if e.errno == errno.ENOTDIR \
            else (e.strerror or str(e)).lower()
        raise errors.AutomdtError(f"{what} {root}: {why}", errors.DIR_NOT_FOUND) from None
    try:
        if writable:
            check_writable(fd)
    except OSError as e:
        import pwd

        try:
            user = pwd.getpwuid(os.geteuid()).pw_name
        except KeyError:
            user = f"uid {os.geteuid()}"
        raise errors.AutomdtError(f"{what} {root}: not writable by {user}: {e.strerror}",
                                  errors.from_oserror(e, errors.DIR_NOT_FOUND)) from None
    finally:
        os.close(fd)


class ReceiverServer:
    """The control server: authenticates senders and runs their sessions.

    :param root: destination root directory (must exist).
    :param host: address to listen on (control and data ports).
    :param port: control port (0 picks a free one; see :attr:`port`).
    :param secret: shared secret; required to listen on a non-loopback address.
    :param max_threads: clamp for every write-thread count a sender or policy asks for.
    :param max_memory: clamp for each session's receiver staging buffer, bytes.
    :param idle_timeout_s: a session silent this long is closed (its partial files stay).
    :param total_memory: staging memory of all sessions together, bytes: each open session may
        hold an equal share (:meth:`shares`), re-divided whenever one opens or closes.
    :param total_threads: write threads of all sessions together, divided the same way (each
        session keeps at least one).
    :param total_connections: data connections of all sessions together, divided the same way.
        Each sender's controller raises its network threads for its own transfer; on a link
        several jobs share, TCP shares it per connection, so one job's extra connections take the
        others' rate, every job adds more and the receiver drowns in connections. The share keeps
        the sum bounded while giving each job the same number.
    :param disk_throttle: ``(thread_bps, total_bps)`` of an emulated destination disk every
        session writes to (``receive --throttle``; tests and benchmarks): each write thread of
        every session at most ``thread_bps``, all sessions' writes together ``total_bps`` on one
        clock (:class:`automdt.transfer_engine.SharedLimit`); a sender's own write throttle
        applies on top. 0: no limit.
    :param fair_share: share the receiving rate evenly among sessions that want more
        (:mod:`automdt.fair_share`; ``receive --no-fair-share`` turns it off).
    """

    def __init__(self, root: str, host: str = "127.0.0.1", port: int = 0, secret: Optional[bytes] = None,
                 max_threads: int = 64, max_memory: int = 1 << 30, idle_timeout_s: float = 60.0,
                 max_files: int = 10_000_000, max_sessions: int = 16, encrypt: bool = False,
                 metrics: Any = None, embedded: bool = False, total_memory: int = TOTAL_MEMORY,
                 total_threads: int = TOTAL_THREADS, total_connections: int = TOTAL_CONNECTIONS,
                 disk_throttle: Tuple[int, int] = (0, 0), fair_share: bool = True):
        check_root(root, writable=False)
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
        self.total_memory = total_memory
        self.total_threads = total_threads
        self.total_connections = total_connections
        self.disk_thread_bps = int(disk_throttle[0])
        """The emulated disk's rate per write thread of every session (0: none)."""
        self.fair_share: Any = None
        """The rate divider of ``--fair-share`` (:class:`automdt.fair_share.FairShare`), or None."""
        if fair_share:
            from automdt.fair_share import FairShare

            self.fair_share = FairShare()
        self.disk: Any = None
        if disk_throttle[1]:
            from automdt.transfer_engine import SharedLimit

            self.disk = SharedLimit(int(disk_throttle[1]))
        """The emulated disk's total rate, one clock for every session's writes (None: none)."""
        self._shared_by = 0
        """Open sessions when the budget was last divided."""
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.dir_cache = max(8, min(256, (soft if soft > 0 else 1024) // 16))
        """Directory descriptors each session keeps open (bounded by the open-files limit)."""
        self.max_pending = 64
        """Sessions still in their handshake; past this the oldest is dropped."""
        self.handshake_timeout_s = 10.0
        self.sessions: Dict[bytes, Session] = {}
        self._claims: Dict[Tuple[str, ...], Tuple[Session, PartialFile]] = {}
        self.auth_failures = 0
        self.sessions_total = 0
        self.busy_rejections = 0
        self.metrics = metrics
        """An :class:`automdt.metrics.ReceiverMetrics` to keep up to date, or None."""
        self.embedded = embedded
        """Inside ``automdt transfer`` for a local destination: its one sender reports every refusal
        itself, so the server logs them at debug level only (a daemon logs them as warnings)."""
        self._listen(port)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        # stop() writes a byte here so that serve_forever's poll returns at once, not on its timeout
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._deferred: "collections.deque[Tuple[bytes, Any]]" = collections.deque()
        """Replies made in a thread (:class:`~automdt.session.Deferred`), sent by the serving loop."""

    def _listen(self, port: int) -> None:
        """The control socket: a ZeroMQ ROUTER bound to ``self.host`` and ``port`` (0: a free one,
        then ``self.port``), a CURVE server when every session must encrypt.

        :raises AutomdtError: exit 2 when the address cannot be bound."""
        host = self.host
        self._ctx = zmq.Context()
        self.sock = self._ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_MESSAGE_BYTES)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        if self.encrypt and self.secret is not None:  # (checked before: encryption needs the secret)
            self.sock.curve_publickey, self.sock.curve_secretkey = protocol.curve_server_keys(self.secret)
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

    def claim(self, session: Session, f: PartialFile) -> None:
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
            other.give_up(of, "taken over by a newer session")
        self._claims[key] = (session, f)

    def unclaim(self, session: Session, f: PartialFile) -> None:
        owner = self._claims.get(f.parts)
        if owner is not None and owner[0] is session:
            del self._claims[f.parts]

    def clamp_threads(self, n: int) -> int:
        return max(1, min(int(n), self.max_threads))

    def shares(self, joining: int = 0) -> Share:
        """Each open session's share of the budget, with ``joining`` more sessions counted (one
        about to open)."""
        n = max(1, sum(1 for s in self.sessions.values() if s.engine is not None) + joining)
        return Share(self.total_memory // n, max(1, self.total_threads // n), max(1, self.total_connections // n))

    def rebalance(self) -> None:
        """Divide the budget again when sessions opened or closed since the last division: every
        open session is held to its new share (a smaller one frees buffer memory as it drains)."""
        open_now = [s for s in self.sessions.values() if s.engine is not None]
        if len(open_now) == self._shared_by:
            return
        self._shared_by = len(open_now)
        share = self.shares()
        for s in open_now:
            s.apply_share(share)

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
            while self._deferred:
                ident, wire = self._deferred.popleft()
                self._send(ident, wire)
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
                limit = self.handshake_timeout_s if s.state in HANDSHAKE_STATES else self.idle_timeout_s
                if now - s.last_seen > limit:
                    log.warning("session %s idle for %.0f s: closing it (partial files kept)", s.sid, now - s.last_seen)
                    s.close(f"closed after {now - s.last_seen:.0f} s idle")
            if self.fair_share is not None:
                self.fair_share.step(self.sessions.values(), now)
            if self.metrics is not None and now >= next_metrics:
                next_metrics = now + 0.25
                self.metrics.update(self)
            if not self.sessions and now >= next_trim:
                next_trim = now + 5.0
                _trim_slot_cache()  # idle: the slot memory a closed session left goes back after 60 s
        self._shutdown()

    def _dispatch(self, ident: bytes, data: bytes, peer: str = "") -> None:
        seq = None
        reply: protocol.Message
        try:
            msg = protocol.decode(data)
            seq = msg.get("seq")
            s = self.sessions.get(ident)
            if s is None:
                if msg["type"] != "hello":
                    # e.g. the receiver restarted under a running sender: retry (resumes)
                    self._refused(ident, peer, f"{msg['type']!r} for no session (the receiver restarted?)")
                    raise SessionError("no such session (the receiver restarted?); re-run to resume", errors.NETWORK)
                pending = [x for x in self.sessions.values() if x.state in HANDSHAKE_STATES]
                if len(pending) >= self.max_pending:
                    # unauthenticated peers never crowd out others: the oldest pending one goes
                    self._drop(min(pending, key=lambda x: x.last_seen).ident,
                               f"{self.max_pending} senders in the handshake at once; the oldest goes")
                if len(self.sessions) - len(pending) >= self.max_sessions:
                    self.busy_rejections += 1
                    self._refused(ident, peer, f"busy: {self.max_sessions} sessions already (the sender retries)")
                    raise SessionError(f"busy: {self.max_sessions} sessions already", errors.NETWORK)
                s = self.sessions[ident] = Session(self, ident, peer)
                self.sessions_total += 1
            reply = s.handle(msg)
            if isinstance(reply, Deferred):
                threading.Thread(target=self._run_deferred, args=(ident, seq, reply), daemon=True,
                                 name=f"automdt-{msg['type']}-{s.sid[:8]}").start()
                return
        except protocol.ProtocolError as e:
            reply = protocol.Error(errors.USAGE, f"protocol error: {e}")
            self._drop(ident, reply.message)
        except SessionError as e:
            reply = protocol.Error(e.code, str(e))
            if e.code in (errors.FATAL, errors.FILES_FAILED, errors.USAGE, errors.DIR_NOT_FOUND):
                self._drop(ident, reply.message)
        except errors.AutomdtError as e:
            reply = protocol.Error(e.code, e.message)
            self._drop(ident, reply.message)
        except OSError as e:
            reply = protocol.Error(errors.from_oserror(e, errors.ERROR), f"{e.strerror or e}")
            self._drop(ident, reply.message)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError, RecursionError) as e:
            reply = protocol.Error(errors.USAGE, f"bad request: {type(e).__name__}: {str(e)[:200]}")
            self._drop(ident, reply.message)
        except Exception as e:  # a bug must not end the daemon: this session alone is dropped
            log.exception("session %s: internal error", ident.hex())
            reply = protocol.Error(errors.ERROR, f"internal error: {type(e).__name__}")
            self._drop(ident, reply.message)
        wire = reply.to_dict()
        wire["seq"] = seq
        self._send(ident, wire)
        self.rebalance()

    def _send(self, ident: bytes, wire: Dict[str, Any]) -> None:
        try:
            self.sock.send_multipart([ident, protocol.encode(wire)], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def _run_deferred(self, ident: bytes, seq: Any, job: Deferred) -> None:
        """Make a deferred reply (in its own thread) and hand it to the serving loop."""
        reply: protocol.Message
        try:
            reply = job.make()
        except SessionError as e:
            reply = protocol.Error(e.code, str(e))
        except Exception as e:  # the reply must come, whatever failed
            log.exception("deferred reply failed")
            reply = protocol.Error(errors.ERROR, f"internal error: {type(e).__name__}")
        wire = reply.to_dict()
        wire["seq"] = seq
        self._deferred.append((ident, wire))
        try:
            self._wake_w.send(b"d")
        except OSError:
            pass

    def _drop(self, ident: bytes, why: str = "") -> None:
        """End a session the receiver refuses (``why``); one that never opened is logged as refused
        here (an open one logs its totals as it closes)."""
        s = self.sessions.pop(ident, None)
        if s is not None:
            if why and s.state != "open":
                self._refused(ident, s.peer, why)
            s.close(f"ended: {why}" if why else "dropped")

    def _refused(self, ident: bytes, peer: str, why: str) -> None:
        """Log a refused sender: every refusal gets one line with its reason (a wrong or missing
        secret, a destination that cannot be written, a full receiver...)."""
        log.log(logging.DEBUG if self.embedded else logging.WARNING, "session %s%s refused: %s", ident.hex(),
                f" from {peer}" if peer else "", why)

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
