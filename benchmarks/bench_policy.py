#!/usr/bin/env python3
"""Issue 10's figures: what the default policy costs and wins, measured with the real CLI.

One command (from the repository root)::

    .venv/bin/python benchmarks/bench_policy.py [--reps 5] [--only startup,large,warm,sustained,ramp,completion,sim] [--json out.json] [--keep-logs DIR]

Sections (each prints its figures and the issue's target; ``--json`` writes every figure and
raw sample):

* ``startup``: one 3-byte file, the default command (``automdt transfer SRC DEST``, shipped PPO
  policy) against ``--threads 4,4,4``; wall time of the whole command, medians of ``--reps``
  interleaved runs after one warm-up each. Target: default <= 0.3 s and <= static + 0.1 s.
* ``large``: 8 x 256 MB, tmpfs to tmpfs: the default command, ``--threads 4,4,4`` and GridFTP
  (``globus-url-copy -fast -p 4 -cc 4`` to a loopback ``globus-gridftp-server``, the helper of
  ``bench_engine.py``), interleaved, wall including start-up, medians. Target: default within
  10% of the best static setting. GridFTP is skipped with the reason when its Debian packages
  (``globus-gass-copy-progs globus-gridftp-server-progs``) are missing and cannot be installed.
* ``warm``: the same job run twice on a read-bound throttled path (10 MB/s per read thread,
  40 MB/s per network and write thread, 80 MB/s link: achievable 80 MB/s; 20 x 40 MB) with a fresh
  history: seconds to 90% of the achievable rate in each run's ``--log``. Target: second run
  within the first interval.

Issue 10 part B (the policy's behaviour; :mod:`policy_sections`, definitions in
:mod:`automdt.experiments.behaviour`):

* ``sustained``: the default command with the default buffers and chunks on the issue's
  read-bound path and the experiments' read-, network- and write-bound shapes, 26 x 100 MB
  (>= 30 s each), ``--policy marlin`` on the issue's path in the same rounds: the share of
  intervals at >= 90% of the achievable rate after first reaching it (target >= 0.9), the
  longest dip, the settled triple. ``min(--reps, 3)`` rounds.
* ``ramp``: cold start (no history, shipped default) on the experiments' three scenarios at 80
  and 250 MB/s: intervals to 90% of the achievable rate (target <= 2); warm start with a policy
  trained on each scenario's profile (``automdt train --profile``): target 1.
* ``completion``: ``python -m automdt.experiments completion --policies default,marlin``, Marlin's
  completion time over the default's per scenario and dataset (target >= 1.3).
* ``sim``: the shipped default on 30 held-out random profiles (target >= 0.95 of the oracle),
  ``automdt train --profile`` on the scenarios (target >= 0.95 in under a minute), and ramp,
  sustained share and settling in the simulator with the engine's chunk effects.

Sections are functions in :data:`SECTIONS` (name -> function(ctx) -> dict of figures); adding
one is adding an entry. Everything lives under ``/dev/shm/amdt-i10-bench-<pid>`` (datasets,
destinations, the job history and lock directories of the runs) and is removed at the end; the
GridFTP server is stopped by its PID. The CLI runs with the environment a user has, except that
``PYTHONDONTWRITEBYTECODE`` is removed (so imports use cached bytecode, as installed packages do)
and ``XDG_STATE_HOME``/``XDG_RUNTIME_DIR`` point into the scratch directory.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_engine as be  # noqa: E402  (helpers: processes, timed runs, GridFTP on loopback)
import policy_sections as ps  # noqa: E402  (issue 10 part B's sections)

from automdt.experiments.metrics import median  # noqa: E402

MB = 1_000_000
SHM = "/dev/shm"
PREFIX = "amdt-i10-bench-"


def say(msg: str = "") -> None:
    print(msg, flush=True)


class Ctx:
    """What every section gets: options, a scratch directory, the CLI and its environment."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.reps = args.reps
        self.scratch = os.path.join(SHM, f"{PREFIX}{os.getpid()}")
        os.makedirs(self.scratch)
        os.chmod(self.scratch, 0o755)
        self.automdt = be.automdt_argv()
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        self.env["XDG_RUNTIME_DIR"] = self.path("runtime")
        self.env["XDG_STATE_HOME"] = self.path("state")
        os.makedirs(self.env["XDG_RUNTIME_DIR"], mode=0o700)

    def path(self, *parts: str) -> str:
        return os.path.join(self.scratch, *parts)

    def dataset(self, name: str, nfiles: int, size: int) -> be.Dataset:
        """``nfiles`` random files of ``size`` bytes under the scratch directory (made once)."""
        root = self.path("data", name)
        ds = be.Dataset(name, root, nfiles, size)
        if not os.path.isdir(root):
            ok, why = be.room_for(nfiles * size * 2)
            if not ok:
                raise RuntimeError(why)
            os.makedirs(root)
            for i in range(nfiles):
                with open(os.path.join(root, f"f{i:03d}.bin"), "wb") as f:
                    left = size
                    while left > 0:
                        f.write(os.urandom(min(left, 1 << 20)))
                        left -= 1 << 20
        return ds

    def transfer(self, ds: be.Dataset, dest: str, *extra: str, timeout: float = 600) -> be.RunResult:
        """``automdt transfer SRC DEST [extra]`` as a user types it; checks success and the tree."""
        shutil.rmtree(dest, ignore_errors=True)
        argv = self.automdt + ["transfer", ds.path, dest, *extra]
        r = run_timed(argv, timeout, self.scratch, self.env)
        if r.rc != 0:
            raise RuntimeError(f"{' '.join(argv[len(self.automdt):])}: exit {r.rc}: {r.stderr.strip()[-300:]}")
        got = be.tree_stats(dest)
        if got != (ds.nfiles, ds.total):
            raise RuntimeError(f"automdt: destination has {got}, expected {(ds.nfiles, ds.total)}")
        return r

    def cleanup(self) -> None:
        be.PROCS.stop_all()
        if self.args.keep_logs and os.path.isdir(self.scratch):  # the runs' interval logs, for a closer look
            os.makedirs(self.args.keep_logs, exist_ok=True)
            for name in os.listdir(self.scratch):
                if name.endswith(".jsonl"):
                    shutil.copy(os.path.join(self.scratch, name), self.args.keep_logs)
        shutil.rmtree(self.scratch, ignore_errors=True)


