"""One sender as a child process (the fairness experiment runs two inside a network namespace).

``python -m automdt.experiments.sender_proc CONFIG.json OUT.json``: CONFIG holds ``src``, ``dest``
(``HOST:PORT/SUBDIR``), ``policy`` (a registry spec), ``secret_file``, ``throttle``
(``{stage: [per_thread, total]}``), ``memory``, ``chunk_size``, ``interval_s``, ``max_threads``,
``max_duration_s``. OUT receives ``{"wall_t0", "summary", "history"}``: ``wall_t0`` is the
wall-clock time (``time.time()``) of the controller's start, so that intervals of processes that
started at different moments line up (``wall_t0 + record["t"]``).
"""
from __future__ import annotations

import json
import sys
import time


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg_path, out_path = argv
    with open(cfg_path) as f:
        cfg = json.load(f)
    from automdt.agents.registry import make_policy
    from automdt.sender import TransferOptions, run_transfer

    from automdt.protocol import read_secret

    secret = read_secret(cfg["secret_file"])
    policy = make_policy(cfg["policy"], int(cfg["max_threads"]))
    seen = {}

    def progress(summary, ctrl):
        if "wall_t0" not in seen:
            seen["wall_t0"] = time.time() - (time.monotonic() - ctrl.t0)

    opts = TransferOptions(policy=policy, memory=int(cfg["memory"]), chunk_size=int(cfg["chunk_size"]),
                           throttle={k: tuple(v) for k, v in cfg["throttle"].items()}, secret=secret,
                           interval_s=float(cfg["interval_s"]), max_threads=int(cfg["max_threads"]),
                           max_duration_s=float(cfg["max_duration_s"]), progress=progress)
    error = None
    try:
        summary = run_transfer(cfg["src"], cfg["dest"], opts)
        sd, hist = summary.as_dict(), summary.history
    except Exception as e:  # report, never hang the parent
        sd, hist, error = {}, [], f"{type(e).__name__}: {e}"
    with open(out_path, "w") as f:
        json.dump({"wall_t0": seen.get("wall_t0"), "summary": sd, "history": hist, "error": error}, f)
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main())
