"""A per-job lock so two cron runs of the same transfer never overlap (``flock``)."""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import tempfile
import time
from typing import Optional

from automdt import errors
from automdt.errors import AutomdtError


def job_key(src: str, dest: str, *extra: str) -> str:
    """The identity of a job: ``sha256(abspath(src), dest[, extra...])``, 32 hex digits.

    The job lock and the job history (:mod:`automdt.history`) are keyed by it. ``extra`` parts
    (e.g. a shard ``"3/8"``) make a different job of the same SRC and DEST; without them the key
    is what it always was.
    """
    ident = "\0".join((os.path.abspath(src), dest, *extra))
    return hashlib.sha256(ident.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def default_lock_path(src: str, dest: str, *extra: str) -> str:
    """``$XDG_RUNTIME_DIR/automdt/<job_key(src, dest, ...)>.lock`` (falls back to the temp dir)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return os.path.join(base, "automdt", f"{job_key(src, dest, *extra)}.lock")


class JobLock:
    """Exclusive advisory lock on a file, held for the life of the run.

    :param path: lock file (created if missing; never deleted, so the inode stays stable).
    :param wait_s: how long to wait for a busy lock (0: fail at once with exit code 13).
    """

    def __init__(self, path: str, wait_s: float = 0.0):
        self.path = path
        self.wait_s = wait_s
        self.fd: Optional[int] = None

    def __enter__(self) -> "JobLock":
        os.makedirs(os.path.dirname(self.path) or ".", mode=0o700, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise AutomdtError(f"{self.path}: cannot lock: {e.strerror}", errors.ERROR) from None
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise AutomdtError(f"another run holds the lock {self.path}; skipped", errors.LOCK_BUSY) from None
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the flock
            self.fd = None
