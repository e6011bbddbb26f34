"""USL contention (optional profile fields), its fit from samples, and mid-episode profile changes."""
import numpy as np
import pytest

from automdt.simulator import BatchedBufferSim, BufferSimEnv, Profile, ProfileChanges, StageProfile
from automdt.simulator.fit import fit_profile, synthetic_samples
from automdt.simulator.oracle import evaluate_policy_in_sim, oracle, oracle_batch
from automdt.simulator.profile import ProfileError, capacity

MB = 1e6


def _contended(sigma=0.02, kappa=0.002, noise=0.05):
    return Profile(read=StageProfile(40 * MB, 200 * MB), net=StageProfile(40 * MB, 200 * MB),
                   write=StageProfile(10 * MB, 80 * MB, contention=sigma, coherency=kappa),
                   sender_buffer=64 << 20, receiver_buffer=64 << 20, max_threads=32, noise=noise)


# ------------------------------------------------------------------------------- the model
def test_contended_capacity_is_concave_and_falls_past_its_peak():
    w = _contended().write
    n = np.arange(1, 33)
    c = capacity(w, n)
    assert c[0] == pytest.approx(10 * MB)                  # one thread: TPT, no contention yet
    per_thread = c / n
    assert np.all(np.diff(per_thread) < 0)                 # every extra thread is slower
    peak = int(np.argmax(c)) + 1
    assert peak == 8 and c[-1] < 0.4 * c.max()             # falls with too many threads
    # without the optional fields it is exactly min(n * TPT, B)
    plain = StageProfile(10 * MB, 80 * MB)
    assert np.array_equal(capacity(plain, n), np.minimum(n * 10 * MB, 80 * MB))


def test_old_profiles_load_and_save_unchanged(tmp_path):
    p = Profile.default()
    d = p.to_dict()
    assert all("contention" not in st and "coherency" not in st for st in d["stages"].values())
    path = tmp_path / "old.yaml"
    p.save(path)
    q = Profile.load(path)
    assert q == p and not q.has_contention and q.contention_arrays() == (None, None)
    assert q.achievable_bps == float(q.capacities([32] * 3).min())
    # contention round-trips
    c = _contended()
    c.save(tmp_path / "c.yaml")
    assert Profile.load(tmp_path / "c.yaml").write == c.write


@pytest.mark.parametrize("field, value", [("contention", 1.0), ("contention", -0.1), ("coherency", 2.0),
                                          ("coherency", "x")])
def test_bad_contention_values_are_profile_errors(field, value):
    d = _contended().to_dict()
    d["stages"]["write"][field] = value
    with pytest.raises(ProfileError, match=f"stages.write.{field}"):
        Profile.from_dict(d)


def test_achievable_and_oracle_use_the_peak_not_max_threads():
    p = _contended()
    peak = float(capacity(p.write, 8))
    assert p.achievable_bps == pytest.approx(peak) and p.bottleneck == "write"
    o = oracle(p)
    assert o.threads == (2, 2, 8) and o.throughput_bps == pytest.approx(peak)
    sig, kap = p.contention_arrays()
    t, u, x = oracle_batch(p.tpt_array()[None], p.bandwidth_array()[None], 32, contention=sig[None],
                           coherency=kap[None])
    assert tuple(t[0]) == o.threads and u[0] == pytest.approx(o.utility) and x[0] == pytest.approx(peak)


def test_simulator_runs_the_contended_profile():
    p = _contended(noise=0.0)
    env = BufferSimEnv(p, random_start=False)
    env.reset(seed=0, options={"threads": (2, 2, 8)})
    for _ in range(5):
        _, _, _, _, info = env.step_threads((2, 2, 8))
    assert info["sim/write/throughput_bps"] == pytest.approx(capacity(p.write, 8), rel=1e-6)
    for _ in range(5):
        _, _, _, _, info = env.step_threads((2, 2, 32))
    assert info["sim/write/throughput_bps"] == pytest.approx(capacity(p.write, 32), rel=1e-6)
    assert env.episode_profile.write.coherency == pytest.approx(0.002)


# ------------------------------------------------------------------------------- the fit
@pytest.mark.parametrize("seed", range(4))
def test_fit_finds_contention_and_its_peak_in_synthetic_samples(seed):
    truth = _contended()
    s = synthetic_samples(truth, 60, np.random.default_rng(seed))
    f = fit_profile(s, interval_s=1.0, buffers=(64 << 20, 64 << 20), max_threads=32)
    assert f.write.has_contention and not f.read.has_contention and not f.net.has_contention
    ev = f.meta["fit"]["stages"]["write"]["contention"]
    assert abs(ev["peak_threads"] - 8) <= 1 and ev["decline_at_max_sampled"] > 0.3
    assert f.achievable_bps == pytest.approx(truth.achievable_bps, rel=0.06)
    assert abs(oracle(f).threads[2] - 8) <= 1
    # the fitted model reproduces the true capacities where the samples are
    n = np.arange(1, 33)
    assert np.max(np.abs(capacity(f.write, n) / capacity(truth.write, n) - 1)) < 0.15


