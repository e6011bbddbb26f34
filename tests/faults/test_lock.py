"""Case 9 (what tests/automdt/test_ops.py does not cover): the job lock after a SIGKILL of its
holder, the default lock path for a remote destination, and the lock-busy exit measured against
the interpreter's own start-up time."""
import os
import signal
import subprocess
import time

import pytest

pytest.importorskip("automdt.transfer_engine._engine")

from automdt import errors  # noqa: E402
from tests.faults.helpers import ReceiverProc, cli, partial_bytes, wait_for  # noqa: E402
from tests.util import CHUNK, run_cli, trees_identical  # noqa: E402


def _startup_seconds():
    t0 = time.monotonic()
    subprocess.run(cli("exit-codes"), capture_output=True, timeout=60)
    return time.monotonic() - t0


def test_lock_of_a_killed_run_is_free_at_once_and_the_next_run_resumes(make_tree, tmp_path):
    src = make_tree({f"f{i}.bin": 32 * CHUNK for i in range(3)})
    dst = tmp_path / "dst"
    lock = tmp_path / "job.lock"
    args = ["transfer", src, str(dst), "--threads", "2,2,2", "--chunk-size", str(CHUNK), "--memory", "1Mi",
            "--lock-file", str(lock)]
    p = subprocess.Popen(cli(*args, "-q", "--throttle", "net.total=2M"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: partial_bytes(str(dst)) > 4 * CHUNK, 30)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    code, summary, err = run_cli(*args, "--json")
    assert code == 0, err
    assert 0 < summary["bytes"] < 96 * CHUNK
    assert trees_identical(src, str(dst))[0]


def test_default_lock_for_a_remote_job_second_run_exits_13_within_a_second(make_tree, tmp_path):
    src = make_tree({"a.bin": 64 * CHUNK})
    root = tmp_path / "root"
    root.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("lock-secret\n")
    secret.chmod(0o600)  # a secret open to others is refused
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(run_dir))  # the default lock lives here
    rx = ReceiverProc(str(root), str(secret), str(tmp_path))
    first = None
    try:
        rx.start()
        dest = f"{rx.dest}/job"
        base = ["transfer", src, dest, "--secret-file", str(secret), "--threads", "1,1,1", "--chunk-size", str(CHUNK)]
        first = subprocess.Popen(cli(*base, "-q", "--throttle", "net.total=1M"), env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_for(lambda: partial_bytes(str(root)) > 2 * CHUNK, 30)
        startup = _startup_seconds()
        t0 = time.monotonic()
        code, _, err = run_cli(*base, env={"XDG_RUNTIME_DIR": str(run_dir)})
        took = time.monotonic() - t0
        assert code == errors.LOCK_BUSY and "lock" in err, err  # (-q would say nothing: cron)
        assert took < startup + 1.0, (took, startup)
        assert first.poll() is None  # the first run is untouched
        assert [p.name for p in (run_dir / "automdt-locks").iterdir()]  # the lock is where the docs say
    finally:
        if first is not None and first.poll() is None:
            first.kill()
            first.wait(10)
        rx.kill()
