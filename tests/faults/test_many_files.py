"""Case 7: tens of thousands of zero-byte files under a low open-files limit (ulimit -n 256):
exit 0, bounded memory, no descriptor leak, and a second run moves nothing."""
import contextlib
import json
import os
import resource
import subprocess
import sys

import pytest

pytest.importorskip("automdt.transfer_engine._engine")

from automdt.sender import run_transfer  # noqa: E402
from tests.faults.helpers import ReceiverProc, opts, temporaries, tmpfs  # noqa: E402
from tests.util import CHUNK, write_file  # noqa: E402

NOFILE = 256

CHILD = r"""
import gc, json, os, resource, sys, time
from automdt.sender import TransferOptions, run_transfer
src, dst = sys.argv[1], sys.argv[2]
def fds():
    return len(os.listdir("/proc/self/fd"))
o = dict(threads=(2, 2, 2), memory=1 << 20, chunk_size=65536, interval_s=0.5, timeout_s=60)
out = {"fds": [fds()], "runs": [], "seconds": []}
for _ in range(2):
    t = time.monotonic()
    s = run_transfer(src, dst, TransferOptions(**o))
    out["seconds"].append(time.monotonic() - t)
    gc.collect()
    out["fds"].append(fds())
    out["runs"].append(s.as_dict())
# VmHWM of this process's own memory: getrusage's ru_maxrss would also count the parent's
# resident set at fork time (Linux keeps the high-water mark across execve).
out["maxrss_kb"] = int([l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")][0])
out["nofile"] = resource.getrlimit(resource.RLIMIT_NOFILE)
print(json.dumps(out))
"""


def _low_nofile():
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


@contextlib.contextmanager
def _workdir(tmp_path):
    """A tmpfs when root (fast metadata on a shared disk), else tmp_path itself."""
    if os.geteuid() == 0:
        with tmpfs(str(tmp_path / "fs"), "256m") as mnt:
            yield mnt
    else:
        yield str(tmp_path)


def _make_empty_files(root, n, ndirs):
    for d in range(ndirs):
        os.makedirs(os.path.join(root, f"d{d:03d}"))
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(n):
            os.close(os.open(f"d{i % ndirs:03d}/f{i:06d}", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644, dir_fd=fd))
    finally:
        os.close(fd)


def _run_child(tmp_path, src, dst):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    p = subprocess.run([sys.executable, str(script), src, dst], capture_output=True, text=True, timeout=600,
                       preexec_fn=_low_nofile, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _count_files(root):
    n = 0
    for _, _, fns in os.walk(root):
        n += len(fns)
    return n


def _check_many(tmp_path, n, ndirs):
    with _workdir(tmp_path) as work:
        src, dst = os.path.join(work, "src"), os.path.join(work, "dst")
        _make_empty_files(src, n, ndirs)
        r = _run_child(tmp_path, src, dst)
        assert r["nofile"] == [NOFILE, NOFILE]
        first, second = r["runs"]
        assert first["exit_code"] == 0, first["errors"]
        assert first["files_transferred"] == n and first["bytes"] == 0
        assert second["exit_code"] == 0, second["errors"]
        assert second["files_skipped"] == n and second["files_transferred"] == 0 and second["bytes"] == 0
        # no descriptor leak: back to the count before the runs, and no growth between runs
        assert r["fds"][1] == r["fds"][0] and r["fds"][2] == r["fds"][0], r["fds"]
        # bounded memory: ~0.5 KiB per file measured (the manifest); allow 1.5 KiB per file over 100 MiB
        assert r["maxrss_kb"] < 100 * 1024 + 1.5 * n, r["maxrss_kb"]
        assert _count_files(dst) == n and temporaries(dst) == []
        return r


def test_20000_zero_byte_files_under_ulimit_256(tmp_path):
    _check_many(tmp_path, 20_000, 100)


def test_100000_zero_byte_files_under_ulimit_256(tmp_path):
    """~10-15 s on a tmpfs (as root); far slower on a busy disk without root."""
    _check_many(tmp_path, 100_000, 100)


def test_many_directories_under_ulimit_256(tmp_path):
    _check_many(tmp_path, 4_000, 400)


def test_receiver_daemon_under_ulimit_256_leaks_no_descriptor_across_sessions(tmp_path):
    with _workdir(tmp_path) as work:
        src = os.path.join(work, "src")
        _make_empty_files(src, 5_000, 50)
        for i in range(4):
            write_file(os.path.join(src, f"data{i}.bin"), 5 * CHUNK + i, seed=i)
        root = os.path.join(work, "root")
        os.mkdir(root)
        secret = tmp_path / "secret"
        secret.write_text("many-files-secret\n")
        secret.chmod(0o600)  # a secret open to others is refused
        rx = ReceiverProc(root, str(secret), str(tmp_path), preexec_fn=_low_nofile)
        try:
            rx.start()
            base = rx.fds()
            for i in range(3):
                dest = f"{rx.dest}/job{i % 2}"
                s = run_transfer(src, dest, opts(secret=b"many-files-secret"))
                assert s.exit_code == 0, s.errors
                if i == 2:  # the same job again: nothing moves
                    assert s.files_skipped == s.files_total and s.bytes == 0
            assert rx.alive()
            assert rx.fds() == base, (base, rx.fds())
        finally:
            rx.kill()


def test_tree_whose_directory_list_exceeds_the_message_cap(tmp_path):
    with _workdir(tmp_path) as work:
        src, dst = os.path.join(work, "src"), os.path.join(work, "dst")
        for c in range(600):  # 600 chains of 19 nested directories with ~200-byte names: ~19 MB of paths
            p = os.path.join(src, f"c{c:03d}")
            for k in range(18):
                p = os.path.join(p, "x" * 196 + f"{k:03d}")
            os.makedirs(p)
        with open(os.path.join(p, "leaf.txt"), "w") as f:
            f.write("leaf")
        s = run_transfer(src, dst, opts(timeout_s=2, retries=0))
        assert s.exit_code == 0, s.errors
        assert os.path.exists(os.path.join(dst, os.path.relpath(p, src), "leaf.txt"))
