"""Two transfers competing for one rate-limited link (Marlin, ICS'23, section 4.4 and Figure 8).

Set-up (needs root: network namespaces):

* two network namespaces, ``<prefix>-snd`` (both senders) and ``<prefix>-rcv`` (one
  ``automdt receive``), joined by a veth pair; the sender side's egress has a ``tc`` token-bucket
  (``tbf``) rate limit: the shared bottleneck link (40 MB/s by default);
* transfer 1 reads fast (one read thread can fill the link: ``read.thread`` = link rate), transfer
  2 reads slowly (``read.thread`` = link / 10: it needs ten read threads to fill it), as in
  Marlin's experiment (300 vs 30 Mbit/s per read thread on a 300 Mbit/s link);
* transfer 1 starts alone, transfer 2 joins ``join_s`` later; both stop at ``window_s``.

Both transfers use the same policy (one pair per policy). A monolithic tuner (Falcon) gives the
slow reader as many connections as readers, and TCP shares the link per connection, so the slow
reader takes most of the link; modular tuners (Marlin, PPO) need few connections and should
share it about equally. Reported: each transfer's mean network throughput while both run (from
``join_s + settle_s`` to the end), its share, Jain's fairness index and the link utilisation.

Each sender runs in its own process inside the sender namespace
(``python -m automdt.experiments.sender_proc``), which records the wall-clock time of its
controller's start so that both transfers' intervals line up on one time axis.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from automdt.experiments import metrics as M
from automdt.experiments import plots
from automdt.experiments.netns import NetnsPair, netns_available
from automdt.experiments.runner import RunDir, Scratch, git_info, ppo_default_info
from automdt.experiments.scenarios import MB, large_dataset

FAIR_POLICIES = ("falcon", "marlin", "ppo")
LINK_BPS = 40 * MB
PORT = 5000


def _sh(*cmd: str, check: bool = True, timeout: float = 20.0) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check, timeout=timeout)


def shared_link(rate_bps: float, prefix: str = "amdtfair", qdisc: str = "tbf") -> NetnsPair:
    """The shared bottleneck: two namespaces (A sends, B receives) joined by a veth pair with a
    ``qdisc`` rate limit of ``rate_bps`` bytes/s on A's egress (not opened yet; a context manager)."""
    octet = 16 + os.getpid() % 200
    return NetnsPair(rate=rate_bps, qdisc=qdisc, prefix=prefix, addr_a=f"10.213.{octet}.1",
                     addr_b=f"10.213.{octet}.2", both_ways=False, burst_min=64 * 1024)


