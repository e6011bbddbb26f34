"""Case 2: SIGKILL of the sender, of a remote receiver, and of both, at seeded random points of a
throttled transfer, repeated; then resume: byte-identical trees, and the resumed run resends no
more than the journals left unverified plus one chunk per stream."""
import json
import os
import random
import signal
import subprocess
import time

import pytest

pytest.importorskip("automdt.transfer_engine._engine")

from automdt import errors  # noqa: E402
from tests.faults.helpers import (Outside, ReceiverProc, assert_final_names_ok, bytes_still_needed, cli,  # noqa: E402
                                  disk_bytes, partial_bytes, source_versions, temporaries, wait_for)
from tests.util import CHUNK, trees_identical  # noqa: E402

WRITE_THREADS = 2
NET_THREADS = 3
STREAMS = max(WRITE_THREADS, NET_THREADS)
FILES = {f"d{i % 2}/f{i}.bin": 40 * CHUNK + 777 * i for i in range(4)}  # ~10.5 MB, tails not chunk-aligned


def _sender(src, dest, secret, tmp_path, n, json_out=False, rate="3M", retries=0):
    args = ["transfer", src, dest, "--secret-file", str(secret), "--threads", f"2,{NET_THREADS},{WRITE_THREADS}",
            "--chunk-size", str(CHUNK), "--memory", "1Mi", "--timeout", "2", "--lock-file", str(tmp_path / "job.lock")]
    args += ["--json"] if json_out else ["-q", "--throttle", f"net.total={rate}"]
    if retries is not None:  # the killed runs do not retry (a retry would wait for the restarted receiver)
        args += ["--retries", str(retries)]
    out = open(tmp_path / "logs" / f"sender{n}.out", "w")
    err = open(tmp_path / "logs" / f"sender{n}.err", "w")
    try:
        return subprocess.Popen(cli(*args), stdout=out, stderr=err)
    finally:
        out.close()
        err.close()


def _kill(p):
    if p.poll() is None:
        os.kill(p.pid, signal.SIGKILL)
    p.wait(10)


def _receiver_dirs(tmp_path):
    """(destination root, secret file, log dir) of a receiver process, created under tmp_path."""
    root = tmp_path / "rroot"
    root.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("fault-suite-secret\n")
    secret.chmod(0o600)  # a secret open to others is refused
    logs = tmp_path / "logs"
    logs.mkdir()
    return root, secret, logs


def _run_kills(make_tree, tmp_path, victims, seed, files=FILES, rate="3M"):
    rng = random.Random(seed)
    src = make_tree(files)
    root, secret, logs = _receiver_dirs(tmp_path)
    dst = root / "job"
    rx = ReceiverProc(str(root), str(secret), str(logs))
    guard = Outside(tmp_path, [str(root), str(logs), str(tmp_path / "job.lock")])
    versions = source_versions(src)
    senders = []
    try:
        rx.start()
        for n, victim in enumerate(victims):
            before = disk_bytes(str(root))
            s = _sender(src, f"{rx.dest}/job", secret, tmp_path, n, rate=rate)
            senders.append(s)
            # a random point once this run is moving data
            assert wait_for(lambda: disk_bytes(str(root)) > before + 2 * CHUNK or s.poll() is not None, 30)
            time.sleep(rng.uniform(0.0, 1.2))
            assert s.poll() is None, f"run {n} ended before the kill: {(logs / f'sender{n}.err').read_text()}"
            if victim in ("receiver", "both"):
                rx.kill()
            if victim in ("sender", "both"):
                _kill(s)
            else:
                code = s.wait(30)  # the sender notices the dead receiver (control timeout 2 s)
                assert code == errors.NETWORK, (logs / f"sender{n}.err").read_text()
            if not rx.alive():
                rx.start()
            time.sleep(0.3)  # a surviving receiver drains what it had buffered
            assert_final_names_ok(str(dst), versions)
            need, unrecorded = bytes_still_needed(src, str(dst), CHUNK)
            # chunks written but not journaled: at most one per write thread (killed between pwrite and record)
            assert unrecorded <= WRITE_THREADS, unrecorded
            assert need > 0
        need, _ = bytes_still_needed(src, str(dst), CHUNK)
        final = _sender(src, f"{rx.dest}/job", secret, tmp_path, len(victims), json_out=True)
        senders.append(final)
        code = final.wait(120)
        err = (logs / f"sender{len(victims)}.err").read_text()
        assert code == 0, err
        summary = json.loads((logs / f"sender{len(victims)}.out").read_text().strip().splitlines()[-1])
        ok, diff = trees_identical(src, str(dst))
        assert ok, diff
        assert temporaries(str(dst)) == []
        # resent bytes: exactly what the journals did not prove, plus at most one chunk per stream
        assert need <= summary["bytes"] <= need + STREAMS * CHUNK, (need, summary)
        assert summary["bytes"] < sum(files.values())
        assert rx.alive()
        guard.check()
    finally:
        for s in senders:
            _kill(s)
        rx.kill()


@pytest.mark.parametrize("victims,seed", [
    (["sender", "sender"], 1),
    (["receiver"], 2),  # one round: the sender needs --timeout + 5 s to give up (repeated: the expensive case)
    (["both", "both"], 3),
], ids=["sender", "receiver", "both"])
def test_sigkill_at_random_points_then_resume(make_tree, tmp_path, victims, seed):
    _run_kills(make_tree, tmp_path, victims, seed)


