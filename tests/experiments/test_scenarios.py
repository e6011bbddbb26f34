"""Scenarios, datasets and metrics of automdt.experiments (no transfers; fast)."""
import hashlib
import os

import pytest

from automdt.experiments import metrics as M
from automdt.experiments.scenarios import (MB, SCENARIOS, DatasetSpec, Scenario, bottleneck_scenarios,
                                           large_dataset, mixed_dataset)
from automdt.units import parse_throttle


@pytest.mark.parametrize("name,opt", [("read-bound", (8, 2, 2)), ("net-bound", (2, 8, 2)),
                                      ("write-bound", (2, 2, 8))])
def test_bottleneck_scenarios_are_analytic(name, opt):
    sc = SCENARIOS[name]
    assert sc.achievable_bps == 80 * MB
    assert sc.optimum == opt
    assert sc.min_bottleneck_threads == 8
    # The simulator's oracle, on the same path as a profile, agrees with the hand computation.
    assert sc.oracle_threads() == opt
    prof = sc.profile()
    assert prof.bottleneck == sc.bottleneck
    assert prof.steady_throughput(opt) == pytest.approx(80 * MB)
    # One thread fewer on the bottleneck stage loses 1/8 of the throughput.
    less = list(opt)
    less[("read", "net", "write").index(sc.bottleneck)] -= 1
    assert prof.steady_throughput(less) == pytest.approx(70 * MB)
    # The CLI spelling of the throttles is the same throttles.
    assert {k: tuple(v) for k, v in parse_throttle(sc.throttle_spec()).items()} == \
        {k: tuple(float(x) for x in v) for k, v in sc.throttle.items()}


def test_scaled_scenarios_and_validation():
    sc = bottleneck_scenarios(rate_bps=40 * MB)["write-bound"]
    assert sc.achievable_bps == 40 * MB and sc.optimum == (2, 2, 8)
    with pytest.raises(ValueError):
        Scenario("bad", "read", {"read": (10e6, 100e6), "net": (10e6, 50e6), "write": (10e6, 100e6)})


def test_mixed_dataset_follows_the_slides_mix():
    sizes, info = mixed_dataset(480 * MB, 100, seed=3).sizes()
    assert len(sizes) == 100 and sum(sizes) == 480 * MB
    cls = info["classes"]
    assert [cls[c]["files"] for c in ("medium", "large", "small", "gap")] == [80, 10, 5, 5]
    labels = info["labels"]
    # the classes keep their order after scaling: small < medium < gap < large
    by = {c: [s for s, lab in zip(sizes, labels) if lab == c] for c in cls}
    assert max(by["small"]) <= min(by["medium"]) * 1.01
    assert max(by["medium"]) <= min(by["gap"]) * 1.01
    assert max(by["gap"]) <= min(by["large"]) * 1.01
    # reproducible from the seed, different for another seed
    assert mixed_dataset(480 * MB, 100, seed=3).sizes()[0] == sizes
    assert mixed_dataset(480 * MB, 100, seed=4).sizes()[0] != sizes


def test_dataset_generation_is_reproducible(tmp_path):
    spec = DatasetSpec("mixed", 6 * MB, 12, seed=1)
    a = spec.generate(str(tmp_path / "a"))
    b = spec.generate(str(tmp_path / "b"))
    assert a.total_bytes == 6 * MB and len(a.files) == 12

    def digest(ds):
        h = hashlib.sha256()
        for rel in ds.files:
            with open(os.path.join(ds.path, rel), "rb") as f:
                h.update(f.read())
        return h.hexdigest()

    assert digest(a) == digest(b)
    c = DatasetSpec("mixed", 6 * MB, 12, seed=2).generate(str(tmp_path / "c"))
    assert digest(c) != digest(a)
    # incompressible enough: not a run of one byte
    with open(os.path.join(a.path, a.files[0]), "rb") as f:
        head = f.read(4096)
    assert len(set(head)) > 200
    big = large_dataset(3 * MB + 1, 3).sizes()[0]
    assert sum(big) == 3 * MB + 1 and len(big) == 3


def _rows(tputs, threads=(8, 2, 2)):
    return [{"t": float(i + 1), "tput_write": x * MB, "threads_read": threads[0], "threads_net": threads[1],
             "threads_write": threads[2], "cpu": 10.0} for i, x in enumerate(tputs)]


def test_convergence_time_needs_reach_and_hold():
    # reaches 72 at t=2 but falls back; holds from t=5
    rows = _rows([30, 75, 40, 60, 76, 79, 78, 80])
    assert M.convergence_time(rows, 80 * MB) == 5.0
    assert M.convergence_time(_rows([10, 20, 30]), 80 * MB) is None
    m = M.run_metrics(rows, 80 * MB, "read", {"read": 8, "net": 2, "write": 2})
    assert m["converged"] and m["conv_s"] == 5.0 and m["after_intervals"] == 3
    assert m["after_std_sum"] == 0.0 and m["bottleneck_within1_frac"] == 1.0
    assert m["mean_total_threads"] == 12.0


def test_stability_metrics_see_fluctuating_threads():
    rows = _rows([80] * 6)
    for r, n in zip(rows, (8, 12, 4, 8, 14, 3)):
        r["threads_read"] = n
    m = M.run_metrics(rows, 80 * MB, "read", {"read": 8, "net": 2, "write": 2})
    assert m["conv_s"] == 1.0
    assert m["after_spread_read"] == 11 and m["after_changes"] == 4
    assert m["after_std_read"] > 3
    assert m["bottleneck_within1_frac"] == pytest.approx(1 / 5)


def test_jain_and_ratio():
    assert M.jain_index([1, 1]) == pytest.approx(1.0)
    assert M.jain_index([1, 0]) == pytest.approx(0.5)
    assert M.jain_index([2, 1]) == pytest.approx(0.9)
    assert M.ratio(6, 3) == 2 and M.ratio(None, 3) is None and M.ratio(1, 0) is None
    t = M.md_table(["a", "b"], [[1.234, None], ["x|y", True]])
    assert "| 1.23 | - |" in t and "x\\|y" in t
