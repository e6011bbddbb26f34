"""``automdt transfer --shard I/N``: the partition (deterministic, size-balanced, every file in
exactly one shard), the shard as part of the job identity (lock), a re-run of one shard, bad
values, and N shards from N network namespaces against N receivers over one shared destination."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from automdt import errors
from automdt.experiments.netns import netns_available
from automdt.lock import JobLock, default_lock_path, job_key
from automdt.manifest import FileEntry, parse_shard, scan, shard_manifest, shard_of
from tests.util import run_cli, trees_identical


def _entries(sizes):
    return [FileEntry(i, f"d{i % 3}/f{i:04d}", f"/x/{i}", s, 0, 0o644) for i, s in enumerate(sizes)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 1 << 30), max_size=300), st.integers(1, 16))
def test_partition_covers_every_file_once_and_is_balanced(sizes, n):
    files = _entries(sizes)
    which = shard_of(files, n)
    assert len(which) == len(files) and all(0 <= s < n for s in which)
    parts = [shard_manifest(scan_like(files), i, n).files for i in range(n)]
    paths = [f.path for p in parts for f in p]
    assert sorted(paths) == sorted(f.path for f in files)  # every file in exactly one shard
    loads = [sum(f.size for f in p) for p in parts]
    if files:
        # greedy largest-first: no shard exceeds another by more than the largest file
        assert max(loads) - min(loads) <= max(sizes)
        counts = [len(p) for p in parts]
        if not any(sizes):  # all empty: balanced by count
            assert max(counts) - min(counts) <= 1
    for p in parts:  # renumbered 0..k-1 in scan order
        assert [f.id for f in p] == list(range(len(p)))


def scan_like(files):
    from automdt.manifest import Manifest

    return Manifest([FileEntry(f.id, f.path, f.abspath, f.size, f.mtime_ns, f.mode) for f in files], [], [])


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text("abc/", min_size=1, max_size=6).filter(lambda p: "//" not in p),
                       st.integers(0, 10**6), max_size=60), st.integers(1, 8), st.randoms())
def test_partition_depends_only_on_paths_and_sizes(tree, n, rnd):
    """Another node lists the same tree in another order (and with other mtimes, inodes): the
    same files land in the same shards."""
    items = list(tree.items())
    a = [FileEntry(i, p, p, s, 1, 0o644) for i, (p, s) in enumerate(items)]
    rnd.shuffle(items)
    b = [FileEntry(i, p, "/elsewhere/" + p, s, 99, 0o600) for i, (p, s) in enumerate(items)]
    sa = dict(zip((f.path for f in a), shard_of(a, n)))
    sb = dict(zip((f.path for f in b), shard_of(b, n)))
    assert sa == sb


def test_partition_of_a_real_tree_is_the_same_on_two_copies(tmp_path, make_tree):
    sizes = {f"a/f{i:03d}.bin": (i * 7919) % 50_000 for i in range(120)}
    sizes.update({"big0": 400_000, "big1": 300_000, "b/empty": 0})
    one = make_tree(sizes)
    two = str(tmp_path / "copy")
    shutil.copytree(one, two)  # new inodes and mtimes, same paths and sizes
    for n in (2, 3, 5):
        for i in range(n):
            p1 = [f.path for f in shard_manifest(scan(one), i, n).files]
            p2 = [f.path for f in shard_manifest(scan(two), i, n).files]
            assert p1 == p2 and p1
    loads = [sum(f.size for f in shard_manifest(scan(one), i, 4).files) for i in range(4)]
    total = sum(sizes.values())
    assert max(loads) - min(loads) <= 50_000, loads  # within one small file
    assert sum(loads) == total


@pytest.mark.parametrize("text,ok", [("0/1", (0, 1)), ("3/4", (3, 4)), (" 1/2 ", (1, 2)), ("3/2", None),
                                     ("2/2", None), ("x", None), ("1", None), ("-1/2", None), ("1/0", None),
                                     ("a/b", None), ("1/2/3", None), ("", None)])
def test_parse_shard(text, ok):
    if ok is None:
        with pytest.raises(ValueError) as e:
            parse_shard(text)
        assert "--shard" in str(e.value) and "\n" not in str(e.value)
    else:
        assert parse_shard(text) == ok


@pytest.mark.parametrize("value,msg", [("3/2", "index must be in 0..1"), ("x", "expected I/N"),
                                       ("0/0", "at least 1")])
def test_bad_shard_is_one_line_exit_2(tmp_path, make_tree, value, msg):
    src = make_tree({"a": 10})
    code, _, err = run_cli("transfer", src, str(tmp_path / "d"), "--shard", value)
    assert code == errors.USAGE, err
    assert err.strip().count("\n") == 0 and msg in err and "Traceback" not in err
    assert not (tmp_path / "d").exists()


def test_shard_is_part_of_the_job_identity(tmp_path, make_tree):
    src = make_tree({f"f{i}": 1000 + i for i in range(6)})
    dst = str(tmp_path / "dst")
    assert job_key(src, dst) != job_key(src, dst, (0, 2)) != job_key(src, dst, (1, 2))
    assert job_key(src, dst, (0, 2)) != job_key(src, dst, (0, 3))
    # shard 0 is running (its lock held): shard 0 again is skipped (13), shard 1 runs
    with JobLock(default_lock_path(src, dst, (0, 2))):
        code, _, err = run_cli("transfer", src, dst, "--shard", "0/2", "--json")
        assert code == errors.LOCK_BUSY, err
        code, s1, err = run_cli("transfer", src, dst, "--shard", "1/2", "--json")
        assert code == 0, err
    code, s0, err = run_cli("transfer", src, dst, "--shard", "0/2", "--json")
    assert code == 0, err
    assert s0["shard"] == "0/2" and s1["shard"] == "1/2"
    assert s0["files_total"] + s1["files_total"] == 6
    assert trees_identical(src, dst)[0]


def test_rerun_of_one_shard_resumes_only_its_part(tmp_path, make_tree):
    src = make_tree({f"d/f{i:02d}": 20_000 + 997 * i for i in range(12)}, dirs=["empty"])
    dst = str(tmp_path / "dst")
    parts = {i: [f.path for f in shard_manifest(scan(src), i, 3).files] for i in range(3)}
    for i in range(3):
        code, s, err = run_cli("transfer", src, dst, "--shard", f"{i}/3", "--json")
        assert code == 0 and s["files_transferred"] == len(parts[i]), err
    assert trees_identical(src, dst)[0]
    lost0, lost1 = parts[0][0], parts[1][-1]
    os.unlink(os.path.join(dst, lost0))
    with open(os.path.join(dst, lost1), "r+b") as f:
        f.truncate(100)
    code, s, err = run_cli("transfer", src, dst, "--shard", "1/3", "--json")
    assert code == 0, err
    assert s["files_transferred"] == 1 and s["files_skipped"] == len(parts[1]) - 1
    assert not os.path.exists(os.path.join(dst, lost0))  # shard 0's file is shard 0's business
    code, s, err = run_cli("transfer", src, dst, "--shard", "0/3", "--json")
    assert code == 0 and s["files_transferred"] == 1, err
    assert trees_identical(src, dst)[0]


# --------------------------------------------------------------------------- N namespaces
N_SHARDS = 3
SECRET = b"amdt-i14-shard-secret"


def _sh(*cmd, check=True):
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check)


class _Pairs:
    """N pairs of network namespaces (sender i, receiver i), each pair joined by a veth."""

    def __init__(self, n):
        tag = f"{os.getpid() % 100000}"
        self.pairs = []
        for i in range(n):
            self.pairs.append({"snd": f"amdt-i14-s{i}-{tag}", "rcv": f"amdt-i14-r{i}-{tag}",
                               "if_s": f"i14s{i}x{tag}"[:15], "if_r": f"i14r{i}x{tag}"[:15],
                               "ip_s": f"10.214.{i}.1", "ip_r": f"10.214.{i}.2"})

    def __enter__(self):
        try:
            for p in self.pairs:
                for ns in (p["snd"], p["rcv"]):
                    _sh("ip", "netns", "add", ns)
                    _sh("ip", "-n", ns, "link", "set", "lo", "up")
                _sh("ip", "link", "add", p["if_s"], "netns", p["snd"], "type", "veth", "peer", "name", p["if_r"],
                    "netns", p["rcv"])
                _sh("ip", "-n", p["snd"], "addr", "add", p["ip_s"] + "/30", "dev", p["if_s"])
                _sh("ip", "-n", p["rcv"], "addr", "add", p["ip_r"] + "/30", "dev", p["if_r"])
                _sh("ip", "-n", p["snd"], "link", "set", p["if_s"], "up")
                _sh("ip", "-n", p["rcv"], "link", "set", p["if_r"], "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        for p in self.pairs:
            for ns in (p["snd"], p["rcv"]):
                _sh("ip", "netns", "del", ns, check=False)


@pytest.mark.netns
@pytest.mark.timeout(240)
def test_shards_from_separate_namespaces_into_one_shared_destination(tmp_path, make_tree):
    ok, why = netns_available()
    if not ok:
        pytest.skip(why)
    files = {f"run/big{i}.dat": 600_000 + 50_000 * i for i in range(5)}
    files.update({f"run/small/{i % 4}/s{i:03d}.bin": (i * 3571) % 30_000 for i in range(90)})
    src = make_tree(files, dirs=["run/empty-dir"])
    shared = tmp_path / "shared-dest"
    shared.mkdir()
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)  # a secret open to others is refused
    py = sys.executable
    receivers, senders = [], []
    port = 5214
    with _Pairs(N_SHARDS) as net:
        try:
            for p in net.pairs:  # N receivers, one shared root (a parallel file system's view)
                err = open(tmp_path / f"recv-{p['rcv']}.err", "w")
                receivers.append(subprocess.Popen(
                    ["ip", "netns", "exec", p["rcv"], py, "-m", "automdt", "receive", "--listen",
                     f"{p['ip_r']}:{port}", "--root", str(shared), "--secret-file", str(secret)],
                    stdout=subprocess.DEVNULL, stderr=err))
            deadline = time.monotonic() + 30
            for i, p in enumerate(net.pairs):
                while "receiving into" not in (tmp_path / f"recv-{p['rcv']}.err").read_text():
                    assert receivers[i].poll() is None, (tmp_path / f"recv-{p['rcv']}.err").read_text()
                    assert time.monotonic() < deadline, "receiver did not start"
                    time.sleep(0.05)
            env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
            for i, p in enumerate(net.pairs):  # all shards at once, each from its own namespace
                senders.append(subprocess.Popen(
                    ["ip", "netns", "exec", p["snd"], py, "-m", "automdt", "transfer", src,
                     f"{p['ip_r']}:{port}/data", "--shard", f"{i}/{N_SHARDS}", "--secret-file", str(secret),
                     "--threads", "2,2,2", "--json", "--metrics-file", str(tmp_path / f"shard{i}.prom")],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
            sums = []
            for s in senders:
                out, err = s.communicate(timeout=150)
                assert s.returncode == 0, err
                sums.append(json.loads(out.strip().splitlines()[-1]))
            # every receiver served exactly its own shard's session; nothing listens in another namespace
            for p in net.pairs:
                assert f"{p['ip_r']}:{port}" in _sh("ip", "netns", "exec", p["rcv"], "ss", "-Hltn").stdout
        finally:
            for proc in receivers + senders:
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait(5)
    left = _sh("ip", "netns", "list").stdout.split()  # ours gone (other people's may come and go)
    assert not [p[k] for p in net.pairs for k in ("snd", "rcv") if p[k] in left], left
    assert [s["shard"] for s in sums] == [f"{i}/{N_SHARDS}" for i in range(N_SHARDS)]
    assert sum(s["files_total"] for s in sums) == len(files)
    assert sum(s["bytes_total"] for s in sums) == sum(files.values())
    loads = [s["bytes_total"] for s in sums]
    assert max(loads) - min(loads) <= 700_000, loads  # size-balanced: within one large file
    ok, diff = trees_identical(src, str(shared / "data"))
    assert ok, diff
    for i in range(N_SHARDS):
        assert f'shard="{i}/{N_SHARDS}"' in (tmp_path / f"shard{i}.prom").read_text()
