"""train(): outputs, metadata, learning curve, determinism, stopping rules."""
from __future__ import annotations

import csv
import hashlib
import json

import pytest

from automdt.simulator.profile import Profile
from tests.ppo.conftest import TINY_TIMESTEPS, tiny_config, tiny_train


def _weights(path):
    from automdt.agents.ppo import PPOPolicy

    return PPOPolicy.load(path).network.state_dict()


def test_tiny_training_writes_zip_json_csv_png(tiny_policy):
    rep = tiny_policy
    for p in (rep.model_path, rep.metadata_path, rep.curve_csv, rep.curve_png):
        assert p.is_file() and p.stat().st_size > 0, p
    assert rep.metadata_path.name == rep.model_path.name + ".json"
    assert rep.curve_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert rep.timesteps >= TINY_TIMESTEPS
    assert rep.stop_reason == "timesteps"


def test_metadata_describes_the_run(tiny_policy):
    from automdt.simulator.env import OBS_DIM

    meta = json.loads(tiny_policy.metadata_path.read_text())
    assert meta["format"] == "automdt-ppo/1"
    assert meta["env_id"] == "automdt/BufferSim-v0"
    assert meta["observation_space"]["type"] == "Box" and meta["observation_space"]["shape"] == [OBS_DIM]
    # the target head: hold, -1, +1, need, need+1, carry, carry+1, double, x4, max, halve
    assert meta["action_space"] == {"type": "MultiDiscrete", "nvec": [11, 11, 11], "start": [0, 0, 0]}
    assert meta["action_head"] == "target" and meta["action_names"][:4] == ["hold", "minus_one", "plus_one", "need"]
    assert meta["k"] == 1.02 and meta["max_threads"] == 32 and meta["seed"] == 0
    assert meta["timesteps"] == tiny_policy.timesteps
    assert meta["wall_s"] > 0
    assert 0.0 < meta["fraction_of_oracle"] <= 1.01
    assert meta["sha256"] == hashlib.sha256(tiny_policy.model_path.read_bytes()).hexdigest()
    assert meta["hyperparameters"]["num_envs"] == tiny_config().num_envs


def test_learning_curve_csv(tiny_policy):
    rows = list(csv.DictReader(tiny_policy.curve_csv.open()))
    assert rows, "empty learning curve"
    assert list(rows[0]) == ["timesteps", "wall_s", "mean_reward", "fraction_of_oracle", "min_fraction_of_oracle"]
    ts = [int(r["timesteps"]) for r in rows]
    assert ts[0] == 0 and ts == sorted(ts) and ts[-1] == tiny_policy.timesteps
    assert all(0.0 <= float(r["fraction_of_oracle"]) <= 1.01 for r in rows)
    # the saved network is the best evaluated one
    assert max(float(r["fraction_of_oracle"]) for r in rows) == pytest.approx(tiny_policy.fraction_of_oracle, abs=1e-6)


def test_same_seed_same_network_and_curve(tmp_path, tiny_policy):
    import torch

    again = tiny_train(tmp_path / "again.zip", seed=0)
    a, b = _weights(tiny_policy.model_path), _weights(again.model_path)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [p.fraction_of_oracle for p in again.curve] == [p.fraction_of_oracle for p in tiny_policy.curve]
    assert [p.mean_reward for p in again.curve[1:]] == [p.mean_reward for p in tiny_policy.curve[1:]]


def test_other_seed_other_network(tmp_path, tiny_policy):
    import torch

    other = tiny_train(tmp_path / "other.zip", seed=1)
    a, b = _weights(tiny_policy.model_path), _weights(other.model_path)
    assert not all(torch.equal(a[k], b[k]) for k in a)


def test_training_leaves_torch_thread_count_alone(tmp_path):
    import torch

    before = torch.get_num_threads()
    tiny_train(tmp_path / "t.zip", timesteps=256, eval_every=256)
    assert torch.get_num_threads() == before


def test_training_writes_no_sb3_log_directory(tmp_path, monkeypatch):
    """SB3's default logger makes an empty ``$SB3_LOGDIR`` (or ``/tmp/SB3-<time>``) per run."""
    monkeypatch.setenv("SB3_LOGDIR", str(tmp_path / "sb3-logs"))
    tiny_train(tmp_path / "t.zip", timesteps=256, eval_every=256)
    assert (tmp_path / "t.zip").exists()
    assert not (tmp_path / "sb3-logs").exists()


