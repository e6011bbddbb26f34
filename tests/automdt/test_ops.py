"""Cron-facing behaviour: dry run, verify, lock, summary file, log file."""
import json
import subprocess
import sys
import time

import pytest

pytest.importorskip("automdt.transfer_engine._engine")

from automdt import errors  # noqa: E402
from tests.util import CHUNK, run_cli, trees_identical  # noqa: E402


def test_dry_run_changes_nothing_and_lists_what_would_move(make_tree, tmp_path):
    src = make_tree({"a.bin": 3 * CHUNK, "d/e.txt": 0, "d/f.txt": 10})
    dst = tmp_path / "dst"
    code, s, err = run_cli("transfer", src, str(dst), "--json", "--dry-run", "--no-lock")
    assert code == 0, err
    assert sorted(s["dry_run_files"]) == ["a.bin", "d/e.txt", "d/f.txt"] and s["bytes"] == 0
    assert not dst.exists()
    dst.mkdir()
    code, s, err = run_cli("transfer", src, str(dst), "--json", "--dry-run", "--no-lock")
    assert code == 0 and s["bytes_to_send"] == 3 * CHUNK + 10
    assert list(dst.iterdir()) == []
    assert run_cli("transfer", src, str(dst), "--json", "--no-lock")[0] == 0
    code, s, err = run_cli("transfer", src, str(dst), "--json", "--dry-run", "--no-lock")
    assert s["files_skipped"] == 3 and s["dry_run_files"] == []


def test_verify_finds_silent_differences(make_tree, tmp_path):
    src = make_tree({"a.bin": 5 * CHUNK + 3, "b/c.bin": 100})
    dst = tmp_path / "dst"
    code, s, err = run_cli("transfer", src, str(dst), "--json", "--verify", "--no-lock", "--chunk-size", str(CHUNK))
    assert code == 0 and s["verified"] == 2, (err, s)
    code, out, err = run_cli("verify", src, str(dst), "--json")
    assert code == 0 and out["verified"] == 2
    p = dst / "a.bin"
    data = bytearray(p.read_bytes())
    data[CHUNK + 5] ^= 1
    p.write_bytes(bytes(data))
    (dst / "b" / "c.bin").unlink()
    code, out, err = run_cli("verify", src, str(dst), "--json")
    assert code == errors.INTEGRITY
    assert sorted(out["differences"]) == ["differs: a.bin", "missing: b/c.bin"]


def test_overlapping_runs_second_exits_lock_busy_at_once(make_tree, tmp_path):
    src = make_tree({"a.bin": 64 * CHUNK})
    dst = tmp_path / "dst"
    lock = tmp_path / "job.lock"
    first = subprocess.Popen([sys.executable, "-m", "automdt", "transfer", src, str(dst), "-q", "--threads", "2,2,2", "--lock-file", str(lock),
                              "--throttle", "read.total=1M", "--chunk-size", str(CHUNK)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        t0 = time.monotonic()
        code, _, err = run_cli("transfer", src, str(dst), "--lock-file", str(lock))
        assert code == errors.LOCK_BUSY and "lock" in err
        assert time.monotonic() - t0 < 3.0  # includes interpreter start-up
        # cron: --quiet says nothing on stderr for a skipped run, the summary file still tells
        summ = tmp_path / "skipped.json"
        code, _, err = run_cli("transfer", src, str(dst), "-q", "--lock-file", str(lock), "--summary-file", str(summ))
        assert code == errors.LOCK_BUSY and err == ""
        d = json.loads(summ.read_text())
        assert d["exit_code"] == errors.LOCK_BUSY and "lock" in d["errors"][0]
    finally:
        first.kill()
        first.wait(10)


def test_summary_and_log_files(make_tree, tmp_path):
    src = make_tree({"a.bin": 2 * CHUNK})
    dst = tmp_path / "dst"
    summ = tmp_path / "summary.json"
    logf = tmp_path / "automdt.log"
    code, _, err = run_cli("transfer", src, str(dst), "-q", "--no-lock", "--summary-file", str(summ),
                           "--log-file", str(logf), "--max-duration", "60")
    assert code == 0, err
    d = json.loads(summ.read_text())
    assert d["exit_code"] == 0 and d["files_transferred"] == 1
    assert trees_identical(src, str(dst))[0]
    # a run that fails writes its error to the log file too
    code, _, _ = run_cli("transfer", str(tmp_path / "missing"), str(dst), "-q", "--no-lock", "--log-file", str(logf))
    assert code == errors.DIR_NOT_FOUND
    text = logf.read_text()
    assert "transfer finished with exit code 0" in text
    assert "source not found (exit 3)" in text


def test_max_duration_stops_cleanly_and_next_run_resumes(make_tree, tmp_path):
    src = make_tree({"a.bin": 64 * CHUNK, "b.bin": 64 * CHUNK})
    dst = tmp_path / "dst"
    code, s, err = run_cli("transfer", src, str(dst), "--json", "--no-lock", "--max-duration", "1.5",
                           "--throttle", "read.total=2M", "--chunk-size", str(CHUNK))
    assert code == errors.MAX_DURATION, err
    assert 0 < s["bytes"] < 128 * CHUNK
    code, s2, err = run_cli("transfer", src, str(dst), "--json", "--no-lock", "--chunk-size", str(CHUNK))
    assert code == 0, err
    assert s2["bytes"] <= 128 * CHUNK - s["bytes"] + 4 * CHUNK
    assert trees_identical(src, str(dst))[0]
