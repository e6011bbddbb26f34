"""A chaos TCP proxy for AutoMDT's data connections (threads, loopback only, bounded loops).

The proxy sits between the sender's network threads and the receiver's data port (through
``TransferOptions(data_endpoint_hook=proxy.hook)``) and applies a :class:`Plan` to the
sender -> receiver direction of each connection, chosen per connection by its accept index:

- ``pass``: forward unchanged;
- ``flip``: XOR byte ``at`` of the stream (0 = first byte of the hello) with ``xor``;
- ``truncate``: forward ``at`` bytes, then close both sides cleanly (FIN);
- ``reset``: forward ``at`` bytes, then reset both sides (``SO_LINGER`` 0: RST);
- ``stall``: forward ``at`` bytes, then stop reading and forwarding for ``stall_s`` seconds
  (``None``: until the proxy closes), then forward the rest;
- ``frames``: frame-aware corruption (``transfer_engine/PROTOCOL.md``): XOR the byte at
  ``frame_byte`` of the payload (or of the 32-byte header with ``target="header"``, or
  rewrite the header's fields with ``rewrite``) of every frame whose index on this
  connection is in ``frames`` (``None``: every frame).

Everything is bounded: every blocking call has a timeout, and :meth:`ChaosProxy.close`
stops and joins every thread.
"""
from __future__ import annotations

import select
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Union

HELLO_LEN = 40
HDR = struct.Struct("<IIQIIQ")  # magic, file_id, offset, length, flags, hash
HDR_LEN = HDR.size


@dataclass
class Plan:
    kind: str = "pass"
    at: int = 0
    xor: int = 0xFF
    stall_s: Optional[float] = None
    frames: Optional[Sequence[int]] = None
    frame_byte: int = 0
    target: str = "payload"
    limit: Optional[int] = None
    """Fire on at most this many connections (whichever get there first); None: every one."""
    rewrite: Optional[Callable[[int, tuple], Optional[tuple]]] = None
    """``target="header"``: (frame index, (magic, file_id, offset, length, flags, hash)) -> new fields."""


PASS = Plan()


@dataclass
class ConnRecord:
    index: int
    c2s_bytes: int = 0
    s2c_bytes: int = 0
    fired: bool = False
    """The plan's fault happened on this connection."""
    frames_seen: int = 0
    frames_corrupted: int = 0
    closed: bool = False


class _FrameTracker:
    """Follows hello and frame boundaries of one sender -> receiver stream and applies a
    ``frames`` plan. A frame header is held back until complete, so it can be rewritten whole."""

    def __init__(self, plan: Plan, rec: ConnRecord):
        self.plan = plan
        self.rec = rec
        self.hello_left = HELLO_LEN
        self.hdr = bytearray()
        self.payload_left = 0
        self.payload_pos = 0
        self.cur_selected = False

    def _selected(self, idx: int) -> bool:
        return self.plan.frames is None or idx in self.plan.frames

    def process(self, data: bytes) -> bytearray:
        out = bytearray()
        i, n = 0, len(data)
        while i < n:
            if self.hello_left:
                k = min(self.hello_left, n - i)
                out += data[i:i + k]
                self.hello_left -= k
            elif self.payload_left:
                k = min(self.payload_left, n - i)
                piece = bytearray(data[i:i + k])
                fb = self.plan.frame_byte
                if self.cur_selected and self.plan.target == "payload" and self.payload_pos <= fb < self.payload_pos + k:
                    piece[fb - self.payload_pos] ^= self.plan.xor
                    self.rec.frames_corrupted += 1
                    self.rec.fired = True
                out += piece
                self.payload_left -= k
                self.payload_pos += k
            else:
                k = min(HDR_LEN - len(self.hdr), n - i)
                self.hdr += data[i:i + k]
                if len(self.hdr) == HDR_LEN:
                    idx = self.rec.frames_seen
                    self.rec.frames_seen += 1
                    self.cur_selected = self._selected(idx)
                    fields = HDR.unpack(bytes(self.hdr))
                    hdr = bytearray(self.hdr)
                    if self.cur_selected and self.plan.target == "header":
                        if self.plan.rewrite is not None:
                            new = self.plan.rewrite(idx, fields)
                            if new is not None and tuple(new) != fields:
                                hdr = bytearray(HDR.pack(*new))
                                self.rec.fired = True
                                self.rec.frames_corrupted += 1
                        else:
                            hdr[self.plan.frame_byte] ^= self.plan.xor
                            self.rec.fired = True
                            self.rec.frames_corrupted += 1
                    out += hdr
                    self.payload_left = fields[3]  # the sender's true length: stay in step with it
                    self.payload_pos = 0
                    self.hdr = bytearray()
            i += k
        return out


