"""Typed wrapper around the C transfer engine (``automdt.transfer_engine._engine``).

The C extension moves the data: read pool -> sender staging buffer -> network pool (one TCP
connection per thread) -> receiver staging buffer -> write pool. This module validates
arguments (``ValueError`` with a message that says what to fix), turns the C stats tuples into
NamedTuples and documents the API. It uses the standard library only.

Rates are in **bytes per second** (``thread_bps``/``total_bps``); 0 means unlimited.
Times in stats are thread-seconds: ``busy_s`` (working, including throttle sleeps),
``wait_s`` (blocked on a staging buffer: no free slot, or nothing queued) and ``idle_s``
(nothing to do: no file queued, connecting, or waiting for the peer's next frame).
The engine is not deterministic: chunk order on the wire depends on thread scheduling.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any, NamedTuple, Optional, Sequence, TypeVar, Union

from . import _engine
from . import switches as _switches

__all__ = [
    "BufferStats",
    "Event",
    "Receiver",
    "ReceiverStats",
    "Sender",
    "SenderStats",
    "SharedLimit",
    "StageStats",
    "TOKEN_LEN",
    "TLS_KEY_LEN",
    "CHUNK_SIZE_MIN",
    "CHUNK_SIZE_MAX",
    "MAX_THREADS",
    "SESSION_CHUNK_SIZE_MIN",
    "SESSION_CHUNK_SIZE_MAX",
    "JOURNAL_MAGIC",
    "JOURNAL_RECORD_CHECK",
    "JOURNAL_RECORD_FORMAT",
    "JOURNAL_RECORD_LEN",
    "frame_hash",
    "trim_cache",
]

# Limits and layouts of the C engine (transfer_engine/src/constants.h), read from it so that
# no number is written twice.
TOKEN_LEN: int = _engine.TOKEN_LEN
TLS_KEY_LEN: int = _engine.TLS_KEY_LEN
CHUNK_SIZE_MIN: int = _engine.CHUNK_SIZE_MIN
CHUNK_SIZE_MAX: int = _engine.CHUNK_SIZE_MAX
MAX_THREADS: int = _engine.MAX_THREADS
"""Upper bound of ``max_threads`` (threads of one stage)."""
SESSION_CHUNK_SIZE_MIN: int = _engine.SESSION_CHUNK_SIZE_MIN
SESSION_CHUNK_SIZE_MAX: int = _engine.SESSION_CHUNK_SIZE_MAX
"""The chunk sizes automdt's CLI and control protocol accept (a subset of the engine's range)."""
JOURNAL_MAGIC: bytes = _engine.JOURNAL_MAGIC
JOURNAL_RECORD_FORMAT: str = _engine.JOURNAL_RECORD_FORMAT
"""A journal record in :mod:`struct` notation: magic, length, offset, hash, check."""
JOURNAL_RECORD_LEN: int = _engine.JOURNAL_RECORD_LEN
JOURNAL_RECORD_CHECK: int = _engine.JOURNAL_RECORD_CHECK
"""Offset of the record's check field: the check is XXH3-64 of the bytes before it."""
_NS = 1e-9
_M64 = (1 << 64) - 1
_E = TypeVar("_E", bound="_Engine")


def frame_mix(file_id: int, offset: int) -> int:
    """The value XORed into a frame's payload hash (wire.h ``amdt_frame_mix``)."""
    z = (offset ^ ((file_id * 0x9E3779B97F4A7C15) & _M64) ^ 0xA0761D6478BD642F) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def trim_cache(max_age_s: float = 0.0) -> None:
    """Free the staging-slot memory that closed engines left for the next one, if it was kept
    ``max_age_s`` seconds or longer (0: now). Closed engines keep up to the largest buffer
    they used (at most 1 GiB) for 60 s, so that the next engine of a long-running process (a
    receiving daemon's next session) does not fault fresh memory in; this hands it back sooner."""
    if not isinstance(max_age_s, (int, float)) or isinstance(max_age_s, bool) or max_age_s < 0:
        raise ValueError(f"max_age_s must be a number >= 0, got {max_age_s!r}")
    _engine.trim_cache(float(max_age_s))


