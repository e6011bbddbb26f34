"""Falcon (Arifuzzaman & Arslan): one online gradient descent with momentum, one concurrency.

Falcon is monolithic: every transfer process reads a file, sends it and the receiver writes it
inline, so one concurrency ``cc`` drives all three stages. On the modular data path it returns
``(cc, cc, cc)``.

Utility: ``U = T / K^cc - T * B * L`` on the transfer's end-to-end throughput ``T`` (by default
the slowest stage of the interval, ``min(read, net, write)``, which is what a monolithic mover
achieves; ``metric="net"`` or ``"write"`` pick one stage), ``L`` the TCP retransmit ratio.

Step rule (``gradient_opt_fast`` in the Falcon code, on costs ``C = -U``): ``cc`` starts at 1,
then 2; then, with ``dist = max(1, |cc_t - cc_{t-1}|)``,

* ``grad = (C_t - C_{t-1}) / dist`` if ``cc`` went up, else ``(C_{t-1} - C_t) / dist``;
* ``change = |grad / C_{t-1}|`` (``|grad|`` when ``C_{t-1} = 0``), the relative change;
* momentum ``theta``: a cost that fell along the direction (``grad <= 0``) makes ``theta``
  ``+1, +2, +3...`` (it restarts at ``+1`` after a negative run); a cost that rose makes it
  ``-1, -2, ...`` (restarting at ``-1``);
* ``cc <- min(max(cc + theta * ceil(cc * change), 2), soft_limit)``, where
  ``soft_limit = min(best_cc + 10, max_threads)`` is refreshed whenever the cost reaches a new
  minimum (starting from 0, so only once a positive utility has been seen).
"""
from __future__ import annotations

import math
from typing import Optional

from automdt.agents.marlin import B_DEFAULT, K_DEFAULT, finite, network_utility
from automdt.policy_contract import Observation, PolicyBase, Triple, clamp_triple

SOFT_LIMIT_MARGIN = 10
"""Headroom above the best concurrency seen (``soft_limit = best_cc + 10``)."""
MIN_CC = 2
"""Falcon never goes below two concurrent transfers after its first probe."""

_METRICS = ("min", "net", "write")


class FalconPolicy(PolicyBase):
    """Falcon's momentum gradient descent on a single concurrency for all three stages.

    :param k: thread-cost base ``K``.
    :param b: loss-penalty severity ``B``.
    :param metric: throughput the utility scores: ``"min"`` (slowest stage), ``"net"`` or
        ``"write"``.
    :param min_cc: floor of ``cc`` after the first probe (Falcon uses 2).
    :param soft_limit_margin: headroom of the soft limit above the best ``cc``.
    :param max_threads: default upper bound until :meth:`reset` gives one.
    """

    name = "falcon"

    def __init__(
        self,
        k: float = K_DEFAULT,
        b: float = B_DEFAULT,
        metric: str = "min",
        min_cc: int = MIN_CC,
        soft_limit_margin: int = SOFT_LIMIT_MARGIN,
        max_threads: Optional[int] = None,
    ) -> None:
        if k <= 1.0:
            raise ValueError(f"falcon: K must be > 1, got {k}")
        if metric not in _METRICS:
            raise ValueError(f"falcon: metric must be one of {', '.join(_METRICS)}, got {metric!r}")
        self.k = float(k)
        self.b = float(b)
        self.metric = metric
        self.min_cc = int(min_cc)
        self.soft_limit_margin = int(soft_limit_margin)
        self._max = max_threads
        self._init_state()

    def _init_state(self) -> None:
        self.cc = 1
        self.count = 0
        self.theta = 0
        self.least_cost = 0.0
        self.soft_limit = self._max if self._max is not None else 1
        self._prev: Optional[tuple] = None  # (cc, cost)
        self.last_utility = 0.0

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        self._max = int(max_threads)
        self._init_state()
        return clamp_triple((self.cc,) * 3, self._max)

    def start_from(self, threads: Triple) -> None:
        """Start at the network count of ``threads`` (``--threads`` with ``--policy falcon``):
        Falcon's one concurrency is its number of connections."""
        limit = self._max if self._max is not None else int(threads[1])
        self.cc = clamp_triple(threads, limit)[1]

    def throughput(self, obs: Observation) -> float:
        t = [finite(x) for x in obs.throughput_bps]
        if self.metric == "net":
            return t[1]
        if self.metric == "write":
            return t[2]
        return min(t)

    def act(self, obs: Observation) -> Triple:
        if self._max is None:
            self.reset(obs.max_threads)
        assert self._max is not None
        cc = self.cc
        self.last_utility = network_utility(self.throughput(obs), cc, obs.loss, self.k, self.b)
        cost = -self.last_utility
        self.count += 1
        if cost < self.least_cost:
            self.least_cost = cost
            self.soft_limit = min(cc + self.soft_limit_margin, self._max)
        if self._prev is None:
            nxt = 2
        else:
            cc_prev, c_prev = self._prev
            dist = max(1, abs(cc - cc_prev))
            grad = (cost - c_prev) / dist if cc > cc_prev else (c_prev - cost) / dist
            change = abs(grad / c_prev) if c_prev != 0 else abs(grad)
            change = min(change, float(self._max))  # any larger jump is clipped by the limits anyway
            if grad > 0:
                self.theta = self.theta - 1 if self.theta <= 0 else -1
            else:
                self.theta = self.theta + 1 if self.theta >= 0 else 1
            update = int(self.theta * math.ceil(cc * change))
            nxt = min(max(cc + update, self.min_cc), self.soft_limit)
        self._prev = (cc, cost)
        self.cc = int(min(max(nxt, 1), self._max))
        return clamp_triple((self.cc,) * 3, self._max)
