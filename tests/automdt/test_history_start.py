"""Warm start: the per-job history file (round trip, corruption handling) and the start rules,
unit by unit and through the real CLI."""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace

import pytest

from automdt import history
from automdt.history import JobRecord
from automdt.policy_contract import Features, OwnStart, PolicyBase
from automdt.start import Start, choose_start, chunks_to_move, dataset_bound
from tests.util import run_cli

MB = 1_000_000


def _rec(**kw):
    base = dict(settled=(6, 3, 2), rates_bps=(1.0e7, 2.5e7, 3.0e7), throughput_bps=6.0e7, intervals=12,
                policy="ppo:default", runs=3, updated=1.5e9, job="k" * 32, src="/data/out", dest="h:1/x")
    base.update(kw)
    return JobRecord(**base)


# ----------------------------------------------------------------------------- the file
def test_round_trip(tmp_path):
    path = tmp_path / "deep" / "jobs" / "k.json"
    history.save(path, _rec())
    assert history.load(path) == (_rec(), None)
    assert json.loads(path.read_text())["format"] == history.HISTORY_FORMAT
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    assert sorted(p.name for p in path.parent.iterdir()) == ["k.json"]  # no temporary file left
    history.save(path, _rec(settled=(1, 2, 3), runs=4))
    assert history.load(path)[0].settled == (1, 2, 3)


def test_default_location_follows_xdg_state_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "st"))
    assert history.history_path("abc") == tmp_path / "st" / "automdt" / "jobs" / "abc.json"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert history.history_path("abc") == tmp_path / "home" / ".local" / "state" / "automdt" / "jobs" / "abc.json"


