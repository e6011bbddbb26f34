"""``python -m automdt.experiments changing``: every policy on paths that change during the transfer.

Scenarios (``--scenarios``; each transfer copies a dataset to completion while the path changes at
fixed times, counted from the start of the transfer):

=====================  =============================================================================
``moving-bottleneck``  loopback, a throttle schedule (``--throttle @FILE``, written to the run
                       directory): read-bound (5 MB/s per read thread, 40 MB/s) for 12 s, then
                       write-bound (5 MB/s per write thread, 40 MB/s); optimum (8,2,2) -> (2,2,8)
``link-halves``        two namespaces, a 40 MB/s ``tc tbf`` link, 40 ms RTT and 256 KiB per
                       connection through the delay forwarder (6.6 MB/s per connection): the link
                       drops to 20 MB/s at 10 s (``tc qdisc change``) and recovers at 20 s
``competing-transfer`` the same link; a second transfer (static 2,8,2, its own sender process)
                       joins at 10 s and leaves at 20 s
``schedule``           with ``--throttle @FILE``: loopback with the given schedule (held-out
                       schedules: any ``{at, throttle}`` list)
=====================  =============================================================================

Policies: ``ppo`` (shipped), ``ppo-own`` (explore the path as it starts, train with changing
episodes (:class:`~automdt.simulator.changes.ProfileChanges`), transfer), ``marlin``,
``falcon``, ``globus``, ``heuristic``, ``model``, ``oracle`` (one static triple that is optimal
for every phase: each stage's largest phase optimum; for the links, from the link rate and the
per-connection window/RTT) and ``oracle-phases`` (each phase's optimum, switched at the change
times: it knows the future, no tuner does).

Metrics per transfer: for each change, **seconds until 90% of the new achievable rate** (the end of
the first interval that starts after the change, reaches 90% and whose mean over three intervals
does too, minus the change time; ``-`` if not within the phase); **completion time**; mean threads
per stage; CPU (both ends, % of one core). The *achievable rate* of a phase: for throttle phases
``min_i min(max_threads * thread_i, total_i)``; for link phases the link rate times the path's
goodput efficiency (a calibration transfer with 16 connections alone on the full link, before the
policies), divided by the number of transfers sharing the link (the fair share).
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from automdt.experiments import metrics as M
from automdt.policy_contract import STAGES
from automdt.experiments import plots
from automdt.experiments.real import (PolicyUnavailable, check_lines, explore_and_train, load_average,
                                      profile_summary, report_head, to_result)
from automdt.experiments.real import policy_spec as real_policy_spec
from automdt.experiments.realpaths import PathSession, RealScenario
from automdt.experiments.runner import RunDir, RunResult, interval_rows, ppo_default_info
from automdt.experiments.scenarios import MB

CHANGING_POLICIES = ("ppo", "ppo-own", "marlin", "falcon", "globus", "heuristic", "model", "oracle",
                     "oracle-phases")
QUICK_POLICIES = ("ppo", "marlin", "oracle-phases")
KiB = 1024
TARGET_S = 3.0
"""The issue's target: back to 90% of the new achievable rate within 3 s of each change."""


