"""The zero-copy send path (sendfile from the page cache; TLS re-reads the chunk) against the copy
path, a source that shrinks between read and send, and slot memory reused across engines."""
from __future__ import annotations

import os

import pytest

from automdt.transfer_engine import _engine, switches

from .conftest import te, wait_for

CHUNK = 256 * 1024
SIZES = [1, CHUNK - 1, CHUNK, 3 * CHUNK + 17, 40 * CHUNK]


def _copy_all(rig, sender_kw, receiver_kw=None):
    r = rig(chunk=CHUNK, memory=4 << 20, threads=(2, 3, 2), sender_kw=sender_kw, receiver_kw=receiver_kw or {})
    for fid, size in enumerate(SIZES, start=1):
        r.add(fid, size, seed=fid * 7)
    r.wait_done(range(1, len(SIZES) + 1))
    for fid in range(1, len(SIZES) + 1):
        r.assert_identical(fid)
    wait_for(lambda: r.tx.stats().chunks_pending == 0, what="sender drained")
    return r


@pytest.mark.parametrize("mode", ["sendfile", "copy", "switch-copy"])
def test_zero_copy_and_copy_paths_deliver_identical_bytes(rig, mode):
    with switches.using(sendfile=mode != "switch-copy"):  # the switch sendfile=0 as the process's setting
        r = _copy_all(rig, {"zerocopy": mode != "copy"})
    assert r.tx.zerocopy is (mode == "sendfile")
    ts, rs = r.tx.stats(), r.rx.stats()
    assert ts.read.bytes == ts.net.bytes == rs.write.bytes == sum(SIZES)
    assert rs.chunks_bad == 0 and rs.chunks_duplicate == 0
    # zero-copy: the sender's staging slots hold references, never bytes
    assert ts.buffer.fill_bytes == 0 and ts.buffer.slots_allocated >= 1


def test_tls_re_reads_the_chunk_and_delivers_identical_bytes(rig):
    key = os.urandom(te.TLS_KEY_LEN)
    r = _copy_all(rig, {"tls_key": key}, {"tls_key": key})
    assert r.tx.zerocopy and r.tx.encrypted
    assert r.rx.stats().chunks_bad == 0


@pytest.mark.parametrize("path", [{"zerocopy": True}, {"zerocopy": False}, {"local": True}],
                         ids=["sendfile", "copy", "local-link"])
def test_fault_hook_corrupts_after_hashing_on_every_path(rig, path):
    """The hook flips a payload byte after the hash was taken: the receiver refuses the chunk (on the
    local link the writer's check refuses the buffer the reader hashed)."""
    r = rig(chunk=CHUNK, threads=(1, 1, 1), sender_kw={"fault_corrupt": 2, **path})
    r.add(1, 4 * CHUNK)
    wait_for(lambda: len(r.rx_kind("chunk_bad")) == 2, what="two chunk_bad events")
    for _, fid, off, ln in r.rx_kind("chunk_bad"):
        assert r.tx.requeue(fid, off, ln)
    r.wait_done([1])
    r.assert_identical(1)
    assert r.tx.stats().frames_corrupted == 2


def test_source_shrinking_after_the_read_fails_the_file_and_writes_nothing_wrong(rig):
    """Staged chunks are sent from the page cache: a file truncated after they were read and
    hashed is sent short or differently, which the receiver refuses; the re-read fails the file."""
    r = rig(chunk=CHUNK, memory=64 * CHUNK, threads=(2, 1, 1),
            sender_kw={"net_throttle": (0, 2 * CHUNK)})  # slow sending: chunks stay staged
    src, dst, data = r.add(1, 32 * CHUNK)
    wait_for(lambda: r.tx.stats().read.bytes >= 16 * CHUNK, what="chunks read ahead")
    os.truncate(src, 3 * CHUNK)
    r.tx.set_throttle("net", 0, 0)
    wait_for(lambda: r.tx_kind("file_error") != [] or r.rx_kind("chunk_bad") != [], what="the change noticed")
    for _, fid, off, ln in r.rx_kind("chunk_bad"):
        r.tx.requeue(fid, off, ln)
    wait_for(lambda: r.tx_kind("file_error") != [], what="file_error after the re-read")
    assert 1 not in r.done_ids()
    # every chunk the receiver wrote is the original content at its offset
    with open(dst, "rb") as fh:
        got = fh.read()
    for i in range(32):
        piece = got[i * CHUNK:(i + 1) * CHUNK]
        if piece.strip(b"\0"):
            assert piece == data[i * CHUNK:(i + 1) * CHUNK], f"chunk {i} written with other bytes"


def _session(tmp_path, n: int) -> int:
    """One receiver + sender moving 8 MiB through a 4 MiB staging buffer (all 4 slots used).
    Returns the slot memory the closed engines left for the next one."""
    tok = os.urandom(32)
    d = tmp_path / f"s{n}"
    d.mkdir()
    src = d / "src"
    src.write_bytes(os.urandom(8 << 20))
    rx = te.Receiver("127.0.0.1", 0, tok, 1 << 20, 4 << 20, threads=1, write_throttle=(0, 16 << 20))
    tx = te.Sender("127.0.0.1", rx.port, tok, 1 << 20, 4 << 20, threads=(1, 2))
    fd = os.open(d / "dst", os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        rx.add_file(1, fd, -1, 8 << 20)
        tx.add_file(1, str(src), 8 << 20, os.stat(src).st_mtime_ns)
        wait_for(lambda: any(e[0] == "file_done" for e in rx.events()), what="file_done")
        assert rx.stats().buffer.slots_allocated == 4
        in_use = _engine.cached_bytes()
    finally:
        tx.close()
        rx.close()
        os.close(fd)
    assert in_use == 0  # the running receiver took every cached buffer it could
    return _engine.cached_bytes()


def test_slot_memory_is_kept_for_the_next_engine_and_trimmed(tmp_path):
    te.trim_cache()
    assert _engine.cached_bytes() == 0
    assert _session(tmp_path, 1) == 4 << 20  # the receiver's 4 slots (the zero-copy sender has none)
    assert _session(tmp_path, 2) == 4 << 20  # the second took them and gave them back: no more
    te.trim_cache(3600)
    assert _engine.cached_bytes() == 4 << 20  # kept less than an hour
    te.trim_cache()
    assert _engine.cached_bytes() == 0


def test_trim_cache_checks_its_argument():
    with pytest.raises(ValueError):
        te.trim_cache(-1)
    te.trim_cache(3600)
    te.trim_cache()
