"""The control channel between sender and receiver: JSON messages over pyzmq DEALER/ROUTER.

Every message is one ZeroMQ frame holding a JSON object with a ``type`` and, for requests, a
``seq`` that the reply echoes. Nothing is ever unpickled; frames over :data:`MAX_MESSAGE_BYTES`
are refused by the socket itself (``zmq.MAXMSGSIZE``). See ``automdt/PROTOCOL.md``.

Authentication (when a shared secret is set) is a mutual HMAC-SHA256 challenge: the sender
proves the secret over both nonces before any name or data is accepted, the receiver proves it
back, and the token every data connection must present is derived from the secret and the
nonces (it never crosses the wire).

Encryption (``--encrypt`` on both ends, which needs the shared secret): the control channel
runs over ZeroMQ CURVE with a server key pair derived from the secret (so a sender that holds
the secret also knows the receiver's public key; its own key pair is ephemeral), and the data
connections speak TLS 1.3 keyed by :func:`data_key` (see transfer_engine/src/tls.h).
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import time
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Dict, List, Optional, Tuple, Type, TypeVar, Union

import zmq

from automdt import errors
from automdt.errors import AutomdtError

VERSION = 1
MAX_MESSAGE_BYTES = 16 << 20
DEFAULT_CHUNK_SIZE = 4 << 20
"""The chunk size an ``open`` without one asks for."""
FSYNC_MODES = ("none", "end", "file", "dir")
"""The ``--fsync`` settings: nothing, one ``syncfs`` at the end (the default), each file, each file
and its directory (:mod:`automdt.durable`)."""
MAX_DIGEST_PATHS = 1000
"""Paths one ``digest`` request may ask for (the rest of a longer list is ignored)."""


class ProtocolError(ValueError):
    """A malformed control message."""


def encode(msg: Dict[str, Any]) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode()


def decode(data: bytes) -> Dict[str, Any]:
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError("message too large")
    try:
        msg = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ProtocolError("not JSON (or nested too deeply)") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise ProtocolError("not a message object with a type")
    return msg


# ---------------------------------------------------------------------------- typed messages
# One small class per message type. ``to_dict`` builds exactly the JSON object the wire carries
# (keys in field order after ``type``; a field marked ``_omit(x)`` is left out while it is ``x``),
# so the bytes are those the untyped code sent; ``from_dict`` reads one leniently, with the
# defaults and conversions the receiver always applied (a value of the wrong type raises
# ``ValueError``/``TypeError``, which the receiver answers as a bad request).

M = TypeVar("M", bound="Message")


def _omit(when: Any = None, default: Any = None) -> Any:
    """A field left out of the wire object while its value is ``when`` (``None`` or ``False``)."""
    return field(default=default, metadata={"omit": when})


def _share(v: Any) -> Optional[List[int]]:
    """A budget share ``[connections, write threads]`` from the wire: two counts of at least one,
    or None (an older receiver, or a malformed value, which the sender then ignores)."""
    if not isinstance(v, (list, tuple)) or len(v) != 2:
        return None
    try:
        out = [int(x) for x in v]
    except (TypeError, ValueError):
        return None
    return out if all(x >= 1 for x in out) else None


@dataclass
class Message:
    TYPE: ClassVar[str] = ""

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"type": self.TYPE}
        for f in fields(self):
            v = getattr(self, f.name)
            if "omit" in f.metadata and v is f.metadata["omit"]:
                continue
            d[f.name] = v
        return d

    def encode(self) -> bytes:
        return encode(self.to_dict())

    @classmethod
    def from_dict(cls: Type[M], d: Dict[str, Any]) -> M:
        return cls()


@dataclass
class Request(Message):
    """A message the sender sends; ``REPLY`` is the type of the receiver's answer."""

    REPLY: ClassVar[Type[Message]] = Message


