"""Vectorised buffer dynamics shared by :class:`~automdt.simulator.env.BufferSimEnv` (N = 1) and
:class:`~automdt.simulator.vector.BatchedBufferSim` (N environments).

Keeping one implementation for both is what makes "env i of the batch == the single env seeded
``seed + i``" hold by construction; the tests check it anyway.

Randomness. Every reset of one environment draws exactly one block of
``N_PARAM_UNIFORMS + 3 * (episode_steps + 1)`` uniforms from that environment's generator, laid out
as :data:`U_LAYOUT` (profile draw, parameter jitter, start state, then the capacity-noise factors of
the reset interval and of every step). An episode that is stepped past ``episode_steps`` draws
further blocks of ``3 * (episode_steps + 1)`` uniforms. Nothing else consumes randomness.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from automdt.simulator.contract import (  # noqa: F401  (re-exported for importers of this module)
    ABSOLUTE_FIXED,
    ACTION_HEADS,
    ACTION_NAMES,
    DEFAULT_ACTION_HEAD,
    OBS_COLUMNS,
    OBS_DIM,
    OBS_NAMES,
    TARGET_NAMES,
    action_nvec,
)
from automdt.simulator.profile import (N_PROFILE_UNIFORMS, Profile, capacity_array, peak_capacity_array,
                                      random_profile_arrays)
from automdt.simulator.task import SimTask
from automdt.simulator.types import Observation

N_PARAM_UNIFORMS = 32
"""Uniforms reserved at each reset before the noise block (see :data:`U_LAYOUT`)."""

U_LAYOUT: dict[str, slice] = {
    "profile": slice(0, N_PROFILE_UNIFORMS),  # Profile.random draw (random_profiles=True)
    "tpt_jitter": slice(16, 19),  # randomize: tpt_i *= 1 + randomize * (2u - 1)
    "bandwidth_jitter": slice(19, 22),  # randomize: B_i *= 1 + randomize * (2u - 1)
    "start_threads": slice(22, 25),  # random_start: n_i = 1 + floor(u * max_threads)
    "start_fill": slice(25, 27),  # random_start: S/S_max, R/R_max = u
    "chunk_ratio": slice(27, 28),  # chunk_range: chunk = ratio * min_i tpt_i * interval_s, log-uniform
    "start_mode": slice(28, 29),  # start_mix: which kind of start (cold, random, drain)
    "noise": slice(N_PARAM_UNIFORMS, None),  # capacity factors 1 + noise*sqrt(3)*(2u - 1)
}
"""Where each part of the per-reset uniform block goes. With a chunk model (``chunk_bytes`` or
``chunk_range``) the noise part holds 6 uniforms per interval instead of 3: the capacity factors,
then the in-flight draws of :func:`measure_interval`."""

_SQRT3 = math.sqrt(3.0)
C = OBS_COLUMNS
_NEIGHBOUR = [OBS_NAMES.index(n) for n in ("net/throughput", "write/throughput", "net/throughput")]
"""Per stage, the encoded throughput of the neighbour whose flow it carries."""

# Step head: index -> (multiplier, addend); new = floor(n * mult) + add, then clipped. The names
# (ACTION_HEADS, ACTION_NAMES, TARGET_NAMES, OBS_NAMES...) live in the dependency-free
# automdt.simulator.contract.
ACTION_MULT = np.array([0.5, 1.0, 1.0, 1.0, 2.0])
ACTION_ADD = np.array([0, -1, 0, 1, 0], dtype=np.int64)
NEED_SLACK = 0.25
"""The ``target`` head rounds an anchor up once it is this far above a whole count (8.2 -> 8, 8.3 -> 9)."""


def need_from_encoding(enc: np.ndarray, max_threads: int) -> np.ndarray:
    """(N,6): per stage, the threads its current flow needs at its reference per-thread rate,
    ``n * utilization * efficiency``, then the threads it needs to carry its neighbour's flow,
    ``need * neighbour's throughput / own throughput`` (capped at the thread bound): readers and
    writers carry what the network moves, the network carries what the writers move. From
    encodings (N, :data:`OBS_DIM`). The ``target`` head anchors on them; the simulator and the
    live policy compute them from the same encoding."""
    e = np.asarray(enc, dtype=np.float64).reshape(-1, OBS_DIM)
    n = np.rint(e[:, C['threads']] * max_threads)
    need = n * e[:, C['utilization']] * e[:, C['efficiency']]
    neighbour = e[:, _NEIGHBOUR]  # net, write, net throughputs (over the same reference)
    carry = np.minimum(need * neighbour / np.maximum(e[:, C['throughput']], 1e-6), float(max_threads))
    return np.concatenate([need, carry], axis=1)

_TINY_BPS = 1.0  # floor of the throughput reference (bytes/s): avoids 0/0 before anything moved
BUSY_DROP = 0.95
"""An interval whose busy thread-seconds fell below this share of the previous interval's does
not raise a stage's reference rate (see :class:`EncodingState`)."""
MIN_RATE_BUSY_S = 0.25
"""Busy thread-seconds an interval needs before its per-thread rate ``bytes / busy`` may raise a
stage's reference rate (fewer: a chunk or two, too lumpy to trust)."""


