"""Case 4: a source file appended to or replaced during the transfer, and between runs:
detected, never spliced (every file under a final name is one whole version of its source)."""
import os
import threading
import time

import pytest

pytest.importorskip("automdt.transfer_engine._engine")

from automdt import errors  # noqa: E402
from automdt.sender import run_transfer  # noqa: E402
from tests.faults.chaos import ChaosProxy, Plan  # noqa: E402
from tests.faults.helpers import (Outside, assert_final_names_ok, journal_state, opts, partial_bytes, read,  # noqa: E402
                                  temporaries, wait_for)
from tests.util import CHUNK, trees_identical  # noqa: E402


def _replace(path, same_size_and_mtime=False, size=None):
    """Replace ``path`` by a new file (rename over it); returns (old, new) contents."""
    st = os.stat(path)
    old = read(path)
    new = os.urandom(len(old) if size is None else size)
    tmp = path + ".new"
    with open(tmp, "wb") as f:
        f.write(new)
    if same_size_and_mtime:
        assert len(new) == len(old)
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))  # as cp -p, rsync -t or tar x leave it
    else:
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a later version
    os.replace(tmp, path)
    return old, new


def _during(dst, action, min_partial=6 * CHUNK):
    """Run ``action`` in a thread once the destination holds some partial data."""
    out = {}

    def run():
        if wait_for(lambda: partial_bytes(dst) >= min_partial, 20):
            out["result"] = action()

    th = threading.Thread(target=run)
    th.start()
    return th, out


@pytest.mark.parametrize("how", ["appended", "truncated", "rewritten-in-place"])
def test_changed_during_transfer_is_detected_and_not_renamed(make_tree, tmp_path, how):
    src = make_tree({"grow.bin": 40 * CHUNK, "ok.bin": 2 * CHUNK})
    dst = str(tmp_path / "dst")
    guard = Outside(tmp_path, [dst, src])
    old = read(os.path.join(src, "grow.bin"))

    def append():
        p = os.path.join(src, "grow.bin")
        if how == "appended":
            with open(p, "ab") as f:
                f.write(b"appended while being read")
        elif how == "truncated":
            os.truncate(p, 20 * CHUNK)
        else:
            with open(p, "r+b") as f:  # same size, new bytes near the end (not read yet)
                f.seek(35 * CHUNK)
                f.write(os.urandom(100))

    th, out = _during(dst, append)
    s = run_transfer(src, dst, opts(threads=(1, 1, 1), throttle={"read": (0, 1.5e6)}))
    th.join(30)
    assert "result" in out, "the append happened after the transfer"
    assert s.exit_code == errors.SOURCE_CHANGED, s.errors
    assert any("grow.bin" in e for e in s.errors)
    assert not os.path.exists(os.path.join(dst, "grow.bin"))
    assert read(os.path.join(dst, "ok.bin")) == read(os.path.join(src, "ok.bin"))
    assert_final_names_ok(dst, {"ok.bin": [read(os.path.join(src, "ok.bin"))], "grow.bin": [old]})
    guard.check()
    # the next run picks up the new content
    s = run_transfer(src, dst, opts())
    assert s.exit_code == 0, s.errors
    assert trees_identical(src, dst)[0]


def test_vanished_before_it_is_read_is_reported(make_tree, tmp_path):
    src = make_tree({"a.bin": 40 * CHUNK, "z.bin": 3 * CHUNK})
    dst = str(tmp_path / "dst")
    guard = Outside(tmp_path, [dst, src])
    th, out = _during(dst, lambda: os.unlink(os.path.join(src, "z.bin")))
    s = run_transfer(src, dst, opts(threads=(1, 1, 1), throttle={"read": (0, 1.5e6)}))
    th.join(30)
    assert "result" in out
    assert s.exit_code == errors.SOURCE_CHANGED, s.errors
    assert any("z.bin" in e for e in s.errors), s.errors
    assert not os.path.exists(os.path.join(dst, "z.bin"))
    assert read(os.path.join(dst, "a.bin")) == read(os.path.join(src, "a.bin"))
    guard.check()