# ---- replies (receiver -> sender)
@dataclass
class Challenge(Message):
    TYPE = "challenge"
    nonce: str = ""
    auth: bool = False
    """The receiver requires the shared secret."""

    @classmethod
    def from_dict(cls, d):
        return cls(str(d.get("nonce", "")), bool(d.get("auth")))


@dataclass
class Welcome(Message):
    TYPE = "welcome"
    mac: Optional[str] = _omit()
    """With a secret: the receiver's proof of it."""
    token: Optional[str] = _omit()
    """Without a secret (loopback only): the data connections' token, hex."""

    @classmethod
    def from_dict(cls, d):
        return cls(str(d["mac"]) if "mac" in d else None, str(d["token"]) if "token" in d else None)


@dataclass
class Opened(Message):
    TYPE = "opened"
    data_port: int = 0
    chunk_size: int = 0
    memory: int = 0
    max_threads: int = 0
    encrypted: bool = False
    runtime_throttle: bool = False
    """The receiver applies ``poll {write_throttle}`` (throttle schedules)."""
    share: Optional[List[int]] = _omit()
    """``[connections, write threads]``: the session's share of the receiver's budget at open
    (a receiver without a budget omits it)."""

    @classmethod
    def from_dict(cls, d):
        return cls(int(d["data_port"]), int(d["chunk_size"]), int(d.get("memory", 0)), int(d.get("max_threads", 0)),
                   bool(d.get("encrypted")), bool(d.get("runtime_throttle")), _share(d.get("share")))


@dataclass
class Plan(Message):
    TYPE = "plan"
    files: List[Tuple[int, str]] = field(default_factory=list)
    """``(file id, "skip" | "done" | "send" | "fail")`` per manifest entry."""

    @classmethod
    def from_dict(cls, d):
        return cls([(int(fid), str(action)) for fid, action in d["files"]])


@dataclass
class Activated(Message):
    TYPE = "activated"
    files: List[Tuple[int, str, List[List[int]]]] = field(default_factory=list)
    """``(file id, "send" | "done" | "fail", [[offset, length], ...] to send)``."""

    @classmethod
    def from_dict(cls, d):
        return cls([(int(fid), str(action), ranges) for fid, action, ranges in d["files"]])


@dataclass
class Status(Message):
    TYPE = "status"
    stats: Dict[str, Any] = field(default_factory=dict)
    """The receiver engine's counters."""
    done: List[int] = field(default_factory=list)
    """Files renamed into place since the last poll."""
    bad: List[List[int]] = field(default_factory=list)
    """``[file id, offset, length]`` of chunks that failed their checksum (to send again)."""
    errors: List[List[Any]] = field(default_factory=list)
    """``[file id, exit code, message]`` of files that failed on the receiver."""
    fatal: Optional[List[Any]] = None
    """``[exit code, message]``: the transfer cannot go on (a full destination)."""
    now: float = 0.0
    """The receiver's ``time.monotonic()``."""
    share: Optional[List[int]] = _omit()
    """``[connections, write threads]``: the session's share of the receiver's budget now; it
    shrinks when other sessions open and grows when they close."""

    @classmethod
    def from_dict(cls, d):
        return cls(d.get("stats") or {}, d.get("done", []), d.get("bad", []), d.get("errors", []),
                   d.get("fatal") or None, float(d.get("now", 0.0)), _share(d.get("share")))


@dataclass
class MissingRanges(Message):
    TYPE = "missing"
    files: Dict[str, List[List[int]]] = field(default_factory=dict)
    """``{str(file id): [[offset, length], ...]}``: chunks the receiver does not have."""

    @classmethod
    def from_dict(cls, d):
        return cls(d.get("files", {}))


@dataclass
class Ok(Message):
    TYPE = "ok"


@dataclass
class Digests(Message):
    TYPE = "digests"
    digests: Dict[str, Optional[str]] = field(default_factory=dict)
    """Content digest (:mod:`automdt.verify`) per path; None: missing or not a regular file."""
    unreadable: Dict[str, str] = field(default_factory=dict)
    """Paths present but not readable, with why."""

    @classmethod
    def from_dict(cls, d):
        return cls(d.get("digests", {}), d.get("unreadable") or {})


