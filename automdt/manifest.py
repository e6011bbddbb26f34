"""The list of what a transfer moves: scanning the source tree on the sender."""
from __future__ import annotations

import errno
import logging
import os
import stat
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from automdt import errors
from automdt.errors import AutomdtError

log = logging.getLogger(__name__)


@dataclass
class FileEntry:
    """A regular file of the source tree.

    :param id: index in the manifest (also the engine's file id).
    :param path: name relative to the source root, ``/``-separated.
    :param abspath: where the sender reads it.
    :param size: bytes.
    :param mtime_ns: modification time in nanoseconds (kept on the destination).
    :param mode: permission bits (kept on the destination, without setuid/setgid/sticky).
    :param digest: XXH3-128 hex digest of the content when ``--checksum`` asked for it.
    """

    id: int
    path: str
    abspath: str
    size: int
    mtime_ns: int
    mode: int
    digest: Optional[str] = None
    source_id: str = ""
    """``dev:inode`` of the source file: part of the resume fingerprint, so a partial left by a
    file that has since been replaced (a new inode) is never resumed."""


@dataclass
class Manifest:
    files: List[FileEntry]
    dirs: List[str]
    skipped: List[Tuple[str, str]]
    """(path, reason) of entries deliberately not transferred: symlinks, sockets, devices."""
    unreadable: List[Tuple[str, str, int]] = field(default_factory=list)
    """(path, reason, exit code) of entries that could not be read: a directory that cannot be
    listed, an entry that cannot be stat'ed, an empty file that cannot be opened (exit 6), one
    that vanished during the scan (exit 12). Every one is an error of the run."""

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def _why(e: OSError) -> str:
    return (e.strerror or str(e)).lower()


def _unreadable_code(e: OSError) -> int:
    return errors.SOURCE_CHANGED if e.errno in (errno.ENOENT, errno.ESTALE) else errors.FILES_FAILED


