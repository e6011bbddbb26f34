"""Hand-computed buffer dynamics for a read-, a network- and a write-bound path, and the oracle.

Units: MB = 1e6 bytes, interval 1 s, no noise, so bytes moved in an interval = MB/s.
Each sub-step (here one per interval) computes, in order:
    x = min(c_n, S + c_r, (R_max - R) + c_w);  r = min(c_r, (S_max - S) + x);  w = min(c_w, R + x)
    S += r - x;  R += x - w
"""
from __future__ import annotations

import numpy as np
import pytest

from automdt.simulator.dynamics import run_interval
from automdt.simulator.env import BufferSimEnv
from automdt.simulator.oracle import evaluate_policy_in_sim, oracle
from automdt.simulator.profile import Profile, StageProfile, capacity

MB = 1e6


def prof(read, net, write, s_mb, r_mb, **kw):
    return Profile(read=StageProfile(read[0] * MB, read[1] * MB), net=StageProfile(net[0] * MB, net[1] * MB),
                   write=StageProfile(write[0] * MB, write[1] * MB), sender_buffer=int(s_mb * MB),
                   receiver_buffer=int(r_mb * MB), **kw)


def run(profile, start_threads, start_fill, steps_threads):
    """Return [(throughputs MB/s, fills)] for the reset interval and each step."""
    env = BufferSimEnv(profile, noise=0.0, random_start=False, episode_steps=50)
    _, info = env.reset(seed=0, options={"threads": start_threads, "buffer_fill": start_fill})
    out = [info]
    for t in steps_threads:
        out.append(env.step_threads(t)[4])
    return [(tuple(round(v / MB, 6) for v in i["observation"].throughput_bps),
             tuple(round(f, 6) for f in i["observation"].buffer_fill)) for i in out]


# Read-bound: TPT_r = 10 MB/s, every B = 100 MB/s, net/write 50 MB/s per thread, buffers 100 MB.
READ_BOUND = prof((10, 100), (50, 100), (50, 100), 100, 100)
# Network-bound: read/write 100 MB/s per thread (B 1000), net 25 MB/s per thread (B 100), buffers 50 MB.
NET_BOUND = prof((100, 1000), (25, 100), (100, 1000), 50, 50)
# Write-bound: read/net 100 MB/s per thread (B 1000), write 20 MB/s per thread but B_w = 60, buffers 100 MB.
WRITE_BOUND = prof((100, 1000), (100, 1000), (20, 60), 100, 100)


def test_read_bound_sender_buffer_drains():
    # threads (2,2,2): c = (20, 100, 100). Start with S full (100 MB), R empty.
    res = run(READ_BOUND, (2, 2, 2), (1.0, 0.0), [(2, 2, 2)] * 3)
    # reset interval: x = min(100, 100+20, 100+100) = 100; r = min(20, 0+100) = 20; w = min(100, 0+100) = 100
    #                 S = 100+20-100 = 20, R = 0
    assert res[0] == ((20, 100, 100), (0.2, 0.0))
    # step 1: x = min(100, 20+20, 200) = 40; r = 20; w = 40; S = 0
    assert res[1] == ((20, 40, 40), (0.0, 0.0))
    # then the read stage sets the pace: 20 MB/s everywhere, buffers stay empty
    assert res[2] == res[3] == ((20, 20, 20), (0.0, 0.0))


def test_network_bound_readers_block_on_full_sender_buffer():
    # threads (2,2,1): c = (200, 50, 100); buffers 50 MB, empty.
    res = run(NET_BOUND, (2, 2, 1), (0.0, 0.0), [(2, 2, 1)] * 2 + [(2, 4, 1)])
    # x = min(50, 0+200, 50+100) = 50; r = min(200, 50-0+50) = 100; w = min(100, 0+50) = 50
    # S = 0+100-50 = 50 (full), R = 0
    assert res[0] == ((100, 50, 50), (1.0, 0.0))
    # S full: x = min(50, 50+200, 150) = 50; r = min(200, 0+50) = 50 (readers blocked); w = 50
    assert res[1] == res[2] == ((50, 50, 50), (1.0, 0.0))
    # 4 net threads: c_n = min(100, 100) = 100; x = min(100, 50+200, 50+100) = 100;
    # r = min(200, 0+100) = 100; w = min(100, 0+100) = 100 -> the full bottleneck rate
    assert res[3] == ((100, 100, 100), (1.0, 0.0))


