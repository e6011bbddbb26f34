"""Argument checking for the ``automdt`` command line: value types, one-line usage errors, and
output paths checked before any work starts.

Every option's value is validated by its argparse ``type`` (or, for values whose check needs
other options, right after parsing), so a bad value costs no transfer, exploration or training:
``automdt: automdt transfer: argument --retries: must be an integer >= 0, got '-1'`` and exit 2.
"""
from __future__ import annotations

import argparse
import difflib
import math
import os
import re
import sys
import tempfile
from typing import Callable, List, NoReturn, Optional

from automdt import errors
from automdt.errors import AutomdtError


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``automdt: PROG: MESSAGE``) and exit 2.

    An option it does not know is reported by the subcommand it was given to (``automdt transfer:
    unrecognized arguments: --chunksize 1M; did you mean --chunk-size?`` and ``see `automdt
    transfer --help```), before any missing required argument, and a mistyped choice (a command,
    ``--fsync fil``) gets the closest valid one, as git and cargo suggest."""

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def parse_args(self, args=None, namespace=None):
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self._chosen(ns)
            parser.error(parser._unknown_message(extras))
        return ns

    def _chosen(self, ns: argparse.Namespace) -> "Parser":
        """The (sub)parser that read the options: the subcommand's, when one was given."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                sub = action.choices.get(getattr(ns, action.dest, None) or "")
                if isinstance(sub, Parser):
                    return sub._chosen(ns)
        return self

    def _known(self, token: str) -> bool:
        """Whether ``token`` (an option, maybe ``--opt=value``, maybe abbreviated) is one of ours."""
        name = token.split("=", 1)[0]
        if name in self._option_string_actions:
            return True
        if name.startswith("--"):
            return self.allow_abbrev and any(o.startswith(name) for o in self._option_string_actions)
        return name[:2] in self._option_string_actions  # -qn: combined short flags

    def _unknown_message(self, extras: List[str]) -> str:
        text = f"unrecognized arguments: {' '.join(extras)}"
        options = sorted(o for o in self._option_string_actions if o.startswith("--"))
        hints = []
        for token in extras:
            name = token.split("=", 1)[0]
            if name.startswith("-") and not _NUMBER.match(name):
                close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
                if close:
                    hints.append(close[0])
        return text + (f"; did you mean {' or '.join(dict.fromkeys(hints))}?" if hints else "")

    def error(self, message: str) -> NoReturn:
        text = " ".join(str(message).split())
        argv = getattr(self, "_argv", [])
        if text.startswith("the following arguments are required"):
            # a mistyped option leaves a required one "missing": name the typo instead
            positional = argv[:argv.index("--")] if "--" in argv else argv
            unknown = [t for t in positional if t.startswith("-") and t != "-" and not _NUMBER.match(t)
                       and not self._known(t)]
            if unknown:
                text = self._unknown_message(unknown)
        m = _INVALID_CHOICE.search(text)
        if m:
            close = difflib.get_close_matches(m.group(1), re.findall(r"'([^']*)'", m.group(2)), n=1, cutoff=0.6)
            if close:
                text += f"; did you mean {close[0]!r}?"
        if self.prog == "automdt" or self.prog.startswith("automdt "):
            where = "automdt: " + (self.prog[len("automdt "):] + ": " if " " in self.prog else "")
        else:
            where = f"{self.prog}: "
        self.exit(errors.USAGE, f"{where}{text} (see `{self.prog} --help`)\n")


_NUMBER = re.compile(r"^-\d+(\.\d*)?$|^-\.\d+$")
_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")


def _fail(text: str) -> NoReturn:
    raise argparse.ArgumentTypeError(text)


def integer(lo: int, hi: Optional[int] = None) -> Callable[[str], int]:
    """An integer in ``[lo, hi]``."""

    def conv(text: str) -> int:
        try:
            v = int(str(text).strip(), 10)
        except ValueError:
            _fail(f"expected an integer, got {text!r}")
        if v < lo or (hi is not None and v > hi):
            _fail(f"must be an integer >= {lo}, got {text!r}" if hi is None
                  else f"must be an integer from {lo} to {hi}, got {text!r}")
        return v

    conv.__name__ = "integer"
    return conv


