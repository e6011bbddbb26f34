"""How a tuning policy behaves over a transfer: ramp, sustain, settle (issue 10, items 3 and 4).

The definitions, one interval = one control interval, counted from 1 (the first interval runs the
start triple):

* **ramp intervals**: the first interval whose delivered throughput (the write stage) is at least
  90% of the achievable rate; "within 2 intervals" means ramp <= 2. On the engine, whose first
  intervals are shorter for PPO (:data:`automdt.controller.EARLY_INTERVALS`), it is counted in
  steady intervals of time: that interval ends within the first two seconds at 1-s intervals;
* **sustained**: the share of the intervals after that one that stay at or above 90%;
* **longest dip**: the longest run of consecutive intervals below 90% after the ramp (the policy
  must never sit there for more than two intervals while a stage could add threads);
* **settled** (over the last third of the run): the most frequent triple; it *holds* when the
  bottleneck is within one thread of the fewest threads that reach 95% of the achievable rate
  (:func:`min_threads_95`) and every other stage within one of its own such count, and the run
  does not swap back and forth between two triples (``swaps``: the number of A-B-A patterns).

:func:`metrics_of` computes them from per-interval arrays (the simulator's or the engine's
interval log); :func:`sim_episode` runs a policy in the simulator on a :class:`PathSpec` with the
engine's chunk effects.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from automdt.experiments.parity import MB, MiB, PathSpec
from automdt.simulator.profile import STAGES
from automdt.policy_contract import Triple

THRESHOLD = 0.9
"""Share of the achievable rate that counts as "at capacity"."""


def min_threads_95(path: PathSpec) -> Tuple[int, int, int]:
    """Per stage, the fewest threads whose capacity reaches 95% of the path's achievable rate."""
    prof = path.profile()
    target = 0.95 * prof.achievable_bps
    out = []
    for st in prof.stages:
        n = 1
        while n < prof.max_threads and min(n * st.tpt, st.bandwidth) < target * (1 - 1e-12):
            n += 1
        out.append(n)
    return tuple(out)  # type: ignore[return-value]


