#!/usr/bin/env python3
"""Coverage-guided fuzzing of the receiver's control-message handling and data-connection frame
parser (atheris/libFuzzer; the harness is tests/fuzz/harness.py, which says what each input becomes
and what is checked after every input).

    .venv/bin/python scripts/fuzz_receiver.py                      # 1,000,000 inputs per target
    .venv/bin/python scripts/fuzz_receiver.py --runs 20000 --targets data --json out.json

Prints, per target: inputs run, wall time and inputs/s, libFuzzer's coverage (``cov``: edges,
``ft``: features, of the instrumented Python receiver code) and corpus size, the outcomes by kind
(rejections, protocol errors, chunks written...), the normal transfers that succeeded at the
checkpoints (every 2000 inputs and at the end), and whether it ended without a finding (crash,
hang over --timeout seconds, internal error, anything written outside the root). Exit status 0
only if every target ran all its inputs without a finding; a finding's input is saved in the
work directory printed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_target(target: str, runs: int, timeout_s: int, max_len: int, work: str, seed: int) -> dict:
    stats = os.path.join(work, f"{target}.stats.json")
    corpus = os.path.join(work, f"{target}-corpus")
    os.makedirs(corpus, exist_ok=True)
    log = os.path.join(work, f"{target}.log")
    cmd = [sys.executable, "-m", "tests.fuzz.harness", target, stats, corpus, f"-runs={runs}", f"-max_len={max_len}",
           f"-timeout={timeout_s}", "-rss_limit_mb=3072", f"-seed={seed}", "-print_final_stats=1",
           f"-artifact_prefix={work}/{target}-", "-print_pcs=0"]
    t0 = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=HERE).returncode
    wall = time.monotonic() - t0
    text = open(log, errors="replace").read()
    out = {"target": target, "exit_code": rc, "wall_s": round(wall, 1)}
    try:
        out.update(json.load(open(stats)))
    except (OSError, ValueError):
        out["inputs"] = 0
    m = re.findall(r"#(\d+)\s+(?:DONE|pulse|NEW|REDUCE|INITED)\s+cov: (\d+) ft: (\d+) corp: (\d+)/", text)
    if m:
        out["libfuzzer_inputs"], out["cov"], out["ft"], out["corpus"] = (int(x) for x in m[-1])
    done = re.search(r"Done (\d+) runs in (\d+) second", text)
    out["done_runs"] = int(done.group(1)) if done else None
    out["inputs_per_s"] = round(out.get("inputs", 0) / max(wall, 1e-9), 1)
    out["finding"] = None if rc == 0 and out.get("final") else (re.findall(r"(Finding: .*|==\d+== ERROR: .*|"
                                                                            r"Traceback.*)", text) or [f"exit {rc}"])[0]
    out["log"] = log
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1_000_000, help="inputs per target (default 1000000)")
    ap.add_argument("--targets", default="control,data")
    ap.add_argument("--timeout", type=int, default=20, help="seconds one input may take before it is a hang")
    ap.add_argument("--max-len", type=int, default=16384)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (corpus, logs)")
    a = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="amdt-i14-fuzzrun-")
    results = [run_target(t.strip(), a.runs, a.timeout, a.max_len, work, a.seed) for t in a.targets.split(",") if t.strip()]
    ok = all(r["finding"] is None and r.get("inputs") == a.runs for r in results)
    for r in results:
        print(f"{r['target']}: {r.get('inputs', 0)} inputs in {r['wall_s']} s ({r['inputs_per_s']}/s); "
              f"coverage cov {r.get('cov')} ft {r.get('ft')} (instrumented receiver code), corpus {r.get('corpus')}; "
              f"normal transfers ok at checkpoints: {r.get('normal_transfers_ok')}; finding: {r['finding']}")
        print(f"  outcomes: {json.dumps(r.get('outcomes', {}), sort_keys=True)}")
    print(f"ok: {ok}" + (f" (work directory {work})" if not ok or a.keep else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": a.runs, "ok": ok, "results": results}, f, indent=2)
    if ok and not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
