"""The real-resource and changing-path experiments: metrics on synthetic rows, the building blocks
(cgroup, tc link rate changes), a held-out throttle schedule end to end on loopback, and a short
real-resource run where root and namespaces are available."""
import json
import os
import subprocess
import sys
import time

import pytest

from automdt.experiments.changing import (change_metrics, changing_scenarios, schedule_scenario, throttle_achievable,
                                          time_to_fraction)
from automdt.experiments.real import minimal_triple, triple_throughputs
from automdt.experiments.realpaths import CpuCgroup, net_link
from automdt.experiments.runner import read_csv

MB = 1e6
ROOT = os.geteuid() == 0


def _rows(xs, t0=0.0, dt=1.0, threads=(2, 2, 2), rnd=0):
    return [{"t": t0 + (i + 1) * dt, "interval_s": dt, "tput_write": x * MB, "threads_read": threads[0],
             "threads_net": threads[1], "threads_write": threads[2], "round": rnd} for i, x in enumerate(xs)]


# ------------------------------------------------------------------------------- metrics
def test_time_to_90_counts_from_the_change_and_needs_the_level_held():
    rows = _rows([40, 40, 40, 40, 10, 20, 37, 30, 38, 39, 40, 40])  # change at 4 s
    assert time_to_fraction(rows, 0.0, 40 * MB, end_t=4.0) == 1.0
    # after the change at 4 s (new achievable 40): 37 at t=7 is reached, but 37,30,38 averages below 36
    assert time_to_fraction(rows, 4.0, 40 * MB) == pytest.approx(5.0)  # t=9 (38, 39, 40)
    # the interval straddling the change does not count, a lower new rate is reached at once
    assert time_to_fraction(rows, 3.5, 10 * MB) == pytest.approx(1.5)
    assert time_to_fraction(rows, 4.0, 80 * MB) is None
    assert time_to_fraction(rows, 4.0, None) is None
    assert change_metrics(rows, [4.0], [40 * MB, 40 * MB]) == [1.0, 5.0]


def test_grid_samples_skip_transients_and_the_minimal_triple_keeps_95_percent():
    rows = (_rows([90, 50, 50, 50], threads=(1, 1, 1)) + _rows([5, 80, 80], threads=(1, 4, 1))
            + _rows([99, 80, 80], threads=(1, 4, 1), rnd=1))
    s = triple_throughputs(rows, skip=1)
    assert s[(1, 1, 1)] == [50 * MB] * 3 and s[(1, 4, 1)] == [80 * MB] * 4
    table = {(1, 1, 8): 30.0, (1, 2, 8): 60.0, (1, 3, 8): 79.0, (1, 4, 8): 80.0, (1, 8, 8): 80.5,
             (2, 8, 8): 80.0, (1, 8, 1): 80.0, (1, 8, 4): 80.0}
    assert minimal_triple((1, 8, 8), table) == (1, 3, 1)
    # one lucky interval at 32 connections (a burst above the link) does not raise the bar
    spiky = {(1, n, 1): v for n, v in ((1, 12.0), (2, 24.0), (4, 38.5), (8, 38.7), (16, 39.0), (32, 43.9))}
    assert minimal_triple((1, 16, 1), spiky)[1] == 4


def test_changing_scenarios_phase_rates_and_the_oracles():
    sc = changing_scenarios()
    mb = sc["moving-bottleneck"]
    assert mb.change_times == [12.0] and mb.phase_nominals() == [40 * MB, 40 * MB]
    assert mb.oracle_static() == (8, 2, 8) and mb.oracle_phases() == [(0.0, [8, 2, 2]), (12.0, [2, 2, 8])]
    lh = sc["link-halves"]
    assert lh.change_times == [10.0, 20.0]
    assert lh.phase_nominals(0.95) == pytest.approx([38 * MB, 19 * MB, 38 * MB])
    ct = sc["competing-transfer"]
    assert ct.phase_nominals(1.0) == pytest.approx([40 * MB, 20 * MB, 40 * MB])  # the fair share while both run
    assert lh.oracle_phases()[1][1][1] < lh.oracle_phases()[0][1][1]
    assert throttle_achievable("read.thread=5M,write.total=30M", 32) == 30 * MB
    assert throttle_achievable("", 32) is None


def test_a_held_out_schedule_becomes_a_scenario_with_analytic_optima(tmp_path):
    p = tmp_path / "held-out.yaml"
    p.write_text("- {at: 3, throttle: 'net.thread=4M,net.total=24M'}\n- {at: 9, throttle: 'write.total=10M'}\n")
    cs = schedule_scenario(str(p))
    assert cs.throttle_phases[0] == (0.0, "") and cs.change_times == [3.0, 9.0]
    assert cs.phase_optima[1][1] == 6  # 24 MB/s at 4 MB/s per connection
    assert cs.phase_nominals()[1:] == [24 * MB, 10 * MB]