def run_timed(argv: Sequence[str], timeout: float, scratch: str, env: Dict[str, str]) -> be.RunResult:
    """``bench_engine.run_timed`` with an environment."""
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        return be.run_timed(argv, timeout, scratch)
    finally:
        os.environ.clear()
        os.environ.update(old)


def interleaved(ctx: Ctx, contenders: List[Tuple[str, Callable[[], float]]]) -> Dict[str, List[float]]:
    """One untimed warm-up of each, then ``--reps`` rounds in the given order; samples per key."""
    for _, fn in contenders:
        fn()
    out: Dict[str, List[float]] = {k: [] for k, _ in contenders}
    for _ in range(ctx.reps):
        for key, fn in contenders:
            out[key].append(fn())
    return out


def table(samples: Dict[str, List[float]], unit: str = "s") -> Dict[str, float]:
    meds = {k: median(v) for k, v in samples.items()}
    for k, v in samples.items():
        say(f"  {k:44s} median {meds[k]:7.3f} {unit}   ({', '.join(f'{x:.3f}' for x in v)})")
    return meds


# ------------------------------------------------------------------------------ sections
def section_startup(ctx: Ctx) -> Dict[str, Any]:
    ds = ctx.dataset("tiny", 1, 3)
    dest = ctx.path("dst-startup")
    samples = interleaved(ctx, [
        ("default (automdt transfer SRC DEST)", lambda: ctx.transfer(ds, dest).wall),
        ("--threads 4,4,4", lambda: ctx.transfer(ds, dest, "--threads", "4,4,4").wall),
    ])
    meds = table(samples)
    d, s = meds["default (automdt transfer SRC DEST)"], meds["--threads 4,4,4"]
    ok = d <= 0.3 and d - s <= 0.1
    say(f"  default - static = {d - s:+.3f} s; target default <= 0.3 s and <= static + 0.1 s: "
        f"{'met' if ok else 'NOT met'}")
    return {"samples_s": samples, "median_s": meds, "default_minus_static_s": d - s, "target_met": ok}


