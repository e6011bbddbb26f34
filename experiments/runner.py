"""Running one policy on one scenario with the real engine, and the bookkeeping of a run directory.

:func:`run_one` builds the policy (:func:`build_policy`), copies a generated dataset with
:func:`automdt.sender.run_transfer` (real engine, an embedded receiver fed over the local link)
under the scenario's throttles, removes the copy, and returns a :class:`RunResult` with the
flattened interval records and the metrics of :mod:`automdt.experiments.metrics`.
:class:`RunDir` writes ``config.json``, CSVs and ``results.md`` into
``runs/<experiment>-<timestamp>/``.
"""
from __future__ import annotations

import csv
import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from automdt.experiments.metrics import flatten, run_metrics
from automdt.experiments.scenarios import (DEFAULT_CHUNK, DEFAULT_INTERVAL_S, DEFAULT_MEMORY, Dataset,
                                           Scenario)

ALL_POLICIES: Tuple[str, ...] = ("default", "capacity", "topdown", "ppo", "marlin", "falcon", "globus", "static",
                                  "heuristic", "model", "oracle")
"""Policy labels of the experiments, in table order.

* ``default``: what ``automdt transfer`` runs without ``--policy`` (the shield over the capacity
  controller); ``capacity``: the capacity controller alone;
* ``topdown``: adaptiSeq's commit-hold-re-explore knee search, one count for all three stages;
* ``ppo``: the shipped general PPO network (``automdt/data/default_policy.zip``), bare; skipped
  while absent;
* ``marlin``, ``falcon``, ``globus`` (static 4,32,4), ``heuristic`` (Arslan et al.), ``model``
  (Jung et al.): the baselines of ``automdt.agents``;
* ``static``: the engine's default without a policy, ``static:4,4,4``;
* ``oracle``: the scenario's analytic optimum held fixed from the first interval (a reference,
  not a tuner: no real tool knows it in advance);
* any other registry spec (``static:R,N,W``, ``ppo:PATH``, ``PATH.zip``) is used as given.
"""

STATIC_DEFAULT = "static:4,4,4"
LOOPBACK_RTT_S = 0.0002
"""Round-trip time handed to the Arslan heuristic (loopback; the BDP is tiny, so it starts at
concurrency 2, parallelism 1)."""


class PolicyUnavailable(RuntimeError):
    """The policy cannot be built here (e.g. the shipped PPO policy is not there yet)."""


def policy_spec(label: str, scenario: Scenario, dataset: Optional[Dataset] = None) -> Tuple[str, Dict[str, Any]]:
    """The registry spec and keyword arguments behind an experiment policy label."""
    if label == "static":
        return STATIC_DEFAULT, {}
    if label == "heuristic":
        kw: Dict[str, Any] = {"rtt_s": LOOPBACK_RTT_S, "bandwidth_bps": float(scenario.throttle["net"][1])}
        if dataset is not None:
            kw |= {"avg_file_size": float(dataset.avg_file_size), "file_count": len(dataset.files)}
        return "heuristic", kw
    if label == "oracle":
        return "oracle", {"profile": "<scenario profile>"}
    return label, {}


def build_policy(label: str, scenario: Scenario, dataset: Optional[Dataset] = None,
                 memory: int = DEFAULT_MEMORY, max_threads: Optional[int] = None):
    """A fresh policy object for ``label`` (see :data:`ALL_POLICIES`)."""
    from automdt.agents.registry import make_policy

    mt = max_threads or scenario.max_threads
    spec, kw = policy_spec(label, scenario, dataset)
    if label == "oracle":
        kw = {"profile": scenario.profile(memory)}
    try:
        pol = make_policy(spec, mt, **kw)
    except (FileNotFoundError, ImportError, OSError) as e:
        raise PolicyUnavailable(f"{label}: {e}") from e
    except ValueError as e:
        if spec.startswith("ppo") or spec.endswith(".zip"):
            raise PolicyUnavailable(f"{label}: {e}") from e
        raise
    return pol


def ppo_default_info() -> Dict[str, Any]:
    """Where the shipped PPO network is and whether it is there (path, sha256, metadata).

    Does not import torch (``automdt.agents.ppo`` does): the path is the package's data file.
    """
    import hashlib
    from importlib import resources

    p = str(resources.files("automdt").joinpath("data").joinpath("default_policy.zip"))
    if not os.path.exists(p):
        return {"available": False, "path": p, "reason": f"{p} does not exist (not trained/shipped yet)"}
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    info: Dict[str, Any] = {"available": True, "path": p, "sha256": h.hexdigest()}
    meta = p + ".json"
    if os.path.exists(meta):
        try:
            with open(meta) as f:
                m = json.load(f)
            info["metadata"] = {k: v for k, v in m.items() if isinstance(v, (str, int, float, bool))}
        except (OSError, ValueError):
            pass
    return info


