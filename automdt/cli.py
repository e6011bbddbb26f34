"""The ``automdt`` command line.

Heavy modules are imported inside the commands that need them: ``transfer``, ``receive``,
``explore``, ``verify``, ``simulate`` and ``demo`` run on the base install (PPO inference is
numpy); ``train`` and ``tune`` need the ``train`` extra (and ``tune`` the ``sweeps`` one) and say
so in one line (exit 2) where it is missing (:mod:`automdt.lazy`). The engine package (a few ms)
is imported at once for its limits (the chunk-size range). User errors print one
line ``automdt: ...`` on stderr and exit with a documented code (``automdt exit-codes``). Every
option's value and every output path is checked before any work starts
(:mod:`automdt.cli_args`); SIGINT/SIGTERM stop a command cleanly with exit 130/143, however many
arrive (:mod:`automdt.interrupts`), and a transfer's summary is written whatever ended it.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import List, Optional

from automdt import __version__, cli_args as A, errors, interrupts
from automdt.policy_contract import K_DEFAULT
from automdt.errors import AutomdtError, Interrupted
from automdt.lazy import extra_of, require
from automdt.transfer_engine import SESSION_CHUNK_SIZE_MAX, SESSION_CHUNK_SIZE_MIN

log = logging.getLogger("automdt")

EPILOG_EXIT = "Exit codes: see `automdt exit-codes`. Sizes: 4M = 4,000,000 bytes, 4Mi = 4,194,304 bytes."
MAX_THREADS_LIMIT = 1024
MIN_CHUNK, MAX_CHUNK = SESSION_CHUNK_SIZE_MIN, SESSION_CHUNK_SIZE_MAX
FILE_ONLY = {"file_only": True}
"""``extra=`` of a log record that goes to --log-file only (stderr gets the same text another way)."""
QUIET_CODES = (errors.OK, errors.MAX_DURATION, errors.LOCK_BUSY)
ORACLE_ONLY_IN_SIMULATOR = ("policy 'oracle' needs the path's true profile, so it runs only in the simulator "
                            "(automdt simulate --policy oracle)")
"""Outcomes ``--quiet`` reports by exit code only (and in --summary-file/--log-file), not on stderr."""
TRAIN_MODULES = ("torch", "stable_baselines3", "gymnasium", "matplotlib")
"""What ``train`` and ``tune`` need: the ``train`` extra (matplotlib draws the learning curve)."""


def _debug_option(p: argparse.ArgumentParser) -> None:
    # also accepted after the subcommand; SUPPRESS keeps a top-level --debug from being reset
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="log debug messages and show tracebacks")


def _switch(text: str) -> str:
    """``--switch NAME=VALUE``, checked at parse time (exit 2)."""
    from automdt.transfer_engine.switches import Switches

    try:
        if not text.strip():
            raise ValueError("expected NAME=VALUE")
        Switches.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix(f"--switch {text}: ")) from None
    return text


SWITCH_HELP = ("a data-path switch for comparisons (benchmarks), NAME=VALUE, repeatable: local_link=0, sendfile=0, "
               "tls_batch=0 (set it on both ends), files_at_once=N; a transfer records them in its --log start "
               "record (see docs/environment.md)")


def _switch_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--switch", metavar="NAME=VALUE", action="append", type=_switch, help=SWITCH_HELP)


def _add_engine_options(p: argparse.ArgumentParser, threads: bool = True) -> None:
    if threads:  # explore draws its own thread counts
        p.add_argument("--threads", metavar="R,N,W", default=None, type=A.threads,
                       help="static read,network,write thread counts (with --policy: the starting counts)")
    else:
        p.set_defaults(threads=None)
    p.add_argument("--memory", metavar="BYTES", default="256Mi", type=A.size(MIN_CHUNK, what="memory"),
                   help="memory cap of each staging buffer, e.g. 512Mi or 1G (default 256Mi)")
    p.add_argument("--chunk-size", metavar="BYTES", default=None, type=A.size(MIN_CHUNK, MAX_CHUNK, "chunk size"),
                   help=f"chunk size, {MIN_CHUNK >> 10}Ki..{MAX_CHUNK >> 20}Mi (default 4Mi; a transfer whose job ran "
                        "before may take 2Mi or 1Mi, where that run's per-thread rates say a 4 MiB chunk takes over "
                        "a quarter of --interval to pass the three stages)")
    p.add_argument("--throttle", metavar="SPEC", default="",
                   help="emulated bottlenecks: comma list of read.thread=, net.thread=, write.thread=, "
                        "read.total=, net.total=, write.total= in bytes/s with K/M/G (powers of 1000: "
                        "40M = 40 MB/s = 40*10^6 bytes/s, not MiB); "
                        "@FILE: a schedule, a YAML list of {at: SECONDS, throttle: SPEC} entries applied "
                        "at their times (an empty SPEC lifts every limit); 0 means no limit")
    p.add_argument("--secret-file", metavar="F", type=A.nonempty,
                   help="file holding the shared secret; both ends must prove it (keep it mode 600)")
    p.add_argument("--encrypt", action="store_true",
                   help="encrypt the control channel (ZeroMQ CURVE) and the data connections (TLS 1.3); "
                        "needs --secret-file and a receiver started with --encrypt; a local destination (a "
                        "directory) needs neither: its chunks never leave the process, nothing is encrypted")
    p.add_argument("--max-threads", type=A.integer(1, MAX_THREADS_LIMIT), default=32, metavar="N",
                   help=f"upper bound of each stage's threads, 1..{MAX_THREADS_LIMIT} (default 32)")
    p.add_argument("--interval", type=A.seconds(0.1, lo_open=False, hi=3600), default=1.0, metavar="SECONDS",
                   help="control interval, 0.1..3600 (default 1 s)")
    p.add_argument("--log", metavar="FILE", type=A.nonempty, help="append one JSON object per interval to FILE")
    p.add_argument("--json", action="store_true", help="print one final JSON summary on stdout (no progress display)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress display and no summary text; on stderr only errors, none for exit 0, "
                        "10 or 13 (cron mails only real failures)")
    p.add_argument("--sndbuf", metavar="BYTES", default="0", type=A.size(0, 2**31 - 1, "sndbuf"),
                   help="per-connection socket send buffer cap, emulates a TCP window (default 0: the kernel's)")
    _switch_option(p)


def _add_ops_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lock-file", metavar="F", type=A.nonempty,
                   help="lock held for the run (default: per SRC+DEST under $XDG_RUNTIME_DIR/automdt-locks or "
                        "/tmp/automdt-locks-UID); a second run exits 13 at once")
    p.add_argument("--lock-wait", type=A.seconds(0.0, lo_open=False), default=0.0, metavar="SECONDS",
                   help="wait this long for a busy lock before exiting 13 (default 0)")
    p.add_argument("--no-lock", action="store_true", help="do not take the lock")
    p.add_argument("--summary-file", metavar="F", type=A.nonempty,
                   help="also write the final JSON summary to F (always, whatever the exit code)")
    p.add_argument("--log-file", metavar="F", type=A.nonempty,
                   help="append log messages (with times) to F; reopened if logrotate moves it")


def build_parser() -> argparse.ArgumentParser:
    p = A.Parser(prog="automdt", description=(
        "Modular data transfers: separate read, network and write thread pools, tuned jointly."),
        epilog=EPILOG_EXIT)
    p.add_argument("--version", action="version", version=f"automdt {__version__}")
    p.add_argument("--debug", action="store_true", help="log debug messages and show tracebacks")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for add in (_transfer_parser, _verify_parser, _receive_parser, _demo_parser, _explore_parser, _train_parser,
                _tune_parser, _simulate_parser, _exit_codes_parser):
        add(sub)
    return p


def _transfer_parser(sub) -> None:
    t = sub.add_parser("transfer", help="copy a directory tree to a local directory or a running receiver",
                       description="Copy the contents of SRC (a directory, or one file) to DEST: a local directory "
                                   "(a receiver then runs inside this process; chunks reach it without a socket) or HOST:PORT[/SUBDIR] "
                                   "of a running `automdt receive`. Files already complete and identical "
                                   "(size and mtime, or content with --checksum) are skipped; interrupted files "
                                   "resume from their journals.", epilog=EPILOG_EXIT)
    t.add_argument("src", help="source directory (its contents are copied) or file")
    t.add_argument("dest", help="local directory, or HOST:PORT[/SUBDIR] of a running `automdt receive`; as for "
                                "rsync and scp, a colon before the first slash names a host (HOST:/x and "
                                "HOST:PORT:x are usage errors, never local directories): write ./NAME:X for a "
                                "local directory whose name has a colon")
    _add_engine_options(t)
    t.add_argument("--policy", metavar="SPEC", default=None, type=A.nonempty,
                   help="thread-count policy: default (the shield around the capacity controller; the default "
                        "unless --threads is given), capacity, ppo (the shipped PPO network), PATH.zip (a policy "
                        "file from `automdt train`, under the shield), ppo:PATH (the same file bare), marlin, falcon, globus (static 4,32,4), static:R,N,W, "
                        "heuristic, model, topdown, shield:SPEC (SPEC under the shield), or MODULE:FACTORY "
                        "(your own class)")
    t.add_argument("--checksum", action="store_true", help="skip files by content digest instead of size+mtime")
    t.add_argument("--max-duration", type=A.seconds(), metavar="SECONDS",
                   help="stop cleanly after SECONDS (> 0; exit 10); the next run resumes")
    t.add_argument("--fsync", choices=["none", "end", "file", "dir"], default="end",
                   help="durability after a power cut: end (default): the receiver writes the destination's "
                        "filesystem back (syncfs) before the run reports success, so exit 0 means on disk; file: "
                        "fsync each file before its rename; dir: and its directory after; none: no guarantee at "
                        "exit (a rerun after a crash still resends what was at risk)")
    t.add_argument("--chunk-retries", type=A.integer(0, 1000), default=5, metavar="N",
                   help="re-sends of a corrupt chunk before the file fails (default 5)")
    t.add_argument("--retries", type=A.integer(0, 1000), default=2, metavar="N",
                   help="whole-run retries after a network failure, each resuming (default 2)")
    t.add_argument("--retries-sleep", type=A.seconds(0.0, lo_open=False, hi=86400), default=2.0, metavar="SECONDS",
                   help="pause before a retry (default 2)")
    t.add_argument("--timeout", type=A.seconds(1.0, lo_open=False, hi=86400), default=30.0, metavar="SECONDS",
                   help="control-channel reply timeout, at least 1 (default 30)")
    _add_ops_options(t)
    t.add_argument("-n", "--dry-run", action="store_true",
                   help="only report what would move (the files, or with --json the same summary with "
                        "dry_run_files); change nothing")
    t.add_argument("--verify", action="store_true",
                   help="afterwards compare every file's content digest on both ends (exit 11 on a difference)")
    t.add_argument("--bwlimit", metavar="RATE", type=A.size(0, what="rate"),
                   help="cap the network stage at RATE bytes/s, e.g. 100M (same as --throttle net.total=RATE; 0: none)")
    t.add_argument("--no-history", action="store_true",
                   help="neither start from nor record this job's history (where its last run settled; kept under "
                        "$XDG_STATE_HOME/automdt/, default ~/.local/state/automdt/)")
    t.add_argument("--shard", metavar="I/N", type=A.shard,
                   help="move only shard I of N (0..N-1) of SRC: a deterministic, size-balanced part, the same "
                        "on every node; each shard is its own job (lock, history, resume)")
    t.add_argument("--metrics-file", metavar="FILE.prom", type=A.nonempty,
                   help="write the run's figures for node_exporter's textfile collector to FILE (atomically)")
    t.add_argument("--metrics-job", metavar="NAME", default=None, type=A.nonempty,
                   help="job_name label of the --metrics-file series (default: the last component of SRC)")
    _debug_option(t)


def _verify_parser(sub) -> None:
    v = sub.add_parser("verify", help="compare a source tree with a destination by content digest",
                       description="Compare the content digest (XXH3-128 over the per-chunk XXH3-64 digests) of "
                                   "every file of SRC with DEST (a local directory or HOST:PORT[/SUBDIR]); print "
                                   "`missing: PATH` / `differs: PATH` lines, and `unreadable: PATH (source|"
                                   "destination): WHY` for what one side cannot read; exit 11 if any differ or are "
                                   "missing, else 6 if anything was unreadable.", epilog=EPILOG_EXIT)
    v.add_argument("src", help="source directory or file")
    v.add_argument("dest", help="local directory, or HOST:PORT[/SUBDIR] of a running `automdt receive`")
    v.add_argument("--secret-file", metavar="F", type=A.nonempty,
                   help="shared secret of the receiver (as for transfer)")
    v.add_argument("--encrypt", action="store_true", help="encrypted control channel (for a receiver with --encrypt)")
    v.add_argument("--chunk-size", metavar="BYTES", default="4Mi", type=A.size(MIN_CHUNK, MAX_CHUNK, "chunk size"),
                   help=f"chunk size the digests are built from, {MIN_CHUNK >> 10}Ki..{MAX_CHUNK >> 20}Mi "
                        "(default 4Mi; any value works, "
                        "both ends use the same)")
    v.add_argument("--timeout", type=A.seconds(1.0, lo_open=False, hi=86400), default=30.0, metavar="SECONDS",
                   help="control-channel reply timeout, at least 1 (default 30)")
    v.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    v.add_argument("-q", "--quiet", action="store_true", help="print nothing; the exit code tells")
    _debug_option(v)


def _receive_parser(sub) -> None:
    r = sub.add_parser("receive", help="run the destination daemon",
                       description="Serve transfers into ROOT. Listening on a non-loopback address needs "
                                   "--secret-file. Every resource a sender asks for is clamped. Logs one line per "
                                   "session start and finish (with totals) on stderr, with times, and one line "
                                   "per refused sender with the reason (no or a wrong secret, a destination "
                                   "subdirectory that cannot be created or written, busy).",
                       epilog=EPILOG_EXIT)
    r.add_argument("--listen", required=True, metavar="HOST:PORT", type=A.hostport,
                   help="address and port of the control channel (data ports are chosen per session)")
    r.add_argument("--root", required=True, metavar="DIR", type=A.nonempty,
                   help="existing directory every transfer is written beneath; the daemon's user must be able "
                        "to create files in it (checked at start: exit 3 otherwise)")
    r.add_argument("--secret-file", metavar="F", type=A.nonempty,
                   help="shared secret senders must prove (required off loopback; keep it mode 600)")
    r.add_argument("--encrypt", action="store_true",
                   help="require encryption: ZeroMQ CURVE control channel and TLS 1.3 data connections, keyed "
                        "from --secret-file; senders must use --encrypt")
    r.add_argument("--max-threads", type=A.integer(1, MAX_THREADS_LIMIT), default=64, metavar="N",
                   help="clamp for write threads (default 64)")
    r.add_argument("--max-memory", default="1Gi", metavar="BYTES", type=A.size(MIN_CHUNK, what="memory"),
                   help="clamp for each session's staging buffer (default 1Gi)")
    r.add_argument("--total-memory", default="4Gi", metavar="BYTES", type=A.size(MIN_CHUNK, what="memory"),
                   help="staging memory of all sessions together: each open session may hold an equal share, "
                        "re-divided as senders come and go (default 4Gi)")
    r.add_argument("--total-threads", type=A.integer(1, 100_000), default=256, metavar="N",
                   help="write threads of all sessions together, divided the same way, at least one each "
                        "(default 256)")
    r.add_argument("--total-connections", type=A.integer(1, 100_000), default=64, metavar="N",
                   help="data connections (the senders' network threads) of all sessions together, divided the "
                        "same way: each sender's controller keeps its network threads within its share, so jobs "
                        "sharing a link share it evenly instead of outbidding each other (default 64)")
    r.add_argument("--idle-timeout", type=A.seconds(1.0, lo_open=False), default=60.0, metavar="SECONDS",
                   help="close a session silent this long, keeping its partial files (default 60)")
    r.add_argument("--fair-share", action=argparse.BooleanOptionalAction, default=True,
                   help="share the rate evenly among sessions that want more (on by default): jobs sharing a "
                        "link or this host's disk get equal rates, which TCP and their own controllers do not "
                        "give them, by reading no faster from the ones ahead (TCP then slows their senders); a "
                        "job held back by its own path or source keeps what it gets and leaves the rest to the "
                        "others. --no-fair-share leaves the division to TCP")
    r.add_argument("--throttle", metavar="SPEC", default="",
                   help="emulate one slow destination disk that every session writes to (tests, benchmarks): "
                        "write.thread=RATE limits each write thread of every session, write.total=RATE all "
                        "sessions' writes together, e.g. write.thread=20M,write.total=80M (default: none)")
    r.add_argument("--log-file", metavar="F", type=A.nonempty,
                   help="append log messages to F (reopened if logrotate moves it)")
    r.add_argument("--metrics", metavar="HOST:PORT", type=A.hostport,
                   help="serve Prometheus metrics on http://HOST:PORT/metrics (port 0: any free port)")
    r.add_argument("--max-sessions", type=A.integer(1, 100_000), default=16, metavar="N",
                   help="senders served at once; more get 'busy' and retry (default 16)")
    _switch_option(r)
    _debug_option(r)


def _demo_parser(sub) -> None:
    d = sub.add_parser("demo", help="create a sample dataset, transfer it locally, check it, remove it",
                       description="Create a sample dataset (a few large files and many small ones) in "
                                   "DIR/src, copy it to DIR/dst with the live display, compare every file's "
                                   "content digest, and remove both (the directory too, if the demo created it) "
                                   "unless --keep.", epilog=EPILOG_EXIT)
    d.add_argument("--dir", default="demo-data", type=A.nonempty,
                   help="where to create src/ and dst/ (default ./demo-data)")
    d.add_argument("--size", default="1Gi", type=A.size(1 << 20, 1 << 40, "size"),
                   help="approximate dataset size, at least 1Mi (default 1Gi)")
    d.add_argument("--threads", default=None, metavar="R,N,W", type=A.threads,
                   help="static thread counts (default: the default controller chooses them)")
    d.add_argument("--keep", action="store_true", help="keep DIR/src and DIR/dst afterwards")
    _debug_option(d)


def _explore_parser(sub) -> None:
    e = sub.add_parser("explore", help="short real transfer with random thread counts; fit a profile",
                       description="Move real data of SRC to DEST for --duration seconds, drawing a random "
                                   "(read, net, write) thread triple every interval, and fit the simulator "
                                   "profile (per-thread throughput from bytes per busy thread-second, stage "
                                   "bandwidths, noise) to the engine's counters. First prints what a trustworthy "
                                   "fit needs (intervals, seconds, data per round) and what falls short. A stage's "
                                   "bandwidth counts only if the stage was seen limiting the path (within the "
                                   "noise of the end-to-end rates); any other is a lower bound, and if no stage "
                                   "was seen limiting, every bandwidth is capped at the highest delivered rate, so "
                                   "the profile never promises more than the exploration saw. Writes the profile "
                                   "YAML with the raw samples and each stage's confidence (samples used, spread, "
                                   "measured or lower bound). A fit resting on too little evidence (fewer than 10 "
                                   "intervals, no stage seen limiting the path, or an exploration that ended before "
                                   "half of --duration) is an error, exit 14: the profile goes to NAME.weak.yaml "
                                   "instead of -o, the reasons to its meta.fit.weak; --allow-weak-fit writes it to "
                                   "-o (exit 0). If the data is already at DEST, or runs out, further rounds copy "
                                   "it into a scratch subdirectory of DEST that is removed afterwards. Rates are "
                                   "printed in MB/s (1 MB = 10^6 bytes, as --throttle takes them).",
                       epilog=EPILOG_EXIT)
    e.add_argument("src", help="source directory or file (real data of the path to explore)")
    e.add_argument("dest", help="local directory, or HOST:PORT[/SUBDIR] of a running `automdt receive`")
    e.add_argument("--duration", type=A.seconds(), default=30.0, metavar="SECONDS",
                   help="exploration time, at least 3 intervals (default 30 s; explore prints the minimum "
                        "for a trustworthy fit, about 24 intervals)")
    e.add_argument("-o", "--output", required=True, metavar="PROFILE.yaml", type=A.nonempty,
                   help="profile file to write (.yaml, or .json); a weak fit goes to PROFILE.weak.yaml")
    e.add_argument("--seed", type=A.integer(0), default=0, help="seed of the random thread counts (default 0)")
    e.add_argument("--allow-weak-fit", action="store_true",
                   help="write the profile to -o even when the fit rests on too little evidence (exit 0)")
    _add_engine_options(e, threads=False)
    _debug_option(e)


def _train_parser(sub) -> None:
    tr = sub.add_parser("train", help="train a policy for a path (or a general PPO network) offline in the simulator",
                        description="With --profile: train the default controller's learned part for that path with "
                                    "PPO (stable-baselines3) in the simulator, on the profile and the paths near it "
                                    "(the fit's uncertainty, noise, changes after the exploration), validate it against "
                                    "the default controller on paths training never saw, and write the best of the "
                                    "trained network, the profile's start alone, or the default itself, whichever "
                                    "does not lose to the default; it prints which, with the validation figures. The "
                                    "file runs under the shield with `transfer --policy FILE.zip`. Without --profile: "
                                    "train a general PPO network over randomised profiles. Writes the model zip, a "
                                    "JSON sidecar and a learning curve. Says so when the time budget ends training "
                                    "before the target.", epilog=EPILOG_EXIT)
    tr.add_argument("--profile", metavar="PROFILE.yaml", type=A.nonempty,
                    help="profile from `automdt explore` (default: random profiles)")
    tr.add_argument("-o", "--output", required=True, metavar="POLICY.zip", type=A.nonempty,
                    help="policy file to write (.zip appended if missing), with POLICY.zip.json beside it")
    tr.add_argument("--timesteps", type=A.integer(1), default=None, metavar="N",
                    help="environment steps (default with --profile: 120000; without: until the target or the budget)")
    tr.add_argument("--seed", type=A.integer(0), default=0, help="seed of everything random (default 0)")
    tr.add_argument("--target", type=A.number(0.0, 1.0, lo_open=True, what="a fraction"), default=0.95, metavar="F",
                    help="the fraction of the oracle to reach, 0 < F <= 1 (default 0.95): without --profile training "
                         "stops there; with it, on the path as explored, `train` says when it is missed")
    tr.add_argument("--max-seconds", type=A.seconds(), default=None, metavar="SECONDS", help="wall-time budget")
    tr.add_argument("--k", type=A.number(1.0, 2.0, what="a utility base"), default=K_DEFAULT,
                    help=f"utility base per thread, 1..2 (default {K_DEFAULT:g})")
    tr.add_argument("--no-progress", action="store_true", help="no progress bar")
    tr.add_argument("--tensorboard", metavar="DIR", type=A.nonempty,
                    help="write SB3's TensorBoard logs and the evaluations' fraction of the oracle to DIR/PPO_<n>")
    _debug_option(tr)


def _tune_parser(sub) -> None:
    tu = sub.add_parser("tune", help="Optuna study over PPO and reward settings in the simulator (shared storage)",
                        description="Run trials of an Optuna study: each trains PPO in the simulator with sampled "
                                    "hyperparameters and reward settings and scores its fraction of the oracle. "
                                    "Processes (or nodes) given the same --storage and --study-name share one "
                                    "study. Needs the train and sweeps extras (pip install 'automdt[train,sweeps]').",
                        epilog=EPILOG_EXIT)
    from automdt.tune import add_tune_arguments

    add_tune_arguments(tu)
    _debug_option(tu)


def _simulate_parser(sub) -> None:
    sm = sub.add_parser("simulate", help="evaluate a policy in the simulator against the oracle",
                        description="Run a policy (default, a trained zip, ppo for the shipped PPO network, or a "
                                    "baseline: static:R,N,W, globus, marlin, falcon, heuristic, model, topdown, capacity, "
                                    "oracle, shield:SPEC, MODULE:FACTORY) in the simulator on a profile and compare its utility with "
                                    "the oracle's.", epilog=EPILOG_EXIT)
    sm.add_argument("--profile", required=True, metavar="PROFILE.yaml", type=A.nonempty,
                    help="profile to simulate (from `automdt explore`)")
    sm.add_argument("--policy", default="default", metavar="SPEC", type=A.nonempty,
                    help="policy to evaluate (default: what `automdt transfer` runs); see `automdt transfer --help`")
    sm.add_argument("--steps", type=A.integer(1, 1_000_000), default=60, metavar="N",
                    help="control intervals to simulate (default 60)")
    sm.add_argument("--seed", type=A.integer(0), default=0, help="seed of the simulator's noise (default 0)")
    sm.add_argument("--k", type=A.number(1.0, 2.0, what="a utility base"), default=K_DEFAULT,
                    help=f"utility base per thread, 1..2 (default {K_DEFAULT:g})")
    sm.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    _debug_option(sm)


def _exit_codes_parser(sub) -> None:
    x = sub.add_parser("exit-codes", help="list the exit codes", description="List the exit codes.")
    _debug_option(x)


# ------------------------------------------------------------------------------ helpers
def _out(text: str) -> None:
    """Print to stdout; a reader that went away (``| head``) ends the output, not the command."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _policy_error(e: BaseException) -> AutomdtError:
    return AutomdtError(str(e).splitlines()[0] if str(e) else type(e).__name__, errors.USAGE)


