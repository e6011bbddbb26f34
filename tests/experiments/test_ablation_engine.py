"""The engine ablation: its metrics on made-up interval rows, its path set, and a ``--quick`` run on
two loopback paths end to end (real engine, real TCP to an ``automdt receive`` process)."""
import csv
import json
import math
import os

import pytest

from automdt.experiments.ablation_engine import (LOW_MAX_INTERVALS, RECOVERY_INTERVALS, EngineOptions, check_controller,
                                                 controller_list, engine_paths, engine_tables, longest_run,
                                                 low_intervals, parse_controllers, recovery, run_ablation_engine,
                                                 summarize, transfer_metrics)
from automdt.experiments.scenarios import bottleneck_scenarios

MB = 1e6
MT = 32


def _rows(xs, threads=(2, 2, 2), dt=1.0):
    """One interval per value (MB/s delivered), ending at t = 1, 2, ... s."""
    out = []
    for i, x in enumerate(xs):
        th = threads[i] if isinstance(threads[0], tuple) else threads
        out.append({"t": (i + 1) * dt, "interval_s": dt, "tput_write": x * MB, "bytes_write": x * MB * dt,
                    "threads_read": th[0], "threads_net": th[1], "threads_write": th[2]})
    return out


# ------------------------------------------------------------------------------- metrics
def test_recovery_counts_seconds_and_intervals_after_the_change():
    # change at 4 s to a new achievable 50 MB/s: 30 (t=5), 40 (t=6), 46 (t=7), 48, 50, 50
    rows = _rows([40, 40, 40, 40, 30, 40, 46, 48, 50, 50])
    assert recovery(rows, 4.0, 50 * MB) == (pytest.approx(3.0), 3)  # t=7: 46, 48, 50 hold 45
    # a level never held within the phase, and a lower new rate reached at the first full interval
    assert recovery(rows, 4.0, 80 * MB) == (None, None)
    assert recovery(rows, 4.0, 50 * MB, end_t=6.0) == (None, None)
    assert recovery(rows, 4.0, 20 * MB) == (pytest.approx(1.0), 1)
    # a change in the middle of an interval: the straddling interval does not count
    assert recovery(rows, 3.5, 20 * MB) == (pytest.approx(1.5), 1)


def test_low_intervals_need_room_to_add_threads_and_data_left():
    full = (MT, MT, MT)
    th = [(1, 1, 1), (1, 1, 1), (4, 2, 2), full, full, (8, 2, 2), (8, 2, 2), (8, 2, 2), (8, 2, 2), (8, 2, 2)]
    rows = _rows([5, 10, 30, 5, 5, 10, 10, 10, 10, 40], threads=th)
    flags = low_intervals(rows, [0.0], [40 * MB], MT)
    # below 20 MB/s: intervals 1, 2 (room), 4, 5 (every stage at max_threads: not low), 6-9 (room)
    assert flags == [True, True, False, False, False, True, True, True, True, False]
    assert longest_run(flags) == 4 and sum(flags) == 6
    # the phase of each interval is the one its middle falls in: after 5.0 s the achievable rate is 16
    flags2 = low_intervals(rows, [0.0, 5.0], [40 * MB, 16 * MB], MT)
    assert flags2[5:9] == [False] * 4
    # the last interval(s) of a dataset, with less than one interval's worth at the achievable rate left
    tail = _rows([40, 40, 40, 10])
    assert low_intervals(tail, [0.0], [40 * MB], MT, total_bytes=int(130 * MB)) == [False] * 4
    assert low_intervals(tail, [0.0], [40 * MB], MT, total_bytes=int(170 * MB))[-1] is True


def test_transfer_metrics_judge_each_change_the_transfer_lived_to_see():
    rows = _rows([10, 20, 40, 40, 40, 10, 12, 45, 50, 50], threads=(4, 4, 4))
    m = transfer_metrics(rows, [5.0, 30.0], [40 * MB, 50 * MB, 50 * MB], MT, total_bytes=int(400 * MB))
    assert m["to90_start_s"] == pytest.approx(3.0) and m["to90_start_intervals"] == 3
    assert m["recovery_intervals"] == [3, None] and m["change_reached"] == [True, False]
    assert m["worst_recovery_intervals"] == 3 and m["recovered_all"] is (3 <= RECOVERY_INTERVALS)
    # 10 (t=1) is low; 10, 12 after the change (t=6, 7) are low against 50: runs of 1 and 2
    assert m["low_intervals"] == 3 and m["longest_low_run"] == 2
    assert m["mean_threads_read"] == 4.0 and m["mean_threads_total"] == 12.0
    never = transfer_metrics(rows[:7], [5.0], [40 * MB, 50 * MB], MT)
    assert never["recovery_intervals"] == [None] and never["recovered_all"] is False


