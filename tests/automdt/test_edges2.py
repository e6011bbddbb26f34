"""What a new user's first hour still met: destinations written as hosts that are none, permission
problems at the destination, and the small wording slips. Real processes, files and loopback
receivers; an unprivileged user is ``nobody`` (os.setuid in the child, when the tests run as root)."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("automdt.transfer_engine._engine")

from automdt import errors  # noqa: E402
from tests.util import run_cli, trees_identical, write_file  # noqa: E402


def _src(tmp_path):
    src = tmp_path / "src"
    write_file(str(src / "a.bin"), 3000, seed=1)
    write_file(str(src / "sub" / "b.bin"), 5000, seed=2)
    return str(src)


def _cli(*args, cwd=None, user=None, timeout=60):
    """``python -m automdt ARGS`` (as ``user``, a pwd entry, when given); the CompletedProcess."""
    pre = None
    env = dict(os.environ)
    if user is not None:
        def pre():
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
        env["HOME"] = "/nonexistent"
    p = subprocess.run([sys.executable, "-m", "automdt", *args], capture_output=True, text=True, timeout=timeout,
                       cwd=cwd, preexec_fn=pre, env=env)
    assert "Traceback" not in p.stderr and "internal error" not in p.stderr, p.stderr
    return p


# ------------------------------------------------------------------------------ DEST parsing
@pytest.mark.parametrize("dest,hint", [
    ("127.0.0.1:/run13", "127.0.0.1:5000/run13"),  # scp's HOST:/PATH, no port
    ("localhost:5077:run13", "did you mean localhost:5077/run13?"),
    ("dtn-in:run13", "dtn-in:5000/run13"),
    ("[::1]:/x", "no port"),
])
@pytest.mark.parametrize("cmd", ["transfer", "verify"])
def test_a_host_written_wrong_is_a_usage_error_and_creates_nothing(tmp_path, cmd, dest, hint):
    src = _src(tmp_path)
    work = tmp_path / "cwd"
    work.mkdir()
    p = _cli(cmd, src, dest, cwd=work)
    assert p.returncode == errors.USAGE, (p.returncode, p.stderr)
    line = p.stderr.strip()
    assert len(line.splitlines()) == 1 and hint in line and f"./{dest}" in line, line
    assert os.listdir(work) == []  # nothing created where an scp habit would have written


def test_a_colon_name_is_local_with_a_dot_slash(tmp_path):
    src = _src(tmp_path)
    work = tmp_path / "cwd"
    work.mkdir()
    for dest in ("./127.0.0.1:run13", "./host:5000"):
        p = _cli("transfer", src, dest, "--threads", "1,1,1", cwd=work)
        assert p.returncode == 0, p.stderr
        ok, diff = trees_identical(src, str(work / dest[2:]))
        assert ok, diff


def test_an_existing_directory_named_like_an_address_is_still_an_address(tmp_path):
    """host:PORT is always the receiver (as rsync's host:path is always remote): a directory that
    happens to have the name never turns a remote job into a local copy."""
    src = _src(tmp_path)
    work = tmp_path / "cwd"
    (work / "127.0.0.1:9").mkdir(parents=True)
    p = _cli("transfer", src, "127.0.0.1:9", "--retries", "0", cwd=work)
    assert p.returncode == errors.NETWORK, p.stderr
    assert os.listdir(work / "127.0.0.1:9") == []