def available_policies(labels: Sequence[str], scenario: Scenario) -> Tuple[List[str], Dict[str, str]]:
    """Split ``labels`` into those that can be built here and ``{label: reason}`` for the others."""
    ok, skipped = [], {}
    for lab in labels:
        try:
            build_policy(lab, scenario)
            ok.append(lab)
        except PolicyUnavailable as e:
            skipped[lab] = str(e)
    return ok, skipped


@dataclass
class RunResult:
    """One transfer of one policy on one scenario (and dataset)."""

    scenario: str
    policy: str
    dataset: str
    rows: List[Dict[str, Any]]
    summary: Dict[str, Any]
    metrics: Dict[str, Any]
    wall_s: float
    cpu_s: float
    completed: bool
    error: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    def table_row(self) -> Dict[str, Any]:
        """The run's line in ``runs.csv``."""
        row: Dict[str, Any] = {"scenario": self.scenario, "policy": self.policy, "dataset": self.dataset,
                               "completed": self.completed, "seconds": round(self.summary.get("seconds", 0.0), 3),
                               "bytes": self.summary.get("bytes"), "exit_code": self.summary.get("exit_code"),
                               "wall_s": round(self.wall_s, 3), "cpu_s": round(self.cpu_s, 3),
                               "cpu_pct": round(100.0 * self.cpu_s / self.wall_s, 1) if self.wall_s > 0 else None,
                               "error": self.error or ""}
        row.update({k: v for k, v in self.metrics.items()})
        row.update(self.extra)
        return row


def run_one(label: str, scenario: Scenario, dataset: Dataset, scratch: str, *, duration_s: Optional[float],
            memory: int = DEFAULT_MEMORY, chunk_size: int = DEFAULT_CHUNK, interval_s: float = DEFAULT_INTERVAL_S,
            max_threads: Optional[int] = None, log_path: Optional[str] = None, seed: int = 0,
            completion_timeout_s: Optional[float] = None, policy=None) -> RunResult:
    """Copy ``dataset`` under ``scenario``'s throttles with the policy ``label``.

    :param duration_s: stop after this long (``--max-duration``; a fixed-length run), or ``None``
        to run to completion (bounded by ``completion_timeout_s``, default 10x the time at the
        achievable rate plus 30 s).
    :param scratch: directory for the destination copy (removed afterwards).
    :param policy: a ready policy object instead of building ``label``.
    """
    from automdt import errors
    from automdt.sender import TransferOptions, run_transfer

    mt = max_threads or scenario.max_threads
    pol = policy if policy is not None else build_policy(label, scenario, dataset, memory, mt)
    if duration_s is None:
        limit = completion_timeout_s or (10.0 * dataset.total_bytes / scenario.achievable_bps + 30.0)
    else:
        limit = float(duration_s)
    dest = tempfile.mkdtemp(prefix=f"dest-{scenario.name}-{_safe(label)}-", dir=scratch)
    opts = TransferOptions(policy=pol, memory=int(memory), chunk_size=int(chunk_size),
                           throttle={k: tuple(v) for k, v in scenario.throttle.items()},
                           interval_s=float(interval_s), max_threads=mt, log_path=log_path,
                           max_duration_s=limit, stall_s=60.0)
    c0, w0 = _cpu_s(), time.monotonic()
    err = None
    try:
        summary = run_transfer(dataset.path, dest, opts)
    finally:
        wall = time.monotonic() - w0
        cpu = _cpu_s() - c0
        shutil.rmtree(dest, ignore_errors=True)
    if summary.exit_code in (errors.INTERRUPTED, 143):
        # Ctrl-C / SIGTERM reached the transfer: stop the whole experiment (cleanup runs on the way out)
        raise KeyboardInterrupt(f"transfer interrupted (exit {summary.exit_code})")
    sd = summary.as_dict()
    if summary.exit_code not in (errors.OK, errors.MAX_DURATION):
        err = f"exit {summary.exit_code}: " + "; ".join(summary.errors[:3])
    completed = summary.exit_code == errors.OK and summary.files_failed == 0
    if duration_s is None and summary.exit_code == errors.MAX_DURATION:
        err = f"did not complete within {limit:.0f} s"
    rows = [flatten(r) for r in summary.history]
    met = run_metrics(rows, scenario.achievable_bps, scenario.bottleneck, scenario.min_threads)
    return RunResult(scenario=scenario.name, policy=label, dataset=dataset.spec.name, rows=rows, summary=sd,
                     metrics=met, wall_s=wall, cpu_s=cpu, completed=completed, error=err,
                     extra={"policy_name": getattr(pol, "name", label)})


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in s)[:40]


