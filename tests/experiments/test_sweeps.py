"""Sweeps: an Optuna study shared by two processes (journal file and SQLite), bad storages, a
scenario x policy x seed grid through submitit's local executor, and ``train --tensorboard``."""
import csv
import glob
import json
import os
import subprocess
import sys

import pytest

optuna = pytest.importorskip("optuna")

from automdt import errors  # noqa: E402
from tests.util import run_cli  # noqa: E402

PY = sys.executable


def _tune(storage, name, trials=2, timesteps=2048, seed=0, extra=()):
    return [PY, "-m", "automdt", "tune", "--storage", storage, "--study-name", name, "--trials", str(trials),
            "--timesteps", str(timesteps), "--startup-trials", "2", "--seed", str(seed), "--json", *extra]


@pytest.mark.timeout(280)
@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_two_processes_share_one_study(tmp_path, kind):
    storage = f"journal:{tmp_path / 'study.log'}" if kind == "journal" else f"sqlite:///{tmp_path / 'study.db'}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(_tune(storage, "shared", seed=100 * i, extra=["--sampler-seed", str(i)]),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
             for i in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=260)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    mine = [set(o["trial_numbers_this_process"]) for o in outs]
    assert len(mine[0]) == len(mine[1]) == 2 and not mine[0] & mine[1]  # no trial run twice
    st = optuna.load_study(study_name="shared", storage=_storage(storage))
    trials = st.get_trials()
    assert sorted(t.number for t in trials) == [0, 1, 2, 3]
    assert {t.user_attrs["pid"] for t in trials} == {p.pid for p in procs}  # both processes contributed
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert done and all(0.0 < t.value <= 1.2 for t in done)
    assert all(len(t.intermediate_values) >= 1 for t in trials)  # evaluations reported (pruning sees them)
    assert {"learning_rate", "gamma", "reward", "reward_k", "surplus_penalty"} <= set(trials[0].params)
    assert st.user_attrs["search_space_version"] == 1
    assert max(o["trials_total"] for o in outs) >= 3  # the second to finish saw the other's trials


def _storage(url):
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        return JournalStorage(JournalFileBackend(url[len("journal:"):]))
    return url


@pytest.mark.parametrize("storage,msg", [
    ("sqlite:////nonexistent-amdt-i14/x.db", "does not exist"),
    ("postgresql://127.0.0.1:1/automdt", "cannot open the study storage"),
    ("mysql+pymysql://127.0.0.1:1/automdt", "cannot open the study storage"),
    ("journal:/nonexistent-amdt-i14/x.log", "does not exist"),
    ("not-a-url", "expected a database URL"),
])
def test_bad_storage_is_one_line_exit_2(tmp_path, storage, msg):
    code, _, err = run_cli("tune", "--storage", storage, "--study-name", "x", "--trials", "1", timeout=60)
    assert code == errors.USAGE, err
    assert msg in err and err.strip().count("\n") == 0 and "Traceback" not in err


def test_experiments_tune_entry_point(tmp_path):
    p = subprocess.run([PY, "-m", "automdt.experiments", "tune", "--storage", f"journal:{tmp_path / 's.log'}",
                        "--study-name", "one", "--trials", "1", "--timesteps", "1024", "--json"],
                       capture_output=True, text=True, timeout=200, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["trials_total"] == 1 and out["best_trial"] == 0 and 0 < out["best_value"] <= 1.2


@pytest.mark.timeout(280)
def test_grid_through_submitit_local_executor(tmp_path):
    out = tmp_path / "grid"
    p = subprocess.run([PY, "-m", "automdt.experiments", "grid", "--scenarios", "read-bound,write-bound",
                        "--policies", "globus,static:8,2,2", "--seeds", "0,1", "--steps", "20", "--executor", "local",
                        "--parallel", "4", "--out", str(out)], capture_output=True, text=True, timeout=260)
    assert p.returncode == 0, p.stderr
    with open(out / "grid.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8
    assert {(r["scenario"], r["policy"], r["seed"]) for r in rows} == {
        (s, q, str(seed)) for s in ("read-bound", "write-bound") for q in ("globus", "static:8,2,2") for seed in (0, 1)}
    assert len({r["pid"] for r in rows}) > 1 and str(os.getpid()) not in {r["pid"] for r in rows}  # separate processes
    by = {(r["scenario"], r["policy"]): float(r["fraction_of_oracle"]) for r in rows}
    # (8,2,2) is the read-bound optimum; it starves the write-bound path
    assert by[("read-bound", "static:8,2,2")] > 0.95 > by[("write-bound", "static:8,2,2")]
    assert json.loads((out / "config.json").read_text())["executor"] == "local"
    assert (out / "results.md").read_text().count("| read-bound |") == 2
    code = subprocess.run([PY, "-m", "automdt.experiments", "grid", "--scenarios", "nope", "--out", str(tmp_path / "g2")],
                          capture_output=True, text=True, timeout=60)
    assert code.returncode == errors.USAGE and "unknown scenario" in code.stderr


@pytest.mark.timeout(280)
def test_train_tensorboard_logs(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = tmp_path / "tb"
    code, _, err = run_cli("train", "-o", str(tmp_path / "p.zip"), "--timesteps", "16384", "--tensorboard", str(tb),
                           "--no-progress", "--profile", _profile(tmp_path), timeout=260)
    assert code == 0, err
    runs = sorted(glob.glob(str(tb / "PPO_*")))
    assert [os.path.basename(r) for r in runs] == ["PPO_1"]
    acc = EventAccumulator(runs[0])
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"rollout/fraction_of_oracle", "train/value_loss", "train/entropy_loss", "time/fps"} <= tags, tags
    fr = acc.Scalars("rollout/fraction_of_oracle")
    with open(tmp_path / "p.curve.csv") as f:
        curve = list(csv.DictReader(f))
    assert [e.step for e in fr] == [int(r["timesteps"]) for r in curve] and len(curve) >= 10
    assert [round(e.value, 4) for e in fr] == [round(float(r["fraction_of_oracle"]), 4) for r in curve]
    meta = json.loads((tmp_path / "p.zip.json").read_text())
    assert meta["training"]["timesteps"] == fr[-1].step
    # a second run gets its own directory, as SB3 numbers them
    code, _, err = run_cli("train", "-o", str(tmp_path / "q.zip"), "--timesteps", "4096", "--tensorboard", str(tb),
                           "--no-progress", "--profile", _profile(tmp_path), timeout=200)
    assert code == 0 and os.path.isdir(tb / "PPO_2"), err


def _profile(tmp_path):
    from automdt.experiments.scenarios import SCENARIOS

    path = tmp_path / "read-bound.yaml"
    if not path.exists():
        SCENARIOS["read-bound"].profile(noise=0.03).save(str(path))
    return str(path)
