"""The floor under the PPO policy (agents/guard.py): a policy that comes to rest below the rate
the transfer reached, its limiting stage busy, is lifted; a path that cannot give that rate again
is not climbed; a stage over-provisioned behind a total limit is trimmed; the guard cuts a count
only to undo its own raise or to trim."""
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


def _sim_run(schedule_then, start, steps, guard, path=ISSUE_PATH):
    """Run the simulator on ``path`` (issue 10's read-bound path): the counts of ``start`` for 3
    intervals (they reach the path's rate), then a policy that always asks for ``schedule_then``."""
    from automdt.simulator.env import BufferSimEnv

    env = BufferSimEnv(path.profile(0.0), random_start=False, episode_steps=steps + 1,
                       chunk_bytes=float(path.chunk_size))
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
    """A burst (a buffer draining) set the best at 100 MB/s for two intervals; the path gives 80
    (10 MB/s per reader, 80 in total) with 8 readers busy. The guard raises once, sees that the
    raise did not pay within JUDGE intervals, takes the best down and drops the floor; it never
    raises again. Its one check of the readers (8 -> 6: no evidence either way) loses rate and goes
    back to 8 after one interval."""
    g = FloorGuard(32)
    for _ in range(2):
        g(_obs((8, 4, 4), (100 * MB, 100 * MB, 100 * MB), (8, 2, 2)), (8, 4, 4))
    assert g.best == 100 * MB
    outs = []
    for _ in range(30):
        prev = outs[-1] if outs else (8, 4, 4)
        r = prev[0]
        rate = min(80, 10 * r) * MB
        outs.append(g(_obs((r, 4, 4), (rate, rate, rate), (r, 2, 2)), (8, 4, 4)))
    assert g.raises == 1
    assert outs[PATIENCE - 1][0] == 10  # ceil(100 / (80 / 8))
    assert outs[PATIENCE + JUDGE - 1] == (8, 4, 4)  # undone
    after = outs[PATIENCE + JUDGE - 1:]
    assert all(o[0] <= 8 for o in after) and sum(o != (8, 4, 4) for o in after) == 1, outs
    assert g.trims == 1 and g.trim_blocked == [True, False, False]
    assert g.best == pytest.approx(80 * MB)


def test_the_guard_cuts_only_to_undo_its_raise_or_to_trim_and_passes_observations_without_busy_times():
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
        for s in range(3):  # below the policy's choice only to undo its own raise (to the count before it) or at a ceiling
            if out[s] < proposed[s]:
                assert (judging is not None and judging[4][s] == out[s]) or out[s] == g.ceilings[s], \
                    (judging, g.ceilings, proposed, out)
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
    assert [n for n in notes if n and "probe" in n] == ["probe", "trial:probe", "trial:probe,undo"]
    assert g.probes == 1 and g.probe_blocked == [True, True, False]
    assert outs[PROBE_AFTER] == (10, 5, 2)  # the probe (after PROBE_AFTER + 1 intervals: best needs two)
    # never above the counts before it again (this path's rate does not depend on them: the guard's
    # checks cut them and keep what holds)
    assert all(o[0] <= 8 and o[1] <= 4 for o in outs[PROBE_AFTER + JUDGE:]), outs


def test_a_stage_over_provisioned_behind_a_total_limit_is_trimmed_in_the_simulator():
    """The experiments' network-bound path (10 MB/s per connection, 80 MB/s in total, the CLI's
    buffers and chunks): a policy that reached the rate with 8 connections and then asks for 16
    (each added connection looks busy: the total limit shares the rate out) is cut back to within
    one of the 8 that carry it, and the rate holds."""
    from automdt.experiments.behaviour import min_threads_95, scenario_path

    path = scenario_path("net", memory=256 * 2**20, chunk_size=4 * 2**20)
    bare, bare_threads = _sim_run((3, 16, 3), (3, 8, 3), 30, None, path)
    assert bare_threads[-1][1] == 16
    g = FloorGuard(32)
    got, threads = _sim_run((3, 16, 3), (3, 8, 3), 30, g, path)
    need = min_threads_95(path)[1]
    print(f"delivered MB/s {[round(d / MB) for d in got]}, connections {[t[1] for t in threads]}, trims {g.trims}")
    assert g.trims >= 1
    assert all(abs(t[1] - need) <= 1 for t in threads[-5:]), threads
    assert all(d >= SHORTFALL * path.achievable_bps for d in got[-5:])


