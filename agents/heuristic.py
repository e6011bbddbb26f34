"""Arslan et al. (JPDC'18): heuristic transfer parameters from file size and BDP, then adaptive
tuning of the concurrency at run time.

**Heuristic (Algorithm 1).** With ``BDP = bandwidth * RTT`` (bytes), ``bufferSize`` the TCP
buffer, ``avgFileSize`` the dataset's mean file size and ``maxCC`` the concurrency cap:

* ``fileCountToFillThePipe = round(BDP / avgFileSize)`` (Java ``Math.round``: half up);
* pipelining ``pp = fileCountToFillThePipe``;
* parallelism ``p = max(min(ceil(BDP / bufferSize), ceil(avgFileSize / bufferSize)), 1)``;
* concurrency ``cc = min(max(fileCountToFillThePipe, 2), fileCount, maxCC)``.

These are the formulas of the authors' implementation (``Utils.getBestParams`` in
``earslan10/AdaptiveGridFTPClient``); the seed excerpt of the paper stops before Algorithm 1.

**Mapping onto the modular data path.** A GridFTP file transfer in flight is one reader, ``p``
TCP streams and one writer, so ``(read, net, write) = (cc, cc * p, cc)``, clipped to
``max_threads``. Pipelining (queued control-channel commands for small files) has no
counterpart: the engine streams chunks through the staging buffers without per-file round trips.
Dataset partitioning into size clusters (the MC/ProMC schedulers) is not mapped either: one
transfer is tuned as one dataset with one average file size.

**Adaptive tuning.** The paper adapts the concurrency at run time with a multi-phase search on a
cost function that rewards throughput and penalises concurrency. Its text is not in the seeds,
so this is a reconstruction with the same shape, documented in ``agents/BASELINES.md``:

1. *expand*: from the heuristic ``cc``, double while the utility ``U = T / K^cc`` improves
   by more than ``improve_tol`` (``T`` the end-to-end throughput, the slowest stage); if the
   very first doubling loses, halve instead, while that improves;
2. *refine*: binary search between the best ``cc`` and the first one that lost;
3. *hold*: keep the best ``cc``; when the throughput moves by more than ``retune_tol`` from the
   level measured at the best ``cc`` for ``patience`` intervals in a row, search again.

``p`` stays at its heuristic value; only ``cc`` moves, so read and write follow ``cc`` and the
network follows ``cc * p``.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

from automdt.agents.marlin import K_DEFAULT, finite, throughput_utility
from automdt.policy_contract import Observation, PolicyBase, Triple, clamp_triple

DEFAULT_RTT_S = 0.05
"""Round-trip time assumed when none is given (a continental WAN path)."""
DEFAULT_BANDWIDTH_BPS = 1.25e9
"""Path bandwidth assumed when none is given, in bytes/s (10 Gbit/s)."""
DEFAULT_AVG_FILE_SIZE = 1 << 30
"""Mean file size assumed when none is given (1 GiB, the papers' usual dataset)."""
DEFAULT_TCP_BUFFER = 4 << 20
"""TCP buffer size assumed when none is given (Linux's default ``tcp_wmem`` maximum, 4 MiB)."""


class ArslanParameters(NamedTuple):
    """Output of the heuristic: pipelining, parallelism (streams per file), concurrency."""

    pipelining: int
    parallelism: int
    concurrency: int


def _java_round(x: float) -> int:
    return int(math.floor(x + 0.5))


def arslan_heuristic(
    avg_file_size: float,
    bdp: float,
    buffer_size: float,
    max_cc: int,
    file_count: Optional[int] = None,
) -> ArslanParameters:
    """Algorithm 1: heuristic pipelining, parallelism and concurrency.

    :param avg_file_size: mean file size in bytes.
    :param bdp: bandwidth-delay product in bytes.
    :param buffer_size: TCP buffer size in bytes.
    :param max_cc: concurrency cap.
    :param file_count: number of files (caps the concurrency); ``None`` for no cap.
    """
    if avg_file_size <= 0 or buffer_size <= 0 or bdp < 0 or max_cc < 1:
        raise ValueError("arslan_heuristic: sizes must be positive and max_cc >= 1")
    fill_pipe = _java_round(bdp / avg_file_size)
    p_pipe = math.ceil(bdp / buffer_size)
    p_buffer = math.ceil(avg_file_size / buffer_size)
    cc = max(fill_pipe, 2)
    if file_count is not None:
        cc = min(cc, int(file_count))
    cc = max(1, min(cc, int(max_cc)))
    p = max(min(p_pipe, p_buffer), 1)
    return ArslanParameters(pipelining=fill_pipe, parallelism=p, concurrency=cc)


class HeuristicPolicy(PolicyBase):
    """Arslan et al.'s heuristic start and adaptive concurrency, mapped to ``(cc, cc*p, cc)``.

    :param rtt_s: round-trip time of the path, seconds.
    :param bandwidth_bps: path bandwidth estimate in bytes/s (the unit of the observations).
    :param avg_file_size: mean file size of the dataset, bytes.
    :param tcp_buffer_bytes: TCP buffer size, bytes.
    :param file_count: number of files in the dataset (caps ``cc``); ``None`` for no cap.
    :param adaptive: tune ``cc`` at run time; ``False`` keeps the heuristic values.
    :param k: thread-cost base of the adaptive utility ``T / K^cc``.
    :param improve_tol: relative utility gain a move must bring to count as better.
    :param retune_tol: relative throughput change, once settled, that triggers a new search.
    :param patience: consecutive intervals of such change before searching again.
    :param max_threads: default upper bound until :meth:`reset` gives one.
    """

    name = "heuristic"

    def __init__(
        self,
        rtt_s: float = DEFAULT_RTT_S,
        bandwidth_bps: float = DEFAULT_BANDWIDTH_BPS,
        avg_file_size: float = DEFAULT_AVG_FILE_SIZE,
        tcp_buffer_bytes: float = DEFAULT_TCP_BUFFER,
        file_count: Optional[int] = None,
        adaptive: bool = True,
        k: float = K_DEFAULT,
        improve_tol: float = 0.02,
        retune_tol: float = 0.2,
        patience: int = 2,
        max_threads: Optional[int] = None,
    ) -> None:
        if rtt_s < 0 or bandwidth_bps <= 0 or avg_file_size <= 0 or tcp_buffer_bytes <= 0:
            raise ValueError("heuristic: rtt_s >= 0 and positive bandwidth, file size and buffer required")
        if k <= 1.0 or patience < 1:
            raise ValueError("heuristic: K must be > 1 and patience >= 1")
        self.rtt_s = float(rtt_s)
        self.bandwidth_bps = float(bandwidth_bps)
        self.avg_file_size = float(avg_file_size)
        self.tcp_buffer_bytes = float(tcp_buffer_bytes)
        self.file_count = file_count
        self.adaptive = bool(adaptive)
        self.k = float(k)
        self.improve_tol = float(improve_tol)
        self.retune_tol = float(retune_tol)
        self.patience = int(patience)
        self._max = max_threads
        self.params: Optional[ArslanParameters] = None

    @property
    def bdp(self) -> float:
        """Bandwidth-delay product in bytes."""
        return self.bandwidth_bps * self.rtt_s

    def initial_parameters(self, max_threads: int) -> ArslanParameters:
        """The heuristic's (pipelining, parallelism, concurrency) for this path and dataset."""
        return arslan_heuristic(
            self.avg_file_size, self.bdp, self.tcp_buffer_bytes, max_threads, self.file_count
        )

    def _cc_cap(self) -> int:
        assert self._max is not None
        cap = self._max
        if self.file_count is not None:
            cap = min(cap, max(1, int(self.file_count)))
        return cap

    def _triple(self, cc: int) -> Triple:
        assert self._max is not None and self.params is not None
        return clamp_triple((cc, cc * self.params.parallelism, cc), self._max)

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        self._max = int(max_threads)
        self.params = self.initial_parameters(self._max)
        self.cc = self.params.concurrency
        self.phase = "expand"
        self.direction = +1
        self.origin = self.cc
        self.best_cc = self.cc
        self.best_u: Optional[float] = None
        self.best_t = 0.0
        self.bad_lo: Optional[int] = None  # nearest cc below the best known to be worse
        self.bad_hi: Optional[int] = None  # nearest cc above the best known to be worse
        self.drift = 0
        return self._triple(self.cc)

    def start_from(self, threads: Triple) -> None:
        """Start the search at the read count of ``threads`` (``--threads`` with ``--policy
        heuristic``; the heuristic runs ``(cc, cc * parallelism, cc)``). The non-adaptive heuristic
        keeps its formula's answer (it runs that from the second interval on)."""
        if not self.adaptive:
            return
        limit = self._max if self._max is not None else int(threads[0])
        self.cc = self.origin = self.best_cc = clamp_triple(threads, limit)[0]

    def _start_search(self, u: float, t: float) -> None:
        self.phase, self.direction, self.origin = "expand", +1, self.cc
        self.best_cc, self.best_u, self.best_t = self.cc, u, t
        self.bad_lo = self.bad_hi = None
        self.drift = 0

    def _mark_worse(self, cc: int) -> None:
        if cc > self.best_cc:
            self.bad_hi = cc if self.bad_hi is None else min(self.bad_hi, cc)
        elif cc < self.best_cc:
            self.bad_lo = cc if self.bad_lo is None else max(self.bad_lo, cc)

    def act(self, obs: Observation) -> Triple:
        if self._max is None or self.params is None:
            self.reset(obs.max_threads)
        if not self.adaptive:
            return self._triple(self.cc)
        t = min(finite(x) for x in obs.throughput_bps)
        u = throughput_utility(t, self.cc, self.k)

        if self.best_u is None:  # first interval: the heuristic's cc
            self._start_search(u, t)
        elif self.phase == "hold":
            if self.best_t > 0 and abs(t - self.best_t) > self.retune_tol * self.best_t:
                self.drift += 1
            else:
                self.drift = 0
                self.best_t = 0.5 * (self.best_t + t) if self.best_t > 0 else t
            if self.drift < self.patience:
                return self._triple(self.cc)
            self._start_search(u, t)  # conditions changed: search again from here
        elif u > self.best_u * (1.0 + self.improve_tol):
            old = self.best_cc
            self.best_cc, self.best_u, self.best_t = self.cc, u, t
            self._mark_worse(old)
        else:
            self._mark_worse(self.cc)
            if self.phase == "expand" and self.direction > 0 and self.best_cc == self.origin:
                self.direction = -1  # the first doubling lost: try halving instead
            else:
                self.phase = "refine"

        self.cc = self._propose()
        return self._triple(self.cc)

    def _propose(self) -> int:
        cap = self._cc_cap()
        if self.phase == "expand":
            nxt = min(2 * self.best_cc, cap) if self.direction > 0 else max(self.best_cc // 2, 1)
            known_worse = (self.bad_hi is not None and nxt >= self.bad_hi) or (
                self.bad_lo is not None and nxt <= self.bad_lo
            )
            if nxt != self.best_cc and not known_worse:
                return nxt
            self.phase = "refine"
        if self.phase == "refine":
            for bad in (self.bad_hi, self.bad_lo):
                if bad is not None and abs(bad - self.best_cc) > 1:
                    return (self.best_cc + bad) // 2
            self.phase = "hold"
            self.drift = 0
        return self.best_cc
