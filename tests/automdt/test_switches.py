"""The data-path switches (automdt.transfer_engine.switches): explicit options (``--switch``),
checked at parse time, in force for one command, recorded in the interval log's start record;
and ``--debug`` / its mirror ``AUTOMDT_DEBUG`` turning the engine's debug lines on."""
from __future__ import annotations

import json
import os

import pytest

from automdt import cli, errors
from automdt.transfer_engine import switches
from tests.util import run_cli, trees_identical

CHUNK = 64 * 1024


def test_parse_names_values_and_bad_items():
    sw = switches.Switches.parse(["local_link=0,files_at_once=3", "tls-batch=0", "files_at_once=2"])
    assert sw == switches.Switches(local_link=False, tls_batch=False, files_at_once=2)
    assert sw.changed() == {"local_link": False, "tls_batch": False, "files_at_once": 2}
    assert switches.Switches.parse(None).changed() == {}
    for bad, why in [("sendfile=2", "0 or 1"), ("nope=1", "NAME one of"), ("sendfile", "NAME=VALUE"),
                     ("files_at_once=x", "whole number"), ("files_at_once=65", "0..64")]:
        with pytest.raises(ValueError, match=why):
            switches.Switches.parse(bad)


@pytest.mark.parametrize("argv", [["transfer", "{src}", "{dst}", "--switch", "sendfile=2"],
                                  ["explore", "{src}", "{dst}", "-o", "{dst}.yaml", "--switch", "bogus=0"],
                                  ["receive", "--listen", "127.0.0.1:0", "--root", "{dst}", "--switch", "tls_batch"]])
def test_a_bad_switch_is_a_usage_error_before_any_work(make_tree, tmp_path, argv):
    src, dst = make_tree({"a": 10}), str(tmp_path / "dst")
    code, _, err = run_cli(*[a.format(src=src, dst=dst) for a in argv])
    assert code == errors.USAGE and len(err.strip().splitlines()) == 1 and "--switch" in err, err
    assert not os.path.exists(dst)


def test_switches_are_recorded_in_the_start_record_and_hold_for_one_command(make_tree, tmp_path):
    src = make_tree({f"f{i}": 5 * CHUNK + i for i in range(4)})
    log = tmp_path / "log.jsonl"
    argv = ["transfer", src, str(tmp_path / "dst"), "-q", "--threads", "2,2,2", "--chunk-size", str(CHUNK),
            "--log", str(log), "--switch", "local_link=0", "--switch", "sendfile=0,files_at_once=1"]
    assert cli.main(argv) == 0  # in this process: the switches are undone afterwards
    assert switches.current() == switches.Switches()
    assert trees_identical(src, str(tmp_path / "dst"))[0]
    start = json.loads(log.read_text().splitlines()[0])
    assert start["start"]["switches"] == {"local_link": False, "sendfile": False, "files_at_once": 1}
    assert cli.main(["transfer", src, str(tmp_path / "dst2"), "-q", "--threads", "2,2,2", "--log", str(log)]) == 0
    assert "switches" not in json.loads(log.read_text().splitlines()[-1 - _intervals(log)])["start"]


def _intervals(log) -> int:
    """Records after the last start record."""
    lines = log.read_text().splitlines()
    last = max(i for i, ln in enumerate(lines) if '"start"' in ln)
    return len(lines) - 1 - last


@pytest.mark.parametrize("how", ["option", "environment", "neither"])
def test_debug_turns_on_the_engines_debug_lines(make_tree, tmp_path, how):
    src = make_tree({"a": 3 * CHUNK})
    extra = ("--debug",) if how == "option" else ()
    env = {"AUTOMDT_DEBUG": "1" if how == "environment" else "0"}
    code, _, err = run_cli("transfer", src, str(tmp_path / "dst"), "--threads", "1,1,1", *extra, env=env)
    assert code == 0, err
    assert ("automdt-engine " in err) is (how != "neither"), err[-2000:]