def _fallback():
    """What drives the rest of a run whose policy keeps failing: the shield's fallback controller."""
    from automdt.agents.shield import Fallback

    return Fallback


def _resolve_policy(args, max_threads: int):
    """``(policy, threads, start)`` from ``--policy`` and ``--threads``: the policy (fixed counts
    are :class:`automdt.agents.static.StaticPolicy`: ``--threads`` alone, ``static:R,N,W``,
    ``globus``), the counts the receiver opens with, and the counts an adaptive policy starts from
    (``--threads`` given with a ``--policy`` other than ``static:``; None otherwise:
    :mod:`automdt.start`)."""
    from automdt.agents.registry import make_policy
    from automdt.agents.static import StaticPolicy
    from automdt.units import parse_threads

    if args.policy is None and args.threads is not None:
        triple = parse_threads(args.threads)
        return StaticPolicy(*triple), triple, None
    spec = args.policy or "default"
    if spec.strip().lower() == "oracle":
        raise AutomdtError(ORACLE_ONLY_IN_SIMULATOR, errors.USAGE)
    try:
        pol = make_policy(spec, max_threads=max_threads)
    except (ValueError, TypeError, OSError, ImportError, AttributeError) as e:
        raise _policy_error(e) from None
    if isinstance(pol, StaticPolicy) and spec.strip().lower().startswith("static:"):
        return pol, pol.triple, None
    _note_trained_path(args, pol)
    start = parse_threads(args.threads) if args.threads else None
    return pol, start or (1, 1, 1), start