def _transfer(path, ctrl, rep, secs, rec=(1,), low=0, done=True):
    return {"path": path, "controller": ctrl, "rep": rep, "completed": done, "completion_s": secs,
            "recovery_intervals": [None if r is None else r for r in rec],
            "recovery_s": [None if r is None else float(r) for r in rec], "change_reached": [True] * len(rec),
            "worst_recovery_intervals": None if (None in rec or not rec) else max(rec),
            "recovered_all": all(r is not None and r <= RECOVERY_INTERVALS for r in rec) if rec else None,
            "low_intervals": low, "longest_low_run": low,
            "mean_threads_read": 2.0, "mean_threads_net": 3.0, "mean_threads_write": 4.0, "mean_threads_total": 9.0}


def test_summary_takes_medians_over_reps_and_checks_the_targets():
    paths = {"chg": {"changing": True, "change_times": [5.0]}, "flat": {"changing": False, "change_times": []}}
    ts = []
    for rep, (m, x, o) in enumerate([(30, 20, 21), (33, 22, 25), (90, 21, 24)], 1):
        ts += [_transfer("chg", "marlin", rep, m, rec=(6,), low=5), _transfer("chg", "new", rep, x, rec=(2,)),
               _transfer("chg", "model", rep, o, rec=(3,))]
    # on the static path the new controller is slower than the model once in three (the median decides)
    for rep, (x, o) in enumerate([(10, 11), (12, 11), (10, 11)], 1):
        ts += [_transfer("flat", "new", rep, x, rec=(), low=LOW_MAX_INTERVALS + 1 if rep == 2 else 0),
               _transfer("flat", "model", rep, o, rec=())]
    summary, targets = summarize(ts, paths, ["marlin", "new", "model"])
    by = {(d["path"], d["controller"]): d for d in summary}
    assert by[("chg", "marlin")]["completion_s"] == 33 and by[("chg", "new")]["completion_s"] == 21
    assert by[("chg", "new")]["vs_marlin"] == pytest.approx(33 / 21)
    assert by[("chg", "new")]["vs_model"] == pytest.approx(24 / 21)
    assert by[("flat", "new")]["vs_model"] == pytest.approx(11 / 10) and by[("flat", "new")]["vs_marlin"] is None
    assert by[("chg", "new")]["recovery_intervals"] == [2.0] and by[("chg", "marlin")]["worst_recovery_intervals"] == 6
    t = targets["new"]
    assert t["recovery"]["pass"] and t["low_stretch"]["pass"] and t["vs_model"]["pass"]
    assert t["vs_marlin"]["pass"] and t["vs_marlin"]["ratio"] == pytest.approx(33 / 21)
    tm = targets["marlin"]
    assert tm["recovery"]["pass"] is False and tm["low_stretch"]["pass"] is False
    assert tm["vs_marlin"]["ratio"] == pytest.approx(1.0) and tm["vs_marlin"]["pass"] is False
    assert tm["vs_model"]["pass"] is False and tm["vs_model"]["detail"] == {"chg": pytest.approx(24 / 33)}
    assert targets["model"]["vs_model"]["pass"] and targets["model"]["vs_marlin"]["ratio"] == pytest.approx(33 / 24)
    # a recovery that never happens is the worst case in the median, and JSON-safe (None, not inf)
    ts2 = [_transfer("chg", "new", r, 20, rec=(v,)) for r, v in ((1, None), (2, None), (3, 2))]
    s2, t2 = summarize(ts2, {"chg": paths["chg"]}, ["new"])
    assert s2[0]["recovery_intervals"] == [None] and t2["new"]["recovery"]["pass"] is False
    json.dumps([s2, t2], allow_nan=False)


# ------------------------------------------------------------------------------- paths, controllers
def test_the_path_set_is_held_out_and_covers_the_families():
    paths = engine_paths()
    assert len(paths) >= 8
    assert {"moving-bottleneck", "two-limits", "link-change", "rtt", "cpu", "disk", "static"} <= {
        p.family for p in paths.values()}
    scen = {sc.throttle_spec() for sc in bottleneck_scenarios().values()}
    for p in paths.values():
        assert not (set(s for _, s in p.scenario.throttle_phases) & scen), p.name
    mb = paths["mb-read-write"]
    assert mb.scenario.phase_nominals() == [48 * MB, 56 * MB] and mb.changing
    assert [tuple(t) for t in mb.scenario.phase_optima] == [(8, 2, 2), (3, 3, 8)]
    assert paths["two-limits"].scenario.phase_nominals() == [36 * MB] and paths["two-limits"].scenario.phase_optima[0][
        0] == 9
    assert paths["throttle-link-change"].scenario.phase_nominals() == [50 * MB, 25 * MB, 50 * MB]
    ls = paths["link-steps"]
    assert ls.scenario.change_times == [6.0, 12.0] and ls.yardstick == "link"
    assert ls.scenario.path.kind == "net" and paths["net-rtt80"].yardstick == "grid"
    for p in paths.values():  # datasets last ~15-25 s at the achievable rate (disk: capped by its size)
        if p.yardstick != "grid":
            rates = p.scenario.phase_nominals(0.95)
            assert 14 * min(rates) <= p.dataset_bytes() <= 25 * max(rates), p.name
    json.dumps([p.to_dict() for p in paths.values()])