def test_cuts_by_a_share_go_on_while_the_rate_holds_and_the_one_that_loses_it_goes_back():
    """Sixteen readers share an 80 MB/s total limit (10 MB/s each at most), every one busy; the
    policy then asks for 18 and the rate stays (threads added in vain). The guard cuts back to
    the 16 that held the rate, it holds; then a quarter (to 12), it holds; a quarter again (to 9),
    it holds; two more (to 7) lose an eighth of the rate: after one interval the stage goes back
    to the 9 it had (within one of the 8 that carry the rate), is capped there and not cut
    again."""
    g = FloorGuard(32)
    outs, notes = [], []
    r = 16
    for i in range(40):
        rate = min(80, 10 * r) * MB
        outs.append(g(_obs((r, 2, 2), (rate, rate, rate), (r, 1, 1)), (16, 2, 2) if i < 4 else (18, 2, 2)))
        notes.append(g.note)
        r = outs[-1][0]
    print(list(zip([o[0] for o in outs], notes)))
    assert [n for n in notes if n and n != "trial:trim"] == ["trim", "trim", "trim", "trim", "trial:trim,undo"], notes
    assert [o[0] for o, n in zip(outs, notes) if n == "trim"] == [16, 12, 9, 7]
    assert all(o == (9, 2, 2) for o in outs[notes.index("trial:trim,undo"):]), outs
    assert g.trim_blocked == [True, False, False] and g.ceilings[0] == 9


def test_a_cut_still_on_trial_when_the_tail_begins_is_undone():
    """The controller asks no policy in a run's tail: a cut decided just before it would stay
    unjudged (on the engine: 7 writers for 10 at 70 MB/s of 80 for the last 7 s). ``end_trials``
    gives the count before the cut back; with no trial running it changes nothing."""
    g = FloorGuard(32)
    r = 16
    for i in range(12):
        rate = min(80, 10 * r) * MB
        out = g(_obs((r, 2, 2), (rate, rate, rate), (r, 1, 1)), (16, 2, 2) if i < 4 else (18, 2, 2))
        r = out[0]
        if g.note == "trim":
            break
    assert g.note == "trim" and g._trimming is not None
    cut_from = g._trimming[1]
    assert g.end_trials(out) == (cut_from, 2, 2) and g.ceilings[0] == 0
    assert g.end_trials((5, 2, 2)) == (5, 2, 2)


def test_a_cut_of_readers_is_judged_by_their_own_rate_not_by_what_a_full_buffer_still_delivers():
    """Readers share a 96 MB/s total limit (10 MB/s each at most), the network delivers 80 MB/s
    from a full sender buffer whatever the readers do. The policy adds two readers in vain (18);
    the cuts to 15 (the need at the best rate per reader it saw, 6 MB/s, plus one), 12 and 9 hold
    (the readers still read 80 or more); the cut to 7 reads 70 while the buffer still delivers 80:
    it is judged by the 70 and goes back to the 9 it had."""
    g = FloorGuard(32)
    outs, notes = [], []
    r = 16
    for i in range(60):
        read = min(96, 10 * r) * MB
        outs.append(g(_obs((r, 4, 4), (read, 80 * MB, 80 * MB), (r, 2, 2)), (16, 4, 4) if i < 4 else (18, 4, 4)))
        notes.append(g.note)
        r = outs[-1][0]
    cuts = [o[0] for o, n in zip(outs, notes) if n == "trim"]
    assert cuts == [15, 12, 9, 7], (cuts, notes)
    assert notes.count("trial:trim,undo") == 1 and outs[-1][0] == 9 and g.trim_blocked[0]


