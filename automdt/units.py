"""Parsing of sizes, rates, thread triples and throttle specs given on the command line."""
from __future__ import annotations

import re
from typing import Dict, Tuple

from automdt.policy_contract import STAGES

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]?)(i?)[bB]?\s*$")
_POW = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(text: str, what: str = "size") -> int:
    """Parse ``"4M"`` (powers of 1000), ``"4Mi"`` (powers of 1024), or a plain number of bytes.

    >>> parse_size("4M"), parse_size("4Mi"), parse_size("1500")
    (4000000, 4194304, 1500)
    """
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"bad {what} {text!r}: use a number with an optional K/M/G/T suffix (Ki/Mi/Gi for powers of 1024)")
    value, unit, binary = m.groups()
    base = 1024 if binary else 1000
    return int(round(float(value) * base ** _POW[unit.lower()]))


def format_bytes(n: float) -> str:
    """Human-readable byte count in powers of 1024 (``1.5 GiB``)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def parse_threads(text: str) -> Tuple[int, int, int]:
    """Parse ``"R,N,W"`` thread counts, each at least 1."""
    parts = str(text).split(",")
    if len(parts) != 3:
        raise ValueError(f"bad thread counts {text!r}: expected R,N,W such as 4,8,4")
    try:
        vals = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"bad thread counts {text!r}: expected three integers R,N,W") from None
    if min(vals) < 1:
        raise ValueError(f"bad thread counts {text!r}: every count must be at least 1")
    return vals  # type: ignore[return-value]



def parse_throttle(spec: str) -> Dict[str, Tuple[float, float]]:
    """Parse ``read.thread=40M,net.total=400M`` into ``{stage: (thread_bps, total_bps)}``.

    Rates are bytes per second with K/M/G suffixes in powers of 1000; any subset may be given;
    0 means unlimited.
    """
    out = {s: [0.0, 0.0] for s in STAGES}
    if spec is None or not str(spec).strip():
        return {s: (0.0, 0.0) for s in STAGES}
    for item in str(spec).split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        stage, dot, kind = key.strip().partition(".")
        if not sep or not dot or stage not in STAGES or kind not in ("thread", "total"):
            raise ValueError(
                f"bad throttle {item!r}: expected STAGE.KIND=RATE with STAGE in read/net/write "
                "and KIND thread or total, e.g. read.thread=40M")
        rate = parse_size(value, "rate")
        out[stage][0 if kind == "thread" else 1] = float(rate)
    return {s: (v[0], v[1]) for s, v in out.items()}


def parse_hostport(text: str, default_host: str = "127.0.0.1") -> Tuple[str, int]:
    """Parse ``HOST:PORT`` (``[v6]:PORT`` too); ``:PORT`` uses ``default_host``."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not port.isdigit() or not (0 <= int(port) <= 65535):
        raise ValueError(f"bad address {text!r}: expected HOST:PORT such as 127.0.0.1:5000")
    host = host.strip("[]") or default_host
    return host, int(port)
