#!/usr/bin/env python3
"""One receiver daemon, many concurrent senders: does every tree arrive identically, does the
daemon stay within its memory caps, and do the senders share the link fairly?

    .venv/bin/python scripts/load_many_senders.py                    # 32 senders (the issue's figure)
    .venv/bin/python scripts/load_many_senders.py --senders 6 --mib 2 --link-mbps 0   # small, loopback

What it runs is what operators type: one ``automdt receive`` (``--max-sessions`` = the number of
senders, ``--max-memory`` per session, ``--metrics``) and N separate ``automdt transfer``
processes, each its own session, its own policy instance (``--policies``, cycled) and its own
tree of ``--files`` files (``--mib`` MiB in all, different content per sender), started together.
As root, the senders and the receiver sit in two network namespaces joined by a veth pair whose
sender side has a ``tc tbf`` limit of ``--link-mbps`` MB/s: the shared link. Without root (or with
``--link-mbps 0``) everything runs over loopback, where the CPU is what they share.
``--disk-throttle SPEC`` gives the receiver one emulated slow destination disk that every session
writes to (``automdt receive --throttle``): then the disk is what they share.

Printed (and written with ``--json FILE``):
* exit codes of every sender and whether every destination tree equals its source (byte for byte);
* the receiver's resident memory: idle, peak while serving, and the growth against the sum of the
  per-session staging caps (sessions x min(--memory, --max-memory), or the receiver's
  ``--total-memory`` when that is smaller) plus a fixed allowance per session for its threads'
  stacks, sockets and bookkeeping (``--overhead-mib``, default 4);
* Jain's fairness index J = (sum x)^2 / (n sum x^2) of the senders' throughputs, over whole runs
  (bytes / own seconds; start-up order skews it: an early sender has the link to itself) and
  per 5-s period over the senders active through that period (from each sender's ``--log``
  intervals); 1 is perfectly even, 1/n is one sender taking everything;
* aggregate throughput, the daemon's /metrics after the run (sessions, files, bytes), and
  whether it still serves a fresh transfer afterwards.
Exit status: 0 if every sender exited 0, every tree matched, memory stayed within the caps and
the daemon still served; 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

PY = sys.executable
MiB = 1 << 20


def jain(xs):
    xs = [float(x) for x in xs]
    s2 = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * s2) if s2 > 0 else 1.0


def make_tree(root: str, nfiles: int, total: int, seed: int) -> None:
    rng = random.Random(seed)
    weights = [rng.uniform(0.2, 1.0) for _ in range(nfiles)]
    sizes = [int(total * w / sum(weights)) for w in weights]
    block = rng.randbytes(MiB)
    for i, size in enumerate(sizes):
        p = os.path.join(root, f"d{i % 3}", f"f{i:03d}.bin")
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            left = size
            f.write(seed.to_bytes(8, "little"))  # every sender's data differs
            left -= 8
            while left > 0:
                k = min(left, MiB)
                off = rng.randrange(0, MiB - k + 1)
                f.write(block[off:off + k])
                left -= k
    os.makedirs(os.path.join(root, "empty-dir"), exist_ok=True)
    open(os.path.join(root, "empty.txt"), "wb").close()


def same_tree(a: str, b: str) -> bool:
    return subprocess.run(["diff", "-r", "--no-dereference", a, b], capture_output=True).returncode == 0


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Net:
    """Loopback, or (root and a rate) two namespaces joined by a tbf-limited veth (the fairness
    experiment's :func:`automdt.experiments.fairness.shared_link`)."""

    def __init__(self, rate_mbps: float):
        from automdt.experiments.fairness import shared_link
        from automdt.experiments.netns import netns_available

        self.use_ns = rate_mbps > 0 and netns_available()[0]
        self.link = shared_link(rate_mbps * 1e6, prefix="amdt-i14-ld") if self.use_ns else None
        self.ip_r = self.link.addr_b if self.use_ns else "127.0.0.1"

    def __enter__(self):
        if self.link is not None:
            self.link.__enter__()
        return self

    def __exit__(self, *exc):
        if self.link is not None:
            self.link.__exit__(*exc)

    def wrap(self, side: str, cmd):
        """``cmd`` run in the sender (``snd``) or receiver (``rcv``) namespace."""
        return self.link.exec_argv({"snd": "a", "rcv": "b"}[side], cmd) if self.use_ns else cmd


def scrape(net: Net, port: int) -> dict:
    code = (f"import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:{port}/metrics',timeout=5)"
            f".read().decode())")
    out = subprocess.run(net.wrap("rcv", [PY, "-c", code]), capture_output=True, text=True, timeout=30).stdout
    from prometheus_client.parser import text_string_to_metric_families

    vals = {}
    for fam in text_string_to_metric_families(out):
        for s in fam.samples:
            if s.name.startswith("automdt_"):
                vals[s.name] = vals.get(s.name, 0.0) + s.value  # labelled series summed
    return vals


def _parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--senders", type=int, default=32)
    ap.add_argument("--files", type=int, default=8, help="files per sender (default 8)")
    ap.add_argument("--mib", type=float, default=32, help="MiB per sender (default 32)")
    ap.add_argument("--policies", default="ppo", help="comma list cycled over the senders (default ppo, the shipped PPO network)")
    ap.add_argument("--link-mbps", type=float, default=40, help="shared link rate MB/s (0: loopback; default 40)")
    ap.add_argument("--fair-share", action=argparse.BooleanOptionalAction, default=True,
                    help="the receiver's --fair-share (default: on, as the receiver's own default)")
    ap.add_argument("--disk-throttle", default="", metavar="SPEC",
                    help="the receiver's emulated destination disk, shared by every session (its --throttle: "
                         "write.thread=RATE,write.total=RATE; default none)")
    ap.add_argument("--memory", default="8Mi", help="each sender's --memory (default 8Mi)")
    ap.add_argument("--max-memory", default="8Mi", help="the receiver's per-session --max-memory (default 8Mi)")
    ap.add_argument("--total-memory", default=None,
                    help="the receiver's --total-memory for all sessions together (default: its own)")
    ap.add_argument("--total-threads", default=None, help="the receiver's --total-threads (default: its own)")
    ap.add_argument("--late", type=float, default=0.0, metavar="SECONDS",
                    help="start the last sender this long after the others and report how soon it reaches 80%% of "
                         "its fair share (link / senders)")
    ap.add_argument("--chunk-size", default="1Mi",
                    help="senders' --chunk-size (default 1Mi: a fair share of 40/32 MB/s is ~1 chunk a second)")
    ap.add_argument("--bin", type=float, default=5.0, help="seconds per period of the per-period Jain index (default 5)")
    ap.add_argument("--overhead-mib", type=float, default=4.0, help="allowance per session beyond its buffer")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--keep", action="store_true", help="keep the data directory")
    return ap


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    from automdt.units import parse_size

    n = a.senders
    cap = min(parse_size(a.memory), parse_size(a.max_memory))
    from automdt.experiments.run import _policy_list

    policies = _policy_list(a.policies)
    work, root, secret = _prepare(a)
    port = 5215
    recv = None
    procs = []
    res = {"senders": n, "files_per_sender": a.files + 1, "mib_per_sender": a.mib, "policies": policies,
           "staging_cap_per_session": cap}
    budget_args, staging_cap = _budget(a, n * cap, res)
    try:
        with Net(a.link_mbps) as net:
            res["link"] = f"tbf {a.link_mbps:g} MB/s between two namespaces" if net.use_ns else "loopback"
            res["disk_throttle"] = a.disk_throttle
            res["fair_share"] = a.fair_share
            recv = _start_receiver(a, net, work, port, root, secret, budget_args)
            rpid = recv.pid  # `ip netns exec` execs the receiver: same pid
            time.sleep(0.5)
            idle = rss(rpid)
            env = dict(os.environ, XDG_RUNTIME_DIR=work)
            t_launch = time.time()
            ends, outs, peak = _run_senders(a, net, work, port, secret, policies, env, rpid, idle, procs)
            sums = []
            for i, (out, err) in enumerate(outs):
                try:
                    sums.append(json.loads(out.strip().splitlines()[-1]))
                except (ValueError, IndexError):
                    sums.append({"exit_code": procs[i].returncode, "bytes": 0, "seconds": 0, "errors": [err[-300:]]})
            codes = [p.returncode for p in procs]
            late_rows = _log_rows(os.path.join(work, f"s{n - 1:02d}.log"))
            window_jain, window = _window_jain(work, sums, ends, a.bin)
            identical = [same_tree(os.path.join(work, f"src{i:02d}"), os.path.join(root, f"dst{i:02d}")) for i in range(n)]
            metrics = scrape(net, 9215)
            res["still_serving"] = _still_serving(net, work, port, root, secret, env)
            res["receiver_alive"] = recv.poll() is None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if recv is not None and recv.poll() is None:
            os.kill(recv.pid, signal.SIGTERM)
            try:
                recv.wait(15)
            except subprocess.TimeoutExpired:
                recv.kill()
                recv.wait()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    _summary(a, res, sums, codes, identical, ends, t_launch, idle, peak, staging_cap, metrics, window_jain, window,
             late_rows)
    ok = res["ok"]
    _print(res)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0 if ok else 1


def _start_receiver(a, net, work, port, root, secret, budget_args):
    """``automdt receive`` in the receiving namespace, once it says it is receiving (its stderr
    in ``work/receiver.err``)."""
    errp = os.path.join(work, "receiver.err")
    with open(errp, "w") as err:
        recv = subprocess.Popen(net.wrap("rcv", [PY, "-m", "automdt", "receive", "--listen", f"{net.ip_r}:{port}",
                                                 "--root", root, "--secret-file", secret,
                                                 "--max-sessions", str(a.senders), "--max-memory", a.max_memory,
                                                 "--metrics", "127.0.0.1:9215", *budget_args,
                                                 *(["--throttle", a.disk_throttle] if a.disk_throttle else []),
                                                 *([] if a.fair_share else ["--no-fair-share"])]),
                                stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 60
    while "receiving into" not in open(errp).read():
        if recv.poll() is not None or time.monotonic() > deadline:
            if recv.poll() is None:
                recv.kill()
                recv.wait()
            raise SystemExit("receiver did not start: " + open(errp).read())
        time.sleep(0.05)
    return recv


def _still_serving(net, work, port, root, secret, env) -> bool:
    """Whether the receiver still serves after the storm: one more transfer, identical."""
    after = subprocess.run(net.wrap("snd", [PY, "-m", "automdt", "transfer", os.path.join(work, "src00"),
                                            f"{net.ip_r}:{port}/after", "--secret-file", secret, "--json",
                                            "--threads", "2,2,2"]),
                           capture_output=True, text=True, env=env, timeout=300)
    return after.returncode == 0 and same_tree(os.path.join(work, "src00"), os.path.join(root, "after"))


def _prepare(a):
    """A work directory with the receiver's root, a shared secret and one source tree per sender."""
    work = tempfile.mkdtemp(prefix="amdt-i14-load-")
    root = os.path.join(work, "root")
    os.makedirs(root)
    secret = os.path.join(work, "secret")
    with open(secret, "wb") as f:
        f.write(os.urandom(32).hex().encode())
    os.chmod(secret, 0o600)
    for i in range(a.senders):
        make_tree(os.path.join(work, f"src{i:02d}"), a.files, int(a.mib * MiB), seed=1000 + i)
    return work, root, secret


def _budget(a, staging_cap, res):
    """The receiver's budget options and the staging memory the daemon may hold: every session at
    its own cap at once (``staging_cap``), or ``--total-memory`` when smaller."""
    from automdt.units import parse_size

    args = []
    if a.total_memory:
        args += ["--total-memory", a.total_memory]
        staging_cap = min(staging_cap, parse_size(a.total_memory))
        res["total_memory"] = parse_size(a.total_memory)
    if a.total_threads:
        args += ["--total-threads", str(a.total_threads)]
        res["total_threads"] = int(a.total_threads)
    return args, staging_cap


def _run_senders(a, net, work, port, secret, policies, env, rpid, idle, procs):
    """Start the senders (the last ``--late`` seconds after the others), appending them to
    ``procs``; wait for them (``--timeout``) while sampling the receiver's memory. Returns each
    one's end time and output, and the receiver's peak RSS."""
    n = a.senders
    for i in range(n):
        if a.late and i == n - 1:
            time.sleep(a.late)
        cmd = [PY, "-m", "automdt", "transfer", os.path.join(work, f"src{i:02d}"), f"{net.ip_r}:{port}/dst{i:02d}",
               "--secret-file", secret, "--json", "--memory", a.memory, "--chunk-size", a.chunk_size,
               "--log", os.path.join(work, f"s{i:02d}.log"), "--policy", policies[i % len(policies)]]
        procs.append(subprocess.Popen(net.wrap("snd", cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env))
    peak = idle
    ends = [None] * n
    outs = [None] * n
    deadline = time.monotonic() + a.timeout
    while any(e is None for e in ends) and time.monotonic() < deadline:
        peak = max(peak, rss(rpid))
        for i, p in enumerate(procs):
            if ends[i] is None and p.poll() is not None:
                ends[i] = time.time()
                outs[i] = p.communicate()
        time.sleep(0.1)
    for i, p in enumerate(procs):
        if ends[i] is None:
            p.kill()
            outs[i] = p.communicate()
            ends[i] = time.time()
    return ends, outs, peak


def _summary(a, res, sums, codes, identical, ends, t_launch, idle, peak, staging_cap, metrics, window_jain, window,
             late_rows):
    """The run's figures into ``res`` (see the module's doc)."""
    n = a.senders
    tput = [s["bytes"] / s["seconds"] if s.get("seconds") else 0.0 for s in sums]
    res.update({
        "exit_codes": codes, "all_exit_0": all(c == 0 for c in codes),
        "first_errors": [e for s in sums for e in (s.get("errors") or [])][:3], "trees_identical": sum(identical),
        "bytes_total": sum(s["bytes"] for s in sums),
        "aggregate_MBps": round(sum(s["bytes"] for s in sums) / max(1e-9, max(ends) - t_launch) / 1e6, 2),
        "per_sender_MBps": {"min": round(min(tput) / 1e6, 2), "median": round(statistics.median(tput) / 1e6, 2),
                            "max": round(max(tput) / 1e6, 2)},
        "jain_whole_runs": round(jain(tput), 4),
        "logged_span_s": round(max(0.0, window[1] - window[0]), 2),
        "receiver_rss_idle_MiB": round(idle / MiB, 1), "receiver_rss_peak_MiB": round(peak / MiB, 1),
        "receiver_rss_growth_MiB": round((peak - idle) / MiB, 1),
        "memory_cap_MiB": round((staging_cap + n * a.overhead_mib * MiB) / MiB, 1),
        "metrics_after": {k: metrics.get(k) for k in ("automdt_sessions_total", "automdt_received_files_total",
                                                      "automdt_written_bytes_total", "automdt_sessions_active",
                                                      "automdt_rejected_connections_total")},
    })
    res["within_memory_cap"] = peak - idle <= staging_cap + n * a.overhead_mib * MiB
    res["jain_common_window"] = window_jain  # per-second index (see _window_jain)
    if a.late:
        from automdt.units import parse_throttle

        limits = [x for x in (a.link_mbps * 1e6, parse_throttle(a.disk_throttle)["write"][1]) if x > 0]
        share = (min(limits) if limits else res["aggregate_MBps"] * 1e6) / n  # the shared bottleneck's
        res["late_joiner"] = _late_joiner(late_rows, share)
    res["ok"] = bool(res["all_exit_0"] and res["trees_identical"] == n and res["within_memory_cap"]
                     and res["still_serving"])
    return res


def _log_rows(path):
    """``(t, interval_s, net bytes)`` of every interval of a sender's ``--log``."""
    rows = []
    try:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if "t" in r and "interval_s" in r:
                    rows.append((float(r["t"]), float(r["interval_s"]), float((r.get("bytes") or {}).get("net", 0))))
    except (OSError, ValueError):
        pass
    return rows


def _late_joiner(rows, share_bps):
    """How soon the late sender reaches 80% of its fair share: the intervals from its first to the
    first whose network rate is at least 0.8 x ``share_bps``, and its mean rate over its run."""
    rates = [b / dt for _, dt, b in rows if dt > 0]
    first = next((i + 1 for i, x in enumerate(rates) if x >= 0.8 * share_bps), None)
    return {"fair_share_MBps": round(share_bps / 1e6, 2), "intervals_to_80pct": first,
            "mean_MBps": round(sum(rates) / len(rates) / 1e6, 2) if rates else None, "intervals": len(rates)}


def _window_jain(work, sums, ends, bin_s=5.0):
    """Jain's index of the senders' shares of the link, period by period.

    Each sender's ``--log`` has one record per interval with ``t`` (seconds since its controller
    started) and the network stage's bytes; its start in wall time is its exit time minus the
    summary's ``seconds`` (the handshake before the first interval is a fraction of a second).
    Time is cut into ``bin_s`` periods (several chunks per sender each, or the chunk granularity
    dominates); in each bin, the senders between their first and last interval
    are the active ones, and Jain's index is taken over the bytes each of them moved in that bin.
    Returns ({"mean": index averaged over bins with at least 2 active senders, weighted by how many
    were active, "bins": how many such bins, "max_active": most senders active in one bin,
    "mean_at_max": mean over the bins where at least 3/4 of max_active were active, "all_joined":
    {"seconds", "jain"} over the bytes each sender moved while all of them ran, or None when that
    window is shorter than two bins}, (first, last)).
    """
    recs = []
    for i, (s, end) in enumerate(zip(sums, ends)):
        start = end - float(s.get("seconds") or 0.0)
        rows = []
        try:
            with open(os.path.join(work, f"s{i:02d}.log")) as f:
                for line in f:
                    r = json.loads(line)
                    rows.append((start + float(r["t"]), float((r.get("bytes") or {}).get("net", 0))))
        except (OSError, ValueError, KeyError):
            pass
        if rows:
            recs.append(rows)
    if not recs:
        return None, (0.0, 0.0)
    t0 = min(rows[0][0] for rows in recs)
    t1 = max(rows[-1][0] for rows in recs)
    nb = int((t1 - t0) / bin_s) + 1
    per_bin = []
    for b in range(nb):
        lo, hi = t0 + b * bin_s, t0 + (b + 1) * bin_s
        # active: logging from before this period to after it (first and last periods are partial)
        active = [rows for rows in recs if rows[0][0] <= lo and rows[-1][0] >= hi]
        if len(active) >= 2:
            per_bin.append((len(active), jain([sum(x for t, x in rows if lo <= t < hi) for rows in active])))
    if not per_bin:
        return None, (t0, t1)
    mx = max(n for n, _ in per_bin)
    top = [j for n, j in per_bin if n >= 0.75 * mx]
    # once all have joined: from the last sender's first interval to the first sender's last one,
    # the bytes each moved (the fairness experiment's measure: means over the window both ran)
    lo, hi = max(rows[0][0] for rows in recs), min(rows[-1][0] for rows in recs)
    together = None
    if len(recs) >= 2 and hi - lo >= 2 * bin_s:
        together = {"seconds": round(hi - lo, 1),
                    "jain": round(jain([sum(x for t, x in rows if lo < t <= hi) for rows in recs]), 4)}
    return ({"mean": round(sum(n * j for n, j in per_bin) / sum(n for n, _ in per_bin), 4), "bins": len(per_bin),
             "bin_s": bin_s, "max_active": mx, "mean_at_max": round(sum(top) / len(top), 4),
             "all_joined": together}, (t0, t1))


def _print(r):
    print(f"{r['senders']} senders x {r['files_per_sender']} files ({r['mib_per_sender']} MiB each), policies "
          f"{','.join(r['policies'])}, over {r['link']}")
    print(f"  exit codes all 0: {r['all_exit_0']}  ({sorted(set(r['exit_codes']))});  trees identical: "
          f"{r['trees_identical']}/{r['senders']}")
    if r["first_errors"]:
        print(f"  first errors: {r['first_errors']}")
    print(f"  receiver RSS: idle {r['receiver_rss_idle_MiB']} MiB, peak {r['receiver_rss_peak_MiB']} MiB, growth "
          f"{r['receiver_rss_growth_MiB']} MiB vs cap {r['memory_cap_MiB']} MiB "
          f"({r['senders']} x (staging {r['staging_cap_per_session'] / MiB:g} MiB + allowance)): "
          f"within: {r['within_memory_cap']}")
    pm = r["per_sender_MBps"]
    print(f"  throughput: aggregate {r['aggregate_MBps']} MB/s; per sender min {pm['min']} / median {pm['median']} / "
          f"max {pm['max']} MB/s")
    jw = r["jain_common_window"] or {}
    print(f"  Jain's fairness index: whole runs (bytes / own seconds) {r['jain_whole_runs']}; per {jw.get('bin_s')}-s period over "
          f"the senders active through it: mean {jw.get('mean')} over {jw.get('bins')} periods, {jw.get('mean_at_max')} while "
          f">= 3/4 of the peak {jw.get('max_active')} were active; once all had joined "
          f"{(jw.get('all_joined') or {}).get('jain')} over {(jw.get('all_joined') or {}).get('seconds')} s")
    if r.get("late_joiner"):
        lj = r["late_joiner"]
        print(f"  late joiner: 80% of its fair share ({lj['fair_share_MBps']} MB/s) after {lj['intervals_to_80pct']} "
              f"interval(s); mean {lj['mean_MBps']} MB/s over {lj['intervals']} intervals")
    print(f"  daemon after the run: {r['metrics_after']}; still serving a new transfer: {r['still_serving']}")
    print(f"  ok: {r['ok']}")


if __name__ == "__main__":
    sys.exit(main())
