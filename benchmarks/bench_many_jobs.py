"""Many jobs into one default receiver: do they keep the link full, share it evenly, let a late
job in, and keep the daemon within its memory budget?

Runs ``scripts/load_many_senders.py`` (one ``automdt receive``, N ``automdt transfer`` processes
with the default controller, as root on a ``tc tbf`` link between two network namespaces):

* 1, 2, 4 and 8 equal jobs moving the same total (``--total-mib``, split evenly): the aggregate
  rate against one job alone, and Jain's index per period while at least 3/4 of them were active;
* 4 jobs of which the last starts ``--late`` seconds after the others: how many intervals it
  needs to reach 80% of its fair share;
* 16 jobs each asking the receiver for 1 GiB of staging (``--memory``/``--max-memory`` 1Gi)
  under ``--total-memory``: the daemon's resident memory growth against that budget;
* 1, 2, 4 and 8 equal jobs on loopback into one emulated slow disk (the receiver's ``--throttle``,
  one rate for all its sessions; ``--slow-disk``), and 4 of which the last joins late;
* 1, 2, 4 and 8 equal jobs on loopback into the receiver's root on this machine's disk
  (``--disk-mib`` in all, with the default ``--fsync end``): one destination disk (and the
  machine's CPUs) shared instead of a link.

    .venv/bin/python benchmarks/bench_many_jobs.py --json benchmarks/results/many-jobs.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOAD = os.path.join(ROOT, "scripts", "load_many_senders.py")


def _load(args: List[str]) -> Dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    try:
        p = subprocess.run([sys.executable, LOAD, *args, "--json", out], capture_output=True, text=True,
                           timeout=1800, cwd=ROOT)
        if p.returncode not in (0, 1) or not os.path.getsize(out):
            raise SystemExit(f"load_many_senders failed: {p.stdout[-1500:]}{p.stderr[-1500:]}")
        with open(out) as f:
            return json.load(f)
    finally:
        os.unlink(out)


def _jain(jw: Dict[str, Any], n: int) -> Dict[str, Any]:
    """The two fairness columns: Jain's index over the bytes each job moved once all had joined
    (the target's measure; the fairness experiment's too), and its mean over 5-s periods (short-term:
    at a few chunks per job and period, the chunk granularity weighs in)."""
    if n < 2:
        return {"jain": None, "jain_periods": None}
    return {"jain": (jw.get("all_joined") or {}).get("jain"), "jain_periods": jw.get("mean_at_max")}


def _equal_jobs(jobs: str, total_mib: int, common: List[str], where: str) -> List[Dict[str, Any]]:
    """One row per job count in ``jobs``: N equal jobs moving ``total_mib`` together, against the
    first count's aggregate (one job alone when it is 1)."""
    rows: List[Dict[str, Any]] = []
    alone = None
    for n in [int(x) for x in jobs.split(",")]:
        r = _load(["--senders", str(n), "--mib", str(total_mib // n), *common])
        agg = r["aggregate_MBps"]
        alone = alone or agg
        jw = r.get("jain_common_window") or {}
        rows.append({"run": f"{n} equal job{'s' if n > 1 else ''}{where}", "ok": r["ok"],
                     "aggregate_MBps": agg, "of_alone": round(agg / alone, 3), **_jain(jw, n),
                     "late_intervals": None,
                     "rss_growth_MiB": r["receiver_rss_growth_MiB"], "cap_MiB": r["memory_cap_MiB"]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _late_row(r: Dict[str, Any], label: str, alone: Any) -> Dict[str, Any]:
    """The row of a run whose last job joined late (``alone``: one job's aggregate, or None)."""
    lj = r.get("late_joiner") or {}
    jw = r.get("jain_common_window") or {}
    row = {"run": label, "ok": r["ok"], "aggregate_MBps": r["aggregate_MBps"],
           "of_alone": round(r["aggregate_MBps"] / alone, 3) if alone else None, **_jain(jw, 4),
           "late_intervals": lj.get("intervals_to_80pct"), "rss_growth_MiB": r["receiver_rss_growth_MiB"],
           "cap_MiB": r["memory_cap_MiB"]}
    print(json.dumps(row), flush=True)
    return row


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--link-mbps", type=float, default=20.0, help="the shared link, MB/s (default 20)")
    ap.add_argument("--total-mib", type=int, default=400, help="MiB all jobs move together (default 400)")
    ap.add_argument("--jobs", default="1,2,4,8", help="comma list of job counts (default 1,2,4,8)")
    ap.add_argument("--late", type=float, default=8.0, help="seconds the late job starts after the others")
    ap.add_argument("--budget", default="512Mi", help="--total-memory of the 16-job memory run (default 512Mi)")
    ap.add_argument("--disk-jobs", default="1,2,4,8", help="job counts of the shared-disk runs ('' for none)")
    ap.add_argument("--disk-mib", type=int, default=1024, help="MiB all jobs of a shared-disk run move (default 1024)")
    ap.add_argument("--slow-disk", default="write.thread=4M,write.total=20M", metavar="SPEC",
                    help="the emulated slow disk of the slow-disk runs (the receiver's --throttle; default "
                         "write.thread=4M,write.total=20M: one job needs 5 write threads to fill it)")
    ap.add_argument("--slow-disk-jobs", default="1,2,4,8", help="job counts of the slow-disk runs ('' for none)")
    ap.add_argument("--slow-disk-mib", type=int, default=400,
                    help="MiB all jobs of a slow-disk run move (default 400)")
    ap.add_argument("--json", metavar="FILE", help="write a results file")
    a = ap.parse_args(argv)
    common = ["--link-mbps", str(a.link_mbps), "--policies", "default", "--files", "4", "--memory", "64Mi",
              "--max-memory", "1Gi"]
    rows = _equal_jobs(a.jobs, a.total_mib, common, "")
    alone = rows[0]["aggregate_MBps"] if int(a.jobs.split(",")[0]) == 1 else None  # one job alone ran first
    r = _load(["--senders", "4", "--mib", str(a.total_mib // 4), "--late", str(a.late), *common])
    rows.append(_late_row(r, f"4 jobs, the last {a.late:g} s late", alone))
    r = _load(["--senders", "16", "--mib", "48", "--link-mbps", str(a.link_mbps), "--policies", "default",
               "--files", "4", "--memory", "1Gi", "--max-memory", "1Gi", "--total-memory", a.budget])
    jw = r.get("jain_common_window") or {}
    rows.append({"run": f"16 jobs asking 1 GiB each, --total-memory {a.budget}", "ok": r["ok"],
                 "aggregate_MBps": r["aggregate_MBps"], "of_alone": None, **_jain(jw, 16),
                 "late_intervals": None, "rss_growth_MiB": r["receiver_rss_growth_MiB"], "cap_MiB": r["memory_cap_MiB"]})
    print(json.dumps(rows[-1]), flush=True)
    if a.slow_disk_jobs:
        slow = list(common)
        slow[slow.index("--link-mbps") + 1] = "0"  # loopback: the emulated disk is what they share
        slow += ["--disk-throttle", a.slow_disk]
        slow_rows = _equal_jobs(a.slow_disk_jobs, a.slow_disk_mib, slow, ", one emulated disk")
        slow_alone = slow_rows[0]["aggregate_MBps"] if a.slow_disk_jobs.split(",")[0] == "1" else None
        r = _load(["--senders", "4", "--mib", str(a.slow_disk_mib // 4), "--late", str(a.late), *slow])
        rows += [*slow_rows, _late_row(r, f"4 jobs, one emulated disk, the last {a.late:g} s late", slow_alone)]
    if a.disk_jobs:
        disk = list(common)
        disk[disk.index("--link-mbps") + 1] = "0"  # loopback: the root's disk is what they share
        rows += _equal_jobs(a.disk_jobs, a.disk_mib, disk, ", loopback into the disk")
    if a.json:
        cols = [("run", "run"), ("ok", "all exit 0, trees identical, memory within"), ("aggregate_MBps", "aggregate MB/s"),
                ("of_alone", "/ one job alone"), ("jain", "Jain, all joined"),
                ("jain_periods", "Jain per 5-s period (>= 3/4 active)"),
                ("late_intervals", "late job: intervals to 80% of its share"),
                ("rss_growth_MiB", "daemon RSS growth MiB"), ("cap_MiB", "memory cap MiB")]
        results_file.write(
            a.json, "Many jobs into one receiver",
            f"one automdt receive and N automdt transfer (default controller) on a {a.link_mbps:g} MB/s tbf link "
            f"between two network namespaces, {a.total_mib} MiB in all per run; the emulated-disk runs on loopback "
            f"into a receiver with --throttle {a.slow_disk}, {a.slow_disk_mib} MiB in all; the disk runs on loopback "
            f"into a root on this machine's disk, {a.disk_mib} MiB in all; one run each",
            [results_file.table("many-jobs", "Jobs sharing one link and one receiver", cols, rows)])
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
