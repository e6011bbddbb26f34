"""The privileged controllers of the ablation (experiments/headroom.py): with the true curves one
interval late, the capacity controller's decisions reach the oracle where its estimates do not."""
import numpy as np

from automdt.experiments.ablation import held_out_cases, run_case


def test_true_curves_and_the_lagged_oracle_reach_the_oracle():
    cases = held_out_cases(2, families=("static", "contention", "link"))
    score = {lab: np.mean([run_case(c, lab, 0)["fraction"] for c in cases])
             for lab in ("capacity", "capacity-true", "oracle-lag1")}
    assert score["capacity-true"] >= 0.97 and score["oracle-lag1"] >= 0.97, score
    assert score["capacity-true"] >= score["capacity"] - 0.005, score
