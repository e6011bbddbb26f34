"""Exit codes and the one exception type that carries them.

The numbering follows rclone's 0-10 where the meaning fits, then AutoMDT's own from 11
(``docs/exit-codes.md``, or ``automdt exit-codes``). Every user-facing failure is an
:class:`AutomdtError`: the CLI prints its message on one line and exits with its code, never with
a traceback.
"""
from __future__ import annotations

import errno as _errno
from typing import Union

OK = 0
"""Success, including nothing to do."""
ERROR = 1
"""Uncategorised error."""
USAGE = 2
"""Bad command line, configuration, profile or policy file."""
DIR_NOT_FOUND = 3
"""Source directory not found, or the destination (root or SUBDIR) missing or not writable."""
FILE_NOT_FOUND = 4
"""Source file not found."""
NETWORK = 5
"""Receiver unreachable or connection lost after retries; safe to re-run (resumes)."""
FILES_FAILED = 6
"""Some files failed with a non-retryable error (permissions, refused names)."""
FATAL = 7
"""Fatal: destination full, over quota or gone read-only, authentication rejected, ``--encrypt`` differs between the ends,
or the data did not reach the disk (the durable point's write-back failed)."""
MAX_DURATION = 10
"""``--max-duration`` reached; the next run resumes."""
INTEGRITY = 11
"""A chunk kept failing its checksum after re-sends; nothing was renamed into place."""
SOURCE_CHANGED = 12
"""A source file changed or vanished while it was read; re-run to pick up the new content."""
LOCK_BUSY = 13
"""Another run holds the lock."""
WEAK_FIT = 14
"""``explore``: the fitted profile rests on too little evidence (``--allow-weak-fit`` accepts it)."""
INTERRUPTED = 130
"""SIGINT (143 for SIGTERM): stopped after the journal was flushed; re-run to resume."""

EXIT_CODES = {
    OK: "success (also when nothing needed to move)",
    ERROR: "uncategorised error",
    USAGE: "usage, configuration, profile or policy file error",
    DIR_NOT_FOUND: "source directory or destination root not found, or the destination not writable",
    FILE_NOT_FOUND: "source file not found",
    NETWORK: "receiver unreachable or connection lost; safe to re-run (resumes)",
    FILES_FAILED: "some files failed (permissions, refused names); others completed",
    FATAL: "fatal: destination full, authentication rejected, --encrypt differs between the ends, or the data did "
           "not reach the disk",
    MAX_DURATION: "--max-duration reached; the next run resumes",
    INTEGRITY: "integrity failure persisted after re-sends; nothing renamed into place",
    SOURCE_CHANGED: "a source file changed or vanished during the transfer",
    LOCK_BUSY: "another run holds the lock",
    WEAK_FIT: "explore: too little evidence for the profile (written as NAME.weak.yaml; --allow-weak-fit)",
    130: "interrupted by SIGINT (journal flushed; re-run resumes)",
    143: "terminated by SIGTERM (journal flushed; re-run resumes)",
}

# When several problems happen in one run, the most serious code wins.
_SEVERITY = [FATAL, INTEGRITY, NETWORK, SOURCE_CHANGED, FILES_FAILED, FILE_NOT_FOUND, ERROR]


def worst(codes) -> int:
    """Return the most serious of several exit codes (0 if none)."""
    codes = set(c for c in codes if c)
    for c in _SEVERITY:
        if c in codes:
            return c
    return max(codes) if codes else OK


DESTINATION_FULL_ERRNOS = frozenset({_errno.ENOSPC, _errno.EDQUOT})
"""A destination out of space or over quota."""
DESTINATION_FATAL_ERRNOS = DESTINATION_FULL_ERRNOS | {_errno.EROFS}
"""A destination that fails a write during the transfer and where no other file can succeed
either (exit 7): full, over quota, or gone read-only (a filesystem does so after a disk error)."""
SOURCE_GONE_ERRNOS = frozenset({0, _errno.ENOENT, _errno.ESTALE})
"""A source file vanished or changed while read (0: the engine saw the change, no call failed)."""


def from_oserror(err: Union[OSError, int], default: int = FILES_FAILED, *, source: bool = False,
                 writing: bool = False) -> int:
    """The exit code of a failed system call, classified once for both ends (rclone's ``fserrors``).

    :param err: the ``OSError``, or its ``errno`` as the engine reports it in an event.
    :param default: the code of any other failure (a file that failed on its own: 6; the
        receiver's catch-all for a request: 1).
    :param source: the call read a source file: one that vanished or changed is 12.
    :param writing: the call wrote a destination file during the transfer: a filesystem that
        went read-only (``EROFS``) fails every file after it, so it is 7 too (a destination that is
        read-only when the run opens it is "not writable", the caller's ``default``).
    :return: with ``source``, 12 for a source that vanished or changed; otherwise 7 for a full
        destination (``ENOSPC``, ``EDQUOT``) or, ``writing``, one gone read-only; else ``default``.
    """
    n = err if isinstance(err, int) else err.errno
    if source:  # reading a source never fills a disk
        return SOURCE_CHANGED if n in SOURCE_GONE_ERRNOS else default
    fatal = DESTINATION_FATAL_ERRNOS if writing else DESTINATION_FULL_ERRNOS
    return FATAL if n in fatal else default


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived (``code`` 130 or 143). A :class:`KeyboardInterrupt`, so no
    ``except Exception`` on the way swallows it."""

    def __init__(self, code: int = INTERRUPTED):
        super().__init__(code)
        self.code = code


class AutomdtError(Exception):
    """A failure the user can act on: a one-line message and an exit code."""

    def __init__(self, message: str, code: int = ERROR):
        super().__init__(message)
        self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0])
