"""A fitted profile is judged by what the exploration delivered: a stage's capacity counts only if
the stage was seen limiting the path; otherwise the profile never promises more than was seen."""
from __future__ import annotations

import numpy as np
import pytest

from automdt.simulator.fit import (EVIDENCE_SIGMAS, end_to_end_evidence, fit_profile, judge_evidence,
                                   synthetic_samples, weak_fit_reasons)
from automdt.simulator.oracle import oracle
from automdt.simulator.profile import Profile, StageProfile

MB = 1e6
CHUNK = 4 << 20


def _delivered_max(samples) -> float:
    return max(s.get("moved", s["bytes"])[2] / s["interval_s"] for s in samples)


def _held_outside_the_stages(n: int, seed: int, limit: float = 32 * MB, tpt=(10 * MB, 40 * MB, 40 * MB),
                             max_threads: int = 32) -> list[dict]:
    """Samples of a path held at ``limit`` by something the three stages do not show (on the real
    engine: staging buffers of a few chunks, ``--memory 16Mi`` at 4 MiB chunks). Every busy thread
    runs at its stage's per-thread rate and no stage ever reaches a plateau, so the busy-time fit
    sees three fast stages; what the path delivered never passes ``limit``. A stage busy less than
    a fifth of the interval is unusable (bytes 0), as :meth:`IntervalRecord.to_sample` marks it."""
    rng = np.random.default_rng(seed)
    out = []
    for j in range(n):
        thr = rng.integers(1, max_threads + 1, size=3)
        rate = min(limit, float(min(thr * np.asarray(tpt))))
        moved = [rate * (1.0 + 0.02 * rng.standard_normal()) for _ in range(3)]
        busy = [m / t for m, t in zip(moved, tpt)]
        usable = [b >= 0.2 * k for b, k in zip(busy, thr)]
        out.append({"t": j + 1.0, "threads": [int(x) for x in thr], "interval_s": 1.0,
                    "bytes": [m if ok else 0.0 for m, ok in zip(moved, usable)], "moved": moved, "busy_s": busy,
                    "wait_s": [float(k) - b for k, b in zip(thr, busy)], "buffer": [0.95, 0.0]})
    return out


@pytest.mark.parametrize("seed", range(3))
def test_a_path_no_stage_was_seen_limiting_promises_no_more_than_it_delivered(seed):
    samples = _held_outside_the_stages(30, seed)
    fit = fit_profile(samples, max_threads=32, chunk_bytes=CHUNK)
    ev = fit.meta["fit"]["evidence"]
    best = oracle(fit).throughput_bps
    assert best <= _delivered_max(samples) * (1.0 + ev["margin"]), (best, _delivered_max(samples))
    assert best >= 0.9 * 32 * MB  # capped at what was seen, not below it
    assert ev["seen_limiting"] == [] and ev["capped"] and ev["promised_bps"] > 5 * 32 * MB
    assert all(fit.meta["fit"]["stages"][s]["capped_to_end_to_end"] for s in ("read", "net", "write"))
    reasons = weak_fit_reasons(fit)
    assert any("more than the exploration ever delivered" in r and "MB/s" in r for r in reasons), reasons


def _details(**stages):
    base = {"few_samples": False, "tpt_lower_bound": False, "bandwidth_lower_bound": False, "saturated": True}
    return {name: dict(base, **kw) for name, kw in stages.items()}


def _judged(profile_stages, details, samples):
    prof = Profile(*profile_stages, sender_buffer=256 << 20, receiver_buffer=256 << 20,
                   meta={"fit": {"n_samples": len(samples), "stages": details}})
    return judge_evidence(prof, samples, chunk_bytes=CHUNK)


def _flat(rates, threads=(8, 8, 8)):
    return [{"threads": list(threads), "bytes": [r, r, r], "moved": [r, r, r], "busy_s": [8.0, 8.0, 8.0],
             "interval_s": 1.0} for r in rates]


def test_a_measured_plateau_above_every_delivered_rate_is_only_a_lower_bound():
    # the network "saturated" at 77.8 MB/s from busy time, read at 119 MB/s; the path never
    # delivered more than 40 MB/s: neither was seen limiting it
    samples = _flat([36 * MB, 39.3 * MB, 39.5 * MB, 40 * MB, 28 * MB, 39.9 * MB, 24 * MB, 39.3 * MB])
    fit = _judged((StageProfile(12.5 * MB, 119 * MB), StageProfile(39.3 * MB, 77.8 * MB), StageProfile(13.3 * MB, 426 * MB)),
                  _details(read={}, net={}, write={"few_samples": True, "bandwidth_lower_bound": True,
                                                   "tpt_lower_bound": True, "saturated": False}), samples)
    stages = fit.meta["fit"]["stages"]
    assert stages["net"]["not_seen_limiting"] == "above the highest delivered rate"
    assert stages["net"]["bandwidth_lower_bound"] and stages["net"]["fitted_bandwidth_bps"] == 77.8 * MB
    assert oracle(fit).throughput_bps <= 40 * MB * (1.0 + fit.meta["fit"]["evidence"]["margin"])
    assert any("promised 77.8 MB/s" in r for r in weak_fit_reasons(fit)), weak_fit_reasons(fit)


