"""A short run of the coverage-guided fuzzers (atheris) of the receiver's control messages and data
frames: no finding (crash, hang, internal error, write outside the root), the daemon still
completes a normal transfer at every checkpoint, and coverage grows beyond the seed inputs.
The 10^6-input run is ``scripts/fuzz_receiver.py`` (figures in ``benchmarks/results/scale.json``,
shown in ``docs/benchmarks.md``)."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("atheris")
pytest.importorskip("automdt.transfer_engine._engine")

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(280)
def test_short_fuzz_runs_find_nothing(tmp_path):
    out = tmp_path / "fuzz.json"
    before = set(os.listdir("/tmp"))
    p = subprocess.run([sys.executable, os.path.join(HERE, "scripts", "fuzz_receiver.py"), "--runs", "4000",
                        "--json", str(out)], capture_output=True, text=True, timeout=260, cwd=HERE)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(out.read_text())
    assert res["ok"] and [r["target"] for r in res["results"]] == ["control", "data"]
    for r in res["results"]:
        assert r["inputs"] == 4000 and r["done_runs"] == 4000 and r["finding"] is None
        assert r["normal_transfers_ok"] == 2  # checkpoints at 2000 and 4000 inputs
        assert r["cov"] > 100 and r["corpus"] > 1  # libFuzzer found inputs with new coverage
    data = res["results"][1]["outcomes"]
    # the frame parser saw refused hellos, invalid frames and chunks it wrote (how many chunks fail
    # their checksum in 4000 inputs varies with timing: counted, not required)
    assert data["connections_rejected"] > 0 and data["protocol_errors"] > 0 and data["chunks_written"] > 0
    ctl = res["results"][0]["outcomes"]
    assert ctl["ProtocolError"] > 0 and ctl["SessionError"] > 0
    assert "control:" in p.stdout and "coverage cov" in p.stdout
    leftovers = [n for n in set(os.listdir("/tmp")) - before if n.startswith("amdt-i14-fuzz")]
    assert not leftovers, leftovers
