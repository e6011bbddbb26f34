"""Every baseline in the buffer simulator, scored against the oracle (skipped if the simulator's
oracle is not available)."""
import numpy as np
import pytest

oracle_mod = pytest.importorskip("automdt.simulator.oracle")
if not hasattr(oracle_mod, "evaluate_policy_in_sim"):
    pytest.skip("automdt.simulator.oracle has no evaluate_policy_in_sim", allow_module_level=True)

from automdt.agents.registry import make_policy  # noqa: E402
from automdt.simulator.profile import Profile, StageProfile  # noqa: E402

SPECS = ["globus", "marlin", "falcon", "heuristic", "model"]


def _profiles():
    net_bound = Profile(
        read=StageProfile(100e6, 1000e6), net=StageProfile(50e6, 400e6), write=StageProfile(80e6, 2000e6),
        sender_buffer=512 << 20, receiver_buffer=512 << 20,
    )
    return {"default": Profile.default(), "net-bound": net_bound}


@pytest.mark.parametrize("profile_name", ["default", "net-bound"])
def test_baselines_run_in_the_simulator(profile_name):
    profile = _profiles()[profile_name]
    fractions = {}
    for spec in SPECS:
        traj = oracle_mod.evaluate_policy_in_sim(make_policy(spec, profile.max_threads), profile, steps=60, seed=3)
        assert traj.threads.min() >= 1 and traj.threads.max() <= profile.max_threads
        assert np.isfinite(traj.fraction_of_oracle)
        fractions[spec] = traj.fraction_of_oracle
        if spec == "model":
            # Noise-free min(n*TPT, B) stages: the fitted model is exact, the solution is the oracle's.
            assert traj.settled_threads == traj.oracle.threads
    assert fractions["model"] > 0.97
    for spec in ("marlin", "falcon", "heuristic"):
        assert fractions[spec] > 0.6, (spec, fractions)
    # A fixed Globus setting wastes threads on two stages and starves the third.
    assert fractions["globus"] < min(fractions[s] for s in ("marlin", "falcon", "model"))