# ------------------------------------------------------------------------------- building blocks (root)
@pytest.mark.skipif(not ROOT, reason="needs root (cgroup v1 cpu controller)")
def test_cpu_cgroup_sets_the_quota_and_is_removed():
    if not os.path.exists("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):
        pytest.skip("no cgroup v1 cpu controller")
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with CpuCgroup(0.05) as cg:
            assert open(os.path.join(cg.path, "cpu.cfs_quota_us")).read().strip() == "5000"
            cg.add(p.pid)
            assert str(p.pid) in open(os.path.join(cg.path, "cgroup.procs")).read().split()
            path = cg.path
        assert not os.path.exists(path)
    finally:
        p.kill()
        p.wait()


@pytest.mark.skipif(not ROOT, reason="needs root (network namespaces, veth, tc)")
def test_netlink_rate_changes_at_runtime_and_the_namespaces_go_away():
    with net_link(40 * MB) as link:
        assert "rate 320Mbit" in link.qdisc_show()
        link.set_rate(20 * MB)
        assert "rate 160Mbit" in link.qdisc_show()
        names = (link.ns_a, link.ns_b)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed.split() for n in names)


# ------------------------------------------------------------------------------- end to end
def _run_experiment(tmp_path, *args, timeout=300):
    out = tmp_path / "runs"
    p = subprocess.run([sys.executable, "-m", "automdt.experiments", *args, "--out", str(out)],
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    dirs = [d for d in os.listdir(out)]
    assert len(dirs) == 1, dirs
    return os.path.join(out, dirs[0]), p.stdout


def test_changing_runs_a_held_out_schedule_and_measures_each_change(tmp_path):
    """A schedule that is not in the repository, through the documented experiment command: the
    engine follows each entry (read-bound, then write-bound), the phase-switching oracle gets back
    to 90% within a few intervals, and every output is written."""
    sched = tmp_path / "sched.yaml"
    sched.write_text("- {at: 0, throttle: 'read.thread=4M,read.total=16M'}\n"
                     "- {at: 5, throttle: 'write.thread=4M,write.total=16M'}\n")
    d, out = _run_experiment(tmp_path, "changing", "--quick", "--throttle", f"@{sched}", "--policies",
                             "oracle-phases,static:3,3,3")
    md = open(os.path.join(d, "results.md")).read()
    assert "## schedule" in md and "to 90% after change 1 s" in md
    cfg = json.load(open(os.path.join(d, "config.json")))
    info = cfg["scenarios"]["schedule"]
    assert info["achievable_bps"] == [16 * MB, 16 * MB]
    assert [tuple(t) for t in info["scenario"]["phase_optima"]] == [(4, 1, 1), (1, 1, 4)]
    runs = {r["policy"]: r for r in read_csv(os.path.join(d, "runs.csv"))}
    assert set(runs) == {"oracle-phases", "static:3,3,3"}
    ttf = json.loads(runs["oracle-phases"]["time_to_90"])
    assert len(ttf) == 2 and ttf[0] is not None, ttf
    # a static (3,3,3) moves 12 MB/s in both phases: never 90% of 16
    assert json.loads(runs["static:3,3,3"]["time_to_90"]) == [None, None]
    ivs = [r for r in read_csv(os.path.join(d, "intervals.csv")) if r["policy"] == "oracle-phases"]
    # after the change the oracle is back within a few intervals. A throttled loopback on a busy
    # 2-core machine runs a few percent below its nominal 16 MB/s, so the bar is 85% (the static's
    # 12 MB/s is 75%); the rows are printed when it fails
    back = time_to_fraction(ivs, 5.0, 16 * MB, frac=0.85)
    assert back is not None and back <= 4.0, [(r["t"], r["tput_write"], r["threads_write"]) for r in ivs]
    specs = [r["throttle"] for r in ivs]
    assert specs[0].startswith("read.thread=4M") and specs[-1].startswith("write.thread=4M")
    late = [r for r in ivs if r["throttle"].startswith("write") and r["threads_write"] == 4]
    assert late and max(r["tput_read"] for r in ivs if r["throttle"].startswith("read")) <= 1.2 * 16 * MB
    assert os.path.exists(os.path.join(d, "changing-schedule.png"))
    assert os.path.exists(os.path.join(d, "schedule-schedule.yaml"))


@pytest.mark.skipif(not ROOT, reason="needs root (network namespaces, veth, tc)")
def test_real_quick_net_path_finds_an_oracle_that_needs_several_connections(tmp_path):
    """A short real-resource run: 40 MB/s tbf link with the delay forwarder's 20 ms and 256 KiB per
    connection (13 MB/s each), so TCP's own window limit, not any engine throttle, sets the rates."""
    d, out = _run_experiment(tmp_path, "real", "--quick", "--scenarios", "net-rtt20", "--policies", "oracle",
                             timeout=400)
    cfg = json.load(open(os.path.join(d, "config.json")))
    orc = cfg["scenarios"]["net-rtt20"]["oracle"]
    assert orc["throughput_bps"] >= 0.8 * 40 * MB, orc
    assert orc["triple"][1] >= 3, orc  # one connection is window-limited to ~13 MB/s
    grid = read_csv(os.path.join(d, "grid-net-rtt20.csv"))
    one = [g["mean_bps"] for g in grid if g["net"] == 1]
    assert one and max(one) <= 1.3 * 262144 / 0.020, one  # window / RTT
    runs = read_csv(os.path.join(d, "runs.csv"))
    assert runs[0]["policy"] == "oracle" and runs[0]["mean_delivered_bps"] >= 0.7 * orc["throughput_bps"]
    s2r = read_csv(os.path.join(d, "sim_to_real.csv"))
    assert s2r and s2r[0]["policy"] == "oracle" and s2r[0]["sim_bps"] > 0
    md = open(os.path.join(d, "results.md")).read()
    assert "Empirical oracle" in md and "Sim-to-real" in md and "The issue's checks" in md
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in listed.split() for ns in cfg["scenarios"]["net-rtt20"]["path"]["link"]["namespaces"])