def test_a_stage_below_what_the_path_kept_up_is_not_the_bottleneck():
    # read "saturated" at 14.5 MB/s, yet the path kept 40 MB/s through all three stages; the
    # network was seen limiting at 40: read is only a lower bound, kept above the network
    samples = _flat([40 * MB, 39.8 * MB, 40.1 * MB, 39.9 * MB, 20 * MB, 40 * MB] * 2)
    fit = _judged((StageProfile(11.6 * MB, 14.5 * MB), StageProfile(40 * MB, 40 * MB), StageProfile(40 * MB, 1000 * MB)),
                  _details(read={}, net={}, write={"bandwidth_lower_bound": True, "saturated": False}), samples)
    stages = fit.meta["fit"]["stages"]
    assert stages["read"]["not_seen_limiting"] == "below the end-to-end rate the path kept up"
    assert stages["net"]["seen_limiting"] and fit.bottleneck == "net"
    assert fit.read.bandwidth >= 1.25 * 40 * MB * 0.999 and stages["read"]["raised_above_bottleneck"]
    assert oracle(fit).throughput_bps == pytest.approx(40 * MB, rel=0.01)
    assert weak_fit_reasons(fit) == []


def test_a_stage_limited_by_its_threads_at_max_threads_counts_as_seen_limiting():
    # write: 4 MB/s per thread and no plateau within 8 threads; the path delivers 32 MB/s there
    true = Profile(read=StageProfile(50 * MB, 1e9), net=StageProfile(50 * MB, 1e9), write=StageProfile(4 * MB, 1e9),
                   sender_buffer=64 << 20, receiver_buffer=64 << 20, max_threads=8, noise=0.02)
    samples = synthetic_samples(true, 60, np.random.default_rng(0))
    fit = fit_profile(samples, max_threads=8)
    write = fit.meta["fit"]["stages"]["write"]
    assert write["bandwidth_lower_bound"] and not write["tpt_lower_bound"] and write["seen_limiting"]
    assert fit.meta["fit"]["evidence"]["seen_limiting"] == ["write"]
    assert oracle(fit).throughput_bps == pytest.approx(32 * MB, rel=0.1)
    assert weak_fit_reasons(fit) == []


def test_a_well_explored_bottleneck_keeps_its_measured_bandwidth():
    true = Profile(read=StageProfile(40e6, 400e6), net=StageProfile(120e6, 1000e6), write=StageProfile(30e6, 300e6),
                   sender_buffer=2**28, receiver_buffer=2**28, noise=0.05)
    samples = synthetic_samples(true, 120, np.random.default_rng(4))
    fit = fit_profile(samples, max_threads=32)
    ev = fit.meta["fit"]["evidence"]
    assert ev["seen_limiting"] == ["write"] and not ev["capped"]
    assert fit.write.bandwidth == pytest.approx(300e6, rel=0.1) and fit.bottleneck == "write"
    # read and network plateaus were measured from busy time but the path never ran at them
    assert fit.meta["fit"]["stages"]["net"]["not_seen_limiting"] == "above the highest delivered rate"
    assert fit.net.bandwidth == pytest.approx(1000e6, rel=0.1)  # kept, as a lower bound
    assert oracle(fit).throughput_bps <= _delivered_max(samples) * (1.0 + ev["margin"])
    assert weak_fit_reasons(fit) == []


def test_the_evidence_margin_is_count_resolution_plus_two_deviations_of_the_ceiling():
    ev = end_to_end_evidence(_flat([40 * MB] * 12), chunk_bytes=CHUNK)
    assert ev["noise"] == 0.0 and ev["resolution"] == pytest.approx(CHUNK / (40 * MB), rel=1e-3)
    assert ev["margin"] == pytest.approx(ev["resolution"], abs=1e-4)
    rng = np.random.default_rng(0)
    noisy = end_to_end_evidence(_flat(list(40 * MB * (1 + 0.05 * rng.standard_normal(200)))), chunk_bytes=None)
    assert noisy["noise"] == pytest.approx(0.05, rel=0.25)  # a robust std of the rates at the ceiling
    assert noisy["margin"] == pytest.approx(EVIDENCE_SIGMAS * noisy["noise"], abs=1e-3)


def test_samples_with_unusable_bytes_and_no_moved_field_do_not_lower_the_evidence():
    # older sample files had no "moved": a stage zeroed as unusable leaves the interval's
    # through-rate unknown instead of 0
    samples = _flat([40 * MB] * 6)
    for s in samples:
        del s["moved"]
    samples[0]["bytes"][0] = 0.0
    ev = end_to_end_evidence(samples)
    assert ev["top_bps"] == pytest.approx(40 * MB) and ev["intervals"] == 6
