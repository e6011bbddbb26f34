"""Tree verification by content digest (``automdt verify`` and ``transfer --verify``).

The file digest is XXH3-128 over the concatenated little-endian XXH3-64 digests of the file's
chunks in offset order: the per-chunk digests are what the engine checks on the wire and what
the receiver's journal records, so the digest can be assembled in any arrival order, and
either end computes it alone from the file.
"""
from __future__ import annotations

import os
import struct
from typing import Dict, List, Optional

import xxhash

DEFAULT_CHUNK = 4 << 20


def chunked_digest_fd(fd: int, size: int, chunk_size: int = DEFAULT_CHUNK) -> str:
    """Digest of the first ``size`` bytes of an open file (see the module docstring)."""
    h = xxhash.xxh3_128()
    off = 0
    while off < size:
        n = min(chunk_size, size - off)
        data = os.pread(fd, n, off)
        if len(data) != n:
            raise OSError(f"short read at offset {off}")
        h.update(struct.pack("<Q", xxhash.xxh3_64_intdigest(data)))
        off += n
    return h.hexdigest()


def chunked_digest(path: str, chunk_size: int = DEFAULT_CHUNK) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return chunked_digest_fd(fd, os.fstat(fd).st_size, chunk_size)
    finally:
        os.close(fd)


def compare(src_digests: Dict[str, Optional[str]], dst_digests: Dict[str, Optional[str]]) -> List[str]:
    """Differences as lines ``missing: a``, ``differs: b`` (None digest = missing/unreadable)."""
    out = []
    for path, d in sorted(src_digests.items()):
        other = dst_digests.get(path)
        if other is None:
            out.append(f"missing: {path}")
        elif d != other:
            out.append(f"differs: {path}")
    return out
