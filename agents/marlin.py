"""Marlin (Arifuzzaman & Arslan, ICS'23): one online gradient descent per stage.

Each stage (read, network, write) has its own optimiser, its own utility and no knowledge of
the other two; all three step once per control interval, from the same observation.

Utilities (scores are maximised here; the reference code minimises their negation):

* read:    ``U_r = T_r / K^n_r - T_r * s``, where ``s = (used - used_before) / used`` when the
  sender staging buffer grew during the interval and is above ``min(threshold, capacity / 2)``,
  else 0 (a penalty on reading faster than the network drains);
* network: ``U_n = T_n / K^n_n - T_n * B * L``, ``L`` the TCP retransmit ratio (0 when unknown,
  or when it is not below 1, as in the reference ``rc/sc if sc > rc else 0``);
* write:   ``U_w = T_w / K^n_w``.

Step rule (``gradient_opt_fast`` in the Falcon/Marlin code): ``cc`` starts at 1, then 2; then
``g = (V_t - V_{t-1}) / (dcc * V_{t-1})`` (``dcc = 0`` -> ``(V_t - V_{t-1}) / V_{t-1}``,
``V_{t-1} = 0`` -> ``g = 1``), step ``= round(cc * g)``, at least +-1 (a zero step counts as
-1) and at most +-5; ``cc <- min(max(cc + step, 1), soft_limit)``. Every 10th iteration the soft
limit is the ``cc`` with the best utility among the last 20 observations, for that one step
(between refreshes it is ``max_threads``), which pulls an optimiser that drifted into a flat,
too-high region back to the best value it has seen.
"""
from __future__ import annotations

from collections import deque
from typing import Deque, List, Optional, Sequence, Tuple

import numpy as np

from automdt.policy_contract import K_DEFAULT, Observation, PolicyBase, Triple, clamp_triple, finite  # noqa: F401 (re-exported)

B_DEFAULT = 10.0
"""Severity of the packet-loss penalty."""
CC_CHANGE_LIMIT = 5
"""Largest step of one optimiser in one interval (``cc_change_limit``)."""
SOFT_LIMIT_EVERY = 10
"""Iterations between soft-limit refreshes."""
SOFT_LIMIT_WINDOW = 20
"""Observations the soft limit looks back over."""
BUFFER_THRESHOLD_FRAC = 0.3
"""Read-penalty threshold as a fraction of the sender buffer (Marlin's first commit: 15 of 50 GB)."""


def loss_ratio(loss: float) -> float:
    """The loss ratio ``L`` of the Falcon/Marlin utilities: ``loss`` when in [0, 1), else 0."""
    v = finite(loss)
    return v if v < 1.0 else 0.0


def throughput_utility(t: float, n: int, k: float = K_DEFAULT) -> float:
    """``t / K^n``: throughput discounted by the thread count."""
    return finite(t) / (k ** int(n))


def network_utility(t: float, n: int, loss: float, k: float = K_DEFAULT, b: float = B_DEFAULT) -> float:
    """``T / K^n - T * B * L``: the Falcon/Marlin network utility."""
    t = finite(t)
    return t / (k ** int(n)) - t * b * loss_ratio(loss)


def read_utility(
    t: float,
    n: int,
    fill: float,
    fill_before: Optional[float],
    k: float = K_DEFAULT,
    threshold_frac: float = BUFFER_THRESHOLD_FRAC,
) -> float:
    """``T / K^n - T * s``: the Marlin read utility with the buffer-growth penalty ``s``.

    The penalty applies when the sender buffer is above ``min(threshold, capacity / 2)`` (as a
    fraction: ``min(threshold_frac, 0.5)``) and grew during the interval; ``s`` is the growth
    relative to the current occupancy, a ratio that needs no buffer size.
    ``fill_before`` is ``None`` on the first interval (no penalty).
    """
    t = finite(t)
    s = 0.0
    f = min(finite(fill), 1.0)
    if fill_before is not None:
        f0 = min(finite(fill_before), 1.0)
        if f > min(threshold_frac, 0.5) and f > f0:
            s = (f - f0) / f
    return t / (k ** int(n)) - t * s


def marlin_step(cc_prev: int, cc: int, v_prev: float, v: float, change_limit: int = CC_CHANGE_LIMIT) -> int:
    """The signed change Marlin's OGD applies to ``cc`` after two evaluations.

    ``g = (v - v_prev) / ((cc - cc_prev) * v_prev)``; step ``round(cc * g)`` (half to even, as
    ``np.round``), at least 1 in magnitude, at most ``change_limit``. A zero update counts as a
    decrease (the reference code's ``else`` branch).
    """
    diff = cc - cc_prev
    if diff != 0 and v_prev != 0:
        g = (v - v_prev) / (diff * v_prev)
    elif v_prev != 0:
        g = (v - v_prev) / v_prev
    else:
        g = 1.0
    # Clipping before rounding changes nothing in range and keeps inf/huge gradients integral.
    update = float(np.clip(cc * g, -(change_limit + 1), change_limit + 1))
    if update > 0:
        return int(min(max(1, int(np.round(update))), change_limit))
    return int(max(min(-1, int(np.round(update))), -change_limit))


