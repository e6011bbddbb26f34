"""The same path, the same thread schedule, in the simulator and on the real engine: interval by
interval, what does the policy observe in each?

:func:`engine_trace` copies a generated dataset with the real engine (real TCP on loopback, the
engine's throttles playing the disks and the link) while a :class:`SchedulePolicy` sets the thread
counts of every interval and records the :class:`~automdt.simulator.types.Observation` the
controller hands it. :func:`sim_trace` runs the same schedule in
:class:`~automdt.simulator.env.BufferSimEnv` on the path's profile (the throttles are exactly the
simulator's ``min(n * tpt, B)`` model), with or without the engine's chunk effects
(``chunk_bytes``), and :func:`compare` lines the two up.

What this found (issue 10, item 3): the fluid simulator counted bytes as they flowed, the engine
counts a chunk when it is done. On the issue's read-bound path (10 MB/s per read thread, 4 MiB
chunks, 1 s intervals) that makes three differences the policy reads:

* after a stage's thread count is lowered, the threads above the new count finish the chunk they
  hold, so the interval shows ~30% more bytes per (new) thread than the stage can move
  (16 -> 8 readers: 107 MB/s instead of 80): the policy's "best per-thread rate" reference jumps,
  and a saturated stage then looks as if it had spare threads, so the policy cuts it below its
  need and keeps it there;
* single intervals move whole chunks (2 or 3 per thread: lumps of +-10-20% at 5 threads), and
  intervals in which threads were added count their first chunks late;
* the engine's buffer fill counts the slots busy threads hold (a reader holds its slot while it
  reads), so a sender buffer with 16 readers and 8 senders reads ~0.4 fuller than its queue.

The simulator now models all three (``chunk_bytes``; :func:`automdt.simulator.dynamics.measure_interval`)
and both report busy and waiting thread-seconds per stage the same way
(:func:`automdt.controller.stage_times`, :func:`automdt.simulator.dynamics.busy_seconds`).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from automdt.simulator.profile import STAGES, Profile, StageProfile
from automdt.policy_contract import Observation, Triple

MB = 1_000_000
MiB = 1 << 20
UNLIMITED_BPS = 10e9
"""Bandwidth given to the simulator for a stage the engine does not throttle in total (the machine
moves far less than this, so such a stage is never the simulated bottleneck)."""


@dataclass(frozen=True)
class PathSpec:
    """A throttled path: ``{stage: (per_thread_bps, total_bps)}`` (0 = unlimited) and engine options."""

    throttle: Dict[str, Tuple[float, float]]
    memory: int = 256 * MiB
    chunk_size: int = 4 * MiB
    interval_s: float = 1.0
    max_threads: int = 32

    def profile(self, noise: float = 0.0) -> Profile:
        """The path as a simulator profile (``meta["chunk_bytes"]`` is the engine's chunk size)."""
        st = {}
        for s in STAGES:
            tpt, total = self.throttle.get(s, (0.0, 0.0))
            if tpt <= 0:
                raise ValueError(f"stage {s}: the parity path needs a per-thread throttle")
            st[s] = StageProfile(float(tpt), float(total) if total > 0 else UNLIMITED_BPS)
        return Profile(read=st["read"], net=st["net"], write=st["write"], sender_buffer=int(self.memory),
                       receiver_buffer=int(self.memory), interval_s=float(self.interval_s),
                       max_threads=int(self.max_threads), noise=float(noise),
                       meta={"chunk_bytes": int(self.chunk_size), "source": "automdt.experiments.parity"})

    @property
    def achievable_bps(self) -> float:
        return self.profile().achievable_bps


ISSUE_PATH = PathSpec({"read": (10 * MB, 0), "net": (40 * MB, 80 * MB), "write": (40 * MB, 0)})
"""Issue 10's read-bound path: 10 MB/s per read thread, 40 per network and write thread, an
80 MB/s link, the CLI's default 256 MiB buffers and 4 MiB chunks, 1 s intervals."""

ISSUE_SCHEDULE: Tuple[Triple, ...] = (
    ((1, 1, 1), (2, 1, 2), (4, 2, 2), (8, 4, 2), (16, 4, 3), (16, 8, 3), (8, 7, 3), (8, 6, 3), (8, 5, 2))
    + ((5, 5, 2),) * 10 + ((8, 5, 2),) * 4 + ((8, 2, 2),) * 3)
"""The shipped policy's moves on :data:`ISSUE_PATH` (ramp, 16 readers fill the sender buffer, cut
to 8 then 5 while it is full, 5 readers after it drained), then back to the need."""


class SchedulePolicy:
    """Sets the thread counts of a fixed schedule (the last triple repeats) and records every
    :class:`Observation` it is shown."""

    name = "schedule"

    def __init__(self, schedule: Sequence[Triple]) -> None:
        if not schedule:
            raise ValueError("empty schedule")
        self.schedule = [tuple(int(x) for x in t) for t in schedule]
        self.observations: List[Observation] = []

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        self.observations = []
        return self.schedule[0]  # type: ignore[return-value]

    def act(self, obs: Observation) -> Triple:
        self.observations.append(obs)
        return self.schedule[min(len(self.observations), len(self.schedule) - 1)]  # type: ignore[return-value]


@dataclass
class Trace:
    """Per-interval measurements of one run: arrays with one row per interval."""

    threads: np.ndarray  # (T,3) int
    throughput_bps: np.ndarray  # (T,3)
    fill: np.ndarray  # (T,2)
    busy_s: np.ndarray  # (T,3)
    wait_s: np.ndarray  # (T,3)
    interval_s: np.ndarray  # (T,)
    observations: List[Observation] = field(default_factory=list, repr=False)

    @classmethod
    def from_observations(cls, obs: Sequence[Observation]) -> "Trace":
        def arr(f: Any, width: int) -> np.ndarray:
            return np.array([f(o) if f(o) is not None else (np.nan,) * width for o in obs], dtype=np.float64)

        return cls(threads=np.array([o.threads for o in obs], dtype=np.int64),
                   throughput_bps=arr(lambda o: o.throughput_bps, 3), fill=arr(lambda o: o.buffer_fill, 2),
                   busy_s=arr(lambda o: o.busy_s, 3), wait_s=arr(lambda o: o.wait_s, 3),
                   interval_s=np.array([o.interval_s for o in obs]), observations=list(obs))

    def __len__(self) -> int:
        return int(self.threads.shape[0])

    @property
    def utilization(self) -> np.ndarray:
        """(T,3) busy share ``busy / (busy + wait)`` of each stage's thread time."""
        return self.busy_s / np.maximum(self.busy_s + self.wait_s, 1e-9)


def engine_trace(path: PathSpec, schedule: Sequence[Triple], src: str, scratch: Optional[str] = None) -> Trace:
    """Copy ``src`` (bigger than the schedule can move) over ``path`` on the real engine, setting
    the threads of ``schedule`` interval by interval; stop after the schedule. Returns the
    observations the controller produced."""
    from automdt.sender import TransferOptions, run_transfer

    pol = SchedulePolicy(schedule)
    dest = tempfile.mkdtemp(prefix="amdt-parity-dest-", dir=scratch)
    try:
        opts = TransferOptions(policy=pol, memory=int(path.memory), chunk_size=int(path.chunk_size),
                               throttle={k: tuple(v) for k, v in path.throttle.items()},
                               interval_s=float(path.interval_s), max_threads=int(path.max_threads),
                               max_duration_s=(len(schedule) + 0.6) * path.interval_s, stall_s=60.0)
        run_transfer(src, dest, opts)
    finally:
        shutil.rmtree(dest, ignore_errors=True)
    return Trace.from_observations(pol.observations[:len(schedule)])


def sim_trace(path: PathSpec, schedule: Sequence[Triple], chunk_bytes: Optional[float] = None, seed: int = 0,
              noise: float = 0.0) -> Trace:
    """The same schedule in :class:`~automdt.simulator.env.BufferSimEnv` on ``path.profile()``.

    :param chunk_bytes: ``None``: the engine's chunk model with ``path.chunk_size``; ``0``: the
        fluid model (what the simulator did before).
    """
    from automdt.simulator.env import BufferSimEnv

    env = BufferSimEnv(path.profile(noise), random_start=False, episode_steps=max(1, len(schedule)),
                       chunk_bytes=float(path.chunk_size if chunk_bytes is None else chunk_bytes))
    _, info = env.reset(seed=seed, options={"threads": tuple(schedule[0])})
    obs = [info["observation"]]
    for t in schedule[1:]:
        obs.append(env.step_threads(tuple(t))[4]["observation"])
    return Trace.from_observations(obs)


def compare(engine: Trace, sim: Trace, rate_bps: float) -> Dict[str, Any]:
    """Interval-by-interval differences (sim minus engine) over the intervals both have.

    :return: ``throughput`` (T,3) differences as fractions of ``rate_bps``, ``fill`` (T,2),
        ``utilization`` (T,3), and their mean absolute values per stage (``*_mae``).
    """
    n = min(len(engine), len(sim))
    if n == 0:
        raise ValueError("no intervals to compare")
    if not np.array_equal(engine.threads[:n], sim.threads[:n]):
        raise ValueError("the traces ran different thread counts")
    d_t = (sim.throughput_bps[:n] - engine.throughput_bps[:n]) / rate_bps
    d_f = sim.fill[:n] - engine.fill[:n]
    d_u = sim.utilization[:n] - engine.utilization[:n]
    return {"intervals": n, "throughput": d_t, "fill": d_f, "utilization": d_u,
            "throughput_mae": np.nanmean(np.abs(d_t), axis=0), "fill_mae": np.nanmean(np.abs(d_f), axis=0),
            "utilization_mae": np.nanmean(np.abs(d_u), axis=0)}


def format_side_by_side(engine: Trace, sims: Dict[str, Trace]) -> str:
    """A text table: threads, then throughputs (MB/s), fills and utilizations of every trace."""
    names = ["engine", *sims]
    traces = [engine, *sims.values()]
    n = min(len(t) for t in traces)
    head = f"{'i':>3} {'threads':>11} | " + " | ".join(f"{nm:^39}" for nm in names)
    lines = [head, f"{'':>3} {'':>11} | " + " | ".join(f"{'r':>6}{'n':>6}{'w':>6}{'S':>5}{'R':>5}{'u r/n/w':>11}"
                                                       for _ in names)]
    for i in range(n):
        cells = []
        for tr in traces:
            x = tr.throughput_bps[i] / MB
            u = tr.utilization[i]
            cells.append(f"{x[0]:6.1f}{x[1]:6.1f}{x[2]:6.1f}{tr.fill[i, 0]:5.2f}{tr.fill[i, 1]:5.2f}"
                         f" {u[0]:3.2f}/{u[1]:3.2f}/{u[2]:3.2f}"[:50])
        lines.append(f"{i:3d} {str(tuple(int(v) for v in engine.threads[i])):>11} | " + " | ".join(cells))
    return "\n".join(lines)


def make_source(root: str, total_bytes: int, n_files: int = 20, seed: int = 0) -> str:
    """Generate a dataset of ``n_files`` equal files under ``root`` (see
    :class:`automdt.experiments.scenarios.DatasetSpec`); returns its directory."""
    from automdt.experiments.scenarios import large_dataset

    return large_dataset(int(total_bytes), n_files=n_files, seed=seed).generate(root).path


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m automdt.experiments.parity``: the issue's path and schedule, engine against
    the simulator with and without the chunk model, printed side by side."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--data-dir", help="existing dataset directory (default: generate one under /dev/shm)")
    args = ap.parse_args(argv)
    root = None
    src = args.data_dir
    if src is None:
        root = tempfile.mkdtemp(prefix="amdt-parity-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        need = ISSUE_PATH.achievable_bps * len(ISSUE_SCHEDULE) * 1.6
        src = make_source(root, int(need))
    try:
        eng = engine_trace(ISSUE_PATH, ISSUE_SCHEDULE, src, scratch=root)
        sims = {"sim (chunks)": sim_trace(ISSUE_PATH, ISSUE_SCHEDULE),
                "sim (fluid)": sim_trace(ISSUE_PATH, ISSUE_SCHEDULE, chunk_bytes=0)}
        print(format_side_by_side(eng, sims))
        for name, tr in sims.items():
            c = compare(eng, tr, ISSUE_PATH.achievable_bps)
            print(f"{name}: mean |diff| throughput {np.round(c['throughput_mae'], 3)} of the path rate, "
                  f"fill {np.round(c['fill_mae'], 3)}, utilization {np.round(c['utilization_mae'], 3)}")
    finally:
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