def test_max_seconds_stops_and_still_writes(tmp_path):
    rep = tiny_train(tmp_path / "s.zip", timesteps=10**6, max_seconds=0.0, progress=True)
    assert rep.stop_reason == "max_seconds"
    assert rep.timesteps < 10**6
    assert rep.model_path.is_file() and rep.metadata_path.is_file()


def test_select_from_keeps_only_late_networks(tmp_path):
    rep = tiny_train(tmp_path / "late.zip", timesteps=1024, eval_every=256, select_from=0.6)
    assert [p.timesteps for p in rep.curve][:2] == [0, 256]  # early networks are still evaluated
    assert rep.best_timesteps >= 0.6 * 1024
    assert json.loads(rep.metadata_path.read_text())["select_from"] == 0.6


def test_select_from_with_an_early_stop_keeps_the_last_network(tmp_path):
    rep = tiny_train(tmp_path / "s.zip", timesteps=10**6, max_seconds=0.0, select_from=0.5)
    assert rep.stop_reason == "max_seconds" and rep.best_timesteps == rep.timesteps
    assert rep.model_path.is_file()


def test_target_reached_stops_early(tmp_path):
    # any network reaches 1% of the oracle, so the evaluation before training already stops it
    rep = tiny_train(tmp_path / "t.zip", timesteps=10**6, target_fraction=0.01)
    assert rep.stop_reason == "target" and rep.reached_target
    assert rep.timesteps < 10**6
    assert rep.wall_s_to_target is not None


def test_random_profiles_evaluate_on_held_out_profiles(tmp_path):
    rep = tiny_train(tmp_path / "r.zip", random_profiles=True, timesteps=256, eval_every=256, n_eval_profiles=3)
    assert sorted(rep.per_profile_fraction) == ["random0-read", "random1-net", "random2-write"]
    meta = json.loads(rep.metadata_path.read_text())
    assert meta["random_profiles"] is True and meta["profile"] is None
    assert len(meta["eval_profiles"]) == 3


def test_out_without_zip_suffix(tmp_path):
    rep = tiny_train(tmp_path / "noext", timesteps=256, eval_every=256)
    assert rep.model_path.name == "noext.zip" and rep.model_path.is_file()


