"""Fit a :class:`~automdt.simulator.profile.Profile` from exploration samples.

A sample is one control interval of an exploration run with a random thread triple::

    {"t": 12.0,                      # seconds since the start (end of the interval)
     "threads": [r, n, w],
     "bytes":   [r, n, w],           # payload bytes each stage moved in the interval (0: unusable)
     "moved":   [r, n, w],           # optional: the bytes moved, also where "bytes" says unusable
     "busy_s":  [r, n, w],           # thread-seconds spent moving data (not waiting on a buffer)
     "wait_s":  [r, n, w],           # thread-seconds spent waiting on a buffer (full S, empty R...)
     "interval_s": 1.0,
     "buffer": [sender_fill, receiver_fill],
     "inflight_bytes": [r, n, w]}    # optional: bytes the threads that started in this interval
                                     # had in progress at its end (see below)

The busy-time counters are what make a short exploration enough: ``bytes / busy_s`` is the rate
of one busy thread, so ``c = n * bytes / busy_s`` measures the stage's *capacity* at ``n``
threads even when the stage was held back by a buffer (the slides' 10-minute random run only
sees achieved throughputs, which are capped by the bottleneck). The capacity points
``(n, c)`` are then fitted with ``c(n) = min(n * TPT, B)``:

1. ``B0`` = median of the top-k capacities (k = max(3, 10% of the samples)): a rough plateau;
2. linear samples (``c < 0.7 * B0`` and a per-thread rate at least 0.7x the top-3 median rate):
   ``TPT`` = median of their per-thread rates (fewer than three: the median of the top-3
   per-thread rates, since a busy thread never beats TPT). The rate condition matters on the real
   engine: a stage limited in total (a disk, a link) but starved by another stage shows
   ``n * rate`` above its plateau, which inflates ``B0``, while its saturated samples keep a
   per-thread rate ``B / n`` well below TPT;
3. saturated samples (the linear prediction ``n * TPT`` exceeds ``c`` by 25%, or by 10% for a
   sample whose threads were >= 90% busy and whose ``c`` is within 10% of the top capacities of
   such busy samples: a plateau just under ``max_threads * TPT``): ``B`` = median
   of their capacities. A stage with too few saturated samples never hit its bandwidth: the data
   only bound it from below by ``max(B0, highest achieved throughput)`` (``bandwidth_bound_bps``
   in ``meta``), and ``B`` is set to ``max(bound, max_threads * TPT)`` (threads were the limit as
   far as the samples show);
4. ``TPT`` is re-estimated from the samples clearly below ``B`` (``n * TPT < 0.8 B``);
   a stage saturated even at its smallest thread count only bounds ``TPT`` from below;
5. ``noise`` = the (trimmed) std of the relative residuals ``c / c(n) - 1``.
6. A stage with fewer than three usable samples (its threads were nearly always waiting on a
   buffer: it never limited the path) gets lower bounds instead of an error (``few_samples``,
   ``tpt_lower_bound`` and ``bandwidth_lower_bound`` in ``meta``): ``TPT`` = the highest busy
   per-thread rate of its usable samples, or without any, the highest throughput per thread it
   achieved (``moved / (n * interval)``); ``bandwidth_bound_bps`` = the highest capacity or
   achieved throughput seen; ``B = max(bound, max_threads * TPT)``. So that the simulator keeps
   the measured bottleneck, such a stage's capacity at ``max_threads`` is raised to at least 1.25x
   the weakest stage seen limiting the path (step 7; ``raised_above_bottleneck``). Only a stage
   that moved no bytes at all raises :class:`ProfileError`. Lower-bound stages have spreads 0 and
   no residuals.
7. The fit is judged against what the exploration delivered (:func:`judge_evidence`). An
   interval's *delivered* rate is what the write stage moved; its rate *through* the path is the
   least of the three stages' throughputs (a buffer filling or draining raises one stage's
   throughput, never all three). A stage counts as *seen limiting the path* only when its peak
   capacity was measured (its plateau, step 3, or ``max_threads`` times a measured TPT below a
   plateau never reached) and lies within the margin of what the path did: at most the highest
   delivered rate, at least the median rate through the path at its ceiling (the rates within
   :data:`CEILING_FRACTION` of the top-k of step 1).
   A measured value outside that band is marked ``not_seen_limiting`` and its bandwidth becomes
   a lower bound: above the band the path never went that fast, below it the path went faster
   than the stage could. If no stage was seen limiting, every stage's bandwidth is set to the
   highest delivered rate, so the profile never promises more than the exploration delivered
   (``capped_to_end_to_end``); ``meta["fit"]["evidence"]`` keeps what the fit promised before
   (``promised_bps``), and :func:`weak_fit_reasons` calls such a fit weak. The margin is one
   chunk per interval (the resolution of a byte count) plus :data:`EVIDENCE_SIGMAS` standard
   deviations of the rates through the path at its ceiling.

Bytes count when a chunk completes, busy time as it passes. A thread that started in the interval
has a chunk in progress at its end that it was busy on but whose bytes count in the next
interval; a thread that ran through the boundary brought as many bytes in as it takes out. So an
interval after a rise from ``n0`` to ``n`` threads under-reads the per-thread rate by about
``(n - n0) * chunk / 2`` bytes (much of a new thread's share where a chunk is a good part of
what a thread moves in an interval).
``inflight_bytes`` (:meth:`automdt.interval.IntervalRecord.to_sample` fills it in) is added back for the
medians of per-thread rates over linear samples in steps 2 and 4 only: on a plateau a stage's
total does not grow with threads, so the top-rate fallback and the capacities of steps 1 and 3
use the bytes as counted.

``tpt_spread`` / ``bandwidth_spread`` are the relative standard errors of the two medians
(``1.2533 * robust std / sqrt(count) / value``); ``meta["fit"]`` holds per-stage details.
"""
from __future__ import annotations

