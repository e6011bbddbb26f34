"""Jung et al.-style model-based policy: probe, fit min(a n, b) per stage, solve for the flow."""
import math

import pytest

from automdt.agents.model_based import ModelBasedPolicy

SCENARIOS = {
    # name: (tpt per thread, stage ceilings) -> bottleneck
    "network": ((100, 50, 80), (1000, 400, 2000)),
    "read": ((30, 100, 100), (300, 1000, 1000)),
    "write": ((100, 100, 40), (2000, 1500, 360)),
    "threads": ((10, 50, 100), (1e6, 1e6, 1e6)),  # no ceiling reached: read is thread-limited at 32
}


def _expected(path, slack=0.02):
    rate, _ = path.optimum()
    return tuple(min(path.max_threads, math.ceil((1 - slack) * rate / path.tpt[i] - 1e-9)) for i in range(3))


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_finds_bottleneck_triple_within_a_few_intervals(name, toy_path, drive):
    tpt, cap = SCENARIOS[name]
    path = toy_path(tpt=tpt, cap=cap, buffers=(500, 500), max_threads=32)
    p = ModelBasedPolicy()
    chosen = drive(p, path, 12)
    # Three isolation probes and two all-high intervals, then the solution.
    assert chosen[:5] == [(1, 32, 32), (32, 1, 32), (32, 32, 1), (32, 32, 32), (32, 32, 32)]
    expect = _expected(path)
    assert chosen[5] == expect
    assert all(c == expect for c in chosen[5:])  # clean model: it stays
    rate, exact = path.optimum()
    assert sum(expect) <= sum(exact)
    assert p.planned_rate == pytest.approx(0.98 * rate, rel=1e-6)


def test_network_bottleneck_numbers(toy_path, drive):
    # R* = min(min(32*100, 1000), min(32*50, 400), min(32*80, 2000)) = 400 (network);
    # n* = ceil(392/100), ceil(392/50), ceil(392/80) = (4, 8, 5).
    path = toy_path(tpt=(100, 50, 80), cap=(1000, 400, 2000), buffers=(500, 500), max_threads=32)
    p = ModelBasedPolicy()
    assert drive(p, path, 6)[-1] == (4, 8, 5)
    assert p.a == pytest.approx([100, 50, 80])
    assert p.b[1] == pytest.approx(400)


def test_censoring():
    p = ModelBasedPolicy()
    p.reset(8)
    from automdt.simulator.types import Observation

    def o(fs, fr):
        return Observation(threads=(1, 1, 1), throughput_bps=(1, 1, 1), buffer_fill=(fs, fr))

    assert p.uncensored(o(0.5, 0.5)) == (True, True, True)
    assert p.uncensored(o(1.0, 0.5)) == (False, True, True)  # read blocked by a full S
    assert p.uncensored(o(0.0, 0.5)) == (True, False, True)  # network starved by an empty S
    assert p.uncensored(o(0.5, 1.0)) == (True, False, True)  # network blocked by a full R
    assert p.uncensored(o(0.5, 0.0)) == (True, True, False)  # write starved by an empty R


def test_refits_a_stage_that_falls_short(toy_path, drive):
    path = toy_path(tpt=(100, 50, 80), cap=(1000, 400, 2000), buffers=(500, 500), max_threads=32)
    p = ModelBasedPolicy()
    triple = drive(p, path, 6)[-1]
    assert triple == (4, 8, 5)
    path.tpt[1] = 20  # the network per-connection rate drops: 8 connections now give 160
    seen = []
    for _ in range(4):
        triple = p.act(path.step(triple))
        seen.append(triple)
    # Short twice (confirm = 2), one interval re-measuring the network alone at 1 connection,
    # then a refit: 20/connection, no saturation -> ceil(392/20) = 20, the new optimum, without a
    # new full probe.
    assert seen == [(4, 8, 5), (4, 1, 5), (4, 20, 5), (4, 20, 5)]
    assert seen[-1] == _expected(path) and not p.probing


def test_probes_again_when_refits_cannot_help(toy_path, drive):
    path = toy_path(tpt=(100, 50, 80), cap=(1000, 400, 2000), buffers=(500, 500), max_threads=32)
    p = ModelBasedPolicy()
    triple = drive(p, path, 6)[-1]
    path.cap[1] = 200  # the network ceiling halves: more connections do not help
    seen, probing = [], []
    for _ in range(25):
        triple = p.act(path.step(triple))
        seen.append(triple)
        probing.append(p.probing)
    assert any(probing) and (1, 32, 32) in seen  # a new probe ran
    assert seen[-1] == _expected(path) == (2, 4, 3) and not probing[-1]


def test_concave_stage_is_refit(toy_path, drive):
    # Write stage with concave capacity 1000 n / (n + 10): the straight line through the 1-thread
    # probe (90.9/thread) promises far more than it gives at few threads; the policy refits.
    class Concave(toy_path):
        def capacity(self, i, n):
            if i == 2:
                return 1000.0 * n / (n + 10.0)
            return super().capacity(i, n)

    path = Concave(tpt=(100, 100, 1), cap=(500, 500, 1e9), buffers=(500, 500), max_threads=32)
    p = ModelBasedPolicy()
    chosen = drive(p, path, 14)
    # R* = 500 (read/network ceilings); the write stage needs n/(n+10) >= 0.49 -> n = 10.
    assert chosen[5] == (5, 5, 6)  # linear guess: ceil(490 / 90.9)
    assert chosen[6:9] == [(5, 5, 6), (5, 5, 1), (5, 5, 10)]  # short twice, re-measure, refit
    assert chosen[-1] == (5, 5, 10)
    assert p.concave[2] == pytest.approx((1000.0, 10.0), rel=1e-6)


def test_periodic_reprobe(toy_path, drive):
    path = toy_path(tpt=(100, 50, 80), cap=(1000, 400, 2000), buffers=(500, 500), max_threads=32)
    p = ModelBasedPolicy(reprobe_every=4)
    chosen = drive(p, path, 5 + 4)
    assert chosen[5:9] == [(4, 8, 5)] * 4
    assert chosen[9] == (1, 32, 32)


def test_small_max_threads_and_custom_probe(toy_path, drive):
    path = toy_path(tpt=(100, 50, 80), cap=(1000, 400, 2000), buffers=(500, 500), max_threads=4)
    p = ModelBasedPolicy(probe_low=2, settle=1)
    chosen = drive(p, path, 6)
    assert chosen[:4] == [(2, 4, 4), (4, 2, 4), (4, 4, 2), (4, 4, 4)]
    # At 4 threads the network gives 200: R* = 200 -> (2, 4, 3).
    assert chosen[4] == (2, 4, 3)


def test_no_traffic_keeps_probing_setting(obs):
    p = ModelBasedPolicy(settle=1)
    t = p.reset(8)
    for _ in range(4):
        t = p.act(obs(t, (0, 0, 0), max_threads=8))
    assert t == (8, 8, 8)
