"""Gymnasium environment of the two staging buffers, and the policy-facing contract.

The live controller uses the same encoding (:class:`ObservationEncoder`, which lives in the
numpy-only :mod:`automdt.simulator.pipeline` and is re-exported here), action map
(:func:`~automdt.simulator.dynamics.actions_to_threads`, :func:`action_to_threads` here) and
:func:`utility`: they are pure and need no knowledge of the profile.
"""
from __future__ import annotations

from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from automdt.simulator.dynamics import (
    ACTION_NAMES,
    OBS_DIM,
    OBS_NAMES,
    SimCore,
    actions_to_threads,
    encode_arrays,
    utility_arrays,
)
from automdt.simulator.pipeline import ObservationEncoder  # noqa: F401  (re-exported: its old home)
from automdt.simulator.profile import STAGES, Profile
from automdt.simulator.types import Observation, Triple

ENV_ID = "automdt/BufferSim-v0"

__all__ = [
    "ACTION_NAMES",
    "ENV_ID",
    "OBS_DIM",
    "OBS_NAMES",
    "BufferSimEnv",
    "ObservationEncoder",
    "action_to_threads",
    "make_action_space",
    "make_observation_space",
    "utility",
]


# ---------------------------------------------------------------------------------------------
# Policy-facing contract
# ---------------------------------------------------------------------------------------------
def make_observation_space() -> spaces.Box:
    """``Box(0, 1, (OBS_DIM,), float32)``: the encoded observation (see :class:`ObservationEncoder`)."""
    return spaces.Box(low=0.0, high=1.0, shape=(OBS_DIM,), dtype=np.float32)


def make_action_space() -> spaces.MultiDiscrete:
    """``MultiDiscrete([5, 5, 5])``: one step choice per stage (see :func:`action_to_threads`)."""
    return spaces.MultiDiscrete([len(ACTION_NAMES)] * 3)


def action_to_threads(action: Sequence[int] | np.ndarray, current: Sequence[int], max_threads: int) -> Triple:
    """Apply a per-stage step action to the current thread counts.

    Each stage's action index means ``0: n // 2``, ``1: n - 1``, ``2: n`` (hold), ``3: n + 1``,
    ``4: 2 * n``; the result is clipped to ``[1, max_threads]``.

    Why multiplicative-plus-unit steps in a ``MultiDiscrete`` head rather than absolute counts:

    * *scale-free*: the same action means the same thing at 2 and at 200 threads, and with
      ``max_threads = 20`` online or 32 offline; absolute counts from a Gaussian (the reference
      code) tie the policy to one bound and jitter around the optimum;
    * *fast*: 1 -> 32 threads takes 5 steps (x2), any count in [1, 32] is reachable in <= 6 steps,
      and a finished ramp is fine-tuned by +-1;
    * *stable*: ``hold`` is an exact action, so a settled policy stays settled, which is what
      makes AutoMDT beat Marlin's oscillating gradient descents;
    * *learnable*: 3 x 5 logits (SB3 ``MultiDiscrete``) are easy for PPO, and the last change is
      visible in the observation, so the policy can see whether a step helped.

    :param action: three indices in ``0..4`` (read, net, write).
    :param current: current thread counts (read, net, write).
    :param max_threads: upper bound.
    :return: the next thread counts.
    """
    out = actions_to_threads(np.asarray(action).reshape(1, 3), np.asarray(current).reshape(1, 3), max_threads)[0]
    return (int(out[0]), int(out[1]), int(out[2]))


