"""Every baseline returns integer counts in [1, max_threads] under arbitrary observations, and is
deterministic given its seed and inputs."""
import numpy as np
import pytest

from automdt.agents.base import Policy
from automdt.agents.falcon import FalconPolicy
from automdt.agents.heuristic import HeuristicPolicy
from automdt.agents.marlin import MarlinPolicy
from automdt.agents.model_based import ModelBasedPolicy
from automdt.agents.static import StaticPolicy
from automdt.agents.registry import make_policy
from automdt.simulator.types import Observation

SPECS = ["static:3,40,1", "globus", "marlin", "falcon", "heuristic", "model"]


def _random_obs(rng, threads, max_threads):
    scale = 10.0 ** rng.uniform(0, 10)
    tput = rng.uniform(0, 1, 3) * scale
    if rng.random() < 0.1:
        tput[rng.integers(3)] = 0.0
    if rng.random() < 0.05:
        tput[rng.integers(3)] = rng.choice([np.nan, np.inf, -1.0])
    fill = rng.choice([0.0, 1.0, rng.uniform()], 2)
    loss = rng.choice([0.0, rng.uniform(0, 0.2), 1.5])
    # What ran is not always exactly what the policy asked (e.g. an engine that clamps).
    ran = threads if rng.random() < 0.8 else tuple(int(x) for x in rng.integers(1, max_threads + 1, 3))
    return Observation(
        threads=ran,
        throughput_bps=tuple(float(x) for x in tput),
        buffer_fill=tuple(float(x) for x in fill),
        interval_s=1.0,
        max_threads=max_threads,
        loss=float(loss),
        buffer_bytes=(1 << 30, 1 << 30),
    )


def _valid(triple, max_threads):
    return (
        isinstance(triple, tuple)
        and len(triple) == 3
        and all(type(x) is int and 1 <= x <= max_threads for x in triple)
    )


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("max_threads", [1, 2, 7, 64])
def test_counts_stay_in_bounds(spec, max_threads):
    rng = np.random.default_rng(1234 + max_threads)
    policy = make_policy(spec, max_threads)
    assert isinstance(policy, Policy) and isinstance(policy.name, str)
    for episode in range(3):
        triple = policy.reset(max_threads, seed=episode)
        assert _valid(triple, max_threads), triple
        for _ in range(150):
            triple = policy.act(_random_obs(rng, triple, max_threads))
            assert _valid(triple, max_threads), (spec, triple)


@pytest.mark.parametrize("spec", SPECS)
def test_deterministic(spec):
    def run():
        rng = np.random.default_rng(7)
        p = make_policy(spec, 16)
        out = [p.reset(16, seed=3)]
        for _ in range(80):
            out.append(p.act(_random_obs(rng, out[-1], 16)))
        return out

    assert run() == run()


@pytest.mark.parametrize(
    "factory",
    [lambda: StaticPolicy(3, 40, 1), MarlinPolicy, FalconPolicy, HeuristicPolicy, ModelBasedPolicy],
)
def test_act_without_reset_uses_the_observation_bound(factory):
    p = factory()  # built without a bound and never reset
    obs = Observation(threads=(1, 1, 1), throughput_bps=(1e6, 1e6, 1e6), buffer_fill=(0.5, 0.5), max_threads=4)
    assert _valid(p.act(obs), 4)