def metrics_of(delivered_bps: Sequence[float], threads: Sequence[Sequence[int]], achievable_bps: float,
               min95: Sequence[int], bottleneck: int, threshold: float = THRESHOLD,
               ends_s: Optional[Sequence[float]] = None, interval_s: float = 1.0) -> Dict[str, Any]:
    """Ramp, sustained share, longest dip and settling of one run (see the module docstring).

    :param delivered_bps: (T,) delivered throughput of each interval (drop a last partial one).
    :param threads: (T,3) the triple each interval ran.
    :param min95: per stage, the fewest threads reaching 95% of the achievable rate.
    :param bottleneck: index of the bottleneck stage.
    :param ends_s: (T,) seconds from the start to each interval's end (an engine's interval log,
        whose first intervals may be shorter than the steady ``interval_s``): then ``ramp_intervals``
        counts steady intervals of time, ``ceil(t / interval_s)`` for the end ``t`` of the first
        interval at the threshold (with a tenth of an interval for the loop's lag: 2.02 s is 2),
        and ``seconds_to_threshold`` is that ``t``. None: every interval is ``interval_s`` long.
    """
    d = np.asarray(delivered_bps, dtype=np.float64)
    th = np.asarray(threads, dtype=np.int64).reshape(-1, 3)
    ok = d >= threshold * achievable_bps
    hit = np.flatnonzero(ok)
    first = int(hit[0]) if hit.size else None
    after = ok[first + 1:] if first is not None else np.zeros(0, dtype=bool)
    dip = run = 0
    for x in after:
        run = 0 if x else run + 1
        dip = max(dip, run)
    tail = [tuple(int(v) for v in row) for row in th[-max(1, len(th) // 3):]]
    settled = Counter(tail).most_common(1)[0][0]
    swaps = sum(1 for i in range(2, len(tail)) if tail[i] == tail[i - 2] != tail[i - 1])
    changes = sum(1 for i in range(1, len(tail)) if tail[i] != tail[i - 1])
    within = [abs(settled[i] - int(min95[i])) <= 1 for i in range(3)]
    t_hit = None if first is None else (float(ends_s[first]) if ends_s is not None else (first + 1) * interval_s)
    return {
        "intervals": int(len(d)),
        "ramp_intervals": None if t_hit is None else max(1, math.ceil(t_hit / interval_s - 0.1)),
        "seconds_to_threshold": t_hit,
        "sustained": float(after.mean()) if after.size else (1.0 if first is not None else 0.0),
        "longest_dip": int(dip),
        "mean_fraction": float(d.mean() / achievable_bps) if d.size else float("nan"),
        "settled": settled,
        "min95": tuple(int(x) for x in min95),
        "bottleneck_within_one": bool(within[bottleneck]),
        "others_within_one": bool(all(w for i, w in enumerate(within) if i != bottleneck)),
        "tail_changes": int(changes),
        "swaps": int(swaps),
    }


def bottleneck_index(path: PathSpec) -> int:
    return STAGES.index(path.profile().bottleneck)


def sim_episode(policy: Any, path: PathSpec, steps: int = 40, start: Optional[Triple] = None, seed: int = 0,
                noise: float = 0.02, chunk: bool = True, buffer_fill: Optional[Tuple[float, float]] = None
                ) -> Dict[str, Any]:
    """Run ``policy`` (``reset``/``act``) for ``steps`` intervals in the simulator on ``path`` and
    return :func:`metrics_of` plus the per-interval ``threads`` and ``delivered_bps``.

    :param start: the start triple (default: the policy's own ``reset``).
    :param noise: capacity noise of the simulated path (the engine's throttles jitter a little).
    :param chunk: the engine's chunk effects (``path.chunk_size``); False: the fluid model.
    :param buffer_fill: start with the buffers this full (sender, receiver).
    """
    from automdt.simulator.env import BufferSimEnv

    prof = path.profile(noise)
    first = policy.reset(prof.max_threads, seed)
    if start is not None:
        first = tuple(int(x) for x in start)
    env = BufferSimEnv(prof, random_start=False, episode_steps=steps, chunk_bytes=path.chunk_size if chunk else 0.0)
    opts: Dict[str, Any] = {"threads": tuple(first)}
    if buffer_fill is not None:
        opts["buffer_fill"] = tuple(buffer_fill)
    _, info = env.reset(seed=seed, options=opts)
    threads = [info["observation"].threads]
    delivered = [info["observation"].throughput_bps[2]]
    for _ in range(steps - 1):
        nxt = policy.act(info["observation"])
        _, _, _, _, info = env.step_threads(tuple(int(x) for x in nxt))
        threads.append(info["observation"].threads)
        delivered.append(info["observation"].throughput_bps[2])
    m = metrics_of(delivered, threads, prof.achievable_bps, min_threads_95(path), bottleneck_index(path))
    m["threads"] = [list(t) for t in threads]
    m["delivered_bps"] = [float(x) for x in delivered]
    return m


def scenario_path(bottleneck: str, rate_bps: float = 80 * MB, memory: int = 128 * MiB, chunk_size: int = 1 * MiB,
                  interval_s: float = 1.0) -> PathSpec:
    """The experiments' read-, network- or write-bound scenario (every stage throttled per thread
    and in total; :meth:`automdt.experiments.scenarios.Scenario.scaled`) as a :class:`PathSpec`."""
    from automdt.experiments.scenarios import Scenario

    sc = Scenario.scaled(bottleneck, rate_bps)
    return PathSpec({s: tuple(sc.throttle[s]) for s in STAGES}, memory=memory, chunk_size=chunk_size,
                    interval_s=interval_s, max_threads=sc.max_threads)


def sim_paths() -> Dict[str, PathSpec]:
    """The paths the issue's figures are about, as the simulator sees them: the issue's read-bound
    path (default buffers and chunks), the experiments' three scenarios at 80 MB/s (their 128 MiB
    buffers, 1 MiB chunks) and the same shapes at 250 MB/s."""
    from automdt.experiments.parity import ISSUE_PATH

    out = {"issue-read-bound": ISSUE_PATH}
    for b in STAGES:
        out[f"{b}-bound"] = scenario_path(b)
    for b in STAGES:
        out[f"{b}-bound-250"] = scenario_path(b, 250 * MB)
    return out


def summarize(results: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Medians and worst cases over several runs of :func:`metrics_of`."""
    ramps = [r["ramp_intervals"] if r["ramp_intervals"] is not None else math.inf for r in results]
    return {
        "runs": len(results),
        "ramp_median": float(np.median(ramps)),
        "ramp_worst": float(max(ramps)),
        "ramp_within_2": sum(1 for x in ramps if x <= 2),
        "sustained_min": float(min(r["sustained"] for r in results)),
        "sustained_median": float(np.median([r["sustained"] for r in results])),
        "longest_dip": int(max(r["longest_dip"] for r in results)),
        "holds": sum(1 for r in results if r["bottleneck_within_one"] and r["others_within_one"] and r["swaps"] == 0),
    }
