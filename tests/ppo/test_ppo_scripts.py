"""Smoke tests of scripts/train_default_policy.py and benchmarks/bench_train.py with tiny budgets."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _load(rel):
    spec = importlib.util.spec_from_file_location(Path(rel).stem, REPO / rel)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_train_default_policy_script(tmp_path, capsys):
    script = _load("scripts/train_default_policy.py")
    out = tmp_path / "default_policy.zip"
    assert script.main(["--out", str(out), "--timesteps", "256", "--no-progress"]) == 0
    meta = json.loads(Path(str(out) + ".json").read_text())
    assert meta["random_profiles"] is True
    assert sorted(meta["held_out"]["results"]) == ["net-bound", "read-bound", "write-bound"]
    assert meta["action_head"] == "target" and meta["hyperparameters"]["chunk_range"] == [0.005, 0.6]
    beh = meta["behaviour"]["results"]
    assert "issue-read-bound" in beh and beh["issue-read-bound"]["runs"] == 4  # two with a full sender buffer
    text = capsys.readouterr().out
    assert "held-out path" in text and "write-bound" in text and "sustained" in text


def test_bench_train_runs(capsys):
    bench = _load("benchmarks/bench_train.py")
    # a target any network reaches: exercises the loop without training for long
    assert bench.main(["--target", "0.01", "--profiles", "read-bound", "--max-seconds", "30"]) == 0
    text = capsys.readouterr().out
    assert "read-bound" in text and "not reached" not in text