def _note_trained_path(args, pol) -> None:
    """A trained file says so when this transfer is not the path it was trained for."""
    meta = getattr(getattr(pol, "policy", pol), "metadata", None)
    if not isinstance(meta, dict) or getattr(args, "quiet", False) or not hasattr(args, "src"):
        return
    from automdt.agents.tuned import FORMAT, path_note

    note = path_note(meta, args.src, args.dest) if meta.get("format") == FORMAT else None
    if note:
        print(f"automdt: {note}", file=sys.stderr)


def _check_policy(args) -> None:
    """The --policy spec, checked before the lock and any work (loading it comes after the lock)."""
    from automdt.agents.registry import check_spec

    spec = getattr(args, "policy", None)
    if spec is None:
        return
    if spec.strip().lower() == "oracle":
        raise AutomdtError(ORACLE_ONLY_IN_SIMULATOR, errors.USAGE)
    try:
        check_spec(spec)
    except (ValueError, TypeError, ImportError, OSError) as e:
        raise _policy_error(e) from None


def _transfer_options(args):
    """TransferOptions from the command line, every value checked (exit 2), nothing started."""
    from automdt.protocol import DEFAULT_CHUNK_SIZE, read_secret
    from automdt.sender import TransferOptions, check_dest
    from automdt.units import parse_size, parse_threads

    try:
        shard = getattr(args, "shard", None)
        args.shard_parsed = A.parse_shard_text(shard) if shard else None
        spec = args.throttle
        if getattr(args, "bwlimit", None):
            if spec.strip().startswith("@"):
                raise ValueError("--bwlimit cannot be combined with a throttle schedule (--throttle @FILE): "
                                 "put net.total= into the schedule's entries")
            spec = ",".join(x for x in (spec, f"net.total={args.bwlimit}") if x)
        throttle, schedule = _throttle_option(spec)
        opts = TransferOptions(
            threads=parse_threads(args.threads) if args.threads else (4, 4, 4),
            memory=parse_size(args.memory, "memory"), chunk_size=parse_size(args.chunk_size, "chunk size") if args.chunk_size else DEFAULT_CHUNK_SIZE,
            throttle=throttle, throttle_schedule=schedule, interval_s=args.interval, max_threads=args.max_threads,
            log_path=args.log, sndbuf=parse_size(args.sndbuf, "sndbuf"), encrypt=args.encrypt,
            shard=args.shard_parsed)
        check_dest(args.dest)
    except ValueError as e:
        raise AutomdtError(str(e), errors.USAGE) from None
    if opts.memory < opts.chunk_size:
        raise AutomdtError("--memory must be at least one chunk (--chunk-size)", errors.USAGE)
    _check_memory(opts.memory)
    if max(opts.threads) > opts.max_threads:
        raise AutomdtError(f"--threads {args.threads} above --max-threads {opts.max_threads}", errors.USAGE)
    _check_encrypt_secret(args)
    if args.secret_file:
        opts.secret = read_secret(args.secret_file)
    if args.log:
        A.check_append_file(args.log, "--log")
    return opts


