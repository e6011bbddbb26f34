"""The JSON Schemas of docs/schemas/ describe what automdt really writes.

Each test makes the real file (a small local transfer with --json, --log and its job history, a
profile from the simulator's fit written and read back as YAML, the shipped policy's sidecar, the
results files the docs' tables are generated from) and validates it with ``jsonschema``.
"""
import glob
import json
import os
import re

import pytest

from tests.util import run_cli, write_file

jsonschema = pytest.importorskip("jsonschema")
referencing = pytest.importorskip("referencing")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMAS = os.path.join(ROOT, "docs", "schemas")


def _registry():
    resources = []
    for path in glob.glob(os.path.join(SCHEMAS, "*.schema.json")):
        with open(path) as f:
            schema = json.load(f)
        resources.append((schema["$id"], referencing.Resource.from_contents(schema)))
    return referencing.Registry().with_resources(resources)


def validate(instance, name):
    with open(os.path.join(SCHEMAS, name)) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator(schema, registry=_registry(),
                                    format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER).validate(instance)


def test_every_schema_is_a_valid_draft_2020_12_schema():
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(SCHEMAS, "*.schema.json")))
    assert {"profile.schema.json", "interval-log.schema.json", "summary.schema.json", "history.schema.json",
            "policy-metadata.schema.json", "results.schema.json"} <= set(names)
    for name in names:
        with open(os.path.join(SCHEMAS, name)) as f:
            schema = json.load(f)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        jsonschema.Draft202012Validator.check_schema(schema)


@pytest.fixture(scope="module")
def transfer_outputs(tmp_path_factory):
    """One small local transfer, slow enough (a throttled reader, 0.1-s intervals) to measure
    several intervals and so write the job's history; then a dry run of the same job."""
    tmp = tmp_path_factory.mktemp("schemas")
    src, dst, state = tmp / "src", tmp / "dst", tmp / "state"
    write_file(str(src / "a.bin"), 6 << 20, seed=1)
    write_file(str(src / "sub" / "b.txt"), 5000, seed=2)
    env = {"XDG_STATE_HOME": str(state)}
    log = tmp / "log.jsonl"
    rc, summary, err = run_cli("transfer", str(src), str(dst), "--json", "--log", str(log), "--policy", "default",
                               "--throttle", "read.thread=4M", "--interval", "0.1", env=env)
    assert rc == 0, err
    (src / "c.bin").write_bytes(b"new")
    rc, dry, err = run_cli("transfer", str(src), str(dst), "--json", "--dry-run", env=env)
    assert rc == 0, err
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    history = [json.loads(open(p).read()) for p in glob.glob(str(state / "automdt" / "jobs" / "*.json"))]
    return summary, dry, lines, history


def test_transfer_summary_matches_its_schema(transfer_outputs):
    summary, dry, _, _ = transfer_outputs
    assert summary["files_transferred"] == 2 and "start" in summary
    validate(summary, "summary.schema.json")
    assert dry["dry_run_files"] == ["c.bin"]
    validate(dry, "summary.schema.json")


def test_interval_log_lines_match_their_schema(transfer_outputs):
    _, _, lines, _ = transfer_outputs
    assert "start" in lines[0] and len(lines) >= 3
    assert all("final" not in line for line in lines[:-1])  # only the last line may be the partial interval
    for line in lines:
        validate(line, "interval-log.schema.json")


def test_job_history_matches_its_schema(transfer_outputs):
    _, _, _, history = transfer_outputs
    assert len(history) == 1
    validate(history[0], "history.schema.json")


def test_a_fitted_profile_written_as_yaml_matches_its_schema(tmp_path):
    import numpy as np
    import yaml

    from automdt.simulator.fit import fit_profile, synthetic_samples
    from automdt.simulator.profile import Profile

    samples = synthetic_samples(Profile.default(), 40, np.random.default_rng(0))
    path = tmp_path / "path.yaml"
    fit_profile(samples).save(path)
    validate(yaml.safe_load(path.read_text()), "profile.schema.json")
    validate(yaml.safe_load(yaml.safe_dump(Profile.default().to_dict())), "profile.schema.json")


def test_a_profile_the_loader_refuses_is_refused_by_the_schema_too():
    bad = {"stages": {"read": {"tpt": 1e6, "bandwidth": 1e7}, "net": {"tpt": 1e6, "bandwidth": 1e7}},
           "buffers": {"sender": 1, "receiver": 1}}
    with pytest.raises(jsonschema.ValidationError):
        validate(bad, "profile.schema.json")


def test_the_shipped_policy_sidecar_matches_its_schema():
    with open(os.path.join(ROOT, "automdt", "data", "default_policy.zip.json")) as f:
        validate(json.load(f), "policy-metadata.schema.json")


def test_every_results_file_matches_its_schema():
    paths = glob.glob(os.path.join(ROOT, "benchmarks", "results", "*.json")) + \
        glob.glob(os.path.join(ROOT, "experiments", "results", "*.json"))
    assert paths
    pages = "".join(open(p).read() for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        rel = os.path.relpath(path, ROOT)
        if data.get("format") != "automdt-results/1":  # a file of its own format has its own renderer
            assert re.search(rf"```{{results-table}} {re.escape(rel)}\n:renderer: ", pages), \
                f"{rel} is not automdt-results/1 and no docs page renders it with a :renderer:"
            continue
        validate(data, "results.schema.json")
        for table in data["tables"]:
            keys = {c["key"] for c in table["columns"]}
            for row in table["rows"]:
                assert set(row) <= keys, f"{path}: {table['id']}: a row has keys no column shows: {set(row) - keys}"


def test_a_benchmark_writes_a_results_file_the_docs_can_show(tmp_path):
    """``--json`` of a benchmark script writes ``automdt-results/1`` with its provenance filled in."""
    import subprocess
    import sys

    sys.path.insert(0, os.path.join(ROOT, "docs", "_ext"))
    import automdt_docs

    out = tmp_path / "session.json"
    subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_session.py"), "--files", "50", "--reps", "1",
                    "--json", str(out)], check=True, capture_output=True, timeout=120)
    data = json.loads(out.read_text())
    validate(data, "results.schema.json")
    assert data["commit"] and data["machine"] and "bench_session.py" in data["command"]
    assert [r["step"] for r in data["tables"][0]["rows"]] == ["plan", "activate", "rename"]
    text = "\n".join(automdt_docs.results_markdown(str(out)))
    assert "plan" in text and data["commit"] in text
