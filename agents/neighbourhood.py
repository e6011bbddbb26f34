"""The paths near an explored one: what ``automdt train --profile`` trains and validates on.

An explored profile is a measurement, not the truth, and the path it measured changes later. The
episodes of :func:`episode` draw a *true* path around the explored profile and, in
:data:`DRIFT_SHARE` of them, a change after the exploration:

* **fit uncertainty**: every stage's per-thread rate and bandwidth scaled by a log-normal factor
  of the fit's relative spread (at least :data:`MIN_SPREAD`); a value explore reports as a lower
  bound (never seen limiting) may be up to :data:`LOWER_BOUND_REACH` times higher;
* **noise**: the profile's noise level scaled by 0.5-2 (at least 1%);
* **changes** (:data:`DRIFTS`): ``moving`` (every stage rescaled by 1/:data:`MOVE_RANGE` to
  :data:`MOVE_RANGE` at one or two random intervals), ``moved-early`` (the same within the first
  ten intervals: the path is no longer the one explored when the transfer starts), ``moved-far``
  (within the first ten intervals one stage carries :data:`FAR_RANGE` of its explored capacity,
  beyond the trusted band of :func:`trust`: the bottleneck moves to a stage that exploring never
  saw limiting), ``link`` (the network's bandwidth drops to 20-70%
  and recovers) and ``competing`` (2-40 connections of another transfer share the network for a
  while).

Thread bound, interval, buffers and chunk size are the profile's. The generator is seeded; the
validation of a trained file draws from a stream its training never used.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Tuple

import numpy as np

from automdt.agents.families import STEPS, Episode, network_change
from automdt.policy_contract import K_DEFAULT
from automdt.simulator.profile import Profile, StageProfile

DRIFTS = ("moving", "moved-early", "moved-far", "link", "competing")
"""The changes a path makes after it was explored."""
DRIFT_SHARE = 0.5
"""Share of episodes in which the path changes during the transfer."""
MIN_SPREAD = 0.05
"""Least relative uncertainty of a fitted value (a fit is never exact)."""
LOWER_BOUND_REACH = 3.0
"""How far above a lower-bound estimate the true value may lie."""
MOVE_RANGE = 3.0
"""A ``moving`` change rescales each stage by a factor between 1/MOVE_RANGE and MOVE_RANGE."""
FAR_RANGE = (0.03, 0.25)
"""A ``moved-far`` change rescales one stage by a factor in this range."""
TRUST_SIGMAS = 3.0
"""Fit spreads by which a measurement may lie beyond the moves before a trained network is retired."""
MiB = 2 ** 20


def _scaled(rng: np.random.Generator, value: float, spread: float, lower_bound: bool) -> float:
    v = value * math.exp(rng.normal(0.0, max(float(spread), MIN_SPREAD)))
    if lower_bound and rng.random() < 0.5:
        v = max(v, value * float(rng.uniform(1.0, LOWER_BOUND_REACH)))
    return v


def confidence(profile: Profile) -> Dict[str, Dict[str, Any]]:
    """Per stage, whether explore measured its rate and bandwidth or saw them only as lower bounds:
    the profile's ``fit.confidence`` (what ``automdt explore`` writes), else the same judged from
    its fit's per-stage details (:func:`automdt.simulator.fit.stage_confidence`; a profile fitted
    by other means than the command, or without a fit, counts as measured)."""
    from automdt.simulator.fit import stage_confidence

    return ((profile.meta or {}).get("fit") or {}).get("confidence") or stage_confidence(profile)


def true_path(profile: Profile, rng: np.random.Generator) -> Profile:
    """A path the explored ``profile`` could have measured (fit uncertainty and noise drawn)."""
    conf = confidence(profile)
    stages = []
    for name, st in zip(("read", "net", "write"), profile.stages):
        c = conf.get(name) or {}
        tpt = _scaled(rng, st.tpt, st.tpt_spread, not c.get("tpt_measured", True))
        bw = _scaled(rng, st.bandwidth, st.bandwidth_spread, not c.get("bandwidth_measured", True))
        stages.append(StageProfile(tpt, max(bw, tpt), contention=st.contention, coherency=st.coherency))
    noise = min(0.5, max(0.01, profile.noise * float(rng.uniform(0.5, 2.0))))
    return profile.replace(read=stages[0], net=stages[1], write=stages[2], noise=noise, samples=None,
                           meta={"generator": "neighbourhood"})


def _drift(rng: np.random.Generator, base: Profile, kind: str, steps: int) -> List[Tuple[int, Profile]]:
    if kind in ("moving", "moved-early"):
        at = ([int(rng.integers(1, 10))] if kind == "moved-early" else
              sorted({int(x) for x in rng.integers(10, steps - 8, size=int(rng.integers(1, 3)))}))
        out = []
        for a in at:
            g = [math.exp(rng.uniform(-math.log(MOVE_RANGE), math.log(MOVE_RANGE))) for _ in range(3)]
            out.append((a, base.replace(**{n: StageProfile(s.tpt * f, s.bandwidth * f, contention=s.contention,
                                                           coherency=s.coherency)
                                          for n, s, f in zip(("read", "net", "write"), base.stages, g)})))
        return out
    if kind == "moved-far":
        s = int(rng.integers(3))
        f = float(rng.uniform(*FAR_RANGE))
        st = base.stages[s]
        far = StageProfile(st.tpt * f, st.bandwidth * f, contention=st.contention, coherency=st.coherency)
        return [(int(rng.integers(1, 10)), base.replace(**{("read", "net", "write")[s]: far}))]
    a = int(rng.integers(5, steps - 20))
    b = min(a + int(rng.integers(6, 25)), steps - 1)
    return [(a, base.replace(net=network_change(base, kind, rng))), (b, base)]


def episode(profile: Profile, rng: np.random.Generator, steps: int = STEPS, drift: str | None = None) -> Episode:
    """One episode near ``profile``: a true path and, with probability :data:`DRIFT_SHARE` (or
    when ``drift`` names one of :data:`DRIFTS`; ``"none"`` for none), its changes. The episode's
    ``family`` is ``"explored"`` or the change's name."""
    base = true_path(profile, rng)
    if drift is None:
        drift = str(rng.choice(DRIFTS)) if rng.random() < DRIFT_SHARE else "none"
    if drift not in (*DRIFTS, "none"):
        raise ValueError(f"unknown drift {drift!r}; valid: none, {', '.join(DRIFTS)}")
    events = [] if drift == "none" else _drift(rng, base, drift, steps)
    chunk = float((profile.meta or {}).get("chunk_bytes") or 4 * MiB)
    return Episode("explored" if drift == "none" else drift, base, events, chunk)


