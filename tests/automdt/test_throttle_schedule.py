"""``--throttle @FILE``: the schedule parser, its one-line errors, and runtime application on both ends."""
import json

import pytest

from automdt.throttle import (NO_LIMITS, ScheduleClock, ScheduleError, ThrottleSchedule, format_throttle,
                              parse_throttle_option)
from tests.util import run_cli

MB = 1_000_000


def _write(tmp_path, text, name="sched.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_schedule_parses_entries_in_order_and_replaces_the_whole_spec(tmp_path):
    path = _write(tmp_path, """
- {at: 0, throttle: "read.thread=10M,read.total=80M"}
- {at: 2.5, throttle: "write.thread=5M"}
- {at: 7, throttle: ""}
- {at: 9, throttle: null}
""")
    limits, sched = parse_throttle_option("@" + path)
    assert limits == NO_LIMITS and isinstance(sched, ThrottleSchedule)
    assert [e.at_s for e in sched.entries] == [0.0, 2.5, 7.0, 9.0]
    assert sched.at(0.0)[1]["read"] == (10 * MB, 80 * MB)
    spec, lim = sched.at(3.0)
    # an entry replaces everything: the read limits of the first entry are gone
    assert spec == "write.thread=5M" and lim["read"] == (0, 0) and lim["write"] == (5 * MB, 0)
    assert sched.at(7.0)[1] == NO_LIMITS and sched.at(100)[1] == NO_LIMITS
    assert sched.limits_stage("write") and sched.limits_stage("read") and not sched.limits_stage("net")
    # round trip through save/load
    sched.save(str(tmp_path / "copy.yaml"))
    assert ThrottleSchedule.load(str(tmp_path / "copy.yaml")).to_list() == sched.to_list()


def test_before_the_first_entry_nothing_is_limited_and_the_clock_reports_each_change_once():
    sched = ThrottleSchedule.from_list([{"at": 1, "throttle": "net.total=20M"}, {"at": 2, "throttle": ""}])
    clock = ScheduleClock(sched, t0=100.0)
    assert clock.due(100.5) is None                  # no entry yet: nothing to change
    assert clock.current(100.5) == ("", NO_LIMITS)
    spec, lim = clock.due(101.0)
    assert spec == "net.total=20M" and lim["net"] == (0, 20 * MB)
    assert clock.due(101.9) is None
    assert clock.due(102.1) == ("", NO_LIMITS)
    assert clock.due(150.0) is None


def test_plain_spec_is_not_a_schedule():
    limits, sched = parse_throttle_option("read.thread=40M")
    assert sched is None and limits["read"] == (40 * MB, 0)
    assert format_throttle(limits) == "read.thread=40M"
    assert format_throttle(NO_LIMITS) == ""


@pytest.mark.parametrize("text, words", [
    ("- {at: 0, throttle: 'read.thread=1M'}\n- {at: 0, throttle: ''}\n", ["entry 2 (at: 0)", "increasing"]),
    ("- {at: 5, throttle: 'read.thread=1M'}\n- {at: 2, throttle: ''}\n", ["entry 2 (at: 2)", "increasing"]),
    ("- {at: 0, throttle: 'read.thred=1M'}\n", ["entry 1 (at: 0)", "read.thred"]),
    ("- {at: 0, throttle: 'read.thread=fast'}\n", ["entry 1 (at: 0)", "fast"]),
    ("- {at: -1, throttle: ''}\n", ["entry 1", "'at' must be"]),
    ("- {at: soon, throttle: ''}\n", ["entry 1", "'at' must be"]),
    ("- {at: 0}\n", ["entry 1 (at: 0)", "'throttle' is missing"]),
    ("- {throttle: ''}\n", ["entry 1", "'at'", "missing"]),
    ("- {at: 0, throttle: '', rate: 3}\n", ["entry 1", "unknown key", "rate"]),
    ("- {at: 0, throttle: 5}\n", ["entry 1 (at: 0)", "must be a string"]),
    ("- 7\n", ["entry 1", "mapping"]),
    ("at: 0\nthrottle: ''\n", ["expected a list"]),
    ("[]\n", ["no entries"]),
    ("", ["empty"]),
    ("- {at: 0, throttle: 'read.thread=1M'\n", ["not valid YAML", "line"]),
])
def test_bad_schedules_get_one_line_errors_naming_the_entry(tmp_path, text, words):
    path = _write(tmp_path, text)
    with pytest.raises(ScheduleError) as ei:
        ThrottleSchedule.load(path)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(path)
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize("command", ["transfer", "explore"])
def test_cli_bad_schedule_exits_2_with_one_line(tmp_path, make_tree, command):
    src = make_tree({"a.bin": 1000})
    path = _write(tmp_path, "- {at: 0, throttle: ''}\n- {at: 3, throttle: 'net.totl=1M'}\n")
    extra = ("-o", str(tmp_path / "p.yaml")) if command == "explore" else ("--no-lock",)
    code, _, err = run_cli(command, src, str(tmp_path / "dst"), "--throttle", "@" + path, *extra)
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "entry 2 (at: 3)" in lines[0] and "net.totl" in lines[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "dst").exists()  # nothing was created
    code, _, err = run_cli(command, src, str(tmp_path / "dst"), "--throttle", "@" + str(tmp_path / "none.yaml"),
                           *extra)
    assert code == 2 and "not found" in err and len(err.strip().splitlines()) == 1


def test_cli_bwlimit_with_a_schedule_is_a_usage_error(tmp_path, make_tree):
    src = make_tree({"a.bin": 1000})
    path = _write(tmp_path, "- {at: 0, throttle: ''}\n")
    code, _, err = run_cli("transfer", src, str(tmp_path / "dst"), "--throttle", "@" + path, "--bwlimit", "1M",
                           "--no-lock")
    assert code == 2 and "--bwlimit" in err


# ------------------------------------------------------------------------------------ runtime
def _records(log):
    """The interval records of an interval log (its first line, ``start``, says where the run started)."""
    with open(log) as f:
        return [r for r in (json.loads(line) for line in f if line.strip()) if "start" not in r]


def _mean(records, stage, lo, hi):
    xs = [r["throughput"][stage] for r in records if lo <= r["t"] <= hi]
    assert xs, (lo, hi, [r["t"] for r in records])
    return sum(xs) / len(xs)


def test_schedule_applies_read_limits_on_the_sender_and_write_limits_on_a_remote_receiver(tmp_path, make_tree):
    """read-limited (sender's engine), then write-limited (the receiver process, over the control
    channel), then free: each interval's stage throughput follows the entry in force, and every
    record carries the spec."""
    pytest.importorskip("automdt.transfer_engine._engine")
    from tests.faults.helpers import ReceiverProc

    src = make_tree({f"f{i}.bin": 24 * MB for i in range(8)})
    root = tmp_path / "root"
    root.mkdir()
    path = _write(tmp_path, """
- {at: 0, throttle: "read.thread=4M,read.total=8M"}
- {at: 3, throttle: "write.thread=4M,write.total=6M"}
- {at: 6, throttle: ""}
""")
    log = str(tmp_path / "log.jsonl")
    rcv = ReceiverProc(str(root), None, str(tmp_path)).start()
    try:
        code, s, err = run_cli("transfer", src, f"{rcv.dest}/sub", "--throttle", "@" + path, "--policy",
                               "static:4,4,4", "--chunk-size", "256Ki", "--memory", "16Mi", "--log", log,
                               "--json", "--no-lock", "--max-duration", "20", timeout=60)
    finally:
        rcv.stop()
    assert code == 0, err
    recs = _records(log)
    specs = [r.get("throttle") for r in recs]
    assert specs[0] == "read.thread=4M,read.total=8M", specs
    assert "write.thread=4M,write.total=6M" in specs and specs[-1] == "", specs
    # phase 1: the read stage holds its 8 MB/s total (4 threads x 4 MB/s would allow 16)
    assert 5.5 * MB <= _mean(recs, "read", 1.5, 3.0) <= 9.5 * MB
    # phase 2: the receiver's write stage holds 6 MB/s; the read stage is free now
    assert 4.0 * MB <= _mean(recs, "write", 4.5, 6.0) <= 7.2 * MB
    assert _mean(recs, "read", 3.5, 5.5) > 12 * MB or max(r["buffer"]["sender"] for r in recs) > 0.5
    # phase 3: no limits at all: the remaining ~140 MB move well above the 6 MB/s write limit
    free = [r["throughput"]["write"] for r in recs if r.get("throttle") == "" and r["t"] >= 7.0]
    if free:
        assert sum(free) / len(free) > 9 * MB, free
    else:  # all of it within one interval of the lift
        assert s["seconds"] < 9.0, s


def test_explore_follows_a_schedule_over_its_rounds(tmp_path, make_tree):
    """``automdt explore --throttle @FILE``: the schedule's clock starts with the exploration and
    runs across its copy rounds; the interval log shows the spec in force."""
    pytest.importorskip("automdt.transfer_engine._engine")
    src = make_tree({f"f{i}.bin": 16 * MB for i in range(4)})
    path = _write(tmp_path, "- {at: 0, throttle: 'net.total=8M'}\n- {at: 3, throttle: 'net.total=30M'}\n")
    log = str(tmp_path / "explore.jsonl")
    code, out, err = run_cli("explore", src, str(tmp_path / "dst"), "--duration", "6", "-o",
                             str(tmp_path / "p.yaml"), "--throttle", "@" + path, "--log", log, "--json",
                             "--chunk-size", "256Ki", "--memory", "8Mi", "--allow-weak-fit", timeout=60)
    assert code == 0, err
    recs = _records(log)
    specs = [r.get("throttle") for r in recs]
    assert specs[0] == "net.total=8M" and specs[-1] == "net.total=30M", specs
    early = [r["throughput"]["net"] for r in recs if r["throttle"] == "net.total=8M"]
    assert max(early) <= 8 * MB * 1.3, early