@pytest.mark.expensive
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_sigkill_mixed_victims_many_rounds(make_tree, tmp_path, seed):
    rng = random.Random(seed)
    victims = [rng.choice(["sender", "receiver", "both"]) for _ in range(5)]
    files = {f"d{i % 3}/f{i}.bin": 40 * CHUNK + 999 * i for i in range(8)}  # ~21 MB at 2 MB/s
    _run_kills(make_tree, tmp_path, victims, seed, files=files, rate="2M")


def test_receiver_restarted_mid_transfer_gives_network_code_or_resumes(make_tree, tmp_path):
    src = make_tree(FILES)
    root, secret, logs = _receiver_dirs(tmp_path)
    rx = ReceiverProc(str(root), str(secret), str(logs))
    s = None
    try:
        rx.start()
        s = _sender(src, f"{rx.dest}/job", secret, tmp_path, 0, retries=None)  # default --retries
        assert wait_for(lambda: partial_bytes(str(root)) > 2 * CHUNK, 30)
        rx.kill()
        rx.start()  # back on the same port well within the sender's 2 s control timeout
        code = s.wait(30)
        err = (logs / "sender0.err").read_text()
        assert_final_names_ok(str(root / "job"), source_versions(src))
        assert code in (0, errors.NETWORK), f"exit {code}: {err}"
        if code == 0:  # resumed against the restarted receiver
            assert trees_identical(src, str(root / "job"))[0]
    finally:
        if s is not None:
            _kill(s)
        rx.kill()


def test_abandoned_session_never_renames_the_resumed_sessions_partial(tmp_path):
    """Sender A sends a whole small file into a slow-writing session and dies (no close); the
    resumed run B activates the same file before A's session wrote a chunk (so B starts the
    partial afresh) and sends nothing yet. Nothing wrong may ever appear under the final name."""
    import threading

    import zmq

    from automdt.receiver import ReceiverServer
    from tests.faults.helpers import FakeSender, read

    root = tmp_path / "root"
    root.mkdir()
    secret = b"abandoned-session"
    srv = ReceiverServer(str(root), "127.0.0.1", 0, secret=secret).start()
    ctx = zmq.Context()
    data = os.urandom(4 * CHUNK)
    entry = [{"id": 0, "path": "F", "size": len(data), "mtime_ns": 10**18}]
    wrong = []
    stop = threading.Event()

    def watch():
        p = root / "F"
        while not stop.is_set():
            try:
                c = read(str(p))
            except FileNotFoundError:
                c = None
            if c is not None and c != data:
                wrong.append(len(c.strip(b"\0")))
            time.sleep(0.005)

    th = threading.Thread(target=watch)
    th.start()
    a = FakeSender(ctx, srv.port, secret)
    b = FakeSender(ctx, srv.port, secret)
    try:
        a.handshake(write_throttle=[0, 100_000])  # A's session writes at 100 kB/s: 2.6 s for the file
        a.manifest(entry)
        a.activate([0])
        a.send_files({0: data})
        a.c.close()  # A is killed: its session stays until the idle timeout
        b.handshake()
        assert b.manifest(entry)["files"] == [[0, "send"]]
        acts = b.activate([0])["files"]
        time.sleep(3.5)  # A's session finishes writing its buffer meanwhile
        if acts[0][1] == "send":
            b.send_files({0: data})
        done, errs = b.wait_done([0], timeout=10)
    finally:
        stop.set()
        th.join(5)
        b.close()
        srv.stop()
        ctx.term()
    assert wrong == [], f"wrong content under the final name (non-zero bytes: {wrong[:3]}...)"
    assert errs == [] and (done == {0} or acts[0][1] == "done"), (acts, errs)
    assert read(str(root / "F")) == data


@pytest.mark.expensive
def test_hung_receiver_sigstop_then_sigcont(make_tree, tmp_path):
    """The receiver hangs (SIGSTOP) mid-transfer: the sender gives up within its bounded
    timeouts (exit 5, partials kept); after SIGCONT the same receiver serves the resume."""
    src = make_tree(FILES)
    root, secret, logs = _receiver_dirs(tmp_path)
    rx = ReceiverProc(str(root), str(secret), str(logs), extra=["--idle-timeout", "5"])
    s = None
    try:
        rx.start()
        s = _sender(src, f"{rx.dest}/job", secret, tmp_path, 0, retries=1)
        assert wait_for(lambda: partial_bytes(str(root)) > 4 * CHUNK, 30)
        os.kill(rx.proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        code = s.wait(60)
        took = time.monotonic() - t0
        # control timeout 2 s + close 5 s, retry sleep 2 s + hello 2 s, slack
        assert code == errors.NETWORK and took < 20, (code, took, (logs / "sender0.err").read_text())
        os.kill(rx.proc.pid, signal.SIGCONT)
        time.sleep(0.5)  # the continued receiver drains what it had buffered
        assert_final_names_ok(str(root / "job"), source_versions(src))
        need, _ = bytes_still_needed(src, str(root / "job"), CHUNK)
        final = _sender(src, f"{rx.dest}/job", secret, tmp_path, 1, json_out=True)
        assert final.wait(60) == 0, (logs / "sender1.err").read_text()
        summary = json.loads((logs / "sender1.out").read_text().strip().splitlines()[-1])
        assert trees_identical(src, str(root / "job"))[0]
        assert need <= summary["bytes"] <= need + STREAMS * CHUNK, (need, summary)
        assert rx.alive()
    finally:
        if rx.alive():
            os.kill(rx.proc.pid, signal.SIGCONT)
        if s is not None:
            _kill(s)
        rx.kill()