def test_a_stage_at_its_cap_whose_intervals_come_in_lumps_gets_one_thread_more_once():
    """Writers at 10 MB/s each under an 80 MB/s total limit, the policy asking for 12: the cuts
    bring them to 8, where the rate holds on average but every third interval is short (chunks
    end together: 62, 90 and 80 MB/s; the cut's two intervals on trial are 90 and 80). After two
    short intervals at the cap the guard gives the writers one more (9) and keeps it; it does so
    once."""
    g = FloorGuard(32)
    w, outs = 12, []
    for i in range(60):
        rate = min(80, 10 * w) * MB
        if w == 8:
            rate = (62, 90, 80)[i % 3] * MB  # lumps at exactly the threads the rate needs
        outs.append(g(_obs((2, 2, w), (rate, rate, rate), (1, 1, w)), (2, 2, 12)))
        w = outs[-1][2]
    assert min(o[2] for o in outs) <= 8, outs  # the cuts got there
    assert g.spared[2] and all(o[2] == 9 for o in outs[-10:]), outs


# A quiet sustained run of the shipped policy on the experiments' read-bound path (2026-11-24, 22:05;
# bench_policy.py sustained, read-bound, rep 2), its first 7 intervals: per interval the counts,
# throughputs (B/s), buffer fills, interval length, busy and waiting thread-seconds, and the guard's
# note in the log.
_READ_BOUND_RUN = [
    [[4, 2, 8], [32671354, 0, 0], [0.125, 0.0], 0.5135, [2.0429, 0.1716, 0.0], [0.0001, 0.8499, 4.1037], None],
    [[32, 32, 2], [33122883, 66245766, 33122883], [0.5, 0.0625], 0.5065, [12.6382, 0.6727, 0.5506], [0.0004, 11.7405, 1.7267], None],
    [[12, 3, 2], [107150982, 98908599, 82423832], [0.25, 0.125], 1.0177, [23.7842, 2.6405, 2.0355], [0.0001, 1.0938, 0.0], "probe"],
    [[15, 3, 5], [82407385, 82407385, 107129600], [0.2656, 0.0312], 1.0179, [15.3506, 2.0454, 2.8296], [0.0, 1.0085, 2.1883], "trial:probe"],
    [[15, 3, 5], [78312668, 78312668, 78312668], [0.2656, 0.0312], 1.0176, [15.265, 2.0398, 2.0778], [0.0, 1.0132, 3.0104], "trial:probe,undo"],
    [[11, 3, 3], [78504741, 78504741, 78504741], [0.2031, 0.0312], 1.0151, [12.4203, 2.0335, 2.0669], [0.0, 1.0115, 1.0319], None],
    [[9, 2, 2], [82449934, 82449934, 78327438], [0.1719, 0.0469], 1.0174, [10.1139, 2.0348, 2.043], [0.0, 0.0068, 0.0547], "raise"],
]


def test_a_probe_undone_does_not_raise_the_best_rate():
    """The engine run above: the floor's first probe started from a 108 MB/s interval (the sender
    buffer draining; 80 achievable) and was undone. Taking the best rate "down" to the rate before
    the probe made 108 the best: every interval after was short of it, and a raise gave the readers
    the 12 that 108 would take (logged: ``raise`` at (9, 2, 2)). An undo now never raises the best:
    the replay matches the log up to that raise, which no longer comes."""
    pol, notes, outs = _replay(_READ_BOUND_RUN)
    assert notes[:6] == [row[-1] for row in _READ_BOUND_RUN[:6]]
    assert _READ_BOUND_RUN[6][-1] == "raise" and notes[6] is None, (notes, outs)
    assert pol.guard.best < 90 * MB


# A quiet sustained run of the shipped policy on the experiments' read-bound path (2026-11-24, 23:58;
# bench_policy.py sustained, read-bound, rep 1), its first 6 intervals, as above. From the 14th on,
# 2 writers wrote 70-74 MB/s of the 78-83 the network brought, the receiver buffer filling, for 12
# intervals (sustained share 0.70): within 90% of the guard's best rate, so no raise.
_WRITERS_SHORT_RUN = [
    [[4, 2, 8], [32945512, 0, 0], [0.125, 0.0], 0.5092, [2.0309, 0.1658, 0.0], [0.0004, 0.8498, 4.0722], None],
    [[32, 32, 2], [90299384, 65672279, 32836140], [0.6094, 0.0625], 0.5109, [14.8279, 0.8603, 0.5593], [0.0007, 13.8101, 1.0128], None],
    [[10, 3, 3], [79275142, 100137022, 108481774], [0.25, 0.0312], 1.0053, [23.5701, 2.4767, 2.7438], [0.0, 2.1919, 0.2498], "probe"],
    [[13, 3, 5], [79376374, 79376374, 79376374], [0.2344, 0.0312], 1.004, [13.6058, 2.0177, 2.0494], [0.0001, 0.9943, 2.9254], "trial:probe"],
    [[13, 3, 5], [79329374, 79329374, 79329374], [0.2344, 0.0312], 1.0046, [13.0606, 2.0143, 2.0419], [0.0, 0.9997, 2.9812], "trial:probe,undo"],
    [[10, 3, 3], [79278478, 79278478, 79278478], [0.1875, 0.0312], 1.0052, [10.8685, 2.0147, 2.0423], [0.0, 1.0006, 1.2064], "raise"],
]


