"""Case 6 (data connections): a wrong token or magic, another session's token, garbage frame
headers (unknown file id, bad offset or length, flags), a bad payload hash, EOF inside a frame,
silent and slow hellos, a connection flood: rejected, nothing written, and the receiver still
completes the file for the rightful sender and serves a normal transfer."""
import os
import socket
import time

import pytest

pytest.importorskip("automdt.transfer_engine._engine")

import zmq  # noqa: E402

from automdt import journal  # noqa: E402
from automdt.paths import temp_names  # noqa: E402
from automdt.receiver import ReceiverServer  # noqa: E402
from automdt.sender import run_transfer  # noqa: E402
from tests.faults.helpers import FRAME, FRAME_MAGIC, FakeSender, Outside, opts, read, receiver_answers  # noqa: E402
from tests.util import CHUNK, trees_identical, write_file  # noqa: E402

SECRET = b"data-abuse-secret"
SIZES = {0: 3 * CHUNK + 5, 1: CHUNK}


@pytest.fixture
def session(tmp_path):
    """A receiver and one fake-sender session with two files activated (nothing sent yet)."""
    root = tmp_path / "root"
    root.mkdir()
    srv = ReceiverServer(str(root), "127.0.0.1", 0, secret=SECRET, idle_timeout_s=30).start()
    ctx = zmq.Context()
    guard = Outside(tmp_path, [str(root)], allow_new=("normal-src",))
    f = FakeSender(ctx, srv.port, SECRET)
    data = {fid: os.urandom(n) for fid, n in SIZES.items()}
    try:
        f.handshake(subdir="s")
        plan = f.manifest([{"id": fid, "path": f"f{fid}.bin", "size": n, "mtime_ns": 10**18} for fid, n in SIZES.items()])
        assert [a for _, a in plan["files"]] == ["send", "send"]
        acts = f.activate(list(SIZES))["files"]
        assert [a for _, a, _ in acts] == ["send", "send"]
        f.root, f.srv, f.ctx, f.data, f.tmp = root, srv, ctx, data, tmp_path
        yield f
        # the rightful sender still completes both files
        f.send_files(data)
        done, errs = f.wait_done(SIZES)
        assert done == set(SIZES) and errs == [], errs
        for fid in SIZES:
            assert read(root / "s" / f"f{fid}.bin") == data[fid]
        guard.check()
        assert srv._thread.is_alive() and receiver_answers(srv.port, ctx)
        src = tmp_path / "normal-src"
        write_file(str(src / "n.bin"), 2 * CHUNK + 1, seed=3)
        s = run_transfer(str(src), f"127.0.0.1:{srv.port}/normal", opts(secret=SECRET))
        assert s.exit_code == 0, s.errors
        assert trees_identical(str(src), str(root / "normal"))[0]
    finally:
        f.close()
        srv.stop()
        ctx.term()


def _nothing_written(f):
    """No journal record and no data in either partial file."""
    for fid in SIZES:
        part, jname = temp_names(f"f{fid}.bin")
        jfd = os.open(f.root / "s" / jname, os.O_RDONLY)
        try:
            _, _, recs = journal.read_records(jfd)
        finally:
            os.close(jfd)
        assert recs == [], (fid, recs)
        assert read(f.root / "s" / part).strip(b"\0") == b""
        assert not (f.root / "s" / f"f{fid}.bin").exists()


def _closed_by_peer(s, timeout=3.0):
    """True once the receiver closed this connection (EOF or reset)."""
    s.settimeout(0.2)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if s.recv(4096) == b"":
                return True
        except socket.timeout:
            continue
        except OSError:
            return True
    return False


def _stats(f):
    return f.poll()["stats"]


def _raw(f, hello=None):
    s = socket.create_connection(("127.0.0.1", f.data_port), timeout=5)
    if hello is not None:
        s.sendall(hello)
    return s


def test_wrong_token_magic_or_another_sessions_token_is_rejected(session):
    f = session
    other = FakeSender(f.ctx, f.srv.port, SECRET)
    try:
        other.handshake(subdir="other")
        hellos = [b"AMDTDATA" + os.urandom(32), b"AMDTDATX" + f.token, b"AMDTDATA" + other.token,
                  b"AMDTDATA" + f.token[:-1] + bytes([f.token[-1] ^ 1])]
        before = _stats(f)["connections_rejected"]
        for h in hellos:
            s = _raw(f, h)
            try:
                try:
                    s.sendall(f.frames(0, f.data[0]))  # the data that follows a bad hello is never read
                except OSError:
                    pass
                assert _closed_by_peer(s)
            finally:
                s.close()
        time.sleep(0.2)
        assert _stats(f)["connections_rejected"] >= before + len(hellos)
        _nothing_written(f)
    finally:
        other.close()