def _check_encrypt_secret(args) -> None:
    """``--encrypt`` to a receiver needs ``--secret-file``; a local destination does not (its
    chunks never leave the process: the local link, nothing to encrypt)."""
    from automdt.sender import parse_dest

    if args.encrypt and not args.secret_file and parse_dest(args.dest)[0] is not None:
        raise AutomdtError("--encrypt needs --secret-file (the keys derive from the shared secret)", errors.USAGE)


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
        opts.history = rec  # only policies that take a start use it (automdt.start)
        if rec is not None and args.chunk_size is None:
            opts.chunk_size = history.chunk_size_for(rec, opts.chunk_size, opts.interval_s)
        summary = run_transfer(args.src, args.dest, opts)
        name = getattr(opts.policy, "name", None) or "static:" + ",".join(str(int(n)) for n in opts.threads)
        failed = history.update(path, summary.history, previous=rec, policy=name, max_threads=opts.max_threads,
                                job=key, src=os.path.abspath(args.src), dest=args.dest, chunk_bytes=opts.chunk_size)
        if failed and not warning:  # one line per run: an unreadable file is usually unwritable too
            log.warning("%s", failed)
        return summary

    return run


def _receive_throttle(spec: str) -> tuple:
    """``receive --throttle SPEC``: the emulated disk's ``(thread_bps, total_bps)``; a stage
    other than write is a usage error (the daemon only writes)."""
    from automdt.units import parse_throttle

    try:
        limits = parse_throttle(spec)
    except ValueError as e:
        raise AutomdtError(f"--throttle: {e}", errors.USAGE) from None
    if any(limits[s] != (0.0, 0.0) for s in ("read", "net")):
        raise AutomdtError(f"--throttle {spec!r}: the receiver emulates only its disk: write.thread and "
                           "write.total (read and net limits belong to the sender)", errors.USAGE)
    return tuple(int(x) for x in limits["write"])


