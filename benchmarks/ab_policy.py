#!/usr/bin/env python3
"""A/B of the controller's edge settings on the default policy's behaviour, interleaved transfer by transfer.

One command (from the repository root)::

    .venv/bin/python benchmarks/ab_policy.py --controller early_intervals= [--reps 2] [--only ramp,warm,sustained]

``--controller FIELD=VALUE[,FIELD=VALUE...]`` sets fields of
:class:`automdt.controller.ControllerSettings` for variant ``B``; variant ``A`` runs the defaults:

* ``early_intervals``: the first intervals as fractions of the control interval, ``:``-separated
  (``early_intervals=`` for none, ``early_intervals=0.25:0.75``);
* ``end_hold``, ``warm_hold``: ``0``/``1`` (or ``false``/``true``).

The CLI has no option for these settings, so every transfer of both variants runs in a child
process of this script (``--child``) that does what ``automdt transfer SRC DEST`` with the same
``--throttle``, ``--memory``, ``--chunk-size``, ``--policy`` and ``--log`` does around the
controller (the default policy, the job's history read before and written after, its chunk
size), then calls :func:`automdt.sender.run_transfer` with
:attr:`~automdt.sender.TransferOptions.controller_settings`. Each transfer is a fresh process, as
a CLI run is; the job lock, the progress display and the printed summary are left out (none of
them touches the controller).

Every transfer of bench_policy.py's behaviour paths runs twice in a row, once as ``A`` and once
as ``B``, so both see the same machine load; the figures are those of :mod:`policy_sections`
(``log_metrics``: ramp in steady intervals, seconds to 90%, sustained share, settled triple) and
of bench_policy.py's ``warm`` section:

* ``ramp``: cold start (no history, the default policy) on the experiments' read-, network- and
  write-bound scenarios at 80 and 250 MB/s (128 MiB buffers, 1 MiB chunks, 8 x 80 MB / 10 x 200 MB);
  with ``--trained`` also a policy trained on each scenario's profile (``automdt train --profile``);
* ``warm``: bench_policy.py's warm path (read-bound, 4 MiB chunks), a job run twice with a fresh
  history: seconds to 90% of the achievable 80 MB/s in the first (cold) and second (history) run;
* ``sustained``: the warm path and the three scenarios with the CLI's default buffers and chunks,
  26 x 100 MB.

Each transfer prints one line (its first intervals: end time, triple, delivered share of the
achievable rate); a summary per path and variant follows. Scratch space as bench_policy.py's.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_policy as bp  # noqa: E402
import policy_sections as ps  # noqa: E402

MB = 1_000_000
SECTIONS = ("ramp", "warm", "sustained")


def _first_intervals(lines: List[Dict[str, Any]], achievable: float, n: int = 5) -> str:
    body = [r for r in lines if "throughput" in r][:n]
    return " ".join(f"{r['t']:.1f}:({r['threads']['read']},{r['threads']['net']},{r['threads']['write']})"
                    f"{r['throughput']['write'] / achievable:.2f}" for r in body)


def parse_settings(text: str) -> Dict[str, Any]:
    """``--controller FIELD=VALUE[,...]`` as keyword arguments of ControllerSettings (JSON-able);
    ValueError with a one-line reason."""
    from automdt.controller import ControllerSettings

    names = [f.name for f in dataclasses.fields(ControllerSettings)]
    out: Dict[str, Any] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        name, sep, value = item.partition("=")
        if not sep or name not in names:
            raise ValueError(f"{item!r}: expected FIELD=VALUE, FIELD one of {', '.join(names)}")
        if name == "early_intervals":
            try:
                out[name] = [float(x) for x in value.split(":") if x.strip()]
            except ValueError:
                raise ValueError(f"{item!r}: early_intervals takes fractions separated by ':'") from None
            if any(not 0 < x <= 1 for x in out[name]):
                raise ValueError(f"{item!r}: each early interval is a fraction in (0, 1]")
        elif value.lower() in ("0", "1", "false", "true"):
            out[name] = value.lower() in ("1", "true")
        else:
            raise ValueError(f"{item!r}: {name} takes 0/1 or false/true")
    if not out:
        raise ValueError("no setting given: variant B would be variant A")
    return out


def child(argv: Sequence[str]) -> int:
    """One transfer as ``automdt transfer SRC DEST`` runs it around the controller, with the
    ControllerSettings of ``--settings`` (JSON); returns the run's exit code."""
    ap = argparse.ArgumentParser(prog="ab_policy.py --child")
    ap.add_argument("--settings", required=True, help="ControllerSettings fields as a JSON object")
    ap.add_argument("command", choices=["transfer"])
    ap.add_argument("src")
    ap.add_argument("dest")
    ap.add_argument("--throttle", default="")
    ap.add_argument("--memory", default="256Mi")
    ap.add_argument("--chunk-size", default=None)
    ap.add_argument("--policy", default="default")
    ap.add_argument("--log", required=True)
    a = ap.parse_args(argv)

    from automdt import history
    from automdt.agents.registry import make_policy
    from automdt.controller import ControllerSettings
    from automdt.lock import job_key
    from automdt.protocol import DEFAULT_CHUNK_SIZE
    from automdt.sender import TransferOptions, run_transfer
    from automdt.throttle import parse_throttle_option
    from automdt.units import parse_size

    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(a.settings).items()}
    throttle, schedule = parse_throttle_option(a.throttle)
    opts = TransferOptions(policy=make_policy(a.policy, max_threads=32), threads=(1, 1, 1),
                           memory=parse_size(a.memory, "memory"),
                           chunk_size=parse_size(a.chunk_size, "chunk size") if a.chunk_size else DEFAULT_CHUNK_SIZE,
                           throttle=throttle, throttle_schedule=schedule, log_path=a.log,
                           controller_settings=ControllerSettings(**fields))
    key = job_key(a.src, a.dest)
    path = history.history_path(key)
    opts.history, _ = history.load(path)
    if opts.history is not None and a.chunk_size is None:
        opts.chunk_size = history.chunk_size_for(opts.history, opts.chunk_size, opts.interval_s)
    summary = run_transfer(a.src, a.dest, opts)
    history.update(path, summary.history, previous=opts.history, policy=getattr(opts.policy, "name", a.policy),
                   max_threads=opts.max_threads, job=key, src=os.path.abspath(a.src), dest=a.dest,
                   chunk_bytes=opts.chunk_size)
    return summary.exit_code


