"""The limits and layouts of transfer_engine/src/constants.h, as the Python side reads them.

The journal is the one format both languages touch: the engine's write threads append its
records, automdt/journal.py reads them back on resume. Here a real transfer writes a journal in
C, automdt.journal reads it, and its verdict goes back into a new engine as the done bitmap.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import re
import struct

import pytest

from automdt import journal
from tests.engine.conftest import te, wait_for

_engine = pytest.importorskip("automdt.transfer_engine._engine")

CHUNK = 64 * 1024


def test_journal_layout_is_the_engines() -> None:
    fmt = te.JOURNAL_RECORD_FORMAT
    assert journal.RECORD.format == fmt and journal.RECORD.size == te.JOURNAL_RECORD_LEN == 32
    assert journal.RECORD_MAGIC == te.JOURNAL_MAGIC == b"AMJR"
    # The field offsets of the C encoder are the offsets of the struct format's fields.
    fields = re.findall(r"\d*[a-zA-Z]", fmt[1:])  # "4s", "I", "Q", ...
    offsets = [struct.calcsize(fmt[0] + "".join(fields[:i])) for i in range(len(fields))]
    assert offsets == [0, _engine.JOURNAL_RECORD_LENGTH, _engine.JOURNAL_RECORD_OFFSET,
                       _engine.JOURNAL_RECORD_HASH, te.JOURNAL_RECORD_CHECK]
    assert struct.calcsize(_engine.FRAME_HEADER_FORMAT) == _engine.FRAME_HEADER_LEN
    assert _engine.HELLO_LEN == len(_engine.HELLO_MAGIC) + te.TOKEN_LEN


def test_limits_are_read_from_the_engine() -> None:
    from automdt import cli

    names = [n for n in ("automdt.receiver", "automdt.session") if importlib.util.find_spec(n)]
    session = [mod for mod in map(importlib.import_module, names)
               if hasattr(mod, "MIN_CHUNK")]  # wherever the receiving session keeps its limits
    assert session
    for mod in (cli, *session):
        assert (mod.MIN_CHUNK, mod.MAX_CHUNK) == (te.SESSION_CHUNK_SIZE_MIN, te.SESSION_CHUNK_SIZE_MAX), mod
    assert te.CHUNK_SIZE_MIN <= te.SESSION_CHUNK_SIZE_MIN < te.SESSION_CHUNK_SIZE_MAX <= te.CHUNK_SIZE_MAX
    tok = os.urandom(te.TOKEN_LEN)
    # Both layers refuse one thread or one byte past the limit, and name the limit.
    with pytest.raises(ValueError, match=f"max_threads must be 1..{te.MAX_THREADS}"):
        te.Receiver("127.0.0.1", 0, tok, CHUNK, 1 << 20, max_threads=te.MAX_THREADS + 1)
    with pytest.raises(ValueError, match=f"max_threads must be in 1..{te.MAX_THREADS}"):
        _engine.Sender("127.0.0.1", 9, tok, CHUNK, 1 << 20, te.MAX_THREADS + 1, read_threads=0, net_threads=0)
    with pytest.raises(ValueError, match=f"chunk_size must be in 1..{te.CHUNK_SIZE_MAX}"):
        _engine.Sender("127.0.0.1", 9, tok, te.CHUNK_SIZE_MAX + 1, te.CHUNK_SIZE_MAX + 1)
    with pytest.raises(ValueError, match=f"chunk_size must be {te.CHUNK_SIZE_MIN}..{te.CHUNK_SIZE_MAX}"):
        te.Sender("127.0.0.1", 9, tok, 0, 1 << 20)


def _journaled_copy(rig, size: int):
    """One file sent through the engine with a journal that starts with automdt's header."""
    r = rig(chunk=CHUNK, threads=(2, 2, 2))
    src = os.path.join(r.tmp, "src")
    data = os.urandom(size)
    with open(src, "wb") as fh:
        fh.write(data)
    dst, fd = r.open_dst("dst")
    jpath, jfd = r.open_dst("dst.journal", os.O_CREAT | os.O_RDWR | os.O_APPEND)
    fp = journal.fingerprint("src", size, os.stat(src).st_mtime_ns, CHUNK)
    os.write(jfd, journal.header(fp, CHUNK))
    r.rx.add_file(1, fd, jfd, size)
    r.tx.add_file(1, src, size, os.stat(src).st_mtime_ns)
    r.files[1] = (src, dst, data)
    r.wait_done([1])
    r.assert_identical(1)
    return r, fd, jfd, jpath, fp


def test_python_reads_the_journal_the_engine_wrote(rig) -> None:
    size = 9 * CHUNK + 1234
    nchunks = 10
    r, fd, jfd, jpath, fp = _journaled_copy(rig, size)
    assert os.path.getsize(jpath) == journal.HEADER_SIZE + nchunks * te.JOURNAL_RECORD_LEN
    jfp, jcs, recs = journal.read_records(jfd)
    assert (jfp, jcs) == (fp, CHUNK)
    _, _, data = r.files[1]
    assert sorted(off for off, _, _ in recs) == [i * CHUNK for i in range(nchunks)]
    for off, length, h in recs:
        assert length == min(CHUNK, size - off)
        assert h == _engine.hash64(data[off:off + length])  # the engine's XXH3 = journal.py's xxhash
    assert _verified(r, jfd, fp, size) == list(range(nchunks))


def test_journal_round_trip_c_python_c(rig) -> None:
    """C writes the journal, Python keeps the records before a torn one, and a new engine given
    that bitmap asks for exactly the chunks whose records were lost."""
    size = 12 * CHUNK
    r, fd, jfd, jpath, fp = _journaled_copy(rig, size)
    _, _, recs = journal.read_records(jfd)
    # Corrupt the 6th record's offset field: its check no longer matches, so it and every later
    # record are not trusted (a torn tail).
    bad = journal.HEADER_SIZE + 5 * te.JOURNAL_RECORD_LEN + _engine.JOURNAL_RECORD_OFFSET
    _flip(jpath, bad)
    _, _, kept = journal.read_records(jfd)
    assert kept == recs[:5]
    done = _verified(r, jfd, fp, size)
    assert done == sorted(off // CHUNK for off, _, _ in recs[:5])
    rx2 = te.Receiver("127.0.0.1", 0, os.urandom(te.TOKEN_LEN), CHUNK, 1 << 20, threads=0)
    try:
        rx2.add_file(7, fd, -1, size, journal.bitmap(done, 12))
        want = [(i * CHUNK, CHUNK) for i in range(12) if i not in done]
        assert sorted(rx2.missing(7)) == want
    finally:
        rx2.close()
    # A complete journal's bitmap: the new engine reports the file done at once.
    rx3 = te.Receiver("127.0.0.1", 0, os.urandom(te.TOKEN_LEN), CHUNK, 1 << 20, threads=0)
    try:
        rx3.add_file(8, fd, -1, size, journal.bitmap(list(range(12)), 12))
        wait_for(lambda: ("file_done", 8) in rx3.events(), what="file_done of a complete bitmap")
    finally:
        rx3.close()


def _verified(r, jfd: int, fp: bytes, size: int) -> list[int]:
    """journal.verified_chunks on the copied file (it re-reads and re-hashes each chunk)."""
    rfd = os.open(r.files[1][1], os.O_RDONLY)
    try:
        return journal.verified_chunks(rfd, jfd, fp, size, CHUNK)
    finally:
        os.close(rfd)


def _flip(path: str, pos: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(pos)
        b = fh.read(1)
        fh.seek(pos)
        fh.write(bytes([b[0] ^ 0xFF]))
