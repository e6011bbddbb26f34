#!/usr/bin/env python3
"""The data path's targets in one run: AutoMDT against GridFTP, cp and iperf3 (issue 11).

Sections (``--only NAME[,NAME]``), each run interleaved with its peers (ours, peer, ours, peer,
...) after one untimed warm-up of every contender, medians of ``--reps`` rounds (default 5):

  local    tmpfs to tmpfs on one host: `automdt transfer SRC DIR` (the default command, as a user
           types it) and `--threads 4,4,4` (static), against `globus-url-copy -fast` to a
           loopback `globus-gridftp-server` (-cc 4 -p 4 and a few other settings: the best one
           counts too) and `cp -r` (the local ceiling). Target: >= 1.3x GridFTP's speed.
  netns    the same between two network namespaces joined by a veth pair without a rate limit:
           `automdt receive` / the GridFTP server in B, the client in A. Target: >= 1.3x.
  link     the same veth limited by tc (tbf, or --qdisc htb) to 5 Gbit/s: automdt --threads
           2,N,2 and the default command against `iperf3 -P N` (N = 2, 4), plain and
           --encrypt. Targets: >= 0.95x iperf3, encrypted >= 0.95x plain.
  encrypt  --encrypt against plain, speed and CPU: a local destination (both take the local link,
           nothing is encrypted) and a receiving daemon on 127.0.0.1 (TLS over loopback TCP against
           plain loopback TCP; and TLS with --switch tls_batch=0, one socket call per record, as
           before 2026-11-24). Target: >= 0.8x.

Every run's figures: wall time of the whole command (start-up included), Gbit/s, and CPU
seconds per GB of both ends together: the local command's own rusage (both ends are in it),
or the sending command's rusage plus the receiving daemon's CPU during the run (automdt
receive: utime + stime from /proc; globus-gridftp-server: its own and its reaped per-session
children's). For automdt also its in-process time (`--json` "seconds", without the
interpreter's start-up) and its peak RSS against the staging-buffer caps.

Datasets (random data, generated once under --data-dir, default /dev/shm/amdt-bench11-<pid>,
removed at the end unless --data-dir is given): large 8 x 256 MiB, small 2000 x 1 MiB, tiny
20,000 x 64 KiB (`--datasets large,small,tiny`). The machine is a shared 2-core VM: wall-time
ratios taken while others work are noisy (the header prints the load); CPU-seconds per GB much
less so.

    .venv/bin/python benchmarks/bench_datapath.py                         # everything, ~30-45 min
    .venv/bin/python benchmarks/bench_datapath.py --only local --datasets large --reps 3
    .venv/bin/python benchmarks/bench_datapath.py --quick --reps 1        # small sizes, a smoke run

Needs root (namespaces, the GridFTP server's setuid to 'nobody'), and Debian's iperf3,
globus-gass-copy-progs and globus-gridftp-server-progs (installed with apt-get when missing and
root; otherwise that peer is skipped with the reason). Every process it starts is ended by its
PID; namespaces (amdt-b11A/B-<pid>-<tag>) and scratch directories are removed at exit.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import pwd
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_engine import (PROCS, automdt_argv, destination, fresh_dir, gbit, median, room_for,  # noqa: E402
                          run_timed, say, timeout_for, wait_port, free_port)
from automdt.experiments.netns import NetnsPair, netns_available, reap_stale  # noqa: E402
from profile_engine import generate, proc_cpu  # noqa: E402

MiB = 1 << 20
SECTIONS = ("local", "netns", "link", "encrypt")
SPECS = {"large": (8, 256 * MiB), "small": (2000, MiB), "tiny": (20000, 64 << 10)}
QUICK = {"large": (4, 32 * MiB), "small": (200, MiB), "tiny": (2000, 64 << 10)}
NS_PREFIX = "amdt-b11"
APT = ["iperf3", "globus-gass-copy-progs", "globus-gridftp-server-progs"]


class DS:
    def __init__(self, name: str, path: str, nfiles: int, size: int) -> None:
        self.name, self.path, self.nfiles, self.size = name, path, nfiles, size
        self.total = nfiles * size

    def label(self) -> str:
        return f"{self.nfiles} x {self.size // 1024} KiB" if self.size < MiB else f"{self.nfiles} x {self.size // MiB} MiB"


class Sample(dict):
    """One run: wall_s, cpu_s (both ends), bytes; automdt also engine_s, maxrss_mib, net_threads."""


def count_tree(root: str) -> Tuple[int, int]:
    n = size = 0
    for dp, _, fns in os.walk(root):
        for fn in fns:
            n += 1
            size += os.lstat(os.path.join(dp, fn)).st_size
    return n, size


def check(dest: str, ds: DS, who: str) -> None:
    got = count_tree(dest)
    if got != (ds.nfiles, ds.total):
        raise RuntimeError(f"{who}: destination has {got[0]} files / {got[1]} bytes, expected {ds.nfiles} / {ds.total}")


def tree_cpu(pid: int) -> float:
    """CPU seconds of a daemon: its own (all threads) plus its reaped children's (fields 14-17)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def settle_children(pid: int, timeout: float = 5.0) -> None:
    """Wait until a forking server has reaped its per-session children (their CPU then counts)."""
    import psutil

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if not psutil.Process(pid).children():
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)