class AB:
    def __init__(self, ctx: bp.Ctx, settings: Dict[str, Any]) -> None:
        self.ctx = ctx
        self.settings = settings
        self.rows: Dict[Tuple[str, str], List[Dict[str, Any]]] = {}

    def run(self, variant: str, ds: Any, extra: Sequence[str], log: str) -> List[Dict[str, Any]]:
        """One transfer of ``variant`` through :func:`child` (Ctx.transfer's checks: exit 0, the
        whole tree); its interval log."""
        cli = self.ctx.automdt
        settings = self.settings if variant == "B" else {}
        self.ctx.automdt = [sys.executable, os.path.abspath(__file__), "--child", "--settings", json.dumps(settings)]
        try:
            self.ctx.transfer(ds, self.ctx.path("dst-ab"), *extra, "--log", log, timeout=600)
        finally:
            self.ctx.automdt = cli
        return ps._read_log(log)

    def record(self, key: str, variant: str, m: Dict[str, Any], lines: List[Dict[str, Any]], achievable: float,
               rep: int) -> None:
        self.rows.setdefault((key, variant), []).append(m)
        t90 = m["seconds_to_threshold"]
        bp.say(f"  {key:24s} {variant} rep {rep}: ramp {m['ramp_intervals']} ({'never' if t90 is None else f'{t90:.2f} s'}), "
               f"sustained {m['sustained']:.2f}, settled {m['settled']}, start {ps.start_label(m['start'])} | "
               f"{_first_intervals(lines, achievable)}")


def _train(ctx: bp.Ctx, path: Any, name: str) -> str:
    prof = ctx.path(f"ab-{name}.yaml")
    path.profile().save(prof)
    pol = ctx.path(f"ab-{name}.zip")
    p = subprocess.run(ctx.automdt + ["train", "--profile", prof, "-o", pol, "--no-progress"], env=ctx.env,
                       capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"automdt train --profile {name}: exit {p.returncode}: {p.stderr.strip()[-300:]}")
    return pol


def _section(ctx: Any, ab: "AB", sec: str, rep: int, cases: Sequence[Any], data: Dict[int, Any],
             trained: Dict[str, str]) -> None:
    """One round of one section (``ramp``, ``warm`` or ``sustained``): each case with A, then B."""
    from automdt.experiments.behaviour import bottleneck_index, min_threads_95

    if sec == "ramp":
        for name, path, rate in cases:
            common = ["--throttle", ps.throttle_spec(path.throttle), "--memory", str(path.memory),
                      "--chunk-size", str(path.chunk_size)]
            kinds = [("cold", [])] + ([("trained", ["--policy", trained[name]])] if trained else [])
            for kind, extra in kinds:
                for v in "AB":
                    ps._fresh_history(ctx)
                    lines = ab.run(v, data[rate], common + extra, ctx.path(f"ab-{name}-{kind}-{rep}-{v}.jsonl"))
                    m = ps.log_metrics(lines, path.achievable_bps, min_threads_95(path), bottleneck_index(path))
                    ab.record(f"ramp/{kind}/{name}", v, m, lines, path.achievable_bps, rep)
    elif sec == "warm":
        ds = ctx.dataset("warm", 20, 40 * MB)
        for v in "AB":
            shutil.rmtree(ctx.env["XDG_STATE_HOME"], ignore_errors=True)
            for run in ("1", "2"):
                lines = ab.run(v, ds, ["--throttle", bp.WARM_THROTTLE], ctx.path(f"ab-warm-{rep}-{v}-{run}.jsonl"))
                m = {"seconds_to_threshold": bp.seconds_to(lines, 0.9 * bp.WARM_ACHIEVABLE),
                     "start": next((r["start"] for r in lines if "start" in r), None)}
                ab.rows.setdefault((f"warm/run{run}", v), []).append(m)
                t90 = m["seconds_to_threshold"]
                bp.say(f"  warm run {run} {v} rep {rep}: 90% at {'never' if t90 is None else f'{t90:.2f} s'}, "
                       f"start {ps.start_label(m['start'])} | {_first_intervals(lines, bp.WARM_ACHIEVABLE)}")
    else:
        ds = ctx.dataset("sustained", 26, 100 * MB)
        for name, path in ps._paths_default_buffers().items():
            for v in "AB":
                ps._fresh_history(ctx)
                lines = ab.run(v, ds, ["--throttle", ps.throttle_spec(path.throttle)],
                               ctx.path(f"ab-sus-{name}-{rep}-{v}.jsonl"))
                m = ps.log_metrics(lines, path.achievable_bps, min_threads_95(path), bottleneck_index(path))
                ab.record(f"sustained/{name}", v, m, lines, path.achievable_bps, rep)


