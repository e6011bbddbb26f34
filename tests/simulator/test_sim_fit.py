"""Profile fitting from exploration samples."""
from __future__ import annotations

import numpy as np
import pytest

from automdt.simulator.fit import fit_profile, synthetic_samples
from automdt.simulator.profile import Profile, ProfileError, StageProfile

TRUE = Profile(read=StageProfile(40e6, 400e6), net=StageProfile(120e6, 1000e6), write=StageProfile(30e6, 300e6),
               sender_buffer=2**28, receiver_buffer=2**28, noise=0.05)


@pytest.mark.parametrize("seed", range(5))
def test_fit_recovers_known_profile_within_10_percent(seed):
    samples = synthetic_samples(TRUE, 120, np.random.default_rng(seed))  # two minutes at 1 s
    fit = fit_profile(samples, buffers=(2**28, 2**28), max_threads=32)
    for got, want in zip(fit.stages, TRUE.stages):
        assert got.tpt == pytest.approx(want.tpt, rel=0.10)
        assert got.bandwidth == pytest.approx(want.bandwidth, rel=0.10)
        assert 0 < got.tpt_spread < 0.05 and 0 < got.bandwidth_spread < 0.05
    assert fit.noise == pytest.approx(0.05, rel=0.25)
    assert all(fit.meta["fit"]["stages"][s]["saturated"] for s in ("read", "net", "write"))
    assert fit.samples == samples and fit.interval_s == 1.0


def test_unsaturated_stage_gives_a_lower_bound():
    # write: 32 threads * 30 MB/s = 960 MB/s < B_w = 2 GB/s: never saturated in exploration
    p = TRUE.replace(write=StageProfile(30e6, 2e9))
    fit = fit_profile(synthetic_samples(p, 120, np.random.default_rng(0)), max_threads=32)
    info = fit.meta["fit"]["stages"]["write"]
    assert not info["saturated"] and info["bandwidth_lower_bound"]
    assert fit.write.tpt == pytest.approx(30e6, rel=0.10)
    assert fit.write.bandwidth == pytest.approx(32 * fit.write.tpt, rel=0.10)  # n * TPT
    assert fit.write.bandwidth_spread == 0.0


def test_stage_saturated_by_one_thread():
    p = TRUE.replace(read=StageProfile(500e6, 400e6))  # one read thread already exceeds B_r
    fit = fit_profile(synthetic_samples(p, 60, np.random.default_rng(1)))
    assert fit.meta["fit"]["stages"]["read"]["tpt_lower_bound"]
    assert fit.read.bandwidth == pytest.approx(400e6, rel=0.10)
    assert fit.read.tpt >= 0.9 * 400e6  # only bounded from below
    assert fit.achievable_bps == pytest.approx(p.achievable_bps, rel=0.10)


def test_fitted_profile_gives_the_same_oracle():
    from automdt.simulator.oracle import oracle

    fit = fit_profile(synthetic_samples(TRUE, 60, np.random.default_rng(2)))
    a, b = np.array(oracle(fit).threads), np.array(oracle(TRUE).threads)
    assert np.abs(a - b).max() <= 1


def test_samples_without_busy_counters_are_usable():
    samples = synthetic_samples(TRUE, 60, np.random.default_rng(0))
    for s in samples:
        del s["busy_s"]
    fit = fit_profile(samples)  # falls back to wait_s
    assert fit.read.tpt == pytest.approx(40e6, rel=0.10)


def test_bad_samples():
    with pytest.raises(ProfileError, match="no samples"):
        fit_profile([])
    with pytest.raises(ProfileError, match="usable samples"):
        fit_profile([{"threads": [1, 1, 1], "bytes": [0, 0, 0], "busy_s": [1, 1, 1]}] * 5)
    with pytest.raises(ProfileError, match="sample 0"):
        fit_profile([{"threads": [1, 1, 1]}])
