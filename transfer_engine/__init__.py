"""The modular transfer engine (C extension) and its typed Python wrapper.

Public API: :class:`Sender`, :class:`Receiver` and their stats NamedTuples. The C extension
``_engine`` is private; see ``engine.py`` for the documentation and PROTOCOL.md for the wire
format.
"""

try:
    from .engine import (
        CHUNK_SIZE_MAX,
        CHUNK_SIZE_MIN,
        JOURNAL_MAGIC,
        JOURNAL_RECORD_CHECK,
        JOURNAL_RECORD_FORMAT,
        JOURNAL_RECORD_LEN,
        MAX_THREADS,
        SESSION_CHUNK_SIZE_MAX,
        SESSION_CHUNK_SIZE_MIN,
        TOKEN_LEN,
        TLS_KEY_LEN,
        BufferStats,
        Event,
        Receiver,
        ReceiverStats,
        Sender,
        SenderStats,
        SharedLimit,
        StageStats,
        frame_hash,
        trim_cache,
    )
except ImportError as exc:  # pragma: no cover - only without a built extension
    raise ImportError(
        f"automdt.transfer_engine: the C extension is not built ({exc}); "
        "run `make build` (or `pip install -e .`) in the repository"
    ) from exc

__all__ = [
    "frame_hash",
    "BufferStats",
    "CHUNK_SIZE_MAX",
    "CHUNK_SIZE_MIN",
    "Event",
    "JOURNAL_MAGIC",
    "JOURNAL_RECORD_CHECK",
    "JOURNAL_RECORD_FORMAT",
    "JOURNAL_RECORD_LEN",
    "MAX_THREADS",
    "Receiver",
    "ReceiverStats",
    "Sender",
    "SenderStats",
    "SharedLimit",
    "SESSION_CHUNK_SIZE_MAX",
    "SESSION_CHUNK_SIZE_MIN",
    "StageStats",
    "TOKEN_LEN",
    "TLS_KEY_LEN",
    "trim_cache",
]