@dataclass
class Closed(Message):
    TYPE = "closed"


@dataclass
class Error(Message):
    TYPE = "error"
    code: int = errors.ERROR
    """The exit code the sender ends with."""
    message: str = ""

    @classmethod
    def from_dict(cls, d):
        return cls(int(d.get("code", errors.ERROR)), str(d.get("message", "error")))


# ---- requests (sender -> receiver)
@dataclass
class Hello(Request):
    TYPE = "hello"
    REPLY = Challenge
    version: Any = VERSION
    nonce: str = ""

    @classmethod
    def from_dict(cls, d):
        return cls(d.get("version"), str(d.get("nonce", "")))


@dataclass
class Auth(Request):
    TYPE = "auth"
    REPLY = Welcome
    mac: Optional[str] = _omit()
    """``HMAC(secret, "client|" + server_nonce + "|" + client_nonce)``; none without a secret."""

    @classmethod
    def from_dict(cls, d):
        return cls(str(d["mac"]) if "mac" in d else None)


@dataclass
class Open(Request):
    TYPE = "open"
    REPLY = Opened
    subdir: Any = ""
    """Destination subdirectory under the receiver's root (checked by :func:`automdt.paths.check_relpath`)."""
    chunk_size: int = DEFAULT_CHUNK_SIZE
    memory: Optional[int] = None
    """Receiver staging buffer, bytes (None: the receiver's maximum)."""
    write_threads: int = 1
    checksum: bool = False
    fsync: str = "none"
    write_throttle: Tuple[float, float] = (0, 0)
    """``(thread_bps, total_bps)`` of the write stage, 0 = unlimited (read as whole numbers)."""
    dry_run: bool = False
    encrypt: bool = False
    scratch: bool = _omit(False, False)
    """The subdirectory is ``explore``'s scratch: emptied on open, removed on close."""
    rcvbuf: Optional[int] = _omit()
    """``SO_RCVBUF`` of the data connections (None: the kernel's)."""

    @classmethod
    def from_dict(cls, d):
        wt = d.get("write_throttle") or [0, 0]
        return cls(subdir=d.get("subdir") or "", chunk_size=int(d.get("chunk_size", DEFAULT_CHUNK_SIZE)),
                   memory=int(d["memory"]) if "memory" in d else None,
                   write_threads=int(d.get("write_threads", 1)), checksum=bool(d.get("checksum", False)),
                   fsync=d.get("fsync", "none") if d.get("fsync") in FSYNC_MODES else "none",
                   write_throttle=(int(wt[0]), int(wt[1])), dry_run=bool(d.get("dry_run", False)),
                   encrypt=d.get("encrypt") is True, scratch=d.get("scratch") is True,
                   rcvbuf=int(d["rcvbuf"]) if "rcvbuf" in d else None)


@dataclass
class ManifestEntry:
    """One file of a ``manifest``: its relative path and what identifies its version."""

    id: int
    path: str
    size: int
    mtime_ns: int
    mode: int = 0o644
    source_id: str = ""
    """``dev:inode`` of the source (a replaced file is a new version)."""
    digest: Optional[str] = None
    """Content digest (``--checksum``)."""

    def to_dict(self) -> Dict[str, Any]:
        d = {"id": self.id, "path": self.path, "size": self.size, "mtime_ns": self.mtime_ns, "mode": self.mode,
             "source_id": self.source_id}
        if self.digest is not None:
            d["digest"] = self.digest
        return d

    @classmethod
    def from_dict(cls, e: Dict[str, Any]) -> "ManifestEntry":
        """Raises ``KeyError``, ``TypeError`` or ``ValueError`` for a malformed entry (the path
        is not checked here: :func:`automdt.paths.check_relpath` does that)."""
        digest = e.get("digest")
        return cls(int(e["id"]), e["path"], int(e["size"]), int(e["mtime_ns"]), int(e.get("mode", 0o644)),
                   str(e.get("source_id", ""))[:64], digest if isinstance(digest, str) else None)