def number(lo: float, hi: Optional[float] = None, lo_open: bool = False, what: str = "a number"
           ) -> Callable[[str], float]:
    """A finite number in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""

    def conv(text: str) -> float:
        try:
            v = float(str(text).strip())
        except ValueError:
            _fail(f"expected {what}, got {text!r}")
        low_bad = v <= lo if lo_open else v < lo
        if not math.isfinite(v) or low_bad or (hi is not None and v > hi):
            rng = f"{'>' if lo_open else '>='} {lo:g}" if hi is None else \
                f"{'above' if lo_open else 'from'} {lo:g} {'up ' if lo_open else ''}to {hi:g}"
            _fail(f"must be {what} {rng}, got {text!r}")
        return v

    conv.__name__ = "number"
    return conv


def seconds(lo: float = 0.0, lo_open: bool = True, hi: Optional[float] = None) -> Callable[[str], float]:
    return number(lo, hi, lo_open=lo_open, what="a number of seconds")


def size(lo: int = 1, hi: Optional[int] = None, what: str = "size") -> Callable[[str], str]:
    """A byte count such as ``4Mi`` or ``1G`` in ``[lo, hi]``; the text is returned unchanged."""
    from automdt.units import format_bytes, parse_size

    def conv(text: str) -> str:
        try:
            v = parse_size(text, what)
        except ValueError as e:
            _fail(str(e))
        if v < lo or (hi is not None and v > hi):
            _fail(f"bad {what} {text!r}: must be at least {format_bytes(lo)}" if hi is None else
                  f"bad {what} {text!r}: must be from {format_bytes(lo)} to {format_bytes(hi)}")
        return text

    conv.__name__ = "size"
    return conv


def threads(text: str) -> str:
    """``R,N,W`` thread counts (checked; the text is returned unchanged)."""
    from automdt.units import parse_threads

    try:
        parse_threads(text)
    except ValueError as e:
        _fail(str(e))
    return text


def hostport(text: str) -> str:
    from automdt.units import parse_hostport

    try:
        parse_hostport(text)
    except ValueError as e:
        _fail(str(e))
    return text


def nonempty(text: str) -> str:
    if not str(text).strip():
        _fail("must not be empty")
    return text


# ------------------------------------------------------------------------------ output paths
def check_output_file(path: str, option: str) -> None:
    """Fail (exit 2) unless a file can be written at ``path``: its directory exists and takes a
    new file, and ``path`` is no directory. Creates nothing that stays."""
    if not path or not str(path).strip():
        raise AutomdtError(f"{option}: empty file name", errors.USAGE)
    if os.path.isdir(path):
        raise AutomdtError(f"{option} {path}: is a directory", errors.USAGE)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise AutomdtError(f"{option} {path}: directory {parent} does not exist", errors.USAGE)
    try:
        fd, probe = tempfile.mkstemp(prefix=".automdt-check-", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise AutomdtError(f"{option} {path}: cannot write in {parent}: {e.strerror}", errors.USAGE) from None


def check_append_file(path: str, option: str) -> None:
    """Fail (exit 2) unless ``path`` can be opened for appending (it is created if missing)."""
    if not path or not str(path).strip():
        raise AutomdtError(f"{option}: empty file name", errors.USAGE)
    if os.path.isdir(path):
        raise AutomdtError(f"{option} {path}: is a directory", errors.USAGE)
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        raise AutomdtError(f"{option} {path}: cannot open for writing: {e.strerror}", errors.USAGE) from None


def save_result(path: str, write: Callable[[str], None], what: str, text: Optional[str] = None) -> str:
    """Write a finished run's result (summary, profile) to ``path``; if that fails now (the
    directory vanished, the disk filled), write it beside: to the current directory or the temp
    directory, or as a last resort (with ``text``) to stderr. Returns where it went; says so on
    stderr whenever that is not ``path``. Never raises for a write failure."""
    try:
        write(path)
        return path
    except OSError as e:
        first = f"{path}: {e.strerror or e}"
    base, ext = os.path.splitext(os.path.basename(path) or what)
    for d in (os.getcwd(), tempfile.gettempdir()):
        try:
            fd, alt = tempfile.mkstemp(prefix=f"{base}-", suffix=ext, dir=d)
            os.close(fd)
            write(alt)
        except OSError:
            continue
        print(f"automdt: cannot write the {what} to {first}; written to {alt} instead", file=sys.stderr)
        return alt
    if text is not None:
        print(f"automdt: cannot write the {what} to {first}; here it is:", file=sys.stderr)
        print(text, file=sys.stderr)
    else:
        print(f"automdt: cannot write the {what} to {first}, nor beside it", file=sys.stderr)
    return "<stderr>"


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename."""
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def parse_shard_text(text: str):
    """``I/N`` -> ``(I, N)`` (``ValueError`` with a one-line reason)."""
    from automdt.manifest import parse_shard

    return parse_shard(text)


def shard(text: str) -> str:
    """``--shard I/N`` (checked; the text is returned unchanged)."""
    try:
        parse_shard_text(text)
    except ValueError as e:
        _fail(str(e))
    return text
