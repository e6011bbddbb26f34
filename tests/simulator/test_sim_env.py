"""BufferSimEnv: Gymnasium/SB3 checks, determinism, the policy-facing contract."""
from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest

from automdt.simulator.env import (
    ENV_ID,
    OBS_DIM,
    BufferSimEnv,
    ObservationEncoder,
    action_to_threads,
    make_action_space,
    utility,
)
from automdt.simulator.profile import Profile, StageProfile

SEED = 1234


def test_gymnasium_check_env():
    from gymnasium.utils.env_checker import check_env

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no spec" / render-mode notes only
        check_env(BufferSimEnv(noise=0.05, randomize=0.1))
        check_env(gym.make(ENV_ID).unwrapped)


def test_sb3_check_env():
    from stable_baselines3.common.env_checker import check_env

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # SB3 warns about un-normalised spaces: there must be none
        check_env(BufferSimEnv(random_profiles=True), warn=True)


def test_registered_make_and_make_vec():
    env = gym.make(ENV_ID, episode_steps=5)
    obs, info = env.reset(seed=0)
    assert obs.shape == (OBS_DIM,) and obs.dtype == np.float32
    venv = gym.make_vec(ENV_ID, num_envs=3, vectorization_mode="vector_entry_point", episode_steps=5)
    obs, _ = venv.reset(seed=0)
    assert obs.shape == (3, OBS_DIM)


def _rollout(env, seed, n=70):
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    out = [obs]
    rewards = []
    for _ in range(n):
        obs, r, term, trunc, info = env.step(rng.integers(0, 5, 3))
        out.append(obs)
        rewards.append(r)
        if term or trunc:
            obs, info = env.reset()
            out.append(obs)
    return np.array(out), np.array(rewards)


@pytest.mark.parametrize("kw", [dict(), dict(random_profiles=True, randomize=0.3), dict(noise=0.2)])
def test_two_seeded_rollouts_identical(kw):
    o1, r1 = _rollout(BufferSimEnv(episode_steps=20, **kw), SEED)
    o2, r2 = _rollout(BufferSimEnv(episode_steps=20, **kw), SEED)
    assert np.array_equal(o1, o2) and np.array_equal(r1, r2)
    o3, _ = _rollout(BufferSimEnv(episode_steps=20, **kw), SEED + 1)
    assert not np.array_equal(o1, o3)


def test_step_head_mapping():
    m = 32
    assert action_to_threads([4, 4, 4], (1, 1, 1), m, "step") == (2, 2, 2)
    assert action_to_threads([0, 1, 2], (7, 7, 7), m, "step") == (3, 6, 7)
    assert action_to_threads([3, 4, 0], (32, 20, 1), m, "step") == (32, 32, 1)  # clipped to [1, max]
    assert action_to_threads([1, 0, 2], (1, 1, 1), m, "step") == (1, 1, 1)
    n, steps = (1, 1, 1), 0
    while n != (32, 32, 32):
        n, steps = action_to_threads([4, 4, 4], n, m, "step"), steps + 1
    assert steps == 5  # 1 -> 32 by doubling
    assert make_action_space("step").nvec.tolist() == [5, 5, 5]


def test_absolute_head_sets_any_count_in_one_step():
    m = 32
    # 0 holds, 1 and 2 take one off / add one, 2 + k sets k threads
    h = "absolute"
    assert action_to_threads([34, 10, 4], (1, 1, 1), m, h) == (32, 8, 2)
    assert action_to_threads([0, 0, 7], (7, 9, 1), m, h) == (7, 9, 5)
    assert action_to_threads([1, 2, 0], (7, 9, 1), m, h) == (6, 10, 1)
    assert action_to_threads([1, 2, 0], (1, 32, 1), m, h) == (1, 32, 1)  # clipped to [1, max]
    assert action_to_threads([22, 0, 5], (1, 40, 1), 16, h, action_max=32) == (16, 16, 3)
    assert make_action_space(h).nvec.tolist() == [35, 35, 35]
    assert make_action_space(h, 8).nvec.tolist() == [11, 11, 11]
    with pytest.raises(ValueError, match="0..34"):
        action_to_threads([35, 0, 0], (1, 1, 1), m, h)
    with pytest.raises(ValueError, match="unknown action head"):
        action_to_threads([1, 1, 1], (1, 1, 1), m, "jump")
    env = BufferSimEnv(random_start=False, action_head=h)
    env.reset(seed=0)
    env.step(np.array([18, 0, 6]))
    assert env.threads == (16, 1, 4)


def test_utility_formula():
    # 100 MB/s on every stage with (1, 2, 3) threads, scale 100 MB/s, k = 1.02:
    # 1/1.02 + 1/1.02**2 + 1/1.02**3 = 0.98039 + 0.96117 + 0.94232 = 2.88388
    u = utility([100e6, 100e6, 100e6], [1, 2, 3], 1.02, 100e6)
    assert u == pytest.approx(2.883883, abs=1e-6)
    batch = utility(np.full((2, 3), 50e6), np.ones((2, 3)), 1.02, np.array([100e6, 50e6]))
    assert batch == pytest.approx([1.5 / 1.02, 3 / 1.02])


