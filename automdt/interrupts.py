"""SIGINT/SIGTERM: stop once, cleanly, whatever else arrives.

The first signal raises :class:`~automdt.errors.Interrupted` (code 128 + signal number) in the
main thread, unless the code there is inside :func:`shielded` (shutting down: closing the
engine, telling the receiver, writing the summary). Every later signal, and one that arrives
while shielded, is only recorded: :func:`pending` reports it, and the run's exit code becomes
130/143 once its shutdown is done. So Ctrl-C twice, or Ctrl-C then the SIGTERM of ``timeout``,
never interrupts a shutdown half-way.

The CLI installs the handlers for the whole command (:func:`handling` in ``main``);
:func:`automdt.sender.run_transfer` installs them for the length of a transfer when called from
Python (in the main thread only; elsewhere signals are left alone).
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Dict, Iterator, Optional

from automdt.errors import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _State:
    def __init__(self) -> None:
        self.code: Optional[int] = None
        """130/143 of the first signal since the handlers were installed."""
        self.delivered = False
        """An :class:`Interrupted` was raised for it."""
        self.count = 0
        self.shield = 0
        self.startup = False
        self.depth = 0
        self.old: Dict[int, object] = {}


_state = _State()


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _handler(signum: int, frame) -> None:
    s = _state
    s.count += 1
    if s.code is None:
        s.code = 128 + signum
    if not s.delivered and s.shield == 0:
        s.delivered = True
        raise Interrupted(s.code)


def _late(signum: int, frame) -> None:
    """After the command: the outcome is decided and reported; a late signal changes nothing."""
    _state.count += 1


@contextmanager
def handling(start_shielded: bool = False, process_exit: bool = False) -> Iterator[None]:
    """Install the handlers for the duration (nests; outside the main thread: does nothing).

    With ``start_shielded`` (the CLI's start-up) the handlers begin shielded, so a signal that
    arrives while the command line is parsed and checked is only recorded, until :func:`ready`
    says the command can report it (a transfer: once its summary can be written).
    With ``process_exit`` (the ``automdt`` process itself) the handlers are not restored at the
    end: the signals are blocked instead (and ignored should one get through), because the second
    Ctrl-C of a pair may arrive after the summary is out, while the interpreter shuts down (which
    resets every handler to the default), and must neither kill the process nor change its code.
    """
    if not _main_thread():
        yield
        return
    if _state.depth == 0:
        _state.code, _state.delivered, _state.count = None, False, 0
        _state.startup = start_shielded
        _state.shield += int(start_shielded)  # before the handlers exist: no gap
        _state.old = {s: signal.signal(s, _handler) for s in SIGNALS}
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1
        if _state.depth == 0:
            if process_exit:
                signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)  # pending ones die with the process
            for s, h in _state.old.items():
                signal.signal(s, _late if process_exit else h)  # type: ignore[arg-type]
            _state.old = {}
            if _state.startup:
                _state.shield -= 1
                _state.startup = False


def ready() -> None:
    """End the start-up shield of :func:`handling` and act on a signal that arrived during it."""
    if _main_thread() and _state.startup:
        _state.startup = False
        _state.shield -= 1
    check()


@contextmanager
def shielded() -> Iterator[None]:
    """A region no signal interrupts (signals are recorded; see :func:`pending`)."""
    main = _main_thread()
    if main:
        _state.shield += 1
    try:
        yield
    finally:
        if main:
            _state.shield -= 1


def pending() -> Optional[int]:
    """130/143 if a signal arrived since the handlers were installed (else None)."""
    return _state.code if _state.depth else None


def check() -> None:
    """Raise :class:`Interrupted` for a signal that arrived while shielded and was not raised yet."""
    if _state.depth and _state.code is not None and not _state.delivered and _main_thread():
        _state.delivered = True
        raise Interrupted(_state.code)
