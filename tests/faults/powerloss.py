"""Power cuts during and after a transfer, and the rerun that must repair them.

One *point* (:func:`run_point`): a fresh ext4 on the crash disk (:mod:`tests.faults.crashdisk`),
``automdt transfer SRC DEST`` onto it as an operator types it, the power cut at a chosen moment
(seconds after the start, or right after the command reported success), the machine "booted"
again (ext4 recovers its journal; the rerun sees a new boot id) and the same command run again.
The point records what the cut left (files intact, damaged, missing) and what the rerun did.

The contract it checks (the operator guide's "After a power cut"):

* after any cut, the rerun exits 0 and every destination file is the source's bytes;
* after a cut that follows a successful exit with ``--fsync end`` or ``dir``, every file is intact
  before the rerun, and the rerun sends nothing;
* with ``--fsync file`` or ``dir``, after any cut every file that has its name is intact, and the
  rerun sends only the files that are not.

``python -m tests.faults.powerloss --points N`` runs N points spread over the transfer, the crash
models, the ``--fsync`` settings and the datasets, writes every point and a summary as JSON and
prints the points by setting and dataset as a table.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tests.faults.crashdisk import MODELS, CrashDisk, available, new_boot_prefix

KiB = 1024


SPREAD_S = 3.0
"""Seconds a transfer of any dataset takes at the default write limit of :func:`run_point`."""
DATASETS = ("mixed", "small", "large", "deep")
"""The source trees of :func:`make_source`."""


def make_source(path: str, seed: int = 0, kind: str = "mixed") -> Dict[str, str]:
    """A source tree of one of :data:`DATASETS`; returns its digests.

    * ``mixed``: 20 files in three directories and a level below (empty, 1 byte, 4 KiB, 64-900
      KiB, 3 and 5 MiB);
    * ``small``: 300 files of 1-16 KiB in 10 directories (metadata-heavy);
    * ``large``: three files of 6 MiB (long chunk writes, partials in flight);
    * ``deep``: a chain of 12 nested directories, two files at each level.
    """
    rng = random.Random(seed)
    files: List[Tuple[str, int]] = []
    if kind == "mixed":
        sizes = [0, 1, 4 * KiB, 100 * KiB] + [rng.randint(64 * KiB, 900 * KiB) for _ in range(14)] + [3 << 20, 5 << 20]
        files = [(os.path.join(f"d{i % 3}", "deep" if i % 5 == 0 else "", f"f{i:02d}.bin"), n)
                 for i, n in enumerate(sizes)]
    elif kind == "small":
        files = [(os.path.join(f"s{i % 10}", f"f{i:03d}.bin"), rng.randint(1 * KiB, 16 * KiB)) for i in range(300)]
    elif kind == "large":
        files = [(f"big{i}.bin", 6 << 20) for i in range(3)]
    elif kind == "deep":
        files = [(os.path.join(*[f"l{j}" for j in range(level + 1)], f"f{k}.bin"), rng.randint(1 * KiB, 300 * KiB))
                 for level in range(12) for k in range(2)]
    else:
        raise ValueError(f"dataset must be one of {DATASETS}")
    for rel, size in files:
        full = os.path.join(path, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(rng.randbytes(size))
    return tree_digests(path)


def tree_digests(path: str) -> Dict[str, str]:
    """Relative path -> sha256 of every regular file under ``path`` but AutoMDT's own (``.amdt-*``)."""
    out = {}
    for dirpath, dirnames, files in os.walk(path):
        dirnames[:] = [d for d in dirnames if d != "lost+found"]
        for name in files:
            if name.startswith(".amdt-"):
                continue
            full = os.path.join(dirpath, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = hashlib.sha256(f.read()).hexdigest()
    return out


def _command(src: str, dest: str, fsync: str, rate: str) -> List[str]:
    return [sys.executable, "-m", "automdt", "transfer", src, dest, "--json", "--no-history", "--fsync", fsync,
            "--throttle", f"write.total={rate}"]


def _env(state: str) -> Dict[str, str]:
    return dict(os.environ, XDG_RUNTIME_DIR=state, XDG_STATE_HOME=os.path.join(state, "state"))


def run_point(disk: CrashDisk, src: str, digests: Dict[str, str], *, cut_at: Optional[float], model: str, seed: int,
              fsync: str = "end", rate: Optional[str] = None, state: Optional[str] = None) -> Dict[str, Any]:
    """One power cut and its rerun (see the module's doc).

    :param cut_at: seconds after the start, or None: right after the transfer exits.
    :param model: the crash disk's model (:data:`~tests.faults.crashdisk.MODELS`).
    :param rate: the destination's write limit (``--throttle write.total``; default: the
        source's size over :data:`SPREAD_S`): it spreads the transfer over a few seconds, so the
        cut lands inside it.
    :returns: the point's record (``ok``: the contract held; ``problems``: what broke it).
    """
    state = state or tempfile.mkdtemp(prefix="amdt-pl-state-")
    if rate is None:
        total = sum(os.path.getsize(os.path.join(src, k)) for k in digests)
        rate = str(max(256 * KiB, int(total / SPREAD_S)))
    mnt = disk.fresh()
    dest = os.path.join(mnt, "dest")
    cmd = _command(src, dest, fsync, rate)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=_env(state), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first_rc: Optional[int] = None
    try:
        if cut_at is None:
            out, err = proc.communicate(timeout=120)
            first_rc = proc.returncode
        else:
            try:
                proc.wait(timeout=cut_at)
                first_rc = proc.returncode  # it ended before the cut
            except subprocess.TimeoutExpired:
                pass
        cut = disk.cut(model, seed)
        cut["at_s"] = round(time.monotonic() - t0, 3)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    mnt = disk.reboot()
    after_cut = tree_digests(dest) if os.path.isdir(dest) else {}
    intact = sorted(k for k, v in after_cut.items() if digests.get(k) == v)
    damaged = sorted(k for k in after_cut if k not in intact)
    rerun = subprocess.run(new_boot_prefix(state) + cmd, env=_env(state), capture_output=True, text=True,
                           timeout=180)
    summary: Dict[str, Any] = {}
    try:
        summary = json.loads(rerun.stdout) if rerun.stdout.strip() else {}
    except ValueError:
        pass
    final = tree_digests(dest) if os.path.isdir(dest) else {}
    problems = []
    if rerun.returncode != 0:
        problems.append(f"rerun exit {rerun.returncode}: {rerun.stderr.strip()[-300:]}")
    wrong = sorted(k for k in digests if final.get(k) != digests[k])
    if wrong:
        problems.append(f"after the rerun {len(wrong)} file(s) differ from the source: {wrong[:5]}")
    succeeded_first = first_rc == 0
    lost_bytes = sum(os.path.getsize(os.path.join(src, k)) for k in digests if k not in intact)
    if fsync in ("file", "dir"):
        if damaged:
            problems.append(f"--fsync {fsync}: {len(damaged)} renamed file(s) damaged by the cut: {damaged[:5]}")
        at_risk = len(digests) - len(intact)
        if (summary.get("files_transferred") or 0) > at_risk or (summary.get("bytes") or 0) > lost_bytes:
            problems.append(f"--fsync {fsync}: the rerun sent {summary.get('files_transferred')} file(s), "
                            f"{summary.get('bytes')} bytes; {at_risk} file(s), {lost_bytes} bytes were not intact")
    if succeeded_first and fsync in ("end", "dir"):
        if len(intact) != len(digests):
            problems.append(f"exit 0 with --fsync {fsync}, yet {len(digests) - len(intact)} file(s) lost by the cut")
        if summary.get("files_transferred", 0):
            problems.append(f"the rerun after a durable exit sent {summary.get('files_transferred')} file(s)")
    return {"cut_at": cut_at, "model": model, "seed": seed, "fsync": fsync, "fs_mode": disk.fs_mode,
            "first_exit": first_rc, "cut": cut, "files": len(digests), "intact_after_cut": len(intact),
            "damaged_after_cut": len(damaged), "missing_after_cut": len(digests) - len(after_cut),
            "rerun_exit": rerun.returncode, "rerun_sent": summary.get("files_transferred"),
            "rerun_bytes": summary.get("bytes"), "bytes_not_intact": lost_bytes,
            "rerun_skipped": summary.get("files_skipped"), "ok": not problems, "problems": problems}


def plan(points: int, seed: int = 0, duration_s: float = SPREAD_S,
         datasets: Sequence[str] = DATASETS) -> List[Dict[str, Any]]:
    """``points`` cut points: the --fsync settings, crash models, filesystem modes and datasets in
    turn, the cut's moment uniform over the transfer's expected ``duration_s`` and one in eight
    right after a successful exit."""
    rng = random.Random(seed)
    fsyncs = ("end", "none", "file", "dir", "end")
    out = []
    for i in range(points):
        cut_at = None if i % 8 == 7 else round(rng.uniform(0.2, duration_s), 3)
        out.append({"cut_at": cut_at, "model": MODELS[i % len(MODELS)], "fsync": fsyncs[(i // 3) % len(fsyncs)],
                    "fs_mode": ("ordered", "writeback")[(i // 12) % 2], "dataset": datasets[(i // 24) % len(datasets)],
                    "seed": rng.randrange(1 << 30)})
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.faults.powerloss", description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="powerloss.json")
    ap.add_argument("--only", default="", help="run only these points of the plan (0-based, comma-separated)")
    a = ap.parse_args(argv)
    only = {int(x) for x in a.only.split(",") if x.strip()}
    why = available()
    if why:
        print(f"powerloss: cannot run here: {why}", file=sys.stderr)
        return 2
    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # SIGTERM (and SIGINT, ignored in a background job) end it cleanly

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    work = tempfile.mkdtemp(prefix="amdt-powerloss-")
    records: List[Dict[str, Any]] = []
    t0 = time.monotonic()
    disks: Dict[str, CrashDisk] = {}
    sources: Dict[str, Tuple[str, Dict[str, str]]] = {}
    try:
        for i, p in enumerate(plan(a.points, a.seed)):
            if only and i not in only:
                continue
            if p["dataset"] not in sources:
                src = os.path.join(work, "src-" + p["dataset"])
                sources[p["dataset"]] = (src, make_source(src, a.seed, p["dataset"]))
            src, digests = sources[p["dataset"]]
            disk = disks.get(p["fs_mode"])
            if disk is None:
                disk = disks[p["fs_mode"]] = CrashDisk(os.path.join(work, p["fs_mode"]), fs_mode=p["fs_mode"])
            rec = run_point(disk, src, digests, cut_at=p["cut_at"], model=p["model"], seed=p["seed"],
                            fsync=p["fsync"], state=os.path.join(work, "state"))
            rec["point"], rec["dataset"] = i, p["dataset"]
            records.append(rec)
            print(json.dumps(rec), flush=True)
    finally:
        for d in disks.values():
            d.close()
        shutil.rmtree(work, ignore_errors=True)
    failed = [r for r in records if not r["ok"]]
    summary = {"points": len(records), "failed": len(failed), "seconds": round(time.monotonic() - t0, 1),
               "by_fsync": {f: sum(1 for r in records if r["fsync"] == f) for f in sorted({r["fsync"] for r in records})},
               "by_dataset": {k: sum(1 for r in records if r["dataset"] == k) for k in sorted({r["dataset"] for r in records})},
               "cuts_after_success": sum(1 for r in records if r["cut_at"] is None),
               "cuts_with_pending_writes": sum(1 for r in records if r["cut"]["pending"] > 0),
               "damaged_after_cut": sum(r["damaged_after_cut"] for r in records),
               "resent_by_reruns": sum(r["rerun_sent"] or 0 for r in records)}
    with open(a.out, "w") as f:
        json.dump({"summary": summary, "points": records}, f, indent=1)
    print(table(records))
    print(json.dumps(summary))
    return 1 if failed else 0


def table(records: Sequence[Dict[str, Any]]) -> str:
    """The points by --fsync setting and dataset: how many, how many broke the contract, files the
    cuts left damaged or missing, and files the reruns sent (a Markdown table)."""
    lines = ["| --fsync | dataset | points | after exit 0 | contract broken | damaged by the cut | missing after "
             "the cut | sent by the reruns |", "|---|---|---|---|---|---|---|---|"]
    for f in sorted({r["fsync"] for r in records}):
        for d in sorted({r["dataset"] for r in records}):
            rs = [r for r in records if r["fsync"] == f and r["dataset"] == d]
            if rs:
                lines.append(f"| {f} | {d} | {len(rs)} | {sum(r['cut_at'] is None for r in rs)} | "
                             f"{sum(not r['ok'] for r in rs)} | {sum(r['damaged_after_cut'] for r in rs)} | "
                             f"{sum(r['missing_after_cut'] for r in rs)} | {sum(r['rerun_sent'] or 0 for r in rs)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
