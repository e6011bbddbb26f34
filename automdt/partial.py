"""One destination file on its way in: the partial file, its journal and the rename into place.

The receiver's single-object operations (as rclone's ``fs/operations`` beside ``fs/sync``): a
:class:`PartialFile` owns the two descriptors of one file being written (the ``.part`` data file
and its journal, :mod:`automdt.journal`) and their lifecycle::

    open()  ->  (the engine writes chunks)  ->  seal()  ->  close()  ->  rename_into_place()
                                               \\-> close() (failed or interrupted: the partial stays)
                                                   \\-> discard() (the source is gone: it does not)

A file smaller than one chunk has no journal: it is written by one chunk, so there is nothing to
resume part of (a partial left by a killed run is written afresh, as one chunk would be resent
anyway); that saves creating, writing and removing a journal per small file.

:func:`need_transfer` decides whether a destination file already matches its source.
The session (:mod:`automdt.session`) orchestrates: it registers the open file with the engine and
calls these steps; every call here works beneath a directory descriptor from
:class:`automdt.paths.SafeRoot`, never follows a symlink, and never opens a name it did not create.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import AbstractSet, List, Optional, Tuple

from automdt import journal
from automdt.manifest import file_digest
from automdt.paths import UnsafePath, temp_names

_RW = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class PartialFile:
    """One file of a session's plan (a manifest entry), and, once active, its open partial."""

    id: int
    path: str
    """The relative path the sender named."""
    parts: Tuple[str, ...]
    """Its components beneath the receiver's root (the session's subdirectory first)."""
    size: int
    mtime_ns: int
    mode: int
    source_id: str = ""
    digest: str = ""
    data_fd: int = -1
    """The ``.part`` file, open while active (-1 otherwise)."""
    journal_fd: int = -1
    """Its journal, open for appending while active (-1 otherwise)."""
    active: bool = False
    """Open and (unless every chunk was already there) registered with the engine."""
    partial: bool = False
    """The plan found a partial (``.part``) to resume; without one, :meth:`open` creates afresh."""
    stale_journal: bool = True
    """Something may have the journal's name that this run did not create (a journal left by an
    earlier run): it is removed with the partial. False when the plan's directory listing showed
    no such name."""
    journaled: bool = False
    """The open partial has a journal (every file of at least one chunk)."""
    _temp: Optional[Tuple[str, str]] = None

    def temp_names(self) -> Tuple[str, str]:
        """The partial's and journal's names (hashed once per file)."""
        if self._temp is None:
            self._temp = temp_names(self.path)
        return self._temp

    def chunks(self, chunk_size: int) -> int:
        """Number of chunks of ``chunk_size`` bytes."""
        return (self.size + chunk_size - 1) // chunk_size

    def fingerprint(self, chunk_size: int) -> bytes:
        """What binds the journal to this version of the source (:func:`automdt.journal.fingerprint`)."""
        return journal.fingerprint(self.path, self.size, self.mtime_ns, chunk_size, self.source_id, self.digest)

    # ------------------------------------------------------------------ planning
    def see_listing(self, names: AbstractSet[str]) -> None:
        """Take :attr:`partial` and :attr:`stale_journal` from a listing of the file's directory
        (instead of a ``stat`` of each name)."""
        if not names:  # a new directory: no need to hash the names yet
            self.partial = self.stale_journal = False
            return
        tmp, jname = self.temp_names()
        self.partial = tmp in names
        self.stale_journal = jname in names

    def partial_bytes(self, dfd: int) -> int:
        """Bytes a resumable partial already holds on disk in directory ``dfd`` (0 if none).
        Marks the file :attr:`partial` when anything has the partial's name."""
        try:
            st = os.stat(self.temp_names()[0], dir_fd=dfd, follow_symlinks=False)
        except OSError:
            return 0
        self.partial = True  # whatever it is: open() looks at it before creating afresh
        return min(self.size, st.st_blocks * 512) if stat.S_ISREG(st.st_mode) else 0

    def create_empty(self, dfd: int, fsync: bool) -> None:
        """An empty file needs no data: create it with its metadata and rename it into place now."""
        tmp, jname = self.temp_names()
        fd = create(tmp, dfd, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, self.mode)
            os.utime(fd, ns=(self.mtime_ns, self.mtime_ns))
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, self.parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)
        if self.stale_journal:
            unlink(jname, dfd)

    # ------------------------------------------------------------------ lifecycle
    def open(self, dfd: int, chunk_size: int) -> List[int]:
        """Open the partial and its journal in ``dfd``, resuming when the journal is ours, matches
        this source and its chunks re-hash correctly; otherwise create both afresh (anything left
        under the names is unlinked first, never opened). Returns the indices of the chunks that
        are already on disk; the file is then :attr:`active`. A file smaller than one chunk gets
        no journal and is always created afresh.

        A journal written with another chunk size serves too (:func:`automdt.journal.verified_ranges`):
        the chunks of ``chunk_size`` its verified byte ranges cover are on disk, and the engine
        appends records of ``chunk_size`` to it."""
        tmp, jname = self.temp_names()
        if self.size < chunk_size:
            if self.stale_journal:  # an earlier run's journal (e.g. of another chunk size): debris now
                unlink(jname, dfd)
                self.stale_journal = False
            self.data_fd, self.journal_fd, self.journaled, self.active = create(tmp, dfd, _RW), -1, False, True
            return []
        data_fd = jfd = -1
        try:
            if not self.partial:  # nothing to resume when the plan ran: create (below)
                raise FileNotFoundError
            data_fd = os.open(tmp, _RW, dir_fd=dfd)
            jfd = os.open(jname, _RW | os.O_APPEND, dir_fd=dfd)
            euid = os.geteuid()
            for fd in (data_fd, jfd):
                st = os.fstat(fd)
                # only a regular file we created ourselves, with no other name (a hard link
                # planted at the partial's name would make us write outside the root)
                if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != euid:
                    raise FileNotFoundError
            # whatever chunk size wrote the journal (its header's, in its fingerprint)
            ranges = journal.verified_ranges(data_fd, jfd, self.fingerprint, self.size)
            if not ranges:
                raise FileNotFoundError  # nothing reusable: start afresh
            done = journal.chunks_covered(ranges, self.size, chunk_size)
        except OSError:  # missing, a symlink (ELOOP), untrusted or stale: start afresh
            for fd in (data_fd, jfd):
                if fd >= 0:
                    os.close(fd)
            data_fd, jfd = self._create(dfd, self.fingerprint(chunk_size), chunk_size)
            done = []
        self.data_fd, self.journal_fd, self.journaled, self.active = data_fd, jfd, True, True
        return done

    def _create(self, dfd: int, fp: bytes, chunk_size: int) -> Tuple[int, int]:
        tmp, jname = self.temp_names()
        data_fd = create(tmp, dfd, _RW)
        jfd = -1
        try:
            jfd = create(jname, dfd, _RW | os.O_APPEND)
            os.write(jfd, journal.header(fp, chunk_size))
            os.ftruncate(data_fd, self.size)
        except OSError:
            os.close(data_fd)
            if jfd >= 0:
                os.close(jfd)
            raise
        return data_fd, jfd

    def seal(self, fsync: bool) -> None:
        """Every chunk is written and verified: give the partial its mode and mtime (and fsync it)."""
        os.fchmod(self.data_fd, self.mode)
        os.utime(self.data_fd, ns=(self.mtime_ns, self.mtime_ns))
        if fsync:
            os.fsync(self.data_fd)

    def close(self) -> bool:
        """Close both descriptors (the files stay on disk); returns whether the file was active."""
        for fd in (self.data_fd, self.journal_fd):
            if fd >= 0:
                os.close(fd)
        self.data_fd = self.journal_fd = -1
        was, self.active = self.active, False
        return was

    def rename_into_place(self, dfd: int, fsync_dir: bool) -> None:
        """Atomically replace the destination with the sealed, closed partial; drop the journal."""
        tmp, jname = self.temp_names()
        os.rename(tmp, self.parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)
        if self.journaled or self.stale_journal:
            unlink(jname, dfd)
        if fsync_dir:
            os.fsync(dfd)

    def discard(self, dfd: int) -> None:
        """Remove the partial and its journal (a source that is gone makes them debris)."""
        for name in self.temp_names():
            try:
                unlink(name, dfd)
            except OSError:
                pass