@pytest.mark.parametrize("kw, match", [
    ({"timesteps": 0}, "timesteps"),
    ({"target_fraction": 5.0}, "target_fraction"),
    ({"select_from": 1.0}, "select_from"),
])
def test_bad_arguments(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        tiny_train(tmp_path / "x.zip", **kw)


def test_held_out_random_profiles_cover_every_bottleneck():
    from automdt.agents.training import held_out_random_profiles

    profs = held_out_random_profiles(6)
    assert [p.bottleneck for _, p in profs] == ["read", "net", "write"] * 2
    again = held_out_random_profiles(6)
    assert [p for _, p in profs] == [p for _, p in again]


@pytest.mark.expensive
def test_training_on_one_profile_reaches_95_percent_of_oracle(tmp_path):
    from automdt.agents.training import train

    rep = train(Profile.default(), tmp_path / "one.zip", timesteps=3_000_000, seed=0, progress=False,
                target_fraction=0.95, max_seconds=600)
    assert rep.reached_target, rep.curve
    assert rep.fraction_of_oracle >= 0.95


def test_init_from_starts_from_that_network(tmp_path, tiny_policy):
    import torch

    # with a zero learning rate the fine-tuned network is the initial one
    rep = tiny_train(tmp_path / "ft.zip", timesteps=512, init_from=tiny_policy.model_path,
                     config=tiny_config().replace(learning_rate=0.0))
    a, b = _weights(tiny_policy.model_path), _weights(rep.model_path)
    assert all(torch.equal(a[k], b[k]) for k in a)
    meta = json.loads(rep.metadata_path.read_text())
    assert meta["init_from"] == str(tiny_policy.model_path)
    assert meta["init_from_sha256"] == json.loads(tiny_policy.metadata_path.read_text())["sha256"]


def test_init_from_must_match_the_config(tmp_path, tiny_policy):
    with pytest.raises(ValueError, match="frame_stack"):
        tiny_train(tmp_path / "x.zip", init_from=tiny_policy.model_path, config=tiny_config().replace(frame_stack=2))
    with pytest.raises(ValueError, match="network does not match"):
        tiny_train(tmp_path / "y.zip", init_from=tiny_policy.model_path, config=tiny_config().replace(net_arch=(8,)))


def test_own_loop_from_the_public_pieces_gives_the_network_train_gives(tmp_path, tiny_policy):
    """make_model + the callbacks of automdt.agents.callbacks, composed by hand, train the very
    network train() trains (the pieces are the whole of it: no hidden state in train())."""
    import torch
    from stable_baselines3.common.callbacks import CallbackList

    from automdt.agents.callbacks import OracleEvalCallback, StopTrainingOnOracleFraction
    from automdt.agents.training import EVAL_SEED, EnvSettings, eval_policy_metadata, evaluate, make_model

    prof, cfg = Profile.default(), tiny_config()
    threads = torch.get_num_threads()
    try:
        model, init = make_model(prof, EnvSettings(), cfg, seed=0)  # sets cfg.torch_threads
        assert init is None
        evals = OracleEvalCallback(lambda pol: evaluate(pol, [("train", prof)], steps=20, seed=EVAL_SEED),
                                   eval_policy_metadata(prof, cfg), eval_every=512,
                                   callback_on_new_best=StopTrainingOnOracleFraction(2.0))  # never reached
        model.learn(TINY_TIMESTEPS, callback=CallbackList([evals]))
        evals.finish(model.num_timesteps, ran_to_budget=evals.stop_reason is None)
    finally:
        torch.set_num_threads(threads)
    assert [p.timesteps for p in evals.curve] == [p.timesteps for p in tiny_policy.curve]
    assert [p.fraction_of_oracle for p in evals.curve] == [p.fraction_of_oracle for p in tiny_policy.curve]
    assert evals.best_timesteps == tiny_policy.best_timesteps and evals.stop_reason is None
    model.policy.load_state_dict(evals.best_state)
    a, b = model.policy.state_dict(), _weights(tiny_policy.model_path)
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_stop_at_target_is_a_child_of_the_evaluation(tmp_path):
    """The target stop fires on a new best only: a target reached at the very first evaluation
    stops at the first step; with select_from the first evaluations are never kept, so it cannot."""
    rep = tiny_train(tmp_path / "a.zip", timesteps=2048, eval_every=256, target_fraction=0.01, select_from=0.5)
    assert rep.stop_reason == "target" and rep.best_timesteps >= 1024
    assert [p.timesteps for p in rep.curve][:2] == [0, 256]


def test_hook_stops_and_sees_every_evaluation(tmp_path):
    seen = []

    def hook(ts, frac):
        seen.append((ts, frac))
        return ts >= 512

    rep = tiny_train(tmp_path / "h.zip", timesteps=4096, eval_every=256, eval_hook=hook)
    assert rep.stop_reason == "hook" and rep.timesteps < 4096
    assert seen == [(p.timesteps, p.fraction_of_oracle) for p in rep.curve]


def test_env_settings_are_recorded(tmp_path):
    from automdt.simulator.changes import ProfileChanges

    rep = tiny_train(tmp_path / "e.zip", timesteps=256, eval_every=256, randomize=0.2, random_start=True,
                     noise=0.05, changes=ProfileChanges(max_changes=1))
    meta = json.loads(rep.metadata_path.read_text())
    assert (meta["randomize"], meta["random_start"], meta["noise"]) == (0.2, True, 0.05)
    assert meta["changes"]["max_changes"] == 1 and meta["k"] == 1.02 and meta["random_profiles"] is False


def test_write_policy_metadata_round_trips(tmp_path, tiny_policy):
    import os
    import shutil
    import stat

    from automdt.agents.ppo import policy_metadata, write_policy_metadata

    p = tmp_path / "copy.zip"
    shutil.copy(tiny_policy.model_path, p)
    meta = json.loads(tiny_policy.metadata_path.read_text())
    meta["note"] = "written again"
    side = write_policy_metadata(p, meta)
    assert side == tmp_path / "copy.zip.json" and policy_metadata(p) == meta
    assert stat.S_IMODE(os.stat(side).st_mode) == 0o644
    assert not (tmp_path / "copy.zip.json.tmp").exists()
