"""A destination disk that fails during a transfer (tests.faults.crashdisk): every write and cache
flush answers EIO, ext4 cannot write its journal and goes read-only. The run stops with exit 7
naming what failed, never reports success, and once the disk works again (after a reboot) the
same command completes the destination."""
import json
import os
import subprocess
import time

import pytest

from tests.faults.crashdisk import CrashDisk, available, new_boot_prefix
from tests.faults.powerloss import _command, _env, make_source, tree_digests

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))


def _fault_during(cmd, state, at, fault):
    """Run ``cmd`` (a transfer), bring on ``fault`` ``at`` seconds in, wait for the exit: its code,
    stdout and stderr."""
    proc = subprocess.Popen(cmd, env=_env(state), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(at)
        assert proc.poll() is None, "the transfer ended before the fault"
        fault()
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


@pytest.mark.parametrize("fsync,fail_at", [("end", 1.0), ("file", 1.5)])
def test_a_disk_that_fails_mid_transfer_stops_the_run_and_the_rerun_repairs(tmp_path, fsync, fail_at):
    src = str(tmp_path / "src")
    digests = make_source(src)
    state = str(tmp_path / "state")
    with CrashDisk(str(tmp_path / "disk"), fs_mode="ordered") as disk:
        dest = os.path.join(disk.mount(), "dest")
        cmd = _command(src, dest, fsync, "4M")
        code, out, err = _fault_during(cmd, state, fail_at, disk.fail)
        summary = json.loads(out)
        assert code == 7 and summary["exit_code"] == 7, err
        assert "Read-only file system" in err or "Input/output error" in err, err
        assert summary["files_transferred"] < len(digests)
        assert "Traceback" not in err
        assert disk.stats()["failed"] > 0
        # the machine is repaired and restarted: what never reached the disk is gone
        disk.heal()
        disk.cut("flushed", 0)
        disk.reboot()
        rerun = subprocess.run(new_boot_prefix(state) + cmd, env=_env(state), capture_output=True, text=True,
                               timeout=180)
        assert rerun.returncode == 0, rerun.stderr
        assert tree_digests(dest) == digests


def _fill(path):
    """Write zeros to ``path`` until the filesystem is full (ENOSPC); returns the bytes written."""
    n, block = 0, b"\0" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                n += f.write(block)
            except OSError:
                break
    return n


@pytest.mark.parametrize("fill_at", [0.5, 1.2, 2.0])
def test_a_disk_that_fills_up_mid_transfer_stops_the_run_and_the_rerun_finishes(tmp_path, fill_at):
    """Another writer fills the destination's ext4 during the run: exit 7 with a one-line error
    naming what did not fit, nothing renamed that is not whole, the partials kept; once the space
    is freed, the same command finishes."""
    src = str(tmp_path / "src")
    digests = make_source(src)
    state = str(tmp_path / "state")
    with CrashDisk(str(tmp_path / "disk"), size=64 << 20, fs_mode="ordered") as disk:
        mnt = disk.mount()
        dest = os.path.join(mnt, "dest")
        cmd = _command(src, dest, "end", "3M")
        filler = os.path.join(mnt, "filler")
        code, out, err = _fault_during(cmd, state, fill_at, lambda: _fill(filler))
        summary = json.loads(out)
        assert code == 7, err
        assert "No space left on device" in err and "Traceback" not in err, err
        assert "MB free, this run has" in err and dest in err, err  # the space, where it ran out
        done = tree_digests(dest)
        assert all(digests[k] == v for k, v in done.items()), "a file under its final name is not whole"
        assert summary["files_transferred"] < len(digests)
        os.unlink(filler)
        rerun = subprocess.run(cmd, env=_env(state), capture_output=True, text=True, timeout=180)
        assert rerun.returncode == 0, rerun.stderr
        assert tree_digests(dest) == digests
        assert not [n for n in os.listdir(dest) if n.startswith(".amdt-") and n.endswith(".part")]
