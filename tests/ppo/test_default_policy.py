"""The shipped default policy (automdt/data/default_policy.zip): loads, and finds the bottleneck
on hand-written read-, network- and write-bound paths that it never saw in training.

Measured for the shipped file (scripts/train_default_policy.py, seed 0, 6M timesteps), 60
intervals from (1, 1, 1), seeds 0-4: 0.972-0.998 of the oracle's utility; it settles and stays
(at most 3 changes in the last 20 intervals); the bottleneck stage lands one thread above the
oracle's (read 11 vs 10, net 14 vs 13, write 16 vs 15; write 17 on seed 4) and the other stages
within one thread of it. The policy shipped before (session 2) settled 1-3 threads above on
the read- and write-bound paths (read 12 vs 10, write 17-18 vs 15).
"""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from tests.ppo.conftest import held_out_profiles

SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def default_policy():
    from automdt.agents.ppo import load_policy

    return load_policy("default")


def _run(policy, name, seed):
    from automdt.simulator.oracle import evaluate_policy_in_sim
    from automdt.simulator.profile import STAGES

    prof = held_out_profiles()[name]
    traj = evaluate_policy_in_sim(policy, prof, steps=60, seed=seed, k=1.02, start_threads=(1, 1, 1))
    b = STAGES.index(prof.bottleneck)
    detail = (f"{name} seed {seed}: settled {traj.settled_threads}, oracle {traj.oracle.threads}, "
              f"fraction {traj.fraction_of_oracle:.3f}")
    return traj, b, detail


def test_shipped_files_are_consistent(default_policy):
    from automdt.agents.ppo import default_policy_path

    path = default_policy_path()
    meta = json.loads(path.with_name(path.name + ".json").read_text())
    assert meta["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert meta["random_profiles"] is True and meta["profile"] is None
    assert meta["k"] == 1.02 and meta["max_threads"] == 32 and meta["seed"] == 0
    assert meta["stop_reason"] == "timesteps", "the shipped policy is trained on a fixed budget (reproducible)"
    assert sorted(meta["held_out"]["results"]) == ["net-bound", "read-bound", "write-bound"]
    assert path.stat().st_size < 1_000_000, "the shipped policy should stay small"
    assert default_policy.metadata["sha256"] == meta["sha256"]


@pytest.mark.parametrize("name", sorted(held_out_profiles()))
@pytest.mark.parametrize("seed", SEEDS)
def test_held_out_paths(default_policy, name, seed):
    traj, b, detail = _run(default_policy, name, seed)
    settled, best = traj.settled_threads, traj.oracle.threads
    assert traj.fraction_of_oracle >= 0.9, detail
    # the bottleneck gets what it needs (never more than one thread short) and not much more
    assert best[b] - 1 <= settled[b] <= best[b] + 3, detail
    # the other stages stay low: at most one thread above what the bottleneck's rate needs
    for i in range(3):
        if i != b:
            assert settled[i] <= best[i] + 1, detail


@pytest.mark.parametrize("name", sorted(held_out_profiles()))
@pytest.mark.parametrize("seed", SEEDS)
def test_held_out_bottleneck_within_one_thread(default_policy, name, seed):
    traj, b, detail = _run(default_policy, name, seed)
    assert abs(traj.settled_threads[b] - traj.oracle.threads[b]) <= 1, detail


@pytest.mark.parametrize("name", sorted(held_out_profiles()))
def test_settles_and_stays(default_policy, name):
    """Over the last third of a run the thread counts barely move (no Marlin-style oscillation)."""
    traj, _, detail = _run(default_policy, name, 0)
    tail = traj.threads[-20:]
    changes = int(np.any(np.diff(tail, axis=0) != 0, axis=1).sum())
    assert changes <= 4, f"{detail}: {tail.tolist()}"