def test_controllers_refused_by_the_registry_are_skipped_with_the_reason():
    tokens = controller_list("default,marlin,static:2,2,2,mine=static:1,2,3,best-static")
    assert tokens == ["default", "marlin", "static:2,2,2", "mine=static:1,2,3", "best-static"]
    pairs = parse_controllers(tokens)
    assert pairs[0] == ("default", "default") and pairs[2] == ("static:2,2,2", "static:2,2,2")
    assert pairs[3] == ("mine", "static:1,2,3")
    assert check_controller("marlin", "marlin") is None and check_controller("best-static", "best-static") is None
    assert check_controller("static:2,2,2", "static:2,2,2") is None
    why = check_controller("nope", "no-such-policy")
    assert why is not None and "registry refuses" in why and "no-such-policy" in why


# ------------------------------------------------------------------------------- end to end
def test_quick_run_writes_rows_medians_and_tables(tmp_path):
    logs = []
    out = run_ablation_engine(EngineOptions(out=str(tmp_path), quick=True, reps=1,
                                            policies=["marlin", "static:12,3,8", "no-such-policy"], log=logs.append))
    with open(os.path.join(out, "ablation-engine.json")) as f:
        text = f.read()
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    cfg = doc["config"]
    assert set(doc["paths"]) == {"mb-read-write", "static-ratio"} and cfg["reps"] == 1
    assert [c[0] for c in cfg["controllers"]] == ["marlin", "static:12,3,8"]
    assert "registry refuses" in cfg["skipped_controllers"]["no-such-policy"]
    assert cfg["git"].get("commit") and cfg["machine"]["cpus"] and cfg["machine"]["uname"]
    assert all(p["load_before"] for p in doc["paths"].values())
    ts = doc["transfers"]
    assert len(ts) == 4 and all(t["completed"] and t["error"] is None for t in ts)
    mb = doc["paths"]["mb-read-write"]
    assert mb["achievable_bps"] == [48 * MB, 56 * MB] and len(mb["change_times"]) == 1
    for t in ts:
        assert t["completion_s"] > 0 and t["intervals"] >= 2
        assert t["mean_threads_read"] >= 1 and t["longest_low_run"] <= t["low_intervals"] <= t["intervals"]
        if t["path"] == "mb-read-write":
            assert len(t["recovery_intervals"]) == 1 and len(t["change_t"]) == 1
            assert abs(t["change_t"][0] - mb["change_times"][0]) < 1.0
    static = next(t for t in ts if t["controller"] == "static:12,3,8" and t["path"] == "static-ratio")
    assert static["mean_threads_read"] == 12.0 and static["low_intervals"] == 0
    summary = {(d["path"], d["controller"]): d for d in doc["summary"]}
    assert summary[("static-ratio", "marlin")]["vs_marlin"] == 1.0
    assert summary[("static-ratio", "static:12,3,8")]["completion_s"] == static["completion_s"]
    assert set(doc["targets"]) == {"marlin", "static:12,3,8"}
    with open(os.path.join(out, "ablation-engine.csv")) as f:
        assert len(list(csv.DictReader(f))) == 4
    md = engine_tables(os.path.join(out, "ablation-engine.json"))
    assert "## mb-read-write" in md and "| static:12,3,8 |" in md and "## Targets" in md
    with open(os.path.join(out, "ablation-engine.md")) as f:
        assert f.read().strip() == md.strip()
    assert math.isfinite(sum(t["completion_s"] for t in ts))


def test_the_shared_ablation_parser_drives_the_engine_half():
    from automdt.experiments.ablation import build_parser

    a = build_parser().parse_args(["--part", "engine", "--quick", "--paths", "cpu,disk"])
    a.out_dir = "runs/ablation-x"
    o = EngineOptions.from_args(a)
    assert o.quick and o.reps == 1 and o.policies is None and o.paths == ["cpu", "disk"]
    assert o.out == "runs/ablation-x"
    a = build_parser().parse_args(["--part", "engine", "--controllers", "marlin,static:2,2,2", "--grid", "small"])
    o = EngineOptions.from_args(a)
    assert o.policies == ["marlin", "static:2,2,2"] and o.reps == 3 and o.grid == "small" and o.out == "runs"
