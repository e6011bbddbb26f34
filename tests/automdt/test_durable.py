"""The durability contract (automdt.durable): exit 0 means on disk (--fsync end, the default), and
a rerun after a crash never trusts a file the crash may have emptied.

A power cut is injected as what it leaves behind: the receiver's marker from an earlier boot (the
machine restarted) and a completed destination file whose bytes are zeros with its size and mtime
kept (what a filesystem may show after losing data it had not written back)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from automdt import durable

MB = 1_000_000


def _tree(path, n=12, size=2 * MB):
    path.mkdir()
    for i in range(n):
        (path / f"f{i:02d}.bin").write_bytes(os.urandom(size))
    return path


def _env(tmp_path):
    return dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path), XDG_STATE_HOME=str(tmp_path / "state"))


def _transfer(src, dest, tmp_path, *extra, timeout=120):
    p = subprocess.run([sys.executable, "-m", "automdt", "transfer", str(src), str(dest), "--json", "--no-history",
                        *extra], capture_output=True, text=True, timeout=timeout, env=_env(tmp_path))
    return p.returncode, json.loads(p.stdout) if p.stdout.strip() else {}, p.stderr


def _completed(dest):
    return sorted(n for n in os.listdir(dest) if not n.startswith(".amdt-")) if dest.exists() else []


def _markers(dest):
    return sorted(n for n in os.listdir(dest) if n.startswith(durable.MARKER_PREFIX))


def _kill_midway(src, dest, tmp_path, at_least=3):
    """A transfer killed (SIGKILL) once ``at_least`` files are complete: the page cache keeps its
    data, as after any process crash."""
    proc = subprocess.Popen([sys.executable, "-m", "automdt", "transfer", str(src), str(dest), "--no-history", "-q",
                             "--threads", "1,1,1", "--throttle", "write.thread=4M"], env=_env(tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(_completed(dest)) < at_least and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert proc.poll() is None, "the transfer ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    done = _completed(dest)
    assert at_least <= len(done) < 12
    return done


def _power_cut(dest, victim):
    """What a power cut can leave: the markers claim an earlier boot, ``victim`` holds zeros."""
    for name in _markers(dest):
        path = dest / name
        info = json.loads(path.read_text())
        path.write_text(json.dumps(dict(info, boot_id="an-earlier-boot")))
    st = os.stat(dest / victim)
    with open(dest / victim, "r+b") as f:
        f.write(b"\0" * st.st_size)
    os.utime(dest / victim, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_default_run_leaves_no_marker_and_reports_on_disk(tmp_path):
    src = _tree(tmp_path / "src", n=3)
    code, summary, err = _transfer(src, tmp_path / "dest", tmp_path)
    assert code == 0, err
    assert _markers(tmp_path / "dest") == [] and len(_completed(tmp_path / "dest")) == 3


def test_a_rerun_after_a_power_cut_resends_what_was_at_risk_and_only_that(tmp_path):
    src, dest = _tree(tmp_path / "src"), tmp_path / "dest"
    early = sorted(os.listdir(src))[:4]
    (tmp_path / "first").mkdir()
    for name in early:
        os.link(src / name, tmp_path / "first" / name)
    code, _, err = _transfer(tmp_path / "first", dest, tmp_path)  # a run that reached its durable point
    assert code == 0, err
    time.sleep(durable.CLOCK_SLACK_NS / 1e9 + 0.2)
    done = _kill_midway(src, dest, tmp_path, at_least=len(early) + 3)
    assert _markers(dest), "the killed run left no marker"
    _power_cut(dest, sorted(set(done) - set(early))[0])
    code, summary, err = _transfer(src, dest, tmp_path)
    assert code == 0, err
    for name in os.listdir(src):
        assert (dest / name).read_bytes() == (src / name).read_bytes(), name
    assert summary["files_skipped"] == len(early)  # on disk before the crash: kept; the rest resent
    assert _markers(dest) == []
    code, summary, err = _transfer(src, dest, tmp_path)  # the next run trusts them all again
    assert code == 0 and summary["files_skipped"] == 12, err


def test_a_rerun_after_a_crash_without_power_loss_keeps_what_is_complete(tmp_path):
    src, dest = _tree(tmp_path / "src"), tmp_path / "dest"
    done = _kill_midway(src, dest, tmp_path)
    code, summary, err = _transfer(src, dest, tmp_path)
    assert code == 0, err
    assert summary["files_skipped"] == len(done)  # same boot: one syncfs makes them good, nothing resent
    assert _markers(dest) == []
    for name in os.listdir(src):
        assert (dest / name).read_bytes() == (src / name).read_bytes(), name


@pytest.mark.parametrize("mode", ["none", "file"])
def test_every_fsync_setting_resends_what_a_power_cut_may_have_lost(tmp_path, mode):
    src, dest = _tree(tmp_path / "src", n=4), tmp_path / "dest"
    code, _, err = _transfer(src, dest, tmp_path, "--fsync", mode)
    assert code == 0, err
    if mode == "none":  # no durable point: the marker stays until a later run of this boot syncs
        assert _markers(dest)
        _power_cut(dest, "f01.bin")
        code, summary, err = _transfer(src, dest, tmp_path, "--fsync", mode)
        assert code == 0, err
        assert (dest / "f01.bin").read_bytes() == (src / "f01.bin").read_bytes()
    else:  # every file was fsynced before its rename: nothing is at risk after the run
        assert _markers(dest) == []


def test_a_failed_write_back_is_not_success_and_the_rerun_resends_what_it_wrote(tmp_path, monkeypatch):
    """EIO from syncfs (injected): the run exits 7 naming the disk; the next run, whatever boot it
    runs in, resends every file the failed run wrote (a second syncfs would succeed over lost data)."""
    import errno

    from automdt.sender import TransferOptions, run_transfer

    src, dest = _tree(tmp_path / "src", n=4), tmp_path / "dest"

    def eio(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(durable, "syncfs", eio)
    summary = run_transfer(str(src), str(dest), TransferOptions(threads=(2, 2, 2)))
    assert summary.exit_code == 7
    assert any("did not reach the disk" in e and "Input/output error" in e for e in summary.errors), summary.errors
    assert _markers(dest)
    monkeypatch.undo()
    again = run_transfer(str(src), str(dest), TransferOptions(threads=(2, 2, 2)))
    assert again.exit_code == 0 and again.files_skipped == 0 and again.files_transferred == 4
    assert _markers(dest) == []


def _kill_with_a_partial(src, dest, tmp_path, opts):
    """A transfer killed (SIGKILL) once a partial holds 3 MiB (journaled chunks to resume)."""
    proc = subprocess.Popen([sys.executable, "-m", "automdt", "transfer", str(src), str(dest), "--no-history", "-q",
                             *opts, "--throttle", "write.thread=4M"], env=_env(tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            parts = [n for n in os.listdir(dest) if n.endswith(".part")] if dest.exists() else []
            if any(os.stat(dest / n).st_blocks * 512 >= 3 << 20 for n in parts):
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the transfer ended before it could be killed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert [n for n in os.listdir(dest) if n.endswith(".journal")], "the killed run left no journal"


def test_a_partial_written_after_the_last_durable_point_is_sent_whole(tmp_path):
    """Its journal may vouch for chunks the disk lost (after a failed write-back the page cache
    still holds them, and a re-hash would read the cache): after a power cut the rerun reuses
    none of it; after a crash of the process alone it resumes."""
    src, dest = _tree(tmp_path / "src", n=2, size=8 * MB), tmp_path / "dest"
    opts = ("--chunk-size", str(1 << 20), "--threads", "1,1,1")
    _kill_with_a_partial(src, dest, tmp_path, opts)
    code, summary, err = _transfer(src, dest, tmp_path, *opts)  # the same boot: resumed
    assert code == 0 and summary["bytes_reused"] > 0, summary
    for name in os.listdir(dest):
        (dest / name).unlink()
    _kill_with_a_partial(src, dest, tmp_path, opts)
    for name in _markers(dest):  # now the power went instead
        info = json.loads((dest / name).read_text())
        (dest / name).write_text(json.dumps(dict(info, boot_id="an-earlier-boot")))
    code, summary, err = _transfer(src, dest, tmp_path, *opts)
    assert code == 0, err
    assert summary["bytes_reused"] == 0 and summary["files_transferred"] == 2, summary
    for name in os.listdir(src):
        assert (dest / name).read_bytes() == (src / name).read_bytes(), name


def test_a_failed_fsync_is_not_retried_as_if_it_worked(tmp_path, monkeypatch):
    """--fsync file and EIO from the fsync before a rename (injected): that file is reported failed
    with the step named, never renamed, and its partial goes (Linux marks the pages clean after a
    failed write-back, so a resume would trust the cache); the next run sends it whole."""
    import errno

    from automdt import partial
    from automdt.sender import TransferOptions, run_transfer

    src, dest = _tree(tmp_path / "src", n=4), tmp_path / "dest"
    real_fsync, failed = os.fsync, []

    def flaky(fd):
        if not failed and os.fstat(fd).st_size == 2 * MB:  # the first file's data
            failed.append(fd)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_fsync(fd)

    monkeypatch.setattr(partial.os, "fsync", flaky)
    summary = run_transfer(str(src), str(dest), TransferOptions(threads=(1, 1, 1), fsync="file"))
    monkeypatch.undo()
    assert failed and summary.exit_code == 6, summary.errors
    assert any(": fsync: Input/output error" in e for e in summary.errors), summary.errors
    assert len(_completed(dest)) == 3
    assert not [n for n in os.listdir(dest) if n.startswith(".amdt-") and not n.startswith(durable.MARKER_PREFIX)]
    again = run_transfer(str(src), str(dest), TransferOptions(threads=(1, 1, 1), fsync="file"))
    assert again.exit_code == 0 and again.files_transferred == 1 and again.bytes_reused == 0
    for name in os.listdir(src):
        assert (dest / name).read_bytes() == (src / name).read_bytes(), name