# ---------------------------------------------------------------------------------------------
# Run directories
# ---------------------------------------------------------------------------------------------
def git_info() -> Dict[str, Any]:
    """Commit and dirtiness of the source tree this package runs from (if it is a git checkout)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out: Dict[str, Any] = {}
    try:
        out["commit"] = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True,
                                       timeout=10).stdout.strip() or None
        st = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True, timeout=10).stdout
        out["dirty"] = bool(st.strip())
        out["dirty_files"] = [line[3:] for line in st.splitlines()][:50]
    except (OSError, subprocess.SubprocessError):
        out["commit"] = None
    return out


class RunDir:
    """``<out>/<experiment>-<timestamp>/`` with config, CSVs, plots and results."""

    def __init__(self, out: str, experiment: str) -> None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        base = os.path.join(out, f"{experiment}-{stamp}")
        path, i = base, 1
        while os.path.exists(path):
            i += 1
            path = f"{base}-{i}"
        os.makedirs(path)
        os.makedirs(os.path.join(path, "logs"), exist_ok=True)
        self.path = path
        self.experiment = experiment

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def log_path(self, *parts: str) -> str:
        return os.path.join(self.path, "logs", "-".join(_safe(p) for p in parts) + ".jsonl")

    def write_config(self, config: Dict[str, Any]) -> None:
        base = {
            "experiment": self.experiment,
            "created": _dt.datetime.now().isoformat(timespec="seconds"),
            "argv": sys.argv,
            "git": git_info(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        }
        with open(self.file("config.json"), "w") as f:
            json.dump(base | config, f, indent=2, sort_keys=False, default=_json_default)
            f.write("\n")

    def update_config(self, **changes: Any) -> None:
        """Merge ``changes`` into an already written ``config.json``."""
        with open(self.file("config.json")) as f:
            cfg = json.load(f)
        cfg.update(changes)
        with open(self.file("config.json"), "w") as f:
            json.dump(cfg, f, indent=2, default=_json_default)
            f.write("\n")

    def write_csv(self, name: str, rows: Sequence[Dict[str, Any]]) -> str:
        path = self.file(name)
        keys: List[str] = []
        for r in rows:
            for k in r:
                if k not in keys:
                    keys.append(k)
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            for r in rows:
                w.writerow({k: _csv_value(r.get(k)) for k in keys})
        return path

    def write_text(self, name: str, text: str) -> str:
        path = self.file(name)
        with open(path, "w") as f:
            f.write(text if text.endswith("\n") else text + "\n")
        return path


def _csv_value(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 6)
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v)
    return "" if v is None else v


def _json_default(o: Any) -> Any:
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def interval_rows(results: Sequence[RunResult]) -> List[Dict[str, Any]]:
    """All interval records of ``results``, each tagged with scenario, dataset and policy."""
    out = []
    for r in results:
        for row in r.rows:
            out.append({"scenario": r.scenario, "dataset": r.dataset, "policy": r.policy} | row)
    return out


def read_csv(path: str) -> List[Dict[str, Any]]:
    """Read a CSV written by :meth:`RunDir.write_csv` back (numbers as floats, booleans as bool)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    out = []
    for r in rows:
        d: Dict[str, Any] = {}
        for k, v in r.items():
            if v in ("True", "False"):
                d[k] = v == "True"
            elif v == "":
                d[k] = None
            else:
                try:
                    d[k] = float(v)
                except ValueError:
                    d[k] = v
        out.append(d)
    return out


class Scratch:
    """A temp directory for datasets and destination copies (``/dev/shm`` when possible).

    Removed on exit unless ``keep``; ``data_dir`` given: datasets live (and are re-used) there
    and only the destination copies are temporary.
    """

    def __init__(self, data_dir: Optional[str] = None, keep: bool = False) -> None:
        from automdt.experiments.scenarios import default_data_root

        self.keep = keep
        self.own = data_dir is None
        root = default_data_root()
        self.data = data_dir or tempfile.mkdtemp(prefix="automdt-exp-", dir=root)
        os.makedirs(self.data, exist_ok=True)
        self.dest = tempfile.mkdtemp(prefix="automdt-exp-dest-", dir=root if self.own else self.data)

    def __enter__(self) -> "Scratch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self.dest, ignore_errors=True)
        if self.own and not self.keep:
            shutil.rmtree(self.data, ignore_errors=True)
