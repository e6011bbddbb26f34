"""Rejected connections, invalid frames, changing sources, write errors, API validation."""
from __future__ import annotations

import errno
import os
import socket
import struct
import time

import pytest

from .conftest import te, wait_for

CHUNK = 64 * 1024
MAGIC = 0x43444D41


def frame(file_id: int, offset: int, payload: bytes, magic: int = MAGIC, flags: int = 0) -> bytes:
    from automdt.transfer_engine import frame_hash

    return struct.pack("<IIQIIQ", magic, file_id, offset, len(payload), flags,
                       frame_hash(payload, file_id, offset)) + payload


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return s


def wait_closed(s: socket.socket, timeout: float = 5.0) -> None:
    """The receiver closes the connection: recv returns EOF or a reset."""
    s.settimeout(timeout)
    try:
        assert s.recv(1) == b""
    except ConnectionResetError:
        pass


def test_bad_token_rejected_and_receiver_still_serves(rig):
    r = rig(chunk=CHUNK, threads=(1, 1, 1))
    for hello in (b"AMDTDATA" + os.urandom(32), b"NOTMAGIC" + r.token):
        s = connect(r.rx.port)
        s.sendall(hello)
        wait_closed(s)
        s.close()
    wait_for(lambda: len(r.rx_kind("conn_rejected")) == 2, what="2 conn_rejected events")
    msgs = [e[1] for e in r.rx_kind("conn_rejected")]
    assert msgs[0].startswith("bad token from 127.0.0.1:")
    assert msgs[1].startswith("bad hello magic from 127.0.0.1:")
    assert r.rx.stats().connections_rejected == 2
    r.add(1, 3 * CHUNK + 5)
    r.wait_done([1])
    r.assert_identical(1)


@pytest.mark.parametrize(
    "case, expect",
    [
        ("unknown_id", "unknown file id 99"),
        ("bad_offset", "bad offset 100"),
        ("beyond_size", "bad offset 262144"),
        ("bad_length", "bad length"),
        ("bad_magic", "bad frame magic"),
        ("bad_flags", "unsupported frame flags"),
    ],
)
def test_invalid_frame_rejected_nothing_written(rig, case, expect):
    pytest.importorskip("xxhash")
    r = rig(chunk=CHUNK, threads=(0, 0, 1))
    size = 2 * CHUNK + 10
    src, dst, data = r.add(1, size, send=False)
    payload = data[:CHUNK]
    f = {
        "unknown_id": frame(99, 0, payload),
        "bad_offset": frame(1, 100, payload),
        "beyond_size": frame(1, 4 * CHUNK, payload),
        "bad_length": frame(1, 2 * CHUNK, payload[:5]),  # the last chunk has 10 bytes
        "bad_magic": frame(1, 0, payload, magic=0x12345678),
        "bad_flags": frame(1, 0, payload, flags=1),
    }[case]
    s = connect(r.rx.port)
    s.sendall(b"AMDTDATA" + r.token + f)
    wait_closed(s)
    s.close()
    wait_for(lambda: r.rx_kind("protocol_error"), what="protocol_error event")
    (ev,) = r.rx_kind("protocol_error")
    assert expect in ev[1] and "127.0.0.1:" in ev[1]
    time.sleep(0.05)
    st = r.rx.stats()
    assert st.protocol_errors == 1 and st.chunks_written == 0
    assert os.path.getsize(dst) == 0
    assert r.rx.missing(1) == [(0, CHUNK), (CHUNK, CHUNK), (2 * CHUNK, 10)]
    # A well-formed frame on a fresh connection is accepted and written.
    s = connect(r.rx.port)
    s.sendall(b"AMDTDATA" + r.token + frame(1, 2 * CHUNK, data[2 * CHUNK:]))
    s.close()
    wait_for(lambda: r.rx.stats().chunks_written == 1, what="valid frame written")


def test_eof_mid_frame_drops_partial_chunk(rig):
    pytest.importorskip("xxhash")
    r = rig(chunk=CHUNK, threads=(0, 0, 1))
    src, dst, data = r.add(1, 2 * CHUNK, send=False)
    s = connect(r.rx.port)
    s.sendall(b"AMDTDATA" + r.token + frame(1, 0, data[:CHUNK]) + frame(1, CHUNK, data[CHUNK:])[:1000])
    s.close()
    wait_for(lambda: r.rx.stats().chunks_written == 1, what="first chunk")
    wait_for(lambda: r.rx_kind("conn_error"), what="mid-frame conn_error")
    assert r.rx.missing(1) == [(CHUNK, CHUNK)]
    assert r.rx.stats().connections == 0


