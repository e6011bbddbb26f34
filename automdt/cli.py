"""The ``automdt`` command line.

Heavy modules (torch, stable-baselines3, the engine) are imported inside the commands that need
them, so ``automdt transfer`` with a non-PPO policy never imports torch. User errors print one
line ``automdt: ...`` on stderr and exit with a documented code (``automdt exit-codes``).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import List, Optional

from automdt import __version__, errors
from automdt.errors import AutomdtError

log = logging.getLogger("automdt")

EPILOG_EXIT = "Exit codes: see `automdt exit-codes`."


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", metavar="R,N,W", default=None,
                   help="static read,network,write thread counts (with --policy: the starting counts)")
    p.add_argument("--memory", metavar="BYTES", default="256Mi",
                   help="memory cap of each staging buffer, e.g. 512Mi or 1G (default 256Mi)")
    p.add_argument("--chunk-size", metavar="BYTES", default="4Mi", help="chunk size (default 4Mi)")
    p.add_argument("--throttle", metavar="SPEC", default="",
                   help="emulated bottlenecks: comma list of read.thread=, net.thread=, write.thread=, "
                        "read.total=, net.total=, write.total= in bytes/s with K/M/G (powers of 1000); "
                        "@FILE: a schedule, a YAML list of {at: SECONDS, throttle: SPEC} entries applied "
                        "at their times (an empty SPEC lifts every limit)")
    p.add_argument("--secret-file", metavar="F", help="shared secret; both ends must prove it")
    p.add_argument("--encrypt", action="store_true",
                   help="encrypt the control channel (ZeroMQ CURVE) and the data connections (TLS 1.3); "
                        "needs --secret-file and a receiver started with --encrypt")
    p.add_argument("--max-threads", type=int, default=32, help="upper bound of each stage's threads (default 32)")
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="control interval (default 1 s)")
    p.add_argument("--log", metavar="FILE", help="append one JSON object per interval to FILE")
    p.add_argument("--json", action="store_true", help="print one final JSON summary on stdout (no progress display)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress display and no summary text")
    p.add_argument("--sndbuf", metavar="BYTES", default="0", help="per-connection socket send buffer cap (emulates a TCP window)")


def _add_ops_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lock-file", metavar="F", help="lock held for the run (default: per SRC+DEST under $XDG_RUNTIME_DIR "
                                                  "or /tmp); a second run exits 13 at once")
    p.add_argument("--lock-wait", type=float, default=0.0, metavar="SECONDS", help="wait this long for a busy lock")
    p.add_argument("--no-lock", action="store_true", help="do not take the lock")
    p.add_argument("--summary-file", metavar="F", help="also write the final JSON summary to F")
    p.add_argument("--log-file", metavar="F", help="append log messages to F (reopened if logrotate moves it)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="automdt", description=(
        "Modular data transfers: separate read, network and write thread pools, tuned jointly."),
        epilog=EPILOG_EXIT)
    p.add_argument("--version", action="version", version=f"automdt {__version__}")
    p.add_argument("--debug", action="store_true", help="log debug messages and show tracebacks")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    t = sub.add_parser("transfer", help="copy a directory tree to a local directory or a running receiver",
                       description="Copy the contents of SRC (a directory, or one file) to DEST: a local directory "
                                   "(a receiver then runs inside this process over loopback) or HOST:PORT[/SUBDIR] "
                                   "of a running `automdt receive`. Files already complete and identical "
                                   "(size and mtime, or content with --checksum) are skipped; interrupted files "
                                   "resume from their journals.", epilog=EPILOG_EXIT)
    t.add_argument("src")
    t.add_argument("dest")
    _add_engine_options(t)
    t.add_argument("--policy", metavar="SPEC", default=None,
                   help="thread-count policy: ppo (the shipped default policy; the default unless --threads is "
                        "given), PATH.zip or ppo:PATH (a policy from `automdt train`), marlin, falcon, globus "
                        "(static 4,32,4), static:R,N,W, heuristic, model")
    t.add_argument("--checksum", action="store_true", help="skip files by content digest instead of size+mtime")
    t.add_argument("--max-duration", type=float, metavar="SECONDS",
                   help="stop cleanly after SECONDS (exit 10); the next run resumes")
    t.add_argument("--fsync", choices=["none", "file", "dir"], default="none",
                   help="durability: fsync each file before its rename (file), and its directory after (dir)")
    t.add_argument("--chunk-retries", type=int, default=5, help="re-sends of a corrupt chunk before failing (default 5)")
    t.add_argument("--retries", type=int, default=2,
                   help="whole-run retries after a network failure, each resuming (default 2)")
    t.add_argument("--retries-sleep", type=float, default=2.0, metavar="SECONDS", help="pause before a retry (default 2)")
    t.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS", help="control-channel reply timeout")
    _add_ops_options(t)
    t.add_argument("-n", "--dry-run", action="store_true",
                   help="only report what would move (same JSON summary, with dry_run_files); change nothing")
    t.add_argument("--verify", action="store_true",
                   help="afterwards compare every file's content digest on both ends (exit 11 on a difference)")
    t.add_argument("--bwlimit", metavar="RATE", help="cap the network stage at RATE bytes/s (same as --throttle net.total=RATE)")
    t.add_argument("--no-history", action="store_true",
                   help="neither start from nor record this job's history (where its last run settled; kept under "
                        "$XDG_STATE_HOME/automdt/, default ~/.local/state/automdt/)")
    t.add_argument("--shard", metavar="I/N",
                   help="move only shard I of N (0..N-1) of SRC: a deterministic, size-balanced part, the same "
                        "on every node; each shard is its own job (lock, history, resume)")
    t.add_argument("--metrics-file", metavar="FILE.prom",
                   help="write the run's figures for node_exporter's textfile collector to FILE (atomically)")
    t.add_argument("--metrics-job", metavar="NAME", default=None,
                   help="job_name label of the --metrics-file series (default: the last component of SRC)")

    v = sub.add_parser("verify", help="compare a source tree with a destination by content digest",
                       description="Compare the content digest (XXH3-128 over the per-chunk XXH3-64 digests) of "
                                   "every file of SRC with DEST (a local directory or HOST:PORT[/SUBDIR]); print "
                                   "`missing: PATH` / `differs: PATH` lines; exit 11 if any differ.", epilog=EPILOG_EXIT)
    v.add_argument("src")
    v.add_argument("dest")
    v.add_argument("--secret-file", metavar="F")
    v.add_argument("--encrypt", action="store_true", help="encrypted control channel (for a receiver with --encrypt)")
    v.add_argument("--chunk-size", metavar="BYTES", default="4Mi")
    v.add_argument("--json", action="store_true")
    v.add_argument("-q", "--quiet", action="store_true")

    r = sub.add_parser("receive", help="run the destination daemon",
                       description="Serve transfers into ROOT. Listening on a non-loopback address needs "
                                   "--secret-file. Every resource a sender asks for is clamped.", epilog=EPILOG_EXIT)
    r.add_argument("--listen", required=True, metavar="HOST:PORT")
    r.add_argument("--root", required=True, metavar="DIR")
    r.add_argument("--secret-file", metavar="F")
    r.add_argument("--encrypt", action="store_true",
                   help="require encryption: ZeroMQ CURVE control channel and TLS 1.3 data connections, keyed "
                        "from --secret-file; senders must use --encrypt")
    r.add_argument("--max-threads", type=int, default=64, help="clamp for write threads (default 64)")
    r.add_argument("--max-memory", default="1Gi", metavar="BYTES", help="clamp for each session's staging buffer")
    r.add_argument("--idle-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="close a session silent this long (default 60)")
    r.add_argument("--log-file", metavar="F", help="append log messages to F (reopened if logrotate moves it)")
    r.add_argument("--metrics", metavar="HOST:PORT",
                   help="serve Prometheus metrics on http://HOST:PORT/metrics (port 0: any free port)")
    r.add_argument("--max-sessions", type=int, default=16, metavar="N",
                   help="senders served at once; more get 'busy' and retry (default 16)")

    d = sub.add_parser("demo", help="create a sample dataset and transfer it locally",
                       description="Create a sample dataset (a few large files and many small ones) and copy it "
                                   "locally with the live display and a summary.")
    d.add_argument("--dir", default="demo-data", help="where to create src/ and dst/ (default ./demo-data)")
    d.add_argument("--size", default="1Gi", help="approximate dataset size (default 1Gi)")
    d.add_argument("--threads", default=None, metavar="R,N,W",
                   help="static thread counts (default: the shipped PPO policy chooses them)")

    e = sub.add_parser("explore", help="short real transfer with random thread counts; fit a profile",
                       description="Move real data of SRC to DEST for --duration seconds, drawing a random "
                                   "(read, net, write) thread triple every interval, and fit the simulator "
                                   "profile (per-thread throughput from bytes per busy thread-second, stage "
                                   "bandwidths, noise) to the engine's counters. Writes the profile YAML with the "
                                   "raw samples.", epilog=EPILOG_EXIT)
    e.add_argument("src")
    e.add_argument("dest")
    e.add_argument("--duration", type=float, default=30.0, metavar="SECONDS", help="exploration time (default 30 s)")
    e.add_argument("-o", "--output", required=True, metavar="PROFILE.yaml")
    e.add_argument("--seed", type=int, default=0)
    _add_engine_options(e)

    tr = sub.add_parser("train", help="train a PPO policy offline in the simulator",
                        description="Train a PPO agent (stable-baselines3) in the buffer simulator configured by "
                                    "--profile (or on broadly randomised profiles without one). Writes the model zip, "
                                    "a JSON sidecar, and a learning curve (CSV and PNG).", epilog=EPILOG_EXIT)
    tr.add_argument("--profile", metavar="PROFILE.yaml", help="profile from `automdt explore` (default: random profiles)")
    tr.add_argument("-o", "--output", required=True, metavar="POLICY.zip")
    tr.add_argument("--timesteps", type=int, default=None, help="environment steps (default: until the target or the budget)")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--target", type=float, default=0.95, help="stop once this fraction of the oracle is reached (default 0.95)")
    tr.add_argument("--max-seconds", type=float, default=None, help="wall-time budget")
    tr.add_argument("--k", type=float, default=1.02, help="utility base per thread (default 1.02)")
    tr.add_argument("--no-progress", action="store_true", help="no progress bar")
    tr.add_argument("--tensorboard", metavar="DIR",
                    help="write SB3's TensorBoard logs and the evaluations' fraction of the oracle to DIR/PPO_<n>")

    tu = sub.add_parser("tune", help="Optuna study over PPO and reward settings in the simulator (shared storage)",
                        description="Run trials of an Optuna study: each trains PPO in the simulator with sampled "
                                    "hyperparameters and reward settings and scores its fraction of the oracle. "
                                    "Processes (or nodes) given the same --storage and --study-name share one "
                                    "study. Same as `python -m automdt.experiments tune`.", epilog=EPILOG_EXIT)
    from automdt.experiments.sweeps import add_tune_arguments

    add_tune_arguments(tu)

    sm = sub.add_parser("simulate", help="evaluate a policy in the simulator against the oracle",
                        description="Run a policy (a trained zip, ppo for the shipped default, or a baseline: "
                                    "static:R,N,W, globus, marlin, falcon, heuristic, model, oracle) in the simulator "
                                    "on a profile and compare its utility with the oracle's.", epilog=EPILOG_EXIT)
    sm.add_argument("--profile", required=True, metavar="PROFILE.yaml")
    sm.add_argument("--policy", default="ppo", metavar="SPEC")
    sm.add_argument("--steps", type=int, default=60)
    sm.add_argument("--seed", type=int, default=0)
    sm.add_argument("--k", type=float, default=1.02)
    sm.add_argument("--json", action="store_true")

    sub.add_parser("exit-codes", help="list the exit codes")
    return p


def _resolve_policy(args, max_threads: int):
    from automdt.units import parse_threads

    if args.policy is None and args.threads is not None:
        return None, parse_threads(args.threads)
    spec = args.policy or "ppo"
    if spec.startswith("static:"):
        triple = parse_threads(spec[len("static:"):])
        return None, triple
    try:
        from automdt.agents.registry import make_policy
    except ImportError:
        raise AutomdtError(f"policy {spec!r}: only static:R,N,W is available in this build", errors.USAGE) from None
    try:
        pol = make_policy(spec, max_threads=max_threads)
    except (ValueError, FileNotFoundError, ImportError) as e:
        raise AutomdtError(str(e).splitlines()[0], errors.USAGE) from None
    start = parse_threads(args.threads) if args.threads else (1, 1, 1)
    return pol, start


def cmd_transfer(args) -> int:
    from automdt.protocol import read_secret
    from automdt.sender import TransferOptions, run_transfer
    from automdt.units import parse_size

    from automdt.manifest import parse_shard

    try:
        shard = args.shard_parsed = parse_shard(args.shard) if args.shard is not None else None
        if args.bwlimit:
            if args.throttle.strip().startswith("@"):
                raise ValueError("--bwlimit cannot be combined with a throttle schedule (--throttle @FILE): "
                                 "put net.total= into the schedule's entries")
            args.throttle = ",".join(x for x in (args.throttle, f"net.total={args.bwlimit}") if x)
        policy, threads = _resolve_policy(args, args.max_threads)
        explicit = threads if policy is not None and args.threads else None
        throttle, schedule = _throttle_option(args)
        opts = TransferOptions(
            policy=policy, threads=threads, memory=parse_size(args.memory, "memory"),
            chunk_size=parse_size(args.chunk_size, "chunk size"), throttle=throttle, throttle_schedule=schedule,
            secret=read_secret(args.secret_file) if args.secret_file else None, checksum=args.checksum,
            interval_s=args.interval, max_threads=args.max_threads, log_path=args.log,
            max_duration_s=args.max_duration, fsync=args.fsync, chunk_retries=args.chunk_retries,
            timeout_s=args.timeout, sndbuf=parse_size(args.sndbuf, "sndbuf"), dry_run=args.dry_run,
            retries=max(0, args.retries), retry_sleep_s=max(0.0, args.retries_sleep),
            verify=args.verify, encrypt=args.encrypt, shard=shard, start_threads=explicit)
    except ValueError as e:
        raise AutomdtError(str(e), errors.USAGE) from None
    _check_options(opts)
    transfer = _with_history(args, run_transfer)
    if not args.metrics_file:
        return _locked(args, lambda: _run_with_display(args, transfer, opts))
    return _with_metrics_file(args, lambda: _locked(
        args, lambda: _run_with_display(args, lambda o: _keep(args, transfer(o)), opts)))


def _with_history(args, run_transfer):
    """The transfer, with the job's history (:mod:`automdt.history`) read before and written after
    (unless ``--no-history`` or ``--dry-run``); an unusable history file is one warning line. The
    history is keyed like the job lock (SRC, DEST and ``--shard``)."""
    if args.no_history or args.dry_run:
        return lambda o: run_transfer(args.src, args.dest, o)

    def run(opts):
        from automdt import history
        from automdt.lock import job_key

        key = job_key(args.src, args.dest, getattr(args, "shard_parsed", None))
        path = history.history_path(key)
        rec, warning = history.load(path)
        if warning:
            log.warning("%s", warning)
        if opts.policy is not None:
            opts.history = rec
        summary = run_transfer(args.src, args.dest, opts)
        name = getattr(opts.policy, "name", None) or "static:%d,%d,%d" % tuple(opts.threads)
        failed = history.update(path, summary.history, previous=rec, policy=name, max_threads=opts.max_threads,
                                job=key, src=os.path.abspath(args.src), dest=args.dest)
        if failed and not warning:  # one line per run: an unreadable file is usually unwritable too
            log.warning("%s", failed)
        return summary

    return run


def _keep(args, summary):
    args.final_summary = summary
    return summary


def _with_metrics_file(args, run) -> int:
    """Run, then write ``--metrics-file`` whatever the outcome (a failed cron run is news too)."""
    import time

    from automdt.metrics import check_textfile_path, write_transfer_textfile

    check_textfile_path(args.metrics_file)
    t0 = time.monotonic()
    labels = {"job_name": args.metrics_job or os.path.basename(os.path.normpath(os.path.abspath(args.src))),
              "shard": args.shard or "", "dest": args.dest}
    code = errors.ERROR
    try:
        code = run()
        return code
    except AutomdtError as e:
        code = e.code
        raise
    except KeyboardInterrupt:
        code = 130
        raise
    finally:
        s = getattr(args, "final_summary", None)
        write_transfer_textfile(args.metrics_file, s.as_dict() if s is not None else None, code, labels,
                                seconds=time.monotonic() - t0)


def _throttle_option(args):
    """``--throttle SPEC`` or ``--throttle @FILE`` (a schedule): ``(limits, schedule or None)``."""
    from automdt.throttle import parse_throttle_option

    return parse_throttle_option(args.throttle)


def _locked(args, run):
    if args.no_lock:
        return run()
    from automdt.lock import JobLock, default_lock_path

    shard = getattr(args, "shard_parsed", None)
    with JobLock(args.lock_file or default_lock_path(args.src, args.dest, shard), args.lock_wait):
        return run()


def cmd_verify(args) -> int:
    from automdt.protocol import read_secret
    from automdt.sender import TransferOptions, run_transfer
    from automdt.units import parse_size

    try:
        opts = TransferOptions(verify_only=True, chunk_size=parse_size(args.chunk_size, "chunk size"),
                               secret=read_secret(args.secret_file) if args.secret_file else None,
                               encrypt=args.encrypt)
    except ValueError as e:
        raise AutomdtError(str(e), errors.USAGE) from None
    summary = run_transfer(args.src, args.dest, opts)
    d = summary.as_dict()
    if args.json:
        print(json.dumps({k: d.get(k) for k in ("files_total", "verified", "differences", "exit_code", "errors")}))
    elif not args.quiet:
        for line in d.get("differences") or []:
            print(line)
        print(f"{d.get('verified', 0)} of {d['files_total']} files identical; exit {d['exit_code']}")
    return summary.exit_code


def _check_options(opts) -> None:
    if opts.chunk_size < 4096 or opts.chunk_size > 64 << 20:
        raise AutomdtError("--chunk-size must be between 4Ki and 64Mi", errors.USAGE)
    if opts.memory < opts.chunk_size:
        raise AutomdtError("--memory must be at least one chunk", errors.USAGE)
    if opts.interval_s <= 0 or opts.max_threads < 1:
        raise AutomdtError("--interval must be positive and --max-threads at least 1", errors.USAGE)
    if max(opts.threads) > opts.max_threads:
        raise AutomdtError(f"--threads {opts.threads} above --max-threads {opts.max_threads}", errors.USAGE)


def _run_with_display(args, run, opts) -> int:
    show = sys.stdout.isatty() and not args.json and not args.quiet
    if show:
        from automdt.display import LiveProgress

        with LiveProgress() as live:
            opts.progress = live
            summary = run(opts)
    else:
        summary = run(opts)
    _report(summary, args)
    return summary.exit_code


def _report(summary, args) -> None:
    d = summary.as_dict()
    if args.json:
        print(json.dumps(d))
    if getattr(args, "summary_file", None):
        tmp = args.summary_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(d, f)
            f.write("\n")
        os.replace(tmp, args.summary_file)
    for e in summary.errors[:20]:
        print(f"automdt: {e}", file=sys.stderr)
    if not args.json and not args.quiet:
        from automdt.units import format_bytes

        print(f"{d['files_transferred']} transferred, {d['files_skipped']} skipped, {d['files_failed']} failed; "
              f"{format_bytes(d['bytes'])} in {d['seconds']:.2f} s "
              f"({format_bytes(d['bytes_per_second'])}/s); exit {d['exit_code']}")


def cmd_receive(args) -> int:
    import signal
    import threading

    from automdt.protocol import read_secret
    from automdt.receiver import ReceiverServer
    from automdt.units import parse_hostport, parse_size

    try:
        host, port = parse_hostport(args.listen)
        max_memory = parse_size(args.max_memory, "memory")
        metrics_at = parse_hostport(args.metrics) if args.metrics else None
    except ValueError as e:
        raise AutomdtError(str(e), errors.USAGE) from None
    if args.max_sessions < 1:
        raise AutomdtError("--max-sessions must be at least 1", errors.USAGE)
    secret = read_secret(args.secret_file) if args.secret_file else None
    metrics = None
    if metrics_at is not None:
        from automdt.metrics import ReceiverMetrics

        metrics = ReceiverMetrics()
        metrics_port = metrics.serve(*metrics_at)
    try:
        server = ReceiverServer(args.root, host, port, secret=secret, max_threads=args.max_threads,
                                max_memory=max_memory, idle_timeout_s=args.idle_timeout, encrypt=args.encrypt,
                                max_sessions=args.max_sessions, metrics=metrics)
    except AutomdtError:
        if metrics is not None:
            metrics.close()
        raise
    stop = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: stop.set())
    if metrics is not None:
        print(f"automdt: metrics on http://{metrics_at[0]}:{metrics_port}/metrics", file=sys.stderr, flush=True)
    print(f"automdt: receiving into {os.path.abspath(args.root)} on {host}:{server.port}", file=sys.stderr, flush=True)
    try:
        server.serve_forever(stop)
    finally:
        if metrics is not None:
            metrics.close()
    return 0


def cmd_demo(args) -> int:
    from automdt.sender import TransferOptions, run_transfer
    from automdt.units import format_bytes, parse_size, parse_threads

    src = os.path.join(args.dir, "src")
    dst = os.path.join(args.dir, "dst")
    total = parse_size(args.size, "size")
    made = make_sample_dataset(src, total)
    print(f"sample dataset: {made[0]} files, {format_bytes(made[1])} in {src}; copying to {dst}")
    args.json, args.quiet = False, False
    if args.threads:
        opts = TransferOptions(threads=parse_threads(args.threads))
    else:
        args.policy = None
        policy, threads = _resolve_policy(args, 32)
        opts = TransferOptions(policy=policy, threads=threads)
    code = _run_with_display(args, lambda o: run_transfer(src, dst, o), opts)
    if code == 0:
        print(f"check it yourself: diff -r {src} {dst}")
    return code


def make_sample_dataset(root: str, total: int, seed: int = 7):
    """A reproducible mixed dataset: ~80% of the bytes in a few large files, the rest in small
    files across nested directories, plus an empty file and an empty directory."""
    import random

    rng = random.Random(seed)
    if os.path.isdir(root) and os.path.exists(os.path.join(root, ".complete")):
        n = b = 0
        for dp, _, fs in os.walk(root):
            for f in fs:
                n += 1
                b += os.path.getsize(os.path.join(dp, f))
        return n, b
    os.makedirs(root, exist_ok=True)
    block = os.urandom(1 << 20)
    count = written = 0

    def write(path, size):
        nonlocal count, written
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            left = size
            while left > 0:
                k = min(left, len(block))
                off = rng.randrange(0, len(block) - k + 1)
                f.write(block[off:off + k])
                left -= k
        count += 1
        written += size

    big = max(1, int(total * 0.8) // 4)
    for i in range(4):
        write(os.path.join(root, "large", f"run{i:02d}.dat"), big)
    small_total = total - written
    i = 0
    while written < total and i < 5000:
        size = rng.randint(1, max(2, min(4 << 20, small_total // 50)))
        write(os.path.join(root, "small", f"d{i % 7}", f"e{i % 3}", f"f{i:05d}.bin"), size)
        i += 1
    write(os.path.join(root, "empty.txt"), 0)
    os.makedirs(os.path.join(root, "empty-dir"), exist_ok=True)
    with open(os.path.join(root, ".complete"), "w"):
        pass
    count += 1
    return count, written


def _load_profile(path: str):
    from automdt.simulator.profile import Profile, ProfileError

    try:
        return Profile.load(path)
    except FileNotFoundError:
        raise AutomdtError(f"{path}: profile not found", errors.USAGE) from None
    except ProfileError as e:
        raise AutomdtError(str(e), errors.USAGE) from None


def cmd_explore(args) -> int:
    from automdt.explore import explore
    from automdt.protocol import read_secret
    from automdt.sender import TransferOptions
    from automdt.units import format_bytes, parse_size

    try:
        throttle, schedule = _throttle_option(args)
        opts = TransferOptions(
            memory=parse_size(args.memory, "memory"), chunk_size=parse_size(args.chunk_size, "chunk size"),
            throttle=throttle, throttle_schedule=schedule, secret=read_secret(args.secret_file) if args.secret_file else None,
            interval_s=args.interval, max_threads=args.max_threads, log_path=args.log,
            sndbuf=parse_size(args.sndbuf, "sndbuf"), encrypt=args.encrypt)
    except ValueError as e:
        raise AutomdtError(str(e), errors.USAGE) from None
    if args.duration < 3 * args.interval:
        raise AutomdtError("--duration must cover at least 3 intervals", errors.USAGE)
    res = explore(args.src, args.dest, args.duration, opts, seed=args.seed)
    prof = res["profile"]
    prof.save(args.output)
    out = {"profile": args.output, "intervals": len(res["samples"]), "seconds": round(res["seconds"], 1),
           "stages": {n: {"tpt": st.tpt, "bandwidth": st.bandwidth, "tpt_spread": st.tpt_spread,
                          "bandwidth_spread": st.bandwidth_spread} for n, st in zip(("read", "net", "write"), prof.stages)}}
    if args.json:
        print(json.dumps(out))
    elif not args.quiet:
        print(f"profile written to {args.output} from {out['intervals']} intervals in {out['seconds']} s")
        for n, st in zip(("read", "net", "write"), prof.stages):
            print(f"  {n:5s}  per thread {format_bytes(st.tpt)}/s (±{st.tpt_spread:.0%})   "
                  f"stage {format_bytes(st.bandwidth)}/s (±{st.bandwidth_spread:.0%})")
    return 0


def cmd_train(args) -> int:
    profile = _load_profile(args.profile) if args.profile else None
    from automdt.agents.training import train

    out_dir = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(out_dir):
        raise AutomdtError(f"{out_dir}: output directory does not exist", errors.USAGE)
    if args.tensorboard:
        try:
            import tensorboard  # noqa: F401  (SB3 writes through torch's SummaryWriter, which needs it)
        except ImportError:
            raise AutomdtError("--tensorboard needs the tensorboard package (pip install 'automdt[sweeps]')",
                               errors.USAGE) from None
        try:
            os.makedirs(args.tensorboard, exist_ok=True)
        except OSError as e:
            raise AutomdtError(f"--tensorboard {args.tensorboard}: {e.strerror}", errors.USAGE) from None
    rep = train(profile, args.output, timesteps=args.timesteps, seed=args.seed, k=args.k,
                random_profiles=profile is None, progress=not args.no_progress and sys.stderr.isatty(),
                target_fraction=args.target, max_seconds=args.max_seconds, tensorboard_log=args.tensorboard)
    print(f"policy written to {rep.model_path} ({rep.timesteps} steps in {rep.wall_s:.0f} s); "
          f"{rep.fraction_of_oracle:.1%} of the oracle's utility; curve {rep.curve_png}")
    return 0


def cmd_simulate(args) -> int:
    profile = _load_profile(args.profile)
    from automdt.agents.registry import make_policy
    from automdt.simulator.oracle import evaluate_policy_in_sim, oracle

    kw = {"profile": profile} if args.policy.strip().lower() == "oracle" else {}
    try:
        pol = make_policy(args.policy, max_threads=profile.max_threads, **kw)
    except (ValueError, ImportError, FileNotFoundError) as e:
        raise AutomdtError(str(e).splitlines()[0], errors.USAGE) from None
    traj = evaluate_policy_in_sim(pol, profile, steps=args.steps, seed=args.seed, k=args.k)
    orc = oracle(profile, args.k)
    out = {"policy": getattr(pol, "name", args.policy), "fraction_of_oracle": round(float(traj.fraction_of_oracle), 4),
           "oracle_threads": list(orc.threads), "policy_threads": [int(x) for x in traj.settled_threads],
           "oracle_utility": round(float(orc.utility), 4), "oracle_throughput_bps": float(orc.throughput_bps),
           "policy_throughput_bps": round(float(traj.mean_throughput_bps), 1), "steps": args.steps, "seed": args.seed}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{out['policy']}: {out['fraction_of_oracle']:.1%} of the oracle; settles on {out['policy_threads']} "
              f"(oracle {out['oracle_threads']})")
    return 0


def cmd_tune(args) -> int:
    from automdt.experiments.sweeps import print_tune, tune

    print_tune(tune(args), args.json)
    return 0


def cmd_exit_codes(args) -> int:
    for code, meaning in sorted(errors.EXIT_CODES.items()):
        print(f"{code:>4}  {meaning}")
    return 0


COMMANDS = {"transfer": cmd_transfer, "verify": cmd_verify, "receive": cmd_receive, "demo": cmd_demo, "explore": cmd_explore,
            "train": cmd_train, "simulate": cmd_simulate, "tune": cmd_tune, "exit-codes": cmd_exit_codes}


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="automdt: %(message)s", stream=sys.stderr)
    file_handler = None
    if getattr(args, "log_file", None):
        from logging.handlers import WatchedFileHandler

        h = WatchedFileHandler(args.log_file)
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        h.setLevel(logging.INFO)
        logging.getLogger().addHandler(h)
        file_handler = h
        logging.getLogger().setLevel(logging.DEBUG if args.debug else logging.INFO)
        for handler in logging.getLogger().handlers:
            if handler is not h and not args.debug:
                handler.setLevel(logging.WARNING)
    if args.command is None:
        parser.print_help()
        return errors.USAGE
    try:
        code = COMMANDS[args.command](args)
        if file_handler is not None:
            log.log(logging.INFO if code == 0 else logging.WARNING, "%s finished with exit code %d", args.command, code)
        return code
    except AutomdtError as e:
        print(f"automdt: {e.message}", file=sys.stderr)
        if file_handler is not None:
            file_handler.handle(logging.makeLogRecord({"name": "automdt", "levelno": logging.ERROR,
                                                       "levelname": "ERROR", "msg": f"{e.message} (exit {e.code})"}))
        return e.code
    except KeyboardInterrupt:
        print("automdt: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug: still one line unless --debug
        if args.debug:
            raise
        print(f"automdt: internal error: {type(e).__name__}: {e} (re-run with --debug for details)", file=sys.stderr)
        return errors.ERROR


if __name__ == "__main__":
    sys.exit(main())