@dataclass(frozen=True)
class ChangingScenario:
    """A path and what changes on it, at which time (seconds from the start of the transfer)."""

    name: str
    description: str
    path: RealScenario
    throttle_phases: Tuple[Tuple[float, str], ...] = ()
    """A throttle schedule ``((at_s, spec), ...)`` (loopback scenarios)."""
    rate_events: Tuple[Tuple[float, float], ...] = ()
    """``tc`` link-rate changes ``((at_s, rate_bps), ...)`` (network scenarios)."""
    competitor: Optional[Tuple[float, float, str]] = None
    """``(join_s, leave_s, policy spec)`` of a second transfer on the same link."""
    phase_optima: Tuple[Tuple[int, int, int], ...] = ()
    """Each phase's optimal triple (the ``oracle-phases`` yardstick)."""
    nominal_s: float = 30.0
    """Seconds the dataset lasts at the phases' achievable rates (sets the dataset size)."""
    changes_for_training: Dict[str, Any] = field(default_factory=dict)
    """Options of :class:`~automdt.simulator.changes.ProfileChanges` for ppo-own's training."""

    @property
    def change_times(self) -> List[float]:
        ts = [a for a, _ in self.throttle_phases if a > 0] + [a for a, _ in self.rate_events]
        if self.competitor is not None:
            ts += [self.competitor[0], self.competitor[1]]
        return sorted(ts)

    def schedule(self) -> Optional[List[Dict[str, Any]]]:
        return [{"at": a, "throttle": s} for a, s in self.throttle_phases] or None

    def phase_nominals(self, goodput: float = 1.0) -> List[Optional[float]]:
        """Achievable rate of each phase (phase 0 from the start, one more after each change)."""
        out: List[Optional[float]] = []
        starts = [0.0] + self.change_times
        for t in starts:
            if self.throttle_phases:
                spec = [s for a, s in self.throttle_phases if a <= t + 1e-9][-1]
                out.append(throttle_achievable(spec, self.path.max_threads))
            else:
                rate = self.path.link_bps
                for a, r in self.rate_events:
                    if a <= t + 1e-9:
                        rate = r
                share = 1
                if self.competitor is not None and self.competitor[0] <= t + 1e-9 < self.competitor[1]:
                    share = 2
                out.append(goodput * rate / share)
        return out

    def oracle_static(self) -> Tuple[int, int, int]:
        """One triple good for every phase: each stage's largest phase optimum."""
        return tuple(max(t[j] for t in self.phase_optima) for j in range(3))  # type: ignore[return-value]

    def oracle_phases(self) -> List[Tuple[float, List[int]]]:
        starts = [0.0] + [t for t in self.change_times]
        opt = list(self.phase_optima)
        return [(s, list(opt[min(i, len(opt) - 1)])) for i, s in enumerate(starts)]

    def dataset_bytes(self, goodput: float = 0.95) -> int:
        """Bytes that last ``nominal_s`` at the phases' achievable rates."""
        starts = [0.0] + self.change_times + [self.nominal_s]
        rates = self.phase_nominals(goodput)
        total = 0.0
        for i, r in enumerate(rates):
            a, b = starts[i], max(starts[i], starts[i + 1] if i + 1 < len(starts) else self.nominal_s)
            total += (r or 40 * MB) * (b - a)
        return int(total)

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["path"] = self.path.to_dict()
        d["change_times"] = self.change_times
        return d


def throttle_achievable(spec: str, max_threads: int) -> Optional[float]:
    """``min_i min(max_threads * thread_i, total_i)`` of a throttle spec (None: nothing limited)."""
    from automdt.units import parse_throttle

    lim = parse_throttle(spec)
    caps = []
    for s in STAGES:
        t, total = lim[s]
        c = [x for x in (max_threads * t if t else 0.0, total) if x]
        if c:
            caps.append(min(c))
    return min(caps) if caps else None


def changing_scenarios(quick: bool = False, max_threads: int = 32) -> Dict[str, ChangingScenario]:
    """The changing-path scenarios by name (``quick``: shorter)."""
    k = 0.5 if quick else 1.0
    t1, t2 = 12.0 * k, 10.0 * k
    loop = RealScenario("loop", "loop", "loopback, engine throttles", on_disk=True, max_threads=max_threads,
                        dataset_bytes=0, n_files=16)
    link = RealScenario("link", "net", "40 MB/s tbf link, 40 ms RTT, 256 KiB per connection in flight", link_bps=40 * MB,
                        rtt_s=0.040, window=256 * KiB, on_disk=True, max_threads=max_threads, dataset_bytes=0,
                        n_files=16)
    rd = "read.thread=5M,read.total=40M,net.thread=20M,net.total=100M,write.thread=20M,write.total=100M"
    wr = "read.thread=20M,read.total=100M,net.thread=20M,net.total=100M,write.thread=5M,write.total=40M"
    per_conn = link.window / link.rtt_s
    full = int(math.ceil(link.link_bps / per_conn))
    half = int(math.ceil(link.link_bps / 2 / per_conn))
    out = [
        ChangingScenario("moving-bottleneck", f"loopback; read-bound (5 MB/s per read thread, 40 MB/s) until "
                         f"{t1:g} s, then write-bound (5 MB/s per write thread, 40 MB/s)", loop,
                         throttle_phases=((0.0, rd), (t1, wr)), phase_optima=((8, 2, 2), (2, 2, 8)),
                         nominal_s=30.0 * k, changes_for_training={}),
        ChangingScenario("link-halves", f"{link.description}; the link drops to 20 MB/s at {t2:g} s and recovers "
                         f"at {2 * t2:g} s", link, rate_events=((t2, 20 * MB), (2 * t2, 40 * MB)),
                         phase_optima=((2, full, 2), (2, half, 2), (2, full, 2)), nominal_s=30.0 * k,
                         changes_for_training={"link_only": True, "factor_range": [0.4, 1.0]}),
        ChangingScenario("competing-transfer", f"{link.description}; a second transfer (static 2,8,2) joins at "
                         f"{t2:g} s and leaves at {2 * t2:g} s", link, competitor=(t2, 2 * t2, "static:2,8,2"),
                         phase_optima=((2, full, 2), (2, full, 2), (2, full, 2)), nominal_s=30.0 * k,
                         changes_for_training={"link_only": True, "factor_range": [0.4, 1.0]}),
    ]
    return {s.name: s for s in out}