def test_write_bound_receiver_fills_then_everything_blocks():
    # threads (1,1,4): c = (100, 100, min(80, 60) = 60); buffers 100 MB, empty.
    res = run(WRITE_BOUND, (1, 1, 4), (0.0, 0.0), [(1, 1, 4)] * 5)
    # x = min(100, 0+100, 100+60) = 100; r = min(100, 100+100) = 100; w = min(60, 0+100) = 60; R = 40
    assert res[0] == ((100, 100, 60), (0.0, 0.4))
    # x = min(100, 100, 60+60) = 100; r = 100; w = 60; R = 80
    assert res[1] == ((100, 100, 60), (0.0, 0.8))
    # x = min(100, 100, 20+60) = 80; r = min(100, 100+80) = 100; S = 20; w = 60; R = 100 (full)
    assert res[2] == ((100, 80, 60), (0.2, 1.0))
    # x = min(100, 20+100, 0+60) = 60; r = min(100, 80+60) = 100; S = 60; w = 60
    assert res[3] == ((100, 60, 60), (0.6, 1.0))
    # x = 60; r = min(100, 40+60) = 100; S = 100 (full)
    assert res[4] == ((100, 60, 60), (1.0, 1.0))
    # both buffers full: r = min(100, 0+60) = 60 -> every stage runs at the write bandwidth
    assert res[5] == ((60, 60, 60), (1.0, 1.0))


def test_oracle_on_hand_profiles():
    # n_i* = ceil(min B / TPT_i): read-bound 100/10 = 10, 100/50 = 2, 2
    assert oracle(READ_BOUND).threads == (10, 2, 2)
    # network-bound: 100/100 = 1, 100/25 = 4, 1
    assert oracle(NET_BOUND).threads == (1, 4, 1)
    # write-bound: min B = 60: 60/100 -> 1, 1, 60/20 = 3
    r = oracle(WRITE_BOUND)
    assert r.threads == (1, 1, 3) and r.throughput_bps == pytest.approx(60 * MB)
    # utility: T/scale = 1; 1.02**-1 + 1.02**-1 + 1.02**-3 = 0.980392 * 2 + 0.942322 = 2.903106
    assert r.utility == pytest.approx(2.903106, abs=1e-6)
    # U at (10,2,2): 1.02**-10 + 2 * 1.02**-2 = 0.820348 + 1.922338 = 2.742686
    assert oracle(READ_BOUND).utility == pytest.approx(2.742686, abs=1e-6)


def test_oracle_matches_closed_form_on_random_profiles():
    """With k close to 1 the optimum is n_i* = ceil(min B / TPT_i) (DESIGN.md), up to ties."""
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(20):
        p = Profile.random(rng)
        r = oracle(p, k=1.02)
        n_star = np.minimum(np.ceil(p.achievable_bps / p.tpt_array() - 1e-9), p.max_threads)
        u_star = p.steady_throughput(n_star) / p.achievable_bps * np.sum(1.02 ** -n_star)
        assert r.utility >= u_star - 1e-12  # exhaustive search is never worse
        hits += np.abs(np.array(r.threads) - n_star).max() <= 1
    assert hits >= 15  # "ceil-ish": usually within one thread per stage


def test_evaluate_policy_in_sim_with_oracle_policy():
    class Fixed:
        name = "fixed"

        def reset(self, max_threads, seed=None):
            return (1, 1, 1)

        def act(self, obs):
            return (10, 2, 2)

    tr = evaluate_policy_in_sim(Fixed(), READ_BOUND, steps=12, seed=0)
    assert tr.settled_threads == (10, 2, 2)
    assert tr.fraction_of_oracle == pytest.approx(1.0)
    assert tr.threads.shape == (12, 3) and tr.utilities.shape == (12,)
    tr2 = evaluate_policy_in_sim(lambda obs: (32, 32, 32), READ_BOUND, steps=12)
    assert tr2.fraction_of_oracle < 0.7  # 32 threads each: 3 * 1.02**-32 / 2.74 = 0.58


