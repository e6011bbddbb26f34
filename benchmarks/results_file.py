"""Write a benchmark's figures as a results file (``automdt-results/1``).

The documentation's tables are generated from these files (``docs/formats/results.md``; schema
``docs/schemas/results.schema.json``). Besides the tables, a file records when, where, at which
commit and with which command its figures were taken, filled in here so that no script has to.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from typing import Any, Dict, List, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def machine() -> str:
    """CPU count, memory, OS and Python of this machine, in one line."""
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) / (1 << 20)
        mem_text = f", {mem:.0f} GiB"
    except (OSError, ValueError, IndexError):
        mem_text = ""
    return f"{platform.node()}: {os.cpu_count()} CPUs{mem_text}, {platform.system()} {platform.release()}, " \
           f"Python {platform.python_version()}"


def commit() -> str:
    """The checkout's short commit, ``-dirty`` when it has uncommitted changes; ``unknown`` outside git."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD")
        return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def table(table_id: str, title: str, columns: Sequence[tuple], rows: List[Dict[str, Any]],
          notes: Sequence[str] = ()) -> Dict[str, Any]:
    """One table: ``columns`` as ``(key, label)`` pairs, ``rows`` as dicts by key."""
    t: Dict[str, Any] = {"id": table_id, "title": title,
                         "columns": [{"key": k, "label": label} for k, label in columns], "rows": rows}
    if notes:
        t["notes"] = list(notes)
    return t


def write(path: str, title: str, conditions: str, tables: List[Dict[str, Any]], **extra: Any) -> None:
    """Write the results file ``path`` (atomically); ``extra`` keeps raw samples beside the tables."""
    data = {
        "format": "automdt-results/1",
        "title": title,
        "benchmark": os.path.relpath(os.path.abspath(sys.argv[0]), ROOT),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "commit": commit(),
        "command": " ".join(shlex.quote(a) for a in [os.path.relpath(sys.executable, ROOT)
                                                       if sys.executable.startswith(ROOT) else "python", *sys.argv]),
        "conditions": f"{conditions}; load average {os.getloadavg()[0]:.1f} at the end",
        "tables": tables,
        **extra,
    }
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
