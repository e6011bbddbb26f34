"""DelayForwarder: adds the RTT, forwards bytes intact both ways, caps throughput by window/RTT."""
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

import pytest

from automdt.experiments.delay_forwarder import (DelayForwarder, LoopbackPeer, main, measure_throughput,
                                                 ping_rtt)

LOCAL = ("127.0.0.1", 0)


@pytest.fixture
def peer():
    with LoopbackPeer() as p:
        yield p


def test_adds_round_trip_delay(peer):
    base = statistics.median(ping_rtt(peer.address, count=5))
    for delay in (0.02, 0.06):
        with DelayForwarder(LOCAL, peer.address, delay) as fwd:
            rtts = ping_rtt(fwd.address, count=7)
        assert min(rtts) >= 0.95 * delay, (delay, rtts)          # never faster than the delay
        # Within tolerance of delay + base (a shared 2-core machine adds scheduling latency).
        assert statistics.median(rtts) <= delay + base + 0.015, (delay, rtts)


class _ReverseServer:
    """Reads each connection until EOF, then answers the bytes reversed plus b"END" and closes."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(LOCAL)
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    @property
    def address(self):
        return self.sock.getsockname()

    def _loop(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _serve(conn):
        conn.settimeout(10)
        chunks = []
        with conn:
            while True:
                b = conn.recv(1 << 16)
                if not b:
                    break
                chunks.append(b)
            conn.sendall(b"".join(chunks)[::-1] + b"END")

    def close(self):
        self.stop.set()
        self.sock.close()
        self.thread.join(2)


def _exchange(address, payload, out, i):
    with socket.create_connection(address, timeout=10) as s:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)                 # half-close: the answer still has to come back
        got = []
        while True:
            b = s.recv(1 << 16)
            if not b:
                break
            got.append(b)
    out[i] = b"".join(got)


def test_forwards_bytes_intact_both_directions_with_half_close():
    srv = _ReverseServer()
    try:
        # A small window makes the forwarder pause and resume reading many times.
        with DelayForwarder(LOCAL, srv.address, 0.004, window=64 * 1024) as fwd:
            payloads = [os.urandom(n) for n in (1, 300_000, 2_000_000)]
            out = [None] * len(payloads)
            threads = [threading.Thread(target=_exchange, args=(fwd.address, p, out, i))
                       for i, p in enumerate(payloads)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(20)
            stats = fwd.stats
        for p, o in zip(payloads, out):
            assert o == p[::-1] + b"END"
        total = sum(len(p) for p in payloads)
        assert stats["accepted"] == 3 and stats["up_out"] == stats["up_in"] == total
        assert stats["down_out"] == total + 3 * 3
    finally:
        srv.close()


def test_window_caps_throughput_as_rtt_grows(peer):
    window, streams = 256 * 1024, 2
    tput = {}
    for delay in (0.01, 0.04):
        with DelayForwarder(LOCAL, peer.address, delay, window=window) as fwd:
            tput[delay] = measure_throughput(peer, fwd.address, streams, seconds=0.5, sndbuf=window,
                                             warmup_s=0.1 + 2 * delay)
        # Never above streams * window / RTT (one socket read of slack).
        assert tput[delay] <= 1.2 * streams * window / delay, (delay, tput)
    assert tput[0.04] < 0.5 * tput[0.01], tput          # ~4x less at 4x the RTT
    assert tput[0.04] > 0.5 * streams * window / 0.04, tput


def test_rate_limit(peer):
    rate = 4e6
    with DelayForwarder(LOCAL, peer.address, 0.0, rate_bps=rate) as fwd:
        t = measure_throughput(peer, fwd.address, 2, seconds=1.0, warmup_s=0.1)
    # Paced by the link schedule; a loaded machine can stall the loop and then catch up.
    assert 0.65 * rate < t < 1.35 * rate


def test_target_down_closes_client_and_stop_is_clean():
    dead = socket.socket()
    dead.bind(LOCAL)
    addr = dead.getsockname()
    dead.close()                                      # nothing listens there now
    fwd = DelayForwarder(LOCAL, addr, 0.01).start()
    try:
        with socket.create_connection(fwd.address, timeout=5) as s:
            try:
                assert s.recv(10) == b""
            except ConnectionResetError:
                pass
        deadline = time.monotonic() + 5
        while fwd.stats["failed"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert fwd.stats["failed"] == 1
    finally:
        fwd.stop()
    with pytest.raises(OSError):
        socket.create_connection(fwd.address, timeout=1).close()
    fwd.stop()                                        # idempotent


def test_arguments_and_port():
    fwd = DelayForwarder(LOCAL, ("127.0.0.1", 9), 0.01)
    with pytest.raises(RuntimeError):
        fwd.port
    with pytest.raises(ValueError):
        DelayForwarder(LOCAL, ("127.0.0.1", 9), -1)
    with pytest.raises(ValueError):
        DelayForwarder(LOCAL, ("127.0.0.1", 9), 0.01, window=0)
    with fwd:
        assert fwd.port > 0 and "delay 10 ms" in repr(fwd)
    with pytest.raises(OSError):                      # port in use: the error reaches start()
        with LoopbackPeer() as p:
            DelayForwarder((p.host, p.port), ("127.0.0.1", 9), 0.0).start()
    assert main(["--listen", "nonsense", "--target", "127.0.0.1:9", "--delay-ms", "1"]) == 2


def test_command_line(peer):
    proc = subprocess.Popen(
        [sys.executable, "-m", "automdt.experiments.delay_forwarder", "--listen", "127.0.0.1:0",
         "--target", f"127.0.0.1:{peer.port}", "--delay-ms", "30", "--duration", "20"],
        stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on 127.0.0.1:"), line
        port = int(line.split()[2].rsplit(":", 1)[1])
        rtts = ping_rtt(("127.0.0.1", port), count=3)
        assert min(rtts) >= 0.028
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0 and "stopped: 1 connections" in out
