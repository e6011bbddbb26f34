"""The general prober (experiments/prober.py) and the shadow-advantage reward it trains on."""
import numpy as np

from automdt.agents import families as F
from automdt.agents import tuned as T
from automdt.agents.capacity import CapacityPolicy
from automdt.agents.tuned_training import make_vec_env
from automdt.experiments import prober as P


class _Always:
    """An actor that picks one choice on every stage."""

    def __init__(self, choice):
        self.choice = choice

    def mode(self, x):
        return np.full((1, 3), self.choice)


def _venv(shadow):
    return make_vec_env(lambda: P.Prober(), lambda rng: F.episode(rng, "contention"), num_envs=2, seed=3,
                        obs_dim=P.IN_DIM, choices=len(P.CHOICES), shadow=shadow)


def _rewards(venv, action, steps=40):
    venv.reset()
    out = []
    for _ in range(steps):
        venv.step_async(np.full((venv.num_envs, 3), action))
        obs, rew, _, _ = venv.step_wait()
        assert obs.shape == (venv.num_envs, P.IN_DIM)
        out.append(rew)
    return np.asarray(out)


def test_the_advantage_of_the_default_over_itself_is_zero_and_a_probe_shows():
    shadow = lambda m: CapacityPolicy(max_threads=m)  # noqa: E731
    # the same decisions on the same path with the same noise: every interval's advantage is 0
    assert np.abs(_rewards(_venv(shadow), T.CAPACITY)).max() < 1e-9
    # probing down every interval costs against the default, and the reward says so
    probing = _rewards(_venv(shadow), P.DOWN)
    assert probing.mean() < -0.05
    # without the shadow the reward is the fraction of the oracle itself
    plain = _rewards(_venv(None), T.CAPACITY)
    assert 0.3 < plain.mean() < 1.2


def test_probes_move_one_step_and_stay_in_bounds():
    prober = P.Prober(_Always(P.DOWN), max_threads=8)
    prober.reset(8)
    from automdt.policy_contract import Observation

    obs = Observation(threads=(8, 3, 1), throughput_bps=(1e7, 1e7, 1e7), buffer_fill=(0.5, 0.5), max_threads=8,
                      busy_s=(1.0, 1.0, 1.0), wait_s=(0.0, 0.0, 0.0))
    assert len(prober.observe(obs)) == P.IN_DIM
    assert prober.choose([P.DOWN] * 3) == (5, 2, 1)
    assert prober.choose([P.UP] * 3) == (8, 5, 2)


def test_a_trained_prober_loads_and_runs_in_the_ablation(tmp_path):
    from automdt.experiments import ablation as A

    path = P.train(2048, str(tmp_path / "p.zip"), seed=0)
    case = A.held_out_cases(1, families=["static"])[0]
    row = A.run_case(case, f"prober:{path}", 0)
    assert 0.3 < row["fraction"] < 1.2