def _hdr(fid, off, length, flags=0, magic=FRAME_MAGIC, h=0):
    return FRAME.pack(magic, fid, off, length, flags, h)


@pytest.mark.parametrize("hdr", [
    _hdr(0, 0, CHUNK, magic=0xDEADBEEF),
    _hdr(0, 0, CHUNK, flags=1),
    _hdr(99, 0, CHUNK),
    _hdr(0, 1, CHUNK),
    _hdr(0, 4 * CHUNK, CHUNK),
    _hdr(0, 2**63, CHUNK),
    _hdr(0, 0, CHUNK - 1),
    _hdr(0, 3 * CHUNK, CHUNK),  # the last chunk has 5 bytes
    _hdr(0, 0, 0),
    _hdr(0, 0, 2**32 - 1),
    os.urandom(32),
], ids=["magic", "flags", "unknown-file", "unaligned-offset", "offset-past-end", "offset-2^63", "short-length",
        "long-tail", "zero-length", "huge-length", "random"])
def test_garbage_frame_header_closes_the_connection_and_writes_nothing(session, hdr):
    f = session
    before = _stats(f)["protocol_errors"]
    s = _raw(f, b"AMDTDATA" + f.token)
    try:
        try:
            s.sendall(hdr + os.urandom(CHUNK))
        except OSError:
            pass
        assert _closed_by_peer(s)
    finally:
        s.close()
    time.sleep(0.1)
    assert _stats(f)["protocol_errors"] == before + 1
    _nothing_written(f)


def test_bad_payload_hash_is_reported_and_not_written(session):
    f = session
    s = _raw(f, b"AMDTDATA" + f.token)
    try:
        good = f.frames(1, f.data[1])
        bad = bytearray(good)
        bad[40] ^= 0x55  # a payload byte
        s.sendall(bytes(bad))
        s.shutdown(socket.SHUT_WR)
        assert _closed_by_peer(s)
    finally:
        s.close()
    bad_reports = []
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not bad_reports:
        bad_reports = f.poll()["bad"]
        time.sleep(0.05)
    assert bad_reports == [[1, 0, CHUNK]]
    _nothing_written(f)


def test_eof_inside_a_frame_writes_nothing(session):
    f = session
    frame = f.frames(0, f.data[0])[: 32 + CHUNK // 2]
    for cut in (10, 32, len(frame)):
        s = _raw(f, b"AMDTDATA" + f.token)
        try:
            s.sendall(frame[:cut])
            s.shutdown(socket.SHUT_WR)
            assert _closed_by_peer(s)
        finally:
            s.close()
    _nothing_written(f)


def test_silent_slow_and_flooding_connections_are_closed(session):
    """150 connections that never finish their hello (more than the receiver's connection cap):
    all closed within the 5 s hello timeout; the rightful sender gets through afterwards."""
    f = session
    socks = []
    try:
        for i in range(150):
            s = socket.create_connection(("127.0.0.1", f.data_port), timeout=5)
            if i % 3 == 1:
                s.sendall(b"AMDTDA")  # a slow hello
            elif i % 3 == 2:
                s.sendall(b"AMDTDATA" + f.token[:10])
            socks.append(s)
        t0 = time.monotonic()
        for s in socks:
            assert _closed_by_peer(s, timeout=max(0.5, 8 - (time.monotonic() - t0)))
        assert time.monotonic() - t0 < 8
    finally:
        for s in socks:
            s.close()
    _nothing_written(f)


def test_authenticated_but_silent_connection_is_closed_with_its_session(session):
    f = session
    s = _raw(f, b"AMDTDATA" + f.token)
    try:
        s.sendall(f.frames(1, f.data[1])[:100])  # inside a frame, then silent
        time.sleep(0.2)
        other = FakeSender(f.ctx, f.srv.port, SECRET)
        other.handshake(subdir="x")
        other.close()
        assert not _closed_by_peer(s, timeout=0.5)  # another session's end does not touch it
        f.c.request({"type": "close"})
        assert _closed_by_peer(s, timeout=5)
    finally:
        s.close()
    # a new session for the rightful sender (the fixture's finaliser sends the data)
    f.handshake(subdir="s")
    f.manifest([{"id": fid, "path": f"f{fid}.bin", "size": n, "mtime_ns": 10**18} for fid, n in SIZES.items()])
    f.activate(list(SIZES))
