"""``automdt explore``: a short real transfer with random thread triples, then a fitted profile.

Every interval the explorer (:class:`RandomExplorer`, seeded) sets a new (read, net, write)
triple: either a uniform triple in ``[1, max_threads]`` or one interval of a *probe*, a short
ascending sweep of one stage at low, log-uniform counts while the other two run at
``max_threads`` (the class docstring has the scheme). The controller logs the engine counters of
both ends, and :func:`automdt.simulator.fit.fit_profile` turns the samples into a profile:
per-thread throughput from bytes per *busy* thread-second (the engine counts busy and waiting
time separately, so a thread blocked on a full or empty buffer does not dilute the estimate) and
stage bandwidth from the highest stage throughputs. The fit then judges itself by what the path
delivered: a bandwidth counts only if the stage was seen limiting the path; any other is a lower
bound, and when no stage was seen limiting, every bandwidth is capped at the highest delivered
rate, so the profile never promises more than the exploration saw (step 7 of
:mod:`automdt.simulator.fit`; such a fit is weak). :func:`exploration_plan` says up front how
many intervals and how much data a trustworthy fit needs.

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
import stat
import time
from dataclasses import replace
from typing import Any, Dict, List, Optional

from automdt import errors, interrupts
from automdt.errors import AutomdtError, Interrupted
from automdt.interval import as_record
from automdt.paths import SCRATCH_PREFIX as SCRATCH
from automdt.sender import Summary, TransferOptions, parse_dest, run_transfer

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

    def intervals_for_probes(self, probes_per_stage: int) -> int:
        """Intervals the draws take, on average, to probe every stage ``probes_per_stage`` times:
        ``3 * probes_per_stage`` probes come one in ``1 / probe_fraction`` blocks, and a block
        lasts ``probe_len`` intervals (a probe) or one (a uniform triple)."""
        if self.probe_fraction <= 0:
            raise ValueError("an explorer without probes never probes a stage")
        blocks = 3 * probes_per_stage / self.probe_fraction
        return int(math.ceil(blocks * (self.probe_fraction * self.probe_len + 1.0 - self.probe_fraction)))

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


def dataset_bytes(src: str, enough: Optional[int] = None) -> int:
    """Bytes of the regular files under ``src`` (or of ``src`` itself, a file), symlinks not
    followed (the transfer skips them), unreadable entries left out; counting stops once the total
    passes ``enough``."""
    try:
        st = os.lstat(src)
    except OSError:
        return 0
    if stat.S_ISREG(st.st_mode):
        return st.st_size
    total, stack = 0, [src]
    while stack and (enough is None or total <= enough):
        try:
            with os.scandir(stack.pop()) as entries:
                for e in entries:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            stack.append(e.path)
                        elif e.is_file(follow_symlinks=False):
                            total += e.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
        except OSError:
            continue
    return total


def exploration_plan(duration_s: float, opts: TransferOptions, src: Optional[str] = None,
                     explorer: Optional[RandomExplorer] = None) -> Dict[str, Any]:
    """What a trustworthy fit needs, known before exploring (``automdt explore`` prints it).

    * ``min_intervals``: every stage probed often enough to be fitted. A probe's sweep gives its
      stage ``probe_len - 1`` usable intervals (the first follows the drop from ``max_threads``)
      and a stage needs :data:`~automdt.simulator.fit.MIN_STAGE_SAMPLES`, hence
      ``probes_per_stage``; :meth:`RandomExplorer.intervals_for_probes` turns that into intervals
      (at least :data:`~automdt.simulator.fit.MIN_FIT_SAMPLES`).
    * ``min_duration_s``: ``min_intervals`` control intervals.
    * ``min_dataset_bytes``: what one round must move to last a probe at full width: its first
      interval and a sweep (``round_intervals = probe_len + 1`` intervals) in which each of
      ``max_threads`` threads moves one chunk. With less, a round ends before its probe does,
      and the widest stage's threads finish no chunk in an interval, so its bytes say nothing
      about their rate. :func:`data_needed` adds the path's rate once it is known.
    * ``dataset_bytes`` (with ``src``; counted up to the minimum) and ``notes``: what falls short
      and what explore does about it.
    """
    from automdt.simulator.fit import MIN_FIT_SAMPLES, MIN_STAGE_SAMPLES

    ex = explorer or RandomExplorer()
    probes = int(math.ceil(MIN_STAGE_SAMPLES / max(1, ex.probe_len - 1)))
    intervals = max(MIN_FIT_SAMPLES, ex.intervals_for_probes(probes))
    plan: Dict[str, Any] = {
        "probes_per_stage": probes, "min_intervals": intervals,
        "min_duration_s": round(intervals * opts.interval_s, 3),
        "round_intervals": ex.probe_len + 1,
        "min_dataset_bytes": int((ex.probe_len + 1) * opts.max_threads * opts.chunk_size),
        "dataset_bytes": None, "notes": [],
    }
    if duration_s < plan["min_duration_s"]:
        plan["notes"].append(f"--duration {duration_s:g} s is shorter than that: a weak fit (exit 14) is likely "
                             "unless the path shows its limit early")
    slots = opts.memory // max(1, opts.chunk_size)
    if slots < opts.max_threads:
        plan["notes"].append(f"each staging buffer holds only {slots} chunk(s) (--memory / --chunk-size), fewer than "
                             f"--max-threads {opts.max_threads}: the buffers may limit the path before any stage "
                             "does, and a stage never seen limiting is only a lower bound")
    if src is not None:
        plan["dataset_bytes"] = have = dataset_bytes(src, enough=plan["min_dataset_bytes"])
        if have < plan["min_dataset_bytes"]:
            plan["notes"].append(f"SRC holds only {format_size(have)}: on a path where every thread moves a chunk per "
                                 "interval, a round ends before its probe does; explore then copies SRC again into "
                                 "scratch subdirectories of DEST (removed at the end), losing each round's start and "
                                 "end, and the fit may be weak (exit 14)")
    return plan


def data_needed(plan: Dict[str, Any], rate_bps: float, interval_s: float) -> int:
    """Bytes SRC must hold for one round to last ``round_intervals`` intervals at ``rate_bps``
    (a rate the exploration saw), and at least the plan's ``min_dataset_bytes``."""
    return int(max(plan["min_dataset_bytes"], rate_bps * plan["round_intervals"] * interval_s))


