"""The yardstick: the best steady-state thread triple for a known profile, and a policy evaluator.

``fraction_of_oracle = policy utility / oracle utility`` (both in the reward's normalisation).
:func:`oracle` and :func:`oracle_batch` need numpy only (the live controller computes a
profile-trained policy's start with them); :func:`evaluate_policy_in_sim` imports the gymnasium
environment when called.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from automdt.simulator.profile import Profile, capacity_array
from automdt.policy_contract import K_DEFAULT
from automdt.simulator.types import Observation, Triple

__all__ = ["OracleResult", "SimTrajectory", "evaluate_policy_in_sim", "oracle", "oracle_batch"]


@dataclass(frozen=True)
class OracleResult:
    """Best steady state of a profile.

    :param threads: the utility-maximising (read, net, write) thread counts.
    :param utility: its utility ``sum_i (T / scale) / k**n_i`` with ``scale = profile.achievable_bps``.
    :param throughput_bps: its steady-state throughput ``T = min_i capacity_i(n_i)`` (bytes/s).
    """

    threads: Triple
    utility: float
    throughput_bps: float


def oracle(profile: Profile, k: float = K_DEFAULT) -> OracleResult:
    """Exhaustive search over every triple in ``[1, max_threads]^3`` (vectorised).

    In steady state every stage moves the bottleneck's rate ``T = min_i c_i(n_i)``, so the
    utility of a triple is ``(T / scale) * sum_i k**-n_i``. Ties go to the triple that is first in
    (read, net, write) lexicographic order, i.e. to fewer threads.

    :param profile: the path profile (its ``max_threads`` bounds the search).
    :param k: utility base per thread.
    """
    m = profile.max_threads
    n = np.arange(1, m + 1, dtype=np.float64)
    sig, kap = profile.contention_arrays()
    caps = capacity_array(profile.tpt_array()[:, None], profile.bandwidth_array()[:, None], n[None, :],
                          profile.capacity_model,
                          None if sig is None else sig[:, None], None if kap is None else kap[:, None])  # (3, m)
    pen = np.power(float(k), -n)  # (m,)
    scale = profile.achievable_bps
    best = (-np.inf, (1, 1, 1), 0.0)
    # One read count at a time keeps memory at m^2 (m = 1000 still works).
    cap_nw = np.minimum(caps[1][:, None], caps[2][None, :])  # (m, m)
    pen_nw = pen[:, None] + pen[None, :]
    for i in range(m):
        t = np.minimum(caps[0][i], cap_nw)
        u = (t / scale) * (pen[i] + pen_nw)
        j = int(np.argmax(u))
        if u.flat[j] > best[0]:
            a, b = divmod(j, m)
            best = (float(u.flat[j]), (i + 1, a + 1, b + 1), float(t.flat[j]))
    return OracleResult(threads=best[1], utility=best[0], throughput_bps=best[2])


def oracle_batch(
    tpt: np.ndarray,
    bandwidth: np.ndarray,
    max_threads: int,
    k: float = K_DEFAULT,
    capacity_model: str = "min",
    chunk: int = 1024,
    contention: np.ndarray | None = None,
    coherency: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Oracle of N profiles at once: ``(threads (N,3) int, utility (N,), throughput_bps (N,))``.

    Same optimum as :func:`oracle` (utility normalised by each profile's achievable rate), by a
    different search: the optimal steady-state rate ``T`` is one of the 3 * max_threads stage
    capacities ``c_i(n)``, and for a given ``T`` each stage best uses the fewest threads with
    ``c_i(n) >= T``. Cost O(N * 3M * M) instead of O(N * M^3).

    :param tpt: (N,3) per-thread throughputs (bytes/s).
    :param bandwidth: (N,3) stage bandwidths (bytes/s).
    :param max_threads: thread bound M.
    :param k: utility base per thread.
    :param capacity_model: as :attr:`Profile.capacity_model`.
    :param chunk: profiles per vectorised block (memory ~ chunk * 3M * M bytes).
    :param contention: (N,3) USL sigma per stage, or None (see :mod:`automdt.simulator.profile`).
    :param coherency: (N,3) USL kappa per stage, or None. With either, a stage's capacity may fall
        past a peak: the threads it needs for a rate are the fewest that reach it.
    """
    tpt = np.atleast_2d(np.asarray(tpt, dtype=np.float64))
    bandwidth = np.atleast_2d(np.asarray(bandwidth, dtype=np.float64))
    n_prof, m = tpt.shape[0], int(max_threads)
    nn = np.arange(1, m + 1, dtype=np.float64)
    pen = np.power(float(k), -np.arange(m + 2, dtype=np.float64))
    out_n = np.zeros((n_prof, 3), dtype=np.int64)
    out_u = np.zeros(n_prof)
    out_t = np.zeros(n_prof)
    for lo in range(0, n_prof, chunk):
        hi = min(lo + chunk, n_prof)
        usl = [None if a is None else np.atleast_2d(np.asarray(a, dtype=np.float64))[lo:hi, :, None]
               for a in (contention, coherency)]
        caps = capacity_array(tpt[lo:hi, :, None], bandwidth[lo:hi, :, None], nn, capacity_model, *usl)  # (c,3,M)
        if contention is not None or coherency is not None:
            # past its peak a stage never needs more threads for a rate: count on the running maximum
            caps = np.maximum.accumulate(caps, axis=2)
        scale = caps[:, :, -1].min(axis=1)  # achievable rate
        cand = caps.reshape(hi - lo, 3 * m)  # candidate rates T
        cand = np.where(cand <= scale[:, None] * (1 + 1e-12), cand, 0.0)  # T above the achievable is infeasible
        # threads needed per stage for each candidate: 1 + #{n : c_i(n) < T}
        need = 1 + (caps[:, :, None, :] < cand[:, None, :, None] * (1 - 1e-12)).sum(axis=3)  # (c,3,3M)
        u = cand / scale[:, None] * pen[need].sum(axis=1)
        best = np.argmax(u, axis=1)
        rows = np.arange(hi - lo)
        out_n[lo:hi] = np.minimum(need[rows, :, best], m)
        out_u[lo:hi] = u[rows, best]
        out_t[lo:hi] = cand[rows, best]
    return out_n, out_u, out_t


