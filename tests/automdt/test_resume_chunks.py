"""A resume keeps journaled work whatever chunk size the next run takes.

The partial files of an interrupted run carry journals written with that run's chunk size; the
next run may take another one (``--chunk-size``, or the job's history after a slow run picks 1 MiB
chunks). The journals' records are byte ranges: every chunk of the new size they cover is kept,
and the summary says how many bytes were reused (``bytes_reused``)."""
import json
import os
import signal
import struct
import subprocess
import sys
import time

import pytest
import xxhash

pytest.importorskip("automdt.transfer_engine._engine")

from automdt import journal  # noqa: E402
from automdt.partial import PartialFile  # noqa: E402
from automdt.paths import temp_names  # noqa: E402
from tests.faults.helpers import wait_for  # noqa: E402
from tests.util import CHUNK, run_cli, trees_identical, write_file  # noqa: E402


# ------------------------------------------------------------------------------ the journal itself
def _record(data: bytes, offset: int, length: int) -> bytes:
    """One journal record as the engine appends it (journal.RECORD, constants.h)."""
    head = struct.pack("<4sIQQ", journal.RECORD_MAGIC, length, offset,
                       xxhash.xxh3_64_intdigest(data[offset:offset + length]))
    return head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head))


def _partial(tmp_path, data: bytes, cs: int, chunks) -> tuple:
    """A partial of ``data`` opened with chunk size ``cs``, the chunks ``chunks`` written and
    journaled (as the engine would), then closed: what an interrupted run leaves."""
    d = tmp_path / "dst"
    d.mkdir(exist_ok=True)
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    f = PartialFile(1, "f.bin", ("f.bin",), len(data), 123, 0o644, "1:2")
    assert f.open(dfd, cs) == []
    for i in chunks:
        off = i * cs
        ln = min(cs, len(data) - off)
        os.pwrite(f.data_fd, data[off:off + ln], off)
        os.write(f.journal_fd, _record(data, off, ln))
    f.close()
    return dfd, d


def _reopen(dfd, size: int, cs: int):
    f = PartialFile(1, "f.bin", ("f.bin",), size, 123, 0o644, "1:2", partial=True)
    done = f.open(dfd, cs)
    f.close()
    return done


def test_a_smaller_chunk_size_keeps_every_journaled_byte(tmp_path):
    data = os.urandom(10 * CHUNK + 77)
    big = 4 * CHUNK
    dfd, _ = _partial(tmp_path, data, big, [0, 2])  # bytes [0, 4C) and [8C, 10C+77)
    try:
        done = _reopen(dfd, len(data), CHUNK)
        assert done == [0, 1, 2, 3, 8, 9, 10]
        # and the original size still sees its own chunks (the journal keeps its header)
        assert _reopen(dfd, len(data), big) == [0, 2]
    finally:
        os.close(dfd)


def test_a_larger_chunk_size_keeps_the_chunks_it_covers(tmp_path):
    data = os.urandom(12 * CHUNK)
    dfd, _ = _partial(tmp_path, data, CHUNK, [0, 1, 2, 3, 4, 5, 9])
    try:
        assert _reopen(dfd, len(data), 4 * CHUNK) == [0]  # [4C, 8C) lacks 6, 7; [8C, 12C) lacks 8, 10, 11
        assert _reopen(dfd, len(data), 2 * CHUNK) == [0, 1, 2]
    finally:
        os.close(dfd)


def test_a_changed_source_still_starts_afresh_at_any_chunk_size(tmp_path):
    data = os.urandom(8 * CHUNK)
    dfd, d = _partial(tmp_path, data, 4 * CHUNK, [0, 1])
    try:
        f = PartialFile(1, "f.bin", ("f.bin",), len(data), 999, 0o644, "1:2", partial=True)  # another mtime
        assert f.open(dfd, CHUNK) == []
        f.close()
        assert os.path.getsize(d / temp_names("f.bin")[1]) == journal.HEADER_SIZE  # a fresh journal
    finally:
        os.close(dfd)


def test_a_corrupt_journaled_range_is_not_reused(tmp_path):
    data = os.urandom(8 * CHUNK)
    dfd, d = _partial(tmp_path, data, 4 * CHUNK, [0, 1])
    try:
        with open(d / temp_names("f.bin")[0], "r+b") as fh:  # a byte of the second big chunk rots
            fh.seek(5 * CHUNK + 3)
            fh.write(bytes([data[5 * CHUNK + 3] ^ 1]))
        assert _reopen(dfd, len(data), CHUNK) == [0, 1, 2, 3]
    finally:
        os.close(dfd)


