"""End-to-end transfers through the real engine, real TCP on loopback and the pyzmq control channel."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("automdt.transfer_engine._engine")

from automdt import errors  # noqa: E402
from automdt.sender import TransferOptions, run_transfer  # noqa: E402
from tests.util import CHUNK, run_cli, trees_identical  # noqa: E402


def opts(**kw):
    base = dict(threads=(2, 3, 2), memory=1 << 20, chunk_size=CHUNK, interval_s=0.2, timeout_s=20)
    base.update(kw)
    return TransferOptions(**base)


def test_edge_sizes_names_nesting_and_empties(make_tree, tmp_path):
    files = {
        "exact_chunk.bin": CHUNK, "chunk_plus_one.bin": CHUNK + 1, "chunk_minus_one.bin": CHUNK - 1,
        "one_byte": 1, "empty": 0, "with space/and ünïcødé ファイル.dat": 3 * CHUNK + 17,
        "/".join(f"d{i}" for i in range(25)) + "/deep.bin": 1000,
        "large/a.bin": 40 * CHUNK + 5, "large/b.bin": 33 * CHUNK,
    }
    src = make_tree(files, dirs=["empty_dir", "nested/empty/dir"])
    dst = str(tmp_path / "dst")
    s = run_transfer(src, dst, opts())
    assert s.exit_code == 0, s.errors
    ok, diff = trees_identical(src, dst)
    assert ok, diff
    assert s.files_transferred == len(files)
    assert s.bytes == sum(files.values())
    assert not [n for n in os.listdir(dst) if n.startswith(".amdt-")]
    # mtimes are kept, so a second run moves nothing
    s2 = run_transfer(src, dst, opts())
    assert s2.exit_code == 0 and s2.bytes == 0 and s2.files_skipped == len(files)


def test_thousands_of_small_files(make_tree, tmp_path):
    rng = random.Random(3)
    files = {f"s{i % 13}/f{i:05d}": rng.randint(0, 3000) for i in range(2500)}
    src = make_tree(files)
    dst = str(tmp_path / "dst")
    s = run_transfer(src, dst, opts(threads=(3, 3, 3)))
    assert s.exit_code == 0, s.errors
    assert s.files_transferred == len(files)
    assert trees_identical(src, dst)[0]


def test_checksum_mode_detects_same_size_same_mtime_changes(make_tree, tmp_path):
    src = make_tree({"a.bin": 5 * CHUNK, "b.bin": 1000})
    dst = str(tmp_path / "dst")
    assert run_transfer(src, dst, opts()).exit_code == 0
    # corrupt the destination copy but keep its size and mtime: size+mtime cannot see it
    p = os.path.join(dst, "a.bin")
    st = os.stat(p)
    with open(p, "r+b") as f:
        f.seek(100)
        f.write(b"X")
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert run_transfer(src, dst, opts()).files_skipped == 2
    s = run_transfer(src, dst, opts(checksum=True))
    assert s.files_transferred == 1 and s.files_skipped == 1
    assert trees_identical(src, dst)[0]


class ChurnPolicy:
    """Changes every thread count at every interval, including down to 1."""

    name = "churn"

    def __init__(self):
        self.rng = random.Random(11)
        self.calls = 0

    def reset(self, max_threads, seed=None):
        return (1, 1, 1)

    def act(self, obs):
        self.calls += 1
        return tuple(self.rng.choice([1, 1, 2, 5, 8]) for _ in range(3))


def test_thread_changes_during_transfer_keep_tree_identical(make_tree, tmp_path):
    src = make_tree({f"f{i}.bin": 20 * CHUNK + i for i in range(10)})
    dst = str(tmp_path / "dst")
    pol = ChurnPolicy()
    # throttled so the transfer lasts ~2 s and the policy acts many times
    s = run_transfer(src, dst, opts(policy=pol, interval_s=0.05, throttle={"read": (0, 7e6)}))
    assert s.exit_code == 0, s.errors
    assert pol.calls >= 10
    assert trees_identical(src, dst)[0]


@pytest.mark.parametrize("link", ["local", "tcp"])
def test_corrupt_chunks_on_the_wire_are_resent(make_tree, tmp_path, link):
    src = make_tree({"a.bin": 30 * CHUNK, "b.bin": 7 * CHUNK + 3})
    dst = str(tmp_path / "dst")
    s = run_transfer(src, dst, opts(fault_corrupt=4, local_link=link == "local"))
    assert s.exit_code == 0, s.errors
    assert s.link == link
    assert s.chunks_resent >= 4
    assert trees_identical(src, dst)[0]


@pytest.mark.parametrize("link", ["local", "tcp"])
def test_persistent_corruption_fails_with_integrity_code_and_renames_nothing(make_tree, tmp_path, link):
    src = make_tree({"a.bin": 3 * CHUNK})
    dst = str(tmp_path / "dst")
    s = run_transfer(src, dst, opts(fault_corrupt=10_000, chunk_retries=2, local_link=link == "local"))
    assert s.exit_code == errors.INTEGRITY
    assert s.integrity_failures >= 1
    assert not os.path.exists(os.path.join(dst, "a.bin"))


def test_a_local_destination_takes_the_local_link_unless_turned_off(make_tree, tmp_path):
    """The default command moves a local tree over the local link, --encrypt too (nothing leaves
    the process: no TLS, no --secret-file needed, and the summary says "encrypted": false);
    --switch local_link=0 takes loopback TCP, with TLS under --encrypt (and says so in the summary's
    start record). Every way gives the same tree."""
    src = make_tree({f"d/f{i}": 5 * CHUNK + i for i in range(5)} | {"one": 1})
    no_link = ("--switch", "local_link=0")
    for i, (extra, link, encrypted) in enumerate([((), "local", False), (no_link, "tcp", False),
                                                  (("--encrypt",), "local", False),
                                                  (no_link + ("--encrypt",), "tcp", True)]):
        dst = str(tmp_path / f"dst{i}")
        code, summary, err = run_cli("transfer", src, dst, "--json", "--chunk-size", str(CHUNK), *extra)
        assert code == 0, err
        assert (summary["link"], summary["encrypted"]) == (link, encrypted), extra
        assert summary["start"].get("switches") == ({"local_link": False} if no_link[0] in extra else None)
        assert err == ""  # no warning for a cron run
        assert trees_identical(src, dst)[0]


def test_interval_log_and_json_summary(make_tree, tmp_path):
    src = make_tree({f"f{i}": 10 * CHUNK for i in range(6)})
    dst = str(tmp_path / "dst")
    log = tmp_path / "log.jsonl"
    code, summary, err = run_cli("transfer", src, dst, "--json", "--threads", "2,2,2", "--chunk-size", str(CHUNK),
                                 "--memory", "1Mi", "--interval", "0.2", "--log", str(log),
                                 "--throttle", "net.total=3M")
    assert code == 0, err
    for key in ("files_transferred", "files_skipped", "files_failed", "bytes", "seconds", "bytes_per_second", "exit_code"):
        assert key in summary
    assert summary["bytes"] == 60 * CHUNK and summary["files_transferred"] == 6
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    start, lines = lines[0], lines[1:]  # the first line says where the thread counts started
    assert start["start"] == {"threads": {"read": 2, "net": 2, "write": 2}, "source": "policy", "chunk_bytes": CHUNK}
    assert start["policy"] == "static:2,2,2" and summary["start"] == start["start"]
    assert len(lines) >= 3
    rec = lines[1]
    assert set(rec["threads"]) == {"read", "net", "write"} and set(rec["throughput"]) == {"read", "net", "write"}
    assert 0.0 <= rec["buffer"]["sender"] <= 1.0 and 0.0 <= rec["buffer"]["receiver"] <= 1.0
    assert "cpu" in rec
    # the net stage was throttled to 3 MB/s in total: measured rates must agree
    mid = [x["throughput"]["net"] for x in lines[1:-1]]
    assert 1.5e6 < sorted(mid)[len(mid) // 2] < 3.6e6


def test_user_errors_are_one_line_with_codes(tmp_path):
    code, _, err = run_cli("transfer", str(tmp_path / "nope"), str(tmp_path / "d"))
    assert code == errors.DIR_NOT_FOUND and err.strip().count("\n") == 0 and "nope" in err
    src = tmp_path / "s"
    src.mkdir()
    (src / "x").write_bytes(b"x")
    code, _, err = run_cli("transfer", str(src), "127.0.0.1:1/sub", "--timeout", "2", "--retries", "0")
    assert code == errors.NETWORK and "Traceback" not in err
    code, _, err = run_cli("transfer", str(src), str(tmp_path / "d"), "--throttle", "disk.x=1")
    assert code == errors.USAGE and "bad throttle" in err
    code, _, err = run_cli("receive", "--listen", "0.0.0.0:0", "--root", str(tmp_path))
    assert code == errors.USAGE and "secret" in err


@pytest.fixture
def receiver_proc(tmp_path):
    """Start `automdt receive` on a free port; yields (port, root, restart)."""
    procs = []
    root = tmp_path / "rroot"
    root.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("s3cret-for-tests\n")
    secret.chmod(0o600)  # a secret open to others is refused

    def start(port=0):
        import socket

        if not port:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            s.close()
        p = subprocess.Popen([sys.executable, "-m", "automdt", "receive", "--listen", f"127.0.0.1:{port}",
                              "--root", str(root), "--secret-file", str(secret)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(p)
        time.sleep(0.8)
        return p, port

    yield start, root, secret
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def test_remote_receiver_with_secret_and_wrong_secret(make_tree, receiver_proc, tmp_path):
    start, root, secret = receiver_proc
    p, port = start()
    src = make_tree({"a.bin": 9 * CHUNK + 1, "sub/b.txt": 10})
    code, summary, err = run_cli("transfer", src, f"127.0.0.1:{port}/into/here", "--json", "--secret-file", str(secret),
                                 "--chunk-size", str(CHUNK), "--memory", "1Mi")
    assert code == 0, err
    assert trees_identical(src, str(root / "into" / "here"))[0]
    bad = tmp_path / "bad"
    bad.write_text("wrong")
    bad.chmod(0o600)
    code, _, err = run_cli("transfer", src, f"127.0.0.1:{port}/other", "--json", "--secret-file", str(bad))
    assert code == errors.FATAL and "authentication" in err
    code, _, err = run_cli("transfer", src, f"127.0.0.1:{port}/other", "--json")
    assert code == errors.FATAL and "secret" in err
    assert not (root / "other").exists()
    # still serving after the refusals
    code, _, err = run_cli("transfer", src, f"127.0.0.1:{port}/again", "--json", "--secret-file", str(secret))
    assert code == 0, err
    assert p.poll() is None


def _kill_when_partial(proc, root, min_bytes, timeout=30):
    """SIGKILL proc once some partial data is on disk under root."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        total = 0
        for dp, _, fs in os.walk(root):
            for f in fs:
                if f.endswith(".part"):
                    try:
                        total += os.stat(os.path.join(dp, f)).st_blocks * 512
                    except FileNotFoundError:
                        pass
        if total >= min_bytes:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)