def _throttle_option(spec: str):
    """``--throttle SPEC`` or ``--throttle @FILE`` (a schedule): ``(limits, schedule or None)``."""
    from automdt.throttle import parse_throttle_option

    return parse_throttle_option(spec)


def _check_memory(nbytes: int) -> None:
    try:  # physical memory, without importing psutil on the transfer path (start-up)
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # no limit known
        return
    if total <= 0:
        return
    if 2 * nbytes > total:
        from automdt.units import format_bytes

        raise AutomdtError(f"--memory {format_bytes(nbytes)} per staging buffer (two of them) does not fit in "
                           f"this machine's {format_bytes(total)}", errors.USAGE)


def _check_summary_file(args) -> None:
    if getattr(args, "summary_file", None):
        A.check_output_file(args.summary_file, "--summary-file")


class _Lock:
    """The job lock (``--lock-file``/default), or nothing with ``--no-lock``."""

    def __init__(self, args):
        self.args = args
        self.lock = None

    def __enter__(self):
        if self.args.no_lock:
            return self
        from automdt.lock import JobLock, default_lock_path

        path = self.args.lock_file or default_lock_path(self.args.src, self.args.dest,
                                                         getattr(self.args, "shard_parsed", None))
        self.lock = JobLock(path, self.args.lock_wait).__enter__()
        return self

    def __exit__(self, *exc):
        if self.lock is not None:
            self.lock.__exit__(*exc)


def cmd_transfer(args) -> int:
    from automdt.sender import Summary, run_transfer

    # (still in main's start-up shield: checking the options takes milliseconds)
    opts = _transfer_options(args)
    opts.checksum, opts.max_duration_s, opts.fsync = args.checksum, args.max_duration, args.fsync
    opts.chunk_retries, opts.timeout_s, opts.dry_run = args.chunk_retries, args.timeout, args.dry_run
    opts.retries, opts.retry_sleep_s, opts.verify = args.retries, args.retries_sleep, args.verify
    if args.no_lock and args.lock_file:
        raise AutomdtError("--no-lock and --lock-file contradict each other", errors.USAGE)
    _check_policy(args)
    _check_summary_file(args)
    if args.metrics_file:
        A.check_output_file(args.metrics_file, "--metrics-file")
    t0 = time.monotonic()
    # From here on the run always ends with a summary (--json, --summary-file), whatever ends it.
    lock = _Lock(args)
    try:
        interrupts.ready()
        with lock:
            # explicit start counts (--threads with --policy) win over the job's history
            opts.policy, opts.threads, opts.start_threads = _resolve_policy(args, args.max_threads)
            opts.fallback = _fallback()
            summary = _run_with_display(args, _with_history(args, run_transfer), opts)
    except AutomdtError as e:
        if e.code == errors.USAGE and lock.lock is None and not args.no_lock:
            raise  # the lock file itself is unusable: a usage error, before anything started
        summary = Summary(exit_code=e.code, errors=[e.message])
        log.error("%s (exit %d)", e.message, e.code, extra=FILE_ONLY)  # stderr gets it from the summary
    except Interrupted as e:
        from automdt.sender import interrupted

        summary = Summary(exit_code=e.code, errors=[interrupted(e.code)])
    with interrupts.shielded():
        _report(summary, args)
        if args.metrics_file:
            _write_metrics_file(args, summary, time.monotonic() - t0)
    return summary.exit_code


def _write_metrics_file(args, summary, seconds: float) -> None:
    """``--metrics-file``: the run's figures for node_exporter, whatever the outcome (a failed cron
    run is news too)."""
    from automdt.metrics import write_transfer_textfile

    labels = {"job_name": args.metrics_job or os.path.basename(os.path.normpath(os.path.abspath(args.src))),
              "shard": args.shard or "", "dest": args.dest}
    try:
        write_transfer_textfile(args.metrics_file, summary.as_dict(), summary.exit_code, labels, seconds=seconds)
    except OSError as e:
        print(f"automdt: cannot write --metrics-file {args.metrics_file}: {e.strerror or e}", file=sys.stderr)


def _run_with_display(args, run, opts):
    show = sys.stdout.isatty() and not args.json and not args.quiet
    if not show:
        return run(opts)
    from automdt.display import LiveProgress

    with LiveProgress() as live:
        opts.progress = live
        return run(opts)


def _report(summary, args) -> None:
    """The summary: --summary-file (first: it must survive a closed stdout), --json, stderr, text."""
    from automdt.units import format_bytes

    d = summary.as_dict()
    text = json.dumps(d)
    if getattr(args, "summary_file", None):
        A.save_result(args.summary_file, lambda p: A.write_atomic(p, text + "\n"), "summary", text)
    if args.json:
        _out(text)
    if not (args.quiet and summary.exit_code in QUIET_CODES):
        for e in summary.errors[:20]:
            print(f"automdt: {e}", file=sys.stderr)
        if len(summary.errors) > 20:
            print(f"automdt: ... and {len(summary.errors) - 20} more errors (see --json or --summary-file)",
                  file=sys.stderr)
    if args.json or args.quiet:
        return
    if d.get("dry_run_files") is not None:
        files = d["dry_run_files"]
        for name in files:
            _out(f"would send: {name}")
        n = max(len(files), d["files_total"] - d["files_skipped"] - d["files_failed"])
        what = f"would send {_files(n)} ({format_bytes(d['bytes_to_send'])})" if n else "nothing to send"
        listed = f", the first {len(files)} listed above" if len(files) < n else ""
        _out(f"dry run: {what}{listed}; {d['files_skipped']} of {_files(d['files_total'])} already complete, "
             f"{d['files_failed']} failed; nothing changed; exit {d['exit_code']}")
        return
    rate = f"{format_bytes(d['bytes_per_second'])}/s"
    reused = f"; {format_bytes(d['bytes_reused'])} already there from partial files" if d.get("bytes_reused") else ""
    if d.get("verified") is not None:  # --verify: its outcome in words too, not only in --json
        for line in (d.get("differences") or []) + (d.get("unreadable") or []):
            _out(line)
        _out(f"verify: {d['verified']} of {_files(d['files_total'])} identical by content digest on both ends")
    _out(f"{d['files_transferred']} transferred, {d['files_skipped']} skipped, {d['files_failed']} failed; "
         f"{format_bytes(d['bytes'])} in {d['seconds']:.2f} s ({rate}){reused}; exit {d['exit_code']}")


