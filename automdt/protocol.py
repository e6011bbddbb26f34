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
    """Read a shared-secret file (surrounding whitespace ignored; must not be empty)."""
    try:
        with open(path, "rb") as f:
            secret = f.read().strip()
    except FileNotFoundError:
        raise AutomdtError(f"{path}: secret file not found", errors.USAGE) from None
    except PermissionError:
        raise AutomdtError(f"{path}: secret file not readable", errors.USAGE) from None
    if not secret:
        raise AutomdtError(f"{path}: secret file is empty", errors.USAGE)
    return secret


class ControlClient:
    """The sender's end: request/reply over a DEALER socket with timeouts.

    A reply is matched to its request by ``seq``; a late reply to an abandoned request is
    dropped. A request that gets no reply within ``timeout_s`` raises :class:`AutomdtError`
    with the network exit code.
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
        self.sock.connect(self.endpoint)
        self.timeout_s = timeout_s
        self.seq = 0

    def request(self, msg: Dict[str, Any], timeout_s: Optional[float] = None) -> Dict[str, Any]:
        self.seq += 1
        msg = dict(msg, seq=self.seq)
        self.sock.send(encode(msg))
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000) + 1):
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
        self.sock.close(linger=0)