def trust(profile: Profile) -> Dict[str, Any]:
    """The band in which a trained network is trusted (:class:`automdt.agents.tuned.TunedPolicy`),
    as its sidecar's ``trust``: per stage the explored capacity at 1..max_threads, and the lowest
    and highest measured multiple of it the training's paths reach: the moves' range times
    :data:`TRUST_SIGMAS` of the fit's spread; no upper bound for a stage whose rate or bandwidth
    explore saw only as a lower bound."""
    from automdt.simulator.profile import capacity

    conf = confidence(profile)
    n = np.arange(1, profile.max_threads + 1)
    caps, low, high = [], [], []
    for name, st in zip(("read", "net", "write"), profile.stages):
        c = conf.get(name) or {}
        reach = MOVE_RANGE * math.exp(TRUST_SIGMAS * max(st.tpt_spread, st.bandwidth_spread, MIN_SPREAD))
        caps.append([float(x) for x in np.asarray(capacity(st, n, profile.capacity_model))])
        low.append(1.0 / reach)
        high.append(None if not (c.get("tpt_measured", True) and c.get("bandwidth_measured", True)) else reach)
    return {"capacity": caps, "low": low, "high": high}


def validation_set(profile: Profile, per_kind: int, seed: int, steps: int = STEPS) -> List[Episode]:
    """``per_kind`` episodes of the explored path unchanged and ``per_kind`` of each change."""
    out = []
    for i, kind in enumerate(("none", *DRIFTS)):
        rng = np.random.default_rng([seed, i])
        out += [episode(profile, rng, steps, kind) for _ in range(per_kind)]
    return out


def delivered_utility(info: Dict[str, Any], k: float = K_DEFAULT) -> float:
    """The interval's utility counted on what reached the destination: the delivered (write) rate
    times ``sum_i k^-n_i``. In steady state it is the papers' utility (every stage moves the
    bottleneck's rate); unlike it, bytes read or sent into a staging buffer and not yet written
    earn nothing, so filling the buffers with surplus threads does not pay."""
    n = info["observation"].threads
    return float(info["sim/write/moved_bps"]) * sum(k ** -int(x) for x in n)


def oracle_delivered(profile: Profile, k: float = K_DEFAULT) -> float:
    """:func:`delivered_utility` of the oracle's steady state on ``profile``."""
    from automdt.simulator.oracle import oracle

    best = oracle(profile, k)
    return float(best.throughput_bps) * sum(k ** -int(x) for x in best.threads)


def run_episode(policy: Any, ep: Episode, seed: int, k: float = K_DEFAULT, steps: int = STEPS) -> List[float]:
    """``policy`` (reset, act) on ``ep`` in the simulator; per interval, its
    :func:`delivered_utility` as a fraction of the oracle's on the path in force."""
    from automdt.simulator.env import BufferSimEnv

    start = policy.reset(ep.profile.max_threads, seed)
    env = BufferSimEnv(ep.profile, k=k, episode_steps=steps, random_start=False, chunk_bytes=ep.chunk_bytes)
    _, info = env.reset(seed=seed, options={"threads": tuple(int(x) for x in start)})
    best: Dict[int, float] = {}
    out = []
    for step in range(steps):
        triple = policy.act(info["observation"])
        for at, prof in ep.events:
            if at == step:
                env.set_path(prof)
        p = ep.profile_at(step)
        if id(p) not in best:
            best[id(p)] = oracle_delivered(p, k)
        _, _, _, _, info = env.step_threads(tuple(int(x) for x in triple))
        out.append(delivered_utility(info, k) / best[id(p)])
    return out