def _popen(args: Sequence[str], log: str) -> subprocess.Popen:
    f = open(log, "ab")
    try:
        return subprocess.Popen(list(args), stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        f.close()


def _stop(p: Optional[subprocess.Popen], timeout: float = 10.0) -> None:
    """End one process we started (by its pid / process group), politely first."""
    if p is None or p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(5)


def run_pair(link: NetnsPair, policy: str, src: str, root: str, workdir: str, secret_file: str, *,
             window_s: float, join_s: float, memory: int, chunk_size: int, interval_s: float, max_threads: int,
             fast_read_bps: float, slow_read_bps: float, write_bps: float) -> Dict[str, Any]:
    """One receiver and two senders with ``policy``; returns both transfers' records."""
    py = sys.executable
    recv_root = os.path.join(root, f"recv-{policy.replace(':', '_')}")
    os.makedirs(recv_root, exist_ok=True)
    recv = _popen(["ip", "netns", "exec", link.ns_b, py, "-m", "automdt", "receive", "--listen",
                   f"{link.addr_b}:{PORT}", "--root", recv_root, "--secret-file", secret_file,
                   "--idle-timeout", str(int(window_s + 60))], os.path.join(workdir, f"receiver-{policy}.log"))
    senders: List[subprocess.Popen] = []
    try:
        _wait_listening(link, PORT, recv, 15.0)
        transfers = []
        for i, (read_bps, start) in enumerate(((fast_read_bps, 0.0), (slow_read_bps, join_s)), 1):
            cfg = {
                "src": src, "dest": f"{link.addr_b}:{PORT}/t{i}", "policy": policy, "secret_file": secret_file,
                "max_duration_s": window_s - start, "memory": memory, "chunk_size": chunk_size,
                "interval_s": interval_s, "max_threads": max_threads,
                "throttle": {"read": [read_bps, 0], "net": [0, 0], "write": [write_bps, 0]},
            }
            cfg_path = os.path.join(workdir, f"{policy}-t{i}.json")
            with open(cfg_path, "w") as f:
                json.dump(cfg, f)
            transfers.append((f"T{i} (read {read_bps / MB:g} MB/s per thread)", cfg, cfg_path, start,
                              os.path.join(workdir, f"{policy}-t{i}.out.json")))
        t0 = time.time()
        for name, cfg, cfg_path, start, out in transfers:
            delay = t0 + start - time.time()
            if delay > 0:
                time.sleep(delay)
            senders.append(_popen(["ip", "netns", "exec", link.ns_a, py, "-m", "automdt.experiments.sender_proc",
                                   cfg_path, out], out + ".log"))
        deadline = t0 + window_s + 60.0
        for p in senders:
            left = max(1.0, deadline - time.time())
            try:
                p.wait(left)
            except subprocess.TimeoutExpired:
                _stop(p)
        result = {"policy": policy, "t0": t0, "transfers": []}
        for (name, cfg, _, start, out), p in zip(transfers, senders):
            try:
                with open(out) as f:
                    data = json.load(f)
            except (OSError, ValueError) as e:
                data = {"error": f"no result ({e}); exit {p.returncode}", "history": [], "summary": {}}
            rows = []
            w0 = data.get("wall_t0") or (t0 + start)
            for rec in data.get("history", []):
                row = M.flatten(rec)
                row["t_abs"] = round(w0 - t0 + rec["t"], 3)
                rows.append(row)
            result["transfers"].append({"name": name, "start_s": start, "config": cfg, "rows": rows,
                                        "summary": data.get("summary", {}), "error": data.get("error"),
                                        "exit": p.returncode})
        result["qdisc"] = link.qdisc_show()
        return result
    finally:
        for p in senders:
            _stop(p)
        _stop(recv)
        shutil.rmtree(recv_root, ignore_errors=True)


def _wait_listening(link: NetnsPair, port: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"receiver exited early ({proc.returncode})")
        out = _sh("ip", "netns", "exec", link.ns_b, "ss", "-Hltn", check=False).stdout
        if f":{port} " in out or f":{port}\n" in out or out.rstrip().endswith(f":{port}"):
            return
        if f"{link.addr_b}:{port}" in out:
            return
        time.sleep(0.2)
    raise RuntimeError("receiver did not start listening")


def pair_metrics(pair: Dict[str, Any], join_s: float, settle_s: float, window_s: float, link_bps: float
                 ) -> Dict[str, Any]:
    """Mean delivered throughput of each transfer while both ran (after ``join_s + settle_s``).

    Delivered = bytes written at the receiver: what crossed the link. (The sender's network
    counter counts bytes handed to the kernel, which runs ahead of the link by the socket
    buffers, most visibly when connections are added.)
    """
    lo, hi = join_s + settle_s, window_s - 0.5
    means, threads, net_means, losses = [], [], [], []
    for tr in pair["transfers"]:
        xs = [r["tput_write"] for r in tr["rows"] if lo <= r["t_abs"] <= hi]
        nx = [r["tput_net"] for r in tr["rows"] if lo <= r["t_abs"] <= hi]
        net_means.append(sum(nx) / len(nx) if nx else None)
        ns = [r["threads_net"] for r in tr["rows"] if lo <= r["t_abs"] <= hi]
        rs = [r["threads_read"] for r in tr["rows"] if lo <= r["t_abs"] <= hi]
        losses += [r["loss"] for r in tr["rows"] if lo <= r["t_abs"] <= hi and r.get("loss") is not None]
        means.append(sum(xs) / len(xs) if xs else None)
        threads.append({"net_mean": sum(ns) / len(ns) if ns else None, "read_mean": sum(rs) / len(rs) if rs else None})
    # T1 alone: its intervals after the first (slow start) that began before T2 joined (a loaded
    # machine can start T1 late, so "ended before the join" may leave none)
    alone = [r["tput_write"] for r in pair["transfers"][0]["rows"][1:]
             if r["t_abs"] - (r.get("interval_s") or 0.0) < join_s]
    ok = all(m is not None for m in means)
    total = sum(means) if ok else None  # type: ignore[arg-type]
    return {
        "policy": pair["policy"], "window": [lo, hi], "mean_bps": means, "mean_net_counter_bps": net_means,
        "threads": threads,
        "share_t1": (means[0] / total) if ok and total else None,
        "jain": M.jain_index(means) if ok else None,
        "utilisation": (total / link_bps) if ok and total else None,
        "t1_alone_bps": (sum(alone) / len(alone)) if alone else None,
        "loss_mean": (sum(losses) / len(losses)) if losses else None,
        "errors": [tr.get("error") for tr in pair["transfers"] if tr.get("error")],
    }


def run_fairness(st: Any) -> Any:
    """The ``fairness`` experiment (``st``: :class:`automdt.experiments.run.Settings`)."""
    from automdt.experiments.run import Experiment, _policies
    from automdt.experiments.scenarios import bottleneck_scenarios

    quick = st.quick
    window = st.duration_s or (10.0 if quick else 40.0)
    join = round(window * 0.25, 1)
    settle = 3.0 if quick else 5.0
    link_bps = st.rate_bps / 2  # 40 MB/s with the default rate
    rd = RunDir(st.out, "fairness")
    ok, why = netns_available()
    probe = bottleneck_scenarios(st.rate_bps)["net-bound"]
    labels, skipped = _policies(st, FAIR_POLICIES, ("marlin",), probe)
    cfg: Dict[str, Any] = {
        "seed": st.seed, "settings": st.to_dict(), "window_s": window, "join_s": join, "settle_s": settle,
        "link_bps": link_bps, "fast_read_bps": link_bps, "slow_read_bps": link_bps / 10, "write_bps": link_bps,
        "policies": labels, "skipped_policies": skipped,
        "ppo_default": ppo_default_info() if ("ppo" in labels or "ppo" in skipped) else None,
        "options": {"memory": st.memory, "chunk_size": st.chunk_size, "interval_s": st.interval_s,
                    "max_threads": st.max_threads},
    }
    if not ok:
        rd.write_config(cfg | {"skipped": why})
        rd.write_text("results.md", f"# Fairness\n\nSkipped: {why}. The experiment needs two network namespaces "
                                    "joined by a veth pair with a `tc` tbf rate limit.\n")
        st.log(f"[fairness] skipped: {why}")
        return Experiment("fairness", rd.path, [], skipped, {"skipped": why})
    st.log(f"[fairness] {rd.path}: {len(labels)} pairs, link {link_bps / MB:.0f} MB/s, window {window:g} s, "
           f"T2 joins at {join:g} s")
    pairs, mets = _run_pairs(st, rd, cfg, labels)
    _write_fairness_results(st, rd, cfg, pairs, mets)
    st.log(f"[fairness] wrote {rd.path}/results.md")
    return Experiment("fairness", rd.path, [], skipped, {"pairs": mets})


def _run_pairs(st: Any, rd: RunDir, cfg: Dict[str, Any], labels: Sequence[str]
               ) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """One pair of transfers per policy on one shared link (the dataset and the link described
    in ``cfg``, which is written once they are known): the pairs and their metrics."""
    window, join, settle, link_bps = cfg["window_s"], cfg["join_s"], cfg["settle_s"], cfg["link_bps"]
    pairs, mets = [], []
    spec = large_dataset(int(link_bps * window * 1.1 + 2 * st.memory), n_files=8, seed=st.seed)
    with Scratch(st.data_dir, st.keep_data) as scratch:
        ds = spec.generate(scratch.data)
        cfg["dataset"] = ds.to_dict()
        workdir = tempfile.mkdtemp(prefix="fair-", dir=scratch.dest)
        secret = os.path.join(workdir, "secret")
        with open(secret, "w") as f:
            f.write(os.urandom(32).hex())
        os.chmod(secret, 0o600)
        with shared_link(link_bps) as link:
            cfg["link"] = link.describe()
            rd.write_config(cfg)
            for pol in labels:
                pair = run_pair(link, pol, ds.path, scratch.dest, workdir, secret, window_s=window, join_s=join,
                                memory=st.memory, chunk_size=st.chunk_size, interval_s=st.interval_s,
                                max_threads=st.max_threads, fast_read_bps=link_bps, slow_read_bps=link_bps / 10,
                                write_bps=link_bps)
                m = pair_metrics(pair, join, settle, window, link_bps)
                pairs.append(pair)
                mets.append(m)
                st.log(f"  {pol:8s} T1 {M.mb(m['mean_bps'][0])} MB/s, T2 {M.mb(m['mean_bps'][1])} MB/s, "
                       f"share T1 {M.fmt(m['share_t1'], 2)}, Jain {M.fmt(m['jain'], 3)}"
                       + (f"  errors: {m['errors']}" if m["errors"] else ""))
        shutil.rmtree(workdir, ignore_errors=True)
    return pairs, mets


def _write_fairness_results(st: Any, rd: RunDir, cfg: Dict[str, Any], pairs: List[Dict[str, Any]],
                            mets: List[Dict[str, Any]]) -> None:
    """``intervals.csv``, ``pairs.csv``, the plot and ``results.md`` of a fairness run."""
    window, join, settle, link_bps = cfg["window_s"], cfg["join_s"], cfg["settle_s"], cfg["link_bps"]
    skipped = cfg["skipped_policies"]
    rows = []
    for p in pairs:
        for tr in p["transfers"]:
            for r in tr["rows"]:
                rows.append({"policy": p["policy"], "transfer": tr["name"]} | r)
    rd.write_csv("intervals.csv", rows)
    rd.write_csv("pairs.csv", [{"policy": m["policy"], "t1_bps": m["mean_bps"][0],
                                "t2_bps": m["mean_bps"][1], "t1_net_counter_bps": m["mean_net_counter_bps"][0],
                                "t2_net_counter_bps": m["mean_net_counter_bps"][1], "share_t1": m["share_t1"], "jain": m["jain"],
                                "utilisation": m["utilisation"], "t1_alone_bps": m["t1_alone_bps"],
                                "loss_mean": m["loss_mean"],
                                "t1_net_threads": m["threads"][0]["net_mean"], "t2_net_threads": m["threads"][1]["net_mean"],
                                "t1_read_threads": m["threads"][0]["read_mean"],
                                "t2_read_threads": m["threads"][1]["read_mean"],
                                "errors": "; ".join(e for e in m["errors"] if e)} for m in mets])
    plots.fairness_plot(rd.file("fairness.png"), f"two transfers on a {link_bps / MB:.0f} MB/s link", pairs, link_bps)
    g = git_info()
    lines = ["# Fairness: two transfers on one rate-limited link", "",
             f"Two namespaces joined by veth, `tc tbf` at {link_bps / MB:.0f} MB/s ({link_bps * 8 / 1e6:.0f} Mbit/s) on "
             f"the sender side. T1 reads at {link_bps / MB:.0f} MB/s per thread (one reader fills the link), T2 at "
             f"{link_bps / 10 / MB:.0f} MB/s per thread (ten readers needed). T1 starts alone, T2 joins at {join:g} s, "
             f"both stop at {window:g} s; means of the delivered throughput (bytes written at the receiver, i.e. what "
             f"crossed the link) over [{join + settle:g}, {window - 0.5:g}] s. Both transfers use the "
             "same policy. Jain's index: 1 = equal shares, 0.5 = one takes all.", "",
             f"- run directory `{rd.path}`; seed {st.seed}; git `{(g.get('commit') or '?')[:12]}`"
             + (f"; skipped policies: {skipped}" if skipped else ""), "",
             "![fairness](fairness.png)", ""]
    head = ["policy", "T1 alone MB/s", "T1 MB/s", "T2 MB/s", "T1 share", "Jain", "link use",
            "net threads T1 / T2", "read threads T1 / T2", "TCP retransmit ratio"]
    tr = []
    for m in mets:
        th = m["threads"]
        tr.append([m["policy"], M.mb(m["t1_alone_bps"]), M.mb(m["mean_bps"][0]), M.mb(m["mean_bps"][1]),
                   M.fmt(m["share_t1"], 2), M.fmt(m["jain"], 3), M.fmt(100 * (m["utilisation"] or 0), 0) + "%",
                   f"{M.fmt(th[0]['net_mean'], 1)} / {M.fmt(th[1]['net_mean'], 1)}",
                   f"{M.fmt(th[0]['read_mean'], 1)} / {M.fmt(th[1]['read_mean'], 1)}",
                   M.fmt(m["loss_mean"], 4)])
    lines += [M.md_table(head, tr), "",
              "Marlin's paper reports a 2:1 split for two Falcon transfers and 47%:53% for two Marlin transfers. "
              "The network-loss term of the Marlin/Falcon utilities is fed the share of TCP segments retransmitted "
              "in each interval (the sender's TCP_INFO counters); the last column is its mean over the window.", ""]
    if any(m["errors"] for m in mets):
        lines += ["Errors: " + "; ".join(f"{m['policy']}: {m['errors']}" for m in mets if m["errors"]), ""]
    rd.write_text("results.md", "\n".join(lines))
