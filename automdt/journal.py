"""Journals of partial files on the receiver, so a killed transfer resumes without resending.

A partial file ``.amdt-<h>.part`` sits beside its final name with a journal
``.amdt-<h>.journal`` (only a file of at least one chunk: a smaller one is written by a single
chunk, so :mod:`automdt.partial` gives it none and rewrites it whole after an interruption). The journal starts with a 64-byte header binding it to one version of
one source file, then one 32-byte record per chunk written (appended by the engine's write
threads right after the chunk's ``pwrite``)::

    header : b"AMDTJRN1" | fingerprint (32 bytes) | chunk_size (u64 LE) | 16 zero bytes
    record : b"AMJR" | length u32 | offset u64 | xxh3_64(chunk) u64 | xxh3_64(first 24 bytes) u64

The fingerprint hashes the relative path, size, mtime, identity (dev:inode), content digest
(with ``--checksum``) and chunk size of the source file, the chunk size being the one in the
header: a changed or replaced source never splices old data. Before reuse every recorded chunk is
re-read and re-hashed; a torn or mismatching record is simply not counted.

The records are byte ranges, each with its own length, so a journal serves any later chunk size
(:func:`verified_ranges`, :func:`chunks_covered`): a run whose chunk size differs from the one
that wrote the partial (a job's history picks 1 MiB chunks on a slow path, 4 MiB on a fast one)
keeps every chunk of its own size that the verified ranges cover, and its engine appends records
of its own size to the same journal. With a smaller chunk size nothing journaled is sent again.
With a larger one a chunk that a gap in the journaled ranges cuts is sent whole (the engine sends
whole chunks), and so is a file smaller than one new chunk (it has no journal then).
"""
from __future__ import annotations

import hashlib
import os
import struct
from typing import Callable, List, Tuple, Union

import xxhash

from automdt.transfer_engine import (JOURNAL_MAGIC, JOURNAL_RECORD_CHECK, JOURNAL_RECORD_FORMAT,
                                     SESSION_CHUNK_SIZE_MAX)

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


def verified_ranges(data_fd: int, journal_fd: int, fp: Union[bytes, Callable[[int], bytes]],
                    size: int) -> List[Tuple[int, int]]:
    """``[(start, end), ...]`` byte ranges (merged, sorted) of the partial ``data_fd`` that journal
    records vouch for and that re-hash correctly; empty unless the journal's header is bound to
    this source.

    :param fp: the fingerprint the header must carry, or a function of the header's chunk size
        that gives it (:meth:`automdt.partial.PartialFile.fingerprint`): a journal written with
        another chunk size is then used as well.
    """
    jfp, jcs, recs = read_records(journal_fd)
    if not jfp or not jcs or jfp != (fp(jcs) if callable(fp) else fp):
        return []
    seen = set()
    good: List[Tuple[int, int]] = []
    for offset, length, h in recs:
        if length <= 0 or length > SESSION_CHUNK_SIZE_MAX or offset + length > size or (offset, length) in seen:
            continue
        seen.add((offset, length))
        chunk = os.pread(data_fd, length, offset)
        if len(chunk) == length and xxhash.xxh3_64_intdigest(chunk) == h:
            good.append((offset, offset + length))
    merged: List[Tuple[int, int]] = []
    for a, b in sorted(good):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return merged


def chunks_covered(ranges: List[Tuple[int, int]], size: int, chunk_size: int) -> List[int]:
    """Indices of the ``chunk_size`` chunks of a ``size``-byte file that lie wholly inside
    ``ranges`` (from :func:`verified_ranges`)."""
    done: List[int] = []
    for a, b in ranges:
        i = -(-a // chunk_size)
        while i * chunk_size < size and i * chunk_size + min(chunk_size, size - i * chunk_size) <= b:
            done.append(i)
            i += 1
    return done


def verified_chunks(data_fd: int, journal_fd: int, fp: Union[bytes, Callable[[int], bytes]], size: int,
                    chunk_size: int) -> List[int]:
    """Indices of the ``chunk_size`` chunks whose bytes journal records vouch for and re-hash
    correctly (:func:`verified_ranges`, :func:`chunks_covered`)."""
    return chunks_covered(verified_ranges(data_fd, journal_fd, fp, size), size, chunk_size)


def bitmap(indices: List[int], nchunks: int) -> bytes:
    """LSB-first bitmap of chunk indices (the engine's ``done_chunks`` format)."""
    b = bytearray((nchunks + 7) // 8)
    for i in indices:
        b[i >> 3] |= 1 << (i & 7)
    return bytes(b)