def _files(n: int) -> str:
    """``1 file``, ``2 files``."""
    return f"{n} file" if n == 1 else f"{n} files"


def cmd_verify(args) -> int:
    from automdt.protocol import read_secret
    from automdt.sender import TransferOptions, check_dest, run_transfer
    from automdt.units import parse_size

    try:
        check_dest(args.dest)
        opts = TransferOptions(verify_only=True, chunk_size=parse_size(args.chunk_size, "chunk size"),
                               encrypt=args.encrypt, timeout_s=args.timeout)
    except ValueError as e:
        raise AutomdtError(str(e), errors.USAGE) from None
    _check_encrypt_secret(args)
    if args.secret_file:
        opts.secret = read_secret(args.secret_file)
    summary = run_transfer(args.src, args.dest, opts)
    d = summary.as_dict()
    with interrupts.shielded():
        if args.json:
            _out(json.dumps({k: d.get(k) for k in ("files_total", "verified", "differences", "unreadable",
                                                   "exit_code", "errors")}))
        elif not args.quiet:
            for line in (d.get("differences") or []) + (d.get("unreadable") or []):
                _out(line)
            if summary.differences is None:  # it never got to compare: say why
                for err in summary.errors[:20]:
                    print(f"automdt: {err}", file=sys.stderr)
            _out(f"{d.get('verified', 0)} of {_files(d['files_total'])} identical; exit {d['exit_code']}")
    return summary.exit_code


def cmd_receive(args) -> int:
    import signal
    import threading

    from automdt.protocol import read_secret
    from automdt.receiver import ReceiverServer, check_root
    from automdt.units import parse_hostport, parse_size

    host, port = parse_hostport(args.listen)
    max_memory = parse_size(args.max_memory, "memory")
    disk = _receive_throttle(args.throttle)
    metrics_at = parse_hostport(args.metrics) if args.metrics else None
    if os.path.exists(args.root) and not os.path.isdir(args.root):
        raise AutomdtError(f"--root {args.root}: not a directory", errors.USAGE)
    check_root(args.root, what="--root")  # missing or not writable: exit 3 now, not at the first sender
    secret = read_secret(args.secret_file) if args.secret_file else None
    metrics = None
    if metrics_at is not None:
        from automdt.metrics import ReceiverMetrics

        metrics = ReceiverMetrics()
        metrics_port = metrics.serve(*metrics_at)
    try:
        server = ReceiverServer(args.root, host, port, secret=secret, max_threads=args.max_threads,
                                max_memory=max_memory, idle_timeout_s=args.idle_timeout, encrypt=args.encrypt,
                                max_sessions=args.max_sessions, metrics=metrics,
                                total_memory=parse_size(args.total_memory, "memory"),
                                total_threads=args.total_threads, total_connections=args.total_connections,
                                disk_throttle=disk, fair_share=args.fair_share)
    except AutomdtError:
        if metrics is not None:
            metrics.close()
        raise
    stop = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: stop.set())
    if metrics is not None and metrics_at is not None:
        log.info("metrics on http://%s:%d/metrics", metrics_at[0], metrics_port)
    log.info("receiving into %s on %s:%d", os.path.abspath(args.root), host, server.port)
    try:
        server.serve_forever(stop)
    finally:
        if metrics is not None:
            metrics.close()
    log.info("stopped after %d sessions", server.sessions_total)
    return 0


def cmd_demo(args) -> int:
    import shutil

    from automdt.sender import TransferOptions, run_transfer
    from automdt.units import format_bytes, parse_size, parse_threads

    base = args.dir
    created = not os.path.exists(base)
    src = os.path.join(base, "src")
    dst = os.path.join(base, "dst")
    total = parse_size(args.size, "size")
    try:
        os.makedirs(base, exist_ok=True)
    except OSError as e:
        raise AutomdtError(f"--dir {base}: cannot create: {e.strerror}", errors.USAGE) from None
    args.json, args.quiet = False, False
    try:
        made = make_sample_dataset(src, total)
        _out(f"sample dataset: {made[0]} files, {format_bytes(made[1])} in {src}; copying to {dst}")
        if args.threads:
            opts = TransferOptions(threads=parse_threads(args.threads))
        else:
            args.policy = None
            policy, threads, _ = _resolve_policy(args, 32)
            opts = TransferOptions(policy=policy, threads=threads, fallback=_fallback())
        summary = _run_with_display(args, lambda o: run_transfer(src, dst, o), opts)
        with interrupts.shielded():
            _report(summary, args)
        code = summary.exit_code
        if code == 0:
            check = run_transfer(src, dst, TransferOptions(verify_only=True))
            code = check.exit_code
            _out(f"verified: {check.verified} of {_files(check.files_total)} identical by content digest"
                 if code == 0 else f"verify: {'; '.join(check.errors[:3])}")
    finally:
        if not args.keep:
            with interrupts.shielded():
                for p in ((base,) if created else (src, dst)):
                    shutil.rmtree(p, ignore_errors=True)
                _out(f"removed {base if created else src + ' and ' + dst} (--keep keeps them)")
    if args.keep:
        _out(f"kept: compare them yourself with diff -r {src} {dst}")
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
    except IsADirectoryError:
        raise AutomdtError(f"{path}: is a directory, not a profile", errors.USAGE) from None
    except PermissionError:
        raise AutomdtError(f"{path}: profile not readable", errors.USAGE) from None
    except (ProfileError, UnicodeDecodeError) as e:
        raise AutomdtError(f"{path}: {str(e).splitlines()[0]}", errors.USAGE) from None


def _weak_path(path: str) -> str:
    stem, ext = os.path.splitext(path)
    return f"{stem}.weak{ext or '.yaml'}"


def cmd_explore(args) -> int:
    opts = _transfer_options(args)
    if args.duration < 3 * args.interval:
        raise AutomdtError("--duration must cover at least 3 intervals (--interval)", errors.USAGE)
    A.check_output_file(args.output, "-o")
    from automdt.explore import explore, exploration_plan, stage_report, weak_fit

    plan = exploration_plan(args.duration, opts, args.src if os.path.exists(args.src) else None)
    text = not args.json and not args.quiet
    if text:
        for line in _plan_lines(plan, opts):
            _out(line)
    res = explore(args.src, args.dest, args.duration, opts, seed=args.seed, plan=plan)
    prof = res["profile"]
    reasons = weak_fit(prof, res)
    target = args.output if not reasons or args.allow_weak_fit else _weak_path(args.output)
    with interrupts.shielded():
        where = A.save_result(target, prof.save, "profile")
    stages = stage_report(prof)
    evidence = _explore_evidence(prof)
    out = {"profile": where, "intervals": len(res["samples"]), "seconds": round(res["seconds"], 1),
           "rounds": res["rounds"], "weak_fit": reasons, "stages": stages, "evidence": evidence, "plan": plan}
    if args.json:
        _out(json.dumps(out))
    elif text:
        _out(f"profile written to {where} from {out['intervals']} intervals in {out['seconds']} s "
             f"({res['rounds']} round{'s' if res['rounds'] != 1 else ''}); rates in MB/s, 1 MB = 10^6 bytes as in --throttle")
        for name, st in stages.items():
            _out(f"  {name:5s}  per thread {_estimate(st, 'tpt')}   stage {_estimate(st, 'bandwidth')}")
        _out(_evidence_line(evidence))
    if reasons:
        why = "; ".join(reasons)
        if args.allow_weak_fit:
            print(f"automdt: weak fit (written anyway, --allow-weak-fit): {why}", file=sys.stderr)
        else:
            raise AutomdtError(f"weak fit, not written to {args.output}: {why}; the profile is in {where}; "
                               f"{_weak_advice(plan, res, evidence, args.src, opts)}, or accept it with --allow-weak-fit",
                               errors.WEAK_FIT)
    return 0