import math
from dataclasses import replace as _replace_stage
from typing import Any, Mapping, Sequence

import numpy as np

from automdt.simulator.dynamics import run_interval
from automdt.simulator.profile import STAGES, Profile, ProfileError, StageProfile, capacity_array

__all__ = ["fit_profile", "fit_contention", "judge_evidence", "synthetic_samples", "stage_confidence", "weak_fit_reasons",
           "EVIDENCE_SIGMAS", "MIN_FIT_SAMPLES", "MIN_STAGE_SAMPLES"]

_MAD_TO_STD = 1.4826
MIN_STAGE_SAMPLES = 3
"""Usable samples a stage needs to be fitted (steps 1-5); with fewer it gets lower bounds (step 6)."""


def _robust_std(x: np.ndarray) -> float:
    if x.size < 2:
        return 0.0
    return float(_MAD_TO_STD * np.median(np.abs(x - np.median(x))))


def _topk_median(x: np.ndarray, k: int) -> float:
    k = max(1, min(k, x.size))
    return float(np.median(np.sort(x)[-k:]))


def _rel_stderr(x: np.ndarray, value: float) -> float:
    if x.size < 2 or value <= 0:
        return 0.0
    return float(1.2533 * _robust_std(x) / math.sqrt(x.size) / value)


def _arrays(samples: Sequence[Mapping[str, Any]], interval_s: float | None) -> dict[str, np.ndarray]:
    if len(samples) == 0:
        raise ProfileError("fit_profile: no samples")
    n = len(samples)
    threads = np.zeros((n, 3))
    nbytes = np.zeros((n, 3))
    moved = np.zeros((n, 3))
    busy = np.full((n, 3), np.nan)
    inflight = np.zeros((n, 3))
    intervals = np.zeros(n)
    known = np.zeros(n, dtype=bool)  # every stage's moved bytes are known (not zeroed as unusable)
    for j, s in enumerate(samples):
        try:
            threads[j] = s["threads"]
            nbytes[j] = s["bytes"]
            moved[j] = s["moved"] if s.get("moved") is not None else s["bytes"]
            known[j] = s.get("moved") is not None or bool(np.all(nbytes[j] > 0))
        except (KeyError, ValueError, TypeError) as e:
            raise ProfileError(f"fit_profile: sample {j} needs 'threads' and 'bytes' triples ({e})") from None
        intervals[j] = float(s.get("interval_s") or interval_s or 1.0)
        if s.get("inflight_bytes") is not None:
            inflight[j] = s["inflight_bytes"]
        if s.get("busy_s") is not None:
            busy[j] = s["busy_s"]
        elif s.get("wait_s") is not None:
            busy[j] = threads[j] * intervals[j] - np.asarray(s["wait_s"], dtype=np.float64)
    # Without busy counters assume the threads were busy all interval: c is then the achieved
    # throughput, a lower bound of the capacity.
    busy = np.where(np.isnan(busy), threads * intervals[:, None], busy)
    return {"threads": threads, "bytes": nbytes, "moved": moved, "busy": busy, "interval": intervals,
            "inflight": inflight, "moved_known": known}


