"""Helpers shared by the tests (import as ``tests.util``)."""
import json
import os
import random
import subprocess
import sys

CHUNK = 64 * 1024


def write_file(path, size, seed=0):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rng = random.Random(seed)
    with open(path, "wb") as f:
        f.write(rng.randbytes(size))


def trees_identical(a, b):
    """Compare two trees with diff -r (an independent tool); returns (ok, diff output)."""
    p = subprocess.run(["diff", "-r", "--no-dereference", a, b], capture_output=True, text=True)
    return p.returncode == 0, p.stdout + p.stderr


def run_cli(*args, timeout=120, env=None, check_json=True):
    """Run `python -m automdt ...`; returns (exit code, parsed --json summary or None, stderr)."""
    if args and args[0] == "transfer" and "--threads" not in args and "--policy" not in args:
        args = args + ("--threads", "2,2,2")  # static counts unless the test is about policies
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([sys.executable, "-m", "automdt", *args], capture_output=True, text=True, timeout=timeout, env=e)
    summary = None
    if check_json and "--json" in args and p.stdout.strip():
        summary = json.loads(p.stdout.strip().splitlines()[-1])
    return p.returncode, summary, p.stderr
