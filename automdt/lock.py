"""A per-job lock so two cron runs of the same transfer never overlap (``flock``)."""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
import tempfile
import time
from typing import Optional, Tuple

from automdt import errors
from automdt.errors import AutomdtError


LOCK_DIR = "automdt-locks"
"""Name of the default lock directory: never ``automdt``, which a Python session started in its
parent directory would import as a namespace package shadowing the real one."""


def job_key(src: str, dest: str, shard: Optional[Tuple[int, int]] = None) -> str:
    """The identity of a job: sha256 of SRC (absolute), DEST and, with ``--shard I/N``, the shard
    (each shard of a tree is its own job: its own lock, history and resume)."""
    ident = f"{os.path.abspath(src)}\0{dest}"
    if shard is not None:
        ident += f"\0shard={int(shard[0])}/{int(shard[1])}"
    return hashlib.sha256(ident.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def default_lock_path(src: str, dest: str, shard: Optional[Tuple[int, int]] = None) -> str:
    """``$XDG_RUNTIME_DIR/automdt-locks/<job_key>.lock``, or without ``XDG_RUNTIME_DIR``
    ``<temp dir>/automdt-locks-<uid>/...`` (one directory per user, mode 700)."""
    key = job_key(src, dest, shard)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = os.path.join(runtime, LOCK_DIR) if runtime else os.path.join(tempfile.gettempdir(), f"{LOCK_DIR}-{os.geteuid()}")
    return os.path.join(base, f"{key}.lock")


def _lock_dir(path: str) -> None:
    """Create the lock's directory (mode 700) if missing; refuse one that another user could
    swap the lock in (a symlink, or not ours and writable by others)."""
    d = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        st = os.lstat(d)
    except OSError as e:
        raise AutomdtError(f"{path}: cannot create the lock directory: {e.strerror}", errors.USAGE) from None
    if stat.S_ISLNK(st.st_mode) or (st.st_uid != os.geteuid() and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
        raise AutomdtError(f"{d}: lock directory is a symlink or writable by others; use --lock-file", errors.USAGE)


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
        _lock_dir(self.path)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise AutomdtError(f"{self.path}: cannot open the lock file: {e.strerror}", errors.USAGE) from None
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
