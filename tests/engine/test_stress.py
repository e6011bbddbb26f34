"""Threading stress in a subprocess with a timeout, so a deadlock fails instead of hanging."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import te  # noqa: F401  (skips when the engine is not built)

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("seed", [1, 2])
def test_churn_close_stress_subprocess(seed):
    cmd = [sys.executable, os.path.join(HERE, "stress_churn.py"), str(seed), "4"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"stress run hung (possible deadlock); output so far: {exc.stdout!r} {exc.stderr!r}")
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr[-3000:]}"
    assert p.stdout.startswith("OK "), p.stdout
    assert int(p.stdout.split()[1]) >= 3