def section_large(ctx: Ctx) -> Dict[str, Any]:
    ds = ctx.dataset("large", 8, 256 * MB)
    dest = ctx.path("dst-large")
    contenders: List[Tuple[str, Callable[[], float]]] = [
        ("default (automdt transfer SRC DEST)", lambda: ctx.transfer(ds, dest).wall),
        ("--threads 4,4,4", lambda: ctx.transfer(ds, dest, "--threads", "4,4,4").wall),
    ]
    out: Dict[str, Any] = {}
    gftp = None
    try:
        ensure_gridftp()
        gftp = be.GridFTP(_GridCtx(ctx))
        run = dict(gftp.settings(ds))["globus-url-copy -cc 4 -p 4 -fast"]
        contenders.append(("globus-url-copy -fast -p 4 -cc 4", lambda: ds.total * 8 / 1e9 / run()))
    except Exception as e:  # noqa: BLE001 - a missing peer is reported, not fatal
        out["gridftp_skipped"] = str(e)
        say(f"  GridFTP skipped: {e}")
    try:
        samples = interleaved(ctx, contenders)
    finally:
        if gftp is not None:
            gftp.close()
        shutil.rmtree(dest, ignore_errors=True)
    meds = table(samples)
    d, s = meds["default (automdt transfer SRC DEST)"], meds["--threads 4,4,4"]
    ratio = d / s
    say(f"  default / --threads 4,4,4 = {ratio:.2f}; target within 10% of the best static setting: "
        f"{'met' if ratio <= 1.10 else 'NOT met'}")
    if "globus-url-copy -fast -p 4 -cc 4" in meds:
        say(f"  default / GridFTP = {d / meds['globus-url-copy -fast -p 4 -cc 4']:.2f}")
    out.update({"samples_s": samples, "median_s": meds, "default_over_static": ratio,
                "gbit_s": {k: ds.total * 8 / 1e9 / v for k, v in meds.items()}})
    return out


class _GridCtx:
    """What ``bench_engine.GridFTP`` needs of its bench: a scratch directory and a tree check."""

    def __init__(self, ctx: Ctx) -> None:
        self.scratch = ctx.scratch

    def check_tree(self, dest: str, src: be.Dataset, who: str) -> None:
        got = be.tree_stats(dest)
        if got != (src.nfiles, src.total):
            raise RuntimeError(f"{who}: destination has {got}, expected {(src.nfiles, src.total)}")