def _fit_stage(a: Mapping[str, np.ndarray], i: int, ok: np.ndarray, max_threads: int
               ) -> tuple[StageProfile, dict[str, Any], np.ndarray]:
    """Fit stage ``i`` from its (at least three) usable samples ``ok``: steps 1-4 of the module docstring."""
    n, b, busy = a["threads"][ok, i], a["bytes"][ok, i], a["busy"][ok, i]
    busy = np.minimum(busy, n * a["interval"][ok])  # a thread cannot be busy longer than the interval
    per_thread = b / busy  # bytes/s of one busy thread
    cap = n * per_thread  # stage capacity at n threads
    rate = (b + a["inflight"][ok, i]) / busy  # per-thread rate with new threads' chunks in progress
    k_top = max(3, int(math.ceil(0.1 * cap.size)))
    b0 = _topk_median(cap, k_top)
    # A stage that was the limit keeps its threads busy; a starved one only shows n * rate, which
    # on the real engine ignores a limit of all threads together: the busy samples' own plateau.
    limiting = busy >= 0.9 * n * a["interval"][ok]
    b0_busy = _topk_median(cap[limiting], k_top) if limiting.sum() >= 3 else b0
    # On the slope a busy thread runs at TPT; a low per-thread rate means a plateau, even under a
    # b0 inflated by starved samples (a limit of all threads together does not slow a thread
    # while the stage moves less than it, so a starved stage's n * rate overshoots its plateau).
    lin = (cap < 0.7 * b0) & (per_thread >= 0.7 * _topk_median(per_thread, 3))
    tpt_lower = False
    if lin.sum() >= 3:
        tpt = float(np.median(rate[lin]))
    else:  # few points on the slope: a busy thread is never faster than TPT, take the top rates
        tpt = _topk_median(per_thread, 3)  # as counted: these may be plateau samples
        # even the fewest threads reached the plateau: TPT is only bounded from below. Unless the
        # per-thread rate stays put while n grows: on a plateau it would fall as 1/n, so a few
        # samples at similar counts, all on the slope, are no plateau.
        on_slope = bool(n.max() >= 1.5 * n.min() and np.all(np.abs(per_thread / tpt - 1.0) <= 0.2))
        tpt_lower = bool(n.min() * tpt >= 0.7 * b0) and not on_slope
    # well below the linear prediction, or (a plateau just under max_threads * TPT) a busy sample
    # on the busy samples' plateau and still 10% below the linear prediction
    sat = (n * tpt >= 1.25 * cap) | (limiting & (cap >= 0.9 * b0_busy) & (n * tpt >= 1.1 * cap))
    saturated = bool(sat.sum() >= 3) or tpt_lower
    if tpt_lower:
        sat = np.ones_like(sat)
    bound = None
    if saturated:
        bw = float(np.median(cap[sat]))
        bw_spread = _rel_stderr(cap[sat], bw)
    else:  # the plateau was never reached: what the stage moved bounds B; threads were the limit
        bound = max(b0, _achieved_max(a, i))
        bw = max(bound, max_threads * tpt)
        bw_spread = 0.0
    if not tpt_lower:
        clear = n * tpt < 0.8 * bw
        if clear.sum() >= 3:
            tpt = float(np.median(rate[clear]))
        lin_set = rate[clear] if clear.sum() >= 3 else rate[lin]
        tpt_spread = _rel_stderr(lin_set, tpt)
    else:
        tpt = max(tpt, bw / float(n.min()))
        tpt_spread = 0.0
    info: dict[str, Any] = {
        "saturated": saturated,
        "bandwidth_lower_bound": not saturated,
        "tpt_lower_bound": tpt_lower,
        "few_samples": False,
        "samples_used": int(ok.sum()),
        "samples_linear": int(lin.sum()),
        "samples_saturated": int(sat.sum()) if saturated else 0,
        "max_capacity_bps": float(cap.max()),
    }
    if bound is not None:
        info["bandwidth_bound_bps"] = float(bound)
    residuals = cap / capacity_array(tpt, bw, n) - 1.0
    return StageProfile(tpt=tpt, bandwidth=bw, tpt_spread=tpt_spread, bandwidth_spread=bw_spread), info, residuals


def _achieved_max(a: Mapping[str, np.ndarray], i: int) -> float:
    """The highest throughput (bytes/s) stage ``i`` achieved in any sample, usable or not."""
    return float(np.max(a["moved"][:, i] / a["interval"]))


def _bound_stage(a: Mapping[str, np.ndarray], i: int, ok: np.ndarray, max_threads: int, name: str,
                 min_busy_s: float) -> tuple[StageProfile, dict[str, Any]]:
    """Lower bounds for a stage with fewer than three usable samples (step 6 of the module docstring)."""
    n, dt = a["threads"][:, i], a["interval"]
    achieved = a["moved"][:, i] / dt
    if ok.any():
        busy = np.minimum(a["busy"][ok, i], n[ok] * dt[ok])
        per_thread = a["bytes"][ok, i] / busy
        tpt = float(per_thread.max())
        cap_max = float((n[ok] * per_thread).max())
        source = f"busy-time rate of {int(ok.sum())} usable sample(s)"
    elif achieved.max() > 0:
        tpt = float(np.max(np.where(n >= 1, achieved / np.maximum(n, 1), 0.0)))
        cap_max = 0.0
        source = "highest throughput per thread"
    else:
        raise ProfileError(f"fit_profile: stage {name} has no usable samples (need bytes > 0 and busy_s >= "
                           f"{min_busy_s:g}) and moved no bytes")
    bound = max(cap_max, float(achieved.max()))
    info = {
        "saturated": False,
        "bandwidth_lower_bound": True,
        "tpt_lower_bound": True,
        "few_samples": True,
        "tpt_source": source,
        "samples_used": int(ok.sum()),
        "samples_linear": 0,
        "samples_saturated": 0,
        "max_capacity_bps": cap_max,
        "bandwidth_bound_bps": bound,
        "tpt_bound_bps": tpt,
    }
    return StageProfile(tpt=tpt, bandwidth=max(bound, max_threads * tpt)), info


_ABOVE_BOTTLENECK = 1.25