def test_replaced_during_transfer_is_never_spliced(make_tree, tmp_path):
    src = make_tree({"r.bin": 40 * CHUNK, "ok.bin": 2 * CHUNK})
    dst = str(tmp_path / "dst")
    guard = Outside(tmp_path, [dst, src])
    p = os.path.join(src, "r.bin")
    th, out = _during(dst, lambda: _replace(p))
    s = run_transfer(src, dst, opts(threads=(1, 1, 1), throttle={"read": (0, 1.5e6)}))
    th.join(30)
    assert "result" in out, "the replacement happened after the transfer"
    old, new = out["result"]
    assert s.exit_code in (0, errors.SOURCE_CHANGED), s.errors
    assert_final_names_ok(dst, {"ok.bin": [read(os.path.join(src, "ok.bin"))], "r.bin": [old, new]})
    guard.check()
    s = run_transfer(src, dst, opts())
    assert s.exit_code == 0 and trees_identical(src, dst)[0], s.errors


def test_replaced_during_transfer_is_detected(make_tree, tmp_path):
    src = make_tree({"r.bin": 40 * CHUNK})
    dst = str(tmp_path / "dst")
    p = os.path.join(src, "r.bin")
    th, out = _during(dst, lambda: _replace(p))
    s = run_transfer(src, dst, opts(threads=(1, 1, 1), throttle={"read": (0, 1.5e6)}))
    th.join(30)
    assert "result" in out
    assert s.exit_code == errors.SOURCE_CHANGED, s.errors


def test_replaced_with_same_size_and_mtime_then_chunk_resent_is_never_spliced(make_tree, tmp_path):
    """8 chunks are read at once (buffer of 16) and the file closed; the data path is slow
    (0.5 MB/s); the source is replaced with same size and mtime; then frame 5 arrives corrupt
    (chaos proxy) and is re-sent: it must not come from the new file."""
    src = make_tree({"r.bin": 8 * CHUNK})
    dst = str(tmp_path / "dst")
    p = os.path.join(src, "r.bin")

    def later():
        time.sleep(0.15)  # the reader has read all 8 chunks by now
        return _replace(p, same_size_and_mtime=True)

    th, out = _during(dst, later, min_partial=0)
    with ChaosProxy([Plan("frames", frames=[5], frame_byte=3)]) as px:
        s = run_transfer(src, dst, opts(threads=(1, 1, 1), throttle={"net": (0, 5e5)}, data_endpoint_hook=px.hook))
    th.join(30)
    assert px.fired == 1 and "result" in out
    old, new = out["result"]
    assert s.exit_code in (0, errors.SOURCE_CHANGED), s.errors
    assert_final_names_ok(dst, {"r.bin": [old, new]})


@pytest.mark.parametrize("change", ["content", "appended", "truncated"])
def test_stale_partial_is_discarded_when_the_source_changed_between_runs(make_tree, tmp_path, change):
    src = make_tree({"r.bin": 40 * CHUNK + 5})
    dst = str(tmp_path / "dst")
    guard = Outside(tmp_path, [dst, src])
    p = os.path.join(src, "r.bin")
    s = run_transfer(src, dst, opts(throttle={"net": (0, 2e6)}, max_duration_s=0.8))
    assert s.exit_code == errors.MAX_DURATION, s.errors
    assert journal_state(src, dst, CHUNK)["r.bin"]["verified"], "no partial to go stale"
    if change == "content":
        _replace(p)  # same size, later mtime
    elif change == "appended":
        with open(p, "ab") as f:
            f.write(os.urandom(3 * CHUNK))
    else:
        _replace(p, size=20 * CHUNK)
    assert journal_state(src, dst, CHUNK)["r.bin"]["verified"] == set()  # the fingerprint no longer matches
    s = run_transfer(src, dst, opts())
    assert s.exit_code == 0, s.errors
    assert read(os.path.join(dst, "r.bin")) == read(p)
    assert s.bytes == os.path.getsize(p)  # nothing of the stale partial was reused
    assert temporaries(dst) == []
    guard.check()


def test_checksum_mode_never_resumes_a_partial_of_different_content(make_tree, tmp_path):
    src = make_tree({"r.bin": 40 * CHUNK})
    dst = str(tmp_path / "dst")
    p = os.path.join(src, "r.bin")
    s = run_transfer(src, dst, opts(throttle={"net": (0, 2e6)}, max_duration_s=0.8, checksum=True))
    assert s.exit_code == errors.MAX_DURATION, s.errors
    old, new = _replace(p, same_size_and_mtime=True)
    s = run_transfer(src, dst, opts(checksum=True))
    assert s.exit_code == 0, s.errors
    assert read(os.path.join(dst, "r.bin")) == new
