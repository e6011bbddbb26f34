"""Several jobs on one link in the simulator: N copies of one controller, each tuning its own
transfer, coupled through the network stage they share, with and without the receiver's
connection share.

The ablation's ``competing`` family puts a fixed number of another transfer's connections on our
link; here the other transfers are controllers too, and react. Every case draws a path whose
network stage limits (the link, bandwidth ``B``, per-connection rate ``tpt``) and whose read and
write stages are each job's own. In every interval, job ``i`` runs ``n_i`` network threads (one
connection each) and its network stage carries ``n_i min(tpt, B / (n_i + k_i))``, where ``k_i`` is
the other jobs' connections in the same interval: TCP shares a full link per connection, and a
link the connections do not fill gives each its own rate.

With ``share``, each job's network count is clamped to ``total // N`` connections, as
``automdt receive --total-connections`` (default :data:`automdt.receiver.TOTAL_CONNECTIONS`)
divides its budget and the sender's controller keeps within it. Reported per job count and controller: the
jobs' delivered rate together over the link's bandwidth, Jain's index over what each delivered,
and the connections all jobs ran, over the scored intervals ``[SCORE_FROM, STEPS)``, as means over
cases with bootstrap 95% intervals.

    python -m automdt.experiments shared-link [--per-n 12] [--reps 2]
"""
from __future__ import annotations

import json
import os
import time
import zlib
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from automdt.experiments.ablation import HELD_OUT_SEED, K, SCORE_FROM, STEPS, Case, _logu, bootstrap, make_controller
from automdt.receiver import TOTAL_CONNECTIONS
from automdt.simulator.profile import Profile, StageProfile

JOBS = (2, 4, 8)
CONTROLLERS = ("default", "marlin", "model")
"""The default and the baselines whose network count reacts to the link (a fixed triple does not)."""
MiB = 2 ** 20


def shared_cases(per_n: int = 12, seed: int = HELD_OUT_SEED + 1, jobs: Sequence[int] = JOBS) -> List[Case]:
    """``per_n`` paths for each job count of ``jobs``, the same for the same seed: a link of 40 MB/s to
    4 GB/s whose connections each carry 1/2 to 1/24 of it, read and write stages 1.5-6x faster per job."""
    cases = []
    for n_jobs in jobs:
        for i in range(per_n):
            rng = np.random.default_rng([seed, n_jobs, i])
            m = int(rng.choice([16, 32, 64]))
            link = _logu(rng, 40e6, 4e9)
            net = StageProfile(link / _logu(rng, 2.0, 24.0), link)
            other = [StageProfile(bw / _logu(rng, 1.0, 0.5 * m), bw) for bw in (link * _logu(rng, 1.5, 6.0),
                                                                              link * _logu(rng, 1.5, 6.0))]
            prof = Profile(read=other[0], net=net, write=other[1], interval_s=_logu(rng, 0.5, 2.0), max_threads=m,
                           sender_buffer=int(_logu(rng, 64 * MiB, 1024 * MiB)),
                           receiver_buffer=int(_logu(rng, 64 * MiB, 1024 * MiB)), noise=rng.uniform(0.01, 0.05),
                           meta={"generator": "shared-link", "jobs": n_jobs})
            cases.append(Case(f"shared{n_jobs}-{i:03d}", f"{n_jobs} jobs", prof, [], float(rng.choice([1, 4])) * MiB))
    return cases


def _jobs(case: Case) -> int:
    return int(case.profile.meta["jobs"])


def _net_with_others(base: Profile, n: int, others: int) -> Profile:
    """``base`` for a job running ``n`` connections on a link where the other jobs run ``others``:
    its network stage carries ``n min(tpt, B / (n + others))`` at ``n`` (and in proportion below)."""
    net = base.net
    carried = n * min(net.tpt, net.bandwidth / (n + max(0, others)))
    return base.replace(net=StageProfile(carried / n, carried))


