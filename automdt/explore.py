"""``automdt explore``: a short real transfer with random thread triples, then a fitted profile.

Every interval the explorer (:class:`RandomExplorer`, seeded) sets a new (read, net, write)
triple: either a uniform triple in ``[1, max_threads]`` or one interval of a *probe*, a short
ascending sweep of one stage at low, log-uniform counts while the other two run at
``max_threads`` (the class docstring has the scheme). The controller logs the engine counters of
both ends, and :func:`automdt.simulator.fit.fit_profile` turns the samples into a profile:
per-thread throughput from bytes per *busy* thread-second (the engine counts busy and waiting
time separately, so a thread blocked on a full or empty buffer does not dilute the estimate) and
stage bandwidth from the highest stage throughputs. A stage that never limited the path gets
lower bounds, flagged in the profile's ``meta["fit"]``.

Exploration moves the real dataset to DEST. If the dataset is exhausted before ``duration`` (or was
there already), further rounds copy it again into a scratch directory that is removed at the end:
locally by this process, on a remote receiver by the receiver itself when each round's session
closes (``"scratch": true`` in ``open``, ``automdt/PROTOCOL.md``).
"""
from __future__ import annotations

import logging
import math
import os
import random
import shutil
import time
from dataclasses import replace
from typing import Any, Dict, List, Optional

from automdt import errors, interrupts
from automdt.errors import AutomdtError, Interrupted
from automdt.interval import IntervalRecord, as_record
from automdt.paths import SCRATCH_PREFIX as SCRATCH
from automdt.sender import TransferOptions, parse_dest, run_transfer

log = logging.getLogger(__name__)


class RandomExplorer:
    """A policy that sets a random thread triple every interval (seeded, reproducible).

    The draws come in *blocks*. With probability ``probe_fraction`` a block is a probe: the next
    stage in turn (read, net, write, read...) gets ``probe_len`` (3) counts drawn log-uniformly
    from ``[low, max_threads]`` and sorted ascending, one per interval, while the other two
    stages run at ``max_threads``. Otherwise the block is one uniform triple in
    ``[low, max_threads]^3``.

    Why: a stage's busy-time samples are usable only while its threads are mostly busy, that is,
    while it is (nearly) the bottleneck. Uniform triples almost never make a stage that is much
    faster per thread than the path's bottleneck the slowest one, so its per-thread throughput
    stays unseen. With few threads (log-uniform: half the probe counts are at most
    ``sqrt(max_threads)``) and the other stages wide open, even a fast stage limits the path and
    shows its per-thread rate, while the high counts of a sweep reach the plateau of a slow one.
    A sweep ascends because the interval after a thread *decrease* is unusable for that stage
    (:meth:`automdt.interval.IntervalRecord.to_sample`): only its first interval is lost.
    """

    name = "explore-random"

    def __init__(self, seed: int = 0, low: int = 1, probe_fraction: float = 0.5, probe_len: int = 3):
        self.rng = random.Random(seed)
        self.low = low
        self.probe_fraction = probe_fraction
        self.probe_len = max(1, probe_len)
        self.max_threads = 32
        self._probe = 0
        self._queue: List[tuple] = []

    def reset(self, max_threads: int, seed: Optional[int] = None):
        self.max_threads = max_threads
        self._queue = []
        return self._draw()

    def act(self, obs):
        return self._draw()

    def _log_uniform(self, hi: int) -> int:
        """An integer in ``[low, hi]`` whose logarithm is (nearly) uniform."""
        lo = max(1, self.low)
        x = math.exp(self.rng.uniform(math.log(lo), math.log(hi + 1)))
        return max(lo, min(hi, int(x)))

    def _draw(self):
        if not self._queue:
            hi = max(self.low, self.max_threads)
            if self.rng.random() < self.probe_fraction:
                stage = self._probe % 3
                self._probe += 1
                for c in sorted(self._log_uniform(hi) for _ in range(self.probe_len)):
                    t = [hi, hi, hi]
                    t[stage] = c
                    self._queue.append(tuple(t))
            else:
                self._queue.append(tuple(self.rng.randint(self.low, hi) for _ in range(3)))
        return self._queue.pop(0)


def record_to_sample(rec: Any, prev: Any = None, chunk_size: Optional[int] = None) -> Dict[str, Any]:
    """A controller interval record (an :class:`~automdt.interval.IntervalRecord`, or its JSON
    object) -> a profile-fitting sample: :meth:`automdt.interval.IntervalRecord.to_sample`."""
    return as_record(rec).to_sample(None if prev is None else as_record(prev), chunk_size)