@dataclass
class SimTrajectory:
    """What :func:`evaluate_policy_in_sim` returns (arrays have one row per step).

    :param threads: (steps, 3) thread counts used in each interval.
    :param throughput_bps: (steps, 3) achieved throughputs (bytes/s).
    :param buffer_fill: (steps, 2) buffer fill fractions at the end of each interval.
    :param utilities: (steps,) utility of each interval (reward normalisation, no penalty).
    :param settled_threads: the most frequent triple over the last third of the steps.
    :param fraction_of_oracle: mean utility over the last half / ``oracle.utility``.
    :param oracle: the profile's :class:`OracleResult`.
    """

    threads: np.ndarray
    throughput_bps: np.ndarray
    buffer_fill: np.ndarray
    utilities: np.ndarray
    settled_threads: Triple
    fraction_of_oracle: float
    oracle: OracleResult
    observations: list[Observation] = field(default_factory=list, repr=False)

    @property
    def mean_throughput_bps(self) -> float:
        """Mean end-to-end (write-stage) throughput over the whole run."""
        return float(self.throughput_bps[:, 2].mean())


def evaluate_policy_in_sim(
    policy: Any,
    profile: Profile,
    steps: int = 60,
    seed: int | None = 0,
    k: float = K_DEFAULT,
    noise: float | None = None,
    start_threads: Triple | None = None,
) -> SimTrajectory:
    """Run a policy in the simulator on ``profile`` and score it against the oracle.

    It drives the numpy core of :class:`~automdt.simulator.env.BufferSimEnv` (the same dynamics,
    seeding and observations as that environment with ``random_start=False``) without Gymnasium,
    so ``automdt simulate`` runs in the base install.

    :param policy: an object with ``reset(max_threads, seed) -> Triple`` and
        ``act(Observation) -> Triple`` (the :class:`automdt.policy_contract.Policy` protocol), or a
        plain callable ``act(Observation) -> Triple`` (then the start is ``start_threads`` or
        (1, 1, 1)).
    :param profile: the path profile.
    :param steps: number of control intervals after the start interval.
    :param seed: seed of the environment (noise) and of ``policy.reset``.
    :param k: utility base per thread.
    :param noise: capacity noise; ``None``: the profile's.
    :param start_threads: overrides the policy's start triple.
    """
    assert steps >= 1, f"steps must be >= 1, got {steps}"
    if hasattr(policy, "act") and hasattr(policy, "reset"):
        start = policy.reset(profile.max_threads, seed)
        act: Callable[[Observation], Any] = policy.act
    elif callable(policy):
        start, act = (1, 1, 1), policy
    else:
        raise TypeError("policy must have reset()/act() methods or be a callable act(Observation)")
    if start_threads is not None:
        start = start_threads
    from automdt.simulator.dynamics import SimCore
    from automdt.simulator.task import SimTask

    core = SimCore(1, profile, SimTask(k=k, episode_steps=steps, random_start=False, noise=noise))
    rng = np.random.default_rng(seed)  # what Gymnasium's reset(seed=) makes: PCG64 over SeedSequence(seed)
    core.reset_rows(np.array([0]), [rng], {"threads": tuple(int(x) for x in start)})
    threads = np.zeros((steps, 3), dtype=np.int64)
    tput = np.zeros((steps, 3))
    fill = np.zeros((steps, 2))
    util = np.zeros(steps)
    o = core.observation(0)
    observations = [o]
    for t in range(steps):
        triple = act(o)
        core.step_threads(np.asarray([int(x) for x in triple], dtype=np.int64).reshape(1, 3), [rng])
        o = core.observation(0)
        observations.append(o)
        threads[t], tput[t], fill[t], util[t] = o.threads, o.throughput_bps, o.buffer_fill, core.utility[0]
    last_third = [tuple(int(x) for x in row) for row in threads[-max(1, steps // 3):]]
    settled: Triple = Counter(last_third).most_common(1)[0][0]  # type: ignore[assignment]
    orc = oracle(profile, k)
    frac = float(util[-max(1, steps // 2):].mean() / orc.utility) if orc.utility > 0 else float("nan")
    return SimTrajectory(threads=threads, throughput_bps=tput, buffer_fill=fill, utilities=util,
                         settled_threads=settled, fraction_of_oracle=frac, oracle=orc, observations=observations)
