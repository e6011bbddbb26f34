"""The ablation's simulator half: a reproducible held-out generator, scores that mean what they
say, statistics, results files and the command."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from automdt.experiments import ablation as A
from automdt.simulator.oracle import oracle


def test_the_generator_is_seeded_covers_every_family_and_its_ranges():
    cases = A.held_out_cases(6)
    again = A.held_out_cases(6)
    assert [c.describe() for c in cases] == [c.describe() for c in again]
    assert {c.family for c in cases} == set(A.FAMILIES) and len(cases) == 6 * len(A.FAMILIES)
    other = A.held_out_cases(6, seed=A.HELD_OUT_SEED + 1)
    assert [c.describe() for c in other] != [c.describe() for c in cases]
    for c in A.held_out_cases(20):
        p = c.profile
        assert p.max_threads in (8, 16, 32, 64) and 0.5 <= p.interval_s <= 3.0
        assert 32 * A.MiB <= p.sender_buffer <= 1024 * A.MiB and 32 * A.MiB <= p.receiver_buffer <= 1024 * A.MiB
        if c.family in ("moving", "link", "competing"):
            assert c.events and all(A.SCORE_FROM <= at < A.STEPS for at, _ in c.events)
        else:
            assert not c.events
        if c.family == "contention":
            assert p.has_contention
        if c.family == "noise":
            assert p.noise >= 0.12


def test_training_never_imports_the_held_out_generator():
    code = ("import sys, automdt.agents.training, automdt.agents.families, automdt.agents.registry;"
            "print('automdt.experiments.ablation' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_competing_transfer_takes_its_fair_share_of_the_link():
    """The competing family's network stage carries B n / (n + k) with k connections of the other
    transfer (the USL form it is written in)."""
    case = next(c for c in A.held_out_cases(10, families=["competing"]) if c.profile.net.bandwidth < c.profile.net.tpt * 40)
    shared = case.events[0][1].net
    k = round(1 / shared.contention) - 1
    for n in (1, 4, 16):
        want = min(case.profile.net.tpt * n, case.profile.net.bandwidth * n / (n + k))
        got = float(case.events[0][1].capacities((1, n, 1))[1])
        assert got == pytest.approx(want, rel=0.35)


def test_best_static_is_the_oracle_on_a_static_path_and_scores_near_one():
    case = A.held_out_cases(3, families=["static"])[1]
    assert A.best_static(case) == oracle(case.profile).threads
    row = A.run_case(case, "best-static", 0)
    assert 0.9 <= row["fraction"] <= 1.1 and row["below_half"] == 0


def test_a_controller_that_never_adapts_scores_what_it_delivers():
    """One thread per stage on a path that needs many: the fraction is that triple's utility over
    the oracle's, computed independently here from the steady state."""
    case = A.held_out_cases(4, families=["static"])[2]
    p = case.profile
    row = A.run_case(case, "static:1,1,1", 0)
    steady = float(p.steady_throughput((1, 1, 1))) / p.achievable_bps * 3 / 1.02
    assert row["fraction"] == pytest.approx(steady / oracle(p).utility, rel=0.15)


def test_summary_statistics_and_paired_differences():
    rows = []
    for i in range(20):
        for lab, v in (("model", 0.8 + 0.01 * (i % 5)), ("good", 0.9 + 0.01 * (i % 5))):
            rows.append({"case": f"c{i}", "family": "static", "controller": lab, "rep": 0, "fraction": v,
                         "whole": v, "below_half": 0, "recovery": [], "mean_threads": [1, 1, 1], "max_threads": 8})
    s = A.summarize(rows)["static"]
    assert s["good"]["mean"] == pytest.approx(0.92) and s["good"]["worst"] == pytest.approx(0.9)
    assert s["good"]["diff_vs_model"] == pytest.approx(0.1) and s["good"]["diff_ci"][0] == pytest.approx(0.1)
    lo, hi = s["model"]["mean_ci"]
    assert lo < 0.82 < hi and hi - lo < 0.02
    x = np.array([0.5, 1.0] * 50)
    lo, hi = A.bootstrap(x, np.mean)
    assert lo < 0.75 < hi


def test_the_command_writes_results_and_tables(tmp_path):
    rc = subprocess.run([sys.executable, "-m", "automdt.experiments", "ablation", "--quick", "--workers", "1",
                         "--controllers", "default,model,best-static", "--families", "static,moving",
                         "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert rc.returncode == 0, rc.stderr
    run = next(tmp_path.iterdir())
    data = json.loads((run / "ablation-sim.json").read_text())
    assert data["config"]["cases"] == 4 and set(data["summary"]) == {"static", "moving", "all"}
    assert set(data["summary"]["all"]) == {"default", "model", "best-static"}
    assert len(data["rows"]) == 4 * 3
    table = (run / "ablation-sim.md").read_text()
    assert "| default |" in table and "**moving**" in table and table == A.sim_tables(str(run / "ablation-sim.json"))
    bad = subprocess.run([sys.executable, "-m", "automdt.experiments", "ablation", "--quick", "--controllers", "nope"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "nope" in bad.stderr and "Traceback" not in bad.stderr


def test_the_residual_starts_from_the_base_controller_and_trains(tmp_path):
    """With "keep" chosen on every stage the residual runs exactly the capacity controller under
    the shield; a short training run writes a network the ablation can run."""
    from automdt.agents.capacity import CapacityPolicy
    from automdt.agents.shield import Shield
    from automdt.experiments import residual as R

    assert R.apply_residual((8, 3, 1), (R.KEEP,) * 3, 32) == (8, 3, 1)
    assert R.apply_residual((8, 3, 1), (0, 1, 4), 32) == (6, 2, 1)
    case = A.held_out_cases(2, families=["moving"])[1]

    class Keep(R.ResidualPolicy):
        def __init__(self, max_threads=32):
            self.agent = R.Agent()
            self.agent.reset(max_threads)

        def act(self, obs):
            self.agent.observe(obs)
            return self.agent.choose((R.KEEP,) * 3)

    keep = A.run_case(case, "keep", 0, lambda lab, c: Keep(c.profile.max_threads))
    base = A.run_case(case, "base", 0, lambda lab, c: Shield(CapacityPolicy(max_threads=c.profile.max_threads),
                                                             c.profile.max_threads))
    assert keep["fraction"] == base["fraction"] and keep["mean_threads"] == base["mean_threads"]
    out = R.train(256, str(tmp_path / "r.zip"), num_envs=4)
    row = A.run_case(case, "residual", 0, lambda lab, c: R.ResidualPolicy(out, c.profile.max_threads))
    assert 0.0 < row["fraction"] < 1.5
