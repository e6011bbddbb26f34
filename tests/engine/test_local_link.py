"""The local link: a Sender hands chunks to a Receiver of the same process (no socket). Bytes,
back-pressure, the journal, header checks, and a receiver closed under a sender that is still
handing over chunks (the fault hook on the link: test_zerocopy.py)."""
from __future__ import annotations

import os
import time

import pytest

from automdt.transfer_engine import _engine

from .conftest import te, wait_for

CHUNK = 256 * 1024
SIZES = [1, CHUNK - 1, CHUNK, 3 * CHUNK + 17, 40 * CHUNK]


def test_local_link_delivers_identical_bytes_without_a_connection(rig):
    r = rig(chunk=CHUNK, memory=4 << 20, threads=(2, 3, 2), sender_kw={"local": True})
    for fid, size in enumerate(SIZES, start=1):
        r.add(fid, size, seed=fid * 5)
    wait_for(lambda: r.rx.stats().connections == 3, what="three sender threads on the link")
    r.wait_done(range(1, len(SIZES) + 1))
    for fid in range(1, len(SIZES) + 1):
        r.assert_identical(fid)
    wait_for(lambda: r.tx.stats().chunks_pending == 0, what="sender drained")
    assert r.tx.local and not r.tx.zerocopy  # the reader's buffer is what goes over
    ts, rs = r.tx.stats(), r.rx.stats()
    assert ts.read.bytes == ts.net.bytes == rs.recv.bytes == rs.write.bytes == sum(SIZES)
    assert rs.chunks_bad == rs.chunks_duplicate == rs.protocol_errors == 0
    assert ts.tcp_segs_out == 0 and rs.connections_rejected == 0
    # a chunk counts as sent when the receiver took it: every one was
    assert ts.chunks_sent == sum((s + CHUNK - 1) // CHUNK for s in SIZES)


def test_local_link_journals_each_chunk_once(rig):
    r = rig(chunk=CHUNK, threads=(2, 2, 2), sender_kw={"local": True})
    r.add(1, 5 * CHUNK + 3, journal=True)
    r.wait_done([1])
    r.assert_identical(1)
    journal = os.path.join(r.tmp, "dst1.journal")
    assert os.path.getsize(journal) == 6 * _engine.JOURNAL_RECORD_LEN


def test_a_full_receiver_buffer_holds_the_sender_threads_back(rig):
    """One receiver slot and a slow writer: the network threads wait (wait time, not busy), the
    receiver never holds more than its cap, and everything arrives."""
    r = rig(chunk=CHUNK, memory=CHUNK, threads=(2, 2, 1),
            sender_kw={"local": True}, receiver_kw={"write_throttle": (0, 8 * CHUNK)})
    r.add(1, 16 * CHUNK)
    peak = 0
    deadline = time.monotonic() + 30
    while 1 not in r.done_ids() and time.monotonic() < deadline:
        peak = max(peak, r.rx.stats().buffer.fill_bytes)
        time.sleep(0.01)
    r.assert_identical(1)
    assert 0 < peak <= CHUNK
    net = r.tx.stats().net
    assert net.wait_s > 0.5 and net.wait_s > 5 * net.busy_s


def test_closing_the_receiver_under_a_waiting_sender_is_safe(rig, engines):
    """Sender threads blocked on a full receiver when the receiver closes: they give up, report
    the closed link, and the sender closes promptly (no use of freed slot memory)."""
    r = rig(chunk=CHUNK, memory=CHUNK, threads=(2, 3, 1),
            sender_kw={"local": True}, receiver_kw={"write_throttle": (0, 2 * CHUNK)})
    r.add(1, 64 * CHUNK)
    wait_for(lambda: r.tx.stats().net.wait_s > 0.2, what="sender threads waiting on the receiver")
    t0 = time.monotonic()
    r.rx.close()
    assert time.monotonic() - t0 < 3.0
    wait_for(lambda: any("local receiver is closed" in str(e[-1]) for e in r.tx_kind("conn_error")),
             what="conn_error for the closed link")
    t0 = time.monotonic()
    r.tx.close()
    assert time.monotonic() - t0 < 5.0
    assert 1 not in r.done_ids()


def test_a_frame_for_an_unknown_file_is_a_protocol_error_and_comes_back(rig):
    """The header is checked as on a connection: a file the receiver does not know is refused."""
    r = rig(chunk=CHUNK, threads=(1, 1, 1), sender_kw={"local": True})
    r.add(1, 2 * CHUNK, send=False)
    src = os.path.join(r.tmp, "src1")
    r.tx.add_file(7, src, 2 * CHUNK, os.stat(src).st_mtime_ns)  # id 7: unknown to the receiver
    wait_for(lambda: r.rx.stats().protocol_errors >= 1, what="a protocol error")
    errors = r.rx_kind("protocol_error")
    assert errors and "unknown file id 7" in str(errors[0][-1])
    assert r.rx.stats().chunks_written == 0


def test_local_link_arguments_are_checked(engines, tmp_path):
    token = os.urandom(32)
    rx = te.Receiver("127.0.0.1", 0, token, CHUNK, 4 << 20)
    engines(rx)
    with pytest.raises(TypeError, match="local must be a Receiver"):
        _engine.Sender("127.0.0.1", 1, token, CHUNK, 4 << 20, local=object())
    with pytest.raises(ValueError, match="no TLS"):
        te.Sender("127.0.0.1", 1, token, CHUNK, 4 << 20, local=rx, tls_key=os.urandom(te.TLS_KEY_LEN))
    with pytest.raises(ValueError, match="differs from the local receiver"):
        te.Sender("127.0.0.1", 1, token, 2 * CHUNK, 4 << 20, local=rx)
    rx.close()
    with pytest.raises(RuntimeError, match="closed"):
        te.Sender("127.0.0.1", 1, token, CHUNK, 4 << 20, local=rx)
