"""Falcon: one concurrency for all three stages, momentum gradient descent."""
import pytest

from automdt.agents.falcon import FalconPolicy


def _run(policy, tput_of_cc, steps, max_threads=32, loss=0.0, obs=None):
    triple = policy.reset(max_threads)
    seen = [triple]
    for _ in range(steps):
        cc = triple[0]
        t = tput_of_cc(cc)
        triple = policy.act(obs((cc, cc, cc), (t, t, t), loss=loss, max_threads=max_threads))
        seen.append(triple)
    return seen


def test_all_three_equal_and_momentum(obs):
    # Throughput 1000 per thread up to 8 threads. Hand computation (cost C = -T/1.02^cc):
    #  cc 1 -> 2 (second probe)
    #  cc 2: grad = C2 - C1 = -941.9 <= 0 -> theta 1; change = 0.961; +1*ceil(1.92) = +2 -> 4
    #  cc 4: grad = (C4 - C2)/2 = -886.5 -> theta 2; change = 0.461; +2*ceil(1.84) = +4 -> 8
    #  cc 8: grad = -783.1 -> theta 3; change = 0.212; +3*ceil(1.70) = +6 -> 14 (soft limit 8+10)
    #  cc 14 (saturated): grad = +127.5 -> theta -1; -1*ceil(0.26) -> 13
    #  cc 13: went down, cost fell: grad = C14 - C13 = +121 -> theta -2; -2*ceil(0.26) -> 11
    #  cc 11: theta -3 -> -3 -> 8;  cc 8: theta -4; -4*ceil(0.16) -> 4 (momentum overshoots)
    seen = _run(FalconPolicy(), lambda cc: 1000.0 * min(cc, 8), 8, obs=obs)
    assert all(r == n == w for r, n, w in seen)
    assert [t[0] for t in seen] == [1, 2, 4, 8, 14, 13, 11, 8, 4]


def test_momentum_restarts_on_direction_change(obs):
    p = FalconPolicy()
    _run(p, lambda cc: 1000.0 * min(cc, 8), 4, obs=obs)
    assert p.theta == 3
    t = 8000.0
    p.act(obs((14, 14, 14), (t, t, t)))
    assert p.theta == -1


def test_soft_limit_and_floor(obs):
    p = FalconPolicy()
    seen = _run(p, lambda cc: 1000.0 * cc, 12, max_threads=64, obs=obs)
    ccs = [t[0] for t in seen]
    # The soft limit is best cc + 10, so no step jumps more than 10 above the best so far.
    for a, b in zip(ccs[1:], ccs[2:]):
        assert b <= a + 10
    # Never below 2 after the first probe, even when throughput collapses.
    seen = _run(FalconPolicy(), lambda cc: 1000.0 if cc < 3 else 1.0, 15, obs=obs)
    assert min(t[0] for t in seen[1:]) >= 2


def test_metric_and_loss(obs):
    p = FalconPolicy(metric="min")
    p.reset(32)
    p.act(obs((1, 1, 1), (100, 50, 80)))
    assert p.last_utility == pytest.approx(50 / 1.02)
    p = FalconPolicy(metric="net")
    p.reset(32)
    p.act(obs((1, 1, 1), (100, 50, 80), loss=0.01))
    assert p.last_utility == pytest.approx(50 / 1.02 - 50 * 10 * 0.01)
    with pytest.raises(ValueError):
        FalconPolicy(metric="read")


def test_respects_max_threads(obs):
    seen = _run(FalconPolicy(), lambda cc: 1e9 * cc, 20, max_threads=5, obs=obs)
    assert max(t[0] for t in seen) == 5
    assert all(1 <= x <= 5 for t in seen for x in t)
