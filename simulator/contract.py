"""The policy contract's names and shapes, dependency-free (standard library only).

What a trained policy and the code that runs it must agree on: the encoded observation's
components (:data:`OBS_NAMES`), the action heads and their per-stage choices
(:data:`ACTION_HEADS`), the derived
features a policy may ask for (:data:`FEATURES`), and the JSON descriptions of the network's
spaces (:func:`space_descriptions`) that a policy file's metadata records. The numpy code that
computes them lives in :mod:`automdt.simulator.dynamics` and :mod:`automdt.simulator.pipeline`;
this module lets the live controller check a policy file before importing numpy at all.
"""
from __future__ import annotations

from typing import Any, Dict, Sequence, Tuple

ACTION_HEADS: tuple[str, ...] = ("target", "absolute", "step")
"""The policy's action heads (one index per stage; :func:`automdt.simulator.dynamics.actions_to_threads`):

* ``"target"`` (the default): ``MultiDiscrete([11] * 3)``, :data:`TARGET_NAMES`: the next count of
  a stage as a target anchored on what was measured: hold, -1, +1; the threads the stage's current
  flow needs (``n * utilization * efficiency``, rounded up) and that plus one; the threads it needs
  to *carry* its neighbour's flow (``need * neighbour's throughput / own``: readers filling the
  sender buffer at twice the network's rate carry it with half their threads, readers left behind
  by a draining buffer need more) and that plus one; double or four times the count, the thread
  bound, half the count. Any count in one step (the anchors are whatever the stages measured),
  and the exact one is a single choice.
* ``"absolute"``: ``MultiDiscrete([M + 3] * 3)`` for a thread bound ``M``: index 0 keeps the
  stage's count, 1 and 2 take one thread off or add one, index ``2 + k`` sets it to ``k`` threads
  (:data:`ABSOLUTE_FIXED` names the first three).
* ``"step"``: ``MultiDiscrete([5, 5, 5])``, :data:`ACTION_NAMES` (halve, -1, hold, +1, double):
  the first head, kept for policies trained with it (files whose metadata names no head); 1 -> 32
  threads takes five steps.
"""
DEFAULT_ACTION_HEAD = "target"

ACTION_NAMES: tuple[str, ...] = ("halve", "minus_one", "hold", "plus_one", "double")
"""Meaning of each per-stage index of the ``step`` head (see :data:`ACTION_HEADS`)."""
ABSOLUTE_FIXED: tuple[str, ...] = ("hold", "minus_one", "plus_one")
"""The ``absolute`` head's first indices; index ``len(ABSOLUTE_FIXED) - 1 + k`` sets ``k`` threads."""
TARGET_NAMES: tuple[str, ...] = ("hold", "minus_one", "plus_one", "need", "need_plus_one", "carry", "carry_plus_one",
                                 "double", "quadruple", "max", "halve")
"""Meaning of each per-stage index of the ``target`` head."""


def action_nvec(head: str, max_threads: int) -> int:
    """Choices per stage of an action head (:data:`ACTION_HEADS`)."""
    if head == "target":
        return len(TARGET_NAMES)
    if head == "absolute":
        return int(max_threads) + len(ABSOLUTE_FIXED)
    if head == "step":
        return len(ACTION_NAMES)
    raise ValueError(f"unknown action head {head!r}; use one of {ACTION_HEADS}")


def action_names(head: str, max_threads: int) -> list[str]:
    """The names of a head's per-stage choices (what a policy's metadata records)."""
    if head == "absolute":
        return list(ABSOLUTE_FIXED) + [str(n) for n in range(1, int(max_threads) + 1)]
    if head == "target":
        return list(TARGET_NAMES)
    if head == "step":
        return list(ACTION_NAMES)
    raise ValueError(f"unknown action head {head!r}; use one of {ACTION_HEADS}")


OBS_NAMES: tuple[str, ...] = (
    "read/threads", "net/threads", "write/threads",
    "read/throughput", "net/throughput", "write/throughput",
    "buffer/sender_fill", "buffer/receiver_fill",
    "prev/read/threads", "prev/net/threads", "prev/write/threads",
    "prev/read/throughput", "prev/net/throughput", "prev/write/throughput",
    "read/thread_efficiency", "net/thread_efficiency", "write/thread_efficiency",
    "read/utilization", "net/utilization", "write/utilization",
    "read/peak_throughput", "net/peak_throughput", "write/peak_throughput",
    "buffer/sender_trend", "buffer/receiver_trend",
)
"""Names of the encoded observation's components, in order (see
:class:`automdt.simulator.pipeline.ObservationEncoder` for their meaning)."""
OBS_DIM = len(OBS_NAMES)
"""Length of one encoded observation."""


def _span(first: str, count: int) -> slice:
    i = OBS_NAMES.index(first)
    return slice(i, i + count)


