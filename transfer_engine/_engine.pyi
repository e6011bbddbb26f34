"""Stubs of the private C extension; use automdt.transfer_engine (engine.py) instead."""

from typing import Sequence, Union

# transfer_engine/src/constants.h
CHUNK_SIZE_MIN: int
CHUNK_SIZE_MAX: int
MAX_THREADS: int
SESSION_CHUNK_SIZE_MIN: int
SESSION_CHUNK_SIZE_MAX: int
WAIT_MS: int
EVENTS_MAX: int
TOKEN_LEN: int
TLS_KEY_LEN: int
HELLO_MAGIC: bytes
HELLO_LEN: int
FRAME_MAGIC: int
FRAME_HEADER_LEN: int
FRAME_HEADER_FORMAT: str
JOURNAL_MAGIC: bytes
JOURNAL_RECORD_LEN: int
JOURNAL_RECORD_LENGTH: int
JOURNAL_RECORD_OFFSET: int
JOURNAL_RECORD_HASH: int
JOURNAL_RECORD_CHECK: int
JOURNAL_RECORD_FORMAT: str
# of this build and process
HASH_IMPL: str
FILES_AT_ONCE_MAX: int

# (bytes, busy_ns, wait_ns, idle_ns, threads_target, threads_live)
_StageTuple = tuple[int, int, int, int, int, int]
# (fill_bytes, capacity_bytes, slots_used, slots_total, slots_allocated, slots_ready)
_BufferTuple = tuple[int, int, int, int, int, int]
_Event = tuple[Union[str, int], ...]
_Path = Union[str, bytes]

class Sender:
    closed: bool
    def __init__(
        self,
        host: str,
        port: int,
        token: bytes,
        chunk_size: int,
        memory_bytes: int,
        max_threads: int = 64,
        read_thread_bps: int = 0,
        read_total_bps: int = 0,
        net_thread_bps: int = 0,
        net_total_bps: int = 0,
        sndbuf: int = 0,
        fault_corrupt: int = 0,
        read_threads: int = 1,
        net_threads: int = 1,
        tls_key: bytes | None = None,
        zerocopy: bool = True,
        local: Receiver | None = None,
        files_at_once: int = 0,
        tls_per_record: bool = False,
    ) -> None: ...
    zerocopy: bool
    local: bool
    def add_file(
        self,
        file_id: int,
        path: _Path,
        size: int,
        mtime_ns: int,
        ranges: Sequence[tuple[int, int]] | None = None,
        /,
    ) -> None: ...
    def requeue(self, file_id: int, offset: int, length: int, /) -> bool: ...
    def cancel_file(self, file_id: int, /) -> None: ...
    def set_threads(self, read: int, net: int, /) -> tuple[int, int]: ...
    def set_throttle(self, stage: str, thread_bps: int, total_bps: int, /) -> None: ...
    def set_fault_corrupt(self, n: int, /) -> None: ...
    # (time_ns, read, net, buffer, chunks_sent, chunks_requeued, frames_corrupted,
    #  chunks_pending, files_failed, tcp_segs_out, tcp_retrans)
    def stats(
        self,
    ) -> tuple[int, _StageTuple, _StageTuple, _BufferTuple, int, int, int, int, int, int, int]: ...
    def events(self) -> list[_Event]: ...
    def close(self) -> None: ...

class Receiver:
    closed: bool
    port: int
    def __init__(
        self,
        host: str,
        port: int,
        token: bytes,
        chunk_size: int,
        memory_bytes: int,
        max_threads: int = 64,
        write_thread_bps: int = 0,
        write_total_bps: int = 0,
        rcvbuf: int = 0,
        write_threads: int = 1,
        tls_key: bytes | None = None,
        tls_per_record: bool = False,
        write_shared: SharedLimit | None = None,
    ) -> None: ...
    def add_file(
        self, file_id: int, fd: int, journal_fd: int, size: int, done_chunks: bytes | None = None, /
    ) -> None: ...
    def remove_file(self, file_id: int, /) -> None: ...
    def missing(self, file_id: int, /) -> list[tuple[int, int]]: ...
    def set_threads(self, write: int, /) -> int: ...
    def set_memory(self, memory_bytes: int, /) -> int: ...
    def set_write_behind(self, on: bool, /) -> None: ...
    def set_throttle(self, stage: str, thread_bps: int, total_bps: int, /) -> None: ...
    # (time_ns, recv, write, buffer, chunks_written, chunks_bad, chunks_duplicate,
    #  chunks_orphaned, connections, connections_total, connections_rejected, protocol_errors)
    def stats(
        self,
    ) -> tuple[int, _StageTuple, _StageTuple, _BufferTuple, int, int, int, int, int, int, int, int]: ...
    def events(self) -> list[_Event]: ...
    def close(self) -> None: ...

class SharedLimit:
    total_bps: int
    def __init__(self, total_bps: int) -> None: ...

def trim_cache(max_age_s: float = 0.0, /) -> None: ...
def cached_bytes() -> int: ...
def hash64(data: bytes, impl: str = "", /) -> int: ...
def set_debug(on: bool, /) -> bool: ...