def _empty_file_readable(path: str) -> Optional[OSError]:
    """An empty file is never read by the engine (the receiver creates it from the listing), so
    check here that the sender could read it; ``None`` if it can."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        return e
    os.close(fd)
    return None


def scan(src: str) -> Manifest:
    """Scan ``src`` (a directory, whose contents are transferred, or a single file).

    Symlinks and special files are skipped and listed in ``skipped`` (no symlink is ever
    created on the destination); what cannot be read is listed in ``unreadable``. Raises
    :class:`AutomdtError` when ``src`` itself is missing or unreadable.
    """
    try:
        st = os.stat(src)
    except FileNotFoundError:
        raise AutomdtError(f"{src}: source not found", errors.DIR_NOT_FOUND) from None
    except PermissionError:
        raise AutomdtError(f"{src}: permission denied", errors.FILES_FAILED) from None
    except OSError as e:
        raise AutomdtError(f"{src}: {_why(e)}", errors.FILES_FAILED) from None
    if stat.S_ISREG(st.st_mode):
        return _scan_single_file(src, st)
    if not stat.S_ISDIR(st.st_mode):
        raise AutomdtError(f"{src}: not a regular file or directory", errors.USAGE)

    m = Manifest([], [], [], [])
    stack = [("", os.path.abspath(src))]
    unlisted: set = set()
    while stack:
        rel, path = stack.pop()
        try:
            with os.scandir(path) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            if not rel:
                raise AutomdtError(f"{src}: cannot list the source directory: {_why(e)}", errors.FILES_FAILED) from None
            m.unreadable.append((rel, f"cannot list directory: {_why(e)}; nothing in it was transferred",
                                 _unreadable_code(e)))
            unlisted.add(rel)  # not created empty on the destination either
            continue
        stack.extend(reversed(_scan_entries(rel, entries, m)))
    for name, why in m.skipped:
        log.warning("skipping %s: %s", name, why)
    if unlisted:
        m.dirs = [d for d in m.dirs if d not in unlisted]
    return m


def _scan_single_file(src: str, st: os.stat_result) -> Manifest:
    """The manifest of a source that is one regular file."""
    if st.st_size == 0:
        err = _empty_file_readable(src)
        if err is not None:
            raise AutomdtError(f"{src}: {_why(err)}", errors.FILES_FAILED)
    entry = FileEntry(0, os.path.basename(os.path.abspath(src)), os.path.abspath(src), st.st_size, st.st_mtime_ns,
                      stat.S_IMODE(st.st_mode) & 0o777, source_id=f"{st.st_dev}:{st.st_ino}")
    return Manifest([entry], [], [], [])


def _scan_entries(rel: str, entries: List[os.DirEntry], m: Manifest) -> List[Tuple[str, str]]:
    """Sort the entries of the listed directory ``rel`` into ``m``; return its subdirectories as
    (relative name, path), in name order."""
    subdirs = []
    for e in entries:
        name = rel + "/" + e.name if rel else e.name
        try:
            est = e.stat(follow_symlinks=False)
        except OSError as ex:
            why = "vanished during the scan" if ex.errno == errno.ENOENT else f"cannot stat: {_why(ex)}"
            m.unreadable.append((name, why, _unreadable_code(ex)))
            continue
        if stat.S_ISLNK(est.st_mode):
            m.skipped.append((name, "symlink (not followed)"))
        elif stat.S_ISDIR(est.st_mode):
            m.dirs.append(name)
            subdirs.append((name, e.path))
        elif stat.S_ISREG(est.st_mode):
            if est.st_size == 0:
                err = _empty_file_readable(e.path)
                if err is not None:
                    m.unreadable.append((name, f"cannot read: {_why(err)}", _unreadable_code(err)))
                    continue
            m.files.append(FileEntry(len(m.files), name, e.path, est.st_size, est.st_mtime_ns,
                                     stat.S_IMODE(est.st_mode) & 0o777, source_id=f"{est.st_dev}:{est.st_ino}"))
        else:
            m.skipped.append((name, "special file"))
    return subdirs


def file_digest(path: str, block: int = 4 << 20) -> str:
    """XXH3-128 hex digest of a whole file (used by ``--checksum`` to decide what to skip)."""
    import xxhash

    h = xxhash.xxh3_128()
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(block)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def parse_shard(text: str) -> Tuple[int, int]:
    """``"I/N"`` -> ``(I, N)`` with ``0 <= I < N``; :class:`ValueError` with a one-line reason."""
    head, sep, tail = str(text).strip().partition("/")
    try:
        if not sep:
            raise ValueError
        index, count = int(head), int(tail)
    except ValueError:
        raise ValueError(f"--shard {text}: expected I/N (shard I of N, counted from 0), e.g. 0/4") from None
    if count < 1:
        raise ValueError(f"--shard {text}: the number of shards must be at least 1")
    if not 0 <= index < count:
        raise ValueError(f"--shard {text}: the shard index must be in 0..{count - 1}")
    return index, count


def shard_of(files: List[FileEntry], count: int) -> List[int]:
    """The shard (0..count-1) of every file: a deterministic, size-balanced partition.

    Files are placed largest first (ties by path) on the shard holding the fewest bytes so far
    (ties: fewest files, then the lowest index): the greedy longest-processing-time rule, within
    4/3 of the best possible balance and usually within one small file of it. The result depends
    only on the files' relative paths and sizes, so every node that scans the same tree computes
    the same partition, and every file lands in exactly one shard.
    """
    import heapq

    order = sorted(range(len(files)), key=lambda i: (-files[i].size, files[i].path.encode("utf-8", "surrogateescape")))
    heap = [(0, 0, s) for s in range(count)]
    out = [0] * len(files)
    for i in order:
        nbytes, nfiles, s = heapq.heappop(heap)
        out[i] = s
        heapq.heappush(heap, (nbytes + files[i].size, nfiles + 1, s))
    return out


def shard_manifest(manifest: Manifest, index: int, count: int) -> Manifest:
    """The part of ``manifest`` that shard ``index`` of ``count`` moves (:func:`shard_of`).

    Every shard keeps the whole directory list (creating a directory is idempotent, and empty
    directories then exist whichever shards run); its files are renumbered from 0 in scan order.
    """
    if count == 1:
        return manifest
    which = shard_of(manifest.files, count)
    files: List[FileEntry] = []
    for f, s in zip(manifest.files, which):
        if s == index:
            f.id = len(files)
            files.append(f)
    return Manifest(files, manifest.dirs, manifest.skipped)