# ----------------------------------------------------------------------------- contenders
class Ctx:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.scratch = os.path.join("/dev/shm", f"{args.prefix or 'amdt-'}bench11-{os.getpid()}")
        os.makedirs(self.scratch)
        os.chmod(self.scratch, 0o755)
        self.data_root = args.data_dir or os.path.join(self.scratch, "data")
        os.makedirs(self.data_root, exist_ok=True)
        os.chmod(self.data_root, 0o755)
        self.automdt = automdt_argv()
        self.nobody = pwd.getpwnam("nobody").pw_uid
        self.secret = os.path.join(self.scratch, "secret")
        with open(os.open(self.secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        self.sets: Dict[str, DS] = {}

    def dataset(self, name: str) -> DS:
        if name not in self.sets:
            nfiles, size = (QUICK if self.args.quick else SPECS)[name]
            ok, why = room_for(2 * nfiles * size)
            if not ok and not os.path.exists(os.path.join(self.data_root, f"{nfiles}x{size}.complete")):
                raise RuntimeError(why)
            t0 = time.perf_counter()
            path = generate(self.data_root, nfiles, size)
            if time.perf_counter() - t0 > 1:
                say(f"  (generated {nfiles} x {size} bytes in {time.perf_counter() - t0:.0f} s)")
            self.sets[name] = DS(name, path, nfiles, size)
        return self.sets[name]

    def cleanup(self) -> None:
        PROCS.stop_all()
        shutil.rmtree(self.scratch, ignore_errors=True)


def ours(ctx: Ctx, ds: DS, dest: str, args: Sequence[str], prefix: Sequence[str] = (),
         rx_pid: Optional[int] = None, verify: Optional[str] = None) -> Sample:
    argv = list(prefix) + ctx.automdt + ["transfer", ds.path, dest, "--json"] + list(args)
    cpu0 = proc_cpu(rx_pid) if rx_pid else 0.0
    r = run_timed(argv, timeout_for(ds.total) + 60, ctx.scratch)
    rx = proc_cpu(rx_pid) - cpu0 if rx_pid else 0.0
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    try:
        js = json.loads(last)
    except ValueError:
        raise RuntimeError(f"automdt transfer exit {r.rc}, no JSON summary: {r.stderr.strip()[-400:]}") from None
    if r.rc != 0 or js.get("exit_code") != 0 or js.get("files_transferred") != ds.nfiles:
        raise RuntimeError(f"automdt transfer exit {r.rc}: {js.get('errors') or r.stderr.strip()[-400:]}")
    if verify:
        check(verify, ds, "automdt")
    return Sample(wall_s=r.wall, engine_s=js["seconds"], cpu_s=r.cpu_s + rx, cpu_sender_s=r.cpu_s, cpu_receiver_s=rx,
                  bytes=ds.total, maxrss_mib=r.maxrss_kib / 1024, net_threads=js.get("threads", {}).get("net"))


class GridFTPServer:
    """globus-gridftp-server in anonymous clear-text mode (-aa, setuid to 'nobody'), on 127.0.0.1
    or inside a namespace."""

    def __init__(self, ctx: Ctx, host: str = "127.0.0.1", wrap: Sequence[str] = (), port: Optional[int] = None,
                 in_a: Sequence[str] = ()) -> None:
        self.ctx, self.host = ctx, host
        self.port = port or free_port()
        self.dst = fresh_dir(os.path.join(ctx.scratch, f"gridftp-dst-{self.port}"), owner=ctx.nobody)
        self.log = open(os.path.join(ctx.scratch, f"gridftp-{self.port}.log"), "wb")
        self.proc = PROCS.start(list(wrap) + ["globus-gridftp-server", "-aa", "-anonymous-user", "nobody",
                                              "-p", str(self.port), "-control-interface", host,
                                              "-data-interface", host, "-home-dir", "/"],
                                stdout=self.log, stderr=subprocess.STDOUT)
        wait_port(host, self.port, 20, self.proc, in_a)

    def run(self, ds: DS, cc: int, p: int, pp: bool, prefix: Sequence[str] = ()) -> Sample:
        d = os.path.join(self.dst, "d")
        with destination(d, ds, owner=self.ctx.nobody):
            argv = list(prefix) + ["globus-url-copy", "-cc", str(cc), "-p", str(p), "-fast"] + (["-pp"] if pp else []) + \
                ["-r", f"file://{ds.path}/", f"ftp://{self.host}:{self.port}{d}/"]
            cpu0 = tree_cpu(self.proc.pid)
            r = run_timed(argv, timeout_for(ds.total) + 60, self.ctx.scratch)
            settle_children(self.proc.pid)
            srv = tree_cpu(self.proc.pid) - cpu0
            if r.rc != 0:
                raise RuntimeError(f"globus-url-copy exit {r.rc}: {(r.stderr or r.stdout).strip()[-300:]}")
            check(d, ds, "globus-url-copy")
        return Sample(wall_s=r.wall, cpu_s=r.cpu_s + srv, cpu_sender_s=r.cpu_s, cpu_receiver_s=srv, bytes=ds.total)

    def close(self) -> None:
        PROCS.stop(self.proc)
        self.log.close()
        shutil.rmtree(self.dst, ignore_errors=True)


def gridftp_settings(ds: DS) -> List[Tuple[int, int, bool]]:
    """(cc, p, pipelining): the issue's -cc 4 -p 4 first, then the candidates for 'its best'."""
    if ds.nfiles <= 16:
        return [(4, 4, False), (2, 2, False), (8, 2, False)]
    return [(4, 4, False), (8, 1, True), (16, 1, True)]


def gridftp_name(cc: int, p: int, pp: bool) -> str:
    return f"globus-url-copy -fast -cc {cc} -p {p}{' -pp' if pp else ''}"


def cp_run(ctx: Ctx, ds: DS) -> Sample:
    d = os.path.join(ctx.scratch, "cp-dst")
    with destination(d, ds):
        r = run_timed(["cp", "-r", ds.path + "/.", d], timeout_for(ds.total), ctx.scratch)
        if r.rc != 0:
            raise RuntimeError(f"cp exit {r.rc}: {r.stderr.strip()[-300:]}")
        check(d, ds, "cp")
    return Sample(wall_s=r.wall, cpu_s=r.cpu_s, bytes=ds.total)


def measure(ctx: Ctx, contenders: List[Tuple[str, Callable[[], Sample]]]) -> Dict[str, List[Sample]]:
    """One untimed warm-up run of each, then --reps interleaved rounds."""
    for name, fn in contenders:
        fn()
    out: Dict[str, List[Sample]] = {k: [] for k, _ in contenders}
    for i in range(ctx.args.reps):
        for name, fn in contenders:
            out[name].append(fn())
    return out


def med(samples: List[Sample], key: str) -> float:
    return median([s[key] for s in samples if s.get(key) is not None])


def summarize(ds: DS, runs: Dict[str, List[Sample]]) -> Dict[str, Dict[str, float]]:
    rows = {}
    for name, ss in runs.items():
        wall = med(ss, "wall_s")
        row = {"wall_s": wall, "gbit": gbit(ds.total, wall), "cpu_s_per_gb": med(ss, "cpu_s") / (ds.total / 1e9)}
        if ss and "engine_s" in ss[0]:
            row["inprocess_gbit"] = gbit(ds.total, med(ss, "engine_s"))
            row["maxrss_mib"] = max(s["maxrss_mib"] for s in ss)
        if ss and ss[0].get("cpu_receiver_s"):
            row["cpu_sender_s_per_gb"] = med(ss, "cpu_sender_s") / (ds.total / 1e9)
            row["cpu_receiver_s_per_gb"] = med(ss, "cpu_receiver_s") / (ds.total / 1e9)
        rows[name] = row
    return rows


def print_rows(rows: Dict[str, Dict[str, float]]) -> None:
    for name, r in rows.items():
        extra = f", in-process {r['inprocess_gbit']:.2f} Gbit/s" if "inprocess_gbit" in r else ""
        split = ""
        if "cpu_sender_s_per_gb" in r:
            split = f" (sender {r['cpu_sender_s_per_gb']:.2f} + receiver {r['cpu_receiver_s_per_gb']:.2f})"
        say(f"    {name:<44} {r['wall_s']:7.2f} s {r['gbit']:6.2f} Gbit/s{extra}; "
            f"CPU {r['cpu_s_per_gb']:.2f} s/GB{split}")


def ratios(rows: Dict[str, Dict[str, float]], ours_names: Sequence[str], target: float) -> Dict[str, Any]:
    """Speed of each of ours against GridFTP -cc 4 -p 4 and against GridFTP's best setting."""
    peers = {k: v for k, v in rows.items() if k.startswith("globus-url-copy")}
    if not peers:
        return {}
    ref = gridftp_name(4, 4, False)
    best = min(peers, key=lambda k: peers[k]["wall_s"])
    out: Dict[str, Any] = {"gridftp_best": best}
    for o in ours_names:
        if o not in rows:
            continue
        a = peers[ref]["wall_s"] / rows[o]["wall_s"] if ref in peers else float("nan")
        b = peers[best]["wall_s"] / rows[o]["wall_s"]
        out[o] = {"vs_cc4_p4": a, "vs_best": b}
        met = "met" if min(a, b) >= target else "NOT met"
        say(f"    {o}: {a:.2f}x GridFTP -cc 4 -p 4, {b:.2f}x its best ({best.split('-fast ')[1]}) "
            f"[target >= {target:g}x: {met}]")
    return out


# ----------------------------------------------------------------------------- sections
# A local transfer hands chunks to its in-process receiver over the local link; this switch makes
# it use loopback TCP instead (the path of every local transfer before the link).
NO_LINK = ["--switch", "local_link=0"]
TCP_ROW = "automdt --threads 4,4,4, loopback TCP"


def section_local(ctx: Ctx) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    srv = None
    try:
        srv = GridFTPServer(ctx)
    except Exception as e:  # noqa: BLE001 - reported, the section goes on without the peer
        out["gridftp_unavailable"] = str(e)
        say(f"  GridFTP unavailable: {e}")
    try:
        for name in ctx.args.datasets:
            ds = ctx.dataset(name)
            dest = os.path.join(ctx.scratch, "local-dst")

            def run(args: Sequence[str]) -> Sample:
                with destination(dest, ds):
                    return ours(ctx, ds, dest, args, verify=dest)

            cont: List[Tuple[str, Callable[[], Sample]]] = [
                ("automdt (default command)", lambda: run([])),
                ("automdt --threads 4,4,4", lambda: run(["--threads", "4,4,4"])),
                # the same over loopback TCP instead of the local link: what the link buys
                (TCP_ROW, lambda: run(["--threads", "4,4,4"] + NO_LINK))]
            if srv is not None:
                for cc, p, pp in gridftp_settings(ds):
                    cont.append((gridftp_name(cc, p, pp), lambda cc=cc, p=p, pp=pp: srv.run(ds, cc, p, pp)))
            cont.append(("cp -r (local ceiling)", lambda: cp_run(ctx, ds)))
            say(f"  {ds.label()} ({ds.total / 1e9:.2f} GB), tmpfs to tmpfs, medians of {ctx.args.reps}:")
            runs = measure(ctx, cont)
            rows = summarize(ds, runs)
            print_rows(rows)
            rat = ratios(rows, ["automdt (default command)", "automdt --threads 4,4,4", TCP_ROW], 1.3)
            cap = 2 * 256  # local mode: two staging buffers of the default --memory 256Mi
            for o in ("automdt (default command)", "automdt --threads 4,4,4"):
                say(f"    {o}: peak RSS {rows[o]['maxrss_mib']:.0f} MiB (staging caps 2 x 256 MiB = {cap} MiB "
                    f"+ the interpreter)")
            out[name] = {"label": ds.label(), "rows": rows, "ratios": rat, "samples": runs}
    finally:
        if srv is not None:
            srv.close()
    return out


def _receiver(ctx: Ctx, link: NetnsPair, port: int, root: str, extra: Sequence[str] = ()) -> subprocess.Popen:
    log = open(os.path.join(ctx.scratch, f"receiver-{port}.log"), "wb")
    p = PROCS.start(link.exec_argv("b", ctx.automdt + ["receive", "--listen", f"{link.addr_b}:{port}", "--root", root,
                                                       "--secret-file", ctx.secret, "--idle-timeout", "300"] + list(extra)),
                    stdout=log, stderr=subprocess.STDOUT)
    wait_port(link.addr_b, port, 30, p, link.exec_argv("a", []))
    return p


def section_netns(ctx: Ctx) -> Dict[str, Any]:
    ok, why = netns_available()
    if not ok:
        return {"skipped": why}
    out: Dict[str, Any] = {}
    link = NetnsPair(rate=None, prefix=ctx.args.prefix or NS_PREFIX).open()
    srv = rx = None
    try:
        in_a = link.exec_argv("a", [])
        root = fresh_dir(os.path.join(ctx.scratch, "netns-dst"))
        rx = _receiver(ctx, link, 47201, root)
        try:
            srv = GridFTPServer(ctx, host=link.addr_b, wrap=link.exec_argv("b", []), port=47202, in_a=in_a)
        except Exception as e:  # noqa: BLE001
            out["gridftp_unavailable"] = str(e)
            say(f"  GridFTP unavailable: {e}")
        for name in ctx.args.datasets:
            ds = ctx.dataset(name)

            def run(args: Sequence[str]) -> Sample:
                with destination(root, ds, keep_dir=True):
                    return ours(ctx, ds, f"{link.addr_b}:47201", list(args) + ["--secret-file", ctx.secret],
                                prefix=in_a, rx_pid=rx.pid, verify=root)

            cont: List[Tuple[str, Callable[[], Sample]]] = [
                ("automdt (default command)", lambda: run([])),
                ("automdt --threads 4,4,4", lambda: run(["--threads", "4,4,4"]))]
            if srv is not None:
                for cc, p, pp in gridftp_settings(ds):
                    cont.append((gridftp_name(cc, p, pp), lambda cc=cc, p=p, pp=pp: srv.run(ds, cc, p, pp, prefix=in_a)))
            say(f"  {ds.label()} ({ds.total / 1e9:.2f} GB), namespace A -> B over an unlimited veth, "
                f"medians of {ctx.args.reps}:")
            runs = measure(ctx, cont)
            rows = summarize(ds, runs)
            print_rows(rows)
            rat = ratios(rows, ["automdt (default command)", "automdt --threads 4,4,4"], 1.3)
            out[name] = {"label": ds.label(), "rows": rows, "ratios": rat, "samples": runs}
    finally:
        if srv is not None:
            srv.close()
        if rx is not None:
            PROCS.stop(rx)
        link.close()
    return out


def section_link(ctx: Ctx) -> Dict[str, Any]:
    ok, why = netns_available()
    if not ok:
        return {"skipped": why}
    if shutil.which("iperf3") is None:
        return {"skipped": "iperf3 not installed (apt-get install -y iperf3)"}
    rate = "1gbit" if ctx.args.quick else ctx.args.rate
    ds = ctx.dataset("large")
    out: Dict[str, Any] = {"rate": rate, "qdisc": ctx.args.qdisc, "dataset": ds.label(), "rows": []}
    link = NetnsPair(rate=rate, qdisc=ctx.args.qdisc, prefix=ctx.args.prefix or NS_PREFIX).open()
    rx = rx_enc = ip = None
    try:
        in_a = link.exec_argv("a", [])
        root = fresh_dir(os.path.join(ctx.scratch, "link-dst"))
        root_enc = fresh_dir(os.path.join(ctx.scratch, "link-dst-enc"))
        rx = _receiver(ctx, link, 47211, root)
        rx_enc = _receiver(ctx, link, 47213, root_enc, ["--encrypt"])  # CURVE needs a receiver started so
        ip = PROCS.start(link.exec_argv("b", ["iperf3", "-s", "-B", link.addr_b, "-p", "47212"]),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(link.addr_b, 47212, 10, ip, in_a)
        seconds = 2 if ctx.args.quick else 6
        say(f"  veth {ctx.args.qdisc} {rate}, {ds.label()}; automdt in-process Gbit/s (wall in brackets) against "
            f"iperf3 -P N -t {seconds} -O 1 (receiver side); --encrypt against plain")

        def run(args: Sequence[str]) -> Sample:
            enc = "--encrypt" in args
            d, port, pid = (root_enc, 47213, rx_enc.pid) if enc else (root, 47211, rx.pid)
            with destination(d, ds, keep_dir=True):
                return ours(ctx, ds, f"{link.addr_b}:{port}", list(args) + ["--secret-file", ctx.secret],
                            prefix=in_a, rx_pid=pid, verify=d)

        def iperf(n: int) -> Sample:
            argv = in_a + ["iperf3", "-c", link.addr_b, "-p", "47212", "-P", str(n), "-t", str(seconds), "-O", "1", "-J"]
            for _ in range(3):
                r = run_timed(argv, seconds + 30, ctx.scratch)
                try:
                    js = json.loads(r.stdout)
                    return Sample(gbit_rx=js["end"]["sum_received"]["bits_per_second"] / 1e9)
                except (ValueError, KeyError):
                    time.sleep(1)
            raise RuntimeError(f"iperf3 failed: {r.stderr.strip()[-300:]}")

        for n in (2, 4):
            cont = [(f"automdt --threads 2,{n},2", lambda n=n: run(["--threads", f"2,{n},2"])),
                    (f"iperf3 -P {n}", lambda n=n: iperf(n)),
                    (f"automdt --threads 2,{n},2 --encrypt", lambda n=n: run(["--threads", f"2,{n},2", "--encrypt"]))]
            if n == 4:
                cont.insert(0, ("automdt (default command)", lambda: run([])))
            runs = measure(ctx, cont)
            ip_g = median([s["gbit_rx"] for s in runs[f"iperf3 -P {n}"]])
            for name, ss in runs.items():
                if name.startswith("iperf3"):
                    continue
                g = gbit(ds.total, med(ss, "engine_s"))
                gw = gbit(ds.total, med(ss, "wall_s"))
                row = {"name": name, "streams": n, "gbit": g, "gbit_wall": gw, "iperf3_gbit": ip_g, "ratio": g / ip_g,
                       "cpu_s_per_gb": med(ss, "cpu_s") / (ds.total / 1e9), "samples": ss}
                out["rows"].append(row)
                line = f"    {name:<40} {g:5.2f} ({gw:.2f}) Gbit/s vs iperf3 -P {n} {ip_g:.2f}: {g / ip_g:.2f}x"
                if "encrypt" in name:
                    plain = gbit(ds.total, med(runs[f"automdt --threads 2,{n},2"], "engine_s"))
                    row["ratio_to_plain"] = g / plain
                    line += f"; {g / plain:.2f}x plain [target >= 0.95x: {'met' if g / plain >= 0.95 else 'NOT met'}]"
                else:
                    line += f" [target >= 0.95x: {'met' if g / ip_g >= 0.95 else 'NOT met'}]"
                if name.startswith("automdt (default"):
                    line += f" (the policy's network threads at the end: {ss[-1].get('net_threads')})"
                say(line + f"; CPU {row['cpu_s_per_gb']:.2f} s/GB")
        out["qdisc_stats"] = link.qdisc_show("a").strip()
    finally:
        for p in (ip, rx, rx_enc):
            if p is not None:
                PROCS.stop(p)
        link.close()
    return out


def _loopback_receiver(ctx: Ctx, root: str, extra: Sequence[str] = ()) -> Tuple[subprocess.Popen, int]:
    """`automdt receive` on 127.0.0.1 (a free port), its log in the scratch directory."""
    port = free_port()
    log = open(os.path.join(ctx.scratch, f"receiver-{port}.log"), "wb")
    p = PROCS.start(ctx.automdt + ["receive", "--listen", f"127.0.0.1:{port}", "--root", root, "--secret-file",
                                   ctx.secret, "--idle-timeout", "300"] + list(extra),
                    stdout=log, stderr=subprocess.STDOUT)
    wait_port("127.0.0.1", port, 30, p)
    return p, port


ENC_PAIRS = [("local, default command", "plain local (default command)", "--encrypt local (default command)"),
             ("local, --threads 4,4,4", "plain local --threads 4,4,4", "--encrypt local --threads 4,4,4"),
             ("local, 4,4,4, as before 2026-11-24 (TLS over loopback TCP in the process)",
              "plain local --threads 4,4,4", "--encrypt local --threads 4,4,4, --switch local_link=0"),
             ("loopback TCP, default command", "plain loopback TCP (default command)",
              "--encrypt loopback TCP (default command)"),
             ("loopback TCP, --threads 4,4,4", "plain loopback TCP --threads 4,4,4",
              "--encrypt loopback TCP --threads 4,4,4"),
             ("loopback TCP, 4,4,4, TLS one record per socket call (--switch tls_batch=0)",
              "plain loopback TCP --threads 4,4,4", "--encrypt loopback TCP --threads 4,4,4, --switch tls_batch=0")]


def section_encrypt(ctx: Ctx) -> Dict[str, Any]:
    """--encrypt against plain, two ways: a local destination (`automdt transfer SRC DIR`: both take
    the in-process local link, nothing leaves the process, nothing is encrypted) and a receiving
    daemon on 127.0.0.1 (`automdt receive [--encrypt]`, `automdt transfer SRC 127.0.0.1:PORT/x`:
    TLS 1.3 over loopback TCP against plain loopback TCP, the CPU-bound case; CPU counts both
    processes). Two rows run paths as they were before 2026-11-24: a local --encrypt over TLS on
    loopback TCP (--switch local_link=0), and TLS with one socket call per record (--switch tls_batch=0,
    both ends)."""
    ds = ctx.dataset("large")
    dest = os.path.join(ctx.scratch, "enc-dst")
    roots = {k: fresh_dir(os.path.join(ctx.scratch, f"enc-rx-{k}")) for k in ("plain", "tls", "tls0")}
    rx: Dict[str, Tuple[subprocess.Popen, int]] = {}
    try:
        rx["plain"] = _loopback_receiver(ctx, roots["plain"])
        rx["tls"] = _loopback_receiver(ctx, roots["tls"], ["--encrypt"])
        rx["tls0"] = _loopback_receiver(ctx, roots["tls0"], ["--encrypt", "--switch", "tls_batch=0"])

        def local(args: Sequence[str]) -> Sample:
            with destination(dest, ds):
                return ours(ctx, ds, dest, list(args), verify=dest)

        def tcp(which: str, args: Sequence[str]) -> Sample:
            p, port = rx[which]
            root = os.path.join(roots[which], "x")
            with destination(root, ds):
                extra = ["--secret-file", ctx.secret] + (["--encrypt"] if which != "plain" else [])
                extra += ["--switch", "tls_batch=0"] if which == "tls0" else []
                return ours(ctx, ds, f"127.0.0.1:{port}/x", list(args) + extra, rx_pid=p.pid, verify=root)

        t4 = ["--threads", "4,4,4"]
        cont: List[Tuple[str, Callable[[], Sample]]] = [
            ("plain local (default command)", lambda: local([])),
            ("--encrypt local (default command)", lambda: local(["--encrypt"])),
            ("plain local --threads 4,4,4", lambda: local(t4)),
            ("--encrypt local --threads 4,4,4", lambda: local(t4 + ["--encrypt"])),
            ("--encrypt local --threads 4,4,4, --switch local_link=0", lambda: local(t4 + ["--encrypt"] + NO_LINK)),
            ("plain loopback TCP (default command)", lambda: tcp("plain", [])),
            ("--encrypt loopback TCP (default command)", lambda: tcp("tls", [])),
            ("plain loopback TCP --threads 4,4,4", lambda: tcp("plain", t4)),
            ("--encrypt loopback TCP --threads 4,4,4", lambda: tcp("tls", t4)),
            ("--encrypt loopback TCP --threads 4,4,4, --switch tls_batch=0", lambda: tcp("tls0", t4))]
        say(f"  {ds.label()}, local destination and a receiving daemon on 127.0.0.1, medians of {ctx.args.reps}:")
        runs = measure(ctx, cont)
    finally:
        for p, _ in rx.values():
            PROCS.stop(p)
    rows = summarize(ds, runs)
    print_rows(rows)
    out: Dict[str, Any] = {"rows": rows, "samples": runs}
    for kind, plain, enc in ENC_PAIRS:
        p, e = rows[plain], rows[enc]
        r_wall, r_in = p["wall_s"] / e["wall_s"], e["inprocess_gbit"] / p["inprocess_gbit"]
        out[kind] = {"ratio_wall": r_wall, "ratio_inprocess": r_in}
        say(f"    {kind}: encrypted {r_wall:.2f}x plain on wall time, {r_in:.2f}x in-process "
            f"[target >= 0.8x: {'met' if min(r_wall, r_in) >= 0.8 else 'NOT met'}]; CPU {p['cpu_s_per_gb']:.2f} -> "
            f"{e['cpu_s_per_gb']:.2f} s/GB")
    return out


RUNNERS = {"local": section_local, "netns": section_netns, "link": section_link, "encrypt": section_encrypt}


def summary_rows(results: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The documentation's summary table (``--results``): the default command's wall time against
    GridFTP -cc 4 -p 4 on each dataset, locally and between the namespaces, and 2,2,2 against
    iperf3 -P 2 on the rate-limited link."""
    rows = []
    ref = gridftp_name(4, 4, False)
    for sec, where in (("local", "local"), ("netns", "two network namespaces")):
        for data in (v for v in results.get(sec, {}).values() if isinstance(v, dict) and "rows" in v):
            ours_row, peer = data["rows"].get("automdt (default command)"), data["rows"].get(ref)
            if ours_row and peer:
                rows.append({"case": f"{data['label']}, {where}", "automdt": f"{ours_row['wall_s']:.2f} s",
                             "peer": "globus-url-copy -cc 4 -p 4", "peer_value": f"{peer['wall_s']:.2f} s",
                             "ratio": f"{peer['wall_s'] / ours_row['wall_s']:.2f}x"})
    for r in results.get("link", {}).get("rows", []):
        if r["name"] == "automdt --threads 2,2,2":
            link = results["link"]
            rows.append({"case": f"veth limited to {link.get('rate')} (tc {link.get('qdisc')}), 2 connections",
                         "automdt": f"{r['gbit']:.2f} Gbit/s", "peer": "iperf3 -P 2",
                         "peer_value": f"{r['iperf3_gbit']:.2f} Gbit/s", "ratio": f"{r['ratio']:.2f}x"})
    return rows
TITLES = {"local": "Local, tmpfs to tmpfs: automdt vs GridFTP on loopback, cp -r as the ceiling (target >= 1.3x GridFTP)",
          "netns": "Two namespaces, unlimited veth: automdt vs GridFTP (target >= 1.3x)",
          "link": "5 Gbit/s veth: automdt vs iperf3 with the same streams (>= 0.95x), --encrypt vs plain (>= 0.95x)",
          "encrypt": "--encrypt vs plain: local destination, and loopback TCP to a daemon (target >= 0.8x)"}


def ensure_peers() -> None:
    missing = [p for p, exe in zip(APT, ("iperf3", "globus-url-copy", "globus-gridftp-server")) if shutil.which(exe) is None]
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        say(f"(installing {' '.join(missing)} with apt-get)")
        subprocess.run(["apt-get", "install", "-y", "-qq"] + missing, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"), timeout=600)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help=f"comma list of sections: {','.join(SECTIONS)}")
    ap.add_argument("--datasets", default="large,small,tiny", help="for local and netns: large,small,tiny")
    ap.add_argument("--reps", type=int, default=5, help="timed rounds per figure (default 5)")
    ap.add_argument("--quick", action="store_true", help="small sizes, 1 Gbit/s link: a smoke run")
    ap.add_argument("--rate", default="5gbit", help="link section rate (tc syntax, default 5gbit)")
    ap.add_argument("--qdisc", default="tbf", choices=["tbf", "htb"])
    ap.add_argument("--data-dir", help="datasets here (kept and reused); default: a scratch directory, removed")
    ap.add_argument("--json", metavar="FILE", help="every figure and raw sample as JSON")
    ap.add_argument("--results", metavar="FILE", help="the summary table as a results file (automdt-results/1), "
                                                      "as benchmarks/results/datapath.json")
    ap.add_argument("--prefix", default="", help="name prefix of the namespaces and the /dev/shm scratch directory "
                                                 "(default: amdt-b11 and amdt-)")
    args = ap.parse_args(argv)
    args.sections = [s.strip() for s in args.only.split(",") if s.strip()] or list(SECTIONS)
    args.datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    bad = [s for s in args.sections if s not in SECTIONS] + [d for d in args.datasets if d not in SPECS]
    if bad or args.reps < 1:
        ap.error(f"unknown section/dataset {bad}" if bad else "--reps must be at least 1")
    for ns in reap_stale(args.prefix or NS_PREFIX):
        say(f"(removed namespace {ns}, left by a killed run)")
    ensure_peers()

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    ctx = Ctx(args)
    t0 = time.perf_counter()
    results: Dict[str, Any] = {}
    failed = False
    try:
        say(f"automdt data-path benchmark  {time.strftime('%Y-%m-%d %H:%M:%S')}  {platform.node()}, "
            f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} (under load when well above 0); "
            f"medians of {args.reps} interleaved round(s) after 1 warm-up")
        for sec in args.sections:
            say()
            say(f"== {TITLES[sec]}")
            s0 = time.perf_counter()
            try:
                res = RUNNERS[sec](ctx)
            except Exception as e:  # noqa: BLE001 - one failed section does not hide the others
                failed = True
                res = {"error": f"{type(e).__name__}: {e}"}
                say(f"  FAILED: {res['error']}")
            if "skipped" in res:
                say(f"  skipped: {res['skipped']}")
            res["seconds"] = round(time.perf_counter() - s0, 1)
            res["load_after"] = os.getloadavg()[0]
            results[sec] = res
            say(f"  ({res['seconds']:.0f} s, load {res['load_after']:.1f})")
        say()
        say(f"total {time.perf_counter() - t0:.0f} s, load average now {os.getloadavg()[0]:.1f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "reps": args.reps, "quick": args.quick,
                           "sections": results}, f, indent=1, default=float)
            say(f"figures written to {args.json}")
        if args.results:
            import results_file

            results_file.write(args.results, "The data path: automdt against GridFTP, cp and iperf3", (
                f"medians of {args.reps} interleaved rounds after a warm-up, sections {','.join(args.sections)}"), [
                results_file.table("summary", "Wall time of the whole command (start-up included), tmpfs to tmpfs",
                                   [("case", "dataset and path"), ("automdt", "automdt (default command)"),
                                    ("peer", "peer"), ("peer_value", "peer's figure"), ("ratio", "automdt speed-up")],
                                   summary_rows(results))])
            say(f"results file written to {args.results}")
    finally:
        ctx.cleanup()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
