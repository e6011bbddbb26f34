"""The many-senders load script, small: N concurrent `automdt transfer` processes (each its own
session and policy) into one `automdt receive`; every tree identical, the daemon's memory within
its caps, Jain's index reported, the daemon still serving afterwards. The 32-sender figure is
``scripts/load_many_senders.py`` with its defaults (``benchmarks/results/scale.json``, shown in
``docs/benchmarks.md``)."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("automdt.transfer_engine._engine")

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(280)
def test_six_concurrent_senders_into_one_daemon(tmp_path):
    out = tmp_path / "load.json"
    p = subprocess.run([sys.executable, os.path.join(HERE, "scripts", "load_many_senders.py"), "--senders", "6",
                        "--files", "5", "--mib", "3", "--link-mbps", "0", "--policies", "static:2,2,2,marlin",
                        "--json", str(out)], capture_output=True, text=True, timeout=260, cwd=HERE)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(out.read_text())
    assert r["ok"] and r["all_exit_0"] and r["trees_identical"] == 6
    assert r["within_memory_cap"] and r["receiver_rss_growth_MiB"] <= r["memory_cap_MiB"]
    assert r["still_serving"] and r["receiver_alive"]
    assert 1 / 6 <= r["jain_whole_runs"] <= 1.0
    assert r["metrics_after"]["automdt_sessions_total"] == 6
    assert r["metrics_after"]["automdt_received_files_total"] == 6 * 6  # 5 files + 1 empty each
    assert "Jain's fairness index" in p.stdout
