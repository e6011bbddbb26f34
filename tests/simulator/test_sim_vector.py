"""BatchedBufferSim == N single envs, and the SB3 VecEnv adapter's semantics."""
from __future__ import annotations

import numpy as np
import pytest

from automdt.simulator.env import BufferSimEnv
from automdt.simulator.vector import BatchedBufferSim

KW = [
    dict(),
    dict(random_profiles=True, randomize=0.25),
    dict(randomize=0.1, noise=0.2, random_start=False),
]


@pytest.mark.parametrize("kw", KW)
def test_batched_equals_single_envs(kw):
    n, seed, steps = 6, 42, 25
    batch = BatchedBufferSim(n, episode_steps=8, seed=seed, **kw)
    envs = [BufferSimEnv(episode_steps=8, **kw) for _ in range(n)]
    obs_b, _ = batch.reset()
    obs_s = np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(envs)])
    np.testing.assert_allclose(obs_b, obs_s, rtol=1e-6, atol=1e-7)
    rng = np.random.default_rng(0)
    for _ in range(steps):  # crosses several autoresets
        actions = rng.integers(0, 5, (n, 3))
        obs_b, rew_b, term_b, trunc_b, info_b = batch.step(actions)
        for i, e in enumerate(envs):
            o, r, term, trunc, info = e.step(actions[i])
            assert trunc == trunc_b[i] and term == term_b[i]
            assert r == pytest.approx(rew_b[i], rel=1e-9)
            np.testing.assert_allclose(info_b["throughput_bps"][i], info["observation"].throughput_bps, rtol=1e-9)
            if trunc:
                assert info_b["_final_obs"][i]
                np.testing.assert_allclose(info_b["final_obs"][i], o, rtol=1e-6, atol=1e-7)
                o, _ = e.reset()
            np.testing.assert_allclose(obs_b[i], o, rtol=1e-6, atol=1e-7)


def test_batched_step_threads_and_no_autoreset():
    batch = BatchedBufferSim(3, episode_steps=2, seed=0, autoreset=False)
    batch.reset()
    batch.step_threads(np.array([[1, 2, 3]] * 3))
    obs, r, term, trunc, info = batch.step_threads(np.array([[40, 0, 5]] * 3))
    assert trunc.all() and "final_obs" not in info
    assert info["threads"].tolist() == [[32, 1, 5]] * 3
    batch.step_threads(np.ones((3, 3)))  # stepping past the end draws new noise, still works


def test_steady_reward_is_the_noise_free_utility_and_changes_nothing_else():
    """reward="steady": the oracle's objective for the triple just run; same observations and infos."""
    from automdt.simulator.oracle import oracle
    from automdt.simulator.profile import Profile, capacity_array

    prof = Profile.default()
    kw = dict(random_profiles=True, randomize=0.1, episode_steps=6, seed=7)
    meas, steady = BatchedBufferSim(5, **kw), BatchedBufferSim(5, reward="steady", **kw)
    o1, _ = meas.reset()
    o2, _ = steady.reset()
    np.testing.assert_array_equal(o1, o2)
    rng = np.random.default_rng(1)
    for _ in range(14):  # crosses autoresets
        a = rng.integers(0, 5, (5, 3))
        r1 = meas.step(a)
        r2 = steady.step(a)
        np.testing.assert_array_equal(r1[0], r2[0])
        np.testing.assert_array_equal(r1[4]["utility"], r2[4]["utility"])
        c, t = steady._core, r2[4]["threads"]
        live = ~r2[3]  # rows not reset in this step still hold the profile the reward used
        caps = capacity_array(c.tpt, c.bw, t.astype(float))
        expected = caps.min(axis=1) / c.scale * np.power(1.02, -t.astype(float)).sum(axis=1)
        np.testing.assert_allclose(r2[1][live], expected[live], rtol=1e-12)
    # on one fixed noisy profile, the steady reward of the oracle's triple is the oracle's utility
    sim = BatchedBufferSim(2, profile=prof, noise=0.1, reward="steady", seed=0)
    sim.reset()
    best = oracle(prof, 1.02)
    for _ in range(3):
        _, r, *_ = sim.step_threads(np.array([best.threads] * 2))
        np.testing.assert_allclose(r, best.utility, rtol=1e-12)
    more = (best.threads[0] + 1, *best.threads[1:])
    _, r, *_ = sim.step_threads(np.array([more] * 2))
    t_more = min(capacity_array(prof.tpt_array(), prof.bandwidth_array(), np.array(more, float)))
    np.testing.assert_allclose(r, t_more / prof.achievable_bps * np.power(1.02, -np.array(more, float)).sum(),
                               rtol=1e-12)
    with pytest.raises(ValueError, match="reward"):
        BatchedBufferSim(1, reward="noisy")