def test_substeps_do_not_change_results():
    rng = np.random.default_rng(1)
    n = 20000
    smax, rmax = rng.uniform(1, 10, n), rng.uniform(1, 10, n)
    S, R = smax * rng.random(n), rmax * rng.random(n)
    cap = rng.uniform(0, 20, (n, 3))
    one = run_interval(S, R, cap, 1.0, smax, rmax, 1)
    many = run_interval(S, R, cap, 1.0, smax, rmax, 50)
    for a, b in zip(one, many):
        np.testing.assert_allclose(a, b, atol=1e-9)


def test_conservation_and_bounds_under_noise():
    env = BufferSimEnv(Profile.random(np.random.default_rng(3)), noise=0.3, randomize=0.3, episode_steps=200)
    _, info = env.reset(seed=5)
    c = env._core
    level = c.S[0] + c.R[0]
    rng = np.random.default_rng(0)
    for _ in range(200):
        _, _, _, _, info = env.step(rng.integers(0, 5, 3))
        r, x, w = (info[f"sim/{s}/throughput_bps"] * env.profile.interval_s for s in ("read", "net", "write"))
        new = c.S[0] + c.R[0]
        assert new == pytest.approx(level + r - w, rel=1e-9, abs=1e-3)  # bytes are conserved
        level = new
        assert 0 <= info["sim/buffer/sender_fill"] <= 1 and 0 <= info["sim/buffer/receiver_fill"] <= 1
        for s in ("read", "net", "write"):
            assert info[f"sim/{s}/throughput_bps"] <= info[f"sim/{s}/capacity_bps"] * (1 + 1e-9)


def test_noise_has_the_requested_relative_std():
    env = BufferSimEnv(READ_BOUND, noise=0.1, episode_steps=2000, random_start=False)
    env.reset(seed=0, options={"threads": (2, 2, 2)})
    caps = np.array([env.step_threads((2, 2, 2))[4]["sim/read/capacity_bps"] for _ in range(2000)])
    assert np.std(caps / (20 * MB)) == pytest.approx(0.1, rel=0.1)
    assert np.mean(caps / (20 * MB)) == pytest.approx(1.0, abs=0.01)


def test_concave_capacity_model():
    st = StageProfile(tpt=10 * MB, bandwidth=100 * MB)
    assert capacity(st, 5) == 50 * MB and capacity(st, 20) == 100 * MB
    # B n / (n + B/TPT) = 100 * 10 / (10 + 10) = 50 MB/s at n = 10
    assert capacity(st, 10, "concave") == pytest.approx(50 * MB)
    p = READ_BOUND.replace(capacity_model="concave")
    assert oracle(p).threads[0] > 10  # the concave ramp wants more read threads
    env = BufferSimEnv(p, noise=0.0, random_start=False)
    _, info = env.reset(seed=0, options={"threads": (10, 2, 2)})
    assert info["sim/read/throughput_bps"] == pytest.approx(50 * MB)


def test_oracle_batch_equals_exhaustive_oracle():
    from automdt.simulator.oracle import oracle_batch

    rng = np.random.default_rng(7)
    ps = [Profile.random(rng) for _ in range(100)] + [READ_BOUND, NET_BOUND, WRITE_BOUND]
    n, u, t = oracle_batch(np.array([p.tpt_array() for p in ps]), np.array([p.bandwidth_array() for p in ps]), 32)
    for i, p in enumerate(ps):
        r = oracle(p)
        assert tuple(n[i]) == r.threads and u[i] == pytest.approx(r.utility, rel=1e-12)
        assert t[i] == pytest.approx(r.throughput_bps, rel=1e-12)


def test_episode_oracles_of_single_and_batched_envs_agree():
    from automdt.simulator.vector import BatchedBufferSim

    batch = BatchedBufferSim(4, random_profiles=True, randomize=0.2, seed=3)
    batch.reset()
    n, u, _ = batch.episode_oracle()
    for i in range(4):
        env = BufferSimEnv(random_profiles=True, randomize=0.2)
        env.reset(seed=3 + i)
        r = env.episode_oracle()
        assert tuple(n[i]) == r.threads and u[i] == pytest.approx(r.utility, rel=1e-9)
        assert env.reward_scale_bps == pytest.approx(env.episode_profile.achievable_bps, rel=1e-12)


