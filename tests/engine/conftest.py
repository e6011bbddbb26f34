"""Fixtures for the C transfer engine tests: real files, real loopback TCP, timed close."""
from __future__ import annotations

import os
import random
import threading
import time
from typing import Any, Callable, Iterable

import pytest

te = pytest.importorskip("automdt.transfer_engine", reason="the C engine is not built (make build)")

CLOSE_TIMEOUT_S = 15.0


def write_random(path: str, size: int, seed: int = 0) -> bytes:
    data = random.Random(seed).randbytes(size)
    with open(path, "wb") as fh:
        fh.write(data)
    return data


def close_with_timeout(engine: Any, timeout: float = CLOSE_TIMEOUT_S) -> None:
    """Close in a helper thread; fail loudly if close() hangs (a deadlock in the engine)."""
    t = threading.Thread(target=engine.close, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        pytest.fail(f"{type(engine).__name__}.close() hung for {timeout} s (deadlock?)")


def wait_for(pred: Callable[[], bool], timeout: float = 20.0, step: float = 0.005,
             what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


class Rig:
    """A Sender and a Receiver on loopback in this process, plus event bookkeeping."""

    def __init__(self, tmp: str, chunk: int, memory: int, threads: tuple[int, int, int],
                 sender_kw: dict[str, Any], receiver_kw: dict[str, Any],
                 register: Callable[[Any], None]) -> None:
        self.tmp = tmp
        self.chunk = chunk
        self.token = os.urandom(32)
        self.rx = te.Receiver("127.0.0.1", 0, self.token, chunk, memory, threads=threads[2], **receiver_kw)
        register(self.rx)
        if sender_kw.get("local") is True:  # the local link to this rig's receiver
            sender_kw = {**sender_kw, "local": self.rx}
        self.tx = te.Sender("127.0.0.1", self.rx.port, self.token, chunk, memory,
                            threads=(threads[0], threads[1]), **sender_kw)
        register(self.tx)
        self.rx_events: list[tuple[Any, ...]] = []
        self.tx_events: list[tuple[Any, ...]] = []
        self.fds: list[int] = []
        self.files: dict[int, tuple[str, str, bytes]] = {}

    def poll(self) -> None:
        self.rx_events += self.rx.events()
        self.tx_events += self.tx.events()

    def rx_kind(self, kind: str) -> list[tuple[Any, ...]]:
        self.poll()
        return [e for e in self.rx_events if e[0] == kind]

    def tx_kind(self, kind: str) -> list[tuple[Any, ...]]:
        self.poll()
        return [e for e in self.tx_events if e[0] == kind]

    def done_ids(self) -> set[int]:
        return {e[1] for e in self.rx_kind("file_done")}

    def open_dst(self, name: str, flags: int = os.O_CREAT | os.O_WRONLY) -> tuple[str, int]:
        path = os.path.join(self.tmp, name)
        fd = os.open(path, flags, 0o644)
        self.fds.append(fd)
        return path, fd

    def add(self, fid: int, size: int, seed: int | None = None, journal: bool = False,
            send: bool = True, ranges: Iterable[tuple[int, int]] | None = None,
            done_chunks: bytes | None = None) -> tuple[str, str, bytes]:
        """Create a source file, register its destination, queue it on the sender."""
        src = os.path.join(self.tmp, f"src{fid}")
        data = write_random(src, size, seed if seed is not None else fid)
        dst, fd = self.open_dst(f"dst{fid}")
        jfd = -1
        if journal:
            _, jfd = self.open_dst(f"dst{fid}.journal", os.O_CREAT | os.O_WRONLY | os.O_APPEND)
        self.rx.add_file(fid, fd, jfd, size, done_chunks)
        if send:
            self.tx.add_file(fid, src, size, os.stat(src).st_mtime_ns,
                             list(ranges) if ranges is not None else None)
        self.files[fid] = (src, dst, data)
        return src, dst, data

    def wait_done(self, ids: Iterable[int], timeout: float = 30.0) -> None:
        want = set(ids)
        wait_for(lambda: want <= self.done_ids(), timeout, what=f"file_done for {sorted(want)}")

    def assert_identical(self, fid: int) -> None:
        _src, dst, data = self.files[fid]
        with open(dst, "rb") as fh:
            got = fh.read()
        assert len(got) == len(data), f"file {fid}: {len(got)} bytes, expected {len(data)}"
        assert got == data, f"file {fid}: content differs"

    def close(self) -> None:
        close_with_timeout(self.tx)
        close_with_timeout(self.rx)
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


@pytest.fixture
def engines() -> Iterable[Callable[[Any], None]]:
    """register(engine): every registered engine is closed under a timeout at teardown."""
    opened: list[Any] = []
    yield opened.append
    for e in reversed(opened):
        close_with_timeout(e)


@pytest.fixture
def rig(tmp_path: Any, engines: Callable[[Any], None]) -> Iterable[Callable[..., Rig]]:
    """rig(chunk=..., memory=..., threads=(r, n, w), sender_kw={}, receiver_kw={}) -> Rig.
    ``sender_kw={"local": True}``: the sender hands chunks to the rig's receiver over the local link."""
    made: list[Rig] = []

    def make(chunk: int = 64 * 1024, memory: int = 4 << 20, threads: tuple[int, int, int] = (2, 2, 2),
             sender_kw: dict[str, Any] | None = None, receiver_kw: dict[str, Any] | None = None) -> Rig:
        d = tmp_path / f"rig{len(made)}"
        d.mkdir()
        r = Rig(str(d), chunk, memory, threads, sender_kw or {}, receiver_kw or {}, engines)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()