def utility(throughput_bps: Sequence[float] | np.ndarray, threads: Sequence[int] | np.ndarray, k: float,
            scale_bps: float | np.ndarray) -> float | np.ndarray:
    """AutoMDT utility ``sum_i (t_i / scale) / k**n_i`` (Falcon/Marlin/AutoMDT use ``k = 1.02``).

    :param throughput_bps: achieved throughputs (read, net, write) in bytes/s; shape (3,) or (N,3).
    :param threads: thread counts, same shape.
    :param k: cost base per thread.
    :param scale_bps: normalisation in bytes/s (the simulator uses the profile's achievable rate).
    :return: a float for (3,) inputs, an (N,) array for batches.
    """
    u = utility_arrays(np.asarray(throughput_bps, dtype=np.float64), np.asarray(threads), k, scale_bps)
    return float(u) if np.ndim(u) == 0 else u


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------
class BufferSimEnv(gym.Env[np.ndarray, np.ndarray]):
    """
    ## Description

    A modular transfer (read pool -> sender buffer S -> network pool -> receiver buffer R -> write
    pool) reduced to the fluid dynamics of its two bounded staging buffers, after the AutoMDT
    simulator. Stage ``i`` with ``n_i`` threads has capacity ``c_i = min(n_i * TPT_i, B_i)``
    bytes/s (profile ``capacity_model="concave"``: ``B n / (n + B/TPT)``), multiplied once per
    interval by an independent noise factor ``1 + noise * sqrt(3) * (2u - 1)``, u ~ U(0,1)
    (relative std ``noise``).

    One step is one control interval of ``interval_s`` seconds, simulated in ``substeps``
    sub-steps of length ``dt``; with budgets ``a_i = c_i * dt``, each sub-step does, in order:

    1. network ``x = min(a_n, S + a_r, (R_max - R) + a_w)``
    2. read ``r = min(a_r, (S_max - S) + x)`` (a full S blocks readers)
    3. write ``w = min(a_w, R + x)`` (an empty R starves writers)
    4. ``S <- S + r - x``, ``R <- R + x - w``

    i.e. the maximal flows satisfying ``r = min(c_r, room in S + what leaves S)``,
    ``x = min(c_n, S + r, room in R + what leaves R)``, ``w = min(c_w, R + x)``. With rates
    constant over an interval the result is independent of ``substeps`` (tested). Buffers carry
    over between steps. Achieved throughput of a stage = bytes it moved / ``interval_s``.

    ## Action Space

    ``MultiDiscrete([5, 5, 5])``, one index per stage (read, net, write), applied to the current
    counts by :func:`action_to_threads` and clipped to ``[1, max_threads]``:

    | Index | Meaning   | New count  |
    |-------|-----------|------------|
    | 0     | halve     | ``n // 2`` |
    | 1     | minus one | ``n - 1``  |
    | 2     | hold      | ``n``      |
    | 3     | plus one  | ``n + 1``  |
    | 4     | double    | ``2 n``    |

    :meth:`step_threads` takes absolute counts instead (for baselines and evaluation).

    ## Observation Space

    ``Box(0, 1, (17,), float32)`` produced by :class:`ObservationEncoder` from the raw
    measurements (which are in ``info["observation"]``, an :class:`Observation` in bytes/s):

    | Num   | Observation                  | Unit / scaling                              | Min | Max |
    |-------|------------------------------|---------------------------------------------|-----|-----|
    | 0-2   | threads (read, net, write)   | count / max_threads                         | 0   | 1   |
    | 3-5   | throughputs (read, net, write)| B/s / running max stage throughput (episode)| 0   | 1   |
    | 6     | sender buffer fill           | S / S_max                                   | 0   | 1   |
    | 7     | receiver buffer fill         | R / R_max                                   | 0   | 1   |
    | 8-10  | previous interval's threads  | count / max_threads                         | 0   | 1   |
    | 11-13 | previous interval's throughputs | B/s / the same running max               | 0   | 1   |
    | 14-16 | thread efficiency (read, net, write) | (B/s per thread) / its running max  | 0   | 1   |

    ## Rewards

    ``utility(t, n, k, scale) = sum_i (t_i / scale) / k**n_i`` with ``scale`` the episode
    profile's achievable rate ``min_i c_i(max_threads)`` (= the smallest bandwidth when the thread
    bound can saturate every stage), so a policy running every stage at the bottleneck rate with
    few threads earns close to 3 per step. Minus ``bound_penalty`` for each stage at
    ``max_threads`` (default 0; the lower bound is not penalised: 1 thread is often optimal).
    :func:`automdt.simulator.oracle.oracle` gives the best steady-state utility for comparison.

    ## Starting State

    Each :meth:`reset` (optionally) draws a new profile (``random_profiles``) and jitters TPT and
    B by ``randomize``; with ``random_start`` the thread counts are uniform in
    ``[1, max_threads]`` and both buffers uniformly filled, else (1, 1, 1) and empty buffers.
    ``options={"threads": (r, n, w), "buffer_fill": (s, r)}`` overrides the start. One interval
    is simulated at the start triple so the first observation is a real measurement.

    ## Episode End

    Never terminates; truncates after ``episode_steps`` steps (the env does this itself, no
    ``TimeLimit`` wrapper is registered). Stepping further works (new noise is drawn).

    ## Arguments

    :param profile: the path profile; ``None``: :meth:`Profile.default`. With ``random_profiles``
        only its ``max_threads`` and ``interval_s`` are used (and, if ``noise`` is None, each
        random profile's own noise level applies).
    :param k: utility base per thread (1.02 as in Falcon/Marlin/AutoMDT).
    :param episode_steps: steps per episode.
    :param randomize: relative spread of TPT and B redrawn each reset (uniform in ``[1-s, 1+s]``).
    :param random_profiles: draw a fresh :meth:`Profile.random` at each reset (general policy).
    :param random_start: random start threads and buffer fills.
    :param noise: relative std of the per-interval capacity noise; ``None``: the profile's.
    :param substeps: sub-steps per interval.
    :param bound_penalty: reward penalty per stage at ``max_threads``.
    :param changes: a :class:`~automdt.simulator.changes.ProfileChanges`: the profile may change
        at random steps of an episode (``info["sim/profile_changes"]`` counts them); None: off.

    All randomness comes from ``self.np_random`` (see :mod:`automdt.simulator.dynamics`).

    ## Version History

    * v0: initial version.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        profile: Profile | None = None,
        k: float = 1.02,
        episode_steps: int = 30,
        randomize: float = 0.0,
        random_profiles: bool = False,
        random_start: bool = True,
        noise: float | None = None,
        substeps: int = 1,
        bound_penalty: float = 0.0,
        render_mode: str | None = None,
        changes: Any = None,
    ) -> None:
        assert render_mode is None, "BufferSimEnv has no render modes"
        self.render_mode = render_mode
        self._core = SimCore(1, profile, k, episode_steps, randomize, random_profiles, random_start, noise,
                             substeps, bound_penalty, changes=changes)
        self.profile: Profile = self._core.profile
        self.k = float(k)
        self.episode_steps = int(episode_steps)
        self.max_threads = self._core.max_threads
        self.observation_space = make_observation_space()
        self.action_space = make_action_space()
        self._needs_reset = True

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._core.reset_rows(np.array([0]), [self.np_random], options)
        self._needs_reset = False
        return self._core.obs[0].copy(), self._info()

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        assert not self._needs_reset, "Call reset before using step method."
        new = actions_to_threads(np.asarray(action).reshape(1, 3), self._core.threads, self.max_threads)
        return self._step(new)

    def step_threads(self, threads: Sequence[int]) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Like :meth:`step` but with absolute thread counts (clipped to ``[1, max_threads]``)."""
        assert not self._needs_reset, "Call reset before using step method."
        return self._step(np.asarray(threads, dtype=np.int64).reshape(1, 3))

    def _step(self, threads: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._core.step_threads(threads, [self.np_random])
        truncated = bool(self._core.steps[0] >= self.episode_steps)
        return self._core.obs[0].copy(), float(self._core.reward[0]), False, truncated, self._info()

    # ------------------------------------------------------------------ accessors
    @property
    def threads(self) -> Triple:
        """Thread counts (read, net, write) of the last interval."""
        t = self._core.threads[0]
        return (int(t[0]), int(t[1]), int(t[2]))

    @property
    def episode_profile(self) -> Profile:
        """The profile in force this episode (after ``random_profiles`` / ``randomize``)."""
        c = self._core
        from automdt.simulator.profile import StageProfile

        usl = [(0.0, 0.0)] * 3 if c.sigma is None else [(float(c.sigma[0, i]), float(c.kappa[0, i])) for i in range(3)]
        st = [StageProfile(float(c.tpt[0, i]), float(c.bw[0, i]), contention=usl[i][0], coherency=usl[i][1])
              for i in range(3)]
        return Profile(read=st[0], net=st[1], write=st[2], sender_buffer=int(round(c.smax[0])),
                       receiver_buffer=int(round(c.rmax[0])), interval_s=c.interval_s,
                       max_threads=c.max_threads, noise=float(c.noise[0]), capacity_model=c.model)

    def episode_oracle(self) -> Any:
        """:func:`automdt.simulator.oracle.oracle` of :attr:`episode_profile` (same normalisation
        as the reward)."""
        from automdt.simulator.oracle import oracle

        return oracle(self.episode_profile, self.k)

    @property
    def reward_scale_bps(self) -> float:
        """The throughput normalisation of the reward in this episode (bytes/s)."""
        return float(self._core.scale[0])

    def _info(self) -> dict[str, Any]:
        c = self._core
        t = c.threads[0]
        x = c.tput[0]
        fs, fr = float(c.S[0] / c.smax[0]), float(c.R[0] / c.rmax[0])
        obs = Observation(
            threads=(int(t[0]), int(t[1]), int(t[2])),
            throughput_bps=(float(x[0]), float(x[1]), float(x[2])),
            buffer_fill=(fs, fr),
            interval_s=c.interval_s,
            max_threads=c.max_threads,
            buffer_bytes=(int(round(c.smax[0])), int(round(c.rmax[0]))),
        )
        info: dict[str, Any] = {"observation": obs}
        for i, st in enumerate(STAGES):
            info[f"sim/{st}/threads"] = int(t[i])
            info[f"sim/{st}/throughput_bps"] = float(x[i])
            info[f"sim/{st}/capacity_bps"] = float(c.cap[0, i])
        info["sim/buffer/sender_fill"] = fs
        info["sim/buffer/receiver_fill"] = fr
        info["sim/buffer/sender_bytes"] = float(c.S[0])
        info["sim/buffer/receiver_bytes"] = float(c.R[0])
        info["sim/utility"] = float(c.utility[0])
        info["sim/reward_scale_bps"] = float(c.scale[0])
        info["sim/step"] = int(c.steps[0])
        info["sim/profile_changes"] = int(c.profile_changes[0])
        return info


def _register() -> None:
    if ENV_ID not in gym.registry:
        gym.register(
            id=ENV_ID,
            entry_point="automdt.simulator.env:BufferSimEnv",
            vector_entry_point="automdt.simulator.vector:BatchedBufferSim",
            disable_env_checker=False,
        )


_register()