def run_shared(case: Case, label: str, rep: int, share: Optional[int]) -> Dict[str, Any]:
    """One episode of ``N`` jobs running controller ``label`` on ``case``'s link; ``share``: each
    job's connection bound (None: its thread bound)."""
    from automdt.simulator.env import BufferSimEnv

    n_jobs, m = _jobs(case), case.profile.max_threads
    cap = m if share is None else max(1, min(m, share))
    pols, envs, infos = [], [], []
    for j in range(n_jobs):
        pol = make_controller(label, case)
        start = pol.reset(m, rep * 101 + j)
        env = BufferSimEnv(case.profile, k=K, episode_steps=case.steps, random_start=False, chunk_bytes=case.chunk_bytes)
        _, info = env.reset(seed=(rep * 1_000_003 + zlib.crc32(case.name.encode()) + 7919 * j) % (2 ** 31),
                            options={"threads": (int(start[0]), min(int(start[1]), cap), int(start[2]))})
        pols.append(pol)
        envs.append(env)
        infos.append(info)
    delivered = np.zeros((case.steps, n_jobs))
    conns = np.zeros(case.steps)
    for step in range(case.steps):
        triples = []
        for pol, info in zip(pols, infos):
            r, n, w = (int(x) for x in pol.act(info["observation"]))
            triples.append((r, min(n, cap), w))
        total = sum(t[1] for t in triples)
        for j, (env, t) in enumerate(zip(envs, triples)):
            env.set_path(_net_with_others(case.profile, t[1], total - t[1]))
            _, _, _, _, infos[j] = env.step_threads(t)
            delivered[step, j] = infos[j]["sim/write/moved_bps"]
        conns[step] = total
    s = slice(SCORE_FROM, case.steps)
    per_job = delivered[s].mean(axis=0)
    jain = float(per_job.sum() ** 2 / (n_jobs * (per_job ** 2).sum())) if per_job.any() else 0.0
    return {"case": case.name, "jobs": n_jobs, "controller": label, "share": share is not None, "rep": rep,
            "of_link": float(delivered[s].sum(axis=1).mean() / case.profile.net.bandwidth), "jain": jain,
            "connections": float(conns[s].mean()), "per_job_bps": [round(float(x), 1) for x in per_job]}