@dataclass
class Manifest(Request):
    TYPE = "manifest"
    REPLY = Plan
    files: List[Any] = field(default_factory=list)
    """:class:`ManifestEntry` objects (wire entries when decoded: the receiver reads them one by one
    with :meth:`ManifestEntry.from_dict` as it plans, so a malformed one stops the plan there)."""
    dirs: List[Any] = field(default_factory=list)
    """Directories to create, parents first."""

    def to_dict(self) -> Dict[str, Any]:
        return {"type": self.TYPE, "files": [e.to_dict() if isinstance(e, ManifestEntry) else e for e in self.files],
                "dirs": self.dirs}

    @classmethod
    def from_dict(cls, d):
        return cls(d.get("files", []), d.get("dirs", []))


def _ids(d: Dict[str, Any]) -> List[int]:
    return [int(x) for x in d.get("ids", [])]


@dataclass
class _FilesRequest(Request):
    """A request about some files of the plan."""

    ids: List[int] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d):
        return cls(_ids(d))


@dataclass
class Activate(_FilesRequest):
    """Open these files' partials (resuming) and register them with the engine."""

    TYPE = "activate"
    REPLY = Activated


@dataclass
class Poll(Request):
    TYPE = "poll"
    REPLY = Status
    write_threads: Optional[int] = _omit()
    """A new write-thread count (sent when it changes)."""
    write_throttle: Optional[Tuple[int, int]] = _omit()
    """New write limits ``(thread_bps, total_bps)`` (a throttle schedule's entry became due)."""
    backlog: Optional[bool] = _omit()
    """Whether data waits to be sent now (chunks read and not yet taken by a network thread:
    the path, not the source, holds the transfer back); sent when it changes. A receiver with
    ``--fair-share`` shares its rate evenly among the sessions with a backlog."""

    @classmethod
    def from_dict(cls, d):
        wt = d.get("write_threads")
        wl = d.get("write_throttle")
        if wl is not None:
            t, total = (int(x) for x in wl)
            wl = (t, total)
        backlog = d.get("backlog")
        return cls(int(wt) if wt is not None else None, wl, bool(backlog) if backlog is not None else None)


@dataclass
class Missing(_FilesRequest):
    """Which chunks of these active files are missing (lost with a broken connection)?"""

    TYPE = "missing"
    REPLY = MissingRanges


@dataclass
class Fail(Request):
    TYPE = "fail"
    REPLY = Ok
    ids: List[int] = field(default_factory=list)
    discard: bool = _omit(False, False)
    """The source is gone or unreadable: remove the partials too (else they stay for a later run)."""

    @classmethod
    def from_dict(cls, d):
        return cls(_ids(d), d.get("discard") is True)


@dataclass
class Digest(Request):
    TYPE = "digest"
    REPLY = Digests
    paths: List[Any] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d):
        return cls(d.get("paths", [])[:MAX_DIGEST_PATHS])


@dataclass
class Close(Request):
    TYPE = "close"
    REPLY = Closed


REQUESTS: Dict[str, Type[Request]] = {c.TYPE: c for c in (Hello, Auth, Open, Manifest, Activate, Poll, Missing,
                                                            Fail, Digest, Close)}
"""Request classes by ``type``."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, or ``localhost``) is on this machine's loopback."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def nonce() -> str:
    return os.urandom(32).hex()


def mac(secret: bytes, label: str, *parts: str) -> str:
    """HMAC-SHA256 of ``label|part|part...`` under ``secret``, hex."""
    return hmac.new(secret, "|".join((label,) + parts).encode(), hashlib.sha256).hexdigest()


def data_token(secret: Optional[bytes], server_nonce: str, client_nonce: str, fallback_hex: str = "") -> bytes:
    """The 32-byte token data connections present: derived from the secret when there is one."""
    if secret:
        return hmac.new(secret, f"data|{server_nonce}|{client_nonce}".encode(), hashlib.sha256).digest()
    return bytes.fromhex(fallback_hex)


def data_key(secret: bytes, server_nonce: str, client_nonce: str) -> bytes:
    """The session's 32-byte TLS key for the data connections (distinct from the token)."""
    return hmac.new(secret, f"tls|{server_nonce}|{client_nonce}".encode(), hashlib.sha256).digest()