def test_sigkill_sender_then_resume_without_resending_recorded_chunks(make_tree, tmp_path):
    files = {f"f{i}.bin": 64 * CHUNK for i in range(4)}
    src = make_tree(files)
    dst = tmp_path / "dst"
    args = [sys.executable, "-m", "automdt", "transfer", src, str(dst), "--threads", "2,2,2", "--chunk-size", str(CHUNK),
            "--memory", "1Mi", "--throttle", "read.total=4M", "-q"]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _kill_when_partial(p, dst, 2 << 20)
    # no file appeared under its final name unverified
    for name in files:
        fp = dst / name
        if fp.exists():
            assert fp.read_bytes() == (tmp_path / os.path.basename(src) / name).read_bytes()
    code, summary, err = run_cli("transfer", src, str(dst), "--json", "--threads", "2,2,2", "--chunk-size", str(CHUNK),
                                 "--memory", "1Mi")
    assert code == 0, err
    assert trees_identical(src, str(dst))[0]
    assert summary["bytes"] < sum(files.values()) - (1 << 20), summary  # the recorded chunks were not resent


def test_sigkill_remote_receiver_then_resume(make_tree, receiver_proc, tmp_path):
    start, root, secret = receiver_proc
    p, port = start()
    files = {f"f{i}.bin": 64 * CHUNK for i in range(3)}
    src = make_tree(files)
    args = [sys.executable, "-m", "automdt", "transfer", src, f"127.0.0.1:{port}/x", "--threads", "2,2,2", "--secret-file", str(secret),
            "--chunk-size", str(CHUNK), "--memory", "1Mi", "--throttle", "write.total=3M", "-q", "--timeout", "3", "--retries", "0"]
    sender = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _kill_when_partial(p, root, 1 << 20)
    code = sender.wait(60)
    assert code == errors.NETWORK
    start(port)
    code, summary, err = run_cli("transfer", src, f"127.0.0.1:{port}/x", "--json", "--secret-file", str(secret),
                                 "--chunk-size", str(CHUNK), "--memory", "1Mi")
    assert code == 0, err
    assert trees_identical(src, str(root / "x"))[0]
    assert summary["bytes"] < sum(files.values())


