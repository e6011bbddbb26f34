"""Per-file work of small files (issue 11): a file smaller than one chunk has no journal, the plan
lists each destination directory once instead of ``stat``ing two names per file. Real files,
real TCP, the in-process receiver of a local transfer."""
import os
import shutil

import pytest

pytest.importorskip("automdt.transfer_engine._engine")

from automdt import errors, session  # noqa: E402
from automdt.paths import temp_names  # noqa: E402
from automdt.sender import run_transfer  # noqa: E402
from tests.faults.helpers import opts, temporaries  # noqa: E402
from tests.util import CHUNK, trees_identical  # noqa: E402

SMALL = {f"s/f{i:02d}.bin": (CHUNK // 2 + i * 997) % CHUNK or 1 for i in range(24)}
BIG = {"big.bin": 20 * CHUNK + 3, "exact.bin": CHUNK}


def test_files_under_one_chunk_have_no_journal_and_are_rewritten_on_resume(make_tree, tmp_path):
    files = {**SMALL, **BIG}
    src = make_tree(files)
    dst = str(tmp_path / "dst")
    # stop part-way: every file is active (the window holds them all), few are complete
    s = run_transfer(src, dst, opts(throttle={"net": (0, 250e3)}, max_duration_s=0.8))
    assert s.exit_code == errors.MAX_DURATION, s.errors
    tmps = set(temporaries(dst))
    left = [rel for rel in SMALL if not os.path.exists(os.path.join(dst, rel))]
    assert left, "every small file completed before the stop; nothing tested"
    for rel in left:
        part, jname = temp_names(rel)
        d = os.path.dirname(rel)
        assert os.path.join(d, part) in tmps, (rel, tmps)   # its partial is there ...
        assert os.path.join(d, jname) not in tmps, rel      # ... without a journal
    for rel in BIG:  # a file of one chunk or more keeps its journal
        part, jname = temp_names(rel)
        assert os.path.exists(os.path.join(dst, rel)) or jname in tmps, (rel, tmps)
    assert temp_names("big.bin")[1] in tmps  # 20 chunks at 250 kB/s: not done in 0.8 s

    s = run_transfer(src, dst, opts())
    assert s.exit_code == 0, s.errors
    ok, diff = trees_identical(src, dst)
    assert ok, diff
    assert temporaries(dst) == []
    assert s.bytes < sum(files.values())  # the big file resumed from its journal


@pytest.mark.parametrize("budget", [session.LISTING_NAMES_MAX, 0], ids=["listed", "stat-each"])
def test_plan_by_listing_decides_as_stat_does(make_tree, tmp_path, monkeypatch, budget):
    """With one listing per directory (or, past the budget, a stat per name) the plan skips the
    same identical files, refuses a directory at a file's name, resumes a partial and removes an
    earlier run's journal left without its partial."""
    monkeypatch.setattr(session, "LISTING_NAMES_MAX", budget)
    files = {**SMALL, "a/big.bin": 12 * CHUNK + 5, "a/dir_here.bin": 100}
    src = make_tree(files)
    dst = str(tmp_path / "dst")
    same = sorted(SMALL)[::2]
    for rel in same:  # already there and identical (size and mtime): skipped
        os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
        shutil.copy2(os.path.join(src, rel), os.path.join(dst, rel))
    os.makedirs(os.path.join(dst, "a", "dir_here.bin"))  # a directory at a file's name: that file fails
    debris = os.path.join(dst, "s", temp_names(sorted(SMALL)[1])[1])
    with open(debris, "wb") as f:  # a journal whose partial is gone (an earlier run's)
        f.write(b"AMDTJRN1" + bytes(56))
    s = run_transfer(src, dst, opts(throttle={"net": (0, 400e3)}, max_duration_s=0.5))  # leaves big.bin partial
    assert s.exit_code in (errors.MAX_DURATION, errors.FILES_FAILED), s.errors
    big_part = os.path.join(dst, "a", temp_names("a/big.bin")[0])
    assert os.path.exists(big_part)
    s = run_transfer(src, dst, opts())
    assert s.exit_code == errors.FILES_FAILED, s.errors
    assert s.files_failed == 1 and any("dir_here.bin" in e and "directory" in e for e in s.errors), s.errors
    assert s.files_skipped >= len(same)
    assert s.bytes < 12 * CHUNK + sum(SMALL.values())  # big.bin resumed, skipped files not sent
    shutil.rmtree(os.path.join(dst, "a", "dir_here.bin"))
    os.unlink(os.path.join(src, "a", "dir_here.bin"))
    ok, diff = trees_identical(src, dst)
    assert ok, diff
    assert temporaries(dst) == [], temporaries(dst)  # the debris journal went with its file's rename