def frame_hash(payload: bytes, file_id: int, offset: int) -> int:
    """The hash a data frame carries: XXH3-64 of the payload XOR :func:`frame_mix`, which binds
    the chunk to its (file, offset) so a corrupted header fails the check too."""
    return _engine.hash64(payload) ^ frame_mix(file_id, offset)

#: An event tuple, drained by ``events()``. Kinds and shapes:
#: ``("file_error", file_id, errno, message)`` (sender; errno 0 when no system call failed,
#: e.g. "changed during read: size 100 -> 50"), ``("conn_error", errno, message)``,
#: ``("conn_rejected", message)``, ``("protocol_error", message)``,
#: ``("chunk_bad", file_id, offset, length)``, ``("file_done", file_id)``,
#: ``("write_error", file_id, errno, message)``, ``("events_dropped", count)`` (past 65536
#: undrained events, connection events -- conn_error, conn_rejected, protocol_error -- are
#: only counted; file and chunk events are always kept).
Event = tuple[Union[str, int], ...]
PathArg = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]


class StageStats(NamedTuple):
    """Cumulative counters of one stage (thread pool) since the engine started."""

    bytes: int
    """Payload bytes the stage moved (read, sent, received or written)."""
    busy_s: float
    """Thread-seconds spent working, throttle sleeps included."""
    wait_s: float
    """Thread-seconds blocked on a staging buffer (no free slot / empty queue)."""
    idle_s: float
    """Thread-seconds with nothing to do (no work queued, connecting, peer silent)."""
    threads_target: int
    """Thread count asked for (receiving stage: live connections)."""
    threads_live: int
    """Threads running now (an exiting thread counts until it finished its chunk)."""

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_json(cls, d: Any) -> "StageStats":
        """Read :meth:`to_json` back; a missing counter reads as 0 (a peer of an older version)."""
        return cls(*_fields_from(cls, d))


class BufferStats(NamedTuple):
    """Occupancy of one staging buffer."""

    fill_bytes: int
    """Payload bytes staged (sender: read and not yet fully sent)."""
    capacity_bytes: int
    """The byte cap: slots_total * chunk_size."""
    slots_used: int
    """Slots handed out (being filled, queued, or being drained)."""
    slots_total: int
    """The cap in slots (memory_bytes // chunk_size)."""
    slots_allocated: int
    """Slots malloc'ed so far (lazily, reused, freed at close)."""
    slots_ready: int
    """Filled slots waiting for the consumer stage."""

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_json(cls, d: Any) -> "BufferStats":
        """Read :meth:`to_json` back; a missing counter reads as 0."""
        return cls(*_fields_from(cls, d))


class SenderStats(NamedTuple):
    """A snapshot of the sender, taken without stopping anything."""

    time_s: float
    """CLOCK_MONOTONIC time of the snapshot, for rates between two snapshots."""
    read: StageStats
    net: StageStats
    buffer: BufferStats
    chunks_sent: int
    """Frames handed completely to the kernel."""
    chunks_requeued: int
    """Chunks requeued by requeue() (not counting internal retries after a send error)."""
    frames_corrupted: int
    """Frames corrupted on purpose by the fault_corrupt test hook."""
    chunks_pending: int
    """Chunks queued to read + staged + in flight; 0 means everything reached the kernel."""
    files_failed: int
    """Files that failed (see the file_error events)."""
    tcp_segs_out: int
    """TCP segments sent on the data connections so far (TCP_INFO, closed ones included)."""
    tcp_retrans: int
    """TCP segments retransmitted on them: the network stage's loss is the ratio of the two."""