def test_hostile_manifest_is_refused(tmp_path):
    import zmq

    from automdt import protocol
    from automdt.receiver import ReceiverServer

    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    srv = ReceiverServer(str(root), "127.0.0.1", 0, secret=None).start()
    ctx = zmq.Context()
    try:
        for name in ["../x", "/etc/x", "a/../../x", "a\x00b", "x" * 300]:
            c = protocol.ControlClient(ctx, "127.0.0.1", srv.port, timeout_s=5)
            c.request({"type": "hello", "version": protocol.VERSION, "nonce": "n"})
            c.request({"type": "auth"})
            c.request({"type": "open", "chunk_size": CHUNK, "memory": 1 << 20})
            with pytest.raises(errors.AutomdtError) as ei:
                c.request({"type": "manifest", "files": [{"id": 0, "path": name, "size": 1, "mtime_ns": 0}]})
            assert ei.value.code == errors.FILES_FAILED and "unsafe name" in ei.value.message
            c.close()
    finally:
        srv.stop()
        ctx.term()
    assert list(outside.iterdir()) == [] and [p.name for p in root.iterdir()] == []


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_full_destination_reported_and_completes_after_space_is_freed(make_tree, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount tmpfs")
    try:
        filler = mnt / "filler"
        src = make_tree({"a.bin": 24 * CHUNK, "b.bin": 8 * CHUNK})
        filler.write_bytes(b"\0" * (3 << 20))
        s = run_transfer(src, str(mnt), opts())
        assert s.exit_code == errors.FATAL, s.errors
        assert any("space" in e for e in s.errors), s.errors
        assert not (mnt / "a.bin").exists()
        filler.unlink()
        s = run_transfer(src, str(mnt), opts())
        assert s.exit_code == 0, s.errors
        os.unlink(mnt / "filler") if (mnt / "filler").exists() else None
        assert (mnt / "a.bin").read_bytes() == open(os.path.join(src, "a.bin"), "rb").read()
        # the disk fills up while the transfer runs: the engine's write error ends the run
        src2 = make_tree({"c.bin": 20 * CHUNK})
        (mnt / "a.bin").unlink()
        (mnt / "b.bin").unlink()
        import threading

        def fill():
            time.sleep(0.4)
            with open(mnt / "filler2", "wb") as f:
                try:
                    f.write(b"\0" * (4 << 20))
                except OSError:
                    pass

        th = threading.Thread(target=fill)
        th.start()
        s = run_transfer(src2, str(mnt / "later"), opts(throttle={"write": (0, 1e6)}))
        th.join()
        assert s.exit_code == errors.FATAL, s.errors
        assert any("No space left" in e for e in s.errors), s.errors
        assert not (mnt / "later" / "c.bin").exists()
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def test_source_file_changing_during_read_is_detected(make_tree, tmp_path):
    src = make_tree({"grow.bin": 40 * CHUNK, "ok.bin": 2 * CHUNK})
    dst = tmp_path / "dst"
    args = [sys.executable, "-m", "automdt", "transfer", src, str(dst), "--json", "--threads", "1,1,1",
            "--chunk-size", str(CHUNK), "--memory", "1Mi", "--throttle", "read.total=1M"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # once the file is being read (its partial exists): a fixed sleep raced the start-up under load
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (dst.exists() and any(n.endswith(".part") for n in os.listdir(dst))):
        time.sleep(0.02)
    time.sleep(0.2)
    with open(os.path.join(src, "grow.bin"), "ab") as f:
        f.write(b"more data")
    out, err = p.communicate(timeout=60)
    assert p.returncode == errors.SOURCE_CHANGED, err
    assert "grow.bin" in err
    assert not (dst / "grow.bin").exists()
    assert (dst / "ok.bin").exists()


def test_demo_and_default_policy_transfer(tmp_path):
    """`automdt demo` (no --threads: the default controller drives a real transfer)."""
    from tests.util import trees_identical as same

    d = tmp_path / "demo"
    import subprocess as sp

    p = sp.run([sys.executable, "-m", "automdt", "demo", "--dir", str(d), "--size", "24Mi"],
               capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    assert "transferred" in p.stdout and "exit 0" in p.stdout
    n = int(p.stdout.split("sample dataset: ")[1].split(" files")[0])
    assert f"verified: {n} of {n} files identical" in p.stdout
    assert not d.exists(), "the demo leaves nothing behind without --keep"  # (make demo left 2.1 GB)
    p = sp.run([sys.executable, "-m", "automdt", "demo", "--dir", str(d), "--size", "2Mi", "--threads", "2,2,2",
                "--keep"], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    assert same(str(d / "src"), str(d / "dst"))[0]


def test_transfer_options_carry_the_controller_settings(make_tree, tmp_path):
    """``TransferOptions.controller_settings`` reaches the run's controller: the interval log's
    start record shows the settings given (no early intervals, no holds), and the defaults
    without them."""
    from automdt.agents.registry import make_policy
    from automdt.controller import ControllerSettings

    src = make_tree({"f": 3 * CHUNK})
    off = ControllerSettings(early_intervals=(), end_hold=False, warm_hold=False)
    for i, settings in enumerate((None, off)):
        log = tmp_path / f"log{i}.jsonl"
        opts = TransferOptions(policy=make_policy("ppo", max_threads=8), threads=(1, 1, 1), chunk_size=CHUNK,
                               max_threads=8, log_path=str(log), controller_settings=settings)
        assert run_transfer(src, str(tmp_path / f"dst{i}"), opts).exit_code == 0
        shown = json.loads(log.read_text().splitlines()[0])["controller"]
        want = (settings or ControllerSettings()).to_dict()
        assert {k: shown[k] for k in want} == want
        assert (shown["early_intervals_s"] == []) == (settings is off)
