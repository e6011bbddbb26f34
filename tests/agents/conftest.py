"""A tiny stand-in for the transfer path, independent of the simulator package.

Stage ``i`` with ``n`` threads moves at most ``min(n * tpt_i, cap_i)`` bytes/s; two bounded
buffers sit between the stages; one interval is simulated in small sub-steps (read, then
network, then write), and the observation reports what each stage moved and the buffer fills
at the end, as the live engine and the simulator do.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import pytest

from automdt.simulator.types import Observation


class ToyPath:
    def __init__(
        self,
        tpt: Sequence[float],
        cap: Sequence[float],
        buffers: Tuple[float, float],
        max_threads: int = 32,
        interval_s: float = 1.0,
        substeps: int = 50,
        loss: float = 0.0,
    ) -> None:
        self.tpt, self.cap = list(tpt), list(cap)
        self.smax, self.rmax = buffers
        self.S = self.R = 0.0
        self.max_threads = max_threads
        self.interval_s = interval_s
        self.substeps = substeps
        self.loss = loss

    def capacity(self, i: int, n: int) -> float:
        return min(n * self.tpt[i], self.cap[i])

    def optimum(self) -> Tuple[float, Tuple[int, int, int]]:
        """Max flow with at most max_threads per stage, and the fewest threads that reach it."""
        import math

        rate = min(self.capacity(i, self.max_threads) for i in range(3))
        return rate, tuple(math.ceil(rate / self.tpt[i] - 1e-9) for i in range(3))  # type: ignore[return-value]

    def step(self, threads: Sequence[int]) -> Observation:
        dt = self.interval_s / self.substeps
        c = [self.capacity(i, int(threads[i])) * dt for i in range(3)]
        moved = [0.0, 0.0, 0.0]
        for _ in range(self.substeps):
            r = min(c[0], self.smax - self.S)
            self.S += r
            x = min(c[1], self.S, self.rmax - self.R)
            self.S -= x
            self.R += x
            w = min(c[2], self.R)
            self.R -= w
            moved[0] += r
            moved[1] += x
            moved[2] += w
        return Observation(
            threads=tuple(int(t) for t in threads),  # type: ignore[arg-type]
            throughput_bps=tuple(m / self.interval_s for m in moved),  # type: ignore[arg-type]
            buffer_fill=(self.S / self.smax, self.R / self.rmax),
            interval_s=self.interval_s,
            max_threads=self.max_threads,
            loss=self.loss,
            buffer_bytes=(int(self.smax), int(self.rmax)),
        )


def run_policy(policy, path: ToyPath, steps: int, seed: int = 0):
    """Drive ``policy`` on ``path`` for ``steps`` intervals; return the triples it chose."""
    triple = policy.reset(path.max_threads, seed=seed)
    chosen = [triple]
    for _ in range(steps):
        obs = path.step(triple)
        triple = policy.act(obs)
        chosen.append(triple)
    return chosen


@pytest.fixture
def toy_path():
    return ToyPath


@pytest.fixture
def drive():
    return run_policy


def make_obs(threads, tput, fill=(0.0, 0.0), loss=0.0, max_threads=32) -> Observation:
    return Observation(
        threads=tuple(threads),
        throughput_bps=tuple(float(t) for t in tput),
        buffer_fill=tuple(fill),
        interval_s=1.0,
        max_threads=max_threads,
        loss=loss,
    )


@pytest.fixture
def obs():
    return make_obs
