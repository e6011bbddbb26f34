"""benchmarks/policy_sections.py reads interval logs as the CLI writes them (issue 10's tables)."""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import policy_sections as ps  # noqa: E402

MB = 1_000_000


def _interval(t, write_bps, threads=(8, 2, 2)):
    return {"t": t, "threads": dict(zip(("read", "net", "write"), threads)),
            "throughput": {"read": write_bps, "net": write_bps, "write": write_bps},
            "buffer": {"sender": 0.0, "receiver": 0.0}}


def test_log_metrics_reports_the_start_line_that_the_interval_log_begins_with(tmp_path):
    start = {"t": 0.0, "start": {"threads": {"read": 4, "net": 2, "write": 8}, "source": "cold"}, "policy": "ppo"}
    lines = [start] + [_interval(float(i), rate) for i, rate in enumerate((30 * MB, 60 * MB, 75 * MB, 78 * MB,
                                                                           79 * MB, 20 * MB), start=1)]
    log = tmp_path / "run.jsonl"
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    read = ps._read_log(str(log))
    assert read[0] == start  # the start line is kept, not filtered out with the non-interval lines
    m = ps.log_metrics(read, 80 * MB, (8, 2, 2), 0)
    assert m["start"] == start["start"]
    assert ps.start_label(m["start"]) == "cold 4,2,8"
    assert m["ramp_intervals"] == 3  # 75 of 80 MB/s in the third interval; the start line is no interval
    assert m["intervals"] == 5  # the last interval (the dataset's end) is dropped


def test_log_metrics_without_a_start_line_says_so():
    m = ps.log_metrics([_interval(1.0, 80 * MB)] * 4, 80 * MB, (8, 2, 2), 0)
    assert m["start"] is None and ps.start_label(m["start"]) == "?"
    assert m["ramp_intervals"] == 1


def test_the_ramp_counts_steady_intervals_of_time_when_the_first_intervals_are_shorter():
    """Two half intervals, then steady ones: capacity in the interval ending at 2.02 s is a ramp of 2
    steady intervals (the third log line), and at 3.03 s a ramp of 3."""
    from automdt.experiments.behaviour import metrics_of

    rates = [30 * MB, 50 * MB, 78 * MB, 79 * MB, 80 * MB]
    ends = [0.5, 1.0, 2.02, 3.03, 4.04]
    m = metrics_of(rates, [(8, 2, 2)] * 5, 80 * MB, (8, 2, 2), 0, ends_s=ends, interval_s=1.0)
    assert m["ramp_intervals"] == 2 and m["seconds_to_threshold"] == 2.02
    m = metrics_of([30 * MB, 50 * MB, 60 * MB, 79 * MB, 80 * MB], [(8, 2, 2)] * 5, 80 * MB, (8, 2, 2), 0,
                   ends_s=ends, interval_s=1.0)
    assert m["ramp_intervals"] == 3 and m["seconds_to_threshold"] == 3.03
    m = metrics_of([78 * MB] * 3, [(8, 2, 2)] * 3, 80 * MB, (8, 2, 2), 0, ends_s=[0.5, 1.0, 2.0])
    assert m["ramp_intervals"] == 1  # a half interval at capacity is within the first interval
    # without times every interval is a steady one: the third is a ramp of 3
    assert metrics_of(rates, [(8, 2, 2)] * 5, 80 * MB, (8, 2, 2), 0)["ramp_intervals"] == 3


def test_log_metrics_takes_the_times_from_the_log():
    lines = [{"t": 0.0, "start": {"threads": {"read": 4, "net": 2, "write": 8}, "source": "cold"}}]
    lines += [_interval(t, r) for t, r in ((0.5, 30 * MB), (1.0, 50 * MB), (2.01, 77 * MB), (3.02, 79 * MB),
                                           (4.03, 80 * MB), (4.5, 10 * MB))]
    m = ps.log_metrics(lines, 80 * MB, (8, 2, 2), 0)
    assert m["ramp_intervals"] == 2 and m["seconds_to_threshold"] == 2.01
