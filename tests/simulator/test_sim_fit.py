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


def _drop_waiting(samples, min_busy=0.2):
    """What ``automdt.explore.record_to_sample`` does: a stage whose threads were busy less than a
    fifth of the interval is unusable (bytes 0); ``moved`` keeps what it moved."""
    out = []
    for s in samples:
        s = dict(s, moved=list(s["bytes"]))
        s["bytes"] = [b if busy >= min_busy * n * s["interval_s"] else 0.0
                      for b, busy, n in zip(s["bytes"], s["busy_s"], s["threads"])]
        out.append(s)
    return out


# read-bound like the experiments' scenarios, with a network 40x faster per thread than the
# bottleneck: at any thread count its threads wait on the sender buffer >= 80% of the time.
STARVED = Profile(read=StageProfile(10e6, 80e6), net=StageProfile(400e6, 2e9), write=StageProfile(40e6, 200e6),
                  sender_buffer=2**27, receiver_buffer=2**27, noise=0.05)


@pytest.mark.parametrize("seed", range(5))
def test_stage_that_never_limits_gets_flagged_lower_bounds(seed):
    samples = _drop_waiting(synthetic_samples(STARVED, 60, np.random.default_rng(seed)))
    fit = fit_profile(samples, buffers=(2**27, 2**27), max_threads=32)
    info = fit.meta["fit"]["stages"]["net"]
    assert info["few_samples"] and info["tpt_lower_bound"] and info["bandwidth_lower_bound"]
    assert info["samples_used"] < 3 and not info["saturated"]
    assert 0 < info["tpt_bound_bps"] <= STARVED.net.tpt and fit.net.tpt == info["tpt_bound_bps"]
    assert 70e6 <= info["bandwidth_bound_bps"] <= STARVED.net.bandwidth  # at least the path's rate
    assert fit.net.tpt_spread == fit.net.bandwidth_spread == 0.0
    # the bottleneck is still fitted, and stays the simulator's bottleneck
    assert fit.read.tpt == pytest.approx(10e6, rel=0.10) and fit.read.bandwidth == pytest.approx(80e6, rel=0.10)
    assert fit.bottleneck == "read"
    assert fit.achievable_bps == pytest.approx(STARVED.achievable_bps, rel=0.10)
    assert fit.write.tpt == pytest.approx(40e6, rel=0.10)


def test_lower_bounds_from_achieved_throughput_alone():
    # no usable network sample at all: per-thread and stage bounds come from what it moved
    samples = _drop_waiting(synthetic_samples(STARVED, 60, np.random.default_rng(7)))
    for s in samples:
        s["bytes"][1] = 0.0
    fit = fit_profile(samples, max_threads=32)
    info = fit.meta["fit"]["stages"]["net"]
    assert info["samples_used"] == 0 and info["tpt_source"] == "highest throughput per thread"
    achieved = max(s["moved"][1] / s["interval_s"] for s in samples)
    assert info["bandwidth_bound_bps"] == pytest.approx(achieved)
    assert info["tpt_bound_bps"] == pytest.approx(max(s["moved"][1] / s["threads"][1] for s in samples))
    assert info["tpt_bound_bps"] <= STARVED.net.tpt and info["bandwidth_bound_bps"] <= STARVED.net.bandwidth
    assert fit.bottleneck == "read"


def test_lower_bound_stage_is_kept_above_the_measured_bottleneck():
    from automdt.simulator.oracle import oracle

    # Only samples with every network connection open: the per-thread bound (rate / 32) times 32
    # ties with the read plateau; the fit places the network 25% above it.
    samples = _drop_waiting(synthetic_samples(STARVED, 60, np.random.default_rng(3)))
    for s in samples:
        s["threads"][1], s["bytes"][1] = 32, 0.0
    fit = fit_profile(samples, max_threads=32)
    info = fit.meta["fit"]["stages"]["net"]
    assert info["raised_above_bottleneck"]
    assert info["bandwidth_bound_bps"] <= STARVED.net.bandwidth
    assert fit.net.bandwidth >= 1.25 * fit.read.bandwidth * 0.999
    assert fit.bottleneck == "read"
    assert oracle(fit).threads[0] == pytest.approx(oracle(STARVED).threads[0], abs=1)