def test_fit_adds_no_contention_where_the_samples_show_none():
    truth = _contended().replace(write=StageProfile(10 * MB, 80 * MB))
    for seed in range(20):
        s = synthetic_samples(truth, 60, np.random.default_rng(seed))
        f = fit_profile(s, interval_s=1.0, buffers=(64 << 20, 64 << 20), max_threads=32)
        assert not f.has_contention, (seed, f.to_dict(include_samples=False)["stages"])
        assert "contention" not in f.meta["fit"]["stages"]["write"]


# ------------------------------------------------------------------------------- changing episodes
def _steps(env_or_batch, n, threads):
    out = []
    for _ in range(n):
        out.append(env_or_batch.step_threads(threads))
    return out


def test_changes_off_leave_the_seeded_stream_unchanged_and_on_keep_the_episode_start():
    p = _contended().replace(write=StageProfile(10 * MB, 80 * MB))
    a, b = BufferSimEnv(p), BufferSimEnv(p, changes=ProfileChanges(probability=1.0))
    oa, _ = a.reset(seed=3)
    ob, _ = b.reset(seed=3)
    # same profile draw, start state and first interval: the change uniforms come after the block
    assert np.array_equal(oa, ob)
    ra = [a.step_threads((4, 4, 4))[0] for _ in range(3)]
    rb = [b.step_threads((4, 4, 4))[0] for _ in range(3)]
    assert all(np.array_equal(x, y) for x, y in zip(ra, rb))  # changes fall at >= 15% of 30 steps


def test_profile_changes_happen_at_drawn_steps_and_move_the_oracle():
    p = _contended().replace(write=StageProfile(10 * MB, 80 * MB))
    ch = ProfileChanges(probability=1.0, max_changes=2, factor_range=(0.2, 5.0))
    env = BufferSimEnv(p, episode_steps=30, changes=ch, random_start=False)
    moved = 0
    for seed in range(10):
        env.reset(seed=seed)
        before = env.episode_oracle().threads
        scale0 = env.reward_scale_bps
        counts = [env.step_threads((4, 4, 4))[4]["sim/profile_changes"] for _ in range(30)]
        assert counts[0] == 0 and 1 <= counts[-1] <= 2 and counts == sorted(counts)
        first = counts.index(1)
        assert 4 <= first <= 26  # inside the window (15%-85% of 30 steps)
        after = env.episode_oracle().threads
        moved += after != before
        assert env.reward_scale_bps != scale0
    assert moved >= 8


def test_link_only_changes_move_only_the_network_bandwidth():
    p = Profile.default()
    env = BufferSimEnv(p, changes=ProfileChanges(probability=1.0, link_only=True, factor_range=(0.5, 0.5)))
    env.reset(seed=1)
    for _ in range(30):
        env.step_threads((4, 4, 4))
    q = env.episode_profile
    assert q.read == p.read and q.write == p.write
    assert q.net.tpt == p.net.tpt and q.net.bandwidth == pytest.approx(0.5 * p.net.bandwidth)


def test_batched_changes_match_the_single_env_and_random_profiles_redraw():
    ch = ProfileChanges(probability=0.7)
    vec = BatchedBufferSim(4, random_profiles=True, changes=ch, seed=11)
    vec.reset(seed=11)
    singles = [BufferSimEnv(random_profiles=True, changes=ch) for _ in range(4)]
    for i, e in enumerate(singles):
        e.reset(seed=11 + i)
    rng = np.random.default_rng(0)
    for _ in range(40):
        t = rng.integers(1, 33, size=(4, 3))
        obs, rew, _, _, infos = vec.step_threads(t)
        for i, e in enumerate(singles):
            o, r, _, trunc, info = e.step_threads(tuple(t[i]))
            if trunc:
                e.reset()
                o = e._core.obs[0]
            assert np.allclose(obs[i], o) and rew[i] == pytest.approx(r)
    assert infos["profile_changes"].shape == (4,)


def test_a_changing_training_env_keeps_the_surplus_oracle_current():
    ch = ProfileChanges(probability=1.0, max_changes=1)
    vec = BatchedBufferSim(8, profile=Profile.default(), changes=ch, surplus_penalty=0.1, random_start=False)
    vec.reset(seed=0)
    for _ in range(29):
        vec.step_threads(np.full((8, 3), 4))
        t_now = vec.episode_oracle()[0]
        assert np.array_equal(vec._oracle_threads, t_now)


def test_policies_evaluate_on_a_contended_profile():
    from automdt.agents.registry import make_policy

    p = _contended()
    traj = evaluate_policy_in_sim(make_policy("static:2,2,32", 32), p, steps=20, seed=0)
    good = evaluate_policy_in_sim(make_policy("static:2,2,8", 32), p, steps=20, seed=0)
    assert good.mean_throughput_bps > 2 * traj.mean_throughput_bps
    assert good.fraction_of_oracle > 0.95