def test_encoder_matches_env_observations():
    """The live controller's path (raw Observation -> ObservationEncoder) reproduces the env obs."""
    env = BufferSimEnv(random_profiles=True, noise=0.1, episode_steps=15)
    enc = ObservationEncoder(env.max_threads)
    rng = np.random.default_rng(0)
    for ep in range(3):
        obs, info = env.reset(seed=ep)
        enc.reset()
        assert np.array_equal(enc.encode(info["observation"]), obs)
        for _ in range(15):
            obs, _, _, _, info = env.step(rng.integers(0, 5, 3))
            assert np.array_equal(enc.encode(info["observation"]), obs)
            assert env.observation_space.contains(obs)


def test_encoder_is_scale_free():
    """A path 100x faster (same shape) gives the same encoded observations."""
    def prof(scale):
        return Profile(read=StageProfile(40e6 * scale, 400e6 * scale), net=StageProfile(120e6 * scale, 400e6 * scale),
                       write=StageProfile(120e6 * scale, 400e6 * scale), sender_buffer=int(256e6 * scale),
                       receiver_buffer=int(256e6 * scale), noise=0.05)
    o1, r1 = _rollout(BufferSimEnv(prof(1.0)), 7, 30)
    o2, r2 = _rollout(BufferSimEnv(prof(100.0)), 7, 30)
    assert np.allclose(o1, o2, atol=1e-6) and np.allclose(r1, r2)


def test_info_keys_and_observation():
    env = BufferSimEnv(episode_steps=3)
    _, info = env.reset(seed=0)
    for key in ("sim/read/throughput_bps", "sim/net/throughput_bps", "sim/write/throughput_bps",
                "sim/read/threads", "sim/buffer/sender_fill", "sim/buffer/receiver_fill", "sim/utility",
                "sim/reward_scale_bps"):
        assert key in info
    o = info["observation"]
    assert o.throughput_bps[0] == info["sim/read/throughput_bps"]
    assert o.max_threads == 32 and o.buffer_bytes == (256 * 2**20, 256 * 2**20)
    _, r, term, trunc, info = env.step(np.array([2, 2, 2]))
    assert r == pytest.approx(info["sim/utility"]) and not term and not trunc
    env.step(np.array([2, 2, 2]))
    assert env.step(np.array([2, 2, 2]))[3]  # truncated after episode_steps


def test_bound_penalty_and_options():
    env = BufferSimEnv(bound_penalty=0.5, random_start=True)
    _, info = env.reset(seed=0, options={"threads": (32, 1, 32), "buffer_fill": (0.0, 0.0)})
    assert env.threads == (32, 1, 32)
    _, r, _, _, info = env.step(np.array([0, 0, 0]))  # hold
    assert r == pytest.approx(info["sim/utility"] - 1.0)


def test_target_head_anchors_on_what_the_stages_measured():
    from automdt.simulator.dynamics import OBS_DIM, OBS_NAMES, TARGET_NAMES, need_from_encoding

    assert make_action_space().nvec.tolist() == [len(TARGET_NAMES)] * 3 == [11, 11, 11]  # the default head
    # 16 readers at half utilization (a full sender buffer), reading 160 while 80 is delivered;
    # 5 connections at a link two of them fill (efficiency 0.4); 2 busy writers
    enc = np.zeros(OBS_DIM, dtype=np.float32)
    col = OBS_NAMES.index
    for i, st in enumerate(("read", "net", "write")):
        enc[col(f"{st}/threads")] = (16, 5, 2)[i] / 32
        enc[col(f"{st}/utilization")] = (0.5, 1.0, 1.0)[i]
        enc[col(f"{st}/thread_efficiency")] = (1.0, 0.4, 1.0)[i]
        enc[col(f"{st}/throughput")] = (1.0, 0.5, 0.5)[i]
    need = need_from_encoding(enc, 32)[0]
    # need, then carry: readers carry the network's 80 (4 of them), the network the writers' 80,
    # the writers the network's 80
    assert need.tolist() == pytest.approx([8.0, 2.0, 2.0, 4.0, 2.0, 2.0])
    idx = {name: i for i, name in enumerate(TARGET_NAMES)}
    cur = (16, 5, 2)
    assert action_to_threads([idx["need"]] * 3, cur, 32, "target", need=need) == (8, 2, 2)
    assert action_to_threads([idx["carry"], idx["hold"], idx["need_plus_one"]], cur, 32, "target", need=need) == (4, 5, 3)
    assert action_to_threads([idx["double"], idx["quadruple"], idx["max"]], cur, 32, "target", need=need) == (32, 20, 32)
    assert action_to_threads([idx["halve"], idx["minus_one"], idx["plus_one"]], cur, 32, "target", need=need) == (8, 4, 3)
    # anchors round up only a quarter thread above a whole count
    near = np.array([8.2, 8.3, 0.2, 8.2, 8.3, 0.2])
    assert action_to_threads([idx["need"]] * 3, cur, 32, "target", need=near) == (8, 9, 1)
    with pytest.raises(ValueError, match="needs"):
        action_to_threads([3, 3, 3], cur, 32, "target")
