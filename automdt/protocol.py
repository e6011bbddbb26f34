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
import json
import os
import time
from typing import Any, Dict, Optional

import zmq

from automdt import errors
from automdt.errors import AutomdtError

VERSION = 1
MAX_MESSAGE_BYTES = 16 << 20


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

    def request(self, msg: Dict[str, Any], timeout_s: Optional[float] = None) -> Dict[str, Any]:
        self.seq += 1
        msg = dict(msg, seq=self.seq)
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
            if reply["type"] == "error":
                raise AutomdtError(f"receiver: {reply.get('message', 'error')}", int(reply.get("code", errors.ERROR)))
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