def fit_profile(
    samples: Sequence[Mapping[str, Any]],
    interval_s: float | None = None,
    buffers: tuple[int, int] = (256 * 2**20, 256 * 2**20),
    max_threads: int = 32,
    min_busy_s: float | None = None,
    keep_samples: bool = True,
    chunk_bytes: int | None = None,
) -> Profile:
    """Fit per-thread throughputs, bandwidths and noise from exploration samples, then judge the
    fit against the end-to-end rates the samples show (steps 1-7 of the module docstring).

    :param samples: list of sample dicts (module docstring).
    :param interval_s: control interval of the profile; ``None``: the median of the samples'.
    :param buffers: (sender, receiver) staging-buffer capacities in bytes.
    :param max_threads: thread bound of the profile.
    :param min_busy_s: ignore a stage in samples with less busy time (thread-seconds) than this;
        default 5% of the interval.
    :param keep_samples: store the samples in the profile.
    :param chunk_bytes: the chunk size the samples were taken with (bytes); a count is exact to
        one chunk, which widens the evidence margin of :func:`judge_evidence`. ``None``: no such term.
    """
    a = _arrays(samples, interval_s)
    if interval_s is None:
        interval_s = float(np.median(a["interval"]))
    if min_busy_s is None:
        min_busy_s = 0.05 * interval_s
    stages, details, residuals = _fit_stages(a, max_threads, min_busy_s)
    noise = _residual_noise(residuals)
    meta = {
        "fit": {
            "method": "busy-time capacities; min(n*TPT, B); medians",
            "n_samples": len(samples),
            "duration_s": float(a["interval"].sum()),
            "stages": details,
            "noise_residual_std": noise,
            "spreads": "relative standard errors of the medians",
        }
    }
    profile = Profile(
        read=stages[0], net=stages[1], write=stages[2],
        sender_buffer=int(buffers[0]), receiver_buffer=int(buffers[1]),
        interval_s=float(interval_s), max_threads=int(max_threads), noise=min(noise, 0.5),
        samples=[dict(s) for s in samples] if keep_samples else None, meta=meta,
    )
    profile = fit_contention(profile, samples, min_busy_s=min_busy_s)
    return judge_evidence(profile, samples, chunk_bytes=chunk_bytes)


def _fit_stages(a: Mapping[str, np.ndarray], max_threads: int, min_busy_s: float
                ) -> tuple[list[StageProfile], dict[str, Any], list[np.ndarray]]:
    """Each stage fitted from its usable samples (steps 1-5), or bounded when it has fewer than
    three (step 6): ``(stages, per-stage details, residuals of the fitted stages)``."""
    stages: list[StageProfile] = []
    details: dict[str, Any] = {}
    residuals: list[np.ndarray] = []
    for i, name in enumerate(STAGES):
        ok = (a["threads"][:, i] >= 1) & (a["bytes"][:, i] > 0) & (a["busy"][:, i] >= min_busy_s)
        if ok.sum() >= MIN_STAGE_SAMPLES:
            stage, info, res = _fit_stage(a, i, ok, max_threads)
            residuals.append(res)
        else:
            stage, info = _bound_stage(a, i, ok, max_threads, name, min_busy_s)
        stages.append(stage)
        details[name] = info
    return stages, details, residuals


def _residual_noise(residuals: list[np.ndarray]) -> float:
    """The std of the relative capacity residuals of all fitted stages, without outliers beyond
    four robust standard deviations (step 5)."""
    res = np.concatenate(residuals) if residuals else np.zeros(0)
    med = float(np.median(res)) if res.size else 0.0
    keep = np.abs(res - med) <= max(4.0 * _robust_std(res), 1e-12)
    return float(np.std(res[keep])) if keep.sum() >= 2 else 0.0


# ---------------------------------------------------------------------------------------------
# Evidence: a fit may promise no more than the exploration delivered (step 7)
# ---------------------------------------------------------------------------------------------
EVIDENCE_SIGMAS = 2.0
"""Width of the evidence band in standard deviations (a count of them; the deviations are relative
to the rate) of the rates through the path at its ceiling. With one chunk per interval of count
resolution it is the margin by which a measured peak capacity may lie above the highest delivered
rate, or below the median rate through the path at its ceiling, and still count as seen limiting the
path: a difference that normal interval-to-interval noise of that spread exceeds on one side
about once in 44 intervals."""
CEILING_FRACTION = 0.8
"""Rates through the path at least this fraction (dimensionless) of the median of the top ones
are the path's ceiling: their median is the rate it kept up, their robust relative spread the
noise of :data:`EVIDENCE_SIGMAS`."""