def _plan_lines(plan: dict, opts) -> List[str]:
    """What a trustworthy exploration needs (:func:`automdt.explore.exploration_plan`), as printed up front."""
    from automdt.explore import format_size
    from automdt.units import format_bytes

    have = "" if plan["dataset_bytes"] is None else \
        f"; SRC holds {'at least ' if plan['dataset_bytes'] >= plan['min_dataset_bytes'] else ''}{format_size(plan['dataset_bytes'])}"
    lines = [f"explore: a trustworthy fit needs about {plan['min_intervals']} intervals ({plan['min_duration_s']:g} s at "
             f"--interval {opts.interval_s:g} s: every stage probed {plan['probes_per_stage']} times) and at least "
             f"{format_size(plan['min_dataset_bytes'])} of data per round (a probe at --max-threads {opts.max_threads} "
             f"with a chunk of --chunk-size {format_bytes(opts.chunk_size)} per thread per interval){have}"]
    return lines + [f"explore: {note}" for note in plan["notes"]]


def _explore_evidence(prof) -> dict:
    """What the exploration delivered and what the profile promises (``--json``'s ``evidence``)."""
    from automdt.simulator.oracle import oracle

    ev = dict((prof.meta.get("fit") or {}).get("evidence") or {})
    best = oracle(prof)
    ev.update(oracle_threads=list(best.threads), oracle_bps=best.throughput_bps)
    return ev


def _evidence_line(ev: dict) -> str:
    """The last line of explore's report: what the path delivered, which stage was seen limiting
    it, and the optimum the profile promises."""
    from automdt.explore import format_rate

    seen = ", ".join(ev.get("seen_limiting") or []) or "no stage"
    head = "" if "max_bps" not in ev else \
        f"the exploration delivered at most {format_rate(ev['max_bps'])} (noise margin {ev['margin']:.0%}); "
    return (f"{head}seen limiting the path: {seen}; the profile's optimum: {format_rate(ev['oracle_bps'])} with "
            f"{','.join(str(n) for n in ev['oracle_threads'])} (read,net,write) threads")


def _weak_advice(plan: dict, res: dict, evidence: dict, src: str, opts) -> str:
    """What would make the next exploration's fit trustworthy: the plan's minimum duration, and
    data for rounds of a probe's length at the rate seen."""
    from automdt.explore import data_needed, dataset_bytes, format_size

    more = []
    if res["seconds"] < plan["min_duration_s"] or len(res["samples"]) < plan["min_intervals"]:
        more.append(f"for at least {plan['min_duration_s']:g} s")
    need = data_needed(plan, float(evidence.get("max_bps") or 0.0), opts.interval_s)
    if plan["dataset_bytes"] is not None and dataset_bytes(src, enough=need) < need:
        more.append(f"with at least {format_size(need)} of data")
    return "explore " + (" and ".join(more) if more else "longer or with more data")


def _estimate(st: dict, key: str) -> str:
    """One value of a stage line: measured (spread, samples) or a lower bound, and why."""
    from automdt.explore import format_rate

    value = format_rate(st[key])
    seen = key == "bandwidth" and st.get("seen_limiting")
    if st[f"{key}_measured"]:
        spread = st[f"{key}_spread"]
        pm = f"±{spread:.0%}" if spread >= 0.005 else "±<1%"
        return f"{value} ({pm}, {st['samples_used']} samples{'; seen limiting the path' if seen else ''})"
    if key == "bandwidth" and st.get("capped"):
        return f">= {value} (lower bound, capped at the highest delivered rate)"
    if seen:  # threads were the limit: the stage's capacity at --max-threads was seen, its plateau never
        return f">= {value} (lower bound; seen limiting the path at --max-threads)"
    return f">= {value} (lower bound{', ' + str(st['samples_used']) + ' samples' if key == 'tpt' else ''})"


def cmd_train(args) -> int:
    require(TRAIN_MODULES, "train")
    profile = _load_profile(args.profile) if args.profile else None
    if os.path.isdir(args.output):
        raise AutomdtError(f"-o {args.output}: is a directory (name the policy file, e.g. {args.output.rstrip('/')}/policy.zip)",
                           errors.USAGE)
    out = args.output if args.output.endswith(".zip") else args.output + ".zip"
    for path, what in ((out, "-o"), (out + ".json", "-o (sidecar)")):
        A.check_output_file(path, what)
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
    if profile is not None:
        return _train_tuned(args, profile, out)
    from automdt.agents.training import train

    rep = train(None, out, timesteps=args.timesteps, seed=args.seed, k=args.k, random_profiles=True,
                progress=not args.no_progress and sys.stderr.isatty(), target_fraction=args.target,
                max_seconds=args.max_seconds, tensorboard_log=args.tensorboard)
    _out(f"policy written to {rep.model_path} ({rep.timesteps} steps in {rep.wall_s:.0f} s); "
         f"{rep.fraction_of_oracle:.1%} of the oracle's utility; curve {rep.curve_png}")
    if not rep.reached_target:
        _target_missed(args, rep.fraction_of_oracle, rep.stop_reason)
    return 0


def _target_missed(args, fraction: float, reason: str) -> None:
    why = (f"--max-seconds {args.max_seconds:g} ran out" if reason == "max_seconds" else
           "the step budget (--timesteps) ran out" if reason == "timesteps" else str(reason))
    print(f"automdt: target missed: {fraction:.3f} of the oracle, below --target {args.target:g} "
          f"({why}); the policy is written, train longer for a better one", file=sys.stderr)
    _out(f"target {args.target:g} NOT reached ({fraction:.3f}; {why})")


_LEARNED = {"network": "the default controller with the trained selector, from the profile's optimum",
            "prior": "the default controller from the profile's optimum (the trained selector did not pay off on "
                     "the validation paths)",
            "none": "the default controller as it is (neither the selector nor the profile's start paid off on "
                    "the validation paths)"}


def _train_tuned(args, profile, out: str) -> int:
    """``train --profile``: the default controller plus a learned part, validated against the default."""
    from automdt.agents.tuned_training import train_tuned

    rep = train_tuned(profile, out, timesteps=args.timesteps, seed=args.seed, k=args.k,
                      max_seconds=args.max_seconds, progress=not args.no_progress and sys.stderr.isatty(),
                      tensorboard_log=args.tensorboard, profile_path=args.profile)
    v, d = rep.validation[rep.learned], rep.validation["none"]
    _out(f"policy written to {rep.model_path} ({rep.timesteps} steps, {rep.wall_s:.0f} s): {_LEARNED[rep.learned]}")
    _out(f"validation, fraction of the oracle (this file / the default controller): path as explored "
         f"{v['explored']:.3f} / {d['explored']:.3f}; path changed after exploring {v['changed']:.3f} / {d['changed']:.3f}")
    _out(f"run it with: automdt transfer SRC DEST --policy {rep.model_path}  (under the shield; curve {rep.curve_csv})")
    if rep.fraction_on_profile < args.target:
        _target_missed(args, rep.fraction_on_profile, rep.stop_reason)
    return 0


