"""Where a transfer's thread counts start: from the best knowledge available.

:func:`choose_start` applies these rules, first match wins; the interval log's first line
records the result as ``start`` with its ``source``:

1. ``threads``: ``--threads R,N,W`` given together with an adaptive ``--policy`` (the user said so);
2. ``history``: the last run of the same job (same SRC and DEST: the job lock's key) settled at a
   triple; start there, a stage raised where that run's throughput and per-thread rates say it
   was short (:func:`automdt.history.start_threads`) (:mod:`automdt.history`; off with ``--no-history``);
3. ``profile``: a policy trained on one profile (``automdt train --profile P``) starts at
   that profile's optimum, the simulator's oracle triple (stored in the policy's metadata);
4. ``cold``: a general PPO policy starts at the triple chosen for it in the simulator for short
   completion over held-out random profiles (:mod:`automdt.agents.cold_start`);
5. ``policy``: whatever the policy's ``reset`` returns (baselines such as Marlin start as their
   papers say; static policies are what they are).

Rules 2-4 apply to policies that take a start (:func:`takes_start`: their
:meth:`~automdt.policy_contract.PolicyBase.features` name an
:class:`~automdt.policy_contract.OwnStart`, which says where their own start comes from: the
capacity controller and so the default, PPO, a tuned file); baselines keep their papers' start
unless rule 1 applies (then the policy's ``start_from(triple)`` moves its internal state there too).
Every start of rules 2-4 is then bounded by what the dataset can use:
no stage gets more threads than there are chunks to move (a 3-file dataset never opens 16
connections); the controller keeps that bound for the whole run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from automdt.policy_contract import Triple, as_policy, clamp_triple

SOURCES = ("threads", "history", "profile", "cold", "policy")


@dataclass(frozen=True)
class Start:
    """A start triple and where it came from (:data:`SOURCES`), with details for the log."""

    threads: Triple
    source: str
    detail: Dict[str, Any] = field(default_factory=dict)

    def log_record(self) -> Dict[str, Any]:
        return {"threads": dict(zip(("read", "net", "write"), self.threads)), "source": self.source, **self.detail}


def takes_start(policy: Any) -> bool:
    """Whether ``policy`` starts where the rules say (its :class:`~automdt.policy_contract.Features`
    name a start: the capacity controller, PPO, a tuned file)."""
    return as_policy(policy).features().start is not None


def dataset_bound(chunks: int, max_threads: int) -> int:
    """Threads per stage a dataset of ``chunks`` chunks can use: ``min(max_threads, max(1, chunks))``."""
    return max(1, min(int(max_threads), int(chunks)))


def chunks_to_move(sizes: Any, chunk_size: int) -> int:
    """Chunks in files of the given sizes (an empty file counts as one unit of work)."""
    return sum(max(1, math.ceil(int(s) / chunk_size)) for s in sizes)


def choose_start(policy: Any, max_threads: int, *, explicit: Optional[Triple] = None, history: Any = None,
                 bound: Optional[int] = None) -> Optional[Start]:
    """Apply the module's rules.

    :param policy: the transfer's policy (already built).
    :param max_threads: the per-stage bound of the run.
    :param explicit: ``--threads`` given with ``--policy``.
    :param history: the job's :class:`automdt.history.JobRecord`, if any (and allowed).
    :param bound: :func:`dataset_bound` of the run (None: no dataset bound).
    :return: the start, or None for the policy's own (rule 5: what its ``reset`` returns).
    """
    limit = max_threads if bound is None else max(1, min(max_threads, bound))
    if explicit is not None:
        return Start(clamp_triple(explicit, max_threads), "threads")
    own = as_policy(policy).features().start
    if own is None:
        return None
    if history is not None:
        from automdt.history import start_threads, summary

        return Start(clamp_triple(start_threads(history), limit), "history", {"history": summary(history)})
    return Start(clamp_triple(own.threads, limit), own.source if own.source in SOURCES else "policy")
