"""Smoke test of benchmarks/bench_engine.py: the loopback section at tiny sizes, one repetition."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_engine.py")


@pytest.mark.skipif(shutil.which("iperf3") is None, reason="iperf3 not installed (apt-get install -y iperf3)")
@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_quick_loopback_prints_a_ratio(tmp_path):
    out_json = tmp_path / "bench.json"
    p = subprocess.Popen([sys.executable, SCRIPT, "--quick", "--only", "loopback", "--reps", "1",
                          "--json", str(out_json)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        out, _ = p.communicate(timeout=90)   # ~10 s normally; generous for a loaded 2-core machine
    except subprocess.TimeoutExpired:
        p.terminate()
        try:
            p.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
        pytest.fail("bench_engine.py --quick did not finish in 90 s")
    assert p.returncode == 0, out
    assert re.search(r"ratio vs 128 KiB writes \d+\.\d+x", out), out
    doc = json.loads(out_json.read_text())
    row = doc["sections"]["loopback"]["rows"][0]
    assert row["automdt_gbit"] > 0 and row["iperf3_128k_gbit"] > 0 and row["ratio_128k"] > 0
    # the script removes its scratch directory (datasets included) on exit
    assert not os.path.exists(f"/dev/shm/automdt-bench-{p.pid}")