class ReceiverStats(NamedTuple):
    """A snapshot of the receiver, taken without stopping anything."""

    time_s: float
    recv: StageStats
    write: StageStats
    buffer: BufferStats
    chunks_written: int
    chunks_bad: int
    """Chunks whose XXH3-64 did not match their header (not written)."""
    chunks_duplicate: int
    """Chunks already written or being written (dropped)."""
    chunks_orphaned: int
    """Chunks dropped because their file was removed while they were queued."""
    connections: int
    """Authenticated data connections open now."""
    connections_total: int
    """Authenticated data connections since start."""
    connections_rejected: int
    """Connections closed before any frame: bad hello/token, no hello, too many."""
    protocol_errors: int
    """Connections closed on an invalid frame header."""

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (the receiver's ``status`` reply carries it: ``automdt/PROTOCOL.md``)."""
        return {k: (v.to_json() if isinstance(v, (StageStats, BufferStats)) else v) for k, v in self._asdict().items()}

    @classmethod
    def from_json(cls, d: Any) -> "ReceiverStats":
        """Read :meth:`to_json` back (the sender reads the receiver's ``status`` reply with it); a
        missing counter reads as 0 (a receiver of an older version).

        :raises ValueError: ``d`` is not a JSON object.
        """
        if not isinstance(d, dict):
            raise ValueError(f"receiver stats must be a JSON object, got {type(d).__name__}")
        counts = _fields_from(cls, d)[4:]
        return cls(float(d.get("time_s") or 0.0), StageStats.from_json(d.get("recv")),
                   StageStats.from_json(d.get("write")), BufferStats.from_json(d.get("buffer")), *counts)


def _fields_from(cls: Any, d: Any) -> list[Any]:
    d = d if isinstance(d, dict) else {}
    return [d.get(f) or 0 for f in cls._fields]


def _stage(t: tuple[int, int, int, int, int, int]) -> StageStats:
    return StageStats(t[0], t[1] * _NS, t[2] * _NS, t[3] * _NS, t[4], t[5])


def _check_int(name: str, value: object, lo: int, hi: int | None = None) -> int:
    if type(value) is int and value >= lo and (hi is None or value <= hi):
        return value  # the common case first: this runs several times per file on the data path
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {type(value).__name__}")
    if value < lo or (hi is not None and value > hi):
        bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def _check_throttle(name: str, value: Sequence[int]) -> tuple[int, int]:
    try:
        thread_bps, total_bps = value
    except (TypeError, ValueError):
        raise ValueError(
            f"{name} must be a pair (thread_bps, total_bps) in bytes/s, 0 = unlimited; got {value!r}"
        ) from None
    return (_check_int(f"{name}[0] (thread_bps)", thread_bps, 0),
            _check_int(f"{name}[1] (total_bps)", total_bps, 0))


def _check_key(key: Optional[bytes]) -> Optional[bytes]:
    if key is None:
        return None
    if not isinstance(key, (bytes, bytearray)) or len(key) != TLS_KEY_LEN:
        raise ValueError(f"tls_key must be None or {TLS_KEY_LEN} bytes")
    return bytes(key)


def _check_common(token: bytes, chunk_size: int, memory_bytes: int, max_threads: int) -> None:
    if not isinstance(token, (bytes, bytearray)) or len(token) != TOKEN_LEN:
        raise ValueError(f"token must be {TOKEN_LEN} bytes (e.g. os.urandom({TOKEN_LEN}))")
    _check_int("chunk_size", chunk_size, CHUNK_SIZE_MIN, CHUNK_SIZE_MAX)
    _check_int("memory_bytes", memory_bytes, 1)
    if memory_bytes < chunk_size:
        raise ValueError(
            f"memory_bytes ({memory_bytes}) must hold at least one chunk of {chunk_size} bytes"
        )
    _check_int("max_threads", max_threads, 1, MAX_THREADS)


class _Engine:
    """What both ends share: the event queue, close() and use as a context manager."""

    _e: Any

    def events(self) -> list[Event]:
        """Drain the event queue (see :data:`Event`)."""
        return list(self._e.events())

    def close(self) -> None:
        """Stop every thread, close the connections, free the buffer. Idempotent."""
        self._e.close()

    @property
    def closed(self) -> bool:
        return bool(self._e.closed)

    def __enter__(self: _E) -> _E:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class Sender(_Engine):
    """Source side of a transfer: reads files and sends their chunks to a :class:`Receiver`.

    Threads start at construction (``threads``) and change at any moment with
    :meth:`set_threads`. Each network thread opens its own TCP connection to (host, port); a
    failed connect or send produces a ``conn_error`` event and the thread retries with a
    back-off (0.1 s doubling to 2 s), requeueing the chunk it was sending.

    :param host: receiver address (name or IP).
    :param port: receiver data port.
    :param token: the 32-byte session token every data connection presents.
    :param chunk_size: bytes per chunk (same on both sides).
    :param memory_bytes: byte cap of the sender staging buffer (``memory_bytes // chunk_size`` slots).
    :param max_threads: upper bound of each pool (slot tables are pre-allocated).
    :param read_throttle: ``(thread_bps, total_bps)`` for the read stage, bytes/s, 0 = unlimited.
    :param net_throttle: the same for the network stage.
    :param sndbuf: SO_SNDBUF for each connection (0: kernel default, autotuned).
    :param fault_corrupt: test hook: flip one payload byte of the next N frames after hashing.
    :param threads: ``(read, net)`` thread counts to start with.
    :param tls_key: 32 bytes: every data connection speaks TLS 1.3 keyed with it (external
        PSK + ECDHE, no certificates; the receiver must hold the same key). None: plain TCP.
    :param zerocopy: on plain connections, readers hash each chunk through a small buffer and
        network threads send the payload with ``sendfile()`` straight from the page cache (no
        copy in the staging buffer; the buffer's byte cap then bounds what was read ahead and
        not sent yet). False, TLS, or the switch ``sendfile=0``: chunks are copied into the
        staging buffer and sent from there. See :attr:`zerocopy`.
    :param local: a :class:`Receiver` of this process to hand chunks to over the local link
        instead of connecting to (host, port): a network thread gives the receiver the buffer a
        reader filled (no socket, no copy between the two ends; the receiver's writers verify
        each chunk as always). Plain only (no ``tls_key``); the chunk sizes must match; chunks
        are staged as bytes (``zerocopy`` is off). The sender keeps the receiver alive.
    :param switches: the data-path switches (:mod:`automdt.transfer_engine.switches`: ``sendfile``,
        ``tls_batch``, ``files_at_once``); None: those in force in the process.
    """

    def __init__(
        self,
        host: str,
        port: int,
        token: bytes,
        chunk_size: int,
        memory_bytes: int,
        max_threads: int = 64,
        read_throttle: tuple[int, int] = (0, 0),
        net_throttle: tuple[int, int] = (0, 0),
        sndbuf: int = 0,
        fault_corrupt: int = 0,
        *,
        threads: tuple[int, int] = (1, 1),
        tls_key: Optional[bytes] = None,
        zerocopy: bool = True,
        local: Optional[Receiver] = None,
        switches: Optional[_switches.Switches] = None,
    ) -> None:
        if not isinstance(host, str) or not host:
            raise ValueError("host must be a non-empty string")
        _check_int("port", port, 1, 65535)
        _check_common(token, chunk_size, memory_bytes, max_threads)
        rt, rT = _check_throttle("read_throttle", read_throttle)
        nt, nT = _check_throttle("net_throttle", net_throttle)
        _check_int("sndbuf", sndbuf, 0, 2**31 - 1)
        _check_int("fault_corrupt", fault_corrupt, 0, 2**31 - 1)
        nr, nn = self._check_threads(threads, max_threads)
        self.chunk_size = chunk_size
        self.max_threads = max_threads
        self.encrypted = tls_key is not None
        sw = switches or _switches.current()
        self._e = _engine.Sender(host, port, bytes(token), chunk_size, memory_bytes, max_threads,
                                 rt, rT, nt, nT, sndbuf, fault_corrupt, nr, nn, _check_key(tls_key),
                                 bool(zerocopy) and sw.sendfile, None if local is None else local._e,
                                 sw.files_at_once, not sw.tls_batch)

    @property
    def local(self) -> bool:
        """True when chunks go to a :class:`Receiver` of this process over the local link."""
        return bool(self._e.local)

    @property
    def zerocopy(self) -> bool:
        """True when payloads are sent with ``sendfile()`` from the page cache (see __init__)."""
        return bool(self._e.zerocopy)

    @staticmethod
    def _check_threads(threads: Sequence[int], max_threads: int) -> tuple[int, int]:
        try:
            nr, nn = threads
        except (TypeError, ValueError):
            raise ValueError(f"threads must be a pair (read, net), got {threads!r}") from None
        return (_check_int("read threads", nr, 0, max_threads),
                _check_int("net threads", nn, 0, max_threads))

    def add_file(
        self,
        file_id: int,
        path: PathArg,
        size: int,
        mtime_ns: int,
        ranges: Sequence[tuple[int, int]] | None = None,
    ) -> None:
        """Queue a file (also while the transfer runs).

        :param file_id: u32 id the receiver knows the file by.
        :param path: source path, opened lazily by a reader.
        :param size: size in bytes when the session listed it (> 0; empty files are the
            session layer's job). A different size or mtime at read time fails the file.
        :param mtime_ns: ``st_mtime_ns`` when the session listed it.
        :param ranges: ``(offset, length)`` byte ranges to send (offsets multiples of
            chunk_size, lengths whole chunks unless the range ends at ``size``);
            None = the whole file.
        """
        _check_int("file_id", file_id, 0, 2**32 - 1)
        _check_int("size", size, 1)
        if isinstance(mtime_ns, bool) or not isinstance(mtime_ns, int):
            raise ValueError("mtime_ns must be an int (os.stat(path).st_mtime_ns)")
        if ranges is not None:
            ranges = [self._check_range(file_id, size, r) for r in ranges]
            if not ranges:
                raise ValueError("ranges is empty: pass None to send the whole file")
        self._e.add_file(file_id, os.fspath(path), size, mtime_ns, ranges)

    def _check_range(self, file_id: int, size: int, r: tuple[int, int]) -> tuple[int, int]:
        try:
            offset, length = r
        except (TypeError, ValueError):
            raise ValueError(f"file {file_id}: ranges items must be (offset, length), got {r!r}") from None
        _check_int("range offset", offset, 0)
        _check_int("range length", length, 1)
        if offset % self.chunk_size:
            raise ValueError(
                f"file {file_id}: range offset {offset} is not a multiple of chunk_size {self.chunk_size}"
            )
        if offset + length > size:
            raise ValueError(f"file {file_id}: range ({offset}, {length}) ends beyond size {size}")
        if length % self.chunk_size and offset + length != size:
            raise ValueError(
                f"file {file_id}: range ({offset}, {length}) must be whole chunks "
                f"unless it ends at the file size {size}"
            )
        return (offset, length)

    def requeue(self, file_id: int, offset: int, length: int) -> bool:
        """Send one chunk again (the receiver found it bad or missing).

        :return: True if queued, False if the file failed (its chunks are not sent any more).
        :raises KeyError: unknown file id. :raises ValueError: not one chunk of the file.
        """
        _check_int("file_id", file_id, 0, 2**32 - 1)
        _check_int("offset", offset, 0)
        _check_int("length", length, 1)
        return bool(self._e.requeue(file_id, offset, length))

    def cancel_file(self, file_id: int) -> None:
        """Drop every chunk of the file not sent yet (queued, requeued or staged).

        Use it when the receiver gives up on a file (``remove_file`` there), so its chunks do
        not arrive as protocol errors. Frames already being sent finish; no event follows;
        later ``requeue()`` calls for it return False. :raises KeyError: unknown id.
        """
        _check_int("file_id", file_id, 0, 2**32 - 1)
        self._e.cancel_file(file_id)

    def set_threads(self, read: int, net: int) -> tuple[int, int]:
        """Change the read and network thread counts (0 pauses a stage).

        Growing starts threads (network threads open new connections); shrinking lets each
        extra thread finish its current chunk (a network thread its current frame) and exit.

        :return: the previous ``(read, net)`` targets.
        """
        nr, nn = self._check_threads((read, net), self.max_threads)
        old_r, old_n = self._e.set_threads(nr, nn)
        return (old_r, old_n)

    def set_throttle(self, stage: str, thread_bps: int, total_bps: int) -> None:
        """Set the ``"read"`` or ``"net"`` throttle, bytes/s (0 = unlimited)."""
        if stage not in ("read", "net"):
            raise ValueError(f"stage must be 'read' or 'net' on a Sender, got {stage!r}")
        _check_int("thread_bps", thread_bps, 0)
        _check_int("total_bps", total_bps, 0)
        self._e.set_throttle(stage, thread_bps, total_bps)

    def set_fault_corrupt(self, n: int) -> None:
        """Test hook: corrupt one payload byte of each of the next ``n`` frames."""
        self._e.set_fault_corrupt(_check_int("n", n, 0, 2**31 - 1))

    def stats(self) -> SenderStats:
        """Counters now, including the in-progress state of every thread."""
        t = self._e.stats()
        return SenderStats(t[0] * _NS, _stage(t[1]), _stage(t[2]), BufferStats(*t[3]), *t[4:])


class SharedLimit:
    """A write rate that several :class:`Receiver` objects share: one emulated destination disk
    that every session of a receiving daemon writes to (tests and benchmarks, as ``automdt
    receive --throttle`` uses it). Each chunk a receiver given this limit writes takes its turn
    on one clock with every other's, on top of the receiver's own ``write_throttle``.

    :param total_bps: bytes per second of all those receivers' writes together (> 0).
    """

    def __init__(self, total_bps: int) -> None:
        _check_int("total_bps", total_bps, 1, 2**63 - 1)
        self._l = _engine.SharedLimit(total_bps)

    @property
    def total_bps(self) -> int:
        """The shared rate, bytes per second."""
        return int(self._l.total_bps)


class Receiver(_Engine):
    """Destination side: listens at construction, accepts data connections (one receiving
    thread each), verifies every chunk's XXH3-64 and writes it with a pool of writers.

    Files are registered with :meth:`add_file` (file descriptors stay owned by the caller;
    the engine never closes them). :meth:`remove_file` waits until no writer uses the
    file's descriptors any more, so they can be closed right after it returns.

    :param host: address to bind ("" or "0.0.0.0" for all).
    :param port: port to bind, 0 for an ephemeral one (see :attr:`port`).
    :param token: the 32-byte session token; connections presenting another are rejected.
    :param chunk_size: bytes per chunk (same as the sender).
    :param memory_bytes: byte cap of the receiver staging buffer.
    :param max_threads: upper bound of the write pool (connections: up to twice this).
    :param write_throttle: ``(thread_bps, total_bps)`` for the write stage, bytes/s.
    :param rcvbuf: SO_RCVBUF of the data connections (0: kernel default, autotuned).
    :param threads: write threads to start with.
    :param tls_key: 32 bytes: connections must speak TLS 1.3 keyed with it (see Sender); a
        connection without the key fails its handshake and is counted as rejected.
    :param switches: the data-path switches (:mod:`automdt.transfer_engine.switches`:
        ``tls_batch``); None: those in force in the process.
    :param write_shared: a :class:`SharedLimit` the write stage also keeps to, with the other
        receivers given the same one (None: none).
    """

    def __init__(
        self,
        host: str,
        port: int,
        token: bytes,
        chunk_size: int,
        memory_bytes: int,
        max_threads: int = 64,
        write_throttle: tuple[int, int] = (0, 0),
        rcvbuf: int = 0,
        *,
        threads: int = 1,
        tls_key: Optional[bytes] = None,
        switches: Optional[_switches.Switches] = None,
        write_shared: Optional[SharedLimit] = None,
    ) -> None:
        if not isinstance(host, str):
            raise ValueError("host must be a string ('' binds every address)")
        _check_int("port", port, 0, 65535)
        _check_common(token, chunk_size, memory_bytes, max_threads)
        wt, wT = _check_throttle("write_throttle", write_throttle)
        _check_int("rcvbuf", rcvbuf, 0, 2**31 - 1)
        _check_int("threads", threads, 0, max_threads)
        if write_shared is not None and not isinstance(write_shared, SharedLimit):
            raise ValueError(f"write_shared must be a SharedLimit or None, got {type(write_shared).__name__}")
        self.chunk_size = chunk_size
        self.max_threads = max_threads
        self.encrypted = tls_key is not None
        sw = switches or _switches.current()
        self._e = _engine.Receiver(host, port, bytes(token), chunk_size, memory_bytes,
                                   max_threads, wt, wT, rcvbuf, threads, _check_key(tls_key),
                                   not sw.tls_batch, write_shared._l if write_shared else None)

    @property
    def port(self) -> int:
        """The bound TCP port."""
        return int(self._e.port)

    def nchunks(self, size: int) -> int:
        """Number of chunks of a file of ``size`` bytes."""
        return -(-size // self.chunk_size)

    def add_file(self, file_id: int, fd: int, journal_fd: int, size: int,
                 done_chunks: bytes | None = None) -> None:
        """Register a destination file.

        :param file_id: u32 id used by the sender.
        :param fd: writable fd of the destination (temporary) file; chunks are pwrite()n at
            their offsets. Owned by the caller.
        :param journal_fd: fd opened with O_APPEND for 32-byte journal records, or -1.
        :param size: final size in bytes (> 0).
        :param done_chunks: bitmap of chunks already present (bit i = chunk i, LSB first
            within each byte), exactly ``ceil(nchunks / 8)`` bytes; None = nothing yet.
            If every chunk is present, a ``file_done`` event follows at once.
        """
        _check_int("file_id", file_id, 0, 2**32 - 1)
        _check_int("fd", fd, 0)
        _check_int("journal_fd", journal_fd, -1)
        _check_int("size", size, 1)
        if done_chunks is not None:
            if not isinstance(done_chunks, (bytes, bytearray, memoryview)):
                raise ValueError("done_chunks must be bytes (a bitmap) or None")
            want = (self.nchunks(size) + 7) // 8
            if len(done_chunks) != want:
                raise ValueError(
                    f"done_chunks must be {want} bytes for {self.nchunks(size)} chunks, "
                    f"got {len(done_chunks)}"
                )
            done_chunks = bytes(done_chunks)
        self._e.add_file(file_id, fd, journal_fd, size, done_chunks)

    def remove_file(self, file_id: int) -> None:
        """Forget a file; returns once no writer uses its fds. :raises KeyError: unknown id."""
        _check_int("file_id", file_id, 0, 2**32 - 1)
        self._e.remove_file(file_id)

    def missing(self, file_id: int) -> list[tuple[int, int]]:
        """``(offset, length)`` of every chunk not written yet. :raises KeyError: unknown id."""
        _check_int("file_id", file_id, 0, 2**32 - 1)
        return list(self._e.missing(file_id))

    def set_threads(self, write: int) -> int:
        """Change the write thread count (0 pauses writing). :return: the previous count."""
        return int(self._e.set_threads(_check_int("write threads", write, 0, self.max_threads)))

    def set_write_behind(self, on: bool) -> None:
        """Start each chunk's write-back to the disk once it is written (``sync_file_range``,
        not waiting): a durable point at the end then finds little left to write."""
        self._e.set_write_behind(bool(on))

    def set_memory(self, memory_bytes: int) -> int:
        """Change the staging buffer's cap (at least one chunk) while running: a lower cap frees
        buffer memory as the writers drain it. :return: the previous cap in bytes."""
        return int(self._e.set_memory(_check_int("memory_bytes", memory_bytes, self.chunk_size)))

    def set_throttle(self, stage: str, thread_bps: int, total_bps: int) -> None:
        """Set the ``"write"`` throttle, or the ``"recv"`` one (the pace at which chunks are read
        off the data connections: TCP's flow control then slows the sender), bytes/s (0 =
        unlimited)."""
        if stage not in ("write", "recv"):
            raise ValueError(f"stage must be 'write' or 'recv' on a Receiver, got {stage!r}")
        _check_int("thread_bps", thread_bps, 0)
        _check_int("total_bps", total_bps, 0)
        self._e.set_throttle(stage, thread_bps, total_bps)

    def stats(self) -> ReceiverStats:
        """Counters now, including the in-progress state of every thread."""
        t = self._e.stats()
        return ReceiverStats(t[0] * _NS, _stage(t[1]), _stage(t[2]), BufferStats(*t[3]), *t[4:])

    def close(self) -> None:
        """Stop accepting, close connections, join every thread, free the buffer. Idempotent."""
        self._e.close()
