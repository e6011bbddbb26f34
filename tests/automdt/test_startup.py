"""The operators' commands stay light: `transfer` (default PPO policy included), `receive`,
`explore` and `verify` import neither torch, stable-baselines3 nor gymnasium.

Each command runs for real (``python -X importtime -m automdt ...``, a subprocess) and the test
reads which modules it imported from the interpreter's own import log.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("automdt.transfer_engine._engine")

HEAVY = ("torch", "stable_baselines3", "gymnasium")


def _imported(stderr: str) -> set:
    """Top-level package names from ``-X importtime`` lines (``import time: self | cumulative | name``)."""
    out = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            out.add(name.split(".")[0])
    return out


def _run(args, tmp_path, timeout=120):
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "automdt", *args], capture_output=True, text=True,
                       timeout=timeout, env=env)
    msgs = "\n".join(ln for ln in p.stderr.splitlines() if not ln.startswith("import time:"))
    return p.returncode, _imported(p.stderr), msgs


@pytest.mark.parametrize("policy", [[], ["--policy", "ppo"], ["--threads", "2,2,2"], ["--policy", "marlin"]])
def test_transfer_imports_no_ml_framework(make_tree, tmp_path, policy):
    src = make_tree({"a.bin": 3, "d/b.bin": 200_000})
    code, mods, msgs = _run(["transfer", src, str(tmp_path / "dst"), "-q", *policy], tmp_path)
    assert code == 0, msgs
    assert "automdt" in mods
    assert not mods & set(HEAVY), sorted(mods & set(HEAVY))
    assert (tmp_path / "dst" / "d" / "b.bin").stat().st_size == 200_000


def test_verify_and_explore_import_no_ml_framework(make_tree, tmp_path):
    src = make_tree({f"f{i}.bin": 1 << 20 for i in range(4)})
    code, mods, msgs = _run(["transfer", src, str(tmp_path / "dst"), "-q", "--threads", "2,2,2"], tmp_path)
    assert code == 0, msgs
    code, mods, msgs = _run(["verify", src, str(tmp_path / "dst"), "-q"], tmp_path)
    assert code == 0, msgs
    assert not mods & set(HEAVY), sorted(mods & set(HEAVY))
    code, mods, msgs = _run(["explore", src, str(tmp_path / "xdst"), "--duration", "4", "--interval", "0.5",
                             "--max-threads", "4", "--throttle", "read.total=4M", "-o", str(tmp_path / "p.yaml"),
                             "-q", "--allow-weak-fit"], tmp_path)  # 4 s: too short a fit to be trusted
    assert code == 0, msgs
    assert (tmp_path / "p.yaml").is_file()
    assert "numpy" in mods and not mods & set(HEAVY), sorted(mods & set(HEAVY))


def test_receive_imports_no_ml_framework(make_tree, tmp_path):
    src = make_tree({"a.bin": 100_000})
    root = tmp_path / "root"
    root.mkdir()
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    rx = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "automdt", "receive", "--listen",
                           "127.0.0.1:0", "--root", str(root)], stderr=subprocess.PIPE, text=True, env=env)
    try:
        port, lines = None, []
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            line = rx.stderr.readline()
            if not line:
                break
            lines.append(line)
            if "receiving into" in line:
                port = line.rsplit(":", 1)[1].strip()
        assert port, "".join(ln for ln in lines if not ln.startswith("import time:"))
        code, _, msgs = _run(["transfer", src, f"127.0.0.1:{port}/x", "-q", "--threads", "1,1,1"], tmp_path)
        assert code == 0, msgs
    finally:
        rx.send_signal(signal.SIGTERM)
        rest = rx.communicate(timeout=30)[1]
    assert (root / "x" / "a.bin").stat().st_size == 100_000
    mods = _imported("".join(lines) + rest)
    assert "zmq" in mods and not mods & set(HEAVY), sorted(mods & set(HEAVY))


def test_default_policy_imports_numpy_only_when_it_first_acts(make_tree, tmp_path):
    """Loading and checking the shipped policy needs the standard library only: a transfer that
    ends before its first control interval (here: a 30 s interval) never imports numpy."""
    src = make_tree({"a.bin": 3})
    code, mods, msgs = _run(["transfer", src, str(tmp_path / "dst"), "-q", "--interval", "30"], tmp_path)
    assert code == 0, msgs
    assert "automdt" in mods and "numpy" not in mods and not mods & set(HEAVY)


@pytest.mark.parametrize("user_value", [None, "3"])
def test_live_commands_run_numpy_without_a_blas_thread_pool(make_tree, tmp_path, user_value):
    """transfer/receive/explore/verify set OPENBLAS_NUM_THREADS=1 (and OMP_NUM_THREADS) before any
    numpy import: a policy's inference needs no BLAS threads. A value the user set stays."""
    src = make_tree({"a.bin": 3})
    code = ("import os, sys\n"
            "from automdt.cli import main\n"
            "rc = main(['verify', sys.argv[1], sys.argv[2], '-q'])\n"
            "print(rc, os.environ.get('OPENBLAS_NUM_THREADS'), os.environ.get('OMP_NUM_THREADS'))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    if user_value is not None:
        env["OPENBLAS_NUM_THREADS"] = user_value
    p = subprocess.run([sys.executable, "-c", code, src, src], capture_output=True, text=True, timeout=60, env=env)
    rc, blas, omp = p.stdout.split()
    assert rc == "0", p.stderr
    assert blas == (user_value or "1") and omp == "1"
