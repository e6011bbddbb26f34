"""The base install: the wheel, installed without extras into a fresh virtual environment, moves
data (local and to a receiver), verifies it and runs the simulator with the shipped policy and a
baseline (numpy only), and holds no torch, stable-baselines3, gymnasium or matplotlib. A command
that needs an extra (``train``, ``tune``) says in one line which one to install (exit 2).

The wheel is built from a copy of the working tree (the C engine compiles in a few seconds) with
the development environment's setuptools; the new environment gets its dependencies from the
package index (pip's cache makes a repeated run quick).
"""
from __future__ import annotations

import glob
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time

import pytest

from tests.util import trees_identical, write_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXTRAS_ONLY = ("torch", "stable-baselines3", "gymnasium", "matplotlib", "optuna", "pandas")
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", "*.so", "*.o", "runs",
                                    "demo-data", ".pytest_cache", ".ipynb_checkpoints", "notebooks", "benchmarks")


def _run(argv, timeout=300, env=None, check=True, cwd=None):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    if check:
        assert p.returncode == 0, f"{' '.join(argv)}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    return p


@pytest.fixture(scope="module")
def base_env(tmp_path_factory):
    """``(bin directory, environment)`` of a fresh virtual environment holding the wheel alone."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    shutil.copytree(ROOT, src, ignore=NOT_SOURCE, symlinks=True)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
          "--no-build-isolation", "-w", str(work / "dist"), str(src)])
    wheels = glob.glob(str(work / "dist" / "automdt-*.whl"))
    assert len(wheels) == 1, wheels
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", wheels[0]],
         timeout=600)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(XDG_STATE_HOME=str(work / "state"), XDG_RUNTIME_DIR=str(work / "runtime"), PYTHONDONTWRITEBYTECODE="1")
    os.makedirs(env["XDG_RUNTIME_DIR"], mode=0o700)
    return str(venv / "bin"), env, wheels[0]


def _automdt(base_env, *args, timeout=120):
    bindir, env, _ = base_env
    # run from a directory with no automdt/ in it: the installed package, not the checkout
    return subprocess.run([os.path.join(bindir, "automdt"), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=env["XDG_STATE_HOME"].rsplit("/", 1)[0])


def test_wheel_holds_no_experiments_and_pulls_no_training_stack(base_env):
    bindir, env, wheel = base_env
    names = subprocess.run([os.path.join(bindir, "python"), "-c",
                            "import zipfile, sys; print('\\n'.join(zipfile.ZipFile(sys.argv[1]).namelist()))", wheel],
                           capture_output=True, text=True, check=True).stdout.split()
    assert "automdt/data/default_policy.zip" in names and any(n.startswith("automdt/transfer_engine/_engine") for n in names)
    assert not [n for n in names if n.startswith(("automdt/experiments/", "automdt/transfer_engine/src/"))]
    listed = _run([os.path.join(bindir, "python"), "-m", "pip", "list", "--format=json"], env=env).stdout
    installed = {d["name"].lower().replace("_", "-") for d in json.loads(listed)}
    assert "automdt" in installed and "numpy" in installed
    assert not installed & set(EXTRAS_ONLY), sorted(installed & set(EXTRAS_ONLY))


def test_base_install_transfers_verifies_and_simulates(base_env, tmp_path):
    src = tmp_path / "src"
    write_file(str(src / "big.bin"), 3 << 20, seed=1)
    write_file(str(src / "d" / "small.txt"), 1000, seed=2)
    # the shipped PPO policy, numpy inference, a local destination
    p = _automdt(base_env, "transfer", str(src), str(tmp_path / "dst"), "--json")
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["files_transferred"] == 2 and summary["link"] == "local"
    assert trees_identical(str(src), str(tmp_path / "dst"))[0]
    p = _automdt(base_env, "verify", str(src), str(tmp_path / "dst"), "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["verified"] == 2, p.stdout + p.stderr

    # a receiver of the base install, and the shipped policy sending to it over loopback TCP
    bindir, env, _ = base_env
    root = tmp_path / "root"
    root.mkdir()
    recv = subprocess.Popen([os.path.join(bindir, "automdt"), "receive", "--listen", "127.0.0.1:0", "--root", str(root)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        port, seen, deadline = None, "", time.monotonic() + 60
        while port is None and time.monotonic() < deadline and recv.poll() is None:
            if select.select([recv.stderr], [], [], 1.0)[0]:
                line = recv.stderr.readline()
                seen += line
                m = re.search(r"receiving into .* on 127\.0\.0\.1:(\d+)", line)
                port = int(m.group(1)) if m else None
        assert port is not None, seen
        p = _automdt(base_env, "transfer", str(src), f"127.0.0.1:{port}/run", "--json")
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout.strip().splitlines()[-1])["link"] != "local"
        assert trees_identical(str(src), str(root / "run"))[0]
        p = _automdt(base_env, "verify", str(src), f"127.0.0.1:{port}/run", "-q")
        assert p.returncode == 0, p.stderr
    finally:
        recv.terminate()
        recv.wait(20)
    assert recv.returncode == 0

    # the simulator's numpy core: a baseline and the shipped policy against the oracle
    profile = tmp_path / "p.yaml"
    bindir, env, _ = base_env
    _run([os.path.join(bindir, "python"), "-c", "import sys; from automdt.simulator.profile import Profile; "
          "Profile.default().save(sys.argv[1])", str(profile)], env=env, cwd=str(tmp_path))
    for policy in ("model", "ppo"):
        p = _automdt(base_env, "simulate", "--profile", str(profile), "--policy", policy, "--json")
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["fraction_of_oracle"] > 0.9, p.stdout


@pytest.mark.parametrize("argv,extra", [
    (["train", "-o", "{tmp}/policy.zip"], "train"),
    (["tune", "--storage", "journal:{tmp}/study.log", "--study-name", "s"], "train,sweeps"),
])
def test_command_needing_an_extra_names_it(base_env, tmp_path, argv, extra):
    p = _automdt(base_env, *[a.format(tmp=tmp_path) for a in argv])
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pip install 'automdt[{extra}]'" in lines[0], p.stderr
    assert not os.listdir(tmp_path)
