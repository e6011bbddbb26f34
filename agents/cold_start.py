"""The cold start of a general policy: chosen in the simulator for short completion.

A transfer with no history and a policy not trained on its path's profile starts at the triple
recorded in the policy's metadata as ``start`` (source ``cold``). :func:`choose_cold_start`
picks it: for every candidate triple in ``{1, 2, 4, 8, 16}^3`` it runs the policy in the
simulator from that triple on :data:`N_PROFILES` random profiles drawn from a seed stream that
neither training nor model selection uses (``COLD_START_SEED``), with datasets that would take
:data:`DATASET_INTERVALS` intervals at the path's achievable rate, and scores the mean of
``completion time / ideal time`` over all of them. Each run continues to :data:`EPISODE_STEPS`
intervals and also scores how well the policy settles from that start (its utility over the last
half as a fraction of the oracle's, the simulator's yardstick): a policy trained from (1,1,1)
may settle worse from a wide start, and a start that costs more than :data:`SETTLE_MARGIN` of it
against (1,1,1) on any profile is not eligible. Starting wide is never slower in the simulator, so among the
eligible candidates within :data:`TOLERANCE` of the best score it takes the one with the fewest
threads (fewer connections, less CPU, fairer to other transfers). The live controller then
bounds it by what the dataset can use (:mod:`automdt.start`).

Reproducible: fixed seeds, a deterministic policy, the simulator's own seeding. ``automdt train``
without ``--profile`` runs it at the end of training;
``.venv/bin/python -m automdt.agents.cold_start POLICY.zip --write`` (re)chooses it for an
existing policy file (only its JSON sidecar changes) and prints the table.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from automdt.simulator.profile import Profile

COLD_START_SEED = 0xC01D_57A7
"""Root seed of the profiles the cold start is chosen on (no training env or evaluation uses it)."""
N_PROFILES = 12
"""Random profiles scored (a third each read-, network- and write-bound)."""
DATASET_INTERVALS = (3, 8, 20)
"""Dataset sizes, in intervals at the profile's achievable rate (short transfers are where the
start matters)."""
CANDIDATE_COUNTS = (1, 2, 4, 8, 16)
"""Per-stage counts tried (every combination)."""
TOLERANCE = 0.02
"""Candidates within this fraction of the best score count as equally fast."""
EPISODE_STEPS = 60
"""Intervals per run (the settling score is the mean over the last half)."""
SETTLE_MARGIN = 0.02
"""How much worse than from (1,1,1) a start may let the policy settle on any profile (fraction of
the oracle's utility)."""


def cold_start_profiles(count: int = N_PROFILES, max_threads: int = 32) -> List[Tuple[str, Profile]]:
    """``count`` random profiles from ``COLD_START_SEED``, bottlenecks cycling read, net, write."""
    out = []
    for i in range(count):
        want = ("read", "net", "write")[i % 3]
        rng = np.random.default_rng([COLD_START_SEED, i])
        while True:
            p = Profile.random(rng, max_threads=max_threads)
            if p.bottleneck == want:
                break
        out.append((f"cold{i}-{want}", p))
    return out


def runs_from(policy: Any, profile: Profile, starts: Sequence[Tuple[int, int, int]], seed: int = 0,
              sizes: Sequence[float] = DATASET_INTERVALS, steps: int = EPISODE_STEPS,
              oracle_utility: Optional[float] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Simulated runs of ``policy`` on ``profile``, one from each start, all at once (a batched
    simulator, the same capacity noise for every start): completion time / ideal time for
    datasets of ``sizes`` ideal intervals, shape (starts, sizes), and the settling score (mean
    utility over the last half / the oracle's), shape (starts,).

    The policy runs through the same input pipeline and actor as live (:class:`PolicyInput`
    on the simulator's encodings, as in training; equal to the live encoder's, tested).
    """
    from automdt.simulator.dynamics import actions_to_threads, need_from_encoding
    from automdt.simulator.oracle import oracle
    from automdt.simulator.pipeline import PolicyInput
    from automdt.simulator.vector import BatchedBufferSim

    if oracle_utility is None:
        oracle_utility = oracle(profile).utility
    n = len(starts)
    targets = np.array([s * profile.achievable_bps * profile.interval_s for s in sizes])
    sim = BatchedBufferSim(n, profile=profile, episode_steps=steps + 1, random_start=False, autoreset=False)
    obs, info = sim.reset(seed=[seed] * n, options={"threads": np.asarray(starts, dtype=np.int64)})
    pipe = PolicyInput(n, policy.train_max_threads, policy.input_features, policy.frame_stack)
    x = pipe.reset(obs)
    done_at = np.full((n, len(targets)), np.nan)
    total = np.zeros(n)
    util = []
    for t in range(steps + 1):
        moved = info["throughput_bps"][:, 2] * profile.interval_s
        newly = np.isnan(done_at) & ((total + moved)[:, None] >= targets[None, :])
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = (targets[None, :] - total[:, None]) / moved[:, None]
        done_at = np.where(newly, t + frac, done_at)
        total += moved
        util.append(info["utility"])
        if t < steps:
            head = getattr(policy, "action_head", "step")
            threads = actions_to_threads(policy.actor.mode(x), info["threads"], profile.max_threads, head,
                                         policy.train_max_threads, need_from_encoding(obs, policy.train_max_threads))
            obs, _, _, _, info = sim.step_threads(threads)
            x, _ = pipe.step(obs)
    done_at = np.where(np.isnan(done_at), 2.0 * steps, done_at)
    settle = np.mean(np.array(util[len(util) // 2:]), axis=0) / oracle_utility
    return done_at / np.asarray(sizes, dtype=np.float64)[None, :], settle


def choose_cold_start(policy: Any, profiles: Optional[Sequence[Tuple[str, Profile]]] = None,
                      candidates: Optional[Sequence[Tuple[int, int, int]]] = None,
                      tolerance: float = TOLERANCE) -> Dict[str, Any]:
    """Score every candidate start; return the metadata ``start`` record
    ``{"threads", "source": "cold", "chosen_by": {...}}`` (the table is in ``chosen_by["top"]``)."""
    from automdt.simulator.oracle import oracle

    t0 = time.perf_counter()
    profiles = list(profiles if profiles is not None else cold_start_profiles())
    cands = [(int(c[0]), int(c[1]), int(c[2])) for c in (candidates if candidates is not None
                                                         else itertools.product(CANDIDATE_COUNTS, repeat=3))]
    base = (1, 1, 1)
    if base not in cands:
        cands.insert(0, base)
    ratios, settles = [], []
    for j, (_, prof) in enumerate(profiles):
        r, f = runs_from(policy, prof, cands, seed=1000 + j, oracle_utility=oracle(prof).utility)
        ratios.append(r.mean(axis=1))
        settles.append(f)
    score = dict(zip(cands, np.mean(ratios, axis=0).tolist()))
    settle = dict(zip(cands, np.mean(settles, axis=0).tolist()))
    per = np.array(settles)  # (profiles, candidates)
    worst = dict(zip(cands, (per - per[:, [cands.index(base)]]).min(axis=0).tolist()))
    eligible = {c: s for c, s in score.items() if worst[c] >= -SETTLE_MARGIN}
    best = min(eligible.values())
    ok = [c for c, s in eligible.items() if s <= best * (1 + tolerance)]
    chosen = min(ok, key=lambda c: (sum(c), score[c], c))
    ranked = sorted(eligible.items(), key=lambda kv: kv[1])
    return {
        "threads": list(chosen),
        "source": "cold",
        "chosen_by": {
            "module": __name__, "score": "mean completion time / ideal over profiles and dataset sizes",
            "profiles": len(profiles), "profile_seed": COLD_START_SEED, "dataset_intervals": list(DATASET_INTERVALS),
            "tolerance": tolerance, "chosen_score": round(score[chosen], 4), "best_score": round(best, 4),
            "one_one_one_score": round(score[base], 4),
            "settle_margin": SETTLE_MARGIN, "chosen_settle": round(settle[chosen], 4),
            "one_one_one_settle": round(settle[base], 4),
            "top": [[list(c), round(s, 4), round(settle[c], 4)] for c, s in ranked[:10]],
            "ineligible": len(score) - len(eligible),
            "seconds": round(time.perf_counter() - t0, 1),
        },
    }


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m automdt.agents.cold_start", description=__doc__.split("\n\n")[0])
    ap.add_argument("policy", help="policy .zip (with its .zip.json), or 'default'")
    ap.add_argument("--write", action="store_true", help="record the choice as the sidecar's start (atomically)")
    ap.add_argument("--profiles", type=int, default=N_PROFILES, help=f"random profiles (default {N_PROFILES})")
    args = ap.parse_args(argv)
    from automdt.agents.ppo import load_policy

    pol = load_policy(args.policy)
    rec = choose_cold_start(pol, cold_start_profiles(args.profiles, pol.train_max_threads))
    cb = rec["chosen_by"]
    print(f"cold start {tuple(rec['threads'])}: {cb['chosen_score']:.3f} x the ideal completion time, settles at "
          f"{cb['chosen_settle']:.3f} of the oracle (from (1,1,1): {cb['one_one_one_score']:.3f} and "
          f"{cb['one_one_one_settle']:.3f}; {cb['ineligible']} starts settle too badly; {cb['profiles']} profiles, "
          f"{cb['seconds']} s)")
    print("  start         completion/ideal  settled/oracle")
    for c, s, f in cb["top"]:
        print(f"  {str(tuple(c)):12s}  {s:.3f}             {f:.3f}")
    if args.write:
        assert pol.path is not None
        side = Path(str(pol.path) + ".json")
        meta = json.loads(side.read_text())
        meta["start"] = rec
        meta["start_threads"] = rec["threads"]
        tmp = side.with_name(side.name + ".tmp")
        tmp.write_text(json.dumps(meta, indent=2) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, side)
        print(f"written to {side}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