def test_thread_efficiency_feature_by_hand():
    # READ_BOUND (TPT_r 10 MB/s, B_r 100 MB/s): 2 read threads move 20 MB/s = 10 MB/s per thread;
    # 20 read threads move min(200, 100) = 100 MB/s = 5 MB/s per thread -> efficiency 5/10 = 0.5.
    env = BufferSimEnv(READ_BOUND, noise=0.0, random_start=False)
    obs, _ = env.reset(seed=0, options={"threads": (2, 2, 2)})
    assert obs[14:17].tolist() == [1.0, 1.0, 1.0]
    obs, _, _, _, _ = env.step_threads((20, 2, 2))
    # net/write: 2 threads each carry 100 MB/s now, 50 MB/s per thread (best so far) -> 1.0
    assert obs[14:17].tolist() == pytest.approx([0.5, 1.0, 1.0])
    assert obs[3:6].tolist() == pytest.approx([1.0, 1.0, 1.0])  # every stage at the running max
    assert obs[17:20].tolist() == pytest.approx([1.0, 1.0, 1.0])  # all busy: read at its bandwidth
    obs, _, _, _, _ = env.step_threads((10, 4, 4))
    # read 10 MB/s per thread again (1.0). Net/write: 4 threads carry 100 MB/s at 50 MB/s each, so
    # they work half the time (utilization 0.5) and a working thread is as fast as ever (1.0).
    assert obs[14:17].tolist() == pytest.approx([1.0, 1.0, 1.0])
    assert obs[17:20].tolist() == pytest.approx([1.0, 0.5, 0.5])


# ---------------------------------------------------------------------------------------------
# The engine's chunk effects (chunk_bytes) and busy/wait thread-seconds
# ---------------------------------------------------------------------------------------------
def _chunked(profile, chunk_mb, threads, fill=(0.0, 0.0), steps=(), seed=0):
    env = BufferSimEnv(profile, noise=0.0, random_start=False, episode_steps=60, chunk_bytes=chunk_mb * MB)
    _, info = env.reset(seed=seed, options={"threads": threads, "buffer_fill": fill})
    out = [info]
    for t in steps:
        out.append(env.step_threads(t)[4])
    return env, out


def test_busy_seconds_by_hand():
    from automdt.simulator.dynamics import busy_seconds

    dt = 1.0
    threads = np.array([[8, 5, 2]])
    tpt = np.array([[10, 40, 40]]) * MB
    bw = np.array([[1e4, 80, 1e4]]) * MB
    cap = np.minimum(threads * tpt, bw)
    # read-bound: reads at their 80 MB/s (busy), the network below its 80 MB/s link at 40 per
    # thread (80/40 = 2 of 5 threads' time), writers at 80 of 2 x 40 (busy)
    moved = np.array([[80, 80, 80]]) * MB
    busy = busy_seconds(moved, cap, threads, tpt, bw, dt, np.array([[True, False, False]]))
    assert busy[0].tolist() == pytest.approx([8.0, 2.0, 2.0])
    # the same flow with data queued for the network: a stage held at its bandwidth is all busy
    busy = busy_seconds(moved, cap, threads, tpt, bw, dt, np.array([[True, True, False]]))
    assert busy[0].tolist() == pytest.approx([8.0, 5.0, 2.0])


def test_chunk_model_conserves_bytes_and_shows_the_cut_tail():
    # read 10 MB/s per thread (B 1000), net 40/80, write 40/1000, buffers 256 MB, 4 MB chunks
    p = prof((10, 1000), (40, 80), (40, 1000), 256, 256)
    sched = [(16, 4, 3), (16, 4, 3), (8, 4, 3), (8, 4, 3), (8, 4, 3)]
    env, infos = _chunked(p, 4, sched[0], steps=sched[1:])
    counted = np.array([i["observation"].throughput_bps for i in infos]).sum(axis=0)
    moved = np.array([[i[f"sim/{s}/moved_bps"] for s in ("read", "net", "write")] for i in infos]).sum(axis=0)
    # every byte moved is counted once: what is not counted yet is in flight at the end
    assert moved - counted == pytest.approx(env._core.inflight[0], abs=1.0)
    # the cut 16 -> 8 readers: the eight that leave finish their chunk, so the interval counts more
    # than eight readers move (10 MB/s each) and their busy time is in it
    cut = infos[2]["observation"]
    assert cut.throughput_bps[0] > 8 * 10 * MB * 1.1
    assert cut.busy_s[0] > 8.0
    # the sender buffer reports the slots busy readers and senders hold (16 + 4 of 4 MB)
    fill = infos[0]["observation"].buffer_fill[0]
    queued = infos[0]["sim/buffer/sender_bytes"] / (256 * MB)
    assert fill == pytest.approx(queued + 20 * 4 / 256, abs=0.01)