def actions_to_threads(actions: np.ndarray, current: np.ndarray, max_threads: int,
                       head: str = DEFAULT_ACTION_HEAD, action_max: int | None = None,
                       need: np.ndarray | None = None) -> np.ndarray:
    """Vectorised :func:`~automdt.simulator.env.action_to_threads`: (N,3) indices -> (N,3) counts.

    :param head: the action head (:data:`ACTION_HEADS`).
    :param action_max: the thread bound the ``absolute`` head's indices go up to (default
        ``max_threads``); the result is clipped to ``[1, max_threads]`` either way.
    :param need: (N,6) the stages' anchors (:func:`need_from_encoding`), for the ``target`` head.
    """
    a = np.asarray(actions, dtype=np.int64)
    cur = np.asarray(current, dtype=np.int64)
    nvec = action_nvec(head, max_threads if action_max is None else action_max)
    if a.min(initial=0) < 0 or a.max(initial=0) >= nvec:
        raise ValueError(f"action indices must be in 0..{nvec - 1}, got {actions!r}")
    if head == "absolute":
        fixed = len(ABSOLUTE_FIXED)
        new = np.where(a == 0, cur, np.where(a == 1, cur - 1, np.where(a == 2, cur + 1, a - (fixed - 1))))
    elif head == "target":
        if need is None:
            raise ValueError("the target head needs the stages' needs (need_from_encoding)")
        anchors = np.asarray(need, dtype=np.float64).reshape(cur.shape[:-1] + (6,))
        nd = np.maximum(np.ceil(anchors[..., 0:3] - NEED_SLACK), 1.0)
        cy = np.maximum(np.ceil(anchors[..., 3:6] - NEED_SLACK), 1.0)
        m = max_threads if action_max is None else action_max
        table = np.stack([cur, cur - 1, cur + 1, nd, nd + 1, cy, cy + 1, 2 * cur, 4 * cur,
                          np.full(cur.shape, m), cur // 2], axis=-1)
        new = np.take_along_axis(table, a[..., None], axis=-1)[..., 0].astype(np.int64)
    else:
        new = np.floor(cur * ACTION_MULT[a]).astype(np.int64) + ACTION_ADD[a]
    return np.clip(new, 1, max_threads)


class EncodingState:
    """The running values behind the encoding of N transfers (one row each), and the encoding.

    The simulator (:class:`SimCore`) and the live policy
    (:class:`automdt.simulator.env.ObservationEncoder`) both call :meth:`encode` with one
    interval's measurements, so both compute the policy input with the same code.

    Running values per transfer: ``ref`` (largest stage throughput so far), ``best_rate`` (per
    stage, the best per-busy-thread rate ``bytes / busy thread-seconds``), ``peak`` (per stage,
    the largest throughput so far), and the previous interval's threads, throughputs and fills.

    ``best_rate`` learns only from intervals that can be trusted to show a stage's per-thread
    speed: at least :data:`MIN_RATE_BUSY_S` busy thread-seconds, no fewer threads than the
    interval before and no fewer busy thread-seconds than :data:`BUSY_DROP` of the interval
    before. A chunk's bytes count when it is done but its busy time as it passes, so whenever
    fewer threads keep working (the count was lowered, or a full buffer stopped them), chunks
    started in the previous interval complete in this one without their earlier busy time, and
    the stage's bytes per busy thread-second read well above what a thread moves.
    """

    def __init__(self, num_envs: int = 1) -> None:
        self.num_envs = int(num_envs)
        n = self.num_envs
        self.ref = np.zeros(n)
        self.best_rate = np.zeros((n, 3))
        self.peak = np.zeros((n, 3))
        self.prev_threads = np.ones((n, 3), dtype=np.int64)
        self.prev_tput = np.zeros((n, 3))
        self.prev_fill = np.zeros((n, 2))
        self.prev_busy = np.zeros((n, 3))
        self.seen = np.zeros(n, dtype=bool)

    def reset(self, rows: Any = None) -> None:
        """Start rows afresh (all if None)."""
        sel = slice(None) if rows is None else rows
        self.ref[sel] = 0.0
        self.best_rate[sel] = 0.0
        self.peak[sel] = 0.0
        self.prev_threads[sel] = 1
        self.prev_tput[sel] = 0.0
        self.prev_fill[sel] = 0.0
        self.prev_busy[sel] = 0.0
        self.seen[sel] = False

    def encode(self, threads: np.ndarray, tput: np.ndarray, fill: np.ndarray, busy: np.ndarray | None,
               wait: np.ndarray | None, interval_s: Any, max_threads: int, rows: Any = None,
               clip: bool = True) -> np.ndarray:
        """Update ``rows`` (all if None) with one interval each and return their encodings.

        :param threads: (m,3) thread counts of the interval; ``tput`` (m,3) bytes/s; ``fill`` (m,2).
        :param busy: (m,3) busy thread-seconds, or None (unknown: every thread counts as busy).
        :param wait: (m,3) waiting thread-seconds, or None (unknown: none).
        :param interval_s: the interval's length, scalar or (m,).
        :return: (m, :data:`OBS_DIM`) float32 in [0, 1].
        """
        sel = slice(None) if rows is None else rows
        threads = np.asarray(threads, dtype=np.int64)
        tput = np.asarray(tput, dtype=np.float64)
        fill = np.asarray(fill, dtype=np.float64)
        dt = np.broadcast_to(np.asarray(interval_s, dtype=np.float64), (threads.shape[0],))[:, None]
        busy = threads * dt if busy is None else np.asarray(busy, dtype=np.float64)
        wait = np.zeros_like(busy) if wait is None else np.asarray(wait, dtype=np.float64)
        seen = self.seen[sel][:, None]
        prev_threads = np.where(seen, self.prev_threads[sel], threads)
        prev_tput = np.where(seen, self.prev_tput[sel], tput)
        prev_fill = np.where(seen, self.prev_fill[sel], fill)
        ref = np.maximum(np.maximum(self.ref[sel], tput[:, 0]), np.maximum(tput[:, 1], tput[:, 2]))
        rate = tput * dt / np.maximum(busy, 1e-9)
        trusted = (busy >= MIN_RATE_BUSY_S) & (threads >= prev_threads) & (busy >= BUSY_DROP * self.prev_busy[sel])
        best_rate = np.where(trusted, np.maximum(self.best_rate[sel], rate), self.best_rate[sel])
        peak = np.maximum(self.peak[sel], tput)
        out = encode_arrays(threads, tput, fill, prev_threads, prev_tput, ref, max_threads, best_rate, clip,
                            rate=rate, busy=busy, wait=wait, peak_bps=peak, prev_fill=prev_fill)
        self.ref[sel], self.best_rate[sel], self.peak[sel] = ref, best_rate, peak
        self.prev_threads[sel], self.prev_tput[sel], self.prev_fill[sel] = threads, tput, fill
        self.prev_busy[sel] = busy
        self.seen[sel] = True
        return out


def encode_arrays(
    threads: np.ndarray,
    throughput_bps: np.ndarray,
    fill: np.ndarray,
    prev_threads: np.ndarray,
    prev_throughput_bps: np.ndarray,
    ref_bps: np.ndarray,
    max_threads: int,
    best_rate_bps: np.ndarray | None = None,
    clip: bool = True,
    *,
    rate: np.ndarray | None = None,
    busy: np.ndarray | None = None,
    wait: np.ndarray | None = None,
    peak_bps: np.ndarray | None = None,
    prev_fill: np.ndarray | None = None,
) -> np.ndarray:
    """Encode (N,...) measurements into the (N, :data:`OBS_DIM`) float32 policy input in [0, 1].

    ``ref_bps`` (N,) is the running throughput reference (already updated with this interval).
    ``rate`` (N,3) is each stage's per-busy-thread rate this interval and ``best_rate_bps`` (N,3)
    its running reference (:class:`EncodingState`); ``None``: ``t_i / n_i`` and efficiency 1.
    ``busy``/``wait`` (N,3) thread-seconds (``None``: utilization 1), ``peak_bps`` (N,3) each
    stage's largest throughput so far (``None``: this interval's), ``prev_fill`` (N,2) the
    previous interval's fills (``None``: no trend).
    ``clip=False`` skips the clipping to [0, 1] when the inputs are known to be in range.
    """
    n = threads.shape[0]
    out = np.empty((n, OBS_DIM), dtype=np.float32)
    inv_m = 1.0 / max_threads
    inv_ref = 1.0 / np.maximum(ref_bps, _TINY_BPS)[:, None]
    out[:, C['threads']] = threads * inv_m
    out[:, C['throughput']] = throughput_bps * inv_ref
    out[:, C['fill']] = fill
    out[:, C['prev_threads']] = prev_threads * inv_m
    out[:, C['prev_throughput']] = prev_throughput_bps * inv_ref
    if rate is None:
        rate = throughput_bps / np.maximum(threads, 1)
    if best_rate_bps is None:
        best_rate_bps = rate
    # no reference yet, or a stage that did not work: no evidence of lost speed (efficiency 1)
    eff = np.where(best_rate_bps > _TINY_BPS, rate / np.maximum(best_rate_bps, _TINY_BPS), 1.0)
    if busy is not None:
        eff = np.where(busy > 1e-6, eff, 1.0)
    out[:, C['efficiency']] = np.minimum(eff, 1.0)
    if busy is None:
        out[:, C['utilization']] = 1.0
    else:
        w = np.zeros_like(busy) if wait is None else wait
        out[:, C['utilization']] = np.where(busy + w > 1e-9, busy / np.maximum(busy + w, 1e-9), 1.0)
    out[:, C['peak_throughput']] = (throughput_bps if peak_bps is None else peak_bps) * inv_ref
    out[:, C['trend']] = 0.5 if prev_fill is None else 0.5 + 0.5 * (fill - prev_fill)
    if clip:
        np.clip(out, 0.0, 1.0, out=out)
    return out


def utility_arrays(throughput_bps: np.ndarray, threads: np.ndarray, k: float, scale_bps: Any) -> np.ndarray:
    """``sum_i (t_i / scale) / k**n_i`` over the last axis (broadcasting ``scale_bps``)."""
    t = np.asarray(throughput_bps, dtype=np.float64)
    s = np.asarray(scale_bps, dtype=np.float64)
    if s.ndim and t.ndim > 1:
        s = s[..., None]
    return np.sum((t / s) * np.power(float(k), -np.asarray(threads, dtype=np.float64)), axis=-1)


def run_interval(
    S: np.ndarray,
    R: np.ndarray,
    cap_bps: np.ndarray,
    interval_s: float,
    smax: np.ndarray,
    rmax: np.ndarray,
    substeps: int,
    queue_max: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Advance the buffers of N transfers by one interval.

    In each of ``substeps`` sub-steps of length ``dt = interval_s / substeps``, with per-sub-step
    budgets ``a_i = cap_i * dt``, in this order:

    1. ``x = min(a_n, S + a_r, (R_max - R) + a_w)``: the network moves what it can, limited by what
       is in S plus what reading adds, and by the room in R plus what writing frees;
    2. ``r = min(a_r, (S_max - S) + x)``: reading is blocked by a full sender buffer;
    3. ``w = min(a_w, R + x)``: writing is starved by an empty receiver buffer;
    4. ``S += r - x``, ``R += x - w`` (clipped to [0, max] against rounding).

    These are the maximal flows that satisfy the three stage equations simultaneously (given x,
    r and w reach their budgets whenever x uses them). For capacities that are constant over the
    interval (they are: noise is drawn per interval) the cumulative flows of this fluid model are
    concave and piecewise linear, so the result does not depend on ``substeps``; the tests check
    1 vs 50 sub-steps. Sub-steps remain for models whose rates vary within an interval.

    ``queue_max`` (sender, receiver): with the chunk model of :func:`measure_interval`, the room
    readers and the network see is ``queue_max - S`` (``- R``) instead of ``S_max - S``.

    :return: new ``S``, new ``R`` and bytes moved (N,3) by (read, net, write) in the interval.
    """
    dt = interval_s / substeps
    a = cap_bps * dt
    ar, an, aw = a[:, 0], a[:, 1], a[:, 2]
    moved = np.zeros_like(a)
    # queue_max (chunk model): the part of a buffer that queued data may use; slots held by busy
    # threads take the rest. Content above it (threads were added) is never clipped, it drains.
    qs, qr = (smax, rmax) if queue_max is None else queue_max
    for _ in range(substeps):
        x = np.minimum(np.minimum(an, S + ar), np.maximum(qr - R, 0.0) + aw)
        r = np.minimum(ar, np.maximum(qs - S, 0.0) + x)
        w = np.minimum(aw, R + x)
        S = np.minimum(np.maximum(S + r - x, 0.0), np.maximum(smax, S))
        R = np.minimum(np.maximum(R + x - w, 0.0), np.maximum(rmax, R))
        moved[:, 0] += r
        moved[:, 1] += x
        moved[:, 2] += w
    return S, R, moved


def busy_seconds(moved: np.ndarray, cap_bps: np.ndarray, threads: np.ndarray, tpt_bps: np.ndarray,
                 bw_bps: np.ndarray, interval_s: float, backlog: np.ndarray, model: str = "min") -> np.ndarray:
    """Busy thread-seconds of each stage in one interval, as the engine counts them.

    The engine counts a thread *busy* while it works on a chunk (a throttle's sleep included) and
    *waiting* while a buffer holds it back. A stage whose threads run below their total bandwidth
    works at the per-thread rate, so moving ``m`` bytes keeps ``m / tpt`` thread-seconds busy. A
    stage held at its bandwidth with work queued for it (``backlog``: data waiting in its input
    buffer) keeps every thread busy, since they queue on the shared limit; fed at exactly its
    bandwidth and no faster, it still works at the per-thread rate. With any other capacity model
    (``concave``, USL contention) the capacity is spread evenly: ``n * dt * m / (c * dt)``.

    :param moved: (N,3) bytes moved; ``cap_bps``, ``tpt_bps``, ``bw_bps`` (N,3) this interval's
        capacities, per-thread rates and bandwidths (noise included); ``threads`` (N,3).
    :param backlog: (N,3) bool, work waiting for the stage at the end of the interval.
    """
    n_dt = threads * interval_s
    if model != "min":
        return n_dt * np.minimum(moved / np.maximum(cap_bps * interval_s, _TINY_BPS), 1.0)
    at_bw = (bw_bps < threads * tpt_bps) & (moved >= cap_bps * interval_s * (1.0 - 1e-9)) & backlog
    return np.where(at_bw, n_dt, np.minimum(n_dt, moved / np.maximum(tpt_bps, _TINY_BPS)))


def backlog_flags(S: np.ndarray, R: np.ndarray, threshold_s: np.ndarray, threshold_r: np.ndarray) -> np.ndarray:
    """(N,3): work waiting for each stage after an interval (readers always have files to read;
    the network has data in the sender buffer, writers in the receiver buffer)."""
    return np.stack([np.ones(S.shape, dtype=bool), S > threshold_s, R > threshold_r], axis=1)


def measure_interval(moved: np.ndarray, busy_main: np.ndarray, inflight: np.ndarray, chunk: np.ndarray,
                     z: np.ndarray, interval_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What the engine's byte counters show for an interval in which the stages moved ``moved``.

    The engine counts a chunk's bytes when the chunk is done, not while it is worked on. At the end
    of an interval each busy thread holds part of a chunk; with ``k`` busy threads (time average
    ``busy_main / interval_s``) and independent phases, the bytes in flight are about
    ``chunk * (k/2 + sqrt(k/12) z)`` (``z`` ~ unit variance, clipped to ``[0, k chunk]``). The
    counters show ``moved + in-flight before - in-flight after``: lumps of whole chunks, less
    while threads are added (their first chunks are not done) and more when threads were removed
    (those finish the chunk they hold; the caller adds that work to ``moved``).

    :param moved: (N,3) bytes the stages moved (fluid model).
    :param busy_main: (N,3) busy thread-seconds of the threads that stay.
    :param inflight: (N,3) bytes in flight at the start of the interval.
    :param chunk: (N,) chunk size in bytes (0: fluid, counters equal ``moved``).
    :param z: (N,3) draws of unit variance.
    :return: ``(counted bytes (N,3), in-flight bytes at the end (N,3), busy threads at the end (N,3))``.
    """
    k = busy_main / interval_s
    c = chunk[:, None]
    new = c * np.clip(0.5 * k + np.sqrt(k / 12.0) * z, 0.0, k)
    counted = moved + inflight - new
    short = counted < 0.0  # cannot count less than nothing: the in-flight draw was too large
    new = np.where(short, moved + inflight, new)
    counted = np.where(short, 0.0, counted)
    return counted, new, k


def startup_share(S: np.ndarray, R: np.ndarray, chunk: np.ndarray, single_bps: np.ndarray,
                  interval_s: float) -> np.ndarray:
    """(N,3): the share of a transfer's first interval in which each stage has data to work on.

    The network sends nothing before the first chunk is read (unless the sender buffer already
    holds data) and the writers write nothing before the first chunk has crossed the network: with
    large chunks and slow threads the first interval writes well below what the readers read.
    The wait is a chunk at the upstream stage's speed for one chunk
    (``single_bps``: ``min(TPT, B)``). The caller caps what the network and the writers move in
    that interval at this share of what was available to them.
    """
    c = chunk
    lat_n = np.where(S > c, 0.0, c / np.maximum(single_bps[:, 0], _TINY_BPS))
    lat_w = np.where(R > c, 0.0, lat_n + c / np.maximum(single_bps[:, 1], _TINY_BPS))
    share = np.ones((S.shape[0], 3))
    share[:, 1] = np.clip(1.0 - lat_n / interval_s, 0.0, 1.0)
    share[:, 2] = np.clip(1.0 - lat_w / interval_s, 0.0, 1.0)
    return share


class SimCore:
    """State and dynamics of N simulated transfers, as (N, ...) numpy arrays.

    Not a public API: use :class:`~automdt.simulator.env.BufferSimEnv` or
    :class:`~automdt.simulator.vector.BatchedBufferSim`. ``task`` (:class:`~automdt.simulator.task.SimTask`)
    holds every setting but the profile.
    """

    def __init__(self, num_envs: int, profile: Profile | None, task: SimTask) -> None:
        if profile is None:
            profile = Profile.default()
        if not isinstance(profile, Profile):
            raise TypeError(f"profile must be a Profile or None, got {type(profile).__name__}")
        if not (num_envs >= 1):
            raise ValueError("num_envs must be >= 1")
        self.task = task
        chunk_bytes = task.chunk_bytes
        if chunk_bytes is None:
            chunk_bytes = float(profile.meta.get("chunk_bytes", 0.0) or 0.0) if isinstance(profile.meta, dict) else 0.0
        if not (chunk_bytes >= 0.0):
            raise ValueError(f"chunk_bytes must be >= 0, got {chunk_bytes}")
        self.chunk_bytes = float(chunk_bytes)
        chunk_range = task.chunk_range
        self.chunk_range = None if chunk_range is None else (float(chunk_range[0]), float(chunk_range[1]))
        self.chunked = self.chunk_bytes > 0.0 or self.chunk_range is not None
        if task.start_mix is not None:
            mix = np.asarray(task.start_mix, dtype=np.float64)
            self.start_cdf: np.ndarray | None = np.cumsum(mix / mix.sum())
        else:
            self.start_cdf = None
        self.num_envs = int(num_envs)
        self.profile = profile
        self.k = float(task.k)
        self.episode_steps = int(task.episode_steps)
        self.randomize = float(task.randomize)
        self.random_profiles = bool(task.random_profiles)
        self.random_start = bool(task.random_start)
        self.noise_override = None if task.noise is None else float(task.noise)
        self.substeps = int(task.substeps)
        self.bound_penalty = float(task.bound_penalty)
        self.max_threads = int(profile.max_threads)
        self.interval_s = float(profile.interval_s)
        self.model = "min" if task.random_profiles else profile.capacity_model
        self._pen = np.power(self.k, -np.arange(self.max_threads + 1, dtype=np.float64))  # k**-n lookup
        self.block_len = self.episode_steps + 1  # intervals per noise block (reset + steps)
        self.per_interval = 6 if self.chunked else 3  # capacity factors (+ in-flight draws)
        self.n_uniforms = N_PARAM_UNIFORMS + self.per_interval * self.block_len
        self._init_contention_and_changes(profile, task.changes)

        self._allocate(profile, task.noise)

    def _allocate(self, profile: Profile, noise: float | None) -> None:
        """Every environment's state arrays, at ``profile`` (``noise`` overriding its noise)."""
        n = self.num_envs
        self.tpt = np.tile(profile.tpt_array(), (n, 1))
        self.bw = np.tile(profile.bandwidth_array(), (n, 1))
        self.smax = np.full(n, float(profile.sender_buffer))
        self.rmax = np.full(n, float(profile.receiver_buffer))
        self.noise = np.full(n, profile.noise if noise is None else float(noise))
        self.scale = np.ones(n)
        self.threads = np.ones((n, 3), dtype=np.int64)
        self.S = np.zeros(n)
        self.R = np.zeros(n)
        self.steps = np.zeros(n, dtype=np.int64)  # steps since reset
        self.noise_idx = np.zeros(n, dtype=np.int64)  # next interval's index into the noise block
        self.factors = np.ones((n, self.block_len, 3))
        self.zdraw = np.zeros((n, self.block_len, 3))  # in-flight draws (chunk model)
        self.chunk = np.full(n, self.chunk_bytes)
        self.inflight = np.zeros((n, 3))  # bytes held by busy threads, not counted yet
        self.kbusy = np.zeros((n, 3))  # busy threads at the end of the last interval
        self.busy = np.zeros((n, 3))  # busy thread-seconds of the last interval
        self.wait = np.zeros((n, 3))  # waiting thread-seconds of the last interval
        self.moved = np.zeros((n, 3))  # bytes the stages really moved (tput is what counters show)
        self.fill_obs = np.zeros((n, 2))  # buffer fill as the engine reports it (slots in use)
        self.tput = np.zeros((n, 3))
        self.enc = EncodingState(n)  # the policy input's running values (reference rates, previous interval)
        self.obs = np.zeros((n, OBS_DIM), dtype=np.float32)
        self.utility = np.zeros(n)
        self.reward = np.zeros(n)
        self.cap = np.zeros((n, 3))

    # ------------------------------------------------------------------ reset
    def reset_rows(
        self,
        rows: np.ndarray,
        rngs: Sequence[np.random.Generator],
        options: Mapping[str, Any] | None = None,
    ) -> None:
        """Start new episodes for ``rows`` (int index array), drawing from ``rngs[row]``.

        ``options`` (applied to every row): ``"threads"`` start triple, ``"buffer_fill"`` start
        (sender, receiver) fill fractions; they replace the random/default start but the uniforms
        are drawn all the same, so seeded streams do not shift.
        """
        rows = np.asarray(rows, dtype=np.int64)
        m = rows.size
        if m == 0:
            return
        u = np.empty((m, self.n_uniforms))
        for j, i in enumerate(rows.tolist()):
            rngs[i].random(out=u[j])  # same stream as rng.random(n_uniforms), no temporary
        p = self.profile
        if self.random_profiles:
            arr = random_profile_arrays(u[:, U_LAYOUT["profile"]], self.max_threads)
            tpt, bw = arr["tpt"], arr["bandwidth"]
            smax, rmax = arr["buffers"][:, 0].astype(np.float64), arr["buffers"][:, 1].astype(np.float64)
            noise = arr["noise"] if self.noise_override is None else np.full(m, self.noise_override)
        else:
            tpt = np.tile(p.tpt_array(), (m, 1))
            bw = np.tile(p.bandwidth_array(), (m, 1))
            smax = np.full(m, float(p.sender_buffer))
            rmax = np.full(m, float(p.receiver_buffer))
            noise = np.full(m, p.noise if self.noise_override is None else self.noise_override)
        if self.randomize > 0.0:
            tpt = tpt * (1.0 + self.randomize * (2.0 * u[:, U_LAYOUT["tpt_jitter"]] - 1.0))
            bw = bw * (1.0 + self.randomize * (2.0 * u[:, U_LAYOUT["bandwidth_jitter"]] - 1.0))
        if self.start_cdf is not None:
            threads, fill = self._mixed_start(u)
        elif self.random_start:
            threads = 1 + np.floor(u[:, U_LAYOUT["start_threads"]] * self.max_threads).astype(np.int64)
            threads = np.minimum(threads, self.max_threads)
            fill = u[:, U_LAYOUT["start_fill"]].copy()
        else:
            threads = np.ones((m, 3), dtype=np.int64)
            fill = np.zeros((m, 2))
        if options:
            if options.get("threads") is not None:
                t = np.asarray(options["threads"], dtype=np.int64).reshape(-1, 3)
                threads = np.clip(np.broadcast_to(t, (m, 3)), 1, self.max_threads).astype(np.int64)
            if options.get("buffer_fill") is not None:
                f = np.asarray(options["buffer_fill"], dtype=np.float64).reshape(-1, 2)
                fill = np.clip(np.broadcast_to(f, (m, 2)), 0.0, 1.0).astype(np.float64)
        self.tpt[rows], self.bw[rows] = tpt, bw
        self.smax[rows], self.rmax[rows], self.noise[rows] = smax, rmax, noise
        self.scale[rows] = self._scale(rows)
        if self.changes is not None:
            self.change_at[rows], self.change_tpt[rows], self.change_bw[rows] = self.changes.draw(
                u[:, self.n_uniforms - self._n_change_u:], tpt, bw, self.episode_steps, self.max_threads,
                self.random_profiles)
        self.factors[rows], self.zdraw[rows] = self._factors(
            u[:, U_LAYOUT["noise"]][:, :self.per_interval * self.block_len], noise)
        if self.chunk_range is not None:
            lo, hi = self.chunk_range
            ratio = np.exp(np.log(lo) + u[:, U_LAYOUT["chunk_ratio"]][:, 0] * (np.log(hi) - np.log(lo)))
            self.chunk[rows] = ratio * tpt.min(axis=1) * self.interval_s
        self.inflight[rows] = 0.0
        self.kbusy[rows] = 0.0
        self.S[rows] = fill[:, 0] * smax
        self.R[rows] = fill[:, 1] * rmax
        self.steps[rows] = 0
        self.profile_changes[rows] = 0
        self.noise_idx[rows] = 0
        # The first observation is a real measurement: one interval at the start triple.
        self._advance(rows, threads, rngs, first=True)

    def _mixed_start(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Start triples and fills for ``start_mix`` (probabilities of three kinds of start):

        * *cold*: each stage log-uniform in 1..16 threads, empty buffers (a transfer's first
          interval, from whatever start rule chose the triple);
        * *random*: each stage uniform in 1..max_threads, buffers uniformly filled;
        * *drain*: random threads, the sender buffer 70-100% full and the receiver's uniform: a
          full buffer that the chosen threads may drain (an upstream stage that was ahead).
        """
        assert self.start_cdf is not None, "a mixed start needs start_mix"
        mode = np.searchsorted(self.start_cdf, u[:, U_LAYOUT["start_mode"]][:, 0], side="right")
        ut = u[:, U_LAYOUT["start_threads"]]
        uf = u[:, U_LAYOUT["start_fill"]]
        wide = np.minimum(1 + np.floor(ut * self.max_threads).astype(np.int64), self.max_threads)
        cold = np.minimum(np.rint(np.exp(ut * np.log(16.0))).astype(np.int64), self.max_threads)
        threads = np.where((mode == 0)[:, None], cold, wide)
        fill = np.where((mode == 0)[:, None], 0.0, uf)
        fill[:, 0] = np.where(mode == 2, 0.7 + 0.3 * uf[:, 0], fill[:, 0])
        return threads, fill

    def _factors(self, u: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Capacity factors (m, block, 3) and, with a chunk model, the in-flight draws (unit variance)."""
        m = u.shape[0]
        u = u.reshape(m, self.block_len, self.per_interval)
        f = 1.0 + (noise * _SQRT3)[:, None, None] * (2.0 * u[:, :, :3] - 1.0)
        z = _SQRT3 * (2.0 * u[:, :, 3:] - 1.0) if self.chunked else np.zeros_like(f)
        return f, z

    def observation(self, row: int = 0) -> Observation:
        """What a policy sees of environment ``row`` after its last interval (the engine's counters)."""
        t, x = self.threads[row], self.tput[row]
        return Observation(
            threads=(int(t[0]), int(t[1]), int(t[2])),
            throughput_bps=(float(x[0]), float(x[1]), float(x[2])),
            buffer_fill=(float(self.fill_obs[row, 0]), float(self.fill_obs[row, 1])),
            interval_s=self.interval_s,
            max_threads=self.max_threads,
            buffer_bytes=(int(round(self.smax[row])), int(round(self.rmax[row]))),
            busy_s=tuple(float(v) for v in self.busy[row]),  # type: ignore[arg-type]
            wait_s=tuple(float(v) for v in self.wait[row]),  # type: ignore[arg-type]
        )

    # ------------------------------------------------------------------ step
    def step_threads(self, threads: np.ndarray, rngs: Sequence[np.random.Generator]) -> None:
        """Run one interval for all environments with the given (N,3) thread counts."""
        threads = np.clip(np.asarray(threads, dtype=np.int64).reshape(self.num_envs, 3), 1, self.max_threads)
        if self.changes is not None:
            self._apply_changes()
        self._advance(None, threads, rngs, first=False)
        self.steps += 1

    def _advance(self, rows: np.ndarray | None, threads: np.ndarray, rngs: Sequence[np.random.Generator],
                 first: bool) -> None:
        sel = slice(None) if rows is None else rows
        idx = self.noise_idx[sel]
        full = np.flatnonzero(idx >= self.block_len)
        if full.size:  # stepped past the episode: draw the next noise block for those envs
            env_ids = np.arange(self.num_envs)[sel][full]
            for i in env_ids:
                u = rngs[int(i)].random(self.per_interval * self.block_len)
                f_i, z_i = self._factors(u[None, :], self.noise[i:i + 1])
                self.factors[i], self.zdraw[i] = f_i[0], z_i[0]
                self.noise_idx[i] = 0
            idx = self.noise_idx[sel]
        env_ids = np.arange(self.num_envs) if rows is None else rows
        f = self.factors[env_ids, idx]  # (m,3)
        dt = self.interval_s
        tptf, bwf = self.tpt[sel] * f, self.bw[sel] * f
        usl = (None, None) if self.sigma is None or self.kappa is None else (self.sigma[sel], self.kappa[sel])
        cap = capacity_array(self.tpt[sel], self.bw[sel], threads.astype(np.float64), self.model, *usl) * f
        busy_model = self.model if self.sigma is None else "usl"  # contention: the capacity spread evenly
        smax, rmax = self.smax[sel], self.rmax[sel]
        inflight: np.ndarray | None
        kbusy: np.ndarray | None
        if self.chunked:
            S, R, moved, busy, wait, tput, fill_obs, inflight, kbusy = self._advance_chunked(
                sel, threads, first, cap, tptf, bwf, self.zdraw[env_ids, idx], busy_model)
        else:
            S, R, moved = run_interval(self.S[sel], self.R[sel], cap, dt, smax, rmax, self.substeps)
            backlog = backlog_flags(S, R, 1e-6 * smax, 1e-6 * rmax)
            busy = busy_seconds(moved, cap, threads, tptf, bwf, dt, backlog, busy_model)
            wait = threads * dt - busy
            tput = moved * (1.0 / dt)
            fill_obs = np.stack([S / smax, R / rmax], axis=1)
            inflight = kbusy = None
        if first:
            self.enc.reset(sel)
        obs = self.enc.encode(threads, tput, fill_obs, busy, wait, dt, self.max_threads, rows=sel, clip=False)
        weighted = moved * (1.0 / dt) * self._pen[threads]  # the utility of what really moved
        util = (weighted[:, 0] + weighted[:, 1] + weighted[:, 2]) / self.scale[sel]
        reward = self.bounded(util, threads)
        if rows is None:
            self.threads, self.tput, self.S, self.R, self.cap = threads, tput, S, R, cap
            self.obs, self.utility, self.reward = obs, util, reward
            self.busy, self.wait, self.moved, self.fill_obs = busy, wait, moved, fill_obs
            self.noise_idx += 1
        else:
            self.threads[rows], self.tput[rows], self.S[rows], self.R[rows] = threads, tput, S, R
            self.cap[rows] = cap
            self.obs[rows], self.utility[rows], self.reward[rows] = obs, util, reward
            self.busy[rows], self.wait[rows], self.moved[rows], self.fill_obs[rows] = busy, wait, moved, fill_obs
            self.noise_idx[rows] += 1
        if inflight is not None:
            self.inflight[sel], self.kbusy[sel] = inflight, kbusy

    def _advance_chunked(self, sel: Any, threads: np.ndarray, first: bool, cap: np.ndarray, tptf: np.ndarray,
                         bwf: np.ndarray, z: np.ndarray, busy_model: str) -> tuple[np.ndarray, ...]:
        """One interval with the engine's chunk effects (see :func:`measure_interval`).

        Threads above a lowered count finish the chunk they hold (their remaining bytes add to the
        interval's work and busy time, within the stage's bandwidth: alternating counts cannot move
        more than the stage can); slots held by busy threads (readers and senders on the
        sender side, writers on the receiver side) count in the buffer fill the engine reports and
        leave that much less room for queued chunks.
        """
        dt = self.interval_s
        chunk = self.chunk[sel]
        c = chunk[:, None]
        prev_n = threads if first else self.threads[sel]
        k_prev, infl_prev = self.kbusy[sel], self.inflight[sel]
        leaving = np.maximum(prev_n - threads, 0) / np.maximum(prev_n, 1) * k_prev  # busy threads that exit
        extra = np.maximum(leaving * c - infl_prev * leaving / np.maximum(k_prev, 1e-9), 0.0)
        smax, rmax = self.smax[sel], self.rmax[sel]
        held_s = (k_prev[:, 0] + k_prev[:, 1]) * chunk  # readers fill a slot, senders drain one
        held_r = k_prev[:, 2] * chunk  # writers drain one (a connection holds one only mid-frame)
        qmax = (np.maximum(smax - held_s, chunk), np.maximum(rmax - held_r, chunk))
        per_thread = np.minimum(tptf, cap / np.maximum(threads, 1))
        S0, R0 = self.S[sel], self.R[sel]
        # the chunks of leaving threads are finished within the stage's bandwidth, not on top of it
        total = np.minimum(cap + extra / dt, np.maximum(cap, bwf))
        S, R, moved = run_interval(S0, R0, total, dt, smax, rmax, self.substeps, qmax)
        if first:  # a transfer's first interval: the pipeline fills (see startup_share)
            share = startup_share(S0, R0, chunk, np.minimum(tptf, bwf), dt)
            x = np.minimum(moved[:, 1], share[:, 1] * (S0 + moved[:, 0]))
            w = np.minimum(moved[:, 2], share[:, 2] * (R0 + x))
            moved = np.stack([moved[:, 0], x, w], axis=1)
            S, R = S0 + moved[:, 0] - x, R0 + x - w
        extra_done = np.minimum(extra, moved)
        extra_busy = extra_done / np.maximum(per_thread, _TINY_BPS)
        backlog = backlog_flags(S, R, chunk, chunk)
        busy_main = busy_seconds(moved - extra_done, cap, threads, tptf, bwf, dt, backlog, busy_model)
        counted, inflight, kbusy = measure_interval(moved, busy_main, infl_prev, chunk, z, dt)
        busy = busy_main + extra_busy
        wait = np.maximum(threads * dt - busy_main, 0.0)
        fill_obs = np.stack([np.minimum(S + (kbusy[:, 0] + kbusy[:, 1]) * chunk, smax) / smax,
                             np.minimum(R + kbusy[:, 2] * chunk, rmax) / rmax], axis=1)
        return S, R, moved, busy, wait, counted / dt, fill_obs, inflight, kbusy

    # ------------------------------------------------------------------ contention and changes
    def _init_contention_and_changes(self, profile: Profile, changes: Any) -> None:
        """USL contention arrays (``None`` when the profile has none) and the mid-episode change
        plan of :class:`automdt.simulator.changes.ProfileChanges` (``changes``; None: off)."""
        n = self.num_envs
        sig, kap = profile.contention_arrays()
        self.sigma = None if sig is None else np.tile(sig, (n, 1))
        self.kappa = None if kap is None else np.tile(kap, (n, 1))
        self.changes = changes
        self._n_change_u = 0 if changes is None else changes.n_uniforms(self.random_profiles)
        self.n_uniforms += self._n_change_u
        k = 1 if changes is None else changes.max_changes
        self.change_at = np.zeros((n, k), dtype=np.int64)
        self.change_tpt = np.zeros((n, k, 3))
        self.change_bw = np.zeros((n, k, 3))
        self.changed = np.zeros(0, dtype=np.int64)
        """Rows whose profile changed at the last step (for per-episode values that follow it)."""
        self.profile_changes = np.zeros(n, dtype=np.int64)
        """Changes so far in each env's episode."""

    def set_stages(self, rows: np.ndarray, profile: Profile) -> None:
        """The path of ``rows`` changes now: from the next interval on, their stages run with
        ``profile``'s per-thread rates, bandwidths and contention (buffers, noise and the thread
        bound stay). The reward's normalisation follows, as with :class:`ProfileChanges`."""
        rows = np.asarray(rows, dtype=np.int64)
        self.tpt[rows], self.bw[rows] = profile.tpt_array(), profile.bandwidth_array()
        sig, kap = profile.contention_arrays()
        if sig is not None and self.sigma is None:
            self.sigma, self.kappa = np.zeros((self.num_envs, 3)), np.zeros((self.num_envs, 3))
        if self.sigma is not None and self.kappa is not None:
            self.sigma[rows] = 0.0 if sig is None else sig
            self.kappa[rows] = 0.0 if kap is None else kap
        self.scale[rows] = self._scale(rows)
        self.profile_changes[rows] += 1

    def _scale(self, rows: np.ndarray | None) -> np.ndarray:
        """The reward normalisation of ``rows``: each env's achievable rate (the weakest stage's peak)."""
        sel = slice(None) if rows is None else rows
        usl = (None, None) if self.sigma is None or self.kappa is None else (self.sigma[sel], self.kappa[sel])
        return peak_capacity_array(self.tpt[sel], self.bw[sel], self.max_threads, self.model, *usl).min(axis=1)

    def _apply_changes(self) -> None:
        """Switch the envs whose next step is a change step to that slot's profile."""
        hit = self.change_at == (self.steps + 1)[:, None]  # (N, K)
        rows = np.flatnonzero(hit.any(axis=1))
        self.changed = rows
        if rows.size == 0:
            return
        k = hit.shape[1] - 1 - np.argmax(hit[rows, ::-1], axis=1)  # the last used slot of that step
        self.tpt[rows] = self.change_tpt[rows, k]
        self.bw[rows] = self.change_bw[rows, k]
        self.scale[rows] = self._scale(rows)
        self.profile_changes[rows] += 1

    # ------------------------------------------------------------------ views
    def bounded(self, util: np.ndarray, threads: np.ndarray) -> np.ndarray:
        """The reward for ``util``: minus ``bound_penalty`` per stage run at ``max_threads``."""
        if not self.bound_penalty:
            return util
        return util - self.bound_penalty * (threads >= self.max_threads).sum(axis=1)

    def fill(self) -> np.ndarray:
        """(N,2) buffer fill fractions (sender, receiver) as observed (with a chunk model: the
        slots busy threads hold count too, as in the engine)."""
        return self.fill_obs.copy()