def throttle_optimum(spec: str, max_threads: int = 32) -> Tuple[int, int, int]:
    """The simulator's oracle triple for the engine throttles of ``spec`` (128 MiB buffers; a stage
    the spec leaves unlimited counts as 4 GB/s per thread and in total)."""
    from automdt.simulator.oracle import oracle
    from automdt.simulator.profile import Profile, StageProfile
    from automdt.units import parse_throttle

    lim = parse_throttle(spec)
    big = 4e9
    st = [StageProfile(lim[s][0] or big, lim[s][1] or big) for s in STAGES]
    prof = Profile(read=st[0], net=st[1], write=st[2], sender_buffer=128 << 20, receiver_buffer=128 << 20,
                   max_threads=max_threads)
    r, n, w = (int(x) for x in oracle(prof).threads)
    return (r, n, w)


def schedule_scenario(path: str, max_threads: int = 32, quick: bool = False) -> ChangingScenario:
    """A loopback scenario from a user's ``--throttle @FILE`` (a held-out schedule)."""
    from automdt.throttle import ThrottleSchedule

    sched = ThrottleSchedule.load(path)
    phases = tuple((e.at_s, e.spec) for e in sched.entries)
    if phases[0][0] > 0:
        phases = ((0.0, ""),) + phases
    optima = [throttle_optimum(spec, max_threads) for _, spec in phases]
    loop = RealScenario("loop", "loop", "loopback, engine throttles", on_disk=True, max_threads=max_threads,
                        dataset_bytes=0, n_files=16)
    end = phases[-1][0]
    return ChangingScenario("schedule", f"loopback with the schedule {os.path.basename(path)}: "
                            + "; ".join(f"{a:g} s: {s or '(no limits)'}" for a, s in phases), loop,
                            throttle_phases=phases, phase_optima=tuple(optima),  # type: ignore[arg-type]
                            nominal_s=(end + 7.0) if quick else max(30.0, end + 15.0))


# ---------------------------------------------------------------------------------------------
# metrics
# ---------------------------------------------------------------------------------------------
def time_to_fraction(rows: Sequence[Dict[str, Any]], change_t: float, achievable: Optional[float],
                     end_t: Optional[float] = None, frac: float = 0.9, hold: int = 3) -> Optional[float]:
    """Seconds from ``change_t`` to the end of the first interval that starts after it (5% slack),
    reaches ``frac`` of ``achievable`` and whose mean over ``hold`` intervals (as far as the phase
    goes) does too; ``None`` if no such interval before ``end_t``."""
    if achievable is None or achievable <= 0:
        return None
    thr = frac * achievable
    after = [r for r in rows if float(r["t"]) - float(r.get("interval_s") or 1.0) >= change_t - 0.05
             and (end_t is None or float(r["t"]) <= end_t + 0.05)]
    for i, r in enumerate(after):
        if float(r["tput_write"]) < thr:
            continue
        win = [float(x["tput_write"]) for x in after[i:i + hold]]
        if np.mean(win) >= thr:
            return float(r["t"]) - change_t
    return None


