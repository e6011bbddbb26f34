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

from automdt.simulator.contract import ACTION_NAMES, OBS_DIM, OBS_NAMES  # noqa: F401  (re-exported)
from automdt.simulator.profile import (N_PROFILE_UNIFORMS, Profile, capacity_array, peak_capacity_array,
                                      random_profile_arrays)

N_PARAM_UNIFORMS = 32
"""Uniforms reserved at each reset before the noise block (see :data:`U_LAYOUT`)."""

U_LAYOUT: dict[str, slice] = {
    "profile": slice(0, N_PROFILE_UNIFORMS),  # Profile.random draw (random_profiles=True)
    "tpt_jitter": slice(16, 19),  # randomize: tpt_i *= 1 + randomize * (2u - 1)
    "bandwidth_jitter": slice(19, 22),  # randomize: B_i *= 1 + randomize * (2u - 1)
    "start_threads": slice(22, 25),  # random_start: n_i = 1 + floor(u * max_threads)
    "start_fill": slice(25, 27),  # random_start: S/S_max, R/R_max = u
    "noise": slice(N_PARAM_UNIFORMS, None),  # capacity factors 1 + noise*sqrt(3)*(2u - 1)
}
"""Where each part of the per-reset uniform block goes."""

_SQRT3 = math.sqrt(3.0)

# Action table: index -> (multiplier, addend); new = floor(n * mult) + add, then clipped. The names
# (ACTION_NAMES, OBS_NAMES) live in the dependency-free automdt.simulator.contract.
ACTION_MULT = np.array([0.5, 1.0, 1.0, 1.0, 2.0])
ACTION_ADD = np.array([0, -1, 0, 1, 0], dtype=np.int64)

_TINY_BPS = 1.0  # floor of the throughput reference (bytes/s): avoids 0/0 before anything moved


