"""A policy that raises or returns garbage does not end the transfer (the controller keeps the
counts, warns once per kind of failure, and hands the run to the shield's fallback after
repeated failures)."""
from __future__ import annotations

import io
import json
import logging
import os
import sys
import textwrap

from automdt.agents.shield import Fallback
from automdt.controller import MAX_POLICY_FAILURES, Controller
from tests.automdt.test_controller import _rx, _stats


class Failing:
    name = "failing"

    def __init__(self, results):
        self.results = list(results)
        self.calls = 0

    def reset(self, max_threads, seed=None):
        return (2, 3, 4)

    def act(self, obs):
        self.calls += 1
        r = self.results.pop(0) if self.results else (5, 5, 5)
        if isinstance(r, Exception):
            raise r
        return r


def _run(pol, ticks, caplog):
    applied, log = [], io.StringIO()
    c = Controller(pol, applied.append, interval_s=1.0, max_threads=8, log_file=log, fallback=Fallback)
    c.start()
    c.tick(_stats(0.0, 0, 0, 0), _rx(0), now=10.0)
    recs = [c.tick(_stats(1.0 + i, (i + 1) << 20, 0, 0), _rx((i + 1) << 20), now=11.0 + i) for i in range(ticks)]
    return c, recs, applied, [json.loads(x) for x in log.getvalue().splitlines()[1:]]


def test_a_raising_policy_keeps_the_counts_and_warns_once_per_kind(caplog):
    pol = Failing([ValueError("bad"), (4, 4, 4), ValueError("bad again"), "garbage", (6, 6, 6)])
    with caplog.at_level(logging.WARNING, logger="automdt.controller"):
        c, recs, applied, lines = _run(pol, 5, caplog)
    assert [r.next_threads for r in recs] == [(2, 3, 4), (4, 4, 4), (4, 4, 4), (4, 4, 4), (6, 6, 6)]
    assert lines[0]["policy_error"] == "ValueError: bad" and "policy_error" not in lines[1]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2, warnings  # one ValueError, one bad return; not one per interval
    assert "failing" in warnings[0] and "ValueError" in warnings[0]
    assert c.failures == {"ValueError": 2, "bad triple": 1}


def test_repeated_failures_hand_the_run_to_the_fallback(caplog):
    pol = Failing([RuntimeError("x")] * 10)
    with caplog.at_level(logging.WARNING, logger="automdt.controller"):
        c, recs, applied, lines = _run(pol, MAX_POLICY_FAILURES + 3, caplog)
    assert pol.calls == MAX_POLICY_FAILURES  # never asked again once the fallback drives
    assert c.policy.name.startswith("fallback") and "fallback after" in lines[MAX_POLICY_FAILURES - 1]["policy_error"]
    assert lines[-1]["policy"].startswith("fallback") and "policy_error" not in lines[-1]
    assert all(1 <= n <= 8 for r in recs for n in r.next_threads)


def test_a_transfer_whose_policy_raises_completes(tmp_path):
    """The CLI with ``--policy MODULE:FACTORY`` whose ``act`` always raises: every file arrives,
    exit 0, and the log says the fallback drove."""
    from tests.util import run_cli

    (tmp_path / "mypol.py").write_text(textwrap.dedent('''
        class Broken:
            name = "broken"
            def __init__(self, max_threads=32):
                pass
            def reset(self, max_threads, seed=None):
                return (2, 2, 2)
            def act(self, obs):
                raise ValueError("no luck")
    '''))
    src = tmp_path / "src"
    src.mkdir()
    for i in range(17):
        (src / f"f{i:02d}").write_bytes(os.urandom(256 << 10))
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    rc, out, err = run_cli("transfer", str(src), str(tmp_path / "dst"), "--policy", "mypol:Broken", "--interval", "0.2",
                           "--throttle", "read.total=2M", "--log", str(tmp_path / "log.jsonl"), "--json",
                           check_json=False, timeout=120, env=env)
    assert rc == 0, err
    assert len(list((tmp_path / "dst").iterdir())) == 17
    lines = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert any("policy_error" in x for x in lines) and any(str(x.get("policy", "")).startswith("fallback") for x in lines)
    from tests.docs.test_schemas import validate

    for line in lines:  # the documented format covers these records too
        validate(line, "interval-log.schema.json")
    assert "no luck" in err and err.count("failed (ValueError") == 1
    assert "Traceback" not in err and sys.executable


def test_a_dataset_that_fits_in_the_buffers_says_why_the_policy_is_not_asked(tmp_path):
    from tests.util import run_cli

    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(os.urandom(2 << 20))
    rc, _, err = run_cli("transfer", str(src), str(tmp_path / "dst"), "--policy", "default", "--memory", "64Mi",
                         "--log", str(tmp_path / "log.jsonl"), check_json=False, timeout=60)
    assert rc == 0, err
    start = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[0])
    assert "fits in the staging buffers" in start["start"]["fits_in_buffers"]
    from tests.docs.test_schemas import validate

    validate(start, "interval-log.schema.json")
    rc, _, err = run_cli("transfer", str(src), str(tmp_path / "dst2"), "--policy", "default", "--memory", "1Mi",
                         "--chunk-size", "256Ki", "--log", str(tmp_path / "log2.jsonl"), check_json=False, timeout=60)
    assert rc == 0, err
    assert "fits_in_buffers" not in json.loads((tmp_path / "log2.jsonl").read_text().splitlines()[0])["start"]