class StageOGD:
    """One Marlin optimiser (``gradient_opt_fast``) driven one observation at a time.

    :param change_limit: largest step per interval.
    :param soft_limit_every: iterations between soft-limit refreshes.
    :param soft_limit_window: observations remembered for the soft limit.
    """

    def __init__(
        self,
        change_limit: int = CC_CHANGE_LIMIT,
        soft_limit_every: int = SOFT_LIMIT_EVERY,
        soft_limit_window: int = SOFT_LIMIT_WINDOW,
    ) -> None:
        if change_limit < 1 or soft_limit_every < 1 or soft_limit_window < 1:
            raise ValueError("change_limit, soft_limit_every and soft_limit_window must be >= 1")
        self.change_limit = int(change_limit)
        self.soft_limit_every = int(soft_limit_every)
        self.soft_limit_window = int(soft_limit_window)
        self.reset()

    def reset(self) -> int:
        self.count = 0
        self.window: Deque[Tuple[float, int]] = deque(maxlen=self.soft_limit_window)
        self.prev: Optional[Tuple[int, float]] = None
        self.cc = 1
        self.last_soft_limit: Optional[int] = None
        return self.cc

    def best_cc(self) -> int:
        """The ``cc`` with the highest utility in the window (the most recent one on ties)."""
        best_v, best_cc = self.window[0]
        for v, c in self.window:
            if v >= best_v:
                best_v, best_cc = v, c
        return best_cc

    def update(self, value: float, max_cc: int) -> int:
        """Record the utility of the current ``cc``; return the next ``cc``."""
        cc = self.cc
        self.count += 1
        self.window.append((value, cc))
        soft_limit = max_cc
        self.last_soft_limit = None
        if self.count % self.soft_limit_every == 0:
            soft_limit = min(self.best_cc(), max_cc)
            self.last_soft_limit = soft_limit
        if self.prev is None:
            nxt = 2
        else:
            cc_prev, v_prev = self.prev
            step = marlin_step(cc_prev, cc, v_prev, value, self.change_limit)
            nxt = min(max(cc + step, 1), soft_limit)
        self.prev = (cc, value)
        self.cc = int(min(max(nxt, 1), max_cc))
        return self.cc


class MarlinPolicy(PolicyBase):
    """Three independent Marlin optimisers, one per stage.

    :param k: thread-cost base ``K`` of every stage utility.
    :param b: loss-penalty severity ``B`` of the network utility.
    :param change_limit: largest step of one optimiser per interval.
    :param soft_limit_every: iterations between soft-limit refreshes.
    :param soft_limit_window: observations the soft limit looks back over.
    :param buffer_threshold_frac: read-penalty threshold as a fraction of the sender buffer
        (the penalty starts above ``min(buffer_threshold_frac, 0.5)``).
    :param max_threads: default upper bound until :meth:`reset` gives one.
    """

    name = "marlin"

    def __init__(
        self,
        k: float = K_DEFAULT,
        b: float = B_DEFAULT,
        change_limit: int = CC_CHANGE_LIMIT,
        soft_limit_every: int = SOFT_LIMIT_EVERY,
        soft_limit_window: int = SOFT_LIMIT_WINDOW,
        buffer_threshold_frac: float = BUFFER_THRESHOLD_FRAC,
        max_threads: Optional[int] = None,
    ) -> None:
        if k <= 1.0:
            raise ValueError(f"marlin: K must be > 1, got {k}")
        self.k = float(k)
        self.b = float(b)
        self.buffer_threshold_frac = float(buffer_threshold_frac)
        self.stages: List[StageOGD] = [
            StageOGD(change_limit, soft_limit_every, soft_limit_window) for _ in range(3)
        ]
        self._max = max_threads
        self._fill_before: Optional[float] = None
        self.last_utilities: Tuple[float, float, float] = (0.0, 0.0, 0.0)

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        self._max = int(max_threads)
        self._fill_before = None
        for st in self.stages:
            st.reset()
        return clamp_triple(tuple(st.cc for st in self.stages), self._max)

    def start_from(self, threads: Triple) -> None:
        """Start each stage's optimiser at its count of ``threads`` (``--threads`` with
        ``--policy marlin``): the first interval's utilities score those counts."""
        limit = self._max if self._max is not None else max(int(x) for x in threads)
        for st, n in zip(self.stages, clamp_triple(threads, limit)):
            st.cc = n

    def utilities(self, obs: Observation, threads: Sequence[int]) -> Tuple[float, float, float]:
        """The three stage utilities of ``obs`` for the thread counts ``threads``."""
        t = obs.throughput_bps
        u_r = read_utility(
            t[0], threads[0], obs.buffer_fill[0], self._fill_before, self.k, self.buffer_threshold_frac
        )
        u_n = network_utility(t[1], threads[1], obs.loss, self.k, self.b)
        u_w = throughput_utility(t[2], threads[2], self.k)
        return u_r, u_n, u_w

    def act(self, obs: Observation) -> Triple:
        if self._max is None:
            self.reset(obs.max_threads)
        assert self._max is not None
        # Like the reference code, the optimisers score the counts they set (their own history).
        threads = [st.cc for st in self.stages]
        self.last_utilities = self.utilities(obs, threads)
        nxt = [st.update(u, self._max) for st, u in zip(self.stages, self.last_utilities)]
        self._fill_before = min(finite(obs.buffer_fill[0]), 1.0)
        return clamp_triple(nxt, self._max)
