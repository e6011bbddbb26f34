"""A policy trained for one path (automdt.agents.tuned): the neighbourhood it trains on, the file,
the validation gate, and `automdt train --profile` -> `simulate` / `transfer` with the file."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from automdt.agents import neighbourhood as NB
from automdt.agents import tuned as T
from automdt.simulator.profile import Profile, StageProfile

MB = 1_000_000


def _profile(noise=0.02, spread=0.05):
    st = [StageProfile(40 * MB, 300 * MB, spread, spread), StageProfile(60 * MB, 100 * MB, spread, spread),
          StageProfile(50 * MB, 500 * MB, spread, spread)]
    return Profile(read=st[0], net=st[1], write=st[2], sender_buffer=256 << 20, receiver_buffer=256 << 20,
                   interval_s=1.0, max_threads=16, noise=noise, meta={"chunk_bytes": 4 << 20})


def test_neighbourhood_is_seeded_and_stays_near_the_explored_path():
    prof = _profile()
    a = NB.validation_set(prof, 4, seed=1)
    b = NB.validation_set(prof, 4, seed=1)
    assert [e.profile.to_dict() for e in a] == [e.profile.to_dict() for e in b]
    assert sorted({e.family for e in a}) == sorted(["explored", *NB.DRIFTS])
    ratios = [e.profile.net.bandwidth / prof.net.bandwidth for e in NB.validation_set(prof, 40, seed=2)]
    assert 0.8 < float(np.median(ratios)) < 1.25 and min(ratios) > 0.6 and max(ratios) < 1.6
    changed = [e for e in a if e.family != "explored"]
    assert all(e.events for e in changed) and all(not e.events for e in a if e.family == "explored")
    assert all(at < 10 for e in a if e.family == "moved-early" for at, _ in e.events)


def test_a_lower_bound_may_be_exceeded_by_the_true_path():
    prof = _profile().replace(meta={"fit": {"confidence": {"net": {"bandwidth_measured": False}}}})
    rng = np.random.default_rng(3)
    ratios = [NB.true_path(prof, rng).net.bandwidth / prof.net.bandwidth for _ in range(200)]
    assert max(ratios) > 2.0 and np.mean([r > 1.3 for r in ratios]) > 0.3


def test_the_prior_start_carries_the_explored_path_in_the_first_interval():
    from automdt.agents.tuned_training import Prior
    from automdt.simulator.oracle import oracle

    prof = _profile(noise=0.0)
    pol = Prior.of(prof).policy(None, "prior", prof.max_threads)
    fr = NB.run_episode(pol, NB.episode(prof.replace(), np.random.default_rng(0), drift="none"), seed=0)
    assert pol.reset(prof.max_threads) == oracle(prof).threads
    assert fr[0] >= 0.9


def test_the_gate_never_chooses_worse_than_the_default():
    from automdt.agents.tuned_training import GATE_TOLERANCE, choose

    base = {"explored": 0.95, "changed": 0.93, "all": 0.94}
    assert choose({"network": {"explored": 0.99, "changed": 0.93 - 2 * GATE_TOLERANCE, "all": 0.97},
                   "prior": {"explored": 0.94, "changed": 0.95, "all": 0.95}, "none": base}) == "none"
    assert choose({"network": {"explored": 0.99, "changed": 0.94, "all": 0.96},
                   "prior": {"explored": 0.96, "changed": 0.93, "all": 0.945}, "none": base}) == "network"


class _Stubborn:
    """An actor that always picks the explored optimum: right on the explored path, wrong once it moved."""

    def mode(self, x):
        return np.full((1, 3), T.PRIOR)


def _mean_under_shield(policy, ep, seeds=(0, 1)):
    from automdt.agents.shield import Shield

    return float(np.mean([np.mean(NB.run_episode(Shield(policy, max_threads=16), ep, seed=s)) for s in seeds]))


def test_a_network_far_from_its_path_hands_over_to_the_default():
    from automdt.agents.tuned_training import Prior

    prof = _profile()
    prior = Prior.of(prof)
    far = NB.episode(prof, np.random.default_rng(5), drift="moved-far")
    same = NB.episode(prof, np.random.default_rng(5), drift="none")
    trusting = T.TunedPolicy(prior.threads, prior.tpt, prior.rate, _Stubborn(), max_threads=16)
    guarded = prior.policy(_Stubborn(), "prior", 16)
    default = prior.policy(None, "prior", 16)  # the default controller from the same start
    d, g, t = (_mean_under_shield(p, far) for p in (default, guarded, trusting))
    assert g >= d - 0.03, (g, d)  # the default controller drives once the path left the band
    assert t < d - 0.05, (t, d)  # the same network without the band
    assert guarded.retired is not None
    # on the explored path the band keeps the network driving, and it scores what it is worth
    assert _mean_under_shield(guarded, same) >= _mean_under_shield(prior.policy(None, "default", 16), same) - 0.01
    assert guarded.retired is None and guarded.annotation() == {"tuned": "selector"}


def test_the_trust_band_widens_with_the_fit_and_opens_for_lower_bounds():
    prof = _profile(spread=0.2).replace(meta={"fit": {"confidence": {"net": {"tpt_measured": False}}}})
    band = NB.trust(prof)
    assert band["high"][1] is None and band["high"][0] > NB.MOVE_RANGE
    assert band["low"][0] < 1 / NB.MOVE_RANGE and len(band["capacity"][2]) == prof.max_threads
    assert band["capacity"][1][0] == pytest.approx(60 * MB) and band["capacity"][1][-1] == pytest.approx(100 * MB)
    assert T.parse_trust(band) is not None
    assert T.parse_trust({**band, "low": [0.3, -1, 0.3]}) is None
    assert T.parse_trust({**band, "capacity": band["capacity"][:2]}) is None


def test_the_trust_band_reads_lower_bounds_from_the_fit_when_the_summary_is_missing():
    """A profile fitted without ``automdt explore``'s confidence summary (the engine ablation's
    exploration writes none) still has no upper bound where its fit saw only a lower bound: a
    barely busy writer measures far above a lower bound without the path having moved."""
    fit = {"stages": {"write": {"tpt_lower_bound": True, "bandwidth_lower_bound": True}}}
    band = NB.trust(_profile().replace(meta={"fit": fit}))
    assert band["high"][2] is None and band["high"][0] is not None and band["high"][1] is not None
    assert NB.trust(_profile())["high"][2] is not None  # no fit: measured


def _random_file(tmp_path, learned="network"):
    rng = np.random.default_rng(0)
    d = T.FRAME_DIM * T.FRAME_STACK
    arrays = {"mlp_extractor.policy_net.0.weight": rng.normal(0, 0.1, (8, d)),
              "mlp_extractor.policy_net.0.bias": np.zeros(8),
              "action_net.weight": rng.normal(0, 0.1, (9, 8)), "action_net.bias": np.zeros(9)}
    meta = {"learned": learned, "prior": {"threads": [3, 2, 4], "tpt": [40e6, 60e6, 50e6], "rate": 1e8},
            "k": 1.02, "max_threads": 16, "policy_kwargs": {"net_arch": [8], "activation_fn": "Tanh"},
            "trained_on": {"src": "/data/out", "dest": "10.0.0.2:5000/explore"}}
    path = tmp_path / "p.zip"
    T.write_tuned(path, meta, arrays if learned == "network" else None)
    return path


def test_a_tuned_file_loads_without_torch_and_runs_under_the_shield(tmp_path):
    path = _random_file(tmp_path)
    code = ("import sys; from automdt.agents.registry import make_policy; "
            "from automdt.policy_contract import Observation; "
            f"p = make_policy({str(path)!r}, 16); print(p.name, p.reset(16)); "
            "o = Observation((3, 2, 4), (1e8, 1e8, 1e8), (0.5, 0.5), busy_s=(2.5, 1.8, 3.2), wait_s=(0.5, 0.2, 0.8)); "
            "t = p.act(o); print(t, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0].startswith("shield:tuned:") and out[0].endswith("(3, 2, 4)")
    assert out[1].endswith("False") and out[1].startswith("(")


def test_a_tuned_file_is_checked_before_use(tmp_path):
    from automdt.agents.registry import make_policy

    path = _random_file(tmp_path)
    with open(path, "ab") as f:
        f.write(b"x")
    with pytest.raises(ValueError, match="sha256"):
        make_policy(str(path), 16)
    path = _random_file(tmp_path)
    os.chmod(path, 0o666)
    with pytest.raises(ValueError, match="writable by other users"):
        make_policy(str(path), 16)
    os.chmod(path, 0o644)
    meta = json.loads((tmp_path / "p.zip.json").read_text())
    meta["prior"]["threads"] = [0, 2, 4]
    (tmp_path / "p.zip.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="not an AutoMDT policy"):
        make_policy(str(path), 16)


def test_a_file_without_a_network_is_the_capacity_controller(tmp_path):
    from automdt.agents.capacity import CapacityPolicy
    from automdt.agents.registry import make_policy

    pol = make_policy(f"ppo:{_random_file(tmp_path, 'none')}", 16)  # bare: no shield
    assert not pol.has_network and pol.reset(16) == CapacityPolicy().reset(16)
    ep = NB.episode(_profile(), np.random.default_rng(5), drift="link")
    a = NB.run_episode(pol, ep, seed=1)
    b = NB.run_episode(CapacityPolicy(max_threads=16), ep, seed=1)
    assert a == b


def test_the_path_note_names_another_source_or_host():
    meta = {"trained_on": {"src": "/data/out", "dest": "10.0.0.2:5000/explore", "explored": "2026-11-28"}}
    assert T.path_note(meta, "/data/out", "10.0.0.2:5000/run42") is None
    assert "trained for /data/out" in T.path_note(meta, "/data/other", "10.0.0.2:5000/run42")
    assert T.path_note(meta, "/data/out", "10.0.0.3:5000/run42") is not None
    assert T.path_note({}, "/x", "/y") is None


def test_train_profile_writes_a_file_that_simulate_and_transfer_run(tmp_path, monkeypatch):
    from tests.util import run_cli, write_file

    monkeypatch.setenv("SB3_LOGDIR", str(tmp_path / "sb3-logs"))  # SB3's default logger would make it

    prof = _profile(noise=0.1)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        write_file(src / f"f{i}", 300_000, seed=i)
    meta = dict(prof.meta, explored={"src": str(tmp_path / "elsewhere"), "dest": str(tmp_path / "x"), "at": "then"})
    prof.replace(meta=meta).save(tmp_path / "p.yaml")
    rc, _, err = run_cli("train", "--profile", str(tmp_path / "p.yaml"), "-o", str(tmp_path / "pol.zip"),
                         "--timesteps", "2048", "--no-progress", check_json=False, timeout=300)
    assert rc == 0, err
    assert not (tmp_path / "sb3-logs").exists()
    side = json.loads((tmp_path / "pol.zip.json").read_text())
    assert side["format"] == T.FORMAT and side["learned"] in T.LEARNED
    assert side["trained_on"]["src"] == str(tmp_path / "elsewhere")
    assert set(side["validation"]["scores"]) >= {"prior", "none"}
    rc, out, err = run_cli("simulate", "--profile", str(tmp_path / "p.yaml"), "--policy", str(tmp_path / "pol.zip"),
                           "--json", "--steps", "30")
    assert rc == 0 and out["policy"].startswith("shield:tuned:"), err
    rc, out, err = run_cli("transfer", str(src), str(tmp_path / "dst"), "--policy", str(tmp_path / "pol.zip"),
                           "--json", "--no-lock")
    assert rc == 0 and out["files_transferred"] == 3, err
    assert "trained for" in err and str(tmp_path / "elsewhere") in err


def test_a_written_sidecar_matches_its_schema_and_the_help_states_the_budget(tmp_path):
    import jsonschema

    from automdt.agents.tuned_training import DEFAULT_TIMESTEPS
    from automdt.cli import build_parser

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "schemas", "tuned-policy-metadata.schema.json")) as f:
        schema = json.load(f)
    _random_file(tmp_path)
    meta = json.loads((tmp_path / "p.zip.json").read_text())
    meta.update(validation={"scores": {"none": {"explored": 0.9}}}, trained_on=dict(meta["trained_on"], profile=None))
    jsonschema.Draft202012Validator(schema).validate(meta)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(dict(meta, learned="everything"))
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    assert str(DEFAULT_TIMESTEPS) in train.format_help().replace(",", "")
