"""The control seam: the policy contract and the interval record are standard-library modules, and
the transfer path imports neither the simulator package nor any ML framework.

Each import check runs in a fresh interpreter (a subprocess) and reads ``sys.modules`` there.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "stable_baselines3", "gymnasium")


def _modules(code: str) -> set:
    out = subprocess.run([sys.executable, "-c", code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.splitlines()[-1]))


def _forbidden(mods: set, *more: str) -> list:
    return sorted(m for m in mods if m.split(".")[0] in HEAVY + more or m.startswith("automdt.simulator"))


def test_importing_the_sender_imports_no_simulator_nor_ml_framework():
    mods = _modules("import automdt.sender, automdt.controller, automdt.start, automdt.history")
    assert "automdt.policy_contract" in mods and "automdt.interval" in mods
    assert not _forbidden(mods, "numpy"), _forbidden(mods, "numpy")


def test_the_contract_modules_use_the_standard_library_only():
    before = _modules("")  # the interpreter's own start-up (site, the editable install's finder)
    mods = _modules("import automdt.policy_contract, automdt.interval") - before
    outside = sorted(m for m in mods if m.split(".")[0] not in sys.stdlib_module_names)
    outside = [m for m in outside if m != "automdt._version"]  # the build's version string: no imports
    assert outside == ["automdt", "automdt.interval", "automdt.policy_contract"], outside


@pytest.mark.parametrize("policy", ["None", "make_policy('marlin', max_threads=8)"])
def test_a_transfer_imports_no_simulator(make_tree, tmp_path, policy):
    pytest.importorskip("automdt.transfer_engine._engine")
    src = make_tree({"a.bin": 3, "d/b.bin": 300_000})
    dst = tmp_path / "dst"
    mods = _modules(f"""
from automdt.agents.registry import make_policy
from automdt.sender import TransferOptions, run_transfer
s = run_transfer({str(src)!r}, {str(dst)!r}, TransferOptions(threads=(2, 2, 2), policy={policy}, interval_s=0.2))
assert s.exit_code == 0, s.errors
""")
    assert (dst / "d" / "b.bin").stat().st_size == 300_000
    assert not _forbidden(mods), _forbidden(mods)


def test_the_simulator_and_the_agents_re_export_the_one_contract():
    import automdt.agents.base as base
    import automdt.policy_contract as contract
    import automdt.simulator.types as types
    from automdt.agents.static import StaticPolicy

    assert types.Observation is contract.Observation and types.Triple is contract.Triple
    assert base.Policy is contract.Policy and base.clamp_triple is contract.clamp_triple
    assert isinstance(StaticPolicy(1, 2, 3), contract.Policy)
    assert contract.clamp_triple((0, 2.6, 99), 8) == (1, 3, 8)


def test_the_receivers_write_bound_reaches_the_controller(make_tree, tmp_path):
    """A receiver started with ``--max-threads 2`` clamps write threads: the sender reads the bound
    from the ``opened`` reply, so the log shows (and the next interval asks for) what runs."""
    pytest.importorskip("automdt.transfer_engine._engine")
    from automdt.receiver import ReceiverServer
    from automdt.sender import TransferOptions, run_transfer

    src = make_tree({f"f{i}.bin": 1 << 20 for i in range(3)})
    root = tmp_path / "root"
    root.mkdir()
    log = tmp_path / "log.jsonl"
    srv = ReceiverServer(str(root), "127.0.0.1", 0, max_threads=2).start()
    try:
        s = run_transfer(str(src), f"127.0.0.1:{srv.port}/in", TransferOptions(
            threads=(2, 2, 6), max_threads=8, interval_s=0.25, log_path=str(log),
            throttle={"read": (0, 3_000_000)}))
    finally:
        srv.stop()
    assert s.exit_code == 0, s.errors
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert lines[0]["start"]["threads"] == {"read": 2, "net": 2, "write": 2}
    assert len(lines) >= 3 and all(x["threads"]["write"] == 2 and x["next_threads"]["write"] == 2 for x in lines[1:])
