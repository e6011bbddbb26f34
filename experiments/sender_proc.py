"""One sender as a child process (the fairness, real-path and changing-path experiments run it,
inside a network namespace where the path needs one).

``python -m automdt.experiments.sender_proc CONFIG.json OUT.json``. CONFIG holds ``src``, ``dest``
(``HOST:PORT/SUBDIR``), ``policy`` (a registry spec, or ``grid`` / ``phases`` for the yardsticks
of :mod:`automdt.experiments.policies`), optional ``policy_kwargs``, ``secret_file``, ``throttle``
(``{stage: [per_thread, total]}``), ``memory``, ``chunk_size``, ``interval_s``, ``max_threads``,
``max_duration_s``, and optionally:

* ``throttle_schedule``: ``[{at, throttle}, ...]`` (``--throttle @FILE``), timed from ``origin_wall``
  (``time.time()``; default: now);
* ``fsync``: ``none`` / ``file`` / ``dir``; ``log_path``: the controller's interval log;
* ``rounds``: copy the dataset again (into ``SUBDIR/roundK``) until ``max_duration_s`` has passed,
  with one policy state across rounds (:class:`~automdt.experiments.policies.Continuing`);
  ``dest_local_root``: where the receiver writes ``SUBDIR`` on this machine, so finished rounds
  are removed; ``cold``: ``file`` (``posix_fadvise(DONTNEED)`` on the source files) or ``all``
  (``echo 3 > /proc/sys/vm/drop_caches``) before every round, so every read comes from the disk;
* ``forward``: ``{delay_ms, window, rcvbuf}``: the control channel and every data connection go
  through a :mod:`~automdt.experiments.delay_forwarder` process (started here, ended here by PID),
  which adds the round-trip time and caps each connection's bytes in flight; ``sndbuf``: the
  engine's per-connection send buffer cap (``--sndbuf``);
* ``start_wall``: wait until this ``time.time()`` before starting (a transfer that joins later);
  ``OUT.started`` receives the wall-clock origin once the transfer is about to start;
* ``mode: explore``: random triples (:class:`automdt.explore.RandomExplorer`) instead of the
  policy, and the profile fitted from the samples is written to ``profile_out``.

OUT receives ``{"wall_t0", "summary", "history", "rounds", "cpu_s", "forwarder_cpu_s", "error"}``:
``wall_t0`` is the wall-clock time (``time.time()``) of the first controller start and every
history record's ``t`` counts from it (``t_round`` keeps the round's own clock), so intervals of
processes that started at different moments line up.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

FORWARDER_START_S = 15.0


class Forwarders:
    """Delay-forwarder processes of this sender (one per forwarded target), ended by PID."""

    def __init__(self, delay_ms: float, window: int, rcvbuf: int = 0) -> None:
        self.delay_ms, self.window, self.rcvbuf = float(delay_ms), int(window), int(rcvbuf)
        self.procs: Dict[Tuple[str, int], Tuple[subprocess.Popen, int]] = {}
        self.cpu_s = 0.0

    def address(self, host: str, port: int) -> Tuple[str, int]:
        key = (host, int(port))
        if key not in self.procs:
            p = subprocess.Popen(
                [sys.executable, "-m", "automdt.experiments.delay_forwarder", "--listen", "127.0.0.1:0",
                 "--target", f"{host}:{port}", "--delay-ms", str(self.delay_ms), "--window", str(self.window),
                 "--rcvbuf", str(self.rcvbuf)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            line = _readline(p, FORWARDER_START_S)
            if not line.startswith("listening on "):
                self._end(p)
                raise RuntimeError(f"delay forwarder did not start: {line.strip()!r}")
            lport = int(line.split()[2].rsplit(":", 1)[1])
            self.procs[key] = (p, lport)
        return "127.0.0.1", self.procs[key][1]

    def close(self) -> None:
        for p, _ in self.procs.values():
            self.cpu_s += _cpu_of(p.pid)
            self._end(p)
        self.procs.clear()

    @staticmethod
    def _end(p: subprocess.Popen) -> None:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def _readline(p: subprocess.Popen, timeout: float) -> str:
    import select

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([p.stdout], [], [], 0.2)
        if r:
            return p.stdout.readline()
        if p.poll() is not None:
            return p.stdout.read() or f"exited {p.returncode}"
    return "timeout"


def _cpu_of(pid: int) -> float:
    """User + system CPU seconds of a live process (0 if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        tck = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / tck
    except (OSError, IndexError, ValueError):
        return 0.0


def drop_cache(root: str, mode: Optional[str]) -> None:
    """Evict ``root``'s files from the page cache: ``file`` (fadvise each file) or ``all`` (drop_caches)."""
    if not mode:
        return
    os.sync()
    if mode == "all":
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return
    for dp, _, fs in os.walk(root):
        for name in fs:
            try:
                fd = os.open(os.path.join(dp, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def build_policy(cfg: Dict[str, Any]):
    """The policy named by ``cfg['policy']`` (registry spec, ``grid`` or ``phases``)."""
    spec = cfg["policy"]
    kw = dict(cfg.get("policy_kwargs") or {})
    mt = int(cfg["max_threads"])
    if spec == "grid":
        from automdt.experiments.policies import GridPolicy

        return GridPolicy(kw["triples"], int(kw.get("hold", 3)))
    if spec == "phases":
        from automdt.experiments.policies import PhasedStatic

        return PhasedStatic(kw["phases"], kw.get("origin_wall"))
    from automdt.agents.registry import make_policy

    return make_policy(spec, mt, **kw)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg_path, out_path = argv
    with open(cfg_path) as f:
        cfg = json.load(f)
    # SIGTERM from the experiment between rounds ends like Ctrl-C (forwarders ended, OUT written);
    # during a transfer run_transfer's own handler stops it cleanly (exit 143)
    signal.signal(signal.SIGTERM, _interrupt)
    from automdt.experiments.policies import Continuing
    from automdt.protocol import read_secret

    secret = read_secret(cfg["secret_file"]) if cfg.get("secret_file") else None
    explore = cfg.get("mode") == "explore"
    if explore:
        from automdt.explore import RandomExplorer

        policy: Any = RandomExplorer(int(cfg.get("seed", 0)))
    else:
        policy = build_policy(cfg)
    rounds = bool(cfg.get("rounds")) or explore
    if rounds:
        policy = Continuing(policy)
    fwd = (Forwarders(cfg["forward"]["delay_ms"], cfg["forward"].get("window", 4 << 20), cfg["forward"].get("rcvbuf", 0))
           if cfg.get("forward") else None)
    seen: Dict[str, float] = {}

    def progress(summary, ctrl):
        if "ctrl_t0" not in seen:
            seen["ctrl_t0"] = time.time() - (time.monotonic() - ctrl.t0)

    opts, dest = _options(cfg, policy, secret, fwd, progress)
    if cfg.get("start_wall"):  # a transfer that joins at a given moment (a competing transfer)
        time.sleep(max(0.0, float(cfg["start_wall"]) - time.time()))
    origin_wall = float(cfg.get("origin_wall") or time.time())
    if opts.throttle_schedule is not None:
        from dataclasses import replace as _replace

        opts = _replace(opts, schedule_t0=time.monotonic() - (time.time() - origin_wall))
    with open(out_path + ".started", "w") as f:  # the experiment times its path events from this
        f.write(repr(origin_wall))
    error = None
    out_rounds: List[Dict[str, Any]] = []
    c0 = os.times()
    t_start = time.monotonic()
    try:
        _copy(cfg, opts, dest, policy, rounds, explore, seen, out_rounds, t_start)
    except KeyboardInterrupt:
        error = "interrupted"
    except Exception as e:  # report, never hang the parent
        error = f"{type(e).__name__}: {e}"
    finally:
        if fwd is not None:
            fwd.close()
    c1 = os.times()
    result = _merge(out_rounds)
    result.update(cpu_s=(c1.user + c1.system) - (c0.user + c0.system),
                  forwarder_cpu_s=fwd.cpu_s if fwd is not None else 0.0, error=error,
                  origin_wall=origin_wall)
    if explore and out_rounds and error is None:
        try:
            result["profile"] = _fit(cfg, out_rounds)
        except Exception as e:  # noqa: BLE001
            result["error"] = f"fit failed: {type(e).__name__}: {e}"
    with open(out_path, "w") as f:
        json.dump(result, f)
    return 0 if result["error"] is None else 1


def _options(cfg: Dict[str, Any], policy: Any, secret: Any, fwd: Any, progress: Any) -> Tuple[Any, str]:
    """The transfer's options from the configuration, and the destination to give it (through
    the delay forwarder when ``fwd`` is one: the control channel and the data connections)."""
    from automdt.sender import TransferOptions, parse_dest

    sched = None
    if cfg.get("throttle_schedule"):
        from automdt.throttle import ThrottleSchedule

        sched = ThrottleSchedule.from_list(cfg["throttle_schedule"], "config")
    dest = cfg["dest"]
    hook = None
    if fwd is not None:  # the control channel through the forwarder too
        (host, port), sub = parse_dest(dest)
        fh, fp = fwd.address(host, port)
        dest = f"{fh}:{fp}/{sub}" if sub else f"{fh}:{fp}"
        # the receiver announces its data port; it listens on the receiver's host, not the forwarder's
        hook = lambda h, p: fwd.address(host, p)  # noqa: E731
    opts = TransferOptions(policy=policy, memory=int(cfg["memory"]), chunk_size=int(cfg["chunk_size"]),
                           throttle={k: tuple(v) for k, v in (cfg.get("throttle") or {}).items()}, secret=secret,
                           interval_s=float(cfg["interval_s"]), max_threads=int(cfg["max_threads"]),
                           max_duration_s=float(cfg["max_duration_s"]), progress=progress,
                           fsync=cfg.get("fsync", "none"), log_path=cfg.get("log_path"),
                           throttle_schedule=sched, data_endpoint_hook=hook, stall_s=float(cfg.get("stall_s", 60.0)),
                           sndbuf=int(cfg.get("sndbuf", 0)))
    return opts, dest


def _copy(cfg: Dict[str, Any], opts: Any, dest: str, policy: Any, rounds: bool, explore: bool,
          seen: Dict[str, float], out_rounds: List[Dict[str, Any]], t_start: float) -> None:
    """Copy the source once, or (``rounds``) again into a new directory each time until the
    duration is up, the policy is done or a copy fails; each copy's record goes to ``out_rounds``."""
    from dataclasses import replace

    from automdt.sender import run_transfer

    k = 0
    while True:
        left = float(cfg["max_duration_s"]) - (time.monotonic() - t_start)
        if k > 0 and left < 2 * opts.interval_s:
            return
        drop_cache(cfg["src"], cfg.get("cold"))
        target = f"{dest}/round{k}" if rounds else dest
        seen.pop("ctrl_t0", None)
        summary = run_transfer(cfg["src"], target, replace(opts, max_duration_s=max(left, opts.interval_s)))
        out_rounds.append({"wall_t0": seen.get("ctrl_t0"), "summary": summary.as_dict(),
                           "history": [r.to_json() for r in summary.history]})
        if rounds and cfg.get("dest_local_root"):
            shutil.rmtree(os.path.join(cfg["dest_local_root"], f"round{k}"), ignore_errors=True)
        k += 1
        if not rounds or summary.exit_code != 0:  # one copy, the duration is up, or a failure
            return
        if getattr(policy, "done", False) and not explore:
            return


def _merge(rounds: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One history on one clock (the first round's controller start) and one summary."""
    if not rounds:
        return {"wall_t0": None, "summary": {}, "history": [], "rounds": []}
    w0 = next((r["wall_t0"] for r in rounds if r["wall_t0"] is not None), None)
    hist = []
    for i, r in enumerate(rounds):
        off = (r["wall_t0"] - w0) if (r["wall_t0"] is not None and w0 is not None) else 0.0
        for rec in r["history"]:
            hist.append(dict(rec, t=round(rec["t"] + off, 3), t_round=rec["t"], round=i))
    s0 = dict(rounds[-1]["summary"])
    for key in ("bytes", "files_transferred", "files_failed", "chunks_resent"):
        s0[key] = sum(int(r["summary"].get(key) or 0) for r in rounds)
    s0["rounds"] = len(rounds)
    s0["seconds_active"] = round(sum(float(r["summary"].get("seconds") or 0.0) for r in rounds), 3)
    return {"wall_t0": w0, "summary": s0, "history": hist,
            "rounds": [{"wall_t0": r["wall_t0"], "summary": r["summary"]} for r in rounds]}


def _fit(cfg: Dict[str, Any], rounds: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Exploration samples of every round -> a fitted profile, as ``automdt explore`` writes it
    (:func:`automdt.explore.fit_samples`: the chunk size, the explored path, each stage's confidence)."""
    from automdt.explore import fit_samples, record_to_sample

    samples = [record_to_sample(rec, r["history"][j - 1] if j else None, int(cfg["chunk_size"]))
               for r in rounds for j, rec in enumerate(r["history"])]
    prof = fit_samples(samples, cfg["src"], cfg["dest"], interval_s=float(cfg["interval_s"]), memory=int(cfg["memory"]),
                       max_threads=int(cfg["max_threads"]), chunk_size=int(cfg["chunk_size"]))
    if cfg.get("profile_out"):
        prof.save(cfg["profile_out"])
    return {"path": cfg.get("profile_out"), "intervals": len(samples)}


if __name__ == "__main__":
    sys.exit(main())