def curve_server_keys(secret: bytes) -> "tuple[bytes, bytes]":
    """The receiver's CURVE (public, secret) key pair, Z85, derived from the shared secret."""
    from zmq.utils import z85

    sk = z85.encode(hmac.new(secret, b"curve-server", hashlib.sha256).digest())
    return zmq.curve_public(sk), sk


def read_secret(path: str) -> bytes:
    """Read a shared-secret file (surrounding whitespace ignored; must not be empty).

    Refused when others may read or anyone but its owner may change it (any ``o`` bit, or
    ``g+w``; mode 600, or 640 for a service group, are fine), as ssh and PostgreSQL refuse keys.
    """
    import stat

    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise AutomdtError(f"{path}: secret file is not a regular file", errors.USAGE)
            secret = f.read().strip()
    except FileNotFoundError:
        raise AutomdtError(f"{path}: secret file not found", errors.USAGE) from None
    except PermissionError:
        raise AutomdtError(f"{path}: secret file not readable", errors.USAGE) from None
    except IsADirectoryError:
        raise AutomdtError(f"{path}: secret file is a directory", errors.USAGE) from None
    except OSError as e:
        raise AutomdtError(f"{path}: secret file: {e.strerror}", errors.USAGE) from None
    if st.st_mode & 0o027:
        raise AutomdtError(f"{path}: secret file is open to others (mode {stat.S_IMODE(st.st_mode):04o}); "
                           f"chmod 600 {path} (or 640 for a group)", errors.USAGE)
    if not secret:
        raise AutomdtError(f"{path}: secret file is empty", errors.USAGE)
    return secret


def probe_mechanism(host: str, port: int, timeout_s: float) -> Optional[str]:
    """Connect to a control port and read the ZMTP 3 greeting's security mechanism (``"NULL"``:
    plain, ``"CURVE"``: ``--encrypt``) without starting a session; ``None`` if the peer sent no
    greeting in time. Raises ``OSError`` when the connection fails (e.g. refused).

    A plain TCP connection, because a ZeroMQ socket retries a refused connection silently and a
    mechanism mismatch shows only as a dropped connection."""
    import socket

    sig = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03"  # signature + major version 3: the peer then sends its greeting
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.settimeout(timeout_s)
        s.sendall(sig)
        buf = b""
        try:
            while len(buf) < 64:
                d = s.recv(64 - len(buf))
                if not d:
                    break
                buf += d
        except (TimeoutError, ConnectionResetError):
            pass
    if len(buf) < 32 or buf[0] != 0xFF or buf[9] != 0x7F:
        return None
    return buf[12:32].rstrip(b"\0").decode("ascii", "replace")


class HandshakeFailed(AutomdtError):
    """The control channel's ZeroMQ handshake failed: the two ends' security mechanisms differ
    (one uses --encrypt, the other not: ``mismatch``), or the CURVE keys (the secret) differ.
    Retrying cannot help (exit 7)."""

    def __init__(self, message: str, mismatch: bool):
        super().__init__(message, errors.FATAL)
        self.mismatch = mismatch


_HANDSHAKE_FAILED = (getattr(zmq, "EVENT_HANDSHAKE_FAILED_PROTOCOL", 0), getattr(zmq, "EVENT_HANDSHAKE_FAILED_NO_DETAIL", 0),
                     getattr(zmq, "EVENT_HANDSHAKE_FAILED_AUTH", 0))
_MECHANISM_MISMATCH = getattr(zmq, "PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH", 0x11000002)