def test_source_changed_during_read(rig):
    r = rig(chunk=CHUNK, threads=(1, 1, 1), sender_kw={"read_throttle": (4 * CHUNK, 0)})
    src, dst, data = r.add(1, 16 * CHUNK)
    wait_for(lambda: r.tx.stats().read.bytes >= CHUNK, what="first chunk read")
    os.truncate(src, 100)
    wait_for(lambda: r.tx_kind("file_error"), what="file_error event")
    (ev,) = r.tx_kind("file_error")
    assert ev[1] == 1 and ev[2] == 0
    assert ev[3] == f"changed during read: size {16 * CHUNK} -> 100"
    wait_for(lambda: r.tx.stats().chunks_pending == 0, what="failed file dropped")
    st = r.tx.stats()
    assert st.files_failed == 1 and st.chunks_sent < 16
    assert r.tx.requeue(1, 0, CHUNK) is False  # chunks of a failed file are not sent again


def test_source_mtime_change_and_missing_file(rig):
    r = rig(chunk=CHUNK, threads=(1, 1, 1))
    src = os.path.join(r.tmp, "gone")
    r.tx.add_file(5, src, 10, 0)
    path = os.path.join(r.tmp, "touched")
    with open(path, "wb") as fh:
        fh.write(b"x" * 10)
    r.tx.add_file(6, path, 10, os.stat(path).st_mtime_ns - 1)
    wait_for(lambda: len(r.tx_kind("file_error")) == 2, what="2 file_error events")
    evs = {e[1]: e for e in r.tx_kind("file_error")}
    assert evs[5][2] == errno.ENOENT and evs[5][3] == "open: No such file or directory"
    assert evs[6][3].startswith("changed during read: mtime_ns")


@pytest.mark.parametrize("target", ["readonly", "devfull"])
def test_write_error_event(rig, target):
    r = rig(chunk=CHUNK, threads=(1, 1, 1))
    src = os.path.join(r.tmp, "src")
    with open(src, "wb") as fh:
        fh.write(os.urandom(2 * CHUNK))
    if target == "readonly":
        _, fd = r.open_dst("ro", os.O_CREAT | os.O_RDONLY)
        want = (errno.EBADF, "pwrite: Bad file descriptor")
    else:
        if not os.path.exists("/dev/full"):
            pytest.skip("no /dev/full")
        _, fd = r.open_dst("/dev/full", os.O_WRONLY)
        want = (errno.ENOSPC, "pwrite: No space left on device")
    r.rx.add_file(1, fd, -1, 2 * CHUNK)
    r.tx.add_file(1, src, 2 * CHUNK, os.stat(src).st_mtime_ns)
    wait_for(lambda: len(r.rx_kind("write_error")) == 2, what="2 write_error events")
    for ev in r.rx_kind("write_error"):
        assert ev[1] == 1 and (ev[2], ev[3]) == want
    assert r.rx.missing(1) == [(0, CHUNK), (CHUNK, CHUNK)]
    assert r.rx.stats().chunks_written == 0
    r.rx.remove_file(1)
    with pytest.raises(KeyError):
        r.rx.missing(1)


def test_conn_error_event_and_backoff(engines):
    # Nothing listens on this port: each network thread reports and backs off, never spins.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    tx = te.Sender("127.0.0.1", port, os.urandom(32), CHUNK, 1 << 20, threads=(0, 2))
    engines(tx)
    time.sleep(1.0)
    evs = tx.events()
    assert evs and all(e[0] == "conn_error" for e in evs)
    assert evs[0][1] == errno.ECONNREFUSED
    assert evs[0][2] == f"connect 127.0.0.1:{port}: Connection refused"
    assert len(evs) <= 2 * 5  # back-off: 0.1, 0.2, 0.4, 0.8 s ... per thread