@pytest.mark.parametrize("damage, why", [
    ("truncated", "not used"),
    ("not-json", "not used"),
    ("other-version", "another automdt version"),
    ("bad-field", "bad settled"),
    ("unreadable", "unreadable"),
])
def test_unusable_files_give_one_warning_and_no_record(tmp_path, damage, why):
    path = tmp_path / "k.json"
    good = json.dumps(_rec().to_json())
    if damage == "truncated":
        path.write_text(good[: len(good) // 2])
    elif damage == "not-json":
        path.write_bytes(b"\xff\xfe garbage")
    elif damage == "other-version":
        path.write_text(good.replace(history.HISTORY_FORMAT, "automdt-history/9"))
    elif damage == "bad-field":
        path.write_text(good.replace('"settled": [6, 3, 2]', '"settled": [6, 0, 2]'))
    else:
        path.mkdir()  # reading a directory fails whoever runs the test (root reads mode-000 files)
    rec, warning = history.load(path)
    assert rec is None and why in warning and "starting cold" in warning and "\n" not in warning


def test_other_version_is_moved_aside_not_lost(tmp_path):
    path = tmp_path / "k.json"
    other = json.dumps({"format": "automdt-history/9", "whatever": 1})
    path.write_text(other)
    history.save(path, _rec())
    assert history.load(path) == (_rec(), None)
    assert (tmp_path / "k.json.other").read_text() == other


def test_chunk_bytes_round_trip_and_older_records():
    rec = _rec(chunk_bytes=1 << 20)
    assert JobRecord.from_json(json.loads(json.dumps(rec.to_json()))) == rec
    older = rec.to_json()
    del older["chunk_bytes"]  # a record written before the field existed: same format, size unknown
    assert JobRecord.from_json(older).chunk_bytes == 0
    with pytest.raises(ValueError, match="bad chunk_bytes"):
        JobRecord.from_json(dict(older, chunk_bytes="4Mi"))


def test_chunk_size_for_the_rates_the_last_run_measured():
    warm = _rec(rates_bps=(9.4e6, 26e6, 38e6))  # issue 10's warm path at its settled counts
    # one chunk through the three stages: 4 MiB 0.72 s, 2 MiB 0.36 s, 1 MiB 0.18 s (a quarter of 1 s: 0.25)
    assert history.chunk_size_for(warm, 4 << 20, 1.0) == 1 << 20
    assert history.chunk_size_for(warm, 4 << 20, 2.0) == 2 << 20  # a quarter of 2 s: 0.5
    assert history.chunk_size_for(_rec(rates_bps=(3e9, 2.2e8, 8.5e8)), 4 << 20, 1.0) == 4 << 20  # a local copy
    assert history.chunk_size_for(_rec(rates_bps=(0.0, 0.0, 0.0)), 4 << 20, 1.0) == 4 << 20  # nothing measured
    assert history.chunk_size_for(_rec(rates_bps=(1e6, 1e6, 1e6)), 4 << 20, 1.0) == 1 << 20  # the floor
    assert history.chunk_size_for(_rec(rates_bps=(1e6, 1e6, 1e6)), 256 << 10, 1.0) == 256 << 10  # below it
    assert history.chunk_size_for(_rec(rates_bps=(25e6, 25e6, 25e6)), 6 << 20, 1.0) == 1536 << 10  # halvings of it


def test_chunk_size_keeps_the_last_runs_size_near_the_boundary():
    near = _rec(rates_bps=(20e6, 20e6, 20e6))  # 2 MiB: 0.31 s, over the 0.25 s share: 1 MiB alone
    assert history.chunk_size_for(near, 4 << 20, 1.0) == 1 << 20
    assert history.chunk_size_for(replace(near, chunk_bytes=2 << 20), 4 << 20, 1.0) == 2 << 20
    below = _rec(rates_bps=(30e6, 30e6, 30e6))  # 2 MiB: 0.21 s, within the share
    assert history.chunk_size_for(below, 4 << 20, 1.0) == 2 << 20
    assert history.chunk_size_for(replace(below, chunk_bytes=1 << 20), 4 << 20, 1.0) == 1 << 20
    fast = _rec(rates_bps=(3e9, 2.2e8, 8.5e8), chunk_bytes=1 << 20)  # far from the boundary: back to the default
    assert history.chunk_size_for(fast, 4 << 20, 1.0) == 4 << 20
    slow = _rec(rates_bps=(5e6, 5e6, 5e6), chunk_bytes=4 << 20)
    assert history.chunk_size_for(slow, 4 << 20, 1.0) == 1 << 20


def test_record_from_intervals():
    def iv(threads, write_bps, busy=(1.0, 1.0, 1.0)):
        return {"threads": dict(zip(("read", "net", "write"), threads)), "bytes": {"read": 10 * MB, "net": 10 * MB,
                "write": 10 * MB}, "busy_s": dict(zip(("read", "net", "write"), busy)),
                "throughput": {"read": write_bps, "net": write_bps, "write": write_bps}}

    ramp = [iv((1, 1, 1), 1e7), iv((2, 2, 2), 2e7), iv((4, 2, 2), 4e7)]
    steady = [iv((8, 3, 2), 8e7, busy=(8.0, 2.0, 0.5))] * 6
    rec = history.record_from_intervals(ramp + steady + [iv((8, 3, 2), 3e7)], policy="ppo:default")
    assert rec.settled == (8, 3, 2) and rec.intervals == 10 and rec.runs == 1
    assert rec.rates_bps == (10 * MB / 8.0, 10 * MB / 2.0, 10 * MB / 0.5)  # bytes per busy thread-second
    assert rec.throughput_bps == 8e7
    # too short to settle: the latest of the second half's most frequent triples
    assert history.record_from_intervals(ramp + [iv((16, 4, 2), 3e7)]).settled == (4, 2, 2)
    assert history.record_from_intervals(ramp[:1]).settled == (1, 1, 1)
    assert history.record_from_intervals([]) is None
    assert history.record_from_intervals(ramp, previous=_rec(runs=7)).runs == 8
    # the next run starts at the settled triple, a stage raised to the threads that carry the
    # run's throughput at its rate per busy thread (7 readers of 10 MB/s each cannot carry 78),
    # and one thread over that on every stage that used (nearly) all its threads
    short = history.JobRecord(settled=(7, 2, 2), rates_bps=(1e7, 4e7, 4e7), throughput_bps=7.8e7, intervals=9)
    assert history.start_threads(short) == (9, 3, 3)  # 7.8 of 7 readers; 1.95 of 2 network, 2 write threads
    # a total limit of 80 MB/s on 10 network threads: each one's rate is 8 MB/s, all used
    capped = history.JobRecord(settled=(8, 10, 2), rates_bps=(1e7, 8e6, 4e7), throughput_bps=8.0e7, intervals=9)
    assert history.start_threads(capped) == (9, 11, 3)
    ample = history.JobRecord(settled=(9, 5, 3), rates_bps=(1e7, 4e7, 4e7), throughput_bps=8.0e7, intervals=9)
    assert history.start_threads(ample) == (9, 5, 3)  # every stage had a thread over already
    assert history.start_threads(_rec()) == (7, 3, 3)  # readers (6 of 6) and writers (2 of 2) fully used
    # the tail (source read, buffers draining: "tail": true) is left out, however long it is
    tail = [dict(iv((8, 3, 2), 2e7, busy=(0.0, 0.5, 0.5)), tail=True)] * 8
    probe = [dict(iv((10, 4, 2), 8e7, busy=(10.0, 2.0, 0.5)), shield="fallback")] * 7  # the shield's fallback drove
    rec = history.record_from_intervals(ramp + steady + probe + tail)
    assert rec.settled == (8, 3, 2) and rec.throughput_bps == 8e7 and rec.intervals == 24
    assert rec.rates_bps == (10 * MB / 8.0, 10 * MB / 2.0, 10 * MB / 0.5)


def test_rates_count_only_intervals_at_a_held_count():
    """An interval right after a stage's count changed measures the change: after a cut from 32
    readers to 10 the leaving threads' chunks end in it (bytes without their busy time). Issue
    10's warm path: a 10 s job measured 13.8 MB/s per reader of 10 and started its next run at
    7 readers for 80 MB/s."""
    def iv(threads, read_mb, read_busy, **extra):
        return {"threads": dict(zip(("read", "net", "write"), threads)),
                "bytes": {"read": read_mb * MB, "net": 80 * MB, "write": 80 * MB},
                "busy_s": {"read": read_busy, "net": 3.0, "write": 2.0},
                "throughput": {"read": read_mb * MB, "net": 8e7, "write": 8e7}, **extra}

    run = [iv((4, 2, 8), 17, 2.0), iv((32, 3, 2), 17, 13.7),  # readers start, nothing counted yet
           iv((10, 3, 2), 201, 11.0),  # the cut: the 22 leaving readers' chunks end here
           iv((7, 3, 2), 90, 7.0), iv((7, 3, 2), 70, 7.0), iv((7, 3, 2), 72, 7.2),
           iv((7, 3, 2), 0, 0.0, tail=True)]
    rec = history.record_from_intervals(run)
    assert rec.settled == (7, 3, 2)
    assert rec.rates_bps[0] == pytest.approx(10 * MB)  # the window's one held interval
    assert history.start_threads(rec)[0] == 9  # 8 readers carry 80 MB/s; one over for the first second
    # over the whole window (the second half before the tail, its last left out) it read 14.4
    naive = sum(r["bytes"]["read"] for r in run[2:5]) / sum(r["busy_s"]["read"] for r in run[2:5])
    assert naive > 14 * MB
    # a window whose every interval changed the count: the run's held intervals before the tail
    changing = [iv((4, 2, 8), 17, 2.0), iv((12, 3, 2), 120, 12.0), iv((12, 3, 2), 120, 12.0),
                iv((32, 3, 2), 17, 13.7), iv((10, 3, 2), 201, 11.0), iv((7, 3, 2), 90, 7.0),
                iv((8, 3, 2), 70, 8.0), iv((9, 3, 2), 85, 9.0), iv((9, 3, 2), 0, 0.0, tail=True)]
    assert history.record_from_intervals(changing).rates_bps[0] == pytest.approx(10 * MB)


# ----------------------------------------------------------------------------- the rules
class _PPOLike(PolicyBase):
    name = "ppo:x"

    def __init__(self, start=(1, 1, 1), source="cold"):
        self.start_threads, self.start_source = start, source

    def features(self):
        return Features(start=OwnStart(self.start_threads, self.start_source))

    def reset(self, max_threads, seed=None):
        return self.start_threads

    def act(self, obs):
        return obs.threads


class _Baseline:
    name = "marlin-like"

    def reset(self, max_threads, seed=None):
        return (1, 1, 1)

    def act(self, obs):
        return (2, 2, 2)


def test_start_rules_in_order():
    ppo = _PPOLike((5, 5, 5), "profile")
    assert choose_start(ppo, 32, explicit=(3, 4, 5), history=_rec()) == Start((3, 4, 5), "threads")
    s = choose_start(ppo, 32, history=_rec())
    assert (s.threads, s.source) == ((7, 3, 3), "history") and s.detail["history"]["settled"] == [6, 3, 2]  # start_threads
    assert choose_start(ppo, 32) == Start((5, 5, 5), "profile")
    assert choose_start(_PPOLike((4, 4, 2), "cold"), 32) == Start((4, 4, 2), "cold")
    # baselines keep their own start (None: what their reset returns), history or not
    assert choose_start(_Baseline(), 32, history=_rec()) is None
    assert choose_start(_Baseline(), 32, explicit=(7, 7, 7)) == Start((7, 7, 7), "threads")


def test_dataset_bound():
    assert chunks_to_move([3, 3, 3], 4 << 20) == 3
    assert chunks_to_move([0, 10 << 20], 4 << 20) == 1 + 3
    assert dataset_bound(3, 32) == 3 and dataset_bound(0, 32) == 1 and dataset_bound(1000, 32) == 32
    ppo = _PPOLike((16, 16, 8), "cold")
    assert choose_start(ppo, 32, bound=3).threads == (3, 3, 3)
    assert choose_start(_PPOLike((16, 16, 8), "profile"), 32, history=_rec(settled=(20, 9, 9)), bound=8).threads == (8, 8, 8)


# ----------------------------------------------------------------------------- the CLI
def _log_lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def _run(src, dst, log, *extra, env=None):
    code, summary, err = run_cli("transfer", src, dst, "--json", "--log", str(log), "--interval", "0.25",
                                 "--chunk-size", "1Mi", "--memory", "8Mi", *extra, env=env)
    assert code == 0, err
    return summary, _log_lines(log), err


@pytest.fixture
def slow_job(make_tree, tmp_path):
    """A job that takes about 2 s: 12 MB read at 2 MB/s per read thread, at most 6 MB/s in total."""
    src = make_tree({f"f{i:02d}.bin": 1 << 20 for i in range(12)})
    return src, str(tmp_path / "dst"), ("--throttle", "read.thread=2M,net.total=6M", "--policy", "ppo")


def test_second_run_starts_where_the_first_settled(slow_job, tmp_path):
    src, dst, opts = slow_job
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    first, lines, _ = _run(src, dst, tmp_path / "1.jsonl", *opts, env=env)
    assert lines[0]["start"]["source"] == "cold" and lines[0]["policy"] == "ppo:default"
    assert first["start"] == lines[0]["start"]
    files = list((tmp_path / "state" / "automdt" / "jobs").iterdir())
    assert len(files) == 1
    rec, warning = history.load(files[0])
    assert warning is None and rec.runs == 1 and rec.policy == "ppo:default"
    shutil.rmtree(dst)
    second, lines, _ = _run(src, dst, tmp_path / "2.jsonl", *opts, env=env)
    start = lines[0]["start"]
    assert start["source"] == "history" and list(start["threads"].values()) == list(history.start_threads(rec))
    assert all(a >= b for a, b in zip(history.start_threads(rec), rec.settled))
    assert lines[1]["threads"] == start["threads"]  # the first interval really ran at it
    assert history.load(files[0])[0].runs == 2


def test_history_sets_the_chunk_size_unless_given(make_tree, tmp_path):
    """A job whose threads moved 4 MB/s each takes 1 MiB chunks from its second run on (a 4 MiB
    chunk needs a second to be read); ``--chunk-size`` wins; the record keeps the size used."""
    from automdt.lock import job_key

    src, dst = make_tree({f"f{i}.bin": 2 << 20 for i in range(4)}), str(tmp_path / "dst")
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    path = tmp_path / "state" / "automdt" / "jobs" / f"{job_key(src, dst)}.json"

    def run(n, *extra):
        code, summary, err = run_cli("transfer", src, dst, "--json", "--log", str(tmp_path / f"{n}.jsonl"),
                                     "--interval", "0.25", "--memory", "16Mi", "--throttle", "read.thread=4M",
                                     *extra, env=env)
        assert code == 0 and summary["files_transferred"] == 4, err
        shutil.rmtree(dst)
        return _log_lines(tmp_path / f"{n}.jsonl")[0]["start"], history.load(path)[0]

    start, rec = run(1)
    assert start["chunk_bytes"] == rec.chunk_bytes == 4 << 20
    assert history.chunk_size_for(rec, 4 << 20, 0.25) == 1 << 20
    start, rec = run(2)
    assert start["chunk_bytes"] == rec.chunk_bytes == 1 << 20 and rec.runs == 2
    start, rec = run(3, "--chunk-size", "4Mi")
    assert start["chunk_bytes"] == rec.chunk_bytes == 4 << 20
    start, _ = run(4, "--no-history")
    assert start["chunk_bytes"] == 4 << 20


def test_no_history_neither_reads_nor_writes(slow_job, tmp_path):
    src, dst, opts = slow_job
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    _, lines, _ = _run(src, dst, tmp_path / "1.jsonl", *opts, "--no-history", env=env)
    assert lines[0]["start"]["source"] == "cold"
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("damage", ["truncated", "other-version", "unreadable"])
def test_damaged_history_warns_starts_cold_and_loses_nothing(slow_job, tmp_path, damage):
    from automdt.lock import job_key

    src, dst, opts = slow_job
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    path = tmp_path / "state" / "automdt" / "jobs" / f"{job_key(src, dst)}.json"
    path.parent.mkdir(parents=True)
    good = json.dumps(_rec().to_json())
    if damage == "truncated":
        path.write_text(good[:40])
    elif damage == "other-version":
        path.write_text(good.replace(history.HISTORY_FORMAT, "automdt-history/0"))
    else:
        path.mkdir()
    summary, lines, err = _run(src, dst, tmp_path / "1.jsonl", *opts, env=env)
    warnings = [ln for ln in err.splitlines() if "job history" in ln]
    assert len(warnings) == 1 and "starting cold" in warnings[0], err
    assert lines[0]["start"]["source"] == "cold"
    assert summary["files_transferred"] == 12 and summary["exit_code"] == 0
    assert all(os.path.getsize(os.path.join(dst, f"f{i:02d}.bin")) == 1 << 20 for i in range(12))
    if damage != "unreadable":  # the run's own record replaced the useless file
        assert history.load(path)[0].runs == 1
    if damage == "other-version":
        assert "automdt-history/0" in path.with_name(path.name + ".other").read_text()


def test_threads_with_policy_set_the_start(slow_job, tmp_path):
    src, dst, opts = slow_job
    _, lines, _ = _run(src, dst, tmp_path / "1.jsonl", *opts, "--threads", "3,2,1", "--no-history")
    assert lines[0]["start"] == {"threads": {"read": 3, "net": 2, "write": 1}, "source": "threads",
                                 "chunk_bytes": 1 << 20}
    assert lines[1]["threads"] == {"read": 3, "net": 2, "write": 1}


def test_small_dataset_never_opens_more_threads_than_chunks(make_tree, tmp_path):
    src = make_tree({"a": 3, "b": 100, "c": 5000})
    _, lines, _ = _run(src, str(tmp_path / "dst"), tmp_path / "1.jsonl", "--policy", "ppo", "--no-history",
                       "--throttle", "read.total=2K")
    start = lines[0]["start"]
    assert max(start["threads"].values()) <= 3
    for rec in lines[1:]:
        assert max(rec["next_threads"].values()) <= 3 and max(rec["threads"].values()) <= 3


def test_profile_trained_policy_starts_at_its_oracle(tiny_policy_path, make_tree, tmp_path):
    from automdt.simulator.oracle import oracle
    from automdt.simulator.profile import Profile

    src = make_tree({f"f{i:02d}.bin": 1 << 20 for i in range(40)})
    _, lines, _ = _run(src, str(tmp_path / "dst"), tmp_path / "1.jsonl", "--policy", str(tiny_policy_path),
                       "--no-history")
    assert lines[0]["start"]["source"] == "profile" and lines[0]["policy"] == f"shield:ppo:{tiny_policy_path}"  # a file runs under the shield
    assert tuple(lines[0]["start"]["threads"].values()) == oracle(Profile.default()).threads


@pytest.fixture(scope="module")
def tiny_policy_path(tmp_path_factory):
    from tests.ppo.conftest import tiny_train

    return tiny_train(tmp_path_factory.mktemp("tinyp") / "policy.zip", timesteps=512, eval_every=512).model_path


def test_controller_applies_the_start_logs_it_and_keeps_the_bound():
    import io

    from automdt.controller import Controller
    from tests.automdt.test_controller import _rx, _stats

    class Greedy(_PPOLike):
        def act(self, obs):
            return (30, 30, 30)

    applied, log = [], io.StringIO()
    start = choose_start(Greedy((16, 16, 8), "cold"), 32, bound=3)
    c = Controller(Greedy((16, 16, 8), "cold"), applied.append, interval_s=1.0, max_threads=32, log_file=log,
                   start=start, bound=3)
    assert c.start() == (3, 3, 3) and applied == [(3, 3, 3)]
    first = json.loads(log.getvalue().splitlines()[0])
    first.pop("controller")  # the settings (tests/automdt/test_controller.py)
    assert first == {"t": 0.0, "start": {"threads": {"read": 3, "net": 3, "write": 3}, "source": "cold"},
                     "policy": "ppo:x"}
    c.tick(_stats(0.0, 0, 0, 0), _rx(0), now=10.0)
    rec = c.tick(_stats(1.0, 1 << 20, 0, 0, threads=(3, 3)), _rx(1 << 20, write_threads=3), now=11.0).to_json()
    assert rec["next_threads"] == {"read": 3, "net": 3, "write": 3}  # the policy asked for 30
    # an explicit --threads start is not bounded, and neither are the policy's later choices
    c = Controller(Greedy(), applied.append, max_threads=32, start=Start((8, 8, 8), "threads"), bound=3)
    assert c.start() == (8, 8, 8) and c.limit == 32