def ensure_gridftp() -> None:
    """Install Debian's GridFTP client and server if missing (as root); raise with the reason otherwise."""
    if shutil.which("globus-url-copy") and shutil.which("globus-gridftp-server"):
        return
    if os.getuid() != 0:
        raise RuntimeError("globus-url-copy/globus-gridftp-server missing and not root to install them")
    pkgs = ["globus-gass-copy-progs", "globus-gridftp-server-progs"]
    r = subprocess.run(["apt-get", "install", "-y", "-qq", *pkgs], capture_output=True, text=True,
                       env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    if r.returncode != 0 or not shutil.which("globus-url-copy"):
        raise RuntimeError(f"apt-get install {' '.join(pkgs)} failed: {r.stderr.strip()[-200:]}")


WARM_THROTTLE = "read.thread=10M,net.thread=40M,write.thread=40M,net.total=80M"
WARM_ACHIEVABLE = 80 * MB


def seconds_to(lines: List[Dict[str, Any]], rate: float) -> Optional[float]:
    """End time of the first interval whose write throughput reached ``rate`` (None: never)."""
    for rec in lines:
        if "throughput" in rec and rec["throughput"]["write"] >= rate:
            return float(rec["t"])
    return None


def section_warm(ctx: Ctx) -> Dict[str, Any]:
    ds = ctx.dataset("warm", 20, 40 * MB)
    dest = ctx.path("dst-warm")
    first: List[Optional[float]] = []
    second: List[Optional[float]] = []
    starts: List[Dict[str, Any]] = []
    for rep in range(ctx.reps):
        shutil.rmtree(ctx.env["XDG_STATE_HOME"], ignore_errors=True)  # a job that never ran
        for runs, label in ((first, "1"), (second, "2")):
            log = ctx.path(f"warm-{rep}-{label}.jsonl")
            ctx.transfer(ds, dest, "--throttle", WARM_THROTTLE, "--log", log)
            with open(log) as f:
                lines = [json.loads(x) for x in f]
            runs.append(seconds_to(lines, 0.9 * WARM_ACHIEVABLE))
            starts.append(lines[0].get("start", {}))
    shutil.rmtree(dest, ignore_errors=True)

    def fmt(xs: List[Optional[float]]) -> str:
        return ", ".join("never" if x is None else f"{x:.1f}" for x in xs)

    m1 = median([x if x is not None else float("inf") for x in first])
    m2 = median([x if x is not None else float("inf") for x in second])
    say(f"  path: {WARM_THROTTLE} (achievable {WARM_ACHIEVABLE / MB:.0f} MB/s), {ds.nfiles} x {ds.size // MB} MB")
    say(f"  seconds to 90% of achievable, first run (cold):  median {m1:.1f}   ({fmt(first)})")
    say(f"  seconds to 90% of achievable, second run (warm): median {m2:.1f}   ({fmt(second)})")
    say(f"  starts: first {starts[0].get('source')} {starts[0].get('threads')}, second "
        f"{starts[1].get('source')} {starts[1].get('threads')}")
    say(f"  target: second run within the first interval: {'met' if m2 <= 1.05 else 'NOT met'}")
    return {"throttle": WARM_THROTTLE, "first_s": first, "second_s": second, "median_first_s": m1,
            "median_second_s": m2, "starts": starts}


SECTIONS: Dict[str, Callable[[Ctx], Dict[str, Any]]] = {
    "startup": section_startup,
    "large": section_large,
    "warm": section_warm,
    **ps.SECTIONS,  # sustained, ramp, completion, sim (issue 10 part B)
}
"""Section name -> function(ctx) returning its figures."""


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions per figure (default 5)")
    ap.add_argument("--only", default="", help=f"comma list of sections: {','.join(SECTIONS)}")
    ap.add_argument("--json", metavar="FILE", help="write every figure and raw sample to FILE")
    ap.add_argument("--keep-logs", metavar="DIR", help="copy the runs' interval logs (--log) to DIR at the end")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    args.sections = [s.strip() for s in args.only.split(",") if s.strip()] or list(SECTIONS)
    bad = [s for s in args.sections if s not in SECTIONS]
    if bad:
        ap.error(f"unknown section(s) {bad}; choose from {','.join(SECTIONS)}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    for name in os.listdir(SHM):  # what a killed earlier run left
        if name.startswith(PREFIX) and name[len(PREFIX):].isdigit() and not os.path.exists(f"/proc/{name[len(PREFIX):]}"):
            shutil.rmtree(os.path.join(SHM, name), ignore_errors=True)
    signal.signal(signal.SIGTERM, lambda s, f: (_ for _ in ()).throw(SystemExit(128 + s)))
    ctx = Ctx(args)
    atexit.register(ctx.cleanup)
    t0 = time.perf_counter()
    results: Dict[str, Any] = {}
    failed = False
    say(f"automdt policy benchmark (issue 10)  {time.strftime('%Y-%m-%d %H:%M:%S')}  {platform.node()}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; medians of {args.reps} interleaved rep(s)")
    try:
        for sec in args.sections:
            say()
            say(f"== {sec}")
            t1 = time.perf_counter()
            try:
                res = SECTIONS[sec](ctx)
            except Exception as e:  # noqa: BLE001 - one failed section must not hide the others
                failed = True
                res = {"error": f"{type(e).__name__}: {e}"}
                say(f"  FAILED: {res['error']}")
            res["seconds"] = round(time.perf_counter() - t1, 1)
            res["load_after"] = round(os.getloadavg()[0], 2)
            results[sec] = res
        total = time.perf_counter() - t0
        say()
        say(f"total {total:.0f} s, load average now {os.getloadavg()[0]:.1f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"host": platform.node(), "cpus": os.cpu_count(), "reps": args.reps,
                           "seconds": round(total, 1), "sections": results}, f, indent=2)
            say(f"figures written to {args.json}")
    finally:
        ctx.cleanup()
        atexit.unregister(ctx.cleanup)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