# ------------------------------------------------------------------------------ end to end
def _tree(tmp_path, n=3, size=40 * CHUNK):
    src = tmp_path / "src"
    for i in range(n):
        write_file(str(src / f"f{i}.bin"), size, seed=i)
    return str(src)


def _partial_bytes(dst) -> int:
    """Bytes the journals of ``dst``'s partial files vouch for (what a resume may reuse)."""
    total = 0
    for name in os.listdir(dst):
        if name.endswith(".journal"):
            jfd = os.open(os.path.join(dst, name), os.O_RDONLY)
            try:
                total += sum(ln for _, ln, _ in journal.read_records(jfd)[2])
            finally:
                os.close(jfd)
    return total


@pytest.mark.parametrize("first,second", [(4 * CHUNK, CHUNK), (CHUNK, 4 * CHUNK)], ids=["smaller", "larger"])
def test_resume_with_another_chunk_size_sends_only_what_is_missing(tmp_path, first, second):
    src = _tree(tmp_path)
    dst = tmp_path / "dst"
    total = 3 * 40 * CHUNK
    code, s1, err = run_cli("transfer", src, str(dst), "--json", "--chunk-size", str(first), "--memory", "1Mi",
                            "--throttle", "read.total=4M", "--max-duration", "1.2", "--no-history")
    assert code == 10, err
    journaled = _partial_bytes(dst)
    assert 0 < journaled < total, journaled
    code, s2, err = run_cli("transfer", src, str(dst), "--json", "--chunk-size", str(second), "--no-history")
    assert code == 0, err
    ok, diff = trees_identical(src, str(dst))
    assert ok, diff
    assert s2["bytes"] + s2["bytes_reused"] == s2["bytes_to_send"]  # (a file run 1 finished is skipped)
    # a smaller size reuses every journaled byte; a larger one all but the chunks across a gap's edge
    # (one file at most has an unjournaled gap inside it per write thread; 2 threads, 3 files)
    lost = 0 if second < first else 2 * 3 * second
    assert s2["bytes_reused"] >= journaled - lost, (s2, journaled)
    assert s2["bytes_reused"] > 0


def test_the_history_chunk_size_does_not_resend_an_interrupted_run(tmp_path):
    """The issue's case: a slow run with 4 MiB chunks is interrupted (SIGINT); the job's history
    then picks 1 MiB chunks for the next run, on a fast path. That run sends only what is missing,
    and its text summary says how much was already there."""
    src = _tree(tmp_path, n=3, size=128 * CHUNK)  # 3 x 8 MiB
    dst = tmp_path / "dst"
    p = subprocess.Popen([sys.executable, "-m", "automdt", "transfer", src, str(dst), "--threads", "2,2,2",
                          "--throttle", "read.thread=2M,read.total=4M", "--interval", "0.5", "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: dst.is_dir() and _partial_bytes(dst) >= 8 << 20, 30), "nothing journaled"
        time.sleep(0.6)  # a full interval after it, so the history records the slow rates
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, err
    assert json.loads(out.strip().splitlines()[-1])["start"]["chunk_bytes"] == 4 << 20
    journaled = _partial_bytes(dst)
    total = 3 * 128 * CHUNK
    code, s, err = run_cli("transfer", src, str(dst), "--json")
    assert code == 0, err
    assert s["start"]["chunk_bytes"] < 4 << 20, s["start"]  # the history's preference for a slow path
    assert s["bytes_reused"] >= journaled and s["bytes"] + s["bytes_reused"] == s["bytes_to_send"], (s, journaled)
    assert s["bytes"] < total - journaled + 1
    ok, diff = trees_identical(src, str(dst))
    assert ok, diff


def test_the_text_summary_says_what_was_reused(tmp_path):
    src = _tree(tmp_path, n=2)
    dst = tmp_path / "dst"
    code, _, err = run_cli("transfer", src, str(dst), "--chunk-size", str(CHUNK), "--memory", "1Mi",
                           "--throttle", "read.total=4M", "--max-duration", "1", "--no-history")
    assert code == 10, err
    p = subprocess.run([sys.executable, "-m", "automdt", "transfer", src, str(dst), "--threads", "2,2,2",
                        "--chunk-size", str(2 * CHUNK), "--no-history"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "already there from partial files" in p.stdout, p.stdout
