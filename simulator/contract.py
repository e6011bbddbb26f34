"""The policy contract's names and shapes, dependency-free (standard library only).

What a trained policy and the code that runs it must agree on: the encoded observation's
components (:data:`OBS_NAMES`), the per-stage action choices (:data:`ACTION_NAMES`), the derived
features a policy may ask for (:data:`FEATURES`), and the JSON descriptions of the network's
spaces (:func:`space_descriptions`) that a policy file's metadata records. The numpy code that
computes them lives in :mod:`automdt.simulator.dynamics` and :mod:`automdt.simulator.pipeline`;
this module lets the live controller check a policy file before importing numpy at all.
"""
from __future__ import annotations

from typing import Any, Dict, Sequence, Tuple

ACTION_NAMES: tuple[str, ...] = ("halve", "minus_one", "hold", "plus_one", "double")
"""Meaning of each per-stage action index (see :func:`automdt.simulator.env.action_to_threads`)."""

OBS_NAMES: tuple[str, ...] = (
    "read/threads", "net/threads", "write/threads",
    "read/throughput", "net/throughput", "write/throughput",
    "buffer/sender_fill", "buffer/receiver_fill",
    "prev/read/threads", "prev/net/threads", "prev/write/threads",
    "prev/read/throughput", "prev/net/throughput", "prev/write/throughput",
    "read/thread_efficiency", "net/thread_efficiency", "write/thread_efficiency",
)
"""Names of the encoded observation's components, in order."""
OBS_DIM = len(OBS_NAMES)
"""Length of one encoded observation."""

FEATURES = ("spare_threads", "noise_level", "debiased_spare")
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

The last two carry state across intervals (:class:`~automdt.simulator.pipeline.FeatureState`) but are computed from the
encodings alone (an interval's current and previous throughputs share one reference), so the
training environments and the live controller see the same values.
"""

FEATURE_DIMS: Dict[str, int] = {"spare_threads": 3, "noise_level": 1, "debiased_spare": 3}
"""Inputs each derived feature adds to one encoding."""


def feature_dim(features: Sequence[str]) -> int:
    """Number of inputs the derived ``features`` add to one encoding."""
    return sum(FEATURE_DIMS[f] for f in features)


def check_features(features: Sequence[str]) -> None:
    """Raise ``ValueError`` for a feature name that is not in :data:`FEATURES`."""
    unknown = [f for f in features if f not in FEATURE_DIMS]
    if unknown:
        raise ValueError(f"unknown policy feature {unknown[0]!r}; known: {FEATURES}")


def space_descriptions(frame_stack: int = 1, features: Sequence[str] = ()) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """JSON descriptions (as recorded in a policy's metadata) of the network's observation and
    action spaces: ``Box(0, 1, (width * frame_stack,), float32)`` and one ``MultiDiscrete`` choice
    per stage over :data:`ACTION_NAMES`.

    Equal to what :func:`automdt.agents.ppo_sb3.space_to_json` gives for the gymnasium spaces
    the training environment uses (tested), without importing gymnasium or numpy.
    """
    check_features(features)
    dim = (OBS_DIM + feature_dim(features)) * int(frame_stack)
    obs = {"type": "Box", "shape": [dim], "dtype": "float32", "low": [0.0] * dim, "high": [1.0] * dim}
    act = {"type": "MultiDiscrete", "nvec": [len(ACTION_NAMES)] * 3, "start": [0, 0, 0]}
    return obs, act