def test_api_validation(engines, tmp_path):
    tok = os.urandom(32)
    with pytest.raises(ValueError, match="token must be 32 bytes"):
        te.Receiver("127.0.0.1", 0, b"short", CHUNK, 1 << 20)
    with pytest.raises(ValueError, match="memory_bytes .* at least one chunk"):
        te.Receiver("127.0.0.1", 0, tok, CHUNK, CHUNK - 1)
    with pytest.raises(ValueError, match="chunk_size"):
        te.Sender("127.0.0.1", 1, tok, 0, 1 << 20)
    with pytest.raises(ValueError, match="read_throttle"):
        te.Sender("127.0.0.1", 1, tok, CHUNK, 1 << 20, read_throttle=(1,))  # type: ignore[arg-type]
    rx = te.Receiver("127.0.0.1", 0, tok, CHUNK, 1 << 20, max_threads=4)
    engines(rx)
    tx = te.Sender("127.0.0.1", rx.port, tok, CHUNK, 1 << 20, max_threads=4, threads=(0, 0))
    engines(tx)
    p = tmp_path / "f"
    p.write_bytes(b"x" * (3 * CHUNK))
    m = p.stat().st_mtime_ns
    with pytest.raises(ValueError, match="size must be"):
        tx.add_file(1, p, 0, m)
    with pytest.raises(ValueError, match="not a multiple of chunk_size"):
        tx.add_file(1, p, 3 * CHUNK, m, [(5, CHUNK)])
    with pytest.raises(ValueError, match="whole chunks"):
        tx.add_file(1, p, 3 * CHUNK, m, [(0, CHUNK + 1)])
    with pytest.raises(ValueError, match="beyond size"):
        tx.add_file(1, p, 3 * CHUNK, m, [(2 * CHUNK, 2 * CHUNK)])
    with pytest.raises(ValueError, match="file_id"):
        tx.add_file(2**32, p, 3 * CHUNK, m)
    tx.add_file(1, p, 3 * CHUNK, m)
    with pytest.raises(ValueError, match="already added"):
        tx.add_file(1, p, 3 * CHUNK, m)
    with pytest.raises(KeyError):
        tx.requeue(7, 0, CHUNK)
    with pytest.raises(ValueError, match="not one chunk"):
        tx.requeue(1, 0, 2 * CHUNK)
    with pytest.raises(ValueError, match="read threads must be 0..4"):
        tx.set_threads(5, 1)
    with pytest.raises(ValueError, match="stage must be 'read' or 'net'"):
        tx.set_throttle("write", 1, 1)
    with pytest.raises(ValueError, match="stage must be 'write' or 'recv'"):
        rx.set_throttle("net", 1, 1)
    with pytest.raises(ValueError, match="size 0"):
        tx._e.add_file(3, str(p), 0, m, None)  # the C layer checks too
    assert tx.set_threads(1, 1) == (0, 0)
    assert rx.set_threads(3) == 1
    tx.close()
    tx.close()  # idempotent
    assert tx.closed
    with pytest.raises(RuntimeError, match="closed"):
        tx.set_threads(1, 1)
    assert tx.stats().read.threads_live == 0  # stats stay readable after close
    rx.close()
    with pytest.raises(RuntimeError, match="closed"):
        rx.add_file(9, 0, -1, 1)