class ChaosProxy:
    """TCP proxy with per-connection fault plans.

    :param plans: plan for connection i (accept order); beyond the list ``default`` applies.
        Or a callable ``index -> Plan``.
    :param target: (host, port) of the receiver's data port; can be set later by :meth:`hook`.
    """

    def __init__(self, plans: Union[Sequence[Plan], Callable[[int], Plan]] = (), default: Plan = PASS,
                 target: Optional[tuple] = None):
        self.plans = plans
        self.default = default
        self.target = target
        self.records: List[ConnRecord] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._fires: Dict[int, int] = {}
        self._socks: List[socket.socket] = []
        self._threads: List[threading.Thread] = []
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.lsock.settimeout(0.1)
        self.port = self.lsock.getsockname()[1]
        t = threading.Thread(target=self._accept_loop, name="chaos-accept", daemon=True)
        t.start()
        self._threads.append(t)

    # -- wiring
    def hook(self, host: str, port: int):
        """``TransferOptions.data_endpoint_hook``: route the data connections through the proxy."""
        self.target = (host, port)
        return "127.0.0.1", self.port

    def plan_for(self, i: int) -> Plan:
        if callable(self.plans):
            return self.plans(i)
        return self.plans[i] if i < len(self.plans) else self.default

    # -- lifecycle
    def close(self) -> None:
        self._stop.set()
        with self._lock:
            socks = list(self._socks)
        for s in socks + [self.lsock]:
            try:
                s.close()
            except OSError:
                pass
        for t in list(self._threads):
            t.join(5)

    def __enter__(self) -> "ChaosProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def fired(self) -> int:
        return sum(1 for r in self.records if r.fired)

    # -- internals
    def _may_fire(self, plan: Plan) -> bool:
        if plan.limit is None:
            return True
        with self._lock:
            n = self._fires.get(id(plan), 0)
            if n >= plan.limit:
                return False
            self._fires[id(plan)] = n + 1
            return True

    def _track(self, s: socket.socket) -> None:
        with self._lock:
            self._socks.append(s)

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                c, _ = self.lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            if self.target is None:
                c.close()
                continue
            try:
                u = socket.create_connection(self.target, timeout=2)
            except OSError:
                c.close()
                continue
            self._track(c)
            self._track(u)
            with self._lock:
                rec = ConnRecord(len(self.records))
                self.records.append(rec)
            plan = self.plan_for(rec.index)
            for fn, name in ((self._c2s, "c2s"), (self._s2c, "s2c")):
                t = threading.Thread(target=fn, args=(c, u, plan, rec), name=f"chaos-{name}-{rec.index}", daemon=True)
                t.start()
                self._threads.append(t)

    def _send_all(self, sock: socket.socket, data) -> bool:
        view = memoryview(data)
        while view and not self._stop.is_set():
            try:
                _, w, _ = select.select([], [sock], [], 0.1)
            except (OSError, ValueError):
                return False
            if not w:
                continue
            try:
                n = sock.send(view)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return False
            view = view[n:]
        return not view

    @staticmethod
    def _close_pair(c: socket.socket, u: socket.socket, rst: bool) -> None:
        for s in (c, u):
            try:
                if rst:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                else:
                    s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass

    def _recv(self, sock: socket.socket) -> Optional[bytes]:
        """Next data from sock: bytes, b"" on EOF/error, None on timeout or stop."""
        try:
            r, _, _ = select.select([sock], [], [], 0.1)
        except (OSError, ValueError):
            return b""
        if not r:
            return None
        try:
            return sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return b""

    def _c2s(self, c: socket.socket, u: socket.socket, plan: Plan, rec: ConnRecord) -> None:
        tracker = _FrameTracker(plan, rec) if plan.kind == "frames" else None
        pos = 0
        try:
            while not self._stop.is_set():
                data = self._recv(c)
                if data is None:
                    continue
                if not data:
                    try:
                        u.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    return
                buf = bytearray(data)
                if tracker is not None:
                    # (the tracker may hold back an incomplete header)
                    buf = tracker.process(buf)
                elif plan.kind == "flip" and not rec.fired and pos <= plan.at < pos + len(buf):
                    if self._may_fire(plan):
                        buf[plan.at - pos] ^= plan.xor
                        rec.fired = True
                elif (plan.kind in ("truncate", "reset", "stall") and not rec.fired and pos + len(buf) > plan.at
                      and self._may_fire(plan)):
                    keep = plan.at - pos
                    if keep and not self._send_all(u, buf[:keep]):
                        self._close_pair(c, u, rst=True)
                        return
                    rec.c2s_bytes += keep
                    pos += keep
                    rec.fired = True
                    if plan.kind != "stall":
                        time.sleep(0.05)  # let the kept bytes reach the receiver first
                        self._close_pair(c, u, rst=plan.kind == "reset")
                        rec.closed = True
                        return
                    until = None if plan.stall_s is None else time.monotonic() + plan.stall_s
                    while not self._stop.is_set() and (until is None or time.monotonic() < until):
                        time.sleep(0.05)
                    buf = buf[keep:]
                if not self._send_all(u, buf):
                    # the receiver closed or reset its side: so does the proxy, towards the sender
                    self._close_pair(c, u, rst=True)
                    return
                rec.c2s_bytes += len(buf)
                pos += len(buf)
        finally:
            rec.closed = True

    def _s2c(self, c: socket.socket, u: socket.socket, plan: Plan, rec: ConnRecord) -> None:
        while not self._stop.is_set():
            data = self._recv(u)
            if data is None:
                if rec.closed and c.fileno() < 0:
                    return
                continue
            if not data:
                try:
                    c.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            if not self._send_all(c, data):
                return
            rec.s2c_bytes += len(data)


def frame_payload_offset(frame_index: int, chunk: int, k: int = 0) -> int:
    """Stream offset of payload byte k of frame i when every frame carries a full chunk."""
    return HELLO_LEN + frame_index * (HDR_LEN + chunk) + HDR_LEN + k