def _replay(rows):
    """The shipped policy (with its guard) fed an interval log's rows: (policy, notes, outputs)."""
    from automdt.agents.ppo import load_policy

    pol = load_policy("default")
    pol.reset(32, 0)
    notes, outs = [], []
    for threads, tput, fill, dt, busy, wait, _ in rows:
        obs = Observation(threads=tuple(threads), throughput_bps=tuple(float(x) for x in tput), buffer_fill=tuple(fill),
                          interval_s=dt, max_threads=32, busy_s=tuple(busy), wait_s=tuple(wait))
        outs.append(pol.act(obs))
        notes.append(pol.guard.note)
    return pol, notes, outs


def test_the_run_where_two_writers_stayed_short_starts_from_the_same_fault():
    """The run above began like the one before it: a probe from a 108 MB/s burst, undone, then a
    raise against that best that gave the readers 15 and left 2 writers (logged: ``raise`` at
    (10, 3, 3)). The replay matches the log up to that raise, which no longer comes."""
    pol, notes, outs = _replay(_WRITERS_SHORT_RUN)
    assert notes[:5] == [row[-1] for row in _WRITERS_SHORT_RUN[:5]]
    assert _WRITERS_SHORT_RUN[5][-1] == "raise" and notes[5] is None, (notes, outs)


def test_a_buffer_filling_in_front_of_a_busy_stage_gives_that_stage_threads():
    """2 busy writers write 71-74 MB/s of the 80 the network brings (within 90% of the best, so no
    raise), the receiver buffer filling: after three intervals of growth the guard gives the
    writers a third ("rise"), judged like a probe; the third writer drains the buffer (95 MB/s),
    so the rise is kept, and the readers are left alone."""
    g = FloorGuard(32)
    outs, notes, fill = [], [], 0.05
    w = 2
    for i in range(16):
        write = (80 if i < 4 else 72 if w == 2 else 95 if fill > 0.06 else 80) * MB
        fill = max(0.03, min(1.0, fill + (0.02 if write < 80 * MB else -0.05)))
        obs = Observation(threads=(10, 2, w), throughput_bps=(80 * MB, 80 * MB, write), buffer_fill=(0.2, fill),
                          interval_s=1.0, busy_s=(8.0, 1.6, float(w)), wait_s=(2.0, 0.4, 0.0))
        outs.append(g(obs, (10, 2, 2)))
        notes.append(g.note)
        w = outs[-1][2]
    print(list(zip(notes, outs)))
    assert "rise" in notes and "trial:rise,undo" not in notes, notes
    assert all(o == (10, 2, 3) for o in outs[notes.index("rise"):]), outs


def test_a_rise_that_does_not_pay_is_undone_and_not_repeated_from_that_count():
    """Writers under a 70 MB/s total limit, the network bringing 80 and the receiver buffer filling:
    the rise to 3 writers brings nothing, so it is undone (back to 2), and the writers get no rise
    from 2 again, however long the buffer keeps filling."""
    g = FloorGuard(32)
    outs, notes, fill = [], [], 0.05
    w = 2
    for i in range(20):
        fill = min(1.0, fill + 0.02)
        obs = Observation(threads=(10, 2, w), throughput_bps=(80 * MB, 80 * MB, 70 * MB), buffer_fill=(0.2, fill),
                          interval_s=1.0, busy_s=(10.0, 2.0, float(w)), wait_s=(0.0, 0.0, 0.0))
        outs.append(g(obs, (10, 2, 2)))
        notes.append(g.note)
        w = outs[-1][2]
    print(list(zip(notes, [o[2] for o in outs])))
    assert notes.count("rise") == 1 and "trial:rise,undo" in notes, notes
    assert g.rise_blocked[2] == 2 and all(o[2] == 2 for o in outs[notes.index("trial:rise,undo"):])