def change_metrics(rows: Sequence[Dict[str, Any]], change_t: Sequence[float], achievable: Sequence[Optional[float]]
                   ) -> List[Optional[float]]:
    """Time to 90% of each phase's achievable rate: phase 0 from the start, then after each change."""
    starts = [0.0] + list(change_t)
    out = []
    for i, s in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else None
        out.append(time_to_fraction(rows, s, achievable[i] if i < len(achievable) else None, end))
    return out


# ---------------------------------------------------------------------------------------------
# the experiment
# ---------------------------------------------------------------------------------------------
def _policy(label: str, cs: ChangingScenario, ds: Any, own: Optional[str]) -> Tuple[str, Dict[str, Any]]:
    if label == "oracle":
        return "static:%d,%d,%d" % cs.oracle_static(), {}
    if label == "oracle-phases":
        return "phases", {"phases": cs.oracle_phases()}
    return real_policy_spec(label, cs.path, ds.avg_file_size, len(ds.files), None, own)


def changing_transfer(ps: PathSession, cs: ChangingScenario, label: str, spec: str, kw: Dict[str, Any],
                      timeout: float, log_path: Optional[str]) -> Tuple[Any, List[float], List[Dict[str, Any]]]:
    """Run one transfer to completion while the path changes; (run, change times on its clock, events)."""
    pend = ps.start(label, spec, kw, duration_s=timeout, schedule=cs.schedule(), log_path=log_path)
    events: List[Dict[str, Any]] = []
    comp = None
    try:
        origin = pend.wait_started()
        if cs.competitor is not None:
            join, leave, cspec = cs.competitor
            comp = ps.start(f"competitor-{label}", cspec, {}, duration_s=leave - join, start_wall=origin + join)
            events.append({"at": join, "event": "competitor joins", "policy": cspec})
            events.append({"at": leave, "event": "competitor leaves"})
        for at, rate in cs.rate_events:
            if not _sleep_until(origin + at, pend.proc):
                break  # the transfer ended before this change
            ps.set_rate(rate)
            events.append({"at": at, "event": "link rate", "rate_bps": rate, "late_s": round(time.time() - origin - at, 3)})
        run = pend.wait()
    finally:
        pend.stop()
        if comp is not None:
            comp.stop()
            crun = comp.wait(5.0)
            events.append({"event": "competitor result", "bytes": crun.summary.get("bytes"),
                           "error": crun.error})
        if cs.rate_events:
            ps.set_rate(cs.path.link_bps)
    w0 = run.wall_t0 or origin
    change_t = [origin + t - w0 for t in cs.change_times]
    return run, change_t, events


def calibrate_goodput(ps: PathSession, quick: bool = False) -> Dict[str, float]:
    """The goodput efficiency of a network path: a static 2,16,2 transfer alone on the full link
    (6 s; ``quick``: 4 s), its median delivered rate over the link rate (at most 1)."""
    link_bps = ps.sc.link_bps
    cal = ps.run("calibration", "static:2,16,2", duration_s=4.0 if quick else 6.0, rounds=True)
    xs = [float(r["tput_write"]) for r in cal.rows[1:]] or [0.0]
    med = float(np.median(xs))
    return {"median_bps": med, "goodput_efficiency": min(1.0, med / link_bps) if link_bps else 1.0}


def _sleep_until(wall: float, proc: Any) -> bool:
    """Sleep until ``time.time() >= wall``; False if ``proc`` ended first."""
    while True:
        if proc.poll() is not None:
            return False
        left = wall - time.time()
        if left <= 0:
            return True
        time.sleep(min(left, 0.05))