def format_rate(bps: float) -> str:
    """A rate in decimal units, as ``--throttle`` takes them: ``39.9 MB/s`` (1 MB = 10^6 bytes)."""
    return f"{format_size(bps)}/s"


def format_size(n: float) -> str:
    """A byte count in decimal units (kB, MB, GB, TB: powers of 1000), as ``--throttle`` and the rates."""
    n = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def explore(src: str, dest: str, duration_s: float, opts: TransferOptions, seed: int = 0,
            samples_path: Optional[str] = None, plan: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Run exploration; return ``{"profile": Profile, "samples": [...], "weak_fit": [...], ...}``.

    The profile's ``meta["fit"]`` also holds each stage's ``confidence``
    (:func:`automdt.simulator.fit.stage_confidence`), ``weak`` (the reasons the fit cannot be
    stood behind, :func:`weak_fit`; empty when it can) and ``plan`` (:func:`exploration_plan`,
    computed here unless given). When every round ended within its first interval (a small SRC
    on a fast path), the rounds' last, partial intervals are the samples, and the fit is weak.
    Raises :class:`AutomdtError` (exit 14) when not even those moved data through every stage:
    then there is no profile to write.
    """
    from automdt.simulator.profile import ProfileError, write_samples

    if plan is None:
        plan = exploration_plan(duration_s, opts, src)
    t0 = time.monotonic()
    summaries = _run_rounds(src, dest, duration_s, opts, RandomExplorer(seed))
    seconds, rounds = time.monotonic() - t0, len(summaries)
    samples = [r.to_sample(rnd[j - 1] if j else None, opts.chunk_size)
               for rnd in (s.history for s in summaries) for j, r in enumerate(rnd)]
    partial_only = not samples
    if partial_only:  # every round ended within its first interval: its whole run is one partial interval
        samples = [s.final_record.to_sample(None, opts.chunk_size) for s in summaries
                   if s.final_record is not None and s.final_record.interval_s > 0 and max(s.final_record.bytes) > 0]
    if not samples:
        raise AutomdtError(_nothing_measured(summaries, rounds, seconds, opts, plan), errors.WEAK_FIT)
    if samples_path:  # the format of a profile's samples file (JSONL or CSV by suffix)
        write_samples(samples, samples_path)
    try:
        profile = fit_samples(samples, src, dest, interval_s=opts.interval_s, memory=opts.memory,
                              max_threads=opts.max_threads, chunk_size=opts.chunk_size)
    except ProfileError as e:  # a stage moved nothing in any interval: nothing to fit
        raise AutomdtError(f"no profile could be fitted from {len(samples)} interval(s) in {seconds:.0f} s: "
                           f"{str(e).removeprefix('fit_profile: ')}; explore longer or with more data",
                           errors.WEAK_FIT) from None
    res = {"profile": profile, "samples": samples, "rounds": rounds, "seconds": seconds, "duration_s": duration_s,
           "summaries": summaries, "plan": plan, "partial_only": partial_only}
    fit = profile.meta["fit"]
    fit["weak"] = res["weak_fit"] = weak_fit(profile, res)
    fit["explored_s"] = round(seconds, 1)
    fit["rounds"] = rounds
    fit["plan"] = plan
    return res


def fit_samples(samples: List[Dict[str, Any]], src: str, dest: str, *, interval_s: float, memory: int,
                max_threads: int, chunk_size: int) -> Any:
    """Fit a profile to exploration samples of SRC -> DEST, as ``automdt explore`` writes it.

    Besides the fit (:func:`automdt.simulator.fit.fit_profile`, given the chunk size so that the
    simulator shows its chunk effects in training), the profile's meta records ``chunk_bytes``,
    ``explored`` (SRC, DEST and when: a policy trained on the profile says so when it drives
    another path) and ``fit["confidence"]`` per stage (what training's neighbourhood and a
    tuned file's trust band read). Raises :class:`automdt.simulator.profile.ProfileError` when a
    stage moved nothing in any sample.
    """
    from automdt.simulator.fit import fit_profile, stage_confidence

    profile = fit_profile(samples, interval_s=interval_s, buffers=(memory, memory), max_threads=max_threads,
                          chunk_bytes=chunk_size)
    explored = {"src": os.path.abspath(src), "dest": dest if parse_dest(dest)[0] is not None else os.path.abspath(dest),
                "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    profile = profile.replace(meta=dict(profile.meta, chunk_bytes=int(chunk_size), explored=explored))
    profile.meta.setdefault("fit", {})["confidence"] = stage_confidence(profile)
    return profile


def _run_rounds(src: str, dest: str, duration_s: float, opts: TransferOptions, explorer: RandomExplorer) -> List[Summary]:
    """Transfer SRC with ``explorer`` setting the thread counts until ``duration_s`` has passed:
    to DEST, then, when SRC has all gone (or was there already), again into scratch
    subdirectories, removed at the end. Returns each round's :class:`~automdt.sender.Summary`."""
    remote, where = parse_dest(dest)
    t0 = time.monotonic()
    if opts.throttle_schedule is not None and opts.schedule_t0 is None:
        opts = replace(opts, schedule_t0=t0)  # every round follows the one schedule
    scratch = os.path.join(dest, SCRATCH) if remote is None else None
    summaries: List[Summary] = []
    try:
        while True:
            left = duration_s - (time.monotonic() - t0)
            if left < 2 * opts.interval_s:
                break
            rounds = len(summaries)
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
            if summary.exit_code in (130, 143):
                raise Interrupted(summary.exit_code)
            if summary.exit_code not in (errors.OK, errors.MAX_DURATION):
                raise AutomdtError("exploration transfer failed: " + "; ".join(summary.errors[:3]), summary.exit_code)
            if summary.exit_code == errors.MAX_DURATION or summary.bytes_to_send == 0 and rounds > 0:
                break
    finally:
        if scratch and os.path.isdir(scratch):
            with interrupts.shielded():
                shutil.rmtree(scratch, ignore_errors=True)
    return summaries


def _nothing_measured(summaries: List[Summary], rounds: int, seconds: float, opts: TransferOptions,
                      plan: Dict[str, Any]) -> str:
    """Why an exploration measured no interval, and what would let it (the message of exit 14)."""
    moved = sum(s.bytes for s in summaries)
    took = sum(s.seconds for s in summaries)
    text = f"exploration measured no interval in {seconds:.1f} s ({rounds} round(s)), so there is no profile to write"
    if moved == 0:
        text += f": SRC had no data to move; give it at least {format_size(plan['min_dataset_bytes'])}"
    elif rounds and took > 0 and took / rounds < opts.interval_s:
        need = data_needed(plan, moved / took, opts.interval_s)
        text += (f": each round moved SRC in {took / rounds:.2f} s on average ({format_rate(moved / took)}), less than "
                 f"one --interval ({opts.interval_s:g} s); give SRC at least {format_size(need)} (a round of "
                 f"{plan['round_intervals']} intervals at that rate)")
    else:
        text += f": explore for at least {plan['min_duration_s']:g} s"
    return text


def weak_fit(profile, res: Dict[str, Any]) -> List[str]:
    """Why an exploration's profile cannot be stood behind: the fit's own reasons
    (:func:`automdt.simulator.fit.weak_fit_reasons`), a fit from the rounds' partial intervals
    only, and an exploration that ended before half of its ``--duration``."""
    from automdt.simulator.fit import weak_fit_reasons

    reasons = weak_fit_reasons(profile)
    if res.get("partial_only"):
        reasons.append(f"no whole interval was measured: each of the {res['rounds']} rounds moved SRC within its first "
                       "interval, so the profile rests on the rounds' partial intervals, start-up included")
    if res["seconds"] < 0.5 * res["duration_s"]:
        reasons.append(f"the exploration ended after {res['seconds']:.0f} s of the {res['duration_s']:.0f} s asked for")
    return reasons


def stage_report(profile) -> Dict[str, Dict[str, Any]]:
    """Per stage: value, spread, samples used, measured or lower bound (what explore prints)."""
    from automdt.simulator.fit import stage_confidence

    return stage_confidence(profile)