def actions_to_threads(actions: np.ndarray, current: np.ndarray, max_threads: int) -> np.ndarray:
    """Vectorised :func:`~automdt.simulator.env.action_to_threads`: (N,3) indices -> (N,3) counts."""
    a = np.asarray(actions, dtype=np.int64)
    if a.min(initial=0) < 0 or a.max(initial=0) >= len(ACTION_MULT):
        raise ValueError(f"action indices must be in 0..{len(ACTION_MULT) - 1}, got {actions!r}")
    cur = np.asarray(current, dtype=np.int64)
    new = np.floor(cur * ACTION_MULT[a]).astype(np.int64) + ACTION_ADD[a]
    return np.clip(new, 1, max_threads)


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
) -> np.ndarray:
    """Encode (N,...) measurements into the (N, :data:`OBS_DIM`) float32 policy input in [0, 1].

    ``ref_bps`` (N,) is the running throughput reference (already updated with this interval).
    ``best_rate_bps`` (N,3) is the running maximum per-thread rate ``t_i / n_i`` of each stage
    (already updated); ``None``: this interval's rates (efficiency 1).
    ``clip=False`` skips the clipping to [0, 1] when the inputs are known to be in range (the
    simulator's are: ref is a running max, 1 <= threads <= max_threads, 0 <= fill <= 1), which
    gives the same result faster.
    """
    n = threads.shape[0]
    out = np.empty((n, OBS_DIM), dtype=np.float32)
    inv_m = 1.0 / max_threads
    inv_ref = 1.0 / np.maximum(ref_bps, _TINY_BPS)[:, None]
    out[:, 0:3] = threads * inv_m
    out[:, 3:6] = throughput_bps * inv_ref
    out[:, 6:8] = fill
    out[:, 8:11] = prev_threads * inv_m
    out[:, 11:14] = prev_throughput_bps * inv_ref
    rate = throughput_bps / np.maximum(threads, 1)
    if best_rate_bps is None:
        best_rate_bps = rate
    out[:, 14:17] = rate / np.maximum(best_rate_bps, _TINY_BPS)
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

    :return: new ``S``, new ``R`` and bytes moved (N,3) by (read, net, write) in the interval.
    """
    dt = interval_s / substeps
    a = cap_bps * dt
    ar, an, aw = a[:, 0], a[:, 1], a[:, 2]
    moved = np.zeros_like(a)
    for _ in range(substeps):
        x = np.minimum(np.minimum(an, S + ar), (rmax - R) + aw)
        r = np.minimum(ar, (smax - S) + x)
        w = np.minimum(aw, R + x)
        S = np.minimum(np.maximum(S + r - x, 0.0), smax)
        R = np.minimum(np.maximum(R + x - w, 0.0), rmax)
        moved[:, 0] += r
        moved[:, 1] += x
        moved[:, 2] += w
    return S, R, moved


class SimCore:
    """State and dynamics of N simulated transfers, as (N, ...) numpy arrays.

    Not a public API: use :class:`~automdt.simulator.env.BufferSimEnv` or
    :class:`~automdt.simulator.vector.BatchedBufferSim`. Parameters as in those classes.
    """

    def __init__(
        self,
        num_envs: int,
        profile: Profile | None,
        k: float,
        episode_steps: int,
        randomize: float,
        random_profiles: bool,
        random_start: bool,
        noise: float | None,
        substeps: int,
        bound_penalty: float,
        changes: Any = None,
    ) -> None:
        if profile is None:
            profile = Profile.default()
        if not isinstance(profile, Profile):
            raise TypeError(f"profile must be a Profile or None, got {type(profile).__name__}")
        assert num_envs >= 1, "num_envs must be >= 1"
        assert k > 0, f"k must be > 0 (the papers use 1.02), got {k}"
        assert episode_steps >= 1, f"episode_steps must be >= 1, got {episode_steps}"
        assert 0.0 <= randomize < 1.0, f"randomize is a relative spread in [0, 1), got {randomize}"
        assert noise is None or 0.0 <= noise <= 0.5, f"noise is a relative std in [0, 0.5], got {noise}"
        assert substeps >= 1, f"substeps must be >= 1, got {substeps}"
        assert bound_penalty >= 0.0, f"bound_penalty must be >= 0, got {bound_penalty}"
        self.num_envs = int(num_envs)
        self.profile = profile
        self.k = float(k)
        self.episode_steps = int(episode_steps)
        self.randomize = float(randomize)
        self.random_profiles = bool(random_profiles)
        self.random_start = bool(random_start)
        self.noise_override = None if noise is None else float(noise)
        self.substeps = int(substeps)
        self.bound_penalty = float(bound_penalty)
        self.max_threads = int(profile.max_threads)
        self.interval_s = float(profile.interval_s)
        self.model = "min" if random_profiles else profile.capacity_model
        self._pen = np.power(self.k, -np.arange(self.max_threads + 1, dtype=np.float64))  # k**-n lookup
        self.block_len = self.episode_steps + 1  # intervals per noise block (reset + steps)
        self.n_uniforms = N_PARAM_UNIFORMS + 3 * self.block_len
        self._init_contention_and_changes(profile, changes)

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
        self.tput = np.zeros((n, 3))
        self.prev_threads = np.ones((n, 3), dtype=np.int64)
        self.prev_tput = np.zeros((n, 3))
        self.ref = np.zeros(n)
        self.best_rate = np.zeros((n, 3))
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
        if self.random_start:
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
        self.factors[rows] = self._factors(u[:, U_LAYOUT["noise"]][:, :3 * self.block_len], noise)
        self.S[rows] = fill[:, 0] * smax
        self.R[rows] = fill[:, 1] * rmax
        self.steps[rows] = 0
        self.profile_changes[rows] = 0
        self.noise_idx[rows] = 0
        self.ref[rows] = 0.0
        self.best_rate[rows] = 0.0
        # The first observation is a real measurement: one interval at the start triple.
        self._advance(rows, threads, rngs, first=True)

    def _factors(self, u: np.ndarray, noise: np.ndarray) -> np.ndarray:
        m = u.shape[0]
        return 1.0 + (noise * _SQRT3)[:, None, None] * (2.0 * u.reshape(m, self.block_len, 3) - 1.0)

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
                u = rngs[int(i)].random(3 * self.block_len)
                self.factors[i] = self._factors(u[None, :], self.noise[i:i + 1])[0]
                self.noise_idx[i] = 0
            idx = self.noise_idx[sel]
        env_ids = np.arange(self.num_envs) if rows is None else rows
        f = self.factors[env_ids, idx]  # (m,3)
        usl = (None, None) if self.sigma is None else (self.sigma[sel], self.kappa[sel])
        cap = capacity_array(self.tpt[sel], self.bw[sel], threads.astype(np.float64), self.model, *usl) * f
        S, R, moved = run_interval(self.S[sel], self.R[sel], cap, self.interval_s, self.smax[sel], self.rmax[sel],
                                   self.substeps)
        tput = moved * (1.0 / self.interval_s)
        # column-wise max/sum: faster than axis=1 reductions over 3 columns
        ref = np.maximum(np.maximum(self.ref[sel], tput[:, 0]), np.maximum(tput[:, 1], tput[:, 2]))
        best_rate = np.maximum(self.best_rate[sel], tput / threads)
        if first:
            prev_threads, prev_tput = threads, tput
        else:
            prev_threads, prev_tput = self.threads[sel], self.tput[sel]
        fill = np.stack([S / self.smax[sel], R / self.rmax[sel]], axis=1)
        obs = encode_arrays(threads, tput, fill, prev_threads, prev_tput, ref, self.max_threads, best_rate, clip=False)
        weighted = tput * self._pen[threads]
        util = (weighted[:, 0] + weighted[:, 1] + weighted[:, 2]) / self.scale[sel]
        reward = self.bounded(util, threads)
        if rows is None:
            self.prev_threads, self.prev_tput = prev_threads, prev_tput
            self.threads, self.tput, self.S, self.R, self.ref, self.cap = threads, tput, S, R, ref, cap
            self.best_rate = best_rate
            self.obs, self.utility, self.reward = obs, util, reward
            self.noise_idx += 1
        else:
            self.prev_threads[rows], self.prev_tput[rows] = prev_threads, prev_tput
            self.threads[rows], self.tput[rows], self.S[rows], self.R[rows] = threads, tput, S, R
            self.ref[rows], self.cap[rows], self.best_rate[rows] = ref, cap, best_rate
            self.obs[rows], self.utility[rows], self.reward[rows] = obs, util, reward
            self.noise_idx[rows] += 1

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

    def _scale(self, rows: np.ndarray | None) -> np.ndarray:
        """The reward normalisation of ``rows``: each env's achievable rate (the weakest stage's peak)."""
        sel = slice(None) if rows is None else rows
        usl = (None, None) if self.sigma is None else (self.sigma[sel], self.kappa[sel])
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
        """(N,2) buffer fill fractions (sender, receiver)."""
        return np.stack([self.S / self.smax, self.R / self.rmax], axis=1)