def run_changing(st: Any) -> Any:
    """The ``changing`` experiment (``st``: :class:`automdt.experiments.run.Settings`); ``--from DIR``
    rewrites the tables and plots of an earlier run into a new directory."""
    from automdt.experiments.run import Experiment

    if st.from_dir:
        from automdt.experiments.real import load_run_dir

        cfg, results = load_run_dir(st.from_dir)
        rd = RunDir(st.out, "changing")
        rd.write_config(cfg | {"from": os.path.abspath(st.from_dir), "original_git": cfg.get("git")})
        names = list(cfg["scenarios"])
        summary = write_changing_results(st, rd, names, cfg["policies"], cfg["scenarios"], cfg.get("skipped", {}),
                                         results)
        return Experiment("changing", rd.path, results, cfg.get("skipped", {}), summary)

    all_sc = changing_scenarios(st.quick, st.max_threads)
    if getattr(st, "throttle", None):
        all_sc["schedule"] = schedule_scenario(st.throttle.lstrip("@"), st.max_threads, st.quick)
    default = ["schedule"] if "schedule" in all_sc else (["moving-bottleneck"] if st.quick else
                                                         ["moving-bottleneck", "link-halves", "competing-transfer"])
    names = list(st.scenarios) if st.scenarios else default
    bad = [n for n in names if n not in all_sc]
    if bad:
        raise SystemExit(f"unknown changing scenario(s) {bad}; choose from {list(all_sc)}")
    labels = list(st.policies) if st.policies else list(QUICK_POLICIES if st.quick else CHANGING_POLICIES)
    rd = RunDir(st.out, "changing")
    st.log(f"[changing] {rd.path}: {len(names)} scenarios x {len(labels)} policies")
    cfg: Dict[str, Any] = {"seed": st.seed, "settings": st.to_dict(), "policies": labels, "scenarios": {},
                           "skipped": {}, "ppo_default": ppo_default_info() if "ppo" in labels else None,
                           "options": {"memory": st.memory, "chunk_size": st.chunk_size, "interval_s": st.interval_s},
                           "rerun": "python -m automdt.experiments changing" + (" --quick" if st.quick else "")
                                    + (f" --scenarios {','.join(names)}" if st.scenarios else "")
                                    + (f" --policies {','.join(labels)}" if st.policies else "")
                                    + (f" --throttle {st.throttle}" if getattr(st, "throttle", None) else "")
                                    + f" --seed {st.seed}"}
    rd.write_config(cfg)
    results: List[RunResult] = []
    per: Dict[str, Dict[str, Any]] = {}
    for name in names:
        cs = all_sc[name]
        ok, why = cs.path.requirements()
        if not ok:
            cfg["skipped"][name] = why
            st.log(f"  {name}: skipped ({why})")
            continue
        info = _run_scenario(st, rd, name, cs, labels, results)
        info["load_end"] = load_average()
        per[name] = info
        cfg["scenarios"][name] = info
        rd.update_config(scenarios=cfg["scenarios"], skipped=cfg["skipped"])
    rd.write_csv("intervals.csv", interval_rows(results))
    rd.write_csv("runs.csv", [r.table_row() for r in results])
    summary = write_changing_results(st, rd, names, labels, per, cfg["skipped"], results)
    return Experiment("changing", rd.path, results, cfg["skipped"], summary)


def _run_scenario(st: Any, rd: RunDir, name: str, cs: Any, labels: Sequence[str], results: List[RunResult]
                  ) -> Dict[str, Any]:
    """Run every policy of ``labels`` through the changing scenario ``cs`` (appending their
    results to ``results``); returns what the scenario's section of ``results.md`` needs."""
    from automdt.simulator.changes import ProfileChanges

    st.log(f"  {name}: {cs.description}")
    path = cs.path.scaled(dataset_bytes=cs.dataset_bytes())
    info: Dict[str, Any] = {"scenario": cs.to_dict(), "load_start": load_average(), "skipped_policies": {}}
    if cs.schedule():
        from automdt.throttle import ThrottleSchedule

        ThrottleSchedule.from_list(cs.schedule(), name).save(rd.file(f"schedule-{name}.yaml"))
        info["schedule_file"] = f"schedule-{name}.yaml"
    with PathSession(path, rd.file(f"work/{name}"), memory=st.memory, chunk_size=st.chunk_size,
                     interval_s=st.interval_s, drop_caches=st.drop_caches, seed=st.seed, log=st.log) as ps:
        info["path"] = ps.describe()
        ds = ps.dataset
        goodput = 1.0
        if path.kind == "net":
            info["calibration"] = calibrate_goodput(ps, st.quick)
            goodput = info["calibration"]["goodput_efficiency"]
            st.log(f"    calibration: {info['calibration']['median_bps'] / MB:.1f} MB/s on the "
                   f"{path.link_bps / MB:.0f} MB/s link (goodput {goodput:.2f})")
        achievable = cs.phase_nominals(goodput)
        info["achievable_bps"] = achievable
        own = None
        if "ppo-own" in labels:
            first = cs.schedule()[:1] if cs.schedule() else None
            changes = ProfileChanges(**{k: (tuple(v) if isinstance(v, list) else v)
                                        for k, v in cs.changes_for_training.items()})
            own, prof, oinfo = explore_and_train(ps, st, rd, name, changes=changes, schedule=first)
            info["ppo_own"] = oinfo
            if prof is not None:
                info["explored_profile"] = profile_summary(prof)
        timeout = 4.0 * cs.nominal_s + 40.0
        for lab in labels:
            try:
                spec, kw = _policy(lab, cs, ds, own)
            except PolicyUnavailable as e:
                info["skipped_policies"][lab] = str(e)
                continue
            run, change_t, events = changing_transfer(ps, cs, lab, spec, kw, timeout, rd.log_path(name, lab))
            res = to_result(run, name, ds.spec.name, achievable[0] or 1.0, "net",
                            dict(zip(STAGES, cs.phase_optima[0])))
            ttf = change_metrics(run.rows, change_t, achievable)
            res.extra.update(spec=spec, change_t=[round(x, 3) for x in change_t], time_to_90=ttf, events=events,
                             completion_s=run.summary.get("seconds"))
            results.append(res)
            st.log(f"    {lab:13s} completion {M.fmt(run.summary.get('seconds'), 1)} s, to 90% after each change "
                   f"{[None if x is None else round(x, 1) for x in ttf[1:]]}, threads "
                   + ",".join(M.fmt(res.metrics.get(f'mean_threads_{s}'), 1) for s in STAGES)
                   + (f"  ERROR {res.error}" if res.error else ""))
    return info


