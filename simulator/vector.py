"""N buffer simulators in numpy arrays (no Python loop per environment and step).

:class:`BatchedBufferSim` runs the dynamics of :class:`~automdt.simulator.env.BufferSimEnv` for
``num_envs`` environments at once. Environment ``i`` draws from its own generator seeded
``seed + i``, with the same draws as the single env, so it reproduces the trajectory of
``BufferSimEnv(...).reset(seed=seed + i)`` (tested). For stable-baselines3 use
:class:`automdt.simulator.sb3.BatchedSimVecEnv`.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from gymnasium.utils import seeding
from gymnasium.vector import VectorEnv
from gymnasium.vector.utils import batch_space
from gymnasium.vector.vector_env import AutoresetMode

from automdt.simulator.dynamics import DEFAULT_ACTION_HEAD, SimCore, actions_to_threads, need_from_encoding
from automdt.simulator.env import make_action_space, make_observation_space
from automdt.simulator.task import SimTask
from automdt.simulator.profile import Profile, capacity_array

__all__ = ["BatchedBufferSim", "REWARD_MODES"]

REWARD_MODES = ("measured", "steady")
"""Rewards :class:`BatchedBufferSim` can return (its ``reward`` argument)."""


class BatchedBufferSim(VectorEnv):
    """``num_envs`` copies of :class:`~automdt.simulator.env.BufferSimEnv` as numpy arrays.

    Episodes all have ``episode_steps`` steps and end by truncation. With ``autoreset=True``
    (default) a finished environment is reset *in the same step* (Gymnasium
    ``AutoresetMode.SAME_STEP``, the stable-baselines3 convention): the returned observation is the
    new episode's first one and the last observation of the finished episode is in
    ``infos["final_obs"]`` (rows where ``infos["_final_obs"]`` is True). With ``autoreset=False``
    the caller resets.

    ``infos`` is a dict of arrays (cheap at 4096 envs): ``threads`` (N,3) int, ``throughput_bps``
    (N,3), ``buffer_fill`` (N,2), ``utility`` (N,), ``reward_scale_bps`` (N,), ``step`` (N,) (all
    describing the interval just simulated, i.e. *before* any autoreset), plus ``final_obs`` /
    ``_final_obs``.

    :param num_envs: number of environments.
    :param profile: as :class:`~automdt.simulator.env.BufferSimEnv` (shared template).
    :param task: the simulated task (:class:`~automdt.simulator.task.SimTask`), as for
        :class:`~automdt.simulator.env.BufferSimEnv`: its fields may be given as keyword arguments
        instead, over ``task``; with ``random_profiles`` a fresh random profile per episode and
        environment, with ``changes`` ``infos["profile_changes"]`` counts each env's changes so
        far in its episode.
    :param seed: seed of the first :meth:`reset` if that gets none (env ``i`` gets ``seed + i``).
    :param autoreset: reset finished environments within :meth:`step`.
    :param reward: ``"measured"`` (default): the utility of the throughputs the interval achieved,
        as :class:`~automdt.simulator.env.BufferSimEnv`; ``"steady"``: the noise-free
        steady-state utility of the thread triple just run, ``(min_i c_i(n_i) / scale) *
        sum_i k**-n_i`` (the quantity :func:`~automdt.simulator.oracle.oracle` maximises), minus
        ``bound_penalty`` as usual. A *training* option: observations, dynamics and ``infos``
        (``utility`` included) are the same in both modes; only the returned reward differs.
        It takes the capacity noise and the buffer transients out of the learning signal, so
        the ~0.7% of the utility that one surplus thread costs is not buried under the
        interval's noise.
    :param surplus_penalty: a *training* shaping term: the reward is lowered by this much per
        thread that a stage runs above the count the episode profile's oracle
        (:func:`~automdt.simulator.oracle.oracle_batch` at ``k``) gives it. It only ever
        lowers the reward of triples above the oracle's, so the optimum stays the oracle's, but
        the cost of a surplus thread on the bottleneck stage, ~0.7% of the utility at k = 1.02,
        becomes as large as wanted. ``infos["utility"]`` is unchanged.
    :param change_penalty: a *training* shaping term: the reward is lowered by this much per
        stage whose thread count the action changed. Where a stage's need is fractional (3.3
        threads) two counts score almost the same and a policy may swap between them every few
        intervals; a small cost per change makes holding one of them the better choice. The first
        interval of an episode counts changes from the start triple. ``infos["utility"]`` is
        unchanged.
    """

    metadata: dict[str, Any] = {"render_modes": [], "autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int, profile: Profile | None = None, task: SimTask | None = None, *,
                 seed: int | None = None, autoreset: bool = True, reward: str = "measured",
                 surplus_penalty: float = 0.0, change_penalty: float = 0.0, action_head: str = DEFAULT_ACTION_HEAD,
                 **settings: Any) -> None:
        if reward not in REWARD_MODES:
            raise ValueError(f"reward must be one of {REWARD_MODES}, got {reward!r}")
        for name, value in (("surplus_penalty", surplus_penalty), ("change_penalty", change_penalty)):
            if not value >= 0.0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        self.surplus_penalty = float(surplus_penalty)
        self.change_penalty = float(change_penalty)
        self._oracle_threads = np.zeros((int(num_envs), 3), dtype=np.int64)
        self.num_envs = int(num_envs)
        self.reward_mode = reward
        self.task = SimTask.of(task, **settings)
        self._core = SimCore(self.num_envs, profile, self.task)
        self.action_head = action_head
        self.profile = self._core.profile
        self.k = self.task.k
        self.episode_steps = self.task.episode_steps
        self.max_threads = self._core.max_threads
        self.autoreset = bool(autoreset)
        self.metadata = {
            "render_modes": [],
            "autoreset_mode": AutoresetMode.SAME_STEP if autoreset else AutoresetMode.DISABLED,
        }
        self.render_mode = None
        self.single_observation_space = make_observation_space()
        self.single_action_space = make_action_space(action_head, self.max_threads)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._default_seed = seed
        self._rngs: list[np.random.Generator] | None = None
        self._needs_reset = True
        self._all_rows = np.arange(self.num_envs)

    # ------------------------------------------------------------------ seeding
    def _seed(self, seed: int | Sequence[int] | None) -> None:
        if seed is None:
            seeds: list[int | None] = [None] * self.num_envs
        elif isinstance(seed, (int, np.integer)):
            seeds = [int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = [None if s is None else int(s) for s in seed]
            assert len(seeds) == self.num_envs, f"need {self.num_envs} seeds, got {len(seeds)}"
        # Exactly what gymnasium.Env.reset(seed=s) does, so env i == BufferSimEnv seeded seeds[i].
        self._rngs = [seeding.np_random(s)[0] for s in seeds]
        self._np_random_seed = seeds[0] if seeds and seeds[0] is not None else -1

    # ------------------------------------------------------------------ API
    def reset(
        self,
        *,
        seed: int | Sequence[int] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every environment.

        :param seed: int (env ``i`` gets ``seed + i``), a list of per-env seeds, or None (keep the
            generators; on the very first reset use the constructor's ``seed``).
        :param options: as :meth:`BufferSimEnv.reset` (``threads``, ``buffer_fill``), for all envs.
        :return: observations (N, OBS_DIM) float32 and an info dict of arrays.
        """
        if seed is None and self._rngs is None:
            seed = self._default_seed
        if seed is not None or self._rngs is None:
            self._seed(seed)
        assert self._rngs is not None
        self._core.reset_rows(self._all_rows, self._rngs, options)
        self._after_reset(self._all_rows)
        self._needs_reset = False
        return self._core.obs.copy(), self._infos()

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Apply (N,3) action indices (see :func:`~automdt.simulator.env.action_to_threads`)."""
        assert not self._needs_reset, "Call reset before using step method."
        threads = actions_to_threads(np.asarray(actions).reshape(self.num_envs, 3), self._core.threads,
                                     self.max_threads, self.action_head,
                                     need=need_from_encoding(self._core.obs, self.max_threads))
        return self._step(threads)

    def step_threads(self, threads: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """Like :meth:`step` with absolute (N,3) thread counts (clipped to ``[1, max_threads]``)."""
        assert not self._needs_reset, "Call reset before using step method."
        return self._step(np.asarray(threads, dtype=np.int64).reshape(self.num_envs, 3))

    def _step(self, threads: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        assert self._rngs is not None
        core = self._core
        before = core.threads.copy() if self.change_penalty else None
        core.step_threads(threads, self._rngs)
        if core.changed.size:  # the profile changed mid-episode: the per-episode shaping follows it
            self._after_reset(core.changed)
        reward = core.reward.copy() if self.reward_mode == "measured" else self._steady_reward()
        if self.surplus_penalty:
            reward -= self.surplus_penalty * np.maximum(core.threads - self._oracle_threads, 0).sum(axis=1)
        if before is not None:
            reward -= self.change_penalty * (core.threads != before).sum(axis=1)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = core.steps >= self.episode_steps
        infos = self._infos()
        obs = core.obs
        if self.autoreset and truncated.any():
            done = np.flatnonzero(truncated)
            final = np.zeros_like(obs)
            final[done] = obs[done]
            infos["final_obs"] = final
            infos["_final_obs"] = truncated.copy()
            core.reset_rows(done, self._rngs, None)
            self._after_reset(done)
            obs = core.obs
        return obs.copy(), reward, terminated, truncated, infos

    def _after_reset(self, rows: np.ndarray) -> None:
        """Per-episode values of the training shaping (the oracle triple for ``surplus_penalty``)."""
        if self.surplus_penalty:
            from automdt.simulator.oracle import oracle_batch

            c = self._core
            self._oracle_threads[rows] = oracle_batch(
                c.tpt[rows], c.bw[rows], c.max_threads, self.k, c.model,
                contention=None if c.sigma is None else c.sigma[rows],
                coherency=None if c.kappa is None else c.kappa[rows])[0]

    def _steady_reward(self) -> np.ndarray:
        """Noise-free steady-state utility of each env's current triple (``reward="steady"``)."""
        c = self._core
        usl = (None, None) if c.sigma is None else (c.sigma, c.kappa)
        caps = capacity_array(c.tpt, c.bw, c.threads.astype(np.float64), c.model, *usl)
        pen = c._pen[c.threads]
        return c.bounded(caps.min(axis=1) / c.scale * (pen[:, 0] + pen[:, 1] + pen[:, 2]), c.threads)

    def _infos(self) -> dict[str, Any]:
        c = self._core
        return {
            "threads": c.threads.copy(),
            "throughput_bps": c.tput.copy(),
            "buffer_fill": c.fill(),
            "busy_s": c.busy.copy(),
            "wait_s": c.wait.copy(),
            "utility": c.utility.copy(),
            "reward_scale_bps": c.scale.copy(),
            "step": c.steps.copy(),
            "profile_changes": c.profile_changes.copy(),
        }

    @property
    def threads(self) -> np.ndarray:
        """(N,3) thread counts of the last interval (of the new episode after an autoreset)."""
        return self._core.threads.copy()

    def episode_oracle(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Oracle of every environment's current episode (after ``random_profiles``/``randomize``).

        :return: ``(threads (N,3), utility (N,), throughput_bps (N,))`` from
            :func:`automdt.simulator.oracle.oracle_batch`; ``utility`` is in the reward's
            normalisation, so ``mean reward / utility`` is the fraction of the oracle.
        """
        from automdt.simulator.oracle import oracle_batch

        c = self._core
        return oracle_batch(c.tpt, c.bw, c.max_threads, self.k, c.model, contention=c.sigma, coherency=c.kappa)

    def close_extras(self, **kwargs: Any) -> None:
        self._rngs = None
