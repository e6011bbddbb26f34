"""The C sources of the engine follow .clang-format (the pinned clang-format of requirements.lock)."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _clang_format() -> str:
    """The venv's clang-format (installed by `make setup` from requirements.lock)."""
    exe = os.path.join(os.path.dirname(sys.executable), "clang-format")
    found = exe if os.path.exists(exe) else shutil.which("clang-format")
    assert found, "clang-format is not installed: run `make setup` (requirements.lock pins it)"
    return found


def test_c_sources_are_clang_formatted() -> None:
    sources = sorted(glob.glob(os.path.join(ROOT, "transfer_engine", "src", "*.[ch]")))
    assert len(sources) > 10
    out = subprocess.run([_clang_format(), "--dry-run", "--Werror", f"--style=file:{ROOT}/.clang-format",
                          *sources], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (
        "C sources differ from .clang-format; run `.venv/bin/clang-format -i transfer_engine/src/*.[ch]`:\n"
        + out.stderr[-3000:])