def _against_marlin(results: Sequence[RunResult], groups: Sequence[str], checks: List[Tuple[str, Optional[bool], str]]
                    ) -> List[str]:
    """The section comparing the PPO policies' completion over the suite with Marlin's (its check
    appended to ``checks``); no lines when no scenario ran both."""
    ratio_rows = []
    for p in ("ppo", "ppo-own"):
        pairs = [(next((r for r in results if r.scenario == n and r.policy == "marlin"), None),
                  next((r for r in results if r.scenario == n and r.policy == p), None)) for n in groups]
        pairs = [(m, x) for m, x in pairs if m is not None and x is not None
                 and m.extra.get("completion_s") and x.extra.get("completion_s")]
        if not pairs:
            continue
        # a transfer that did not complete counts with the time it was given: a lower bound of its
        # completion time (marked '>')
        tm = sum(float(m.extra["completion_s"]) for m, _ in pairs)
        tp = sum(float(x.extra["completion_s"]) for _, x in pairs)
        ratio = tm / tp if tp else None
        per_sc = ", ".join(f"{m.scenario} {float(m.extra['completion_s']) / float(x.extra['completion_s']):.2f}x"
                           + (" (policy did not complete: > its time)" if not x.completed else "")
                           + (" (Marlin did not complete)" if not m.completed else "") for m, x in pairs)
        incomplete = any(not (m.completed and x.completed) for m, x in pairs)
        ratio_rows.append([p, f"{tm:.1f}", ("> " if incomplete else "") + f"{tp:.1f}", M.fmt(ratio, 2), per_sc])
        checks.append((f"{p} completes the changing-path suite at least 1.33x faster than Marlin",
                       ratio is not None and ratio >= 1.33, f"{M.fmt(ratio, 2)}x ({per_sc})"))
    if not ratio_rows:
        return []
    return ["## PPO vs Marlin over the suite", "",
            M.md_table(["policy", "Marlin total s", "policy total s", "Marlin / policy", "per scenario"], ratio_rows), ""]