def test_a_raise_gives_threads_only_to_a_busy_stage_that_is_short_itself():
    """Readers under a total limit read 78-80 MB/s with 9 threads, all busy; 2 writers, all busy,
    write 66 from the fifth interval on (the buffer between them absorbs the rest). The raise goes
    to the writers, which are short; the readers carry the rate and keep their 9 threads (at
    78 MB/s, 8.7 per reader, the 80 the transfer held would take 10)."""
    g = FloorGuard(32)
    outs, notes = [], []
    for i in range(8):
        write = 80 * MB if i < 4 else 66 * MB
        read = 80 * MB if i < 4 else 78 * MB
        outs.append(g(_obs((9, 2, 2), (read, 80 * MB, write), (9, 2, 2)), (9, 2, 2)))
        notes.append(g.note)
    assert "raise" in notes, notes
    raised = outs[notes.index("raise")]
    assert raised[2] == 3 and raised[0] == 9, raised


def test_readers_waiting_on_a_full_sender_buffer_are_cut_to_their_need_plus_one():
    """13 readers at 10 MB/s per busy thread behind a full sender buffer (they wait for room: 62%
    busy), the network delivering 80 MB/s: no busy stage to trim, but the readers' need at their
    rate per busy thread is 8. The guard cuts them to 9; the cut holds (9 still read 80 while
    the buffer stays full) and goes no further."""
    g = FloorGuard(32)
    outs, notes = [], []
    r = 13
    for i in range(30):
        read = min(80, 10 * r) * MB
        obs = Observation(threads=(r, 3, 3), throughput_bps=(read, 80 * MB, 80 * MB), buffer_fill=(0.99, 0.03),
                          interval_s=1.0, busy_s=(read / (10 * MB), 3.0, 2.0), wait_s=(r - read / (10 * MB), 0.0, 1.0))
        outs.append(g(obs, (13, 3, 3)))
        notes.append(g.note)
        r = outs[-1][0]
    print(list(zip(notes, [o[0] for o in outs])))
    assert notes.count("trim") == 1 and outs[notes.index("trim")][0] == 9, notes
    assert "trial:trim,undo" not in notes and outs[-1][0] == 9 and not g.cut_held[0]


def test_a_cut_that_did_not_hold_goes_back_by_what_it_lost_plus_one():
    """A cut of two threads that lost a thread's rate goes back to the count before it (its loss
    shows that count within one of the need); a deeper one goes back by the threads the lost rate
    takes at the stage's best rate per busy thread, plus one: 16 writers cut to 12 that lost 20 of
    80 MB/s at 10 per writer go back to 15, not 16. A loss under half a thread (a lump of chunks)
    takes one thread back, no more: 10 cut to 8 that lost 4 MB/s go back to 9."""
    g = FloorGuard(32)
    g.rate_ref = [0.0, 0.0, 10 * MB]
    g.judged, g.judged_stage = [0.75, 0.75], [0.75, 0.75]
    g.ceilings = [0, 0, 12]
    assert g._back_to(2, 16, 80 * MB, 80 * MB) == 15
    g.ceilings = [0, 0, 14]
    assert g._back_to(2, 16, 80 * MB, 80 * MB) == 16
    g.judged = [0.95, 0.95]  # a lump: 4 MB/s of 80, under half a writer, lost by a cut of 10 to 8
    g.ceilings = [0, 0, 8]
    assert g._back_to(2, 10, 80 * MB, 80 * MB) == 9
    g.rate_ref = [0.0, 0.0, 0.0]  # no rate known: all the way back
    g.ceilings = [0, 0, 12]
    assert g._back_to(2, 16, 80 * MB, 80 * MB) == 16


