"""What a power cut can take from a destination, and how the receiver makes sure a rerun sees it.

A file renamed into place is complete in the page cache; until the kernel writes it back, a power
cut can leave it empty, short or full of zeros, with its size and mtime already set, and a rerun
that trusts size and mtime would skip it. The receiver keeps two promises (the operator guide's
durability contract states them per ``--fsync`` setting):

* **A durable point.** With ``--fsync end`` (the default) the session's close runs ``syncfs`` on
  the destination's filesystem before the sender reports success: exit 0 means on disk. With
  ``file`` and ``dir`` every file is fsynced before its rename (and its directory after).
* **A mark while data is at risk.** Each session with ``--fsync end`` or ``none`` writes a marker
  ``.amdt-unsynced-<id>`` into its destination directory before it writes its first file
  (fsynced, with the machine's boot id and the time), and removes it at its durable point (the
  removal fsynced too). With ``file`` and ``dir`` nothing is at risk that a rerun could trust: a
  file is on disk before its name is, and a partial's chunks are re-hashed before a resume keeps
  them; such a session writes no marker. A later session that finds a marker of *this* boot knows no
  power was lost since: it runs ``syncfs`` and removes it. A marker of an *earlier* boot means a
  crash may have lost data written after its time: every destination file changed since then
  (its ctime) is sent again instead of being trusted by size and mtime, and the stale markers go
  at that session's durable point. The cost of a crash is the files completed after the last
  durable point, not the whole tree.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
from typing import Iterable, List, Optional, Tuple

MARKER_PREFIX = ".amdt-unsynced-"
"""Name prefix of a session's marker in its destination directory."""
CLOCK_SLACK_NS = 2_000_000_000
"""How much earlier than a marker's time a file's ctime may read and still count as changed after
it (the wall clock and the filesystem's timestamps are not one clock)."""

_libc: Optional[ctypes.CDLL] = None


def boot_id() -> str:
    """This boot's id (``/proc/sys/kernel/random/boot_id``; "" where there is none)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def syncfs(fd: int) -> None:
    """Write back everything cached for the filesystem that holds ``fd`` (``syncfs(2)``; where the
    C library has none, ``sync()``). A write-back error (EIO, ENOSPC) raises :class:`OSError`:
    Linux reports it once, so the caller must treat the data as lost, never retry as if it worked."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    fn = getattr(_libc, "syncfs", None)
    if fn is None:
        os.sync()
        return
    if fn(int(fd)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def write_marker(dfd: int, sid: str, time_ns: int, lost: bool = False) -> str:
    """Create this session's marker in the directory ``dfd`` (``time_ns``: when the session began
    to write) and make it durable (the file and the directory entry); returns its name. ``lost``:
    a write-back failed, so the marker claims no boot: the next session, whatever boot it runs
    in, re-checks every file changed since ``time_ns``."""
    name = MARKER_PREFIX + sid
    data = json.dumps({"boot_id": "" if lost else boot_id(), "time_ns": int(time_ns)}).encode()
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.fsync(dfd)
    return name


def read_markers(dfd: int, names: Iterable[str], skip: Iterable[str] = ()) -> List[Tuple[str, str, int]]:
    """The markers among ``names`` (a listing of ``dfd``), but those in ``skip``: ``(name, boot id,
    time_ns)`` each; an unreadable marker counts as one of an earlier boot, at time 0 (everything
    is re-checked)."""
    out = []
    skipped = set(skip)
    for name in names:
        if not name.startswith(MARKER_PREFIX) or name in skipped:
            continue
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            try:
                info = json.loads(os.read(fd, 4096) or b"{}")
            finally:
                os.close(fd)
            out.append((name, str(info.get("boot_id", "")), int(info.get("time_ns", 0))))
        except (OSError, ValueError, TypeError, AttributeError):
            out.append((name, "", 0))
    return out


def remove(dfd: int, names: Iterable[str]) -> None:
    """Remove markers (one already gone is fine) and make the removal durable (the directory is
    fsynced): a removal that a power cut right after the run undid would make the next run resend
    every file the marker covers, though each is on disk."""
    removed = False
    for name in names:
        try:
            os.unlink(name, dir_fd=dfd)
            removed = True
        except FileNotFoundError:
            pass
    if removed:
        os.fsync(dfd)


def changed_since(dfd: int, name: str, since_ns: int) -> bool:
    """Whether the destination file ``name`` in ``dfd`` exists and changed (ctime) at or after
    ``since_ns`` (less :data:`CLOCK_SLACK_NS`)."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return st.st_ctime_ns >= since_ns - CLOCK_SLACK_NS