def write_changing_results(st: Any, rd: RunDir, names: Sequence[str], labels: Sequence[str],
                           per: Dict[str, Dict[str, Any]], skipped: Dict[str, str], results: Sequence[RunResult]
                           ) -> Dict[str, Any]:
    """``results.md`` and the plots of a changing run: one section per scenario, the completion
    chart, PPO against Marlin, the checks; returns the summary the experiment reports."""
    lines = report_head("Changing paths",
                        "Each policy copies a dataset to completion while the path changes at fixed times "
                        "(`experiments/changing.py`): seconds until 90% of the new achievable rate after each change, "
                        "completion time, mean threads per stage, CPU (both ends).", st, rd, skipped, "Scenarios")
    checks: List[Tuple[str, Optional[bool], str]] = []
    totals: Dict[str, List[float]] = {}
    comp_series: Dict[str, List[Optional[float]]] = {lab: [] for lab in labels}
    groups = []
    for name in names:
        if name not in per:
            continue
        info = per[name]
        sc = info["scenario"]
        runs = [r for r in results if r.scenario == name]
        groups.append(name)
        ach = info["achievable_bps"]
        lines += [f"## {name}", "", f"{sc['description']}. Changes at {sc['change_times']} s; achievable per phase "
                  f"{[None if a is None else round(a / MB, 1) for a in ach]} MB/s; phase optima "
                  f"{[tuple(t) for t in sc['phase_optima']]}. Load average at start / end: {info.get('load_start')} / "
                  f"{info.get('load_end')}."
                  + (f" Schedule: `{info['schedule_file']}`." if info.get("schedule_file") else ""), ""]
        if info.get("calibration"):
            c = info["calibration"]
            lines += [f"Calibration (static 2,16,2 alone on the full link): {c['median_bps'] / MB:.1f} MB/s, goodput "
                      f"efficiency {c['goodput_efficiency']:.2f}.", ""]
        if info.get("explored_profile"):
            lines += [f"ppo-own explored (`profiles/{name}-explored.yaml`): {info['explored_profile']}.", ""]
        if info.get("ppo_own", {}).get("error"):
            lines += [f"ppo-own: {info['ppo_own']['error']}", ""]
        if info.get("skipped_policies"):
            lines += ["Policies not run: " + "; ".join(f"**{k}**: {v}" for k, v in info["skipped_policies"].items()), ""]
        nchg = len(sc["change_times"])
        head = (["policy", "completion s", "to 90% from start s"] + [f"to 90% after change {i + 1} s" for i in range(nchg)]
                + ["mean threads (r,n,w)", "CPU % both ends"])
        rows = []
        for r in runs:
            ttf = r.extra.get("time_to_90") or []
            rows.append([r.policy, ("" if r.completed else "> ") + M.fmt(r.extra.get("completion_s"), 2)
                         + ("" if r.completed else " (did not complete)")]
                        + [M.fmt(x, 1) if x is not None else "never" for x in (ttf + [None] * (nchg + 1))[:nchg + 1]]
                        + [",".join(M.fmt(r.metrics.get(f"mean_threads_{s}"), 1) for s in STAGES),
                           M.fmt(r.extra.get("cpu_pct_both_ends"), 0)])
            if r.error:
                rows[-1][0] += f" (error: {r.error[:60]})"
            if r.completed and r.extra.get("completion_s"):
                totals.setdefault(r.policy, []).append(float(r.extra["completion_s"]))
        for lab in labels:
            r = next((x for x in runs if x.policy == lab), None)
            comp_series[lab].append(r.extra.get("completion_s") if r else None)
        lines += [M.md_table(head, rows), ""]
        if runs:
            phases = [{"achievable_bps": a} for a in ach]
            plots.changing_timeseries(rd.file(f"changing-{name}.png"), f"{name}", runs, sc["change_times"], phases)
            lines += [f"![{name}](changing-{name}.png)", ""]
        for r in runs:
            if r.policy not in ("ppo", "ppo-own"):
                continue
            ttf = (r.extra.get("time_to_90") or [])[1:]
            for i, x in enumerate(ttf):
                checks.append((f"{name}: {r.policy} back to 90% of the new achievable rate within {TARGET_S:g} s "
                               f"after change {i + 1}", x is not None and x <= TARGET_S + 0.15,
                               "never" if x is None else f"{x:.1f} s"))
    if groups:
        plots.grouped_bars(rd.file("changing-completion.png"), "completion time (lower is better)", groups,
                           comp_series, "seconds")
        lines += ["## Completion", "", "![completion](changing-completion.png)", ""]
    lines += _against_marlin(results, groups, checks)
    lines += check_lines(checks)
    rd.write_text("results.md", "\n".join(lines))
    st.log(f"[changing] wrote {rd.path}/results.md")
    return {"checks": [{"check": t, "pass": ok, "detail": d} for t, ok, d in checks], "scenarios": per,
            "completion_totals": totals}