def test_while_a_cut_is_on_trial_the_other_stages_keep_their_counts():
    """One change at a time: the policy takes a writer away in the interval the floor cuts the
    readers (on the engine the two writers left then wrote 75 MB/s of 80, and the readers' cut was
    blamed and undone). While the cut is judged the writers keep the count they had; once it is
    judged the policy's choice stands again."""
    def run(fewer_from):
        g = FloorGuard(32)
        outs, notes = [], []
        r, w = 16, 3
        for i in range(14):
            rate = min(80, 10 * r) * MB
            proposed = (16, 2, 3) if i < 4 else (18, 2, 2 if i >= fewer_from else 3)
            outs.append(g(_obs((r, 2, w), (rate, rate, rate), (r, 1, w)), proposed))
            notes.append(g.note)
            r, w = outs[-1][0], outs[-1][2]
        return outs, notes

    _, notes = run(99)
    first = notes.index("trim")
    outs, notes = run(first)  # the policy asks for 2 writers from the interval of the cut on
    print(list(zip(notes, outs)))
    assert notes[first] == "trim" and notes[first + 1:first + 3] == ["trial:trim", "trial:trim"], notes
    assert outs[first][2] == 3 and outs[first + 1][2] == 3, outs  # the cut's two intervals on trial
    assert outs[first + 2][2] == 2  # judged: the policy's choice


def test_an_interval_that_delivered_nothing_raises_by_the_stage_own_rate():
    """A raise counts a stage's rate per thread no higher than what was delivered; when nothing was
    delivered (writes stalled for an interval) it takes the stage's own rate, not the whole range:
    8 readers that read 60 MB/s with nothing delivered, after 80 MB/s held, get the 11 that 7.5 MB/s
    per reader would need, never 32."""
    g = FloorGuard(32)
    for _ in range(4):
        g(_obs((8, 2, 2), (80 * MB, 80 * MB, 80 * MB), (8, 2, 2)), (8, 2, 2))
    for _ in range(2):
        out = g(_obs((8, 2, 2), (60 * MB, 0, 0), (8, 0.1, 0.1)), (8, 2, 2))
    assert g.raises == 1 and out[0] <= 11, out



def test_the_tail_keeps_the_writers_that_carried_the_rate():
    """The run's tail holds the counts (nobody asks the policy there): on the engine's write-bound
    path the policy took one of the 8 writers that carry the 80 MB/s away in the interval before
    the tail, which then held 7 at 62-79 MB/s for six intervals. The network and write stages keep
    the count they ran through the last three intervals; a ramp's passing counts are not kept."""
    g = FloorGuard(32)
    for _ in range(5):
        g(_obs((3, 3, 8), (80 * MB, 80 * MB, 80 * MB), (2, 2, 8)), (3, 3, 8))
    assert g.end_trials((3, 3, 7)) == (3, 3, 8)
    assert g.end_trials((2, 4, 9)) == (2, 4, 9)  # never fewer than the policy's choice
    ramp = FloorGuard(32)
    for threads in ((4, 2, 8), (32, 32, 2), (10, 3, 3)):
        ramp(_obs(threads, (80 * MB, 80 * MB, 80 * MB), threads), threads)
    assert ramp.end_trials((10, 3, 3)) == (10, 3, 3)


def test_a_cut_whose_last_interval_on_trial_is_short_is_undone():
    """On the engine's write-bound path a cut of 9 writers to 7 (8 carry the 80 MB/s) delivered 86
    MB/s in its first interval, the cut writers' chunks still landing, and 69 in its second: the
    mean held 95% of the rate before, the cut was kept, and a raise came two short intervals later.
    A cut whose last interval on trial is short is undone then, to one thread over the cut (its
    mean loss was under half a thread)."""
    g = FloorGuard(32)
    w, outs, notes, trial = 9, [], [], []
    for i in range(30):
        if w >= 8:
            rate = 80
        else:
            trial.append(i)
            rate = 86 if len(trial) == 1 else 69
        outs.append(g(_obs((3, 3, w), (rate * MB, rate * MB, rate * MB), (2, 2, w)), (3, 3, 9)))
        notes.append(g.note)
        w = outs[-1][2]
    print(list(zip(notes, outs)))
    assert trial, notes  # the floor cut below 8
    first = trial[0]
    assert notes[first] == "trial:trim" and notes[first + 1] == "trial:trim,undo", notes
    assert outs[first + 1][2] >= 8 and "raise" not in notes, (notes, outs)