class ControlClient:
    """The sender's end: request/reply over a DEALER socket with timeouts.

    A reply is matched to its request by ``seq``; a late reply to an abandoned request is
    dropped. A request that gets no reply within ``timeout_s`` raises :class:`AutomdtError`
    with the network exit code; a failed ZeroMQ handshake (seen on a socket monitor) raises
    :class:`HandshakeFailed` at once.
    """

    def __init__(self, ctx: zmq.Context, host: str, port: int, timeout_s: float = 30.0,
                 curve_secret: Optional[bytes] = None):
        self.endpoint = f"tcp://{host}:{port}" if ":" not in host else f"tcp://[{host}]:{port}"
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        if curve_secret is not None:  # encrypted control channel: the receiver's key from the secret
            pub, sec = zmq.curve_keypair()
            self.sock.curve_serverkey = curve_server_keys(curve_secret)[0]
            self.sock.curve_publickey, self.sock.curve_secretkey = pub, sec
        if ":" in host:
            self.sock.setsockopt(zmq.IPV6, 1)
        self.monitor = None
        events = 0
        for ev in _HANDSHAKE_FAILED:
            events |= ev
        if events:
            self.monitor = self.sock.get_monitor_socket(events)
        self.sock.connect(self.endpoint)
        self.timeout_s = timeout_s
        self.seq = 0

    def _handshake_event(self) -> None:
        from zmq.utils.monitor import recv_monitor_message

        failed = mismatch = False
        deadline = None
        while self.monitor is not None:
            if not self.monitor.poll(0 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))):
                break
            ev = recv_monitor_message(self.monitor)
            if ev["event"] and ev["event"] in _HANDSHAKE_FAILED:
                failed = True
                mismatch = mismatch or int(ev.get("value") or 0) == _MECHANISM_MISMATCH
                if mismatch:
                    break
                # the events of one failure may come in either order (and the socket retries):
                # look a little longer for the one that names a mechanism mismatch
                deadline = deadline or time.monotonic() + 0.5
        if failed:
            why = "the --encrypt setting differs between the two ends" if mismatch else \
                "the secret differs between the two ends"
            raise HandshakeFailed(f"receiver {self.endpoint[6:]}: control-channel handshake failed: {why}", mismatch)

    def call(self, req: Request, timeout_s: Optional[float] = None) -> Any:
        """Send a typed request; return its typed reply (``req.REPLY``)."""
        return req.REPLY.from_dict(self.request(req, timeout_s))

    def request(self, msg: Union[Message, Dict[str, Any]], timeout_s: Optional[float] = None) -> Dict[str, Any]:
        """Send ``msg`` (a :class:`Message` or its wire object); return the reply's wire object."""
        self.seq += 1
        msg = dict(msg.to_dict() if isinstance(msg, Message) else msg, seq=self.seq)
        self.sock.send(encode(msg))
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        if self.monitor is not None:
            poller.register(self.monitor, zmq.POLLIN)
        while True:
            left = deadline - time.monotonic()
            ready = dict(poller.poll(int(left * 1000) + 1)) if left > 0 else {}
            if self.monitor is not None and self.monitor in ready:
                self._handshake_event()
            if self.sock not in ready:
                if time.monotonic() >= deadline:
                    raise AutomdtError(
                        f"receiver {self.endpoint[6:]} did not answer {msg['type']!r} within "
                        f"{self.timeout_s if timeout_s is None else timeout_s:.0f} s", errors.NETWORK)
                continue
            reply = decode(self.sock.recv())
            if reply.get("seq") != self.seq:
                continue
            if reply["type"] == Error.TYPE:
                err = Error.from_dict(reply)
                raise AutomdtError(f"receiver: {err.message}", err.code)
            return reply

    def close(self) -> None:
        self.stop_monitor()
        self.sock.close(linger=0)

    def stop_monitor(self) -> None:
        """The handshake is done: no more need to watch it."""
        if self.monitor is not None:
            try:
                self.sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self.monitor.close(linger=0)
            self.monitor = None
