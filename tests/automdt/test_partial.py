"""automdt.partial.PartialFile on its own: open (fresh or resumed), seal, close, rename, discard."""
import os

import pytest
import xxhash

from automdt import journal
from automdt.partial import PartialFile, missing_ranges, need_transfer
from automdt.paths import UnsafePath

CS = 4096


def _file(size=3 * CS, path="f.bin"):
    return PartialFile(7, path, (path,), size, 1_600_000_000_000_000_000, 0o640, "1:2")


def _record(chunk: bytes, offset: int) -> bytes:
    """A journal record as the engine's write threads append it (its last field hashes the rest)."""
    head = journal.RECORD.pack(journal.RECORD_MAGIC, len(chunk), offset, xxhash.xxh3_64_intdigest(chunk), 0)[:-8]
    return head + xxhash.xxh3_64_intdigest(head).to_bytes(8, "little")


@pytest.fixture
def dfd(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def test_fresh_open_then_resume_then_rename(tmp_path, dfd):
    f = _file()
    assert f.partial_bytes(dfd) == 0 and not f.partial
    assert f.open(dfd, CS) == [] and f.active
    tmp, jname = f.temp_names()
    assert os.path.getsize(tmp_path / tmp) == f.size
    assert (tmp_path / jname).read_bytes()[:8] == journal.HEADER_MAGIC
    chunk = os.urandom(CS)
    os.pwrite(f.data_fd, chunk, CS)  # chunk 1, as a write thread would, then its record
    os.write(f.journal_fd, _record(chunk, CS))
    assert f.close() is True and f.data_fd == f.journal_fd == -1 and not f.active
    assert f.close() is False

    g = _file()  # the next run: the plan sees the partial, activation resumes it
    assert g.partial_bytes(dfd) > 0 and g.partial
    done = g.open(dfd, CS)
    assert done == [1]
    assert missing_ranges(done, g.chunks(CS), CS, g.size) == [[0, CS], [2 * CS, CS]]
    g.seal(fsync=True)
    g.close()
    g.rename_into_place(dfd, fsync_dir=True)
    st = os.stat(tmp_path / "f.bin")
    assert (st.st_mode & 0o777, st.st_mtime_ns, st.st_size) == (0o640, g.mtime_ns, g.size)
    assert not (tmp_path / tmp).exists() and not (tmp_path / jname).exists()


def test_other_source_version_starts_afresh(tmp_path, dfd):
    f = _file()
    f.open(dfd, CS)
    chunk = os.urandom(CS)
    os.pwrite(f.data_fd, chunk, 0)
    os.write(f.journal_fd, _record(chunk, 0))
    f.close()
    g = _file()
    g.source_id = "1:3"  # replaced source file: another fingerprint
    g.partial_bytes(dfd)
    assert g.open(dfd, CS) == []
    g.close()


def test_planted_symlink_is_replaced_not_followed(tmp_path, dfd):
    target = tmp_path / "outside"
    target.write_bytes(b"keep")
    f = _file()
    tmp, jname = f.temp_names()
    os.symlink(target, tmp_path / tmp)
    assert f.partial_bytes(dfd) == 0 and f.partial  # something has the name: open() looks first
    assert f.open(dfd, CS) == []
    f.close()
    assert target.read_bytes() == b"keep" and not os.path.islink(tmp_path / tmp)
    f.discard(dfd)
    assert not (tmp_path / tmp).exists() and not (tmp_path / jname).exists()


def test_create_empty_and_need_transfer(tmp_path, dfd):
    f = _file(size=0, path="empty")
    assert need_transfer(dfd, f, checksum=False, digest=None)
    f.create_empty(dfd, fsync=False)
    assert os.path.getsize(tmp_path / "empty") == 0
    assert not need_transfer(dfd, f, checksum=False, digest=None)  # same size and mtime
    f.mtime_ns += 1
    assert need_transfer(dfd, f, checksum=False, digest=None)
    (tmp_path / "d").mkdir()
    with pytest.raises(UnsafePath):
        need_transfer(dfd, _file(path="d"), checksum=False, digest=None)