def run_all(cases: Sequence[Case], labels: Sequence[str] = CONTROLLERS, reps: int = 2,
            total_connections: int = TOTAL_CONNECTIONS) -> List[Dict[str, Any]]:
    """Every case with every controller, without and with the share, ``reps`` times each."""
    rows = []
    for case in cases:
        for label in labels:
            for share in (None, max(1, total_connections // _jobs(case))):
                for rep in range(reps):
                    rows.append(run_shared(case, label, rep, share))
    return rows


def summarize(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per job count, controller and share: means over cases (each the mean of its repetitions) of
    the rate over the link, Jain's index and the connections, with bootstrap 95% intervals."""
    out = []
    keys = sorted({(r["jobs"], r["controller"], r["share"]) for r in rows}, key=lambda k: (k[0], CONTROLLERS.index(k[1])
                  if k[1] in CONTROLLERS else 99, k[2]))
    for jobs, label, share in keys:
        sel = [r for r in rows if (r["jobs"], r["controller"], r["share"]) == (jobs, label, share)]
        per: Dict[str, Dict[str, List[float]]] = {}
        for r in sel:
            d = per.setdefault(r["case"], {"of_link": [], "jain": [], "connections": []})
            for k in d:
                d[k].append(r[k])
        row: Dict[str, Any] = {"jobs": jobs, "controller": label, "share": share, "cases": len(per)}
        for k in ("of_link", "jain", "connections"):
            x = np.array([float(np.mean(d[k])) for d in per.values()])
            lo, hi = bootstrap(x, np.mean)
            row[k] = round(float(x.mean()), 4)
            row[f"{k}_ci"] = [round(lo, 4), round(hi, 4)]
            if k != "connections":
                row[f"{k}_min"] = round(float(x.min()), 4)
        out.append(row)
    return out


def tables(summary: Sequence[Dict[str, Any]], total_connections: int = TOTAL_CONNECTIONS) -> str:
    """The Markdown table of :func:`summarize`'s rows."""
    lines = ["## Several jobs on one link (simulator)", "",
             f"N jobs, each its own controller, share one link (`experiments/shared_link.py`); with the share each "
             f"keeps its connections within {total_connections} // N, as `automdt receive --total-connections` "
             "gives them. Means over cases [bootstrap 95%], worst case after the slash.", "",
             "| jobs | controller | receiver share | rate / link | Jain | connections, all jobs |",
             "|---|---|---|---|---|---|"]
    for r in summary:
        lines.append(f"| {r['jobs']} | {r['controller']} | {'yes' if r['share'] else 'no'} | "
                     f"{r['of_link']:.3f} [{r['of_link_ci'][0]:.3f}, {r['of_link_ci'][1]:.3f}] / {r['of_link_min']:.3f} | "
                     f"{r['jain']:.3f} [{r['jain_ci'][0]:.3f}, {r['jain_ci'][1]:.3f}] / {r['jain_min']:.3f} | "
                     f"{r['connections']:.1f} |")
    return "\n".join(lines) + "\n"


def write_results(out_dir: str, cases: Sequence[Case], rows: Sequence[Dict[str, Any]], reps: int, seconds: float) -> str:
    """``shared-link.json`` (configuration, rows, summary) and ``shared-link.md`` in ``out_dir``;
    returns the Markdown."""
    os.makedirs(out_dir, exist_ok=True)
    summary = summarize(rows)
    with open(os.path.join(out_dir, "shared-link.json"), "w") as f:
        json.dump({"config": {"cases": len(cases), "reps": reps, "steps": STEPS, "score_from": SCORE_FROM,
                              "total_connections": TOTAL_CONNECTIONS, "date": time.strftime("%Y-%m-%d"),
                              "seconds": round(seconds, 1)},
                   "summary": summary, "rows": list(rows), "cases": [c.describe() for c in cases]}, f, indent=1)
    md = tables(summary)
    with open(os.path.join(out_dir, "shared-link.md"), "w") as f:
        f.write(md)
    return md


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m automdt.experiments shared-link``: prints the table and the run directory."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m automdt.experiments shared-link",
                                description="Several jobs, each with its own controller, on one simulated link, "
                                            "with and without the receiver's connection share.")
    p.add_argument("--per-n", type=int, default=12, help="cases per job count (default 12)")
    p.add_argument("--jobs", default=",".join(map(str, JOBS)), help="comma list of job counts (default 2,4,8)")
    p.add_argument("--controllers", default=",".join(CONTROLLERS), help="comma list (default %(default)s)")
    p.add_argument("--reps", type=int, default=2, help="repetitions per case, other noise (default 2)")
    p.add_argument("--out", default="runs", help="parent directory of the run directory (default runs)")
    a = p.parse_args(argv)
    try:
        jobs = [int(x) for x in a.jobs.split(",") if x.strip()]
    except ValueError:
        p.error(f"--jobs {a.jobs!r}: a comma list of counts")
    if not jobs or min(jobs) < 2 or a.per_n < 1 or a.reps < 1:
        p.error("--jobs counts of at least 2; --per-n and --reps at least 1")
    cases = shared_cases(a.per_n, jobs=jobs)
    t0 = time.monotonic()
    rows = run_all(cases, [x.strip() for x in a.controllers.split(",") if x.strip()], a.reps)
    out_dir = os.path.join(a.out, "shared-link-" + time.strftime("%Y%m%d-%H%M%S"))
    print(write_results(out_dir, cases, rows, a.reps, time.monotonic() - t0))
    print(f"shared-link: {out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
