"""Path safety on the receiver: names from a sender are validated, then opened beneath the root.

Two layers, as rsync does: a lexical check of every name (:func:`check_relpath`), then every
directory component is opened with ``O_NOFOLLOW|O_DIRECTORY`` relative to its parent's
descriptor (:class:`SafeRoot`), so a symlink planted anywhere under the root is refused rather
than followed, and no path string is ever resolved from the root down again.
No symbolic link is ever created on the destination.
"""
from __future__ import annotations

import errno
import hashlib
import os
import secrets
from collections import OrderedDict
from typing import Tuple

MAX_COMPONENT_BYTES = 255
MAX_PATH_BYTES = 4096
TEMP_PREFIX = ".amdt-"
"""Temporary and journal files of partial transfers start with this; senders may not use it."""
SCRATCH_PREFIX = ".automdt-explore-scratch"
"""``automdt explore`` copies data again into directories named so; a receiver removes a session's
scratch directory when the session closes."""


class UnsafePath(ValueError):
    """A name from a sender that would escape or abuse the destination root."""


def check_relpath(name: str) -> Tuple[str, ...]:
    """Validate a relative name from a sender and return its components.

    Refuses: non-strings, empty names, NUL bytes, absolute names, empty, ``.`` or ``..``
    components, components over 255 bytes, names over 4096 bytes, and names of AutoMDT's own
    temporary files.
    """
    if not isinstance(name, str) or not name:
        raise UnsafePath(f"unsafe name {name!r}: empty or not a string")
    if "\x00" in name:
        raise UnsafePath(f"unsafe name {name!r}: contains a NUL byte")
    if name.startswith("/"):
        raise UnsafePath(f"unsafe name {name!r}: absolute")
    raw = os.fsencode(name)
    if len(raw) > MAX_PATH_BYTES:
        raise UnsafePath(f"unsafe name {name[:60]!r}...: longer than {MAX_PATH_BYTES} bytes")
    parts = tuple(name.split("/"))
    long = len(raw) > MAX_COMPONENT_BYTES  # else no component can be (names are checked per file)
    for p in parts:
        if p in ("", ".", ".."):
            raise UnsafePath(f"unsafe name {name!r}: has an empty, '.' or '..' component")
        if long and len(os.fsencode(p)) > MAX_COMPONENT_BYTES:
            raise UnsafePath(f"unsafe name {name[:60]!r}: a component is longer than {MAX_COMPONENT_BYTES} bytes")
    if parts[-1].startswith(TEMP_PREFIX):
        raise UnsafePath(f"unsafe name {name!r}: reserved for AutoMDT's temporary files")
    return parts


def temp_names(relpath: str) -> Tuple[str, str]:
    """Names (in the file's own directory) of the partial data file and its journal."""
    h = hashlib.sha256(os.fsencode(relpath)).hexdigest()[:24]
    return f"{TEMP_PREFIX}{h}.part", f"{TEMP_PREFIX}{h}.journal"


def check_writable(dfd: int) -> None:
    """Raise ``OSError`` unless a new file can be created in the directory open as ``dfd``.

    A probe file (an AutoMDT temporary name, created with ``O_EXCL`` and removed at once) gets the
    kernel's own answer for modes, ACLs, read-only mounts and root-squashed NFS alike, where
    ``access()`` guesses from the mode bits."""
    name = f"{TEMP_PREFIX}probe-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    os.close(fd)
    os.unlink(name, dir_fd=dfd)


def where_beneath(root: str, parts: Tuple[str, ...]) -> str:
    """The path of ``parts`` below ``root`` for messages."""
    return os.path.join(root, *parts) if parts else root


class SafeRoot:
    """A destination root whose subdirectories are opened without following symlinks.

    Directory descriptors are cached (bounded); callers use ``dir_fd=`` system calls with them.
    """

    def __init__(self, root: str, max_cached: int = 256):
        self.root = root
        try:
            self.fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise FileNotFoundError(f"destination root {root}: no such directory") from None
        self._cache: "OrderedDict[Tuple[str, ...], int]" = OrderedDict()
        self._max = max_cached
        self.created: list = []
        """Directories this instance created (parents before children)."""

    def close(self) -> None:
        for fd in self._cache.values():
            os.close(fd)
        self._cache.clear()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def remove_created(self) -> int:
        """Remove the directories this instance created that are still empty (children first), so
        that a refused transfer leaves no empty tree behind. Returns how many went."""
        removed = 0
        for parts in reversed(self.created):
            fd = self._cache.pop(parts, None)
            if fd is not None:
                os.close(fd)
            try:
                os.rmdir(parts[-1], dir_fd=self.dir_fd(parts[:-1], create=False))
                removed += 1
            except (OSError, UnsafePath):
                pass
        self.created = []
        return removed

    def __enter__(self) -> "SafeRoot":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def dir_fd(self, parts: Tuple[str, ...], create: bool = True) -> int:
        """Descriptor of the directory ``parts`` below the root (created when missing).

        Raises :class:`UnsafePath` if any component is a symlink or not a directory.
        """
        if not parts:
            return self.fd
        cached = self._cache.get(parts)
        if cached is not None:
            self._cache.move_to_end(parts)
            return cached
        parent = self.dir_fd(parts[:-1], create)
        name = parts[-1]
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
            try:
                os.mkdir(name, 0o755, dir_fd=parent)
                self.created.append(parts)
            except FileExistsError:
                pass
            fd = os.open(name, flags, dir_fd=parent)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UnsafePath(f"{'/'.join(parts)}: is a symlink or not a directory; refusing to follow it") from None
            raise
        self._cache[parts] = fd
        while len(self._cache) > self._max:
            # Never evict an ancestor still needed: entries are independent descriptors.
            _, old = self._cache.popitem(last=False)
            os.close(old)
        return fd
