"""The floor under the PPO policy (agents/guard.py): a policy that comes to rest below the rate
the transfer reached, its limiting stage busy, is lifted; a path that cannot give that rate again
is not climbed; the guard cuts a count only to undo its own raise."""
from __future__ import annotations

import random

import pytest

from automdt.agents.guard import JUDGE, PATIENCE, SHORTFALL, FloorGuard
from automdt.experiments.parity import ISSUE_PATH
from automdt.policy_contract import Observation

MB = 1_000_000


def _obs(threads, tput, busy, dt=1.0):
    return Observation(threads=tuple(threads), throughput_bps=tuple(float(x) for x in tput), buffer_fill=(0.1, 0.0),
                       interval_s=dt, busy_s=tuple(float(x) for x in busy), wait_s=(0.0, 0.0, 0.0))


def _sim_run(schedule_then, start, steps, guard):
    """Run the simulator on issue 10's read-bound path: the counts of ``start`` for 3 intervals
    (they reach the path's rate), then a policy that always asks for ``schedule_then``."""
    from automdt.simulator.env import BufferSimEnv

    env = BufferSimEnv(ISSUE_PATH.profile(0.0), random_start=False, episode_steps=steps + 1,
                       chunk_bytes=float(ISSUE_PATH.chunk_size))
    _, info = env.reset(seed=0, options={"threads": tuple(start)})
    delivered, threads = [], []
    nxt = tuple(start)
    for k in range(steps):
        obs = info["observation"]
        delivered.append(obs.throughput_bps[2])
        threads.append(obs.threads)
        proposed = tuple(start) if k < 3 else tuple(schedule_then)
        nxt = guard(obs, proposed) if guard is not None else proposed
        info = env.step_threads(nxt)[4]
    return delivered, threads


def test_a_policy_resting_below_the_rate_it_reached_is_lifted_in_the_simulator():
    """Issue 10's case: 6 readers at 10 MB/s each on an 80 MB/s path after it reached 80 MB/s.
    Without the guard the run stays at 60 MB/s; with it, no more than PATIENCE + 2 intervals are
    short before the readers carry the rate again, and it stays there."""
    achievable = ISSUE_PATH.achievable_bps
    bare, _ = _sim_run((6, 2, 2), (9, 3, 3), 26, None)
    assert max(bare[-10:]) < SHORTFALL * achievable  # the failure the guard is for
    g = FloorGuard(32)
    got, threads = _sim_run((6, 2, 2), (9, 3, 3), 26, g)
    first = next(i for i, d in enumerate(got) if d >= SHORTFALL * achievable)
    short = [i for i in range(first, len(got)) if got[i] < SHORTFALL * achievable]
    print(f"delivered MB/s {[round(d / MB) for d in got]}, threads {threads[-1]}, raises {g.raises}")
    assert len(short) <= PATIENCE + 2, short
    assert all(d >= SHORTFALL * achievable for d in got[-8:])
    assert threads[-1][0] >= 8 and g.raises >= 1


def test_a_best_rate_the_path_no_longer_gives_is_not_climbed():
    """A burst (a buffer draining) set the best at 100 MB/s for two intervals; the path gives 80 with 8 readers busy
    under a total limit. The guard raises once, sees that the raise did not pay within JUDGE
    intervals, takes the best down and drops the floor; it never raises again."""
    g = FloorGuard(32)
    for _ in range(2):
        g(_obs((8, 4, 4), (100 * MB, 100 * MB, 100 * MB), (8, 2, 2)), (8, 4, 4))
    assert g.best == 100 * MB
    outs = []
    for _ in range(30):
        prev = outs[-1] if outs else (8, 4, 4)
        r = prev[0]
        outs.append(g(_obs((r, 4, 4), (80 * MB, 80 * MB, 80 * MB), (r, 2, 2)), (8, 4, 4)))
    assert g.raises == 1
    assert outs[PATIENCE - 1][0] == 10  # ceil(100 / (80 / 8))
    assert outs[PATIENCE + JUDGE - 1] == (8, 4, 4)  # undone
    assert all(o == (8, 4, 4) for o in outs[PATIENCE + JUDGE - 1:]), outs
    assert g.best == pytest.approx(80 * MB)