def end_to_end_rates(samples: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """Per sample, in bytes/s: ``(delivered, through)``. ``delivered`` is what the write stage
    moved (what reached the destination); ``through`` is the least of the three stages'
    throughputs, the rate at which data passed the whole path in that interval (a buffer filling
    or draining raises one stage's throughput, never all three). NaN where a sample has no
    ``moved`` and the stage's ``bytes`` were marked unusable (unknown)."""
    a = _arrays(samples, None)
    known = a["moved_known"]
    delivered = np.where(known | (a["bytes"][:, 2] > 0), a["moved"][:, 2] / a["interval"], np.nan)
    through = np.where(known, a["moved"].min(axis=1) / a["interval"], np.nan)
    return delivered, through


def end_to_end_evidence(samples: Sequence[Mapping[str, Any]], chunk_bytes: int | None = None
                        ) -> dict[str, Any] | None:
    """What the exploration delivered (:func:`end_to_end_rates`), or None if nothing was delivered.

    ``max_bps``: the highest delivered rate of an interval; ``top_bps``: the rate the path kept
    up at its ceiling, the median of the rates through the whole path that reach
    :data:`CEILING_FRACTION` of the median of the top-k ones (k = max(3, 10% of the intervals),
    as in step 1; the top-k alone sit above the ceiling by the noise); None if no interval moved
    data through all three stages; ``noise``: the robust relative std of those ceiling rates;
    ``resolution``: one chunk per interval relative to ``max_bps`` (0 without ``chunk_bytes``);
    ``margin``: ``resolution + EVIDENCE_SIGMAS * noise``.
    """
    delivered, through = end_to_end_rates(samples)
    delivered = delivered[np.isfinite(delivered) & (delivered > 0)]
    through = through[np.isfinite(through) & (through > 0)]
    if delivered.size == 0:
        return None
    hi = float(delivered.max())
    top_bps, noise = None, 0.0
    if through.size:
        top = float(np.median(np.sort(through)[-max(3, int(math.ceil(0.1 * through.size))):]))
        ceiling = through[through >= CEILING_FRACTION * top]
        top_bps = float(np.median(ceiling))
        noise = _robust_std(ceiling) / top_bps
    interval = float(np.median([float(s.get("interval_s") or 1.0) for s in samples]))
    resolution = float(chunk_bytes) / (interval * hi) if chunk_bytes else 0.0
    return {"max_bps": hi, "top_bps": top_bps, "noise": round(noise, 4), "resolution": round(resolution, 4),
            "margin": round(resolution + EVIDENCE_SIGMAS * noise, 4), "intervals": int(delivered.size)}


def judge_evidence(profile: Profile, samples: Sequence[Mapping[str, Any]] | None = None,
                   chunk_bytes: int | None = None) -> Profile:
    """The profile with every bandwidth checked against the end-to-end rates (step 7).

    Marks each stage ``seen_limiting`` (or, for a measured bandwidth outside the band,
    ``not_seen_limiting`` and a lower bound), keeps the stages not seen limiting 25% above the
    weakest one seen limiting, or, when none was, sets every bandwidth to the highest delivered
    rate. ``meta["fit"]["evidence"]`` gets :func:`end_to_end_evidence`, the stages seen limiting,
    ``promised_bps`` (the fit's achievable rate before this step) and ``capped``. Without samples
    (``profile.samples`` if a list) or without a positive end-to-end rate it returns the profile
    with ``evidence`` None.

    :param profile: a fitted profile whose ``meta["fit"]["stages"]`` holds the fit's details.
    :param samples: the samples it was fitted from; None: ``profile.samples``.
    :param chunk_bytes: the exploration's chunk size (bytes), or None.
    """
    if samples is None:
        samples = profile.samples if isinstance(profile.samples, list) else []
    fit = dict((profile.meta or {}).get("fit") or {})
    details = {k: dict(v) for k, v in (fit.get("stages") or {}).items()}
    ev = end_to_end_evidence(samples, chunk_bytes) if samples else None
    stages = list(profile.stages)
    if ev is None or set(details) != set(STAGES):
        fitted = [j for j, name in enumerate(STAGES) if not (details.get(name) or {}).get("few_samples", True)]
        if fitted:  # no end-to-end rate to judge by: keep the bounds above the fitted stages
            _keep_above_bottleneck(stages, details, fitted, profile.max_threads)
        meta = dict(profile.meta, fit=dict(fit, stages=details, evidence=None))
        return profile.replace(read=stages[0], net=stages[1], write=stages[2], meta=meta)
    peaks = profile.peak_capacities()
    hi = ev["max_bps"] * (1.0 + ev["margin"])
    lo = 0.0 if ev["top_bps"] is None else ev["top_bps"] * (1.0 - ev["margin"])
    seen = []
    for j, name in enumerate(STAGES):
        info = details[name]
        measured = _peak_measured(info)
        info["seen_limiting"] = bool(measured and lo <= peaks[j] <= hi)
        if info["seen_limiting"]:
            seen.append(j)
        elif measured:
            info["not_seen_limiting"] = "above the highest delivered rate" if peaks[j] > hi else \
                "below the end-to-end rate the path kept up"
            if not info.get("bandwidth_lower_bound"):
                info["bandwidth_lower_bound"] = True
                info["fitted_bandwidth_bps"] = float(stages[j].bandwidth)
    ev.update(seen_limiting=[STAGES[j] for j in seen], promised_bps=float(profile.achievable_bps), capped=not seen)
    if seen:
        _keep_above_bottleneck(stages, details, seen, profile.max_threads)
    else:
        for j, name in enumerate(STAGES):
            details[name].setdefault("fitted_bandwidth_bps", float(stages[j].bandwidth))
            details[name]["capped_to_end_to_end"] = True
            stages[j] = _replace_stage(stages[j], bandwidth=ev["max_bps"], bandwidth_spread=0.0)
    meta = dict(profile.meta, fit=dict(fit, stages=details, evidence=ev))
    return profile.replace(read=stages[0], net=stages[1], write=stages[2], meta=meta)


def _peak_measured(info: Mapping[str, Any]) -> bool:
    """Whether the fit measured a stage's peak capacity: its plateau (step 3), or, below a plateau
    never reached, ``max_threads`` times a measured per-thread rate."""
    if info.get("few_samples"):
        return False
    return not info.get("bandwidth_lower_bound") or not info.get("tpt_lower_bound")


def _keep_above_bottleneck(stages: list[StageProfile], details: dict[str, Any], seen: list[int],
                           max_threads: int) -> None:
    """Keep every stage not seen limiting at least 25% above the weakest stage seen limiting.

    Such a stage never limited the path (its threads were mostly waiting on a buffer, or its
    measured plateau lies above anything the path delivered), so its bounds may still tie with or
    fall below the bottleneck, which would move the simulator's bottleneck and the oracle to the
    wrong stage.
    """
    ref = min(float(capacity_array(stages[j].tpt, stages[j].bandwidth, max_threads)) for j in seen)
    for j, name in enumerate(STAGES):
        st = stages[j]
        if j in seen or capacity_array(st.tpt, st.bandwidth, max_threads) >= _ABOVE_BOTTLENECK * ref:
            continue
        bw = max(st.bandwidth, _ABOVE_BOTTLENECK * ref)
        stages[j] = _replace_stage(st, tpt=max(st.tpt, bw / max_threads), bandwidth=bw)
        details[name]["raised_above_bottleneck"] = True


def synthetic_samples(
    profile: Profile,
    n: int,
    rng: np.random.Generator,
    noise: float | None = None,
    threads_low: int = 1,
    threads_high: int | None = None,
) -> list[dict[str, Any]]:
    """Exploration samples from the simulator: ``n`` intervals, each with a random triple.

    Thread counts are uniform in ``[threads_low, threads_high]`` (default ``max_threads``) per
    stage; buffers start empty and carry over. Busy time follows the simulator's model: a busy
    thread moves ``capacity / n`` bytes/s, so ``busy_s = bytes * n / capacity`` and
    ``wait_s = n * interval_s - busy_s``.

    :param profile: the true profile.
    :param n: number of samples (intervals).
    :param rng: random generator.
    :param noise: per-interval capacity noise (relative std); ``None``: the profile's.
    """
    hi = profile.max_threads if threads_high is None else threads_high
    noise = profile.noise if noise is None else noise
    dt = profile.interval_s
    smax = np.array([float(profile.sender_buffer)])
    rmax = np.array([float(profile.receiver_buffer)])
    S, R = np.zeros(1), np.zeros(1)
    out: list[dict[str, Any]] = []
    for j in range(n):
        thr = rng.integers(threads_low, hi + 1, size=3)
        f = 1.0 + noise * math.sqrt(3.0) * (2.0 * rng.random(3) - 1.0)
        cap = profile.capacities(thr) * f
        S, R, moved = run_interval(S, R, cap[None, :], dt, smax, rmax, 1)
        moved = moved[0]
        busy = np.minimum(moved * thr / cap, thr * dt)
        out.append({
            "t": (j + 1) * dt,
            "threads": [int(x) for x in thr],
            "bytes": [float(x) for x in moved],
            "busy_s": [float(x) for x in busy],
            "wait_s": [float(x) for x in thr * dt - busy],
            "interval_s": dt,
            "buffer": [float(S[0] / smax[0]), float(R[0] / rmax[0])],
        })
    return out


# ---------------------------------------------------------------------------------------------
# Contention: capacities that bend and fall with too many threads (Universal Scalability Law)
# ---------------------------------------------------------------------------------------------
CONTENTION_GRID = np.concatenate([[0.0], np.logspace(-3.0, -0.3, 24)])
"""USL sigma values the contention fit tries (0 and 0.001-0.5)."""
COHERENCY_GRID = np.concatenate([[0.0], np.logspace(-5.0, -1.0, 24)])
"""USL kappa values the contention fit tries (0 and 1e-5-0.1)."""
CONTENTION_MIN_DECLINE = 0.05
"""A stage gets contention only if the fitted capacity at the largest sampled thread count is at
least this much below its peak: a bend the samples show, not an extrapolation."""
CONTENTION_MIN_BIC_GAIN = 6.0
"""...and if the two extra parameters lower the Bayesian information criterion by this much."""


def fit_contention(profile: Profile, samples: Sequence[Mapping[str, Any]], min_busy_s: float | None = None
                   ) -> Profile:
    """Add USL ``contention``/``coherency`` to the stages whose samples show them (else unchanged).

    For each stage the fit measured (not one with few samples or a TPT lower bound) it takes the
    capacities ``n * bytes / busy_s`` of the usable samples in which the stage's threads were
    >= 90% busy (the stage was the limit, so the capacity is what it could do; with fewer than six
    such samples, all usable ones) and fits, in log space,

    * ``M0``: ``min(n * TPT, B)``, and
    * ``M1``: ``min(n * TPT, B) / (1 + sigma (n - 1) + kappa n (n - 1))``,

    each by grid search (``TPT`` within +-24% and ``B`` within 0.6-3x of the plain fit's,
    :data:`CONTENTION_GRID`, :data:`COHERENCY_GRID`). ``M1`` is kept when it lowers the BIC by
    :data:`CONTENTION_MIN_BIC_GAIN` and its capacity at the largest sampled count is at least
    :data:`CONTENTION_MIN_DECLINE` below its peak; the stage then gets ``M1``'s TPT, B, sigma and
    kappa, and ``meta["fit"]["stages"][stage]["contention"]`` the evidence (peak count and rate,
    decline, BIC gain, samples). Profiles of paths without contention come out unchanged; a screen
    (the top quartile of thread counts at least 5% below the best lower quartile's median
    capacity) skips the grid for stages whose samples do not fall at all.
    """
    if not samples:
        return profile
    a = _arrays(samples, profile.interval_s)
    if min_busy_s is None:
        min_busy_s = 0.05 * profile.interval_s
    details = profile.meta.get("fit", {}).get("stages", {})
    stages = list(profile.stages)
    changed = False
    for i, name in enumerate(STAGES):
        info = details.get(name, {})
        if info.get("few_samples") or info.get("tpt_lower_bound"):
            continue
        ok = (a["threads"][:, i] >= 1) & (a["bytes"][:, i] > 0) & (a["busy"][:, i] >= min_busy_s)
        n = a["threads"][ok, i]
        busy = np.minimum(a["busy"][ok, i], n * a["interval"][ok])
        cap = n * a["bytes"][ok, i] / busy
        limiting = busy >= 0.9 * n * a["interval"][ok]
        if limiting.sum() >= 6:
            n, cap = n[limiting], cap[limiting]
        if n.size < 6 or np.unique(n).size < 3 or not _declines(n, cap):
            continue
        res = _usl_fit(n, cap, stages[i], profile.max_threads)
        if res is None:
            continue
        st, evidence = res
        stages[i] = st
        if name in details:
            details[name]["contention"] = evidence
        changed = True
    if not changed:
        return profile
    meta = dict(profile.meta)
    if "fit" in meta:
        meta["fit"] = dict(meta["fit"], contention_model="USL: min(n*TPT, B) / (1 + sigma (n-1) + kappa n (n-1))")
    return profile.replace(read=stages[0], net=stages[1], write=stages[2], meta=meta)


def _declines(n: np.ndarray, cap: np.ndarray) -> bool:
    """Cheap screen: does the median capacity of the highest thread counts fall below the best
    median of lower counts by at least :data:`CONTENTION_MIN_DECLINE`? (Quartiles of ``n``.)"""
    order = np.argsort(n, kind="stable")
    groups = [g for g in np.array_split(order, 4) if g.size]
    meds = [float(np.median(cap[g])) for g in groups]
    return len(meds) >= 3 and meds[-1] <= (1.0 - CONTENTION_MIN_DECLINE) * max(meds[:-1])


def _usl_fit(n: np.ndarray, cap: np.ndarray, base: StageProfile, max_threads: int
             ) -> tuple[StageProfile, dict[str, Any]] | None:
    """Grid fit of M0 and M1 (see :func:`fit_contention`); the contended stage and the evidence, or None."""
    y = np.log(np.maximum(cap, 1.0))
    m = float(n.size)
    tpts = base.tpt * np.linspace(0.76, 1.24, 9)
    bws = base.bandwidth * np.geomspace(0.6, 3.0, 33)
    lin = np.minimum(n[None, None, :] * tpts[:, None, None], bws[None, :, None])  # (T, B, m)
    loglin = np.log(lin)
    sse0 = ((y - loglin) ** 2).sum(axis=2)  # (T, B)
    j0 = np.unravel_index(int(np.argmin(sse0)), sse0.shape)
    best: tuple[float, tuple[float, float, float, float] | None] = (np.inf, None)
    for sig in CONTENTION_GRID:
        den = np.log(1.0 + sig * (n[None, :] - 1.0) + COHERENCY_GRID[:, None] * n[None, :] * (n[None, :] - 1.0))
        # (K, T, B, m): y - (log lin - log den)
        r = y[None, None, None, :] - loglin[None, :, :, :] + den[:, None, None, :]
        sse = (r ** 2).sum(axis=3)
        j = np.unravel_index(int(np.argmin(sse)), sse.shape)
        if sse[j] < best[0]:
            best = (float(sse[j]), (float(sig), float(COHERENCY_GRID[j[0]]), float(tpts[j[1]]), float(bws[j[2]])))
    sse1, params = best
    if params is None:
        return None
    sig, kap, tpt, bw = params
    if sig == 0.0 and kap == 0.0:
        return None
    floor = 1e-12 * m
    bic0 = m * math.log(max(float(sse0[j0]), floor) / m) + 2.0 * math.log(m)
    bic1 = m * math.log(max(sse1, floor) / m) + 4.0 * math.log(m)
    grid = np.arange(1, int(max(n.max(), 1)) + 1, dtype=np.float64)
    curve = capacity_array(tpt, bw, grid) / (1.0 + sig * (grid - 1.0) + kap * grid * (grid - 1.0))
    peak_i = int(np.argmax(curve))
    decline = 1.0 - float(curve[-1] / curve[peak_i])
    beyond = int((n > grid[peak_i]).sum())
    if bic0 - bic1 < CONTENTION_MIN_BIC_GAIN or decline < CONTENTION_MIN_DECLINE or beyond < 3:
        return None
    evidence = {
        "sigma": sig, "kappa": kap, "peak_threads": int(grid[peak_i]), "peak_bps": float(curve[peak_i]),
        "decline_at_max_sampled": round(decline, 4), "max_sampled_threads": int(n.max()),
        "bic_gain": round(bic0 - bic1, 2), "samples": int(m), "samples_beyond_peak": beyond,
        "plain_fit": {"tpt": float(base.tpt), "bandwidth": float(base.bandwidth)},
    }
    st = StageProfile(tpt=tpt, bandwidth=bw, tpt_spread=base.tpt_spread, bandwidth_spread=base.bandwidth_spread,
                      contention=sig, coherency=kap)
    return st, evidence


# ---------------------------------------------------------------------------------------------
# How far a fit can be trusted (``automdt explore`` prints this and refuses a weak fit)

MIN_FIT_SAMPLES = 10
"""Fewer exploration intervals than this make a weak fit, whatever they show."""


def stage_confidence(profile: Profile) -> dict[str, dict[str, Any]]:
    """Per stage: samples used, the spreads, whether each value was measured or is only a lower
    bound, whether the stage was seen limiting the path and whether its bandwidth was capped at
    the highest delivered rate (step 7), from ``profile.meta["fit"]``; a profile without it counts
    as measured."""
    details = ((profile.meta or {}).get("fit") or {}).get("stages") or {}
    out: dict[str, dict[str, Any]] = {}
    for name, st in zip(STAGES, profile.stages):
        info = details.get(name) or {}
        out[name] = {
            "tpt": float(st.tpt), "bandwidth": float(st.bandwidth),
            "tpt_measured": not info.get("tpt_lower_bound", False),
            "bandwidth_measured": not info.get("bandwidth_lower_bound", False),
            "tpt_spread": float(st.tpt_spread), "bandwidth_spread": float(st.bandwidth_spread),
            "samples_used": int(info.get("samples_used", 0)),
            "few_samples": bool(info.get("few_samples", False)),
            "seen_limiting": bool(info.get("seen_limiting", False)),
            "capped": bool(info.get("capped_to_end_to_end", False)),
        }
    return out


def weak_fit_reasons(profile: Profile, min_samples: int = MIN_FIT_SAMPLES) -> list[str]:
    """Why the fit of ``profile`` cannot be stood behind (empty: it can).

    A fit is weak when it rests on fewer than ``min_samples`` intervals, or when no stage was seen
    limiting the path (step 7 of the module docstring: every bandwidth is then a lower bound,
    capped at the highest delivered rate, and the simulator's bottleneck is a guess); the reason
    says whether the fit had promised more than the exploration ever delivered, or less than the
    path kept up. A profile judged without end-to-end rates (``evidence`` None or absent) is weak
    when every stage had too few samples to be measured.
    """
    fit = (profile.meta or {}).get("fit") or {}
    reasons = []
    n = int(fit.get("n_samples", 0))
    if n < min_samples:
        reasons.append(f"only {n} intervals were usable (at least {min_samples} needed)")
    ev = fit.get("evidence")
    if ev and ev.get("capped"):
        reasons.append(_no_limit_seen(ev))
    elif not ev and all(c["few_samples"] for c in stage_confidence(profile).values()):
        reasons.append("no stage limited the path long enough to be measured (every value is a lower bound)")
    return reasons


def _no_limit_seen(ev: Mapping[str, Any]) -> str:
    """The weak-fit reason of a profile capped to its highest delivered rate (rates in MB/s, 10^6 bytes/s)."""
    mb = 1e6
    promised, hi, margin, top = ev["promised_bps"], ev["max_bps"], ev["margin"], ev.get("top_bps")
    why = ""
    if promised > hi * (1.0 + margin):
        why = (f"the fit promised {promised / mb:.1f} MB/s, more than the exploration ever delivered "
               f"({hi / mb:.1f} MB/s, noise margin {margin:.0%}): ")
    elif top is not None and promised < top * (1.0 - margin):
        why = (f"the fit promised only {promised / mb:.1f} MB/s, less than the path kept up end to end "
               f"({top / mb:.1f} MB/s): ")
    return (f"{why}no stage was seen limiting the path, so every stage's bandwidth is only a lower bound, "
            f"capped at the highest delivered rate, {hi / mb:.1f} MB/s")