def _report(ab: "AB", label: str, args: Any, only: Sequence[str]) -> None:
    """The table of both variants per path (printed, and written with ``--json``)."""
    bp.say()
    bp.say(f"{'path':32s} {'':2s} {'seconds to 90% (median; runs)':40s} sustained (min)   settled")
    table_rows = []
    for key in sorted({k for k, _ in ab.rows}):
        for v in "AB":
            ms = ab.rows.get((key, v), [])
            ts = [m["seconds_to_threshold"] for m in ms]
            med = statistics.median([t if t is not None else float("inf") for t in ts])
            cell = f"{med:.2f} ({', '.join('never' if t is None else f'{t:.2f}' for t in ts)})"
            sus = [m["sustained"] for m in ms if "sustained" in m]
            sus_cell = f"{statistics.median(sus):.2f} ({min(sus):.2f})" if sus else "-"
            settled = [m.get("settled") for m in ms if "settled" in m]
            bp.say(f"{key:32s} {v:2s} {cell:40s} {sus_cell:17s} {settled}")
            table_rows.append({"path": key, "variant": "A" if v == "A" else f"B ({label})", "t90": cell,
                               "sustained": sus_cell, "settled": ", ".join(map(str, settled))})
    bp.say(f"load average now {os.getloadavg()[0]:.1f}")
    if args.json:
        import results_file

        results_file.write(args.json, f"A/B of the controller settings {label} on the default policy",
                           f"{args.reps} interleaved rounds, sections {','.join(only)}", [
                               results_file.table("ab", "Seconds to 90% of the achievable rate, sustained share, settled threads",
                                                  [("path", "path"), ("variant", "variant"), ("t90", "s to 90% (median; runs)"),
                                                   ("sustained", "sustained (median, min)"), ("settled", "settled")],
                                                  table_rows)])


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--controller", required=True, metavar="FIELD=VALUE[,...]",
                    help="variant B's ControllerSettings fields: early_intervals=F:F... (empty: none), "
                         "end_hold=0|1, warm_hold=0|1; variant A runs the defaults")
    ap.add_argument("--reps", type=int, default=2, help="rounds (default 2)")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of {','.join(SECTIONS)}")
    ap.add_argument("--trained", action="store_true", help="ramp: also policies trained on each scenario's profile")
    ap.add_argument("--json", metavar="FILE", help="write the figures as a results file (automdt-results/1)")
    args = ap.parse_args(argv)
    try:
        settings = parse_settings(args.controller)
    except ValueError as e:
        ap.error(f"--controller {e}")
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    if any(s not in SECTIONS for s in only) or args.reps < 1:
        ap.error(f"--only takes {','.join(SECTIONS)}; --reps at least 1")
    signal.signal(signal.SIGTERM, lambda s, f: (_ for _ in ()).throw(SystemExit(128 + s)))
    ctx = bp.Ctx(bp.parse_args(["--reps", str(args.reps)]))
    ab = AB(ctx, settings)
    label = args.controller.strip()
    bp.say(f"A: the controller's defaults; B: {label}; load {os.getloadavg()[0]:.1f}")
    try:
        from automdt.experiments.behaviour import scenario_path

        cases = [(f"{b}-bound" + ("" if rate == 80 else f"-{rate}"), scenario_path(b, rate * MB), rate)
                 for rate in (80, 250) for b in ("read", "net", "write")]
        data = {80: ctx.dataset("ramp80", 8, 80 * MB), 250: ctx.dataset("ramp250", 10, 200 * MB)} if "ramp" in only else {}
        trained = {name: _train(ctx, path, name) for name, path, _ in cases} if "ramp" in only and args.trained else {}
        for rep in range(args.reps):
            for sec in only:
                _section(ctx, ab, sec, rep, cases, data, trained)
        _report(ab, label, args, only)
    finally:
        ctx.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(child(sys.argv[2:]) if sys.argv[1:2] == ["--child"] else main())