def test_chunk_model_leaves_the_fluid_model_alone():
    p = prof((10, 1000), (40, 80), (40, 1000), 256, 256)
    a = BufferSimEnv(p, noise=0.05, random_start=False, episode_steps=10)
    b = BufferSimEnv(p, noise=0.05, random_start=False, episode_steps=10, chunk_bytes=0.0)
    oa, _ = a.reset(seed=3)
    ob, _ = b.reset(seed=3)
    assert np.array_equal(oa, ob)
    for t in [(4, 2, 2), (16, 4, 3), (5, 5, 2)]:
        assert np.array_equal(a.step_threads(t)[0], b.step_threads(t)[0])


def test_mixed_starts():
    from automdt.simulator.dynamics import N_PARAM_UNIFORMS, U_LAYOUT
    from automdt.simulator.vector import BatchedBufferSim

    core = BatchedBufferSim(1, random_profiles=True, seed=0, start_mix=(0.5, 0.2, 0.3))._core
    u = np.random.default_rng(0).random((4000, N_PARAM_UNIFORMS))
    threads, fill = core._mixed_start(u)
    mode = u[:, U_LAYOUT["start_mode"]][:, 0]
    cold, rand, drain = mode < 0.5, (mode >= 0.5) & (mode < 0.7), mode >= 0.7
    assert (threads[cold] <= 16).all() and (threads[cold] >= 1).all() and (fill[cold] == 0).all()
    assert 0.3 < np.mean(threads[cold] >= 4) < 0.7  # log-uniform over 1..16
    assert threads[rand].max() == 32 and (fill[rand] >= 0).all() and (fill[rand] <= 1).all()
    assert (fill[drain, 0] >= 0.7).all()  # a full sender buffer the threads may drain
    assert threads[drain].max() == 32


def test_alternating_counts_cannot_move_more_than_a_stage_can():
    """Threads that leave finish the chunk they hold within the stage's bandwidth: a policy that
    lowers and raises a count every interval moves no more than the bandwidth on average."""
    from automdt.simulator.env import BufferSimEnv
    from automdt.simulator.profile import Profile, StageProfile

    mb = 1e6
    prof = Profile(read=StageProfile(5 * mb, 48 * mb), net=StageProfile(25 * mb, 800 * mb),
                   write=StageProfile(25 * mb, 800 * mb), sender_buffer=128 << 20, receiver_buffer=128 << 20,
                   interval_s=1.0, max_threads=32, noise=0.0)
    env = BufferSimEnv(prof, episode_steps=40, random_start=False, chunk_bytes=4 << 20)
    _, info = env.reset(seed=0, options={"threads": (10, 2, 2)})
    written = 0.0
    for t in range(40):
        _, _, _, _, info = env.step_threads((32, 7, 2) if t % 2 == 0 else (10, 7, 8))
        written += info["sim/write/moved_bps"]
    assert written / 40 <= 1.05 * prof.read.bandwidth  # (before: twice the bandwidth)


@pytest.mark.parametrize("bad", [{"k": 0.0}, {"episode_steps": 0}, {"randomize": 1.0}, {"noise": 0.9},
                                 {"substeps": 0}, {"chunk_bytes": -1.0}, {"chunk_range": (2.0, 1.0)}])
def test_bad_settings_raise_a_value_error_even_under_python_O(bad):
    """Settings are checked with exceptions, not asserts (which ``python -O`` strips)."""
    import subprocess
    import sys

    with pytest.raises(ValueError):
        BufferSimEnv(Profile.default(), **bad)
    code = f"from automdt.simulator.env import BufferSimEnv\nBufferSimEnv(**{bad!r})"
    p = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "ValueError" in p.stderr
