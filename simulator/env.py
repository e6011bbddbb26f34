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
    ABSOLUTE_FIXED,
    TARGET_NAMES,
    ACTION_HEADS,
    ACTION_NAMES,
    DEFAULT_ACTION_HEAD,
    OBS_DIM,
    OBS_NAMES,
    SimCore,
    action_nvec,
    actions_to_threads,
    need_from_encoding,
    utility_arrays,
)
from automdt.simulator.pipeline import ObservationEncoder  # noqa: F401  (re-exported for importers of this module)
from automdt.simulator.task import SimTask
from automdt.simulator.profile import STAGES, Profile
from automdt.simulator.types import Triple

ENV_ID = "automdt/BufferSim-v0"

__all__ = [
    "ABSOLUTE_FIXED",
    "TARGET_NAMES",
    "ACTION_HEADS",
    "ACTION_NAMES",
    "DEFAULT_ACTION_HEAD",
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


def make_action_space(head: str = DEFAULT_ACTION_HEAD, max_threads: int = 32) -> spaces.MultiDiscrete:
    """The action space of a head (:data:`ACTION_HEADS`): ``MultiDiscrete([11] * 3)`` for
    ``target``, ``MultiDiscrete([max_threads + 3] * 3)`` for ``absolute``, ``MultiDiscrete([5, 5,
    5])`` for ``step`` (see :func:`action_to_threads`)."""
    return spaces.MultiDiscrete([action_nvec(head, max_threads)] * 3)


def action_to_threads(action: Sequence[int] | np.ndarray, current: Sequence[int], max_threads: int,
                      head: str = DEFAULT_ACTION_HEAD, action_max: int | None = None,
                      need: Sequence[float] | np.ndarray | None = None) -> Triple:
    """Apply a per-stage action to the current thread counts.

    ``target`` head (the default, :data:`TARGET_NAMES`): hold, -1, +1, the threads the stage's
    flow needs, +1, the threads it needs to carry its neighbour's flow, +1, double, x4, the thread
    bound, half; ``need`` holds the anchors (:func:`~automdt.simulator.dynamics.need_from_encoding`
    of the interval's encoding). ``absolute`` head: index 0 keeps the stage's count, 1 takes a
    thread off, 2 adds one, index ``2 + k`` sets it to ``k``. ``step`` head (the first one):
    ``0: n // 2``, ``1: n - 1``, ``2: n`` (hold), ``3: n + 1``, ``4: 2 * n``. The result is
    clipped to ``[1, max_threads]``.

    Why targets anchored on measurements:

    * *fast*: any count in one step (the AutoMDT slides' agent predicts the next counts). The step
      head needs 5 doublings from 1 to 32 threads, so its ramp takes at least as many intervals
      however well the policy knows the path;
    * *exact*: the count a stage needs is one choice, computed from what it measured; absolute
      counts (1..32) ramp as fast, but a categorical over 32 counts lands near a count, not on it;
    * *stable*: ``hold`` is exact whatever the count, so a settled policy stays settled, which is
      what makes AutoMDT beat Marlin's oscillating gradient descents; a small per-change cost in
      training (``change_penalty``) makes holding the habit.

    :param action: three indices (read, net, write).
    :param current: current thread counts (read, net, write).
    :param max_threads: upper bound of the result.
    :param head: :data:`ACTION_HEADS`.
    :param action_max: the bound the ``absolute`` and ``target`` heads were built for (default
        ``max_threads``).
    :param need: the six anchors of the ``target`` head (needs, then carries, per stage).
    :return: the next thread counts.
    """
    out = actions_to_threads(np.asarray(action).reshape(1, 3), np.asarray(current).reshape(1, 3), max_threads,
                             head, action_max, None if need is None else np.asarray(need).reshape(1, 6))[0]
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
    **Description**

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

    **Action Space**

    ``MultiDiscrete([11, 11, 11])`` (the default ``target`` head), one index per stage (read, net,
    write), applied to the current counts by :func:`~automdt.simulator.env.action_to_threads` on the anchors of the
    observation just returned, clipped to ``[1, max_threads]``:


    =====  ==============  =========================================================
    Index  Meaning         New count
    =====  ==============  =========================================================
    0      hold            ``n``
    1, 2   minus/plus one  ``n - 1``, ``n + 1``
    3, 4   need (+1)       ``ceil(n * utilization * efficiency - 0.25)`` (+1)
    5, 6   carry (+1)      the need times the neighbour's throughput / own (+1)
    7, 8   double, x4      ``2 n``, ``4 n``
    9, 10  max, halve      ``max_threads``, ``n // 2``
    =====  ==============  =========================================================

    ``action_head="absolute"`` (hold, -1, +1, then 1..max_threads) and ``"step"`` (halve, -1, hold,
    +1, double) are the other heads. :meth:`step_threads` takes absolute counts instead (for
    baselines and evaluation).

    **Observation Space**

    ``Box(0, 1, (25,), float32)`` produced by :class:`~automdt.simulator.pipeline.ObservationEncoder`
    from the raw measurements (which are in ``info["observation"]``, an
    :class:`~automdt.policy_contract.Observation` in bytes/s; see
    the encoder for the components: threads, throughputs, fills, the previous interval, thread
    efficiency, utilization, peak throughputs, buffer trends).

    **Rewards**

    ``utility(t, n, k, scale) = sum_i (t_i / scale) / k**n_i`` with ``scale`` the episode
    profile's achievable rate ``min_i c_i(max_threads)`` (= the smallest bandwidth when the thread
    bound can saturate every stage), so a policy running every stage at the bottleneck rate with
    few threads earns close to 3 per step. Minus ``bound_penalty`` for each stage at
    ``max_threads`` (default 0; the lower bound is not penalised: 1 thread is often optimal).
    :func:`automdt.simulator.oracle.oracle` gives the best steady-state utility for comparison.

    **Starting State**

    Each :meth:`reset` (optionally) draws a new profile (``random_profiles``) and jitters TPT and
    B by ``randomize``; with ``random_start`` the thread counts are uniform in
    ``[1, max_threads]`` and both buffers uniformly filled, else (1, 1, 1) and empty buffers.
    ``options={"threads": (r, n, w), "buffer_fill": (s, r)}`` overrides the start. One interval
    is simulated at the start triple so the first observation is a real measurement.

    **Episode End**

    Never terminates; truncates after ``episode_steps`` steps (the env does this itself, no
    ``TimeLimit`` wrapper is registered). Stepping further works (new noise is drawn).

    **Arguments**

    :param profile: the path profile; ``None``: :meth:`~automdt.simulator.profile.Profile.default`. With ``random_profiles``
        only its ``max_threads`` and ``interval_s`` are used (and, if ``noise`` is None, each
        random profile's own noise level applies).
    :param task: the simulated task (:class:`~automdt.simulator.task.SimTask`: ``k``,
        ``episode_steps``, ``randomize``, ``random_profiles``, ``random_start``, ``noise``,
        ``substeps``, ``bound_penalty``, ``chunk_bytes``, ``chunk_range``, ``start_mix``,
        ``changes``); ``None``: its defaults. Any of its fields may be given as a keyword argument
        instead (``BufferSimEnv(profile, episode_steps=60)``, and so through ``gym.make``), over
        ``task``. With ``changes`` ``info["sim/profile_changes"]`` counts the profile's changes.
    :param action_head: the action head (``"target"``, ``"absolute"`` or ``"step"``; see above).

    All randomness comes from ``self.np_random`` (see :mod:`automdt.simulator.dynamics`).

    **Version History**

    * v0: initial version.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, profile: Profile | None = None, task: SimTask | None = None, *, render_mode: str | None = None,
                 action_head: str = DEFAULT_ACTION_HEAD, **settings: Any) -> None:
        if render_mode is not None:
            raise ValueError(f"BufferSimEnv has no render modes, got render_mode={render_mode!r}")
        self.render_mode = render_mode
        self.task = SimTask.of(task, **settings)
        self._core = SimCore(1, profile, self.task)
        self.action_head = action_head
        self.profile: Profile = self._core.profile
        self.k = self.task.k
        self.episode_steps = self.task.episode_steps
        self.max_threads = self._core.max_threads
        self.observation_space = make_observation_space()
        self.action_space = make_action_space(action_head, self.max_threads)
        self._needs_reset = True

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._core.reset_rows(np.array([0]), [self.np_random], options)
        self._needs_reset = False
        return self._core.obs[0].copy(), self._info()

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        assert not self._needs_reset, "Call reset before using step method."
        return self._step(np.asarray(self.threads_for(action), dtype=np.int64).reshape(1, 3))

    def threads_for(self, action: np.ndarray) -> Triple:
        """The thread counts ``action`` means now (what :meth:`step` would run)."""
        new = actions_to_threads(np.asarray(action).reshape(1, 3), self._core.threads, self.max_threads,
                                 self.action_head, need=need_from_encoding(self._core.obs, self.max_threads))
        return (int(new[0, 0]), int(new[0, 1]), int(new[0, 2]))

    def step_threads(self, threads: Sequence[int]) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Like :meth:`step` but with absolute thread counts (clipped to ``[1, max_threads]``)."""
        assert not self._needs_reset, "Call reset before using step method."
        return self._step(np.asarray(threads, dtype=np.int64).reshape(1, 3))

    def _step(self, threads: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._core.step_threads(threads, [self.np_random])
        truncated = bool(self._core.steps[0] >= self.episode_steps)
        return self._core.obs[0].copy(), float(self._core.reward[0]), False, truncated, self._info()

    def set_path(self, profile: Profile) -> None:
        """The path changes now (a moving bottleneck, a link that halves, a transfer that joins):
        the next :meth:`step` runs on ``profile``'s stages; the buffers, their contents, the noise
        and the thread bound stay. ``episode_profile`` and the reward's normalisation follow."""
        assert not self._needs_reset, "Call reset before using set_path."
        self._core.set_stages(np.array([0]), profile)

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

        usl = [(0.0, 0.0)] * 3 if c.sigma is None or c.kappa is None else [(float(c.sigma[0, i]), float(c.kappa[0, i])) for i in range(3)]
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
        fs, fr = float(c.fill_obs[0, 0]), float(c.fill_obs[0, 1])
        info: dict[str, Any] = {"observation": c.observation(0)}
        for i, st in enumerate(STAGES):
            info[f"sim/{st}/threads"] = int(t[i])
            info[f"sim/{st}/throughput_bps"] = float(x[i])
            info[f"sim/{st}/capacity_bps"] = float(c.cap[0, i])
            info[f"sim/{st}/moved_bps"] = float(c.moved[0, i] / c.interval_s)
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
