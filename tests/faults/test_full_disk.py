"""Case 3: the destination fills up in the middle of a file (small tmpfs): exit 7, the partial and
its journal kept; once space is freed the run completes without resending the journaled chunks."""
import os
import threading

import pytest

pytest.importorskip("automdt.transfer_engine._engine")

from automdt import errors  # noqa: E402
from automdt.sender import run_transfer  # noqa: E402
from tests.faults.helpers import (Outside, assert_final_names_ok, bytes_still_needed, journal_state, opts,  # noqa: E402
                                  partial_bytes, source_versions, temporaries, tmpfs, wait_for)
from tests.util import CHUNK, trees_identical  # noqa: E402

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")

SIZE = 40 * CHUNK + 123  # 2.6 MB on a 4 MiB tmpfs


def _fill(path, stop_at=None):
    """Write zeros to path until ENOSPC (or stop_at bytes)."""
    block = b"\0" * CHUNK
    n = 0
    with open(path, "wb", buffering=0) as f:
        while stop_at is None or n < stop_at:
            try:
                f.write(block if stop_at is None else block[:min(CHUNK, stop_at - n)])
            except OSError:
                break
            n += CHUNK
    return n


def _free(mnt):
    st = os.statvfs(mnt)
    return st.f_bavail * st.f_frsize


def _stop_part_way(src, dst, mnt, tmp_path):
    """Run 1: the disk fills once ~12 chunks are on it -> exit 7, partial and journal kept."""
    filler = os.path.join(mnt, "filler")

    def fill_when_started():
        wait_for(lambda: partial_bytes(dst) >= 12 * CHUNK, 20)
        _fill(filler)

    th = threading.Thread(target=fill_when_started)
    th.start()
    try:
        s = run_transfer(src, dst, opts(throttle={"write": (0, 1.5e6)}))
    finally:
        th.join(30)
    assert s.exit_code == errors.FATAL, s.errors
    assert any("No space left" in e for e in s.errors), s.errors
    assert not os.path.exists(os.path.join(dst, "big.bin"))
    tmps = temporaries(dst)
    assert [t for t in tmps if t.endswith(".part")] and [t for t in tmps if t.endswith(".journal")], tmps
    assert_final_names_ok(dst, source_versions(src))
    js = journal_state(src, dst, CHUNK)["big.bin"]
    assert len(js["verified"]) >= 10, js
    return filler, js


def test_enospc_mid_file_then_resume_does_not_resend_journaled_chunks(make_tree, tmp_path):
    src = make_tree({"big.bin": SIZE})
    mnt = str(tmp_path / "small")
    with tmpfs(mnt, "4m"):
        guard = Outside(tmp_path, [mnt])
        dst = os.path.join(mnt, "d")
        filler, js = _stop_part_way(src, dst, mnt, tmp_path)
        os.unlink(filler)
        need, _ = bytes_still_needed(src, dst, CHUNK)
        assert need == SIZE - js["verified_bytes"]
        s = run_transfer(src, dst, opts())
        assert s.exit_code == 0, s.errors
        ok, diff = trees_identical(src, dst)
        assert ok, diff
        assert temporaries(dst) == []
        assert need <= s.bytes <= need + 3 * CHUNK, (need, s.bytes)
        guard.check()


def test_resume_that_fits_in_the_free_space_is_not_refused(make_tree, tmp_path):
    src = make_tree({"big.bin": SIZE})
    mnt = str(tmp_path / "small")
    with tmpfs(mnt, "4m"):
        dst = os.path.join(mnt, "d")
        filler, js = _stop_part_way(src, dst, mnt, tmp_path)
        os.unlink(filler)
        need, _ = bytes_still_needed(src, dst, CHUNK)
        # leave room for what is missing (plus slack), but less than the whole file
        _fill(filler, stop_at=max(0, _free(mnt) - need - 6 * CHUNK))
        assert need + 4 * CHUNK < _free(mnt) < SIZE, (need, _free(mnt))
        s = run_transfer(src, dst, opts())
        assert s.exit_code == 0, s.errors
        assert open(os.path.join(dst, "big.bin"), "rb").read() == open(os.path.join(src, "big.bin"), "rb").read()