def test_surplus_penalty_charges_threads_above_the_episode_oracle():
    from automdt.simulator.oracle import oracle_batch

    kw = dict(random_profiles=True, randomize=0.1, episode_steps=4, seed=3)
    plain, shaped = BatchedBufferSim(6, **kw), BatchedBufferSim(6, surplus_penalty=0.05, **kw)
    plain.reset()
    shaped.reset()
    rng = np.random.default_rng(2)
    for _ in range(10):  # crosses autoresets: the penalty uses the oracle of the episode that ran
        c = shaped._core
        best = oracle_batch(c.tpt, c.bw, c.max_threads, 1.02, c.model)[0]
        a = rng.integers(0, 5, (6, 3))
        r1, r2 = plain.step(a), shaped.step(a)
        np.testing.assert_array_equal(r1[0], r2[0])
        np.testing.assert_array_equal(r1[4]["utility"], r2[4]["utility"])
        surplus = np.maximum(r2[4]["threads"] - best, 0).sum(axis=1)
        np.testing.assert_allclose(r1[1] - r2[1], 0.05 * surplus, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="surplus_penalty"):
        BatchedBufferSim(1, surplus_penalty=-1.0)


def test_change_penalty_charges_each_stage_whose_count_changed():
    kw = dict(random_profiles=True, episode_steps=4, seed=5)
    plain, shaped = BatchedBufferSim(6, **kw), BatchedBufferSim(6, change_penalty=0.02, **kw)
    plain.reset()
    shaped.reset()
    rng = np.random.default_rng(4)
    charged = 0
    for _ in range(10):  # crosses autoresets: changes count from the triple the interval started at
        before = shaped.threads
        a = rng.integers(0, 5, (6, 3))  # index 2 is "keep", so some stages hold and some move
        r1, r2 = plain.step(a), shaped.step(a)
        np.testing.assert_array_equal(r1[0], r2[0])
        np.testing.assert_array_equal(r1[4]["utility"], r2[4]["utility"])
        changed = (r2[4]["threads"] != before).sum(axis=1)
        charged += int(changed.sum())
        np.testing.assert_allclose(r1[1] - r2[1], 0.02 * changed, rtol=1e-9, atol=1e-12)
    assert 0 < charged < 10 * 6 * 3, "the random actions should both move and hold some stages"
    with pytest.raises(ValueError, match="change_penalty"):
        BatchedBufferSim(1, change_penalty=-0.5)


def test_sb3_adapter_semantics():
    from stable_baselines3.common.vec_env import VecEnv, VecMonitor

    from automdt.simulator.sb3 import BatchedSimVecEnv

    venv = BatchedSimVecEnv(num_envs=4, episode_steps=3, noise=0.05, info_keywords=("utility",))
    assert isinstance(venv, VecEnv) and venv.num_envs == 4
    venv.seed(10)
    obs0 = venv.reset()
    ref = BufferSimEnv(episode_steps=3, noise=0.05)
    o_ref, _ = ref.reset(seed=12)  # env 2 is seeded 10 + 2
    np.testing.assert_allclose(obs0[2], o_ref, rtol=1e-6)
    hold = np.full((4, 3), 2)
    for t in range(3):
        obs, rew, dones, infos = venv.step(hold)
        o_ref, r_ref, _, trunc_ref, _ = ref.step(hold[2])
        assert rew.dtype == np.float32 and rew[2] == pytest.approx(r_ref, rel=1e-6)
        assert len(infos) == 4 and "utility" in infos[0]
        if t < 2:
            assert not dones.any() and "terminal_observation" not in infos[0]
    # SB3 semantics: done on the last step, reset in the same step, last obs in the info
    assert dones.all() and trunc_ref
    for i in range(4):
        assert infos[i]["TimeLimit.truncated"] is True
        assert infos[i]["terminal_observation"].shape == obs.shape[1:]
    np.testing.assert_allclose(infos[2]["terminal_observation"], o_ref, rtol=1e-6)
    o_new, _ = ref.reset()  # the adapter's obs is already the next episode's first one
    np.testing.assert_allclose(obs[2], o_new, rtol=1e-6)
    # wrapper compatibility
    mon = VecMonitor(BatchedSimVecEnv(num_envs=2, episode_steps=2, seed=0))
    mon.reset()
    mon.step(np.full((2, 3), 2))
    _, _, _, infos = mon.step(np.full((2, 3), 2))
    assert "episode" in infos[0] and infos[0]["episode"]["l"] == 2
    assert venv.get_attr("render_mode") == [None] * 4


def test_sb3_ppo_smoke():
    """PPO can consume the adapter (a few hundred steps, no learning asserted)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.logger import Logger

    from automdt.simulator.sb3 import BatchedSimVecEnv

    venv = BatchedSimVecEnv(num_envs=8, episode_steps=10, random_profiles=True, seed=0)
    model = PPO("MlpPolicy", venv, n_steps=8, batch_size=64, n_epochs=1, seed=0, device="cpu")
    model.set_logger(Logger(folder=None, output_formats=[]))  # the default one leaves /tmp/SB3-<time>
    model.learn(64)
    assert model.num_timesteps == 64


def test_simulator_does_not_import_torch_or_sb3():
    import subprocess
    import sys

    code = ("import sys, automdt.simulator, automdt.simulator.env, automdt.simulator.vector, "
            "automdt.simulator.profile;"
            "bad=[m for m in ('torch','stable_baselines3','automdt.transfer_engine') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
