"""The same path and thread schedule on the real engine and in the simulator, interval by interval.

The path is issue 10's read-bound path scaled down (per-thread rates, link and buffers halved or
more, half-second intervals) so that a chunk is the same share of a reader's interval as there
(1 MiB at 5 MB/s over 0.5 s = 4 MiB at 10 MB/s over 1 s = 0.42): sixteen readers half fill the
sender buffer, the schedule cuts them to eight, then to four (below the need: the buffer drains), then
back to eight. What the policy reads from it must agree between the two; the fluid simulator
(``chunk_bytes=0``, what the simulator was before) is the negative control.
"""
from __future__ import annotations

import numpy as np
import pytest

from automdt.experiments.parity import (MB, MiB, PathSpec, compare, engine_trace, format_side_by_side,
                                        make_source, sim_trace)

PATH = PathSpec({"read": (5 * MB, 0), "net": (20 * MB, 40 * MB), "write": (20 * MB, 0)}, memory=64 * MiB,
                chunk_size=1 * MiB, interval_s=0.5)
SCHEDULE = [(1, 1, 1), (4, 2, 2), (16, 4, 2), (8, 4, 2), (8, 4, 2)] + [(4, 4, 2)] * 6 + [(8, 4, 2)] * 3
CUT = 3  # the interval right after 16 -> 8 readers (the sender buffer about half full)
DRAIN = range(6, 11)  # four readers, the sender buffer draining, then empty


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity")
    src = make_source(str(root), int(PATH.achievable_bps * len(SCHEDULE) * PATH.interval_s * 2.5), n_files=8)
    eng = engine_trace(PATH, SCHEDULE, src, scratch=str(root))
    assert len(eng) >= len(SCHEDULE) - 1, "the engine run ended early"
    return eng, sim_trace(PATH, SCHEDULE), sim_trace(PATH, SCHEDULE, chunk_bytes=0)


def _detail(traces):
    eng, chunked, fluid = traces
    return "\n" + format_side_by_side(eng, {"sim (chunks)": chunked, "sim (fluid)": fluid})


def test_threads_cut_show_more_bytes_per_thread_for_an_interval(traces):
    """The difference found: after 16 -> 8 readers, the eight that leave finish the chunk they
    hold, so the interval counts more bytes per remaining reader than a reader can move. The
    fluid simulator never showed it; that inflated the policy's reference rate on the engine."""
    eng, chunked, fluid = traces
    per_thread = PATH.throttle["read"][0]
    rate = {name: tr.throughput_bps[CUT, 0] / 8 for name, tr in (("engine", eng), ("chunked", chunked),
                                                                  ("fluid", fluid))}
    assert rate["engine"] > 1.15 * per_thread, _detail(traces)
    assert rate["chunked"] > 1.15 * per_thread, _detail(traces)
    assert rate["fluid"] == pytest.approx(per_thread, rel=1e-6)
    # busy time says the same on both: the leaving readers worked in that interval
    assert eng.busy_s[CUT, 0] > 8 * PATH.interval_s * 1.05, _detail(traces)
    assert chunked.busy_s[CUT, 0] > 8 * PATH.interval_s * 1.05


def test_buffer_fill_counts_the_slots_busy_threads_hold(traces):
    eng, chunked, fluid = traces
    c_ch = compare(eng, chunked, PATH.achievable_bps)
    c_fl = compare(eng, fluid, PATH.achievable_bps)
    # with sixteen readers each holding a 1 MiB slot of 32, the engine reads >= 0.4 fuller than the queue
    assert c_ch["fill_mae"][0] < 0.12, _detail(traces)
    assert c_ch["fill_mae"][0] < 0.7 * c_fl["fill_mae"][0], _detail(traces)


def test_utilization_agrees_interval_by_interval(traces):
    """Busy share of each stage: readers always busy (no full buffer blocks them for long here),
    the network and the writers waiting part of the time in proportion to what flows."""
    eng, chunked, _ = traces
    c = compare(eng, chunked, PATH.achievable_bps)
    assert np.nanmax(np.abs(c["utilization"][1:, 0])) < 0.2, _detail(traces)
    assert c["utilization_mae"][1] < 0.15 and c["utilization_mae"][2] < 0.2, _detail(traces)


def test_what_the_policy_reads_during_the_drain_agrees(traces):
    """The ``need`` input (threads the flow needs per stage) of the shipped policy's pipeline,
    computed from each trace: within a thread and a half on every stage while the sender buffer
    drains under four readers, and the readers' need is all four of them (a lumpy interval may
    read ~3.3; before the reference rate ignored the interval after a cut, the engine's read
    about 3 throughout, which is what made the shipped policy cut the readers further)."""
    from automdt.agents.ppo import FeatureState, add_features
    from automdt.simulator.env import OBS_DIM, ObservationEncoder

    def need(tr):
        enc, state, out = ObservationEncoder(32), FeatureState(1), []
        for o in tr.observations:
            x = add_features(enc.encode(o), ("need",), 32, state)
            out.append(x[OBS_DIM:OBS_DIM + 3] * 32)
        return np.array(out)

    eng, chunked, _ = traces
    ne, ns = need(eng), need(chunked)
    for i in DRAIN:
        assert np.all(np.abs(ne[i] - ns[i]) <= 1.5), (i, ne[i], ns[i], _detail(traces))
    drain = list(DRAIN)
    assert np.median(ne[drain, 0]) >= 3.5 and np.median(ns[drain, 0]) >= 3.5, (ne[drain], ns[drain])


def test_the_first_interval_fills_the_pipeline(traces):
    """Writers get nothing before the first chunk is read and sent: the first interval delivers
    well under what it reads, on the engine and in the simulator with chunks, not in the fluid one."""
    eng, chunked, fluid = traces
    for tr in (eng, chunked):
        assert tr.throughput_bps[0, 2] < 0.75 * tr.throughput_bps[0, 0], _detail(traces)
    assert fluid.throughput_bps[0, 2] == pytest.approx(fluid.throughput_bps[0, 0])
