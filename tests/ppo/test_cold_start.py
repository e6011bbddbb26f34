"""The cold start of a general policy is chosen in the simulator, reproducibly, and is not (1,1,1)."""
from __future__ import annotations

import json


def test_choice_is_reproducible_and_beats_one_thread():
    from automdt.agents.cold_start import choose_cold_start, cold_start_profiles
    from automdt.agents.ppo import load_policy

    pol = load_policy("default")
    profiles = cold_start_profiles()
    cands = [(1, 1, 1), (2, 1, 2), (2, 2, 4), (4, 2, 8), (8, 2, 2), (16, 16, 8)]
    a = choose_cold_start(pol, profiles, cands)
    b = choose_cold_start(pol, profiles, cands)
    a["chosen_by"].pop("seconds"), b["chosen_by"].pop("seconds")
    assert a == b and a["source"] == "cold"
    cb = a["chosen_by"]
    assert cb["chosen_score"] <= cb["one_one_one_score"]
    assert cb["chosen_settle"] >= cb["one_one_one_settle"] - cb["settle_margin"]
    assert cb["ineligible"] >= 1  # the settling safeguard does reject starts (here: the widest)
    assert a["threads"] != [1, 1, 1], cb["top"]
    # with a tolerance that makes every candidate "as fast", the fewest threads win
    assert choose_cold_start(pol, profiles, cands, tolerance=10.0)["threads"] == [1, 1, 1]


def test_shipped_default_records_its_cold_start():
    from automdt.agents.ppo import default_policy_path, load_policy

    path = default_policy_path()
    meta = json.loads(path.with_name(path.name + ".json").read_text())
    start = meta["start"]
    assert start["source"] == "cold" and start["threads"] != [1, 1, 1]
    assert start["chosen_by"]["chosen_score"] < start["chosen_by"]["one_one_one_score"]
    pol = load_policy("default")
    assert (pol.start_source, list(pol.reset(32))) == ("cold", start["threads"])


def test_shipped_default_settles_from_its_cold_start():
    """From its recorded cold start the shipped policy still settles near the oracle on the
    hand-written held-out paths (the live evaluation path, one env at a time)."""
    from automdt.agents.ppo import load_policy
    from automdt.simulator.oracle import evaluate_policy_in_sim
    from tests.ppo.conftest import held_out_profiles

    pol = load_policy("default")
    for name, prof in held_out_profiles().items():
        traj = evaluate_policy_in_sim(pol, prof, steps=60, seed=0)
        assert tuple(traj.threads[0]) != (1, 1, 1) or pol.start_threads == (1, 1, 1)
        assert traj.fraction_of_oracle >= 0.9, (name, traj.settled_threads, traj.oracle.threads)
