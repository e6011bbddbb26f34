"""Numpy inference: the same actions as the torch network, one input pipeline, no ML framework
imported on the transfer path."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

HEAVY = ("torch", "stable_baselines3", "gymnasium")


def _recorded_inputs(policy, count, seed=0):
    """Network inputs the policy saw while running in the simulator on held-out random profiles."""
    from automdt.agents.training import held_out_random_profiles
    from automdt.simulator.oracle import evaluate_policy_in_sim

    seen = []
    real = policy.network_input

    def record(obs):
        x = real(obs)
        seen.append(x[0].copy())
        return x

    policy.network_input = record
    try:
        steps = 100
        for j, (_, prof) in enumerate(held_out_random_profiles(-(-count // steps), policy.train_max_threads)):
            evaluate_policy_in_sim(policy, prof, steps=steps, seed=seed + j)
    finally:
        del policy.network_input
    return np.array(seen[:count], dtype=np.float32)


@pytest.mark.parametrize("which", ["default", "tiny"])
def test_numpy_forward_equals_torch(which, tiny_policy):
    """Same actions on 6,000 recorded and 6,000 random observations; prints the largest logit gap."""
    import torch as th

    from automdt.agents.ppo import PPOPolicy, load_policy

    pol = load_policy("default") if which == "default" else PPOPolicy.load(tiny_policy.model_path)
    net = pol.network  # the SB3 network, rebuilt from the same file by the torch loader
    rng = np.random.default_rng(42)
    x = np.concatenate([_recorded_inputs(pol, 6000),
                        rng.uniform(0.0, 1.0, (6000, pol.actor.in_dim)).astype(np.float32)])
    assert x.shape[0] >= 10_000
    with th.inference_mode():
        t = th.as_tensor(x)
        logits_torch = net.action_net(net.mlp_extractor.forward_actor(net.pi_features_extractor(t))).numpy()
        sb3_actions, _ = net.predict(x, deterministic=True)
    logits_np = pol.actor.logits(x)
    gap = float(np.abs(logits_np - logits_torch).max())
    print(f"\n{which}: largest |numpy - torch| logit difference over {x.shape[0]} inputs: {gap:.3g}")
    assert gap < 1e-4
    assert np.array_equal(pol.actor.mode(x), sb3_actions)


def test_frame_stack_equals_sb3_vecframestack():
    """FrameStack gives VecFrameStack's values, terminal observations included."""
    from gymnasium import spaces
    from stable_baselines3.common.vec_env.stacked_observations import StackedObservations

    from automdt.simulator.pipeline import FrameStack

    rng = np.random.default_rng(0)
    n, width, k = 4, 5, 3
    ours = FrameStack(n, width, k)
    ref = StackedObservations(n, k, spaces.Box(0.0, 1.0, (width,), np.float32))
    first = rng.random((n, width), dtype=np.float32)
    assert np.array_equal(ours.reset(first), ref.reset(first))
    for step in range(30):
        obs = rng.random((n, width), dtype=np.float32)
        dones = rng.random(n) < 0.2
        terminal = {int(i): rng.random(width, dtype=np.float32) for i in np.flatnonzero(dones)}
        infos = [{"terminal_observation": terminal[i]} if i in terminal else {} for i in range(n)]
        want, infos = ref.update(obs, dones, infos)
        got, term = ours.push(obs, dones, terminal)
        assert np.array_equal(got, want), step
        for i, t in term.items():
            assert np.array_equal(t, infos[i]["terminal_observation"])


def test_policy_input_equals_the_training_wrapper_it_replaced():
    """The training wrapper (PolicyInputVecEnv) = features then SB3 VecFrameStack, done rows included."""
    from stable_baselines3.common.vec_env import VecEnvWrapper, VecFrameStack

    from automdt.agents.ppo_sb3 import simulator_spaces
    from automdt.agents.training import PolicyInputVecEnv
    from automdt.simulator.pipeline import FeatureState, add_features
    from automdt.simulator.profile import Profile
    from automdt.simulator.sb3 import BatchedSimVecEnv

    features, stack = ("debiased_spare", "noise_level"), 4

    class FeaturesOnly(VecEnvWrapper):  # the features part of the old training wrapper, spelled out
        def __init__(self, venv):
            self.state = FeatureState(venv.num_envs)
            super().__init__(venv, observation_space=simulator_spaces(1, features)[0])

        def reset(self):
            self.state.reset()
            return add_features(self.venv.reset(), features, 32, self.state)

        def step_wait(self):
            obs, rew, done, infos = self.venv.step_wait()
            for i in np.flatnonzero(done):
                infos[i]["terminal_observation"] = add_features(infos[i]["terminal_observation"][None], features,
                                                                32, _row_state(self.state, i))[0]
            self.state.reset(np.flatnonzero(done))
            return add_features(obs, features, 32, self.state), rew, done, infos

    def _row_state(state, i):
        s = FeatureState(1)
        s.sum[0], s.count[0], s.seen[0] = state.sum[i], state.count[i], state.seen[i]
        return s

    def make():
        return BatchedSimVecEnv(num_envs=6, profile=Profile.default(), episode_steps=7, random_profiles=True, seed=3)

    a = PolicyInputVecEnv(make(), features, 32, stack)
    b = VecFrameStack(FeaturesOnly(make()), stack)
    a.seed(3)
    b.seed(3)
    assert np.array_equal(a.reset(), b.reset())
    rng = np.random.default_rng(5)
    for step in range(20):
        act = rng.integers(0, 5, (6, 3))
        xa, _, da, ia = a.step(act)
        xb, _, db, ib = b.step(act)
        assert np.array_equal(da, db) and np.array_equal(xa, xb), step
        for i in np.flatnonzero(da):
            assert np.array_equal(ia[i]["terminal_observation"], ib[i]["terminal_observation"])


def test_space_descriptions_match_the_gymnasium_spaces():
    from automdt.agents.ppo_sb3 import simulator_spaces, space_to_json
    from automdt.simulator.pipeline import space_descriptions

    for stack, feats in [(1, ()), (8, ("debiased_spare", "noise_level")), (3, ("spare_threads",))]:
        obs, act = simulator_spaces(stack, feats)
        assert space_descriptions(stack, feats) == (space_to_json(obs), space_to_json(act))


def test_loading_and_acting_import_no_ml_framework():
    code = ("import sys, json\n"
            "from automdt.agents.registry import make_policy\n"
            "from automdt.simulator.types import Observation\n"
            "p = make_policy('ppo', 32)\n"
            "t = p.reset(32)\n"
            "t = p.act(Observation(threads=t, throughput_bps=(1e8, 1e8, 1e8), buffer_fill=(0.5, 0.1)))\n"
            f"print(json.dumps([p.name, list(t), [m for m in {HEAVY!r} if m in sys.modules]]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    name, threads, heavy = json.loads(out)
    assert name == "ppo:default" and len(threads) == 3
    assert heavy == []
