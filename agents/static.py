"""Static thread counts: a fixed (read, net, write) triple, and the Globus-like preset.

Globus / GridFTP tune two numbers: *concurrency* (files in flight, each with its own control
and data channel) and *parallelism* (TCP streams per file). In a monolithic mover each file in
flight is read, sent and written by the same channel, so on the modular data path
concurrency ``cc`` x parallelism ``p`` maps to ``cc`` read threads, ``cc * p`` connections and
``cc`` write threads. The AutoMDT paper compares against ``globus-url-copy`` with cc=4, p=8.
"""
from __future__ import annotations

from typing import Optional, Tuple

from automdt.policy_contract import Observation, PolicyBase, Triple, clamp_triple

GLOBUS_CONCURRENCY = 4
"""Concurrency of the AutoMDT paper's Globus baseline (``globus-url-copy -cc 4``)."""
GLOBUS_PARALLELISM = 8
"""Parallelism of the AutoMDT paper's Globus baseline (``globus-url-copy -p 8``)."""


class StaticPolicy(PolicyBase):
    """Always return the same thread counts, clipped to ``[1, max_threads]``.

    :param read: read threads.
    :param net: network threads (TCP connections).
    :param write: write threads.
    :param name: name reported by the policy; defaults to ``static:R,N,W``.
    :param max_threads: default upper bound until :meth:`reset` gives one.
    """

    def __init__(
        self,
        read: int,
        net: int,
        write: int,
        name: Optional[str] = None,
        max_threads: Optional[int] = None,
    ) -> None:
        triple = (read, net, write)
        for label, value in zip(("read", "net", "write"), triple):
            if int(value) != value or value < 1:
                raise ValueError(f"static policy: {label} threads must be an integer >= 1, got {value!r}")
        self.triple: Tuple[int, int, int] = tuple(int(v) for v in triple)  # type: ignore[assignment]
        self.name = name or "static:{},{},{}".format(*self.triple)
        self._max = max_threads

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        self._max = int(max_threads)
        return clamp_triple(self.triple, self._max)

    def act(self, obs: Observation) -> Triple:
        limit = self._max if self._max is not None else obs.max_threads
        return clamp_triple(self.triple, limit)

    def __repr__(self) -> str:
        return f"StaticPolicy({self.triple[0]}, {self.triple[1]}, {self.triple[2]}, name={self.name!r})"


def globus_policy(
    max_threads: Optional[int] = None,
    concurrency: int = GLOBUS_CONCURRENCY,
    parallelism: int = GLOBUS_PARALLELISM,
) -> StaticPolicy:
    """Globus-like fixed setting: ``(cc, cc * p, cc)``, clipped to ``max_threads`` when used.

    :param max_threads: default upper bound (the clip happens in ``reset``/``act``).
    :param concurrency: files in flight (one read and one write thread each).
    :param parallelism: TCP streams per file.
    """
    if concurrency < 1 or parallelism < 1:
        raise ValueError("globus: concurrency and parallelism must be >= 1")
    return StaticPolicy(
        concurrency, concurrency * parallelism, concurrency, name="globus", max_threads=max_threads
    )


def parse_static(spec: str, max_threads: Optional[int] = None) -> StaticPolicy:
    """Build a :class:`StaticPolicy` from ``"static:R,N,W"`` (or just ``"R,N,W"``).

    :raises ValueError: when the spec is not three positive integers.
    """
    body = spec.strip()
    if body.lower().startswith("static:"):
        body = body[len("static:"):]
    parts = [p.strip() for p in body.split(",")]
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"static policy spec must be 'static:R,N,W' with positive integers, got {spec!r}")
    r, n, w = (int(p) for p in parts)
    return StaticPolicy(r, n, w, max_threads=max_threads)
