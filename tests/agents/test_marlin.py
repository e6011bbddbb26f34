"""Marlin: per-stage utilities, the step rule on hand-computed numbers, the clamp, the soft limit."""
import pytest

from automdt.agents.marlin import (
    MarlinPolicy,
    StageOGD,
    marlin_step,
    network_utility,
    read_utility,
    throughput_utility,
)

K = 1.02


def test_utilities():
    assert throughput_utility(100.0, 2) == pytest.approx(100 / K**2)
    # Loss penalty T*B*L with B = 10; a ratio >= 1 (or negative/NaN) counts as unknown.
    assert network_utility(100.0, 1, 0.01) == pytest.approx(100 / K - 100 * 10 * 0.01)
    assert network_utility(100.0, 1, 1.5) == pytest.approx(100 / K)
    assert network_utility(100.0, 1, float("nan")) == pytest.approx(100 / K)
    # Read penalty s = (f - f_before) / f only above min(threshold, 1/2) and when the buffer grew.
    assert read_utility(100.0, 1, 0.8, 0.6) == pytest.approx(100 / K - 100 * (0.2 / 0.8))
    assert read_utility(100.0, 1, 0.6, 0.8) == pytest.approx(100 / K)  # shrinking: no penalty
    assert read_utility(100.0, 1, 0.25, 0.1) == pytest.approx(100 / K)  # below the 0.3 threshold
    assert read_utility(100.0, 1, 0.25, 0.1, threshold_frac=0.2) == pytest.approx(100 / K - 100 * 0.6)
    assert read_utility(100.0, 1, 0.9, 0.1, threshold_frac=0.9) == pytest.approx(100 / K - 100 * (0.8 / 0.9))  # min(thr, 1/2)
    assert read_utility(100.0, 1, 0.9, None) == pytest.approx(100 / K)  # first interval


def test_step_rule():
    # g = (V_t - V_{t-1}) / (dcc * V_{t-1}); step = round(cc * g), at least +-1, at most +-5.
    assert marlin_step(1, 2, 100.0, 150.0) == 1  # g = 0.5, 2 * 0.5 = 1
    assert marlin_step(2, 4, 100.0, 180.0) == 2  # g = 0.4, 4 * 0.4 = 1.6 -> 2
    assert marlin_step(2, 4, 100.0, 100.5) == 1  # tiny gain: at least +1
    assert marlin_step(2, 4, 100.0, 100.0) == -1  # zero update counts as a decrease
    assert marlin_step(4, 2, 100.0, 90.0) == 1  # went down and lost: g = -0.1 / -2 -> up
    assert marlin_step(2, 4, 100.0, 10_000.0) == 5  # clamp
    assert marlin_step(29, 30, 100.0, 1.0) == -5  # g = -0.99, 30 * g = -29.7 -> clamp
    assert marlin_step(2, 8, 100.0, 1.0) == -1  # g = -0.99/6 = -0.165, 8 * g = -1.32 -> -1
    assert marlin_step(2, 4, 100.0, 0.0) == -2  # g = -0.5, 4 * g = -2
    assert marlin_step(4, 4, 100.0, 50.0) == -2  # dcc = 0: g = -0.5
    assert marlin_step(1, 2, 0.0, 50.0) == 2  # V_{t-1} = 0: g = 1, step = cc
    assert marlin_step(20, 24, 100.0, 1e308) == 5
    assert marlin_step(20, 24, 1e-300, 1e300) == 5  # huge gradient stays integral


def test_hand_computed_sequence(obs):
    p = MarlinPolicy()
    assert p.reset(32) == (1, 1, 1)
    # Interval 1 at (1, 1, 1): every optimiser's second probe is 2.
    assert p.act(obs((1, 1, 1), (100, 100, 100))) == (2, 2, 2)
    # Interval 2 at (2, 2, 2):
    #  read : V1 = 100/1.02 = 98.039, V2 = 200/1.02^2 = 192.234, g = 0.9608, 2g = 1.92 -> +2 -> 4
    #  net  : V2 = 150/1.0404 = 144.175, g = 0.4706, 2g = 0.94 -> +1 -> 3
    #  write: V2 = 100/1.0404 = 96.117, g = -0.0196, 2g = -0.04 -> -1 -> 1
    assert p.act(obs((2, 2, 2), (200, 150, 100))) == (4, 3, 1)
    # Interval 3 at (4, 3, 1):
    #  read : V3 = 400/1.02^4 = 369.54, dcc = 2, g = (369.54-192.23)/(2*192.23) = 0.461, 4g = 1.84 -> +2 -> 6
    #  net  : V3 = 150/1.02^3 = 141.35, g = -0.0196, 3g = -0.06 -> -1 -> 2
    #  write: V3 = 100/1.02 = 98.04, dcc = -1, g = (98.04-96.12)/(-96.12) = -0.02 -> -1 -> floor 1
    assert p.act(obs((4, 3, 1), (400, 150, 100))) == (6, 2, 1)