def test_yardstick_policies_hold_switch_and_continue():
    from automdt.experiments.policies import Continuing, GridPolicy, PhasedStatic

    g = GridPolicy([(1, 1, 1), (2, 2, 2)], hold=2)
    seq = [g.reset(32)] + [g.act(None) for _ in range(4)]
    assert seq == [(1, 1, 1), (1, 1, 1), (2, 2, 2), (2, 2, 2), (2, 2, 2)] and g.done
    ph = PhasedStatic([(0.0, (8, 2, 2)), (0.05, (2, 2, 8))])
    assert ph.reset(32) == (8, 2, 2)
    time.sleep(0.08)
    assert ph.act(None) == (2, 2, 8)
    c = Continuing(GridPolicy([(1, 1, 1), (3, 3, 3)], hold=1))
    assert c.reset(32) == (1, 1, 1) and c.act(None) == (3, 3, 3)
    assert c.reset(32) == (3, 3, 3)  # a new copy round continues where the policy was
    assert not c.done and c.act(None) == (3, 3, 3) and c.done  # the last triple held its interval


def test_yardsticks_keep_the_hooks_the_controller_reads():
    """The phased oracle follows its phases into the run's tail (a change can come after the source
    is read); a policy run in copy rounds keeps its tail behaviour but starts where it left off."""
    from automdt.agents.registry import make_policy
    from automdt.experiments.policies import Continuing, PhasedStatic
    from automdt.policy_contract import as_policy

    assert as_policy(PhasedStatic([(0.0, (1, 1, 1))])).features().asked_in_tail
    cap = make_policy("capacity", 32)
    assert as_policy(cap).features().start is not None
    f = as_policy(Continuing(cap)).features()
    assert f.asked_in_tail and f.start is None


def test_sender_rounds_merge_onto_one_clock():
    from automdt.experiments.sender_proc import _merge

    rounds = [{"wall_t0": 100.0, "summary": {"bytes": 10, "exit_code": 0}, "history": [{"t": 1.0}, {"t": 2.0}]},
              {"wall_t0": 103.5, "summary": {"bytes": 5, "exit_code": 10}, "history": [{"t": 1.0}]}]
    m = _merge(rounds)
    assert [h["t"] for h in m["history"]] == [1.0, 2.0, 4.5] and [h["round"] for h in m["history"]] == [0, 0, 1]
    assert m["summary"]["bytes"] == 15 and m["summary"]["rounds"] == 2 and m["summary"]["exit_code"] == 10


def test_grid_search_finds_the_minimal_triple_of_a_known_path():
    """The grid logic (coarse grid, line search, refinement, verification) on a fake path whose
    delivered rate is min(40, 3 x connections) MB/s, read and write free: the oracle needs 13
    connections for 39 of 40 MB/s (95% is the bar) and one read and one write thread."""
    from types import SimpleNamespace

    from automdt.experiments.real import grid_search
    from automdt.experiments.realpaths import TransferRun

    class FakePath:
        sc = SimpleNamespace(max_threads=32)
        interval_s = 1.0
        calls = []

        def run(self, label, policy, kw, **_):
            self.calls.append(label)
            rows = []
            for t in kw["triples"]:
                for _ in range(kw["hold"]):
                    rows.append({"t": len(rows) + 1.0, "threads_read": t[0], "threads_net": t[1],
                                 "threads_write": t[2], "tput_write": min(40.0, 3.0 * t[1]) * MB, "round": 0})
            return TransferRun(label, rows, {}, 1.0, 0.0, 0.0, 0.0, 0.0, None, {})

    st = SimpleNamespace(log=lambda s: None)
    fake = FakePath()
    g = grid_search(fake, st, quick=False)
    assert fake.calls == ["grid-coarse", "grid-lines", "grid-refine", "grid-verify"]
    assert g["triple"] == [1, 13, 1], g["triple"]
    assert g["throughput_bps"] == pytest.approx(39 * MB)