def test_few_samples_on_the_slope_are_not_a_plateau():
    # three usable samples at 3, 4 and 7 threads, all at 40 MB/s per thread (a starved fast stage)
    rows = [([27, 3, 17], 118e6), ([29, 4, 4], 158e6), ([22, 7, 7], 81e6)]
    samples = []
    for (thr, moved) in rows:
        busy = moved / 40e6
        samples.append({"threads": thr, "bytes": [thr[0] * 10e6, moved, 0.0], "moved": [80e6, moved, 80e6],
                        "busy_s": [thr[0], busy, 1.0], "interval_s": 1.0})
    info = fit_profile(samples, max_threads=32).meta["fit"]["stages"]["net"]
    assert not info["tpt_lower_bound"] and not info["saturated"]
    assert fit_profile(samples, max_threads=32).net.tpt == pytest.approx(40e6)


def test_profile_with_bounds_round_trips(tmp_path):
    samples = _drop_waiting(synthetic_samples(STARVED, 40, np.random.default_rng(0)))
    fit = fit_profile(samples, max_threads=32)
    fit.save(tmp_path / "p.yaml")
    again = Profile.load(tmp_path / "p.yaml")
    assert again.meta["fit"]["stages"]["net"] == fit.meta["fit"]["stages"]["net"]
    assert again.net == fit.net and again.bottleneck == "read"


def test_bad_samples():
    with pytest.raises(ProfileError, match="no samples"):
        fit_profile([])
    with pytest.raises(ProfileError, match="usable samples"):
        fit_profile([{"threads": [1, 1, 1], "bytes": [0, 0, 0], "busy_s": [1, 1, 1]}] * 5)
    with pytest.raises(ProfileError, match="stage write has no usable samples"):
        fit_profile([{"threads": [1, 1, 1], "bytes": [1e6, 1e6, 0], "busy_s": [1, 1, 1]}] * 5)
    with pytest.raises(ProfileError, match="sample 0"):
        fit_profile([{"threads": [1, 1, 1]}])


def _lagged(samples, profile, chunk):
    """Bytes counted at chunk completion: in an interval where a slope stage's thread count rose,
    each new thread's last chunk (on average half of one) is still in progress at the end. As in
    ``automdt.explore.record_to_sample``, an interval after a decrease is unusable (bytes 0)."""
    out, prev = [], None
    for s in samples:
        started = [max(0, n - (p if prev is not None else 0))
                   for n, p in zip(s["threads"], prev["threads"] if prev is not None else (0, 0, 0))]
        lag = [k * chunk / 2 if n * st.tpt < st.bandwidth else 0.0
               for k, n, st in zip(started, s["threads"], profile.stages)]
        fell = [prev is not None and n < p for n, p in zip(s["threads"], prev["threads"] if prev else (0, 0, 0))]
        out.append(dict(s, bytes=[0.0 if f else max(1.0, b - d) for b, d, f in zip(s["bytes"], lag, fell)],
                        inflight_bytes=[k * chunk / 2 for k in started]))
        prev = s
    return out


def test_inflight_bytes_correct_the_per_thread_rate_after_thread_rises():
    quiet = TRUE.replace(noise=0.005)
    samples = _lagged(synthetic_samples(quiet, 120, np.random.default_rng(3)), quiet, chunk=8e6)
    with_inflight = fit_profile(samples)
    without = fit_profile([{k: v for k, v in s.items() if k != "inflight_bytes"} for s in samples])
    # half a chunk is 10% of a read thread's interval, 13% of a write thread's, 3% of a net one's
    assert without.read.tpt < 0.97 * quiet.read.tpt and without.write.tpt < 0.97 * quiet.write.tpt
    for got, raw, want in zip(with_inflight.stages, without.stages, quiet.stages):
        assert got.tpt == pytest.approx(want.tpt, rel=0.02)
        assert abs(got.tpt - want.tpt) <= abs(raw.tpt - want.tpt)
        assert got.bandwidth == pytest.approx(raw.bandwidth, rel=0.02), "plateaus use the bytes as counted"
