"""The policy's input pipeline, numpy only: encoding, derived features, frame stack.

One pipeline turns what a transfer measured into what the PPO network reads, and the same code
serves training (:class:`automdt.agents.training` wraps :class:`PolicyInput` around the batched
simulator) and the live controller (:class:`automdt.agents.ppo.PPOPolicy` runs one row of it):

1. **encoding** (:class:`ObservationEncoder` for live :class:`Observation` s, the simulator's
   batched ``SimCore`` for training; both run :class:`~automdt.simulator.dynamics.EncodingState`);
2. **derived features** (:func:`add_features`, :class:`FeatureState`): inputs a policy's metadata
   may ask for (``features``), appended to each encoding;
3. **frame stack** (:class:`FrameStack`): the last ``frame_stack`` frames side by side, oldest
   first, exactly as stable-baselines3's ``VecFrameStack`` on a 1-D ``Box`` (a new episode starts
   from zeros; a terminal frame is stacked onto the old episode's frames).

:class:`PolicyInput` chains 2 and 3 for N transfers at once. This module imports numpy and the
simulator's numpy modules only (never gymnasium or torch), so the transfer path can use it;
:func:`space_descriptions` gives the JSON form of the network's spaces for the loader's checks
without building gymnasium spaces.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from automdt.simulator.contract import (  # noqa: F401  (FEATURES & co. re-exported: the pipeline's inputs)
    FEATURE_DIMS,
    FEATURES,
    OBS_DIM,
    OBS_COLUMNS,
    OBS_NAMES,
    check_features,
    feature_dim,
    space_descriptions,
)
from automdt.simulator.dynamics import EncodingState
from automdt.simulator.types import Observation

__all__ = [
    "DEBIAS",
    "FEATURES",
    "NOISE_PRIOR",
    "NOISE_SCALE",
    "SPARE_CAP",
    "FeatureState",
    "FrameStack",
    "ObservationEncoder",
    "PolicyInput",
    "add_features",
    "feature_dim",
    "space_descriptions",
]


# ---------------------------------------------------------------------------------------------
# 1. Encoding of live observations
# ---------------------------------------------------------------------------------------------
class ObservationEncoder:
    """Turns measured :class:`Observation` s into the policy input; one instance per episode.

    Scale-free and profile-free: it uses only what the live engine measures, through the same
    :class:`~automdt.simulator.dynamics.EncodingState` the simulator encodes with. Layout
    (``OBS_DIM = 25``, all float32 in [0, 1]):

    | Index | Name (:data:`OBS_NAMES`)  | Value                                                     |
    |-------|---------------------------|-----------------------------------------------------------|
    | 0-2   | read/net/write threads    | threads / max_threads                                     |
    | 3-5   | read/net/write throughput | throughput (B/s) / ref, ref = max stage throughput so far |
    | 6     | buffer/sender_fill        | sender buffer fill fraction at the end of the interval    |
    | 7     | buffer/receiver_fill      | receiver buffer fill fraction                             |
    | 8-10  | prev threads              | the previous interval's threads / max_threads             |
    | 11-13 | prev throughput           | the previous interval's throughputs / ref (current ref)   |
    | 14-16 | thread efficiency         | per-busy-thread rate / the stage's reference rate         |
    | 17-19 | utilization               | busy / (busy + waiting) thread-seconds of the stage       |
    | 20-22 | peak throughput           | the stage's largest throughput so far / ref               |
    | 23-24 | buffer trend              | 0.5 + (fill - previous fill) / 2, sender and receiver     |

    ``ref`` is the largest single-stage throughput seen since :meth:`reset` (floored at 1 B/s), so
    the stage with the best rate so far reads 1 and a path of any speed looks alike. On the first
    interval "previous" equals current.

    *Utilization* is the share of a stage's thread time spent working: a stage that waits on a
    staging buffer (readers on a full sender buffer, writers on an empty receiver buffer) reads
    below 1, and ``n * (1 - utilization)`` of its threads are idle. *Thread efficiency* is the
    stage's rate per busy thread (``bytes / busy thread-seconds``) relative to the best it showed
    in this transfer (learned only from intervals with enough busy time and no cut of that
    stage's threads, see :class:`~automdt.simulator.dynamics.EncodingState`): a stage held at its
    bandwidth reads below 1. Without busy/wait counters (``Observation.busy_s`` None) every thread
    counts as busy and the rate is ``t / n``. *Peak throughput* says what a stage has shown it can
    move; the *buffer trend* shows a buffer filling or draining before it is full or empty.

    :param max_threads: the thread bound used to scale thread counts.
    """

    dim = OBS_DIM

    def __init__(self, max_threads: int) -> None:
        assert max_threads >= 1, f"max_threads must be >= 1, got {max_threads}"
        self.max_threads = int(max_threads)
        self.state = EncodingState(1)

    @property
    def observation_space(self) -> Any:
        """The gymnasium ``Box`` of the encoding (imports gymnasium; the encoder itself does not)."""
        from automdt.simulator.env import make_observation_space

        return make_observation_space()

    def reset(self) -> None:
        """Forget the running references and the previous interval (start of a transfer)."""
        self.state.reset()

    @property
    def ref_bps(self) -> float:
        """The running throughput reference (largest stage throughput so far)."""
        return float(self.state.ref[0])

    def encode(self, obs: Observation) -> np.ndarray:
        """Encode one interval's measurements; updates the running state. Returns shape (OBS_DIM,)."""
        busy = None if obs.busy_s is None else np.asarray(obs.busy_s, dtype=np.float64).reshape(1, 3)
        wait = None if obs.wait_s is None else np.asarray(obs.wait_s, dtype=np.float64).reshape(1, 3)
        return self.state.encode(np.asarray(obs.threads, dtype=np.int64).reshape(1, 3),
                                 np.asarray(obs.throughput_bps, dtype=np.float64).reshape(1, 3),
                                 np.asarray(obs.buffer_fill, dtype=np.float64).reshape(1, 2),
                                 busy, wait, float(obs.interval_s), self.max_threads)[0]


# ---------------------------------------------------------------------------------------------
# 2. Derived features
# ---------------------------------------------------------------------------------------------
SPARE_CAP = 8.0
"""Spare threads at which the ``spare_threads`` feature saturates at 1."""

NOISE_SCALE = 0.2
"""Mean ``|log`` throughput ratio``|`` at which ``noise_level`` saturates at 1 (uniform capacity
noise of relative std 0.1, the top of the training range, reads about 0.6)."""

NOISE_PRIOR = 0.06
"""The noise level (mean ``|log`` ratio``|``) assumed until the first interval without a thread
change: one pseudo-sample at about the middle of the training range."""

DEBIAS = 0.9
"""``debiased_spare``'s correction per unit of the unscaled noise level: the maximum of a few
(~4) per-thread rates with uniform noise of relative std s exceeds their mean by ~0.6*sqrt(3)*s
~ 1.04 s, and the noise level is ~1.15 s."""

_STATEFUL = ("noise_level", "debiased_spare", "need", "spare")
_UTIL = OBS_COLUMNS["utilization"]
_FILL = OBS_COLUMNS["fill"]
_TREND = OBS_COLUMNS["trend"]
_THREADS = OBS_COLUMNS["threads"]
_EFFICIENCY = OBS_COLUMNS["efficiency"]
_TPUT = OBS_COLUMNS["throughput"]
_PREV_THREADS = OBS_COLUMNS["prev_threads"]
_PREV_TPUT = OBS_COLUMNS["prev_throughput"]


def _spare(n: np.ndarray, eff: np.ndarray) -> np.ndarray:
    return (np.clip(n * (1.0 - eff), 0.0, SPARE_CAP) / SPARE_CAP).astype(np.float32)


def add_features(enc: np.ndarray, features: Sequence[str], max_threads: int,
                 state: Optional["FeatureState"] = None) -> np.ndarray:
    """Append the derived ``features`` (:data:`FEATURES`) to encoded observations ``(N, OBS_DIM)``
    (or one ``(OBS_DIM,)``).

    Used identically by the training environments and by the live policy (through
    :class:`PolicyInput`). Stateful features need ``state``, which this call updates with ``enc``
    (one row per transfer, in order).
    """
    if not features:
        return enc
    check_features(features)
    level = np.zeros_like(enc[..., :1])  # (..., 1): the noise level, read only by the stateful features
    if any(f in _STATEFUL for f in features):
        if state is None:
            raise ValueError(f"the features {[f for f in features if f in _STATEFUL]} need a FeatureState")
        level = state.update(enc)  # (..., 1)
    n = enc[..., _THREADS] * float(max_threads)
    eff = enc[..., _EFFICIENCY]
    parts = [enc]
    for name in features:
        if name == "spare_threads":
            parts.append(_spare(n, eff))
        elif name == "noise_level":
            parts.append(np.clip(level / NOISE_SCALE, 0.0, 1.0).astype(np.float32))
        elif name == "debiased_spare":
            parts.append(_spare(n, np.minimum(1.0, eff * (1.0 + DEBIAS * level))))
        elif name in ("need", "spare"):
            useful = enc[..., _UTIL] * np.minimum(1.0, eff * (1.0 + DEBIAS * level))
            if name == "need":
                parts.append(np.clip(n * useful / float(max_threads), 0.0, 1.0).astype(np.float32))
            else:
                parts.append(_spare(n, useful))
        else:  # drain
            change = 2.0 * (enc[..., _TREND] - 0.5)
            before = enc[..., _FILL] - change
            parts.append(np.clip(np.maximum(-change, 0.0) / np.maximum(before, 0.01), 0.0, 1.0).astype(np.float32))
    return np.concatenate(parts, axis=-1)


class FeatureState:
    """Running state of the stateful features for ``num_envs`` transfers (one row each).

    :meth:`update` consumes one encoding per row (in order, from the first interval of a transfer)
    and returns the noise level (mean ``|log`` throughput ratio``|``, unscaled); :meth:`reset`
    starts rows afresh (a new transfer).
    """

    def __init__(self, num_envs: int = 1) -> None:
        self.num_envs = int(num_envs)
        self.sum = np.zeros(self.num_envs)
        self.count = np.zeros(self.num_envs)
        self.seen = np.zeros(self.num_envs, dtype=bool)

    def reset(self, rows: Any = None) -> None:
        """Forget rows (all if None)."""
        sel = slice(None) if rows is None else rows
        self.sum[sel] = 0.0
        self.count[sel] = 0.0
        self.seen[sel] = False

    def copy(self) -> "FeatureState":
        other = FeatureState(self.num_envs)
        other.sum, other.count, other.seen = self.sum.copy(), self.count.copy(), self.seen.copy()
        return other

    def update(self, enc: np.ndarray) -> np.ndarray:
        """Add one interval per row; returns the noise level, shape ``enc.shape[:-1] + (1,)``."""
        e = np.asarray(enc, dtype=np.float64).reshape(self.num_envs, -1)
        cur, prev = e[:, _TPUT], e[:, _PREV_TPUT]
        held = np.all(e[:, _THREADS] == e[:, _PREV_THREADS], axis=1) & self.seen
        with np.errstate(divide="ignore", invalid="ignore"):
            d = np.abs(np.log(cur / prev))
        d = np.where((cur > 0) & (prev > 0), d, np.nan)
        ok = held & np.isfinite(d).all(axis=1)
        sample = np.median(np.where(np.isfinite(d), d, 0.0), axis=1)
        self.sum += np.where(ok, np.minimum(sample, 1.0), 0.0)
        self.count += ok
        self.seen[:] = True
        level = (self.sum + NOISE_PRIOR) / (self.count + 1.0)
        return level.reshape(np.shape(enc)[:-1] + (1,))


# ---------------------------------------------------------------------------------------------
# 3. Frame stack
# ---------------------------------------------------------------------------------------------
class FrameStack:
    """The last ``n_stack`` frames of each of ``num_envs`` rows side by side, oldest first.

    Same values as stable-baselines3's ``VecFrameStack`` on a 1-D ``Box``: :meth:`reset` zeroes
    the stack and puts the first frame last; :meth:`push` shifts every row left by one frame and
    puts the new frame last, except that rows marked ``done`` start again from zeros (their
    terminal frame, if given, is stacked onto the old episode's frames and returned).
    """

    def __init__(self, num_envs: int, width: int, n_stack: int) -> None:
        if n_stack < 1:
            raise ValueError(f"n_stack must be >= 1, got {n_stack}")
        self.num_envs, self.width, self.n_stack = int(num_envs), int(width), int(n_stack)
        self.stacked = np.zeros((self.num_envs, self.width * self.n_stack), dtype=np.float32)

    def reset(self, frames: np.ndarray, rows: Any = None) -> np.ndarray:
        """Start rows (all if None) afresh with their first ``frames``; returns the whole stack."""
        sel = slice(None) if rows is None else rows
        self.stacked[sel] = 0.0
        self.stacked[sel, -self.width:] = frames
        return self.stacked

    def push(self, frames: np.ndarray, dones: Optional[np.ndarray] = None,
             terminal: Optional[Dict[int, np.ndarray]] = None) -> Tuple[np.ndarray, Dict[int, np.ndarray]]:
        """Add one frame per row. ``dones`` (N,) bool marks rows whose ``frames`` start a new
        episode; ``terminal`` maps such rows to the old episode's last frame.

        :return: the stack (N, width * n_stack) and ``{row: stacked terminal frame}``.
        """
        w = self.width
        self.stacked = np.roll(self.stacked, -w, axis=-1)
        out: Dict[int, np.ndarray] = {}
        if dones is not None:
            for i in np.flatnonzero(dones).tolist():
                if terminal is not None and i in terminal:
                    out[i] = np.concatenate((self.stacked[i, :-w], np.asarray(terminal[i], dtype=np.float32)))
                self.stacked[i] = 0.0
        self.stacked[:, -w:] = frames
        return self.stacked, out


# ---------------------------------------------------------------------------------------------
# The chain: encoding -> features -> stack
# ---------------------------------------------------------------------------------------------
class PolicyInput:
    """Derived features and frame stack of N transfers: encodings in, network inputs out.

    :param num_envs: transfers (rows) processed together.
    :param max_threads: the thread bound the policy was trained with (scales thread counts).
    :param features: derived features (:data:`FEATURES`), in the policy's order.
    :param frame_stack: frames the network sees at once.
    """

    def __init__(self, num_envs: int, max_threads: int, features: Sequence[str] = (), frame_stack: int = 1) -> None:
        check_features(features)
        self.num_envs = int(num_envs)
        self.max_threads = int(max_threads)
        self.features = tuple(features)
        self.frame_stack = int(frame_stack)
        self.width = OBS_DIM + feature_dim(self.features)
        self.dim = self.width * self.frame_stack
        self.state = FeatureState(self.num_envs)
        self.stack = FrameStack(self.num_envs, self.width, self.frame_stack)

    def _frames(self, enc: np.ndarray, state: FeatureState) -> np.ndarray:
        return add_features(np.asarray(enc, dtype=np.float32).reshape(self.num_envs, OBS_DIM), self.features,
                            self.max_threads, state)

    def reset(self, enc: np.ndarray) -> np.ndarray:
        """First encodings (N, OBS_DIM) of new transfers; returns the network inputs (N, dim)."""
        self.state.reset()
        return self.stack.reset(self._frames(enc, self.state)).copy()

    def step(self, enc: np.ndarray, dones: Optional[np.ndarray] = None,
             terminal: Optional[Dict[int, np.ndarray]] = None) -> Tuple[np.ndarray, Dict[int, np.ndarray]]:
        """The next encodings (N, OBS_DIM). Rows marked in ``dones`` begin a new transfer with
        ``enc``; ``terminal`` maps them to the old transfer's last encoding.

        :return: network inputs (N, dim) and ``{row: network input of the terminal encoding}``.
        """
        term_frames: Dict[int, np.ndarray] = {}
        done_rows = np.flatnonzero(dones) if dones is not None else np.zeros(0, dtype=np.int64)
        if done_rows.size:
            if terminal:
                # the old episodes' last frames: features continue the old state (a copy, so the
                # rows that did not end are updated once only, below)
                last = np.asarray(enc, dtype=np.float32).reshape(self.num_envs, OBS_DIM).copy()
                for i, t in terminal.items():
                    last[i] = t
                frames = self._frames(last, self.state.copy())
                term_frames = {i: frames[i] for i in terminal}
            self.state.reset(done_rows)
        x, term = self.stack.push(self._frames(enc, self.state), dones if done_rows.size else None, term_frames)
        return x.copy(), term