def test_the_guard_cuts_only_its_own_raise_and_passes_observations_without_busy_times():
    rng = random.Random(7)
    g = FloorGuard(16)
    for _ in range(500):
        threads = tuple(rng.randint(1, 16) for _ in range(3))
        tput = [rng.uniform(0, 200) * MB for _ in range(3)]
        busy = [t * rng.uniform(0, 1.0) for t in threads]
        proposed = tuple(rng.randint(1, 16) for _ in range(3))
        judging = g._judging
        out = g(_obs(threads, tput, busy), proposed)
        assert all(1 <= o <= 16 for o in out)
        for s in range(3):  # below the policy's choice only to undo its own raise, to the count before it
            if out[s] < proposed[s]:
                assert judging is not None and judging[4][s] == out[s], (judging, proposed, out)
    plain = Observation(threads=(1, 1, 1), throughput_bps=(0.0, 0.0, 0.0), buffer_fill=(0.0, 0.0))
    assert g(plain, (3, 4, 5)) == (3, 4, 5)


def test_the_shipped_policy_carries_the_guard_unless_switched_off(monkeypatch):
    from automdt.agents.ppo import load_policy

    assert load_policy("ppo").guard is not None
    monkeypatch.setenv("AUTOMDT_GUARD", "0")
    assert load_policy("ppo").guard is None


def _profile_run(prof, guard_on, steps=40):
    from automdt.agents.ppo import load_policy
    from automdt.simulator.oracle import evaluate_policy_in_sim

    pol = load_policy("ppo")
    if not guard_on:
        pol.guard = None
    traj = evaluate_policy_in_sim(pol, prof, steps=steps, seed=0, k=1.02)
    return traj, pol.guard


def test_a_balanced_rest_short_of_the_oracle_is_probed_up():
    """Held-out random profile 22: the bare shipped policy rests at (11, 2, 13), every stage busy,
    0.69 of the oracle (18, 4, 21); the probes take it most of the way, and a probe that does not
    pay is undone for good."""
    from automdt.agents.training import held_out_random_profiles

    _, prof = held_out_random_profiles(30)[22]
    bare, _ = _profile_run(prof, False)
    got, g = _profile_run(prof, True)
    print(f"bare {bare.fraction_of_oracle:.3f} {bare.settled_threads}, guarded {got.fraction_of_oracle:.3f} "
          f"{got.settled_threads}, probes {g.probes}, blocked {g.probe_blocked}")
    assert bare.fraction_of_oracle < 0.75
    assert got.fraction_of_oracle >= 0.85 and g.probes >= 2


def test_a_probe_on_a_total_limit_is_undone_and_not_repeated():
    """Two stages busy at 80 MB/s under a total limit: the probe adds a quarter of their threads,
    the rate stays, the probe is undone after JUDGE intervals and never tried again."""
    from automdt.agents.guard import PROBE_AFTER

    g = FloorGuard(32)
    outs, notes = [], []
    threads = (8, 4, 2)
    for _ in range(40):
        outs.append(g(_obs(threads, (80 * MB, 80 * MB, 80 * MB), (threads[0], threads[1], 0.5)), (8, 4, 2)))
        notes.append(g.note)
        threads = outs[-1]
    # what the interval log's "guard" field says
    assert [n for n in notes if n] == ["probe", "trial:probe", "trial:probe,undo"]
    assert g.probes == 1 and g.probe_blocked == [True, True, False]
    assert outs[PROBE_AFTER] == (10, 5, 2)  # the probe (after PROBE_AFTER + 1 intervals: best needs two)
    assert all(o == (8, 4, 2) for o in outs[PROBE_AFTER + JUDGE:]), outs
