"""Journals of partial files on the receiver, so a killed transfer resumes without resending.

A partial file ``.amdt-<h>.part`` sits beside its final name with a journal
``.amdt-<h>.journal`` (only a file of at least one chunk: a smaller one is written by a single
chunk, so :mod:`automdt.partial` gives it none and rewrites it whole after an interruption). The journal starts with a 64-byte header binding it to one version of
one source file, then one 32-byte record per chunk written (appended by the engine's write
threads right after the chunk's ``pwrite``)::

    header : b"AMDTJRN1" | fingerprint (32 bytes) | chunk_size (u64 LE) | 16 zero bytes
    record : b"AMJR" | length u32 | offset u64 | xxh3_64(chunk) u64 | xxh3_64(first 24 bytes) u64

The fingerprint hashes the relative path, size, mtime, identity (dev:inode), content digest
(with ``--checksum``) and chunk size of the source file: a changed or replaced source (or another
chunk size) never splices old data. Before reuse every recorded chunk is
re-read and re-hashed; a torn or mismatching record is simply not counted.
"""
from __future__ import annotations

import hashlib
import os
import struct
from typing import List, Tuple

import xxhash

from automdt.transfer_engine import JOURNAL_MAGIC, JOURNAL_RECORD_CHECK, JOURNAL_RECORD_FORMAT

HEADER_MAGIC = b"AMDTJRN1"
HEADER_SIZE = 64
RECORD = struct.Struct(JOURNAL_RECORD_FORMAT)  # the engine writes the records (constants.h)
RECORD_MAGIC = JOURNAL_MAGIC


def fingerprint(relpath: str, size: int, mtime_ns: int, chunk_size: int, source_id: str = "", digest: str = "") -> bytes:
    """Binds a journal to one version of one source file: its path, size, mtime, identity
    (``dev:inode``: a replaced file is a new inode), content digest when ``--checksum`` supplied
    one, and the chunk size."""
    key = f"{relpath}\x00{size}\x00{mtime_ns}\x00{chunk_size}\x00{source_id}\x00{digest}"
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def header(fp: bytes, chunk_size: int) -> bytes:
    return HEADER_MAGIC + fp + struct.pack("<Q", chunk_size) + b"\x00" * 16


def read_records(journal_fd: int) -> Tuple[bytes, int, List[Tuple[int, int, int]]]:
    """Return (fingerprint, chunk_size, [(offset, length, hash)]) of valid records."""
    os.lseek(journal_fd, 0, os.SEEK_SET)
    data = b""
    while True:
        b = os.read(journal_fd, 1 << 20)
        if not b:
            break
        data += b
    if len(data) < HEADER_SIZE or data[:8] != HEADER_MAGIC:
        return b"", 0, []
    fp = data[8:40]
    chunk_size = struct.unpack_from("<Q", data, 40)[0]
    recs = []
    for pos in range(HEADER_SIZE, len(data) - RECORD.size + 1, RECORD.size):
        magic, length, offset, h, check = RECORD.unpack_from(data, pos)
        if magic != RECORD_MAGIC or xxhash.xxh3_64_intdigest(data[pos:pos + JOURNAL_RECORD_CHECK]) != check:
            break  # torn tail: the rest is not trusted
        recs.append((offset, length, h))
    return fp, chunk_size, recs


def verified_chunks(data_fd: int, journal_fd: int, fp: bytes, size: int, chunk_size: int) -> List[int]:
    """Chunk indices whose journal record matches ``fp`` and whose data re-hashes correctly."""
    jfp, jcs, recs = read_records(journal_fd)
    if jfp != fp or jcs != chunk_size:
        return []
    done = set()
    for offset, length, h in recs:
        if offset % chunk_size or length != min(chunk_size, size - offset) or length <= 0:
            continue
        idx = offset // chunk_size
        if idx in done:
            continue
        chunk = os.pread(data_fd, length, offset)
        if len(chunk) == length and xxhash.xxh3_64_intdigest(chunk) == h:
            done.add(idx)
    return sorted(done)


def bitmap(indices: List[int], nchunks: int) -> bytes:
    """LSB-first bitmap of chunk indices (the engine's ``done_chunks`` format)."""
    b = bytearray((nchunks + 7) // 8)
    for i in indices:
        b[i >> 3] |= 1 << (i & 7)
    return bytes(b)