def need_transfer(dfd: int, f: PartialFile, checksum: bool, digest: Optional[str],
                  names: Optional[AbstractSet[str]] = None) -> bool:
    """Whether the destination ``f.parts[-1]`` in ``dfd`` must be (re)written: it is missing or not
    a regular file, its size differs, or its content digest (``checksum``; with the sender's
    ``digest``) or else its mtime differs. Raises :class:`UnsafePath` when a directory has the name.
    ``names``: the directory's entries when known (a name not among them is missing: no ``stat``)."""
    name = f.parts[-1]
    if names is not None and name not in names:
        return True
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return True
    if stat.S_ISDIR(st.st_mode):
        raise UnsafePath("destination exists as a directory")
    if stat.S_ISREG(st.st_mode) and st.st_size == f.size:
        if checksum and digest:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            try:
                same = file_digest(f"/proc/self/fd/{fd}") == digest
            finally:
                os.close(fd)
            if same:
                return False
        elif not checksum and st.st_mtime_ns == f.mtime_ns:
            return False
    return True


def missing_ranges(done: List[int], nchunks: int, cs: int, size: int) -> List[List[int]]:
    """``[[offset, length], ...]`` of the chunks not in ``done``, adjacent ones merged."""
    have = set(done)
    out: List[List[int]] = []
    for i in range(nchunks):
        if i in have:
            continue
        off = i * cs
        ln = min(cs, size - off)
        if out and out[-1][0] + out[-1][1] == off:
            out[-1][1] += ln
        else:
            out.append([off, ln])
    return out


def create(name: str, dfd: int, flags: int) -> int:
    """Create ``name`` (0600, O_EXCL) in ``dfd``; whatever already has that name (a stale partial,
    a planted symlink or hard link) is unlinked first and never opened."""
    try:
        return os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dfd)
    except FileExistsError:
        unlink(name, dfd)
        return os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dfd)


def unlink(name: str, dfd: int) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass
