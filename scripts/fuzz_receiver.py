#!/usr/bin/env python3
"""Coverage-guided fuzzing of the receiver's control-message handling and data-connection frame
parser (atheris/libFuzzer; the harness is tests/fuzz/harness.py, which says what each input becomes
and what is checked after every input).

    .venv/bin/python scripts/fuzz_receiver.py                      # 1,000,000 inputs per target
    .venv/bin/python scripts/fuzz_receiver.py --runs 20000 --targets data --json out.json
    .venv/bin/python scripts/fuzz_receiver.py --targets data --c-coverage   # + receiver.c line coverage (gcov)

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


def build_gcov_engine(work: str) -> str:
    """The C engine built again with gcc ``--coverage`` (objects and counters under ``work``)."""
    import glob
    import sysconfig

    out = os.path.join(work, "gcov-engine")
    os.makedirs(out, exist_ok=True)
    flags = ["-O1", "-g", "-fPIC", "--coverage", "-std=gnu11", "-pthread", "-I" + sysconfig.get_paths()["include"]]
    objs = []
    for src in sorted(glob.glob(os.path.join(HERE, "transfer_engine", "src", "*.c"))):
        obj = os.path.join(out, os.path.basename(src)[:-2] + ".o")
        subprocess.run(["gcc", *flags, "-c", src, "-o", obj], check=True)
        objs.append(obj)
    so = os.path.join(out, "_engine.so")
    subprocess.run(["gcc", "-shared", "--coverage", "-pthread", *objs, "-o", so, "-lxxhash", "-lssl", "-lcrypto",
                    "-lpthread"], check=True)
    return so


FRAME_PATH_FUNCTIONS = ("amdt_conn_body", "amdt_validate_frame", "amdt_recv_full", "amdt_token_eq",
                        "amdt_writer_body")


def c_coverage(work: str) -> dict:
    """Line coverage of receiver.c (whole file and the frame path's functions) from gcov."""
    out = os.path.join(work, "gcov-engine")
    src = os.path.join(HERE, "transfer_engine", "src", "receiver.c")
    r = subprocess.run(["gcov", "-f", "-n", "-o", out, src], capture_output=True, text=True, cwd=out)
    res, fn = {"functions": {}}, None
    for line in r.stdout.splitlines():
        m = re.match(r"Function '(.+)'", line)
        if m:
            fn = m.group(1)
            continue
        m = re.match(r"File '(.+)'", line)
        if m:
            fn = "file:" + os.path.basename(m.group(1))
            continue
        m = re.match(r"Lines executed:([\d.]+)% of (\d+)", line)
        if m and fn:
            if fn == "file:receiver.c":
                res["receiver.c"] = {"lines_pct": float(m.group(1)), "lines": int(m.group(2))}
            elif fn in FRAME_PATH_FUNCTIONS:
                res["functions"][fn] = {"lines_pct": float(m.group(1)), "lines": int(m.group(2))}
            fn = None
    return res


def run_target(target: str, runs: int, timeout_s: int, max_len: int, work: str, seed: int,
               engine: str = "") -> dict:
    stats = os.path.join(work, f"{target}.stats.json")
    corpus = os.path.join(work, f"{target}-corpus")
    os.makedirs(corpus, exist_ok=True)
    log = os.path.join(work, f"{target}.log")
    cmd = [sys.executable, "-m", "tests.fuzz.harness", target, stats, corpus, f"-runs={runs}", f"-max_len={max_len}",
           f"-timeout={timeout_s}", "-rss_limit_mb=3072", f"-seed={seed}", "-print_final_stats=1",
           f"-artifact_prefix={work}/{target}-", "-print_pcs=0"]
    t0 = time.monotonic()
    with open(log, "w") as f:
        env = dict(os.environ, AMDT_FUZZ_ENGINE=engine) if engine else None
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=HERE, env=env).returncode
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
    if engine:
        out["c_coverage"] = c_coverage(work)
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
    ap.add_argument("--c-coverage", action="store_true",
                    help="run the data target on a gcov build of the C engine and print receiver.c's line coverage "
                         "(the frame parser's functions too); libFuzzer's guidance stays on the Python side")
    a = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="amdt-i14-fuzzrun-")
    engine = build_gcov_engine(work) if a.c_coverage else ""
    results = [run_target(t.strip(), a.runs, a.timeout, a.max_len, work, a.seed, engine if t.strip() == "data" else "")
               for t in a.targets.split(",") if t.strip()]
    ok = all(r["finding"] is None and r.get("inputs") == a.runs for r in results)
    for r in results:
        print(f"{r['target']}: {r.get('inputs', 0)} inputs in {r['wall_s']} s ({r['inputs_per_s']}/s); "
              f"coverage cov {r.get('cov')} ft {r.get('ft')} (instrumented receiver code), corpus {r.get('corpus')}; "
              f"normal transfers ok at checkpoints: {r.get('normal_transfers_ok')}; finding: {r['finding']}")
        print(f"  outcomes: {json.dumps(r.get('outcomes', {}), sort_keys=True)}")
        if "c_coverage" in r:
            cc = r["c_coverage"]
            fns = ", ".join(f"{k} {v['lines_pct']:.0f}% of {v['lines']}" for k, v in sorted(cc["functions"].items()))
            print(f"  C engine (gcov): receiver.c {cc.get('receiver.c', {}).get('lines_pct')}% of "
                  f"{cc.get('receiver.c', {}).get('lines')} lines; {fns}")
    print(f"ok: {ok}" + (f" (work directory {work})" if not ok or a.keep else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": a.runs, "ok": ok, "results": results}, f, indent=2)
    if ok and not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