def cmd_simulate(args) -> int:
    if args.policy.strip().lower() != "oracle":
        _check_policy(args)
    profile = _load_profile(args.profile)
    from automdt.agents.registry import make_policy
    from automdt.simulator.oracle import evaluate_policy_in_sim, oracle

    kw = {"profile": profile} if args.policy.strip().lower() == "oracle" else {}
    try:
        pol = make_policy(args.policy, max_threads=profile.max_threads, **kw)
    except (ValueError, TypeError, OSError, ImportError, AttributeError) as e:
        raise _policy_error(e) from None
    traj = evaluate_policy_in_sim(pol, profile, steps=args.steps, seed=args.seed, k=args.k)
    orc = oracle(profile, args.k)
    out = {"policy": getattr(pol, "name", args.policy), "fraction_of_oracle": round(float(traj.fraction_of_oracle), 4),
           "oracle_threads": list(orc.threads), "policy_threads": [int(x) for x in traj.settled_threads],
           "oracle_utility": round(float(orc.utility), 4), "oracle_throughput_bps": float(orc.throughput_bps),
           "policy_throughput_bps": round(float(traj.mean_throughput_bps), 1), "steps": args.steps, "seed": args.seed}
    if args.json:
        _out(json.dumps(out))
    else:
        _out(f"{out['policy']}: {out['fraction_of_oracle']:.1%} of the oracle; settles on {out['policy_threads']} "
             f"(oracle {out['oracle_threads']})")
    return 0


def cmd_tune(args) -> int:
    require(TRAIN_MODULES + ("optuna",), "tune")
    from automdt.tune import print_tune, tune

    print_tune(tune(args), args.json)
    return 0


def cmd_exit_codes(args) -> int:
    for code, meaning in sorted(errors.EXIT_CODES.items()):
        _out(f"{code:>4}  {meaning}")
    return 0


COMMANDS = {"transfer": cmd_transfer, "verify": cmd_verify, "receive": cmd_receive, "demo": cmd_demo, "explore": cmd_explore,
            "train": cmd_train, "simulate": cmd_simulate, "tune": cmd_tune, "exit-codes": cmd_exit_codes}


class _Logging:
    """stderr (and --log-file) logging for one command; undone afterwards (``main`` may be called
    more than once in a process)."""

    def __init__(self, args):
        self.args = args
        self.handlers: List[logging.Handler] = []
        self.root = logging.getLogger()
        self.level = self.root.level

    def __enter__(self) -> "_Logging":
        a = self.args
        daemon = a.command == "receive"
        console = logging.StreamHandler(sys.stderr)
        fmt = "%(asctime)s automdt: %(message)s" if daemon else "automdt: %(message)s"
        console.setFormatter(logging.Formatter(fmt))
        quiet = getattr(a, "quiet", False)
        console.setLevel(logging.DEBUG if a.debug else logging.ERROR if quiet else
                         logging.INFO if daemon else logging.WARNING)
        console.addFilter(lambda record: not getattr(record, "file_only", False))
        self.handlers.append(console)
        if getattr(a, "log_file", None):
            from logging.handlers import WatchedFileHandler

            A.check_append_file(a.log_file, "--log-file")
            try:
                h = WatchedFileHandler(a.log_file)
            except OSError as e:
                raise AutomdtError(f"--log-file {a.log_file}: {e.strerror}", errors.USAGE) from None
            h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            h.setLevel(logging.DEBUG if a.debug else logging.INFO)
            self.handlers.append(h)
            self.file_handler = h
        for handler in self.handlers:
            self.root.addHandler(handler)
        self.root.setLevel(logging.DEBUG if a.debug else logging.INFO)
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handlers:
            self.root.removeHandler(h)
            h.close()
        self.root.setLevel(self.level)

    def to_file(self, level: int, message: str) -> None:
        h = getattr(self, "file_handler", None)
        if h is not None:
            h.handle(logging.makeLogRecord({"name": "automdt", "levelno": level,
                                            "levelname": logging.getLevelName(level), "msg": message}))


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    # a signal during the start-up is acted on once the command can report it (interrupts.ready)
    with interrupts.handling(start_shielded=True, process_exit=argv is None):
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # --help, --version, or a usage error (already printed, one line)
            return e.code if isinstance(e.code, int) else errors.USAGE
        except Interrupted as e:
            return e.code
        # AUTOMDT_DEBUG mirrors --debug (the engine reads it at import too)
        args.debug = bool(getattr(args, "debug", False)) or os.environ.get("AUTOMDT_DEBUG", "0") not in ("", "0")
        if args.command is None:
            parser.print_help()
            return errors.USAGE
        return _run_command(args)


# Commands that drive a live transfer: their policy inference is one small matrix product per
# control interval, so numpy's BLAS needs no thread pool (OpenBLAS starts one per core at import,
# which lengthens the import and takes CPU time from the transfer's own threads).
LIVE_COMMANDS = ("transfer", "receive", "explore", "verify")


def _run_command(args) -> int:
    logs = None
    if args.command in LIVE_COMMANDS:
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
            os.environ.setdefault(var, "1")  # a user's own setting stays
    from automdt.transfer_engine import _engine, switches

    # --switch and --debug hold for this command (main() may run more than once in a process)
    previous = switches.configure(switches.Switches.parse(getattr(args, "switch", None)))
    was_debug = _engine.set_debug(True) if args.debug else None
    try:
        logs = _Logging(args).__enter__()
        if args.command != "transfer":  # (transfer acts on it where it can still write its summary)
            interrupts.ready()
        code = COMMANDS[args.command](args)
        logs.to_file(logging.INFO if code == 0 else logging.WARNING, f"{args.command} finished with exit code {code}")
        return code
    except AutomdtError as e:
        if not (getattr(args, "quiet", False) and e.code in QUIET_CODES):
            print(f"automdt: {e.message}", file=sys.stderr)
        if logs is not None:
            logs.to_file(logging.ERROR, f"{e.message} (exit {e.code})")
        return e.code
    except Interrupted as e:
        print("automdt: interrupted", file=sys.stderr)
        if logs is not None:
            logs.to_file(logging.WARNING, f"interrupted (exit {e.code})")
        return e.code
    except BrokenPipeError:
        _silence_stdout()
        print("automdt: output closed early (broken pipe)", file=sys.stderr)
        return errors.ERROR
    except Exception as e:  # a bug: still one line unless --debug
        if args.debug:
            raise
        extra = extra_of(e) if isinstance(e, ModuleNotFoundError) else None
        if extra is not None:  # an optional package not checked beforehand (a MODULE:FACTORY policy on torch)
            print(f"automdt: {args.command} needs {getattr(e, 'name', None)}, which this install lacks: "
                  f"pip install 'automdt[{extra}]'", file=sys.stderr)
            return errors.USAGE
        print(f"automdt: internal error: {type(e).__name__}: {e} (re-run with --debug for details)", file=sys.stderr)
        return errors.ERROR
    finally:
        switches.configure(previous)
        if was_debug is not None:
            _engine.set_debug(was_debug)
        if logs is not None:
            with interrupts.shielded():
                logs.__exit__(None, None, None)


if __name__ == "__main__":
    sys.exit(main())