OBS_COLUMNS: Dict[str, slice] = {
    "threads": _span("read/threads", 3), "throughput": _span("read/throughput", 3),
    "fill": _span("buffer/sender_fill", 2), "prev_threads": _span("prev/read/threads", 3),
    "prev_throughput": _span("prev/read/throughput", 3), "efficiency": _span("read/thread_efficiency", 3),
    "utilization": _span("read/utilization", 3), "peak_throughput": _span("read/peak_throughput", 3),
    "trend": _span("buffer/sender_trend", 2),
}
"""The encoded observation's columns by group (read, net, write or sender, receiver), as slices of
:data:`OBS_NAMES`: what the encoder writes and the action heads read."""

FEATURES = ("spare_threads", "noise_level", "debiased_spare", "need", "spare", "drain")
"""Derived inputs a policy may add to the simulator's encoding (metadata ``features``).

``spare_threads`` (3 inputs): per stage, the threads it could shed at its best per-thread rate so
far, ``n_i * (1 - efficiency_i)``, clipped to [0, :data:`~automdt.simulator.pipeline.SPARE_CAP`] and divided by it. It is a
pure function of the encoding (thread counts and thread efficiencies), spelled out because a small
network finds the product hard to learn precisely, and precision is what settles a stage on
exactly the threads it needs.

``noise_level`` (1 input): how noisy this transfer's throughputs are: the running mean, since the
start of the transfer, of ``|log(t_i / t_i,prev)|`` (median over the three stages) over the
intervals in which no thread count changed, divided by :data:`~automdt.simulator.pipeline.NOISE_SCALE` and clipped to [0, 1].

``debiased_spare`` (3 inputs): ``spare_threads`` with the efficiency corrected for the noise. The
efficiency reference is a running *maximum* of noisy per-thread rates, so it reads high by about
the noise amplitude, and a stage at exactly the threads it needs shows ``n * (1 - efficiency)``
of about ``n * noise * sqrt(3) * 0.6``: one spare thread is real on a quiet path and noise on a
noisy one. This input uses ``min(1, efficiency * (1 + DEBIAS * level))`` (``pipeline.DEBIAS``), where ``level`` is the
unscaled ``noise_level`` (about ``1.15 * noise``), so it reads about 0 at the needed count
whatever the noise.

``need`` (3 inputs): per stage, the threads the current flow needs at the stage's reference
per-thread rate, ``n_i * utilization_i * efficiency_i`` (efficiency debiased as above), divided by
the thread bound. ``spare`` (3 inputs): ``n_i`` minus that, clipped to [0,
:data:`~automdt.simulator.pipeline.SPARE_CAP`] and divided by it: threads waiting on a buffer and
threads a stage's bandwidth makes useless, both.

``drain`` (2 inputs): per buffer, the share of its content lost in the last interval,
``max(0, -change of fill) / previous fill``, clipped to [0, 1]: near 1 the buffer empties within
an interval. A full sender buffer says an upstream stage *was* ahead; a high ``drain`` says it no
longer is.

``noise_level``, ``debiased_spare``, ``need`` and ``spare`` carry state across intervals
(:class:`~automdt.simulator.pipeline.FeatureState`) but are computed from the encodings alone (an
interval's current and previous throughputs share one reference), so the training environments and
the live controller see the same values.
"""

FEATURE_DIMS: Dict[str, int] = {"spare_threads": 3, "noise_level": 1, "debiased_spare": 3, "need": 3, "spare": 3,
                                "drain": 2}
"""Inputs each derived feature adds to one encoding."""


def feature_dim(features: Sequence[str]) -> int:
    """Number of inputs the derived ``features`` add to one encoding."""
    return sum(FEATURE_DIMS[f] for f in features)


def check_features(features: Sequence[str]) -> None:
    """Raise ``ValueError`` for a feature name that is not in :data:`FEATURES`."""
    unknown = [f for f in features if f not in FEATURE_DIMS]
    if unknown:
        raise ValueError(f"unknown policy feature {unknown[0]!r}; known: {FEATURES}")


def space_descriptions(frame_stack: int = 1, features: Sequence[str] = (), action_head: str = DEFAULT_ACTION_HEAD,
                       max_threads: int = 32) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """JSON descriptions (as recorded in a policy's metadata) of the network's observation and
    action spaces: ``Box(0, 1, (width * frame_stack,), float32)`` and one ``MultiDiscrete`` choice
    per stage of the action head (:data:`ACTION_HEADS`; ``absolute`` depends on ``max_threads``).

    Equal to what :func:`automdt.agents.ppo_sb3.space_to_json` gives for the gymnasium spaces
    the training environment uses (tested), without importing gymnasium or numpy.
    """
    check_features(features)
    dim = (OBS_DIM + feature_dim(features)) * int(frame_stack)
    obs = {"type": "Box", "shape": [dim], "dtype": "float32", "low": [0.0] * dim, "high": [1.0] * dim}
    act = {"type": "MultiDiscrete", "nvec": [action_nvec(action_head, max_threads)] * 3, "start": [0, 0, 0]}
    return obs, act