def test_steps_are_clamped_to_five(obs):
    p = MarlinPolicy()
    p.reset(64)
    p.act(obs((1, 1, 1), (100, 100, 100)))
    # Huge gains: every stage moves +5 from 2 (the step would be far larger).
    assert p.act(obs((2, 2, 2), (1e6, 1e6, 1e6))) == (7, 7, 7)
    # A collapse right after a jump of 5 is divided by dcc = 5: g = -0.2, 7g = -1.4 -> -1.
    assert p.act(obs((7, 7, 7), (1.0, 1.0, 1.0))) == (6, 6, 6)
    # The next collapse has dcc = -1: g = (V - Vp) / (-Vp) > 0 -> up, and hard: +5.
    assert p.act(obs((6, 6, 6), (1e-3, 1e-3, 1e-3))) == (11, 11, 11)


def test_loss_pushes_network_down(obs):
    p = MarlinPolicy()
    p.reset(32)
    p.act(obs((1, 1, 1), (100, 100, 100)))
    # Same throughputs, but the network saw 5% retransmits at 2 connections: U_n < 0 -> down.
    r, n, w = p.act(obs((2, 2, 2), (200, 200, 200), loss=0.05))
    assert n == 1 and r == 4 and w == 4


def _drive_stage(opt, value_of, steps, max_cc=64):
    seen = []
    for _ in range(steps):
        cc = opt.cc
        seen.append(cc)
        opt.update(value_of(cc), max_cc)
    return seen


def test_soft_limit_every_ten_iterations():
    # Best utility at cc = 2; elsewhere the utility keeps rising with cc, so the OGD climbs away.
    value = lambda cc: 1000.0 if cc == 2 else 50.0 + cc
    opt = StageOGD()
    seen = _drive_stage(opt, value, 9)
    assert seen[:2] == [1, 2] and max(seen) > 10  # drifted high
    assert opt.count == 9
    before = opt.cc
    nxt = opt.update(value(before), 64)  # the 10th observation: soft limit = best cc of the window = 2
    assert opt.last_soft_limit == 2
    assert nxt == 2 and before > 2
    # The limit is for that step only: the 11th step is free again.
    opt.update(value(2), 64)
    assert opt.last_soft_limit is None


def test_soft_limit_looks_back_twenty_observations():
    # The best observation (count 2) leaves the window after 20 more; at count 30 the soft limit
    # is the best cc among observations 11..30.
    value = lambda cc: 1e6 if cc == 2 and opt.count < 2 else float(cc)
    opt = StageOGD()
    hist = []
    for _ in range(29):
        cc = opt.cc
        v = value(cc)
        hist.append((v, cc))
        opt.update(v, 64)
    cc = opt.cc
    v = value(cc)
    hist.append((v, cc))
    nxt_unlimited = min(max(cc + 5, 1), 64)  # just to show the limit binds below
    window = hist[-20:]
    best_cc = max(window, key=lambda vc: vc[0])[1]
    nxt = opt.update(v, 64)
    assert opt.last_soft_limit == best_cc != 2
    assert nxt <= best_cc <= nxt_unlimited


def test_reset_restarts_and_respects_max(obs):
    p = MarlinPolicy()
    p.reset(3)
    p.act(obs((1, 1, 1), (100, 100, 100), max_threads=3))
    for _ in range(5):
        t = p.act(obs((3, 3, 3), (1e9, 1e9, 1e9), max_threads=3))
        assert all(1 <= x <= 3 for x in t)
    assert p.reset(3) == (1, 1, 1)
    assert p.act(obs((1, 1, 1), (1, 1, 1), max_threads=3)) == (2, 2, 2)