def explore(src: str, dest: str, duration_s: float, opts: TransferOptions, seed: int = 0,
            samples_path: Optional[str] = None) -> Dict[str, Any]:
    """Run exploration; return ``{"profile": Profile, "samples": [...], "weak_fit": [...], ...}``.

    The profile's ``meta["fit"]`` also holds each stage's ``confidence``
    (:func:`automdt.simulator.fit.stage_confidence`) and ``weak`` (the reasons the fit cannot be
    stood behind, :func:`weak_fit`; empty when it can).
    """
    from automdt.simulator.fit import fit_profile, stage_confidence
    from automdt.simulator.profile import write_samples

    remote, where = parse_dest(dest)
    explorer = RandomExplorer(seed)
    records: List[List[IntervalRecord]] = []
    t0 = time.monotonic()
    if opts.throttle_schedule is not None and opts.schedule_t0 is None:
        opts = replace(opts, schedule_t0=t0)  # every round follows the one schedule
    rounds = 0
    scratch = os.path.join(dest, SCRATCH) if remote is None else None
    summaries = []
    try:
        while True:
            left = duration_s - (time.monotonic() - t0)
            if left < 2 * opts.interval_s:
                break
            o = replace(opts, policy=explorer, max_duration_s=left)
            if rounds == 0:
                target = dest
            elif scratch is not None:
                target = os.path.join(scratch, f"round{rounds}")
            else:
                # the data is already there, or all of it went: copy it again into a scratch
                # subdirectory the receiver empties first and removes when the session closes
                assert remote is not None  # a local DEST has its scratch directory
                target = f"{remote[0] if ':' not in remote[0] else '[' + remote[0] + ']'}:{remote[1]}/" + \
                    "/".join(x for x in (where, f"{SCRATCH}-{rounds}") if x)
                o = replace(o, scratch=True)
            summary = run_transfer(src, target, o)
            summaries.append(summary)
            records.append(list(summary.history))
            rounds += 1
            if summary.exit_code in (130, 143):
                raise Interrupted(summary.exit_code)
            if summary.exit_code not in (errors.OK, errors.MAX_DURATION):
                raise AutomdtError("exploration transfer failed: " + "; ".join(summary.errors[:3]), summary.exit_code)
            if summary.exit_code == errors.MAX_DURATION or summary.bytes_to_send == 0 and rounds > 1:
                break
    finally:
        if scratch and os.path.isdir(scratch):
            with interrupts.shielded():
                shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.monotonic() - t0
    samples = [r.to_sample(rnd[j - 1] if j else None, opts.chunk_size) for rnd in records for j, r in enumerate(rnd)]
    if len(samples) < 3:
        raise AutomdtError(f"exploration gathered only {len(samples)} intervals in {seconds:.0f} s (a profile "
                           "needs at least 10): use a larger dataset or a longer --duration", errors.WEAK_FIT)
    if samples_path:  # the format of a profile's samples file (JSONL or CSV by suffix)
        write_samples(samples, samples_path)
    buffers = (opts.memory, opts.memory)
    profile = fit_profile(samples, interval_s=opts.interval_s, buffers=buffers, max_threads=opts.max_threads)
    # the chunk size the path was explored with: the simulator shows its chunk effects (training)
    profile = profile.replace(meta=dict(profile.meta, chunk_bytes=int(opts.chunk_size)))
    res = {"profile": profile, "samples": samples, "rounds": rounds, "seconds": seconds, "duration_s": duration_s,
           "summaries": summaries}
    fit = profile.meta.setdefault("fit", {})
    fit["confidence"] = stage_confidence(profile)
    fit["weak"] = res["weak_fit"] = weak_fit(profile, res)
    fit["explored_s"] = round(seconds, 1)
    return res


def weak_fit(profile, res: Dict[str, Any]) -> List[str]:
    """Why an exploration's profile cannot be stood behind: the fit's own reasons
    (:func:`automdt.simulator.fit.weak_fit_reasons`) and an exploration that ended before half of
    its ``--duration``."""
    from automdt.simulator.fit import weak_fit_reasons

    reasons = weak_fit_reasons(profile)
    if res["seconds"] < 0.5 * res["duration_s"]:
        reasons.append(f"the exploration ended after {res['seconds']:.0f} s of the {res['duration_s']:.0f} s asked for")
    return reasons


def stage_report(profile) -> Dict[str, Dict[str, Any]]:
    """Per stage: value, spread, samples used, measured or lower bound (what explore prints)."""
    from automdt.simulator.fit import stage_confidence

    return stage_confidence(profile)
