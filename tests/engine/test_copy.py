"""Byte-identical copies, resume bitmaps, journals, missing() and corruption handling."""
from __future__ import annotations

import os
import struct

import pytest

from automdt.transfer_engine import switches

from .conftest import wait_for

CHUNK = 64 * 1024


def test_edge_sizes_identical(rig):
    r = rig(chunk=CHUNK, threads=(2, 2, 2))
    sizes = [1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 5 * CHUNK + 7, 1 << 20]
    for fid, size in enumerate(sizes, start=1):
        r.add(fid, size)
    r.wait_done(range(1, len(sizes) + 1))
    for fid in range(1, len(sizes) + 1):
        r.assert_identical(fid)
    nchunks = sum(-(-s // CHUNK) for s in sizes)
    wait_for(lambda: r.tx.stats().chunks_pending == 0, what="sender drained")
    ts, rs = r.tx.stats(), r.rx.stats()
    assert ts.chunks_sent == nchunks
    assert rs.chunks_written == nchunks
    assert rs.chunks_duplicate == 0 and rs.chunks_bad == 0
    assert ts.read.bytes == ts.net.bytes == rs.recv.bytes == rs.write.bytes == sum(sizes)
    assert rs.connections == 2 and rs.connections_total == 2
    assert ts.buffer.fill_bytes == 0 and ts.buffer.capacity_bytes == 4 << 20
    assert ts.buffer.slots_total == (4 << 20) // CHUNK
    assert r.tx_kind("file_error") == [] and r.rx_kind("write_error") == []


def test_many_small_files(rig):
    r = rig(chunk=4096, memory=1 << 20, threads=(3, 2, 2))
    rng = __import__("random").Random(7)
    ids = list(range(1000, 1300))
    for fid in ids:
        r.add(fid, rng.randint(1, 10_000))
    r.wait_done(ids)
    for fid in ids:
        r.assert_identical(fid)
    assert r.rx.stats().chunks_duplicate == 0


def test_add_file_while_running_and_ranges_missing_requeue(rig):
    r = rig(chunk=CHUNK, threads=(1, 1, 1))
    size = 5 * CHUNK + 100  # chunks 0..5, the last one short
    # Only chunks 0, 2 and 3 are sent: a two-chunk range and a single chunk.
    src, dst, data = r.add(1, size, ranges=[(0, CHUNK), (2 * CHUNK, 2 * CHUNK)])
    wait_for(lambda: r.rx.stats().chunks_written == 3, what="3 chunks written")
    wait_for(lambda: r.tx.stats().chunks_pending == 0, what="sender drained")
    missing = r.rx.missing(1)
    assert missing == [(CHUNK, CHUNK), (4 * CHUNK, CHUNK), (5 * CHUNK, 100)]
    assert r.done_ids() == set()
    for off, ln in missing:
        assert r.tx.requeue(1, off, ln) is True
    r.wait_done([1])
    r.assert_identical(1)
    assert r.rx.missing(1) == []
    assert r.tx.stats().chunks_requeued == 3
    # A file added later (while the engine runs) goes through too.
    r.add(2, 3 * CHUNK)
    r.wait_done([2])
    r.assert_identical(2)


def test_done_chunks_bitmap_skips(rig):
    r = rig(chunk=CHUNK, threads=(2, 2, 2))
    size = 10 * CHUNK + 1  # 11 chunks -> 2 bitmap bytes
    done = {0, 3, 8, 10}
    bitmap = bytearray(2)
    for i in done:
        bitmap[i >> 3] |= 1 << (i & 7)
    src, dst, data = r.add(1, size, done_chunks=bytes(bitmap))
    r.wait_done([1])
    # file_done can come before the writers have seen (and dropped) the pre-done chunks.
    wait_for(lambda: (lambda s: s.chunks_written + s.chunks_duplicate)(r.rx.stats()) == 11,
             what="every chunk written or dropped")
    with open(dst, "rb") as fh:
        got = fh.read()
    for i in range(11):
        lo, hi = i * CHUNK, min(size, (i + 1) * CHUNK)
        if i in done:  # skipped: never written (a hole or past EOF)
            assert got[lo:hi] in (b"", b"\0" * (min(hi, len(got)) - lo))
        else:
            assert got[lo:hi] == data[lo:hi]
    st = r.rx.stats()
    assert st.chunks_written == 11 - len(done)
    assert st.chunks_duplicate == len(done)
    # A complete bitmap means done at once; a wrong length is refused.
    _, fd = r.open_dst("full")
    r.rx.add_file(2, fd, -1, 3 * CHUNK, b"\x07")
    wait_for(lambda: 2 in r.done_ids(), what="immediate file_done")
    with pytest.raises(ValueError, match="done_chunks must be 1 bytes"):
        r.rx.add_file(3, fd, -1, 3 * CHUNK, b"\x07\x00")


def test_journal_records(rig):
    xxhash = pytest.importorskip("xxhash")
    r = rig(chunk=CHUNK, threads=(2, 2, 2))
    size = 7 * CHUNK + 333
    src, dst, data = r.add(1, size, journal=True)
    r.wait_done([1])
    r.assert_identical(1)
    with open(dst + ".journal", "rb") as fh:
        raw = fh.read()
    assert len(raw) == 8 * 32
    seen = set()
    for k in range(0, len(raw), 32):
        rec = raw[k:k + 32]
        magic, length, offset, h, check = struct.unpack("<4sIQQQ", rec)
        assert magic == b"AMJR"
        assert check == xxhash.xxh3_64_intdigest(rec[:24])
        assert h == xxhash.xxh3_64_intdigest(data[offset:offset + length])
        assert length == min(CHUNK, size - offset)
        seen.add(offset)
    assert seen == {i * CHUNK for i in range(8)}
    # Chunks sent again after the file is complete are dropped: no write, no journal record.
    for _ in range(5):
        r.tx.requeue(1, 0, CHUNK)
    wait_for(lambda: r.rx.stats().chunks_duplicate == 5, what="5 duplicates dropped")
    assert os.path.getsize(dst + ".journal") == 8 * 32
    assert r.rx.stats().chunks_written == 8


def test_corruption_hook_and_requeue(rig):
    r = rig(chunk=CHUNK, threads=(1, 2, 1), sender_kw={"fault_corrupt": 2})
    size = 6 * CHUNK
    r.add(1, size)
    wait_for(lambda: len(r.rx_kind("chunk_bad")) == 2, what="2 chunk_bad events")
    wait_for(lambda: r.rx.stats().chunks_written == 4, what="4 good chunks")
    bad = r.rx_kind("chunk_bad")
    assert all(e[1] == 1 and e[3] == CHUNK and e[2] % CHUNK == 0 for e in bad)
    assert sorted(r.rx.missing(1)) == sorted((e[2], e[3]) for e in bad)
    for _, fid, off, ln in bad:
        r.tx.requeue(fid, off, ln)
    r.wait_done([1])
    r.assert_identical(1)
    ts, rs = r.tx.stats(), r.rx.stats()
    assert ts.frames_corrupted == 2 and rs.chunks_bad == 2
    # The hook can be armed again at runtime.
    r.tx.set_fault_corrupt(1)
    r.add(2, CHUNK)
    wait_for(lambda: len(r.rx_kind("chunk_bad")) == 3, what="third chunk_bad")
    r.tx.requeue(2, 0, CHUNK)
    r.wait_done([2])
    r.assert_identical(2)


@pytest.mark.parametrize("at_once", ["3", None])
def test_large_files_are_read_several_at_a_time(rig, at_once):
    """Chunks are taken round robin from the first files of the queue, as many files as the
    wider sender stage has threads (the switch files_at_once=N: N), so the receiver's writers work
    on different files instead of queueing on one file's inode lock. One thread per stage keeps
    the order of the reads as the order of the writes: with 3 files at once a one-chunk file
    queued after an eight-chunk one completes first; with one read and one network thread
    (the default then reads one file at a time, in add order) it completes second."""
    with switches.using(files_at_once=int(at_once or 0)):
        r = rig(chunk=CHUNK, threads=(0, 1, 1))
    r.add(1, 8 * CHUNK)
    r.add(2, CHUNK // 2)
    r.add(3, 8 * CHUNK + 1)
    r.tx.set_threads(1, 1)  # every file is queued before the first read
    r.wait_done([1, 2, 3])
    order = [e[1] for e in r.rx_kind("file_done")]
    assert order == ([2, 1, 3] if at_once else [1, 2, 3])
    assert r.rx.stats().chunks_written == 8 + 1 + 9
    for fid in (1, 2, 3):
        r.assert_identical(fid)
