"""Arslan et al.: heuristic initial parameters and the adaptive concurrency search."""
import math

import pytest

from automdt.agents.heuristic import HeuristicPolicy, arslan_heuristic

MiB = 1 << 20
BDP = 1.25e9 * 0.05  # 10 Gbit/s x 50 ms = 62.5 MB


@pytest.mark.parametrize(
    "avg, buf, max_cc, files, expect",
    [
        # BDP/avg = 59.6 -> 60 files fill the pipe; p = min(ceil(14.9), ceil(0.25)) = 1; cc capped at 32.
        (1 * MiB, 4 * MiB, 32, None, (60, 1, 32)),
        # BDP/avg = 0.058 -> 0; cc = max(0, 2) = 2; p = min(ceil(62.5e6/4MiB) = 15, 256) = 15.
        (1 << 30, 4 * MiB, 32, None, (0, 15, 2)),
        # BDP/avg = 0.625 -> 1 (pp); cc = 2; p = min(15, ceil(23.8) = 24) = 15.
        (100e6, 4 * MiB, 32, None, (1, 15, 2)),
        # 2.5 rounds half up (Java Math.round) -> 3; p = min(15, ceil(25e6/4MiB) = 6) = 6.
        (25e6, 4 * MiB, 32, None, (3, 6, 3)),
        # The file count caps the concurrency.
        (1 * MiB, 4 * MiB, 32, 5, (60, 1, 5)),
        (1 << 30, 4 * MiB, 32, 1, (0, 15, 1)),
        # A larger TCP buffer needs fewer streams: ceil(62.5e6/64MiB) = 1.
        (1 << 30, 64 * MiB, 32, None, (0, 1, 2)),
    ],
)
def test_heuristic_formula(avg, buf, max_cc, files, expect):
    got = arslan_heuristic(avg, BDP, buf, max_cc, files)
    assert tuple(got) == expect
    # The same formula, written out once more.
    fill = math.floor(BDP / avg + 0.5)
    cc = min(max(fill, 2), files if files is not None else 10**9, max_cc)
    p = max(min(math.ceil(BDP / buf), math.ceil(avg / buf)), 1)
    assert (got.pipelining, got.parallelism, got.concurrency) == (fill, p, cc)


def test_mapping_to_threads():
    # Large files: cc = 2 files in flight, 15 streams each -> (2, 30, 2).
    p = HeuristicPolicy(rtt_s=0.05, bandwidth_bps=1.25e9, avg_file_size=1 << 30, tcp_buffer_bytes=4 * MiB)
    assert p.reset(32) == (2, 30, 2)
    assert p.reset(16) == (2, 16, 2)  # network clipped
    # Small files: 32 concurrent files, one stream each.
    p = HeuristicPolicy(rtt_s=0.05, bandwidth_bps=1.25e9, avg_file_size=MiB, tcp_buffer_bytes=4 * MiB)
    assert p.reset(32) == (32, 32, 32)


def test_non_adaptive_holds(obs):
    p = HeuristicPolicy(adaptive=False)
    start = p.reset(32)
    for t in [(1, 1, 1), (1e9, 1e9, 1e9), (0, 0, 0)]:
        assert p.act(obs(start, t)) == start


def _small_file_policy(**kw):
    # BDP/avg = 2 -> cc = 2, p = 1: the triple is (cc, cc, cc).
    return HeuristicPolicy(rtt_s=0.01, bandwidth_bps=2e8, avg_file_size=1e6, tcp_buffer_bytes=4 * MiB, **kw)


def test_adaptive_finds_best_concurrency(toy_path, drive):
    # Read ceiling 800 at 100/thread: U = min(100 cc, 800)/1.02^cc peaks at cc = 8.
    path = toy_path(tpt=(100, 100, 100), cap=(800, 1e5, 1e5), buffers=(300, 300), max_threads=32)
    p = _small_file_policy()
    chosen = drive(p, path, 16)
    assert chosen[0] == (2, 2, 2)
    assert [c[0] for c in chosen[:4]] == [2, 4, 8, 16]  # doubling while the utility improves
    assert chosen[-1] == (8, 8, 8) and p.phase == "hold"
    assert len(chosen) - chosen.index((8, 8, 8), 4) >= 3  # settled, then held


def test_adaptive_searches_again_when_conditions_change(toy_path, drive):
    path = toy_path(tpt=(100, 100, 100), cap=(800, 1e5, 1e5), buffers=(300, 300), max_threads=32)
    p = _small_file_policy(patience=2)
    triple = drive(p, path, 16)[-1]
    assert triple == (8, 8, 8)
    path.cap[0] = 400  # the source slows down: now cc = 4 is best
    for _ in range(16):
        triple = p.act(path.step(triple))
    assert triple == (4, 4, 4) and p.phase == "hold"


def test_adaptive_halves_when_the_first_doubling_loses(toy_path, drive):
    # Ceiling 300: starting at cc = 8 (BDP/avg = 8), 16 is worse, so it halves: 4 (best), 2 worse,
    # then refines to 3 (300/1.02^3 beats 300/1.02^4).
    path = toy_path(tpt=(100, 100, 100), cap=(300, 1e5, 1e5), buffers=(300, 300), max_threads=32)
    p = HeuristicPolicy(rtt_s=0.04, bandwidth_bps=2e8, avg_file_size=1e6, tcp_buffer_bytes=4 * MiB, improve_tol=0.0)
    chosen = drive(p, path, 12)
    assert chosen[0] == (8, 8, 8)
    assert [c[0] for c in chosen[:4]] == [8, 16, 4, 2]
    assert chosen[-1] == (3, 3, 3)
