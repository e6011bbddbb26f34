"""Helpers shared by the tests (import as ``tests.util``)."""
import json
import os
import random
import socket
import subprocess
import sys
import threading

CHUNK = 64 * 1024


def write_file(path, size, seed=0):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rng = random.Random(seed)
    with open(path, "wb") as f:
        f.write(rng.randbytes(size))


def trees_identical(a, b):
    """Compare two trees with diff -r (an independent tool); returns (ok, diff output)."""
    p = subprocess.run(["diff", "-r", "--no-dereference", a, b], capture_output=True, text=True)
    return p.returncode == 0, p.stdout + p.stderr


def run_cli(*args, timeout=120, env=None, check_json=True, allow_internal_error=False):
    """Run `python -m automdt ...`; returns (exit code, parsed --json summary or None, stderr).

    Every run also checks that no user-reachable path printed an "internal error" (a bug's
    catch-all) or a traceback, unless ``allow_internal_error``."""
    if args and args[0] == "transfer" and "--threads" not in args and "--policy" not in args:
        args = args + ("--threads", "2,2,2")  # static counts unless the test is about policies
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([sys.executable, "-m", "automdt", *args], capture_output=True, text=True, timeout=timeout, env=e)
    if not allow_internal_error and "--debug" not in args:
        assert "internal error" not in p.stderr and "Traceback" not in p.stderr, p.stderr
    summary = None
    if check_json and "--json" in args and p.stdout.strip():
        summary = json.loads(p.stdout.strip().splitlines()[-1])
    return p.returncode, summary, p.stderr


class TcpTap:
    """A loopback TCP relay to ``target_port`` that records every byte its clients send."""

    def __init__(self, target_port: int) -> None:
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.target = target_port
        self.seen = bytearray()
        self.lock = threading.Lock()
        self.stop = False
        self.threads: list[threading.Thread] = []
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self.threads.append(t)

    def _accept(self) -> None:
        self.lsock.settimeout(0.1)
        while not self.stop:
            try:
                c, _ = self.lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            u = socket.create_connection(("127.0.0.1", self.target))
            for a, b, rec in ((c, u, True), (u, c, False)):
                t = threading.Thread(target=self._pipe, args=(a, b, rec), daemon=True)
                t.start()
                self.threads.append(t)

    def _pipe(self, a: socket.socket, b: socket.socket, record: bool) -> None:
        a.settimeout(0.1)
        try:
            while not self.stop:
                try:
                    d = a.recv(65536)
                except socket.timeout:
                    continue
                if not d:
                    break
                if record:
                    with self.lock:
                        self.seen += d
                b.sendall(d)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.stop = True
        self.lsock.close()
        for t in self.threads:
            t.join(5)
