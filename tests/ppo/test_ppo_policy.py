"""PPOPolicy: the Policy protocol, loading (numpy only, pickle-free), and one-line loading errors."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from automdt.agents.base import Policy
from automdt.simulator.types import Observation


def _obs(rng, threads, max_threads=32):
    return Observation(threads=tuple(int(t) for t in threads),
                       throughput_bps=tuple(float(x) for x in rng.uniform(0, 1e9, 3)),
                       buffer_fill=tuple(float(x) for x in rng.uniform(0, 1, 2)), max_threads=max_threads)


def _copy_policy(src, dst_dir, name="p.zip"):
    dst = dst_dir / name
    shutil.copy(src, dst)
    shutil.copy(str(src) + ".json", str(dst) + ".json")
    return dst


def test_satisfies_policy_protocol(tiny_policy):
    from automdt.agents.ppo import PPOPolicy

    pol = PPOPolicy.load(tiny_policy.model_path)
    assert isinstance(pol, Policy)
    assert pol.name == f"ppo:{tiny_policy.model_path}"  # logs and `simulate` name the file
    assert pol.deterministic


def _profile_start(max_threads=32):
    from automdt.agents.base import clamp_triple
    from automdt.simulator.oracle import oracle
    from automdt.simulator.profile import Profile

    return clamp_triple(oracle(Profile.default()).threads, max_threads)


def test_profile_trained_policy_starts_at_its_oracle(tiny_policy):
    """The tiny policy is trained on Profile.default(): it starts at that profile's optimum, stored
    in its metadata, and an older file with only the profile gets it computed at load time."""
    from automdt.agents.ppo import PPOPolicy

    pol = PPOPolicy.load(tiny_policy.model_path)
    assert pol.start_source == "profile"
    assert pol.reset(32) == _profile_start() != (1, 1, 1)
    assert tiny_policy.metadata["start"] == {"threads": list(_profile_start()), "source": "profile"}
    meta = dict(tiny_policy.metadata)
    del meta["start"]
    older = PPOPolicy(pol.actor, metadata=meta)
    assert (older.start_threads, older.start_source) == (_profile_start(), "profile")


@pytest.mark.parametrize("max_threads", [1, 4, 20, 32, 64])
def test_triples_in_range(tiny_policy, max_threads):
    from automdt.agents.ppo import PPOPolicy

    pol = PPOPolicy.load(tiny_policy.model_path)
    rng = np.random.default_rng(max_threads)
    start = pol.reset(max_threads, seed=0)
    assert start == _profile_start(max_threads)
    threads = start
    for _ in range(50):
        threads = pol.act(_obs(rng, threads, max_threads))
        assert isinstance(threads, tuple) and len(threads) == 3
        assert all(type(t) is int and 1 <= t <= max_threads for t in threads), threads


def test_deterministic_by_default(tiny_policy):
    from automdt.agents.ppo import PPOPolicy

    a, b = PPOPolicy.load(tiny_policy.model_path), PPOPolicy.load(tiny_policy.model_path)

    def run(pol):
        rng = np.random.default_rng(7)
        threads = pol.reset(32)
        out = []
        for _ in range(30):
            threads = pol.act(_obs(rng, threads))
            out.append(threads)
        return out

    assert run(a) == run(b) == run(a)


def test_sampling_is_seeded_and_leaves_global_rng_alone(tiny_policy):
    import torch

    from automdt.agents.ppo import PPOPolicy

    pol = PPOPolicy.load(tiny_policy.model_path, deterministic=False)
    np.random.seed(11)
    np_before = np.random.get_state()[1].copy()

    def run(seed):
        rng = np.random.default_rng(3)
        threads = pol.reset(32, seed=seed)
        out = []
        for _ in range(40):
            threads = pol.act(_obs(rng, threads))
            out.append(threads)
        return out

    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    first = run(5)
    assert torch.equal(before, torch.random.get_rng_state())
    assert np.array_equal(np_before, np.random.get_state()[1])
    assert run(5) == first
    assert run(6) != first


def test_runs_in_the_simulator(tiny_policy):
    from automdt.agents.ppo import load_policy
    from automdt.simulator.oracle import evaluate_policy_in_sim
    from automdt.simulator.profile import Profile

    traj = evaluate_policy_in_sim(load_policy(tiny_policy.model_path), Profile.default(), steps=20, seed=0)
    assert 0.0 < traj.fraction_of_oracle <= 1.01


def test_default_names_resolve_to_the_shipped_file():
    from automdt.agents.ppo import default_policy_path, load_policy

    path = default_policy_path()
    assert path.name == "default_policy.zip" and path.is_file()
    for name in ("ppo", "default", "PPO"):
        pol = load_policy(name)
        assert pol.path == path and pol.name == "ppo:default"


def test_default_policy_path_survives_a_namespace_package(tmp_path, monkeypatch):
    """A stray ``automdt`` directory (e.g. /tmp/automdt, the job locks' fallback home) can turn the
    package into a namespace package; ``files()`` then returns a MultiplexedPath whose joinpath
    takes one argument (Python 3.11). The shipped file is still found."""
    from importlib.resources.readers import MultiplexedPath

    from automdt.agents import ppo

    real = ppo.default_policy_path().parent.parent
    (tmp_path / "automdt").mkdir()
    monkeypatch.setattr(ppo.resources, "files", lambda pkg: MultiplexedPath(tmp_path / "automdt", real))
    path = ppo.default_policy_path()
    assert path == real / "data" / "default_policy.zip" and path.is_file()


# ----------------------------------------------------------------------------- loading errors
def _load_error(path, names=None):
    """The one-line error loading ``path`` raises; it starts with ``names`` (default: ``path``)."""
    from automdt.agents.ppo import PPOPolicy

    with pytest.raises(ValueError) as ei:
        PPOPolicy.load(path)
    msg = str(ei.value)
    assert "\n" not in msg, msg
    assert msg.startswith(str(names or path) + ": "), msg
    return msg


def test_missing_file(tmp_path):
    assert "not an AutoMDT policy (no such file)" in _load_error(tmp_path / "nope.zip")


def test_directory(tmp_path):
    assert "not a regular file" in _load_error(tmp_path)


def test_not_a_zip(tmp_path):
    p = tmp_path / "x.zip"
    p.write_text("hello")
    assert "not an AutoMDT policy (not a zip archive)" in _load_error(p)


def test_zip_without_metadata(tmp_path, tiny_policy):
    p = tmp_path / "p.zip"
    shutil.copy(tiny_policy.model_path, p)
    msg = _load_error(p)
    assert "no metadata file p.zip.json" in msg
    assert "two files that travel together: copy p.zip and p.zip.json" in msg


def test_metadata_not_json_or_wrong_format(tmp_path, tiny_policy):
    p = _copy_policy(tiny_policy.model_path, tmp_path)
    meta = p.with_name(p.name + ".json")
    meta.write_text("{not json")
    assert "unreadable metadata" in _load_error(p)
    meta.write_text(json.dumps({"format": "something-else"}))
    assert "is not format 'automdt-ppo/1'" in _load_error(p)


def test_other_zip(tmp_path, tiny_policy):
    p = _copy_policy(tiny_policy.model_path, tmp_path)
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("readme.txt", "not a model")
    meta = json.loads(tiny_policy.metadata_path.read_text())
    meta["sha256"] = None
    p.with_name(p.name + ".json").write_text(json.dumps(meta))
    msg = _load_error(p)
    assert "zip has no automdt_actor.npz" in msg and "python -m automdt.agents.ppo_sb3" in msg


def test_sha256_mismatch(tmp_path, tiny_policy):
    p = _copy_policy(tiny_policy.model_path, tmp_path)
    with open(p, "ab") as f:
        f.write(b"\0")  # still a zip (trailing bytes), but not the file the metadata describes
    assert "does not match its metadata" in _load_error(p)


def test_spaces_mismatch(tmp_path, tiny_policy):
    p = _copy_policy(tiny_policy.model_path, tmp_path)
    meta = json.loads(tiny_policy.metadata_path.read_text())
    meta["action_space"]["nvec"] = [3, 3, 3]
    p.with_name(p.name + ".json").write_text(json.dumps(meta))
    assert "trained for action_space MultiDiscrete[3, 3, 3], this simulator has MultiDiscrete[11, 11, 11]" in _load_error(p)


def _with_policy_kwarg(tmp_path, tiny_policy, key, value):
    """A copy of the tiny policy whose metadata records ``policy_kwargs[key] = value``."""
    p = _copy_policy(tiny_policy.model_path, tmp_path)
    meta = json.loads(tiny_policy.metadata_path.read_text())
    meta["policy_kwargs"][key] = value
    p.with_name(p.name + ".json").write_text(json.dumps(meta))
    return p


def test_network_mismatch(tmp_path, tiny_policy):
    p = _with_policy_kwarg(tmp_path, tiny_policy, "net_arch", {"pi": [8], "vf": [8]})
    assert "weights do not fit the recorded network" in _load_error(p)


def test_bad_net_arch_is_refused(tmp_path, tiny_policy):
    p = _with_policy_kwarg(tmp_path, tiny_policy, "net_arch", "huge")
    assert "not an AutoMDT policy (" in _load_error(p)


def test_unknown_activation_is_refused(tmp_path, tiny_policy):
    p = _with_policy_kwarg(tmp_path, tiny_policy, "activation_fn", "os.system")
    assert "unknown activation" in _load_error(p)


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
@pytest.mark.parametrize("which", ["zip", "sidecar"])
def test_refuses_files_writable_by_others(tmp_path, tiny_policy, mode, which):
    p = _copy_policy(tiny_policy.model_path, tmp_path)
    target = p if which == "zip" else p.with_name(p.name + ".json")
    os.chmod(target, mode)
    msg = _load_error(p, target)
    assert f"{target}: refusing to load a policy file writable by other users" in msg
    assert "chmod go-w" in msg


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a file to another user")
@pytest.mark.parametrize("which", ["zip", "sidecar"])
def test_refuses_files_owned_by_another_user(tmp_path, tiny_policy, which):
    p = _copy_policy(tiny_policy.model_path, tmp_path)
    target = p if which == "zip" else p.with_name(p.name + ".json")
    os.chown(target, 4242, -1)
    assert f"{target}: refusing to load a policy file owned by another user (uid 4242)" in _load_error(p, target)


def test_older_file_without_numpy_weights(tmp_path, tiny_policy):
    """A policy zip written before the numpy weights existed: a one-line error naming the fix, and
    the fix (python -m automdt.agents.ppo_sb3 PATH) makes it load with the same actions."""
    from automdt.agents import ppo_sb3
    from automdt.agents.ppo import WEIGHTS_ENTRY, PPOPolicy, sha256_file

    p = tmp_path / "old.zip"
    with zipfile.ZipFile(tiny_policy.model_path) as src, zipfile.ZipFile(p, "w") as dst:
        for info in src.infolist():
            if info.filename != WEIGHTS_ENTRY:
                dst.writestr(info, src.read(info.filename))
    meta = json.loads(tiny_policy.metadata_path.read_text())
    meta["sha256"] = sha256_file(p)
    p.with_name(p.name + ".json").write_text(json.dumps(meta))
    msg = _load_error(p)
    assert f"zip has no {WEIGHTS_ENTRY}" in msg and f"python -m automdt.agents.ppo_sb3 {p}" in msg
    code = subprocess.run([sys.executable, "-m", "automdt.agents.ppo_sb3", str(p)], capture_output=True, text=True)
    assert code.returncode == 0, code.stderr
    fixed, orig = PPOPolicy.load(p), PPOPolicy.load(tiny_policy.model_path)
    x = np.random.default_rng(1).uniform(0, 1, (200, orig.actor.in_dim)).astype(np.float32)
    assert np.array_equal(fixed.actor.mode(x), orig.actor.mode(x))
    assert json.loads(p.with_name(p.name + ".json").read_text())["sha256"] == sha256_file(p)
    assert ppo_sb3.load_network(p) is not None


def test_never_unpickles(tmp_path, tiny_policy, monkeypatch):
    """Loading works with pickle and cloudpickle loads disabled (SB3's PPO.load would need them)."""
    import pickle

    import cloudpickle

    from automdt.agents.ppo import PPOPolicy

    def boom(*a, **k):
        raise AssertionError("unpickled something")

    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(cloudpickle, "loads", boom)
    pol = PPOPolicy.load(tiny_policy.model_path)
    assert pol.reset(32) == _profile_start()


def test_training_module_imports_without_torch():
    code = ("import sys, automdt.agents.training, automdt.agents.base; "
            "print('torch' in sys.modules, 'stable_baselines3' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.parametrize("frame_stack, features", [(1, ()), (3, ()), (1, ("spare_threads",)),
                                                    (3, ("spare_threads",)),
                                                    (3, ("spare_threads", "noise_level")),
                                                    (2, ("debiased_spare", "noise_level"))])
def test_policy_sees_what_the_training_env_showed(tmp_path, frame_stack, features):
    """PPOPolicy's encoding (and frame stacking) of live Observations equals the training input
    (without the floor, agents/guard.py, which may raise the network's choice)."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    from automdt.agents.ppo import PPOPolicy
    from automdt.agents.training import PolicyInputVecEnv
    from automdt.simulator.dynamics import need_from_encoding
    from automdt.simulator.env import BufferSimEnv, action_to_threads
    from automdt.simulator.profile import Profile
    from tests.ppo.conftest import tiny_config, tiny_train

    rep = tiny_train(tmp_path / "fs.zip", timesteps=512, eval_every=512,
                     config=tiny_config().replace(frame_stack=frame_stack, features=features))
    pol = PPOPolicy.load(rep.model_path)
    assert pol.frame_stack == frame_stack and pol.input_features == features
    inner = DummyVecEnv([lambda: BufferSimEnv(Profile.default(), random_start=False, episode_steps=25)])
    venv = PolicyInputVecEnv(inner, features, 32, frame_stack) if features or frame_stack > 1 else inner
    venv.seed(4)
    x = venv.reset()
    obs = inner.reset_infos[0]["observation"]
    pol.start_threads = obs.threads  # the env starts at (1, 1, 1)
    threads = pol.reset(32)
    assert threads == obs.threads
    for _ in range(40):  # past the end of the 25-step episode: stateful inputs restart with it
        action, _ = pol.network.predict(x, deterministic=True)
        threads = pol.act(obs)
        # the target head anchors on what the stages measured: the encoding the policy just made
        expected = action_to_threads(action[0], obs.threads, 32, need=need_from_encoding(pol._last_encoding, 32))
        assert threads == expected
        x, _, done, infos = venv.step(action)
        assert infos[0]["observation"].threads == threads
        if done[0]:  # a new episode is a new transfer
            obs = inner.reset_infos[0]["observation"]
            assert pol.reset(32) == obs.threads
        else:
            obs = infos[0]["observation"]


def test_debiased_spare_counts_surplus_threads_whatever_the_noise():
    """At the oracle's count the noise-corrected spare reads ~0 and two threads above it ~2 (within
    half a thread at 2% capacity noise, one at 8%); the plain spare_threads reads high by about
    twice as much."""
    from automdt.agents.ppo import FeatureState, add_features
    from automdt.simulator.env import OBS_DIM, BufferSimEnv
    from automdt.simulator.oracle import oracle
    from tests.ppo.conftest import held_out_profiles

    prof = held_out_profiles()["write-bound"]
    best = oracle(prof).threads
    feats = ("spare_threads", "debiased_spare", "noise_level")
    levels = {}
    for noise in (0.02, 0.08):
        for extra in (0, 2):
            raw, deb, lev = [], [], []
            for seed in range(4):
                env = BufferSimEnv(prof, random_start=False, episode_steps=60, noise=noise)
                obs, _ = env.reset(seed=seed)
                state = FeatureState(1)
                add_features(obs, feats, 32, state)
                for t in range(45):
                    obs, *_ = env.step_threads([(2, 2, 2), (4, 4, 4), (8, 8, 8)][t] if t < 3
                                               else (best[0], best[1], best[2] + extra))
                    x = add_features(obs, feats, 32, state)
                    if t >= 15:  # the write stage of each feature (after the encoding's OBS_DIM inputs)
                        raw.append(x[OBS_DIM + 2] * 8)
                        deb.append(x[OBS_DIM + 5] * 8)
                        lev.append(x[OBS_DIM + 6])
            assert abs(np.mean(deb) - extra) < (0.5 if noise < 0.05 else 1.0), (noise, extra, np.mean(deb))
            assert np.mean(raw) - extra > 1.5 * (np.mean(deb) - extra)
            levels[noise] = np.mean(lev)
    assert levels[0.08] > 2 * levels[0.02]


def test_stateful_features_need_a_state():
    from automdt.agents.ppo import add_features
    from automdt.simulator.env import OBS_DIM

    with pytest.raises(ValueError, match="FeatureState"):
        add_features(np.zeros(OBS_DIM, np.float32), ("noise_level",), 32)
    with pytest.raises(ValueError, match="unknown policy feature"):
        add_features(np.zeros(OBS_DIM, np.float32), ("nope",), 32)


def test_shipped_files_are_consistent():
    import hashlib
    import json

    from automdt.agents.ppo import default_policy_path, load_policy

    ppo = load_policy("ppo")
    path = default_policy_path()
    meta = json.loads(path.with_name(path.name + ".json").read_text())
    assert meta["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert meta["random_profiles"] is True and meta["profile"] is None
    assert meta["k"] == 1.02 and meta["max_threads"] == 32 and meta["seed"] == 0
    assert meta["stop_reason"] == "timesteps", "the shipped policy is trained on a fixed budget (reproducible)"
    assert sorted(meta["held_out"]["results"]) == ["net-bound", "read-bound", "write-bound"]
    assert path.stat().st_size < 1_000_000, "the shipped policy should stay small"
    assert ppo.metadata["sha256"] == meta["sha256"]
