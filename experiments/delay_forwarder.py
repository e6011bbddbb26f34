"""Userspace TCP delay forwarder: adds a round-trip delay (and optionally a rate limit) between
two endpoints, for machines whose kernel has ``tc`` tbf/htb but no ``netem``.

    DelayForwarder(listen=("127.0.0.1", 0), target=("127.0.0.1", 5000), delay_s=0.020)

accepts TCP connections on ``listen``, opens one connection to ``target`` for each, and forwards
bytes both ways. Every piece of data read from one side is held for ``delay_s / 2`` before it is
written to the other side, so a request/response exchange through the forwarder takes ``delay_s``
longer: the round-trip time grows by ``delay_s``.

Window (what makes the delay limit throughput). The forwarder terminates TCP on both sides (it is
a split proxy), so the endpoints' own windows and socket buffers do not span the emulated path.
Instead each direction of each connection carries at most ``window`` bytes "in flight": a byte
counts from the moment the forwarder reads it until ``delay_s / 2`` after it was written out (the
emulated ACK travelling back), i.e. for one emulated RTT. When ``window`` bytes are in flight the
forwarder stops reading that side (``pause_reading``), the kernel buffers fill and the sender
blocks, exactly like a sender whose window is full. One connection therefore moves at most
``window / delay_s`` bytes per second, N connections ``N * window / delay_s``: the bandwidth-delay
product of a real path with a window cap. A read never takes more than the room left in the
window, so the cap is exact. Memory is bounded by ``window`` plus the outgoing transport's
write-buffer high-water mark (256 KiB) per direction and connection.

Rate (``rate_bps``, bytes per second, the project's convention for ``*_bps``): a link shared by
all connections in each direction; a chunk is serialised at ``rate_bps`` after the chunks before
it, then propagates for ``delay_s / 2``.

Implementation: asyncio protocols in one background thread (``start()`` / ``stop()`` or a
``with`` block), or in the foreground from the command line::

    python -m automdt.experiments.delay_forwarder --listen 127.0.0.1:0 --target 127.0.0.1:5000 --delay-ms 20

AutoMDT's control channel (pyzmq) and its data connections are separate TCP connections; to run a
whole transfer through forwarders, forward both the control port given by the user and the data
port announced by the receiver. ``LoopbackPeer``, ``ping_rtt`` and ``measure_throughput`` are the
small in-process echo/sink server, ping-pong and N-stream sender used by the tests and by the
Rao et al. RTT sweep (``automdt.experiments.rao``).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import signal
import socket
import sys
import threading
import time
from typing import Deque, Dict, List, Optional, Tuple

from automdt.units import parse_hostport, parse_size

Address = Tuple[str, int]

DEFAULT_WINDOW = 4 * 1024 * 1024     # bytes in flight per connection and direction
_WRITE_HIGH = 256 * 1024             # outgoing transport buffer high-water mark
_READ_MAX = 256 * 1024               # largest single socket read
_START_TIMEOUT_S = 5.0
_STOP_TIMEOUT_S = 5.0
_CONNECT_TIMEOUT_S = 5.0


class _Side(asyncio.BufferedProtocol):
    """One socket of a forwarded connection: ``which`` is ``"c"`` (client) or ``"t"`` (target).

    Reads go into a buffer no larger than the room left in the direction's window
    (:class:`asyncio.BufferedProtocol`), so that at most ``window`` bytes are ever in flight (a
    plain protocol reads up to 256 KiB at a time and would overshoot the window by one read)."""

    def __init__(self, conn: "_Connection", which: str):
        self.conn = conn
        self.which = which
        self.transport: Optional[asyncio.Transport] = None
        self._buf = bytearray(_READ_MAX)

    def connection_made(self, transport):  # noqa: D401 - asyncio callback
        self.transport = transport
        transport.set_write_buffer_limits(high=_WRITE_HIGH)
        self.conn.side_made(self)

    def get_buffer(self, sizehint):
        room = self.conn.fwd.window - self.conn.pipe_from(self.which).held
        return memoryview(self._buf)[:max(1, min(_READ_MAX, room))]

    def buffer_updated(self, nbytes):
        self.conn.pipe_from(self.which).push(bytes(self._buf[:nbytes]))

    def eof_received(self):
        self.conn.pipe_from(self.which).push(None)
        return True  # keep the socket half-open: the other direction may still be sending

    def connection_lost(self, exc):
        self.conn.side_lost(self, exc)

    def pause_writing(self):
        self.conn.pipe_to(self.which).dst_blocked = True

    def resume_writing(self):
        pipe = self.conn.pipe_to(self.which)
        pipe.dst_blocked = False
        pipe.flush()


class _Pipe:
    """One direction of one connection: source side -> delay queue -> destination side."""

    def __init__(self, conn: "_Connection", direction: str):
        self.conn = conn
        self.fwd = conn.fwd
        self.direction = direction          # "up" (client -> target) or "down"
        self.src: Optional[_Side] = None
        self.dst: Optional[_Side] = None
        self.queue: Deque[Tuple[float, Optional[bytes]]] = collections.deque()
        self.held = 0                       # bytes in flight (read, not yet "acknowledged")
        self.reading_paused = False
        self.dst_blocked = False
        self.timer: Optional[asyncio.TimerHandle] = None
        self.last_release = 0.0
        self.eof_queued = False
        self.eof_sent = False

    # -- input -------------------------------------------------------------------------
    def push(self, data: Optional[bytes]) -> None:
        if self.eof_queued:
            return
        loop = self.fwd._loop
        now = loop.time()
        depart = now
        if data is not None and self.fwd.rate_bps:
            link = self.fwd._link_free
            depart = max(now, link[self.direction]) + len(data) / self.fwd.rate_bps
            link[self.direction] = depart
        release = max(depart + self.fwd.half_delay, self.last_release)
        self.last_release = release
        self.queue.append((release, data))
        if data is None:
            self.eof_queued = True
        else:
            self.held += len(data)
            self.fwd._count(self.direction, 0, len(data))
            if self.held >= self.fwd.window and not self.reading_paused and self.src is not None:
                self.src.transport.pause_reading()
                self.reading_paused = True
        self.flush()

    # -- output ------------------------------------------------------------------------
    def flush(self) -> None:
        if self.dst is None or self.dst.transport is None or self.conn.closed:
            return
        loop = self.fwd._loop
        now = loop.time()
        tr = self.dst.transport
        while self.queue and not self.dst_blocked:
            release, data = self.queue[0]
            if release > now:
                if self.timer is None:
                    self.timer = loop.call_at(release, self._on_timer)
                return
            self.queue.popleft()
            if data is None:
                if tr.can_write_eof() and not tr.is_closing():
                    tr.write_eof()
                self.eof_sent = True
                self.conn.check_done()
                return
            tr.write(data)
            self.fwd._count(self.direction, 1, len(data))
            # The emulated ACK of these bytes reaches the sender half an RTT after delivery.
            loop.call_at(now + self.fwd.half_delay, self._credit, len(data))

    def _on_timer(self) -> None:
        self.timer = None
        self.flush()

    def _credit(self, n: int) -> None:
        self.held -= n
        if self.reading_paused and self.held < self.fwd.window and not self.conn.closed:
            self.reading_paused = False
            if self.src is not None and self.src.transport is not None:
                self.src.transport.resume_reading()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.queue.clear()


class _Connection:
    """A client connection and its connection to the target."""

    def __init__(self, fwd: "DelayForwarder"):
        self.fwd = fwd
        self.up = _Pipe(self, "up")
        self.down = _Pipe(self, "down")
        self.client: Optional[_Side] = None
        self.target: Optional[_Side] = None
        self.closed = False
        self.connect_task: Optional[asyncio.Task] = None

    def pipe_from(self, which: str) -> _Pipe:
        return self.up if which == "c" else self.down

    def pipe_to(self, which: str) -> _Pipe:
        return self.down if which == "c" else self.up

    def side_made(self, side: _Side) -> None:
        if side.which == "c":
            self.client = side
            self.up.src = side
            self.down.dst = side
            if self.fwd._closing:
                side.transport.abort()
                return
            self.fwd._conns.add(self)
            self.fwd._count("accepted", 0, 1)
            side.transport.pause_reading()       # until the target answers
            self.connect_task = self.fwd._loop.create_task(self._connect())
        else:
            self.target = side
            self.up.dst = side
            self.down.src = side

    async def _connect(self) -> None:
        host, port = self.fwd.target
        try:
            await asyncio.wait_for(
                self.fwd._loop.create_connection(lambda: _Side(self, "t"), host, port), _CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            self.fwd._count("failed", 0, 1)
            self.close(abort=True)
            return
        if self.closed:                          # the client went away meanwhile
            if self.target is not None and self.target.transport is not None:
                self.target.transport.abort()
            return
        self.client.transport.resume_reading()
        self.up.flush()

    def check_done(self) -> None:
        if self.up.eof_sent and self.down.eof_sent:
            self.close()

    def side_lost(self, side: _Side, exc) -> None:
        if self.closed:
            return
        # A reset, or a side that vanished without a FIN: drop the whole connection.
        self.close(abort=exc is not None or not self.pipe_from(side.which).eof_queued)

    def close(self, abort: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        self.up.cancel()
        self.down.cancel()
        if self.connect_task is not None and not self.connect_task.done():
            self.connect_task.cancel()
        for side in (self.client, self.target):
            if side is not None and side.transport is not None:
                if abort:
                    side.transport.abort()
                else:
                    side.transport.close()       # flushes what was already written
        self.fwd._conns.discard(self)


class DelayForwarder:
    """TCP forwarder adding ``delay_s`` of round-trip time (and an optional shared rate limit).

    :param listen: ``(host, port)`` to accept on; port 0 picks a free port (see :attr:`port`).
    :param target: ``(host, port)`` each accepted connection is forwarded to.
    :param delay_s: added round-trip time; each direction holds data for ``delay_s / 2``.
    :param rate_bps: optional link rate in bytes per second per direction, shared by all
        connections (serialisation before the propagation delay); ``None`` or 0: unlimited.
    :param window: bytes in flight per connection and direction (see the module docstring); one
        connection moves at most ``window / delay_s`` bytes per second.
    """

    def __init__(self, listen: Address, target: Address, delay_s: float, rate_bps: Optional[float] = None,
                 *, window: int = DEFAULT_WINDOW, rcvbuf: int = 0):
        if delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, got {delay_s}")
        if rate_bps is not None and rate_bps < 0:
            raise ValueError(f"rate_bps must be >= 0 (0 or None: unlimited), got {rate_bps}")
        if int(window) < 1:
            raise ValueError(f"window must be at least 1 byte, got {window}")
        self.listen = (str(listen[0]), int(listen[1]))
        self.target = (str(target[0]), int(target[1]))
        self.delay_s = float(delay_s)
        self.half_delay = self.delay_s / 2.0
        self.rate_bps = float(rate_bps) if rate_bps else 0.0
        self.window = int(window)
        self.rcvbuf = int(rcvbuf)
        """``SO_RCVBUF`` of the accepted (client-side) sockets; 0: the kernel's autotuning. A small
        value keeps the client's data in its own send buffer while the window is full, as on a
        real path, instead of megabytes of it in this hop's receive buffer."""
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._server = None
        self._port: Optional[int] = None
        self._conns: set = set()
        self._closing = False
        self._link_free: Dict[str, float] = {"up": 0.0, "down": 0.0}
        self._stats_lock = threading.Lock()
        self._stats = {"accepted": 0, "failed": 0, "up_in": 0, "up_out": 0, "down_in": 0, "down_out": 0}

    # -- life cycle ----------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The port actually listened on (after :meth:`start`)."""
        if self._port is None:
            raise RuntimeError("DelayForwarder is not started")
        return self._port

    @property
    def address(self) -> Address:
        return (self.listen[0], self.port)

    @property
    def stats(self) -> Dict[str, int]:
        """Connections accepted/failed and bytes read (``*_in``) and written (``*_out``) per direction."""
        with self._stats_lock:
            return dict(self._stats)

    def _count(self, direction: str, out: int, n: int) -> None:
        key = direction if direction in ("accepted", "failed") else f"{direction}_{'out' if out else 'in'}"
        with self._stats_lock:
            self._stats[key] += n

    def start(self) -> "DelayForwarder":
        """Listen and forward in a background thread; returns ``self`` once listening."""
        if self._thread is not None:
            raise RuntimeError("DelayForwarder already started")
        ready = threading.Event()
        error: List[BaseException] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, args=(ready, error), daemon=True,
                                        name=f"delay-forwarder:{self.listen[1]}")
        self._thread.start()
        if not ready.wait(_START_TIMEOUT_S):
            self.stop()
            raise RuntimeError("DelayForwarder did not start in time")
        if error:
            self._thread.join(_STOP_TIMEOUT_S)
            self._thread = None
            raise error[0]
        return self

    def _run(self, ready: threading.Event, error: List[BaseException]) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            if self.rcvbuf:
                lsock = socket.socket(socket.AF_INET6 if ":" in self.listen[0] else socket.AF_INET, socket.SOCK_STREAM)
                lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                lsock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)  # inherited by accepted sockets
                lsock.bind(self.listen)
                server = loop.create_server(lambda: _Side(_Connection(self), "c"), sock=lsock, backlog=128)
            else:
                server = loop.create_server(lambda: _Side(_Connection(self), "c"), self.listen[0], self.listen[1],
                                            reuse_address=True, backlog=128)
            self._server = loop.run_until_complete(server)
            self._port = self._server.sockets[0].getsockname()[1]
        except BaseException as exc:  # noqa: BLE001 - handed to the caller of start()
            error.append(exc)
            ready.set()
            loop.close()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            try:
                loop.run_until_complete(asyncio.wait_for(self._server.wait_closed(), 1.0))
            except (asyncio.TimeoutError, RuntimeError):
                pass
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=1.0))
            loop.close()

    def _shutdown(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            conn.close(abort=True)
        self._loop.call_soon(self._loop.stop)   # let the aborts' callbacks run first

    def stop(self) -> None:
        """Close the listener and every forwarded connection; joins the thread (bounded)."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        if thread.is_alive() and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._shutdown)
            except RuntimeError:  # loop closed meanwhile
                pass
        thread.join(_STOP_TIMEOUT_S)
        self._thread = None

    def __enter__(self) -> "DelayForwarder":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        port = self._port if self._port is not None else self.listen[1]
        return (f"DelayForwarder({self.listen[0]}:{port} -> {self.target[0]}:{self.target[1]}, "
                f"delay {self.delay_s * 1e3:g} ms, window {self.window} B"
                + (f", rate {self.rate_bps:g} B/s)" if self.rate_bps else ")"))


# ----------------------------------------------------------------------------------------
# Measurement helpers: an echo/sink peer, a ping-pong and an N-stream sender.
# ----------------------------------------------------------------------------------------
class LoopbackPeer:
    """Small threaded TCP server: a connection's first byte selects echo (``b"E"``) or sink (``b"S"``).

    :attr:`received` is the number of bytes sunk so far (all sink connections).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.host, self._req_port = host, port
        self._sock: Optional[socket.socket] = None
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self._counts: List[List[int]] = []
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        return self._sock.getsockname()[1]

    @property
    def address(self) -> Address:
        return (self.host, self.port)

    @property
    def received(self) -> int:
        with self._lock:
            cells = list(self._counts)
        return sum(c[0] for c in cells)

    def start(self) -> "LoopbackPeer":
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((self.host, self._req_port))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        t = threading.Thread(target=self._accept_loop, daemon=True, name="loopback-peer")
        t.start()
        self._threads.append(t)
        return self

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True, name="loopback-peer-conn")
            t.start()
            with self._lock:
                self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _serve(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.settimeout(0.2)
        cell = [0]
        with self._lock:
            self._counts.append(cell)
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        mode = None
        try:
            while not self._stop.is_set():
                try:
                    n = conn.recv_into(buf)
                except socket.timeout:
                    continue
                if n == 0:
                    break
                data = view[:n]
                if mode is None:
                    mode, data = bytes(data[:1]), data[1:]
                if mode == b"E":
                    if len(data):
                        conn.sendall(data)
                else:
                    cell[0] += len(data)
        except OSError:
            pass
        finally:
            view.release()
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        if self._sock is not None:
            self._sock.close()
        with self._lock:
            threads = list(self._threads)
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> "LoopbackPeer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        b = sock.recv(n - got)
        if not b:
            raise ConnectionError("connection closed during ping")
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def ping_rtt(address: Address, count: int = 10, size: int = 64, timeout_s: float = 5.0) -> List[float]:
    """Round-trip times (seconds) of ``count`` ping-pongs of ``size`` bytes to an echo peer
    (a :class:`LoopbackPeer`, possibly through a forwarder)."""
    out = []
    with socket.create_connection(address, timeout=timeout_s) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(b"E")
        payload = bytes(range(256)) * (size // 256 + 1)
        payload = payload[:size]
        for _ in range(int(count)):
            t0 = time.perf_counter()
            s.sendall(payload)
            if _recv_exact(s, size) != payload:
                raise ConnectionError("echo returned different bytes")
            out.append(time.perf_counter() - t0)
    return out


def measure_throughput(peer: LoopbackPeer, address: Address, streams: int = 4, seconds: float = 1.0,
                       sndbuf: Optional[int] = None, warmup_s: float = 0.2, chunk: int = 1 << 20) -> float:
    """Aggregate bytes/s received by ``peer`` from ``streams`` parallel senders connected to
    ``address`` (the peer itself, or a forwarder in front of it), over ``seconds`` after
    ``warmup_s``. ``sndbuf`` sets ``SO_SNDBUF`` on the sending sockets."""
    if streams < 1 or seconds <= 0:
        raise ValueError("streams must be >= 1 and seconds > 0")
    stop = threading.Event()
    hard_deadline = time.monotonic() + warmup_s + seconds + 10.0
    errors: List[BaseException] = []
    payload = memoryview(bytes(chunk))
    connected = threading.Barrier(streams + 1, timeout=_CONNECT_TIMEOUT_S + 1)

    def send() -> None:
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            if sndbuf:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, int(sndbuf))
            s.settimeout(_CONNECT_TIMEOUT_S)
            s.connect(address)
            s.sendall(b"S")
            s.settimeout(0.2)
        except (OSError, threading.BrokenBarrierError) as exc:
            errors.append(exc)
            connected.abort()
            return
        try:
            connected.wait()
            off = 0
            while not stop.is_set() and time.monotonic() < hard_deadline:
                try:
                    off = (off + s.send(payload[off:])) % chunk
                except socket.timeout:
                    continue
        except (OSError, threading.BrokenBarrierError) as exc:
            if not stop.is_set():
                errors.append(exc)
        finally:
            s.close()

    threads = [threading.Thread(target=send, daemon=True, name=f"sender{i}") for i in range(streams)]
    for t in threads:
        t.start()
    try:
        connected.wait()
        time.sleep(warmup_s)
        c0, t0 = peer.received, time.perf_counter()
        stop.wait(seconds)
        c1, t1 = peer.received, time.perf_counter()
    except threading.BrokenBarrierError:
        c0 = c1 = 0
        t0, t1 = 0.0, 1.0
    finally:
        stop.set()
        for t in threads:
            t.join(_STOP_TIMEOUT_S)
    if errors:
        raise ConnectionError(f"sender failed: {errors[0]!r}")
    return (c1 - c0) / (t1 - t0)


# ----------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------
def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m automdt.experiments.delay_forwarder",
        description="Forward TCP connections from --listen to --target, adding --delay-ms of round-trip time.")
    p.add_argument("--listen", required=True, help="HOST:PORT to accept on (port 0: any free port)")
    p.add_argument("--target", required=True, help="HOST:PORT to forward to")
    p.add_argument("--delay-ms", type=float, required=True, help="added round-trip time in milliseconds")
    p.add_argument("--rate", default=None,
                   help="link rate per direction in bytes/s shared by all connections (e.g. 100M, 1Gi)")
    p.add_argument("--window", default=str(DEFAULT_WINDOW),
                   help="bytes in flight per connection and direction (default 4Mi): throughput per "
                        "connection <= window / delay")
    p.add_argument("--rcvbuf", default="0",
                   help="SO_RCVBUF of the accepted connections (default 0: kernel autotuning); a small value keeps "
                        "the sender's data in its own send buffer while the window is full")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds (default: until ^C)")
    args = p.parse_args(argv)
    try:
        listen = parse_hostport(args.listen)
        target = parse_hostport(args.target)
        rate = parse_size(args.rate, "rate") if args.rate else None
        window = parse_size(args.window, "window")
        fwd = DelayForwarder(listen, target, args.delay_ms / 1e3, rate, window=window,
                             rcvbuf=parse_size(args.rcvbuf, "rcvbuf"))
        fwd.start()
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"delay_forwarder: {exc}", file=sys.stderr)
        return 2
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    print(f"listening on {fwd.listen[0]}:{fwd.port} -> {target[0]}:{target[1]}, "
          f"delay {args.delay_ms:g} ms, window {window} B" + (f", rate {rate} B/s" if rate else ""), flush=True)
    try:
        if args.duration is not None:
            done.wait(max(0.0, args.duration))
        else:
            while not done.wait(1.0):
                pass
    finally:
        fwd.stop()
        s = fwd.stats
        print(f"stopped: {s['accepted']} connections, up {s['up_out']} B, down {s['down_out']} B", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
