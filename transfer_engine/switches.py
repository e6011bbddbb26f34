"""Data-path switches: the one configuration object of the engine's comparison settings.

Each switch turns off (or pins) one optimisation of the data path so that a benchmark or an
A/B run can measure what it buys; every default is what a transfer uses, and nothing else
needs them. They are set for the whole process (:func:`configure`, or :func:`using` for a
block) before engines start: the CLI's ``--switch NAME=VALUE`` (``transfer``, ``explore``,
``receive``) sets them, and a transfer records those not at their default in its interval log's
``start`` record (``"switches"``) and in its summary's ``start``.

=================  =======  ==================================================================
name               default  what the other value does
=================  =======  ==================================================================
``local_link``     1        0: a local destination takes loopback TCP (with TLS under
                            ``--encrypt``) instead of handing chunks over inside the process
``sendfile``       1        0: plain connections copy every chunk into the staging buffer and
                            send it from there instead of ``sendfile()`` from the page cache
``tls_batch``      1        0: TLS makes one socket call per record (no batched writes on the
                            sender, no read-ahead on the receiver); set it on both ends
``files_at_once``  0        N (1..64): the sender reads N files at the same time (1: in add
                            order); 0: as many as the wider of its read and network stages
=================  =======  ==================================================================

Standard library only, like the rest of the engine package.
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, Optional, Union

from . import _engine

FILES_AT_ONCE_MAX = int(_engine.FILES_AT_ONCE_MAX)


@dataclass(frozen=True)
class Switches:
    """The data-path switches (see the module docstring); the defaults are a normal transfer's."""

    local_link: bool = True
    sendfile: bool = True
    tls_batch: bool = True
    files_at_once: int = 0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type == "bool" and not isinstance(v, bool):
                raise ValueError(f"switch {f.name}: expected 0 or 1, got {v!r}")
        if isinstance(self.files_at_once, bool) or not isinstance(self.files_at_once, int) \
                or not 0 <= self.files_at_once <= FILES_AT_ONCE_MAX:
            raise ValueError(f"switch files_at_once: expected 0..{FILES_AT_ONCE_MAX}, got {self.files_at_once!r}")

    def changed(self) -> Dict[str, Any]:
        """The switches not at their default, ``{name: value}`` (what a transfer records)."""
        default = Switches()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}

    @classmethod
    def parse(cls, specs: Union[str, Iterable[str], None]) -> "Switches":
        """``Switches`` from ``NAME=VALUE`` items (comma-separated, or several strings; later
        ones win): ``local_link=0,tls_batch=0``. ValueError names a bad item in one line."""
        items = [specs] if isinstance(specs, str) else list(specs or [])
        values: Dict[str, Any] = {}
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for item in (x.strip() for spec in items for x in spec.split(",")):
            if not item:
                continue
            name, eq, text = item.partition("=")
            name = name.strip().replace("-", "_")
            if name not in fields or not eq:
                raise ValueError(f"--switch {item}: expected NAME=VALUE with NAME one of {', '.join(fields)}")
            text = text.strip()
            if fields[name].type == "bool":
                if text not in ("0", "1"):
                    raise ValueError(f"--switch {item}: {name} is 0 or 1")
                values[name] = text == "1"
            else:
                try:
                    values[name] = int(text)
                except ValueError:
                    raise ValueError(f"--switch {item}: {name} is a whole number") from None
        try:
            return cls(**values)
        except ValueError as e:
            raise ValueError(f"--{e}") from None


_current = Switches()


def current() -> Switches:
    """The switches in force in this process."""
    return _current


def configure(switches: Optional[Switches]) -> Switches:
    """Put ``switches`` in force for the engines started from now on (None: the defaults);
    returns the ones in force before."""
    global _current
    previous, _current = _current, switches or Switches()
    return previous


@contextlib.contextmanager
def using(**values: Any) -> Iterator[Switches]:
    """``with using(sendfile=False): ...``: those switches for the block, then the previous ones."""
    previous = configure(dataclasses.replace(_current, **values))
    try:
        yield _current
    finally:
        configure(previous)
