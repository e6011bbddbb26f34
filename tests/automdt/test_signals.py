"""SIGINT/SIGTERM, once or twice, during start-up, transfer and shutdown: exit 130/143 (the first
signal's), the JSON summary on stdout and in --summary-file every time, never a traceback or an
"internal error", and nothing lost (a re-run completes the copy)."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("automdt.transfer_engine._engine")

from tests.faults.helpers import ReceiverProc, bytes_still_needed, wait_for  # noqa: E402
from tests.util import CHUNK, run_cli, trees_identical, write_file  # noqa: E402

SIG = {"INT": signal.SIGINT, "TERM": signal.SIGTERM}


def _tree(tmp_path, n=6, size=48 * CHUNK):
    src = tmp_path / "src"
    for i in range(n):
        write_file(str(src / f"d{i % 2}" / f"f{i}.bin"), size, seed=i)
    write_file(str(src / "empty.txt"), 0)
    return str(src)


def _start(src, dest, tmp_path, *extra):
    summ = tmp_path / "summary.json"
    ilog = tmp_path / "intervals.jsonl"
    args = [sys.executable, "-m", "automdt", "transfer", src, dest, "--json", "--summary-file", str(summ),
            "--log", str(ilog), "--threads", "2,2,2", "--chunk-size", str(CHUNK), "--no-lock", *extra]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), summ, ilog


def _catches_sigterm(pid):
    """The process has installed its SIGTERM handler (automdt's main has started)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    except OSError:
        pass
    return False


def _send(p, seq, gap=0.05):
    for name in seq:
        os.kill(p.pid, SIG[name])
        time.sleep(gap)


def _finish(p, summ, seq):
    out, err = p.communicate(timeout=60)
    want = 128 + SIG[seq[0]]
    assert p.returncode == want, (seq, p.returncode, err)
    assert "Traceback" not in err and "internal error" not in err, err
    assert all(line.startswith("automdt: ") for line in err.strip().splitlines()), err
    printed = json.loads(out.strip().splitlines()[-1])
    written = json.loads(summ.read_text())
    assert printed["exit_code"] == written["exit_code"] == want
    assert any("interrupted" in e for e in written["errors"]), written["errors"]
    return written


SEQS = [("INT",), ("TERM",), ("INT", "INT"), ("TERM", "TERM"), ("INT", "TERM"), ("TERM", "INT")]


@pytest.mark.parametrize("seq", [("INT",), ("TERM",), ("TERM", "INT")], ids="+".join)
def test_signal_during_start_up(seq, tmp_path):
    src = _tree(tmp_path, n=2)
    dst = tmp_path / "dst"
    p, summ, _ = _start(src, str(dst), tmp_path)
    assert wait_for(lambda: _catches_sigterm(p.pid), 20)
    _send(p, seq)
    s = _finish(p, summ, seq)
    assert s["bytes"] == 0 and s["files_transferred"] == 0
    assert run_cli("transfer", src, str(dst), "--no-lock")[0] == 0
    assert trees_identical(src, str(dst))[0]


@pytest.mark.parametrize("seq", SEQS, ids="+".join)
def test_signal_during_transfer(seq, tmp_path):
    src = _tree(tmp_path)
    dst = tmp_path / "dst"
    p, summ, ilog = _start(src, str(dst), tmp_path, "--throttle", "read.total=4M", "--interval", "0.5")
    assert wait_for(lambda: ilog.exists() and len(ilog.read_text().splitlines()) >= 2, 30)
    _send(p, seq)
    s = _finish(p, summ, seq)
    assert 0 < s["bytes"] < 6 * 48 * CHUNK
    # the journals were flushed: every chunk written is recorded (at most one per write thread not)
    need, unrecorded = bytes_still_needed(src, str(dst), CHUNK)
    assert unrecorded <= 2 and 0 < need < 6 * 48 * CHUNK, (need, unrecorded)
    code, s2, err = run_cli("transfer", src, str(dst), "--no-lock", "--json", "--chunk-size", str(CHUNK))
    assert code == 0, err
    assert s2["bytes"] <= need, (s2["bytes"], need)  # resumed, not restarted
    assert trees_identical(src, str(dst))[0]


class HoldingRelay:
    """A loopback TCP relay to ``port`` that holds the client's bytes once it sees ``marker``
    (until :meth:`release`): here the sender's final "close" on the control channel, so that
    the sender sits in its shutdown for as long as the test wants."""

    def __init__(self, port, marker=b'"type":"close"'):
        self.up, self.marker = port, marker
        self.holding, self.released, self.stop = threading.Event(), threading.Event(), threading.Event()
        self.ls = socket.create_server(("127.0.0.1", 0))
        self.ls.settimeout(0.1)
        self.port = self.ls.getsockname()[1]
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self):
        while not self.stop.is_set():
            try:
                c, _ = self.ls.accept()
            except OSError:
                continue
            u = socket.create_connection(("127.0.0.1", self.up))
            for a, b, hold in ((c, u, True), (u, c, False)):
                t = threading.Thread(target=self._pipe, args=(a, b, hold), daemon=True)
                t.start()
                self.threads.append(t)

    def _pipe(self, a, b, hold):
        a.settimeout(0.1)
        try:
            while not self.stop.is_set():
                try:
                    d = a.recv(65536)
                except socket.timeout:
                    continue
                if not d:
                    break
                if hold and self.marker in d and not self.holding.is_set():
                    self.holding.set()
                    self.released.wait(30)
                b.sendall(d)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    def release(self):
        self.released.set()

    def close(self):
        self.release()
        self.stop.set()
        self.ls.close()
        for t in self.threads:
            t.join(5)


@pytest.mark.parametrize("seq", [("INT",), ("TERM",), ("INT", "TERM")], ids="+".join)
def test_signal_during_shutdown(seq, tmp_path):
    src = _tree(tmp_path, n=3, size=4 * CHUNK)
    root = tmp_path / "root"
    root.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("signals-secret\n")
    secret.chmod(0o600)
    rx = ReceiverProc(str(root), str(secret), str(tmp_path))
    relay = None
    try:
        rx.start()
        relay = HoldingRelay(rx.port)
        p, summ, _ = _start(src, f"127.0.0.1:{relay.port}/job", tmp_path, "--secret-file", str(secret))
        assert relay.holding.wait(30), "the sender never reached its shutdown"
        _send(p, seq)
        time.sleep(0.3)  # the signals arrive while the sender waits for the receiver's "closed"
        relay.release()
        s = _finish(p, summ, seq)
        assert s["files_transferred"] == s["files_total"] == 4  # the data had all arrived
        assert trees_identical(src, str(root / "job"))[0]
    finally:
        if relay is not None:
            relay.close()
        rx.stop()


def test_signals_after_the_summary_change_nothing(tmp_path):
    """Signals that arrive once the summary is written (while the process reports and exits) neither
    kill it with a traceback nor contradict the summary's exit code."""
    src = _tree(tmp_path, n=2, size=4 * CHUNK)
    p, summ, _ = _start(src, str(tmp_path / "dst"), tmp_path)
    assert wait_for(lambda: summ.exists(), 30)
    for _ in range(20):
        if p.poll() is not None:
            break
        try:
            os.kill(p.pid, signal.SIGINT)
        except ProcessLookupError:
            break
        time.sleep(0.005)
    out, err = p.communicate(timeout=30)
    assert p.returncode == json.loads(summ.read_text())["exit_code"] == 0, (p.returncode, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