def test_receiver_restart_sender_recovers(tmp_path, engines):
    """The receiver goes away mid-transfer: the sender requeues what it was sending, reports
    conn_error, backs off, reconnects to a new receiver on the same port, and missing() +
    requeue() complete the file."""
    tok = os.urandom(32)
    size = 48 * CHUNK
    src = tmp_path / "src"
    data = os.urandom(size)
    src.write_bytes(data)
    rx1 = te.Receiver("127.0.0.1", 0, tok, CHUNK, 1 << 20, threads=1)
    engines(rx1)
    port = rx1.port
    dst = str(tmp_path / "dst")
    fd = os.open(dst, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        rx1.add_file(1, fd, -1, size)
        tx = te.Sender("127.0.0.1", port, tok, CHUNK, 1 << 20, threads=(1, 2),
                       net_throttle=(0, 24 * CHUNK))  # about 2 s for the whole file
        engines(tx)
        tx.add_file(1, str(src), size, src.stat().st_mtime_ns)
        wait_for(lambda: rx1.stats().chunks_written >= 4, what="some chunks written")
        rx1.close()
        wait_for(lambda: any(e[0] == "conn_error" for e in tx.events()), what="conn_error on the sender")
        assert tx.stats().chunks_pending > 0  # requeued, not lost
        rx2 = te.Receiver("127.0.0.1", port, tok, CHUNK, 1 << 20, threads=1)
        engines(rx2)
        rx2.add_file(1, fd, -1, size)  # a real session would pass the journal's bitmap
        tx.set_throttle("net", 0, 0)
        wait_for(lambda: tx.stats().chunks_pending == 0, timeout=20, what="sender drained")
        wait_for(lambda: rx2.stats().buffer.slots_used == 0, what="receiver drained")
        missing = rx2.missing(1)
        for off, ln in missing:
            tx.requeue(1, off, ln)
        wait_for(lambda: any(e[0] == "file_done" for e in rx2.events()), what="file_done")
        with open(dst, "rb") as fh:
            assert fh.read() == data
        assert rx2.stats().connections_total >= 1
    finally:
        for e in ("tx", "rx2"):
            obj = locals().get(e)
            if obj is not None:
                obj.close()
        os.close(fd)


def test_remove_file_waits_for_writers_then_fds_are_free(rig):
    r = rig(chunk=CHUNK, memory=1 << 20, threads=(1, 2, 3),
            receiver_kw={"write_throttle": (8 * CHUNK, 0)})
    src, dst, data = r.add(1, 64 * CHUNK)
    wait_for(lambda: r.rx.stats().chunks_written >= 3, what="writes in progress")
    r.rx.remove_file(1)  # returns once no writer is inside pwrite/journal for this file
    size_after = os.path.getsize(dst)
    written_after = r.rx.stats().chunks_written
    time.sleep(0.3)
    assert os.path.getsize(dst) == size_after
    assert r.rx.stats().chunks_written == written_after
    with pytest.raises(KeyError):
        r.rx.remove_file(1)
    # Queued chunks of the removed file are dropped; new frames for it are protocol errors.
    wait_for(lambda: r.rx.stats().chunks_orphaned + r.rx.stats().protocol_errors > 0,
             what="orphaned chunks or protocol errors")
    r.tx.close()


def test_cancel_file_drops_unsent_chunks(rig):
    r = rig(chunk=CHUNK, memory=1 << 20, threads=(1, 1, 1),
            sender_kw={"net_throttle": (8 * CHUNK, 0)})
    r.add(1, 64 * CHUNK)
    r.add(2, 3 * CHUNK)
    wait_for(lambda: r.rx.stats().chunks_written >= 2, what="transfer under way")
    r.tx.cancel_file(1)
    wait_for(lambda: 2 in r.done_ids(), what="the other file still completes")
    wait_for(lambda: r.tx.stats().chunks_pending == 0, what="cancelled chunks dropped")
    st = r.tx.stats()
    assert st.chunks_sent < 64 + 3 and st.files_failed == 0
    assert r.tx.requeue(1, 0, CHUNK) is False
    assert r.tx_kind("file_error") == []
    with pytest.raises(KeyError):
        r.tx.cancel_file(77)


def test_a_receivers_buffer_cap_changes_while_it_runs(rig):
    """A lowered cap frees buffer memory as the writers drain it and no more is handed out above
    it; a raised cap lets the buffer grow again (the receiver's budget shares memory this way)."""
    r = rig(chunk=CHUNK, memory=32 * CHUNK, threads=(2, 2, 1),
            receiver_kw={"write_throttle": (16 * CHUNK, 0)})
    src, dst, data = r.add(1, 160 * CHUNK)
    wait_for(lambda: r.rx.stats().buffer.slots_allocated >= 24, what="the buffer fills behind a slow writer")
    assert r.rx.set_memory(8 * CHUNK) == 32 * CHUNK
    wait_for(lambda: r.rx.stats().buffer.slots_allocated <= 8, what="the buffer shrinks to the new cap")
    for _ in range(20):
        st = r.rx.stats().buffer
        assert st.slots_allocated <= 8 and st.slots_used <= 8 and st.capacity_bytes == 8 * CHUNK
        time.sleep(0.05)
    r.rx.set_memory(32 * CHUNK)
    wait_for(lambda: r.rx.stats().buffer.slots_allocated > 16, what="the buffer grows again")
    r.rx.set_threads(4)
    wait_for(lambda: 1 in r.done_ids(), timeout=60, what="the file completes")
    with open(dst, "rb") as f:
        assert f.read() == data
    with pytest.raises(ValueError):
        r.rx.set_memory(CHUNK - 1)
