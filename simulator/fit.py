"""Fit a :class:`~automdt.simulator.profile.Profile` from exploration samples.

A sample is one control interval of an exploration run with a random thread triple::

    {"t": 12.0,                      # seconds since the start (end of the interval)
     "threads": [r, n, w],
     "bytes":   [r, n, w],           # payload bytes each stage moved in the interval
     "busy_s":  [r, n, w],           # thread-seconds spent moving data (not waiting on a buffer)
     "wait_s":  [r, n, w],           # thread-seconds spent waiting on a buffer (full S, empty R...)
     "interval_s": 1.0,
     "buffer": [sender_fill, receiver_fill]}

The busy-time counters are what make a short exploration enough: ``bytes / busy_s`` is the rate
of one busy thread, so ``c = n * bytes / busy_s`` measures the stage's *capacity* at ``n``
threads even when the stage was held back by a buffer (the slides' 10-minute random run only
sees achieved throughputs, which are capped by the bottleneck). The capacity points
``(n, c)`` are then fitted with ``c(n) = min(n * TPT, B)``:

1. ``B0`` = median of the top-k capacities (k = max(3, 10% of the samples)): a rough plateau;
2. linear samples (``c < 0.7 * B0``): ``TPT`` = median of their per-thread rates (fewer than
   three: the median of the top-3 per-thread rates, since a busy thread never beats TPT);
3. saturated samples (the linear prediction ``n * TPT`` exceeds ``c`` by 25%): ``B`` = median
   of their capacities. A stage with too few saturated samples never hit its bandwidth: ``B`` is
   only a lower bound, set to ``max(B0, max_threads * TPT)`` (threads were the limit), and this
   is recorded in ``meta``;
4. ``TPT`` is re-estimated from the samples clearly below ``B`` (``n * TPT < 0.8 B``);
   a stage saturated even at its smallest thread count only bounds ``TPT`` from below;
5. ``noise`` = the (trimmed) std of the relative residuals ``c / c(n) - 1``.

``tpt_spread`` / ``bandwidth_spread`` are the relative standard errors of the two medians
(``1.2533 * robust std / sqrt(count) / value``); ``meta["fit"]`` holds per-stage details.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from automdt.simulator.dynamics import run_interval
from automdt.simulator.profile import STAGES, Profile, ProfileError, StageProfile, capacity_array

__all__ = ["fit_profile", "synthetic_samples"]

_MAD_TO_STD = 1.4826


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
    busy = np.full((n, 3), np.nan)
    intervals = np.zeros(n)
    for j, s in enumerate(samples):
        try:
            threads[j] = s["threads"]
            nbytes[j] = s["bytes"]
        except (KeyError, ValueError, TypeError) as e:
            raise ProfileError(f"fit_profile: sample {j} needs 'threads' and 'bytes' triples ({e})") from None
        intervals[j] = float(s.get("interval_s") or interval_s or 1.0)
        if s.get("busy_s") is not None:
            busy[j] = s["busy_s"]
        elif s.get("wait_s") is not None:
            busy[j] = threads[j] * intervals[j] - np.asarray(s["wait_s"], dtype=np.float64)
    # Without busy counters assume the threads were busy all interval: c is then the achieved
    # throughput, a lower bound of the capacity.
    busy = np.where(np.isnan(busy), threads * intervals[:, None], busy)
    return {"threads": threads, "bytes": nbytes, "busy": busy, "interval": intervals}


def fit_profile(
    samples: Sequence[Mapping[str, Any]],
    interval_s: float | None = None,
    buffers: tuple[int, int] = (256 * 2**20, 256 * 2**20),
    max_threads: int = 32,
    min_busy_s: float | None = None,
    keep_samples: bool = True,
) -> Profile:
    """Fit per-thread throughputs, bandwidths and noise from exploration samples.

    :param samples: list of sample dicts (module docstring).
    :param interval_s: control interval of the profile; ``None``: the median of the samples'.
    :param buffers: (sender, receiver) staging-buffer capacities in bytes.
    :param max_threads: thread bound of the profile.
    :param min_busy_s: ignore a stage in samples with less busy time (thread-seconds) than this;
        default 5% of the interval.
    :param keep_samples: store the samples in the profile.
    """
    a = _arrays(samples, interval_s)
    if interval_s is None:
        interval_s = float(np.median(a["interval"]))
    if min_busy_s is None:
        min_busy_s = 0.05 * interval_s
    stages: list[StageProfile] = []
    details: dict[str, Any] = {}
    residuals: list[np.ndarray] = []
    for i, name in enumerate(STAGES):
        n, b, busy = a["threads"][:, i], a["bytes"][:, i], a["busy"][:, i]
        ok = (n >= 1) & (b > 0) & (busy >= min_busy_s)
        if ok.sum() < 3:
            raise ProfileError(f"fit_profile: stage {name} has {int(ok.sum())} usable samples (need >= 3 with "
                               f"bytes > 0 and busy_s >= {min_busy_s:g})")
        n, b, busy = n[ok], b[ok], busy[ok]
        busy = np.minimum(busy, n * a["interval"][ok])  # a thread cannot be busy longer than the interval
        per_thread = b / busy  # bytes/s of one busy thread
        cap = n * per_thread  # stage capacity at n threads
        k_top = max(3, int(math.ceil(0.1 * cap.size)))
        b0 = _topk_median(cap, k_top)
        lin = cap < 0.7 * b0
        tpt_lower = False
        if lin.sum() >= 3:
            tpt = float(np.median(per_thread[lin]))
        else:  # few points on the slope: a busy thread is never faster than TPT, take the top rates
            tpt = _topk_median(per_thread, 3)
            # even the fewest threads reached the plateau: TPT is only bounded from below
            tpt_lower = bool(n.min() * tpt >= 0.7 * b0)
        sat = n * tpt >= 1.25 * cap
        saturated = bool(sat.sum() >= 3) or tpt_lower
        if tpt_lower:
            sat = np.ones_like(sat)
        if saturated:
            bw = float(np.median(cap[sat]))
            bw_spread = _rel_stderr(cap[sat], bw)
        else:
            bw = max(b0, max_threads * tpt)
            bw_spread = 0.0
        if not tpt_lower:
            clear = n * tpt < 0.8 * bw
            if clear.sum() >= 3:
                tpt = float(np.median(per_thread[clear]))
            lin_set = per_thread[clear] if clear.sum() >= 3 else per_thread[lin]
            tpt_spread = _rel_stderr(lin_set, tpt)
        else:
            tpt = max(tpt, bw / float(n.min()))
            tpt_spread = 0.0
        stage = StageProfile(tpt=tpt, bandwidth=bw, tpt_spread=tpt_spread, bandwidth_spread=bw_spread)
        stages.append(stage)
        pred = capacity_array(tpt, bw, n)
        residuals.append(cap / pred - 1.0)
        details[name] = {
            "saturated": saturated,
            "bandwidth_lower_bound": not saturated,
            "tpt_lower_bound": tpt_lower,
            "samples_used": int(ok.sum()),
            "samples_linear": int(lin.sum()),
            "samples_saturated": int(sat.sum()) if saturated else 0,
            "max_capacity_bps": float(cap.max()),
        }
    res = np.concatenate(residuals)
    med = float(np.median(res))
    spread = _robust_std(res)
    keep = np.abs(res - med) <= max(4.0 * spread, 1e-12)
    noise = float(np.std(res[keep])) if keep.sum() >= 2 else 0.0
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
    return Profile(
        read=stages[0], net=stages[1], write=stages[2],
        sender_buffer=int(buffers[0]), receiver_buffer=int(buffers[1]),
        interval_s=float(interval_s), max_threads=int(max_threads), noise=min(noise, 0.5),
        samples=[dict(s) for s in samples] if keep_samples else None, meta=meta,
    )


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
