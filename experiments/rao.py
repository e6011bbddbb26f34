"""Concave-convex throughput profiles of Rao et al. ("Learning Concave-Convex Profiles of Data
Transport Over Dedicated Connections"): fit throughput against RTT and report the transition RTT.

The model is the paper's, with the flipped sigmoid ``g_{a,tau_a}(tau) = 1 - 1/(1 + exp(-a (tau -
tau_a)))``, which is concave for ``tau <= tau_a`` and convex for ``tau >= tau_a``::

    f(tau) = b [ g_{a1,tau1}(tau) I(tau <= tau_T) + g_{a2,tau2}(tau) I(tau >= tau_T) ]
    with  tau2 <= tau_T <= tau1  (concave left of the transition RTT tau_T, convex right of it)

and the parameters minimise the paper's sum of squared errors (3.1), in which the measurements at
``tau_T`` count for both pieces, with ``tau_T`` one of the measured RTTs. ``a1, a2 > 0`` (throughput
falls with RTT). How this module fits it (numpy only):

* for every candidate ``tau_T``: a grid over ``(a, tau_a)`` for each piece (the constraint applied
  as a mask) and over ``b``, the squared error of every grid curve being a quadratic in ``b`` built
  from prefix sums; then a projected Levenberg-Marquardt refinement of all continuous parameters;
* ``tau_T`` at the smallest RTT means an entirely convex profile (the paper's LNet case: only the
  convex piece is fitted); at the largest RTT an entirely concave one (only the concave piece);
* ``b``: the paper scales measurements by the connection capacity so that ``b = 1``; give
  ``capacity=`` to do the same. Without it ``b`` is fitted too (closed form on the grid, then
  with the rest). Either way the concave piece lies above ``b / 2`` and the convex one below it,
  so ``tau_T`` is where the measured shape turns convex *as a flipped sigmoid sees it*: for a
  window-limited profile ``min(C, N W / RTT)`` (flat, then hyperbolic) that is about 1.3-2.5x the
  bandwidth-delay knee ``N W / C``, where throughput has fallen to roughly half to two thirds of
  its peak, not the knee itself (a sigmoid's convex tail decays exponentially, not as 1/RTT);
* selection of ``tau_T`` (and so of the shape): ``criterion="sse"`` is the paper's plain minimum
  of (3.1); the default ``"bic"`` charges the two-piece candidates for their extra parameters, so
  noise does not turn an entirely convex (or concave) profile into a two-piece one.

Reported error: (3.1) as ``sse``, ``rmse = sqrt(sse / n)`` (the square root of the paper's
empirical error), ``rel_rmse`` (``rmse`` over the largest mean throughput) and ``r2``.
The paper's distribution-free confidence bounds (its section 4) are not computed.

``sweep()`` measures the profile on this machine through :class:`DelayForwarder` (N parallel
streams with a per-stream window cap, RTTs swept), ``load_measurements()`` reads a user's file.
Command line::

    python -m automdt.experiments.rao --sweep 0,5,10,20,40,80 --streams 4 -o out/
    python -m automdt.experiments.rao --measurements profile.csv -o out/

Throughputs are bytes per second (the project's ``*_bps`` convention); RTTs in seconds.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from automdt.experiments.delay_forwarder import (DEFAULT_WINDOW, DelayForwarder, LoopbackPeer,
                                                 measure_throughput, ping_rtt)
from automdt.units import parse_size

CRITERIA = ("bic", "sse")

# Search space in normalised units (RTT / largest RTT, throughput / largest mean throughput).
_A_MIN, _A_MAX = 10 ** -1.5, 10 ** 2.7     # sigmoid steepness
_TAU_MIN, _TAU_MAX = -1.5, 2.5             # sigmoid centres (the paper's [-T, T])
_B_MIN, _B_MAX = 0.75, 8.0                 # scale when it is fitted
_REFINE_TOP = 5                            # two-piece candidates refined after the grid


def _g(t: np.ndarray, a, tau) -> np.ndarray:
    """Flipped sigmoid 1 - 1/(1+exp(-a (t - tau))) = 1/(1+exp(a (t - tau))), overflow-free."""
    return 0.5 * (1.0 - np.tanh(0.5 * np.multiply(a, np.subtract(t, tau))))


@dataclasses.dataclass
class RaoFit:
    """A fitted concave-convex profile. Pieces that are absent (entirely convex / concave) are ``None``."""

    transition_rtt_s: float            #: tau_T: concave up to here, convex from here
    shape: str                         #: "concave-convex", "convex" (tau_T = min RTT) or "concave" (max RTT)
    b: float                           #: scale, bytes/s (the capacity when ``capacity_fixed``)
    a1: Optional[float]                #: concave piece steepness, 1/s
    tau1_s: Optional[float]            #: concave piece centre (inflection), s; >= tau_T
    a2: Optional[float]                #: convex piece steepness, 1/s
    tau2_s: Optional[float]            #: convex piece centre (inflection), s; <= tau_T
    sse: float                         #: sum of squared errors (3.1), (bytes/s)^2
    rmse: float                        #: sqrt(sse / n_points), bytes/s
    rel_rmse: float                    #: rmse / largest mean throughput
    r2: float                          #: 1 - sse / total sum of squares
    n_points: int
    n_rtts: int
    rtt_min_s: float
    rtt_max_s: float
    peak_bps: float                    #: largest mean throughput measured at one RTT
    capacity_fixed: bool
    criterion: str
    notes: List[str] = dataclasses.field(default_factory=list)   #: caveats about this fit
    candidates: List[Dict[str, float]] = dataclasses.field(default_factory=list, repr=False)

    def concave(self, rtt_s) -> np.ndarray:
        """The concave piece ``b g_{a1,tau1}`` (NaN where it is absent)."""
        t = np.asarray(rtt_s, dtype=float)
        if self.a1 is None:
            return np.full(t.shape, np.nan)
        return self.b * _g(t, self.a1, self.tau1_s)

    def convex(self, rtt_s) -> np.ndarray:
        """The convex piece ``b g_{a2,tau2}`` (NaN where it is absent)."""
        t = np.asarray(rtt_s, dtype=float)
        if self.a2 is None:
            return np.full(t.shape, np.nan)
        return self.b * _g(t, self.a2, self.tau2_s)

    def predict(self, rtt_s) -> np.ndarray:
        """Throughput (bytes/s) of the profile: the concave piece before tau_T, the convex piece
        after it, and at tau_T itself (fitted by both pieces, as in (3.1)) their mean."""
        t = np.asarray(rtt_s, dtype=float)
        if self.a1 is None:
            return self.convex(t)
        if self.a2 is None:
            return self.concave(t)
        c1, c2 = self.concave(t), self.convex(t)
        tT = self.transition_rtt_s
        return np.where(t < tT, c1, np.where(t > tT, c2, 0.5 * (c1 + c2)))

    def to_dict(self) -> Dict[str, object]:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        ms = 1e3
        lines = [f"shape: {self.shape}",
                 f"transition RTT tau_T: {self.transition_rtt_s * ms:.3g} ms"
                 + {"convex": " (entirely convex: no concave region measured)",
                    "concave": " (entirely concave: no convex region measured)"}.get(self.shape, ""),
                 f"b: {self.b:.4g} B/s ({self.b * 8 / 1e9:.3g} Gbit/s)"
                 + (" fixed (capacity)" if self.capacity_fixed else " fitted")]
        if self.a1 is not None:
            lines.append(f"concave piece: a1 = {self.a1:.4g} /s, tau1 = {self.tau1_s * ms:.4g} ms")
        if self.a2 is not None:
            lines.append(f"convex piece:  a2 = {self.a2:.4g} /s, tau2 = {self.tau2_s * ms:.4g} ms")
        lines.append(f"fit error: rmse {self.rmse:.4g} B/s ({100 * self.rel_rmse:.2f}% of peak), "
                     f"r2 {self.r2:.4f}, sse {self.sse:.4g} over {self.n_points} points at {self.n_rtts} RTTs "
                     f"(criterion {self.criterion})")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


# ----------------------------------------------------------------------------------------
# Fitting
# ----------------------------------------------------------------------------------------
def _residuals(p: np.ndarray, layout: Tuple[bool, bool, bool], b_fixed, t, y, sw, left, right):
    """Weighted residuals of (3.1) and their Jacobian; ``layout`` = (b free, concave piece, convex piece)."""
    free_b, has1, has2 = layout
    b = p[0] if free_b else b_fixed
    i = 1 if free_b else 0
    rs, cols = [], []
    for present, sel in ((has1, left), (has2, right)):
        if not present:
            continue
        a, tau = p[i], p[i + 1]
        tt = t[sel]
        g = _g(tt, a, tau)
        dg = g * (1.0 - g)
        rs.append(sw[sel] * (y[sel] - b * g))
        block = np.zeros((tt.size, p.size))
        if free_b:
            block[:, 0] = -sw[sel] * g
        block[:, i] = sw[sel] * b * dg * (tt - tau)
        block[:, i + 1] = -sw[sel] * b * dg * a
        cols.append(block)
        i += 2
    return np.concatenate(rs), np.vstack(cols)


def _refine(p0: np.ndarray, lo: np.ndarray, hi: np.ndarray, fun, iters: int = 100) -> Tuple[np.ndarray, float]:
    """Projected Levenberg-Marquardt on a box; ``fun(p) -> (residuals, jacobian)``; bounded iterations."""
    p = np.clip(p0.astype(float), lo, hi)
    r, J = fun(p)
    cost = float(r @ r)
    lam = 1e-3
    for _ in range(iters):
        JtJ, Jtr = J.T @ J, J.T @ r
        improved = False
        for _ in range(10):
            try:
                step = np.linalg.solve(JtJ + lam * (np.diag(np.diag(JtJ)) + 1e-12 * np.eye(p.size)), -Jtr)
            except np.linalg.LinAlgError:
                lam *= 10
                continue
            q = np.clip(p + step, lo, hi)
            rq, Jq = fun(q)
            cq = float(rq @ rq)
            if cq < cost:
                improved = cost - cq > 1e-7 * cost
                p, r, J, cost = q, rq, Jq, cq
                lam = max(lam / 5, 1e-12)
                break
            lam *= 10
        if not improved:
            break
    return p, cost


def _grid_candidates(t: np.ndarray, yn: np.ndarray, w: np.ndarray, b_fixed: Optional[float],
                     score: Callable[[float, int, bool, bool], Tuple[float, float]]) -> List[Dict[str, Any]]:
    """Pass 1 of :func:`fit_profile`: for every candidate tau_T (each measured RTT, normalised in
    ``t``), the best pieces on a grid of (a, tau_a) and b, with the bounds the refinement keeps and
    ``score``'s (sse, bic)."""
    free_b = b_fixed is None
    n = t.size
    # Grid of curves (a, tau_a) evaluated at the measured RTTs.
    a_grid = np.logspace(math.log10(_A_MIN), math.log10(_A_MAX), 48)
    tau_grid = np.unique(np.concatenate([np.linspace(_TAU_MIN, _TAU_MAX, 81), t]))
    A, TAU = np.meshgrid(a_grid, tau_grid, indexing="ij")
    A, TAU = A.ravel(), TAU.ravel()
    G = _g(t[None, :], A[:, None], TAU[:, None])            # (P, n)
    wy, wgy, wgg = w * yn ** 2, w * yn * G, w * G ** 2
    # Left sums over k <= j and right sums over k >= j (the point at tau_T counts in both).
    L_yy, L_gy, L_gg = np.cumsum(wy), np.cumsum(wgy, axis=1), np.cumsum(wgg, axis=1)
    R_yy = np.cumsum(wy[::-1])[::-1]
    R_gy = np.cumsum(wgy[:, ::-1], axis=1)[:, ::-1]
    R_gg = np.cumsum(wgg[:, ::-1], axis=1)[:, ::-1]
    b_grid = np.array([b_fixed]) if not free_b else np.logspace(math.log10(_B_MIN), math.log10(_B_MAX), 64)

    def piece_sse(yy, gy, gg, mask):
        """min over masked curves of yy - 2 b gy + b^2 gg, for every b in b_grid: (values, argmins)."""
        q = yy - 2.0 * b_grid[:, None] * gy[None, mask] + (b_grid ** 2)[:, None] * gg[None, mask]
        k = np.argmin(q, axis=1)
        return q[np.arange(b_grid.size), k], np.flatnonzero(mask)[k]

    cands = []
    for j in range(n):
        tT = t[j]
        has1, has2 = j > 0, j < n - 1           # j = 0: entirely convex; j = n-1: entirely concave
        total = np.zeros(b_grid.size)
        idx1 = idx2 = None
        if has1:
            q1, idx1 = piece_sse(L_yy[j], L_gy[:, j], L_gg[:, j], TAU >= tT)
            total += q1
        if has2:
            q2, idx2 = piece_sse(R_yy[j], R_gy[:, j], R_gg[:, j], TAU <= tT)
            total += q2
        ib = int(np.argmin(total))
        p0, lo, hi = [], [], []
        if free_b:
            p0.append(b_grid[ib]); lo.append(1e-3); hi.append(_B_MAX * 4)
        if has1:
            c = idx1[ib]
            p0 += [A[c], TAU[c]]; lo += [_A_MIN, tT]; hi += [_A_MAX, _TAU_MAX]
        if has2:
            c = idx2[ib]
            p0 += [A[c], TAU[c]]; lo += [_A_MIN, _TAU_MIN]; hi += [_A_MAX, tT]
        sse, bic = score(float(total[ib]), j, has1, has2)
        cands.append({"j": j, "p": np.array(p0), "lo": np.array(lo), "hi": np.array(hi), "cost": float(total[ib]),
                      "layout": (free_b, has1, has2), "sse": sse, "bic": bic})
    return cands


def fit_profile(rtt_s: Sequence[float], throughput: Sequence[float], *, capacity: Optional[float] = None,
                criterion: str = "bic") -> RaoFit:
    """Fit the concave-convex profile of Rao et al. to measurements (repeats at one RTT allowed).

    :param rtt_s: RTT of each measurement, seconds (>= 0; at least 3 distinct values).
    :param throughput: throughput of each measurement (bytes/s; any unit works, results follow it).
    :param capacity: fix ``b`` to the connection capacity (the paper's scaling); default: fit ``b``.
    :param criterion: ``"bic"`` (default) or ``"sse"`` (the paper's plain least squares) to choose tau_T.
    """
    x, y = _measurements(rtt_s, throughput, capacity, criterion)
    ux, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    if ux.size < 3:
        raise ValueError(f"need measurements at 3 or more distinct RTTs, got {ux.size}")
    n_total = int(y.size)
    ybar = np.bincount(inv, weights=y) / counts
    xs, ys = float(ux.max()), float(ybar.max())
    if ys <= 0:
        raise ValueError("all throughputs are zero")
    t = ux / xs                               # normalised RTTs in [0, 1]
    yn = ybar / ys
    w = counts.astype(float)
    within = float(np.sum((y / ys - yn[inv]) ** 2))   # spread of repeats: no model removes it
    n = ux.size
    free_b = capacity is None
    b_fixed = None if free_b else float(capacity) / ys

    def score(sse: float, j: int, has1: bool, has2: bool) -> Tuple[float, float]:
        """(3.1) with repeats' spread, and BIC on the points counted once (sse per counted point)."""
        shared = has1 and has2
        # Repeats at the shared point count in both pieces, so their spread counts twice there.
        sse = sse + within + (float(np.sum(((y / ys) - yn[inv])[inv == j] ** 2)) if shared else 0.0)
        n_eff = n_total + (int(counts[j]) if shared else 0)
        k = (1 if free_b else 0) + 2 * (int(has1) + int(has2)) + (1 if shared else 0)
        bic = n_total * math.log(max(sse / n_eff, 1e-15)) + k * math.log(n_total)
        return sse, bic

    cands = _grid_candidates(t, yn, w, b_fixed, score)
    # Pass 2: refine every continuous parameter of the two one-piece candidates and of the best
    # two-piece candidates on the grid (the grid is fine enough to rank them).
    two = sorted(range(1, n - 1), key=lambda j: cands[j][criterion])[:_REFINE_TOP]
    sw = np.sqrt(w)
    for j in sorted({0, n - 1, *two}):
        c = cands[j]
        left, right = np.arange(n) <= j, np.arange(n) >= j
        p, cost = _refine(c["p"], c["lo"], c["hi"],
                          lambda q, c=c, left=left, right=right: _residuals(q, c["layout"], b_fixed, t, yn, sw, left, right))
        if cost < c["cost"]:
            c["p"], c["cost"] = p, cost
            c["sse"], c["bic"] = score(cost, j, *c["layout"][1:])

    # Entirely concave first, then entirely convex, then the two-piece candidates: ties go to the
    # simpler reading (a flat profile is "concave": no RTT-dependent limit measured).
    order = [n - 1, 0] + list(range(1, n - 1))
    best = min(order, key=lambda j: (cands[j][criterion], order.index(j)))
    return _result(cands, best, b_fixed, y, ys, ux, inv, counts, criterion)


def _measurements(rtt_s: Sequence[float], throughput: Sequence[float], capacity: Optional[float], criterion: str
                  ) -> Tuple[np.ndarray, np.ndarray]:
    """The measurements as two flat float arrays, checked (``ValueError`` saying what is wrong)."""
    x = np.asarray(rtt_s, dtype=float).ravel()
    y = np.asarray(throughput, dtype=float).ravel()
    if x.shape != y.shape:
        raise ValueError(f"rtt_s and throughput differ in length ({x.size} vs {y.size})")
    if criterion not in CRITERIA:
        raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("measurements must be finite numbers")
    if np.any(x < 0) or np.any(y < 0):
        raise ValueError("RTTs and throughputs must be >= 0")
    if capacity is not None and not capacity > 0:
        raise ValueError(f"capacity must be > 0, got {capacity}")
    return x, y


def _result(cands: List[Dict[str, Any]], best: int, b_fixed: Optional[float], y: np.ndarray, ys: float,
            ux: np.ndarray, inv: np.ndarray, counts: np.ndarray, criterion: str) -> RaoFit:
    """The chosen candidate ``cands[best]`` in the measurements' units (RTTs in seconds, rates as
    given; ``ys`` the peak mean rate and ``ux`` the distinct RTTs the fit normalised by)."""
    n_total, n, xs = int(y.size), int(ux.size), float(ux.max())
    c = cands[best]
    free_b, has1, has2 = c["layout"]
    p = c["p"]
    n_eff = n_total + (int(counts[best]) if has1 and has2 else 0)
    i = 0
    b = p[0] if free_b else b_fixed
    i += 1 if free_b else 0
    a1 = tau1 = a2 = tau2 = None
    if has1:
        a1, tau1 = p[i] / xs, p[i + 1] * xs
        i += 2
    if has2:
        a2, tau2 = p[i] / xs, p[i + 1] * xs
    shape = "concave-convex" if has1 and has2 else ("concave" if has1 else "convex")
    sse_bytes = c["sse"] * ys ** 2
    # Total sum of squares with the same double counting of the points at tau_T as (3.1).
    yy = y / ys
    sst = float(np.sum((yy - yy.mean()) ** 2))
    if has1 and has2:
        sst += float(np.sum((yy[inv == best] - yy.mean()) ** 2))
    rmse = math.sqrt(sse_bytes / n_eff)
    notes = []
    if free_b and b >= 0.99 * _B_MAX * 4:
        notes.append("b reached its search bound: b and the sigmoid centre trade off here (the piece is "
                     "an exponential decay over the measured RTTs): the curve is determined, not b and the centre separately")
    if counts.max() == 1 and n < 8:
        notes.append(f"only {n} RTTs without repeats: the shape choice is sensitive to noise; "
                     "measure more RTTs or repeat them")
    return RaoFit(
        transition_rtt_s=float(ux[best]), shape=shape, b=float(b * ys),
        a1=None if a1 is None else float(a1), tau1_s=None if tau1 is None else float(tau1),
        a2=None if a2 is None else float(a2), tau2_s=None if tau2 is None else float(tau2),
        sse=float(sse_bytes), rmse=rmse, rel_rmse=rmse / ys,
        r2=float(1.0 - c["sse"] / sst) if sst > 0 else 1.0,
        n_points=n_total, n_rtts=n, rtt_min_s=float(ux[0]), rtt_max_s=xs, peak_bps=ys,
        capacity_fixed=not free_b, criterion=criterion, notes=notes,
        candidates=[{"tau_T_s": float(ux[d["j"]]), "sse": d["sse"] * ys ** 2, "bic": d["bic"]} for d in cands])


# ----------------------------------------------------------------------------------------
# Measurements: a sweep through the delay forwarder, or a user's file
# ----------------------------------------------------------------------------------------
def sweep(rtts: Sequence[float], streams: int = 4, seconds: float = 1.0, sndbuf: Optional[int] = None, *,
          repeats: int = 1, rate_bps: Optional[float] = None, pings: int = 5,
          progress: Optional[Callable[[Dict[str, float]], None]] = None) -> List[Dict[str, float]]:
    """Measure TCP throughput through a :class:`DelayForwarder` on loopback for each RTT.

    :param rtts: added RTTs in seconds.
    :param streams: parallel TCP streams.
    :param seconds: measuring time per point (after a warm-up of 0.1 s + 2 RTTs).
    :param sndbuf: per-stream window cap in bytes: ``SO_SNDBUF`` of the sending sockets and the
        forwarder's per-connection window (the forwarder terminates TCP, so only the latter caps
        the bytes in flight across the emulated RTT). ``None``: no ``SO_SNDBUF`` and the
        forwarder's default window (4 MiB).
    :param repeats: measurements per RTT (interleaved: the whole sweep is repeated).
    :param rate_bps: optional link rate of the forwarder (bytes/s per direction).
    :param pings: ping-pongs per point to record the RTT actually seen through the forwarder.
    :returns: one record per measurement: ``rtt_s`` (configured), ``rtt_measured_s`` (median
        ping-pong), ``throughput_bps``, ``streams``, ``seconds``, ``window_bytes``, ``repeat``.
    """
    rtts = [float(r) for r in rtts]
    if not rtts or min(rtts) < 0:
        raise ValueError("rtts must be a non-empty list of values >= 0 (seconds)")
    if streams < 1 or seconds <= 0 or repeats < 1:
        raise ValueError("streams and repeats must be >= 1 and seconds > 0")
    window = int(sndbuf) if sndbuf else DEFAULT_WINDOW
    out = []
    with LoopbackPeer() as peer:
        for rep in range(int(repeats)):
            for rtt in rtts:
                with DelayForwarder(("127.0.0.1", 0), peer.address, rtt, rate_bps, window=window) as fwd:
                    measured = statistics.median(ping_rtt(fwd.address, count=max(1, pings))) if pings else float("nan")
                    tput = measure_throughput(peer, fwd.address, streams, seconds, sndbuf=sndbuf,
                                              warmup_s=0.1 + 2 * rtt)
                rec = {"rtt_s": rtt, "rtt_measured_s": measured, "throughput_bps": tput, "streams": int(streams),
                       "seconds": float(seconds), "window_bytes": window, "repeat": rep}
                out.append(rec)
                if progress is not None:
                    progress(rec)
    return out


_RTT_COLS = {"rtt_s": 1.0, "rtt": 1.0, "rtt_ms": 1e-3, "rtt_us": 1e-6}
_TPUT_COLS = {"throughput_bps": 1.0, "throughput": 1.0, "throughput_bytes_s": 1.0, "throughput_mb_s": 1e6,
              "throughput_gb_s": 1e9, "throughput_bit_s": 1 / 8, "throughput_mbit_s": 1e6 / 8,
              "throughput_gbit_s": 1e9 / 8, "throughput_mbps": 1e6 / 8, "throughput_gbps": 1e9 / 8}


def _columns(names: Sequence[str], where: str) -> Tuple[str, float, str, float]:
    low = {str(n).strip().lower(): n for n in names}
    rtt = next((c for c in _RTT_COLS if c in low), None)
    tput = next((c for c in _TPUT_COLS if c in low), None)
    if rtt is None or tput is None:
        raise ValueError(f"{where}: need an RTT column ({', '.join(_RTT_COLS)}) and a throughput column "
                         f"({', '.join(_TPUT_COLS)}); found {list(names)}")
    return low[rtt], _RTT_COLS[rtt], low[tput], _TPUT_COLS[tput]


def load_measurements(path: str) -> Tuple[np.ndarray, np.ndarray]:
    """Read ``(rtt_s, throughput_bps)`` arrays from a CSV or JSON file.

    CSV: a header naming an RTT column (``rtt_s``, ``rtt_ms``, ``rtt_us``) and a throughput
    column (``throughput_bps`` in bytes/s as everywhere in this project, ``throughput_mb_s``,
    ``throughput_gb_s`` in bytes, or ``throughput_gbps`` / ``throughput_mbps`` /
    ``throughput_gbit_s`` / ``throughput_bit_s`` in bits); or no header and two columns,
    seconds and bytes/s. Other columns are ignored (a sweep's CSV loads as it is).
    JSON: ``{"rtt_s": [...], "throughput_bps": [...]}``, a list of such records, a list of
    ``[rtt_s, throughput_bps]`` pairs, or ``{"measurements": <one of those>}``.
    """
    with open(path, newline="") as f:
        text = f.read()
    where = os.fspath(path)
    if path.lower().endswith(".json") or text.lstrip()[:1] in ("{", "["):
        data = json.loads(text)
        if isinstance(data, dict) and "measurements" in data:
            data = data["measurements"]
        if isinstance(data, dict):
            rc, rs, tc, ts = _columns(list(data), where)
            rtt, tput = np.asarray(data[rc], float) * rs, np.asarray(data[tc], float) * ts
        elif isinstance(data, list) and data and isinstance(data[0], dict):
            rc, rs, tc, ts = _columns(list(data[0]), where)
            rtt = np.array([float(r[rc]) for r in data]) * rs
            tput = np.array([float(r[tc]) for r in data]) * ts
        elif isinstance(data, list) and data and isinstance(data[0], (list, tuple)):
            arr = np.asarray(data, dtype=float)
            if arr.ndim != 2 or arr.shape[1] != 2:
                raise ValueError(f"{where}: expected [rtt_s, throughput_bps] pairs")
            rtt, tput = arr[:, 0], arr[:, 1]
        else:
            raise ValueError(f"{where}: no measurements found")
    else:
        rows = [r for r in csv.reader(line for line in text.splitlines() if line.strip() and not line.startswith("#"))]
        if not rows:
            raise ValueError(f"{where}: empty file")
        try:
            float(rows[0][0])
            header = None
        except ValueError:
            header = rows[0]
        if header is None:
            rtt = np.array([float(r[0]) for r in rows])
            tput = np.array([float(r[1]) for r in rows])
        else:
            rc, rs, tc, ts = _columns(header, where)
            i, k = header.index(rc), header.index(tc)
            body = [r for r in rows[1:] if len(r) > max(i, k) and r[i].strip() and r[k].strip()]
            rtt = np.array([float(r[i]) for r in body]) * rs
            tput = np.array([float(r[k]) for r in body]) * ts
    if rtt.size == 0:
        raise ValueError(f"{where}: no measurements found")
    return rtt, tput


# ----------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------
def write_outputs(outdir: str, rtt_s: np.ndarray, tput: np.ndarray, fit: RaoFit,
                  records: Optional[List[Dict[str, float]]] = None, config: Optional[Dict] = None) -> Dict[str, str]:
    """Write ``rao_measurements.csv``, ``rao_fit.csv``, ``rao_fit.json`` and ``rao_profile.png``."""
    os.makedirs(outdir, exist_ok=True)
    paths = {k: os.path.join(outdir, f) for k, f in (("measurements", "rao_measurements.csv"),
                                                     ("fit_csv", "rao_fit.csv"), ("fit_json", "rao_fit.json"),
                                                     ("plot", "rao_profile.png"))}
    recs = records or [{"rtt_s": float(r), "throughput_bps": float(v)} for r, v in zip(rtt_s, tput)]
    fields = list(recs[0].keys())
    with open(paths["measurements"], "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=fields)
        wr.writeheader()
        wr.writerows(recs)
    d = fit.to_dict()
    with open(paths["fit_csv"], "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["parameter", "value"])
        for k, v in d.items():
            if k != "candidates":
                wr.writerow([k, "" if v is None else v])
    with open(paths["fit_json"], "w") as f:
        json.dump({"fit": d, "config": config or {}, "measurements": recs}, f, indent=1, default=float)
    _plot(paths["plot"], rtt_s, tput, fit)
    return paths


def _plot(path: str, rtt_s: np.ndarray, tput: np.ndarray, fit: RaoFit) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms, gb = 1e3, 8 / 1e9
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(np.asarray(rtt_s) * ms, np.asarray(tput) * gb, "o", color="tab:gray", alpha=0.7, label="measured")
    tT = fit.transition_rtt_s
    if fit.a1 is not None:
        xx = np.linspace(fit.rtt_min_s, tT if fit.a2 is not None else fit.rtt_max_s, 200)
        ax.plot(xx * ms, fit.concave(xx) * gb, "-", color="tab:blue", lw=2, label="concave piece")
    if fit.a2 is not None:
        xx = np.linspace(tT if fit.a1 is not None else fit.rtt_min_s, fit.rtt_max_s, 200)
        ax.plot(xx * ms, fit.convex(xx) * gb, "--", color="black", lw=2, label="convex piece")
    ax.axvline(tT * ms, color="tab:red", ls=":", label=f"tau_T = {tT * ms:.3g} ms")
    ax.set_xlabel("RTT (ms)")
    ax.set_ylabel("throughput (Gbit/s)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Rao concave-convex fit: {fit.shape}, rmse {100 * fit.rel_rmse:.1f}% of peak")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _parse_list(text: str) -> List[float]:
    try:
        vals = [float(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"bad RTT list {text!r}: expected milliseconds such as 0,5,10,20,40,80") from None
    if not vals:
        raise ValueError("empty RTT list")
    return vals


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m automdt.experiments.rao",
        description="Fit the concave-convex throughput profile of Rao et al. and report the transition RTT.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--sweep", metavar="MS,MS,...", help="RTTs in ms to measure through the delay forwarder")
    src.add_argument("--measurements", metavar="FILE", help="CSV or JSON of (rtt_s, throughput_bps)")
    p.add_argument("--streams", type=int, default=4, help="parallel TCP streams (sweep; default 4)")
    p.add_argument("--seconds", type=float, default=1.0, help="measuring time per RTT (sweep; default 1)")
    p.add_argument("--sndbuf", default="1Mi",
                   help="per-stream window cap: SO_SNDBUF and the forwarder window (sweep; default 1Mi; 0: "
                        "no SO_SNDBUF and the forwarder's default 4 MiB window)")
    p.add_argument("--repeats", type=int, default=1, help="measurements per RTT (sweep)")
    p.add_argument("--rate", default=None, help="forwarder link rate, bytes/s (sweep; e.g. 200M)")
    p.add_argument("--capacity", default=None,
                   help="fix b to this capacity in bytes/s (the paper's scaling); default: fit b")
    p.add_argument("--criterion", choices=CRITERIA, default="bic",
                   help="choice of tau_T: bic (default) or sse (the paper's plain least squares)")
    p.add_argument("-o", "--output", metavar="DIR", help="write CSV, JSON and a PNG plot here")
    args = p.parse_args(argv)
    try:
        capacity = float(parse_size(args.capacity, "capacity")) if args.capacity else None
        records = None
        config = {"argv": list(sys.argv[1:] if argv is None else argv), "criterion": args.criterion,
                  "capacity_bps": capacity}
        if args.sweep:
            rtts = [v / 1e3 for v in _parse_list(args.sweep)]
            sndbuf = parse_size(args.sndbuf, "sndbuf") or None
            rate = parse_size(args.rate, "rate") if args.rate else None
            config.update(rtts_s=rtts, streams=args.streams, seconds=args.seconds, sndbuf=sndbuf,
                          repeats=args.repeats, rate_bps=rate, started=time.strftime("%Y-%m-%dT%H:%M:%S"))
            print(f"sweep: {len(rtts)} RTTs x {args.repeats}, {args.streams} streams, {args.seconds:g} s each, "
                  f"window {sndbuf or DEFAULT_WINDOW} B per stream", flush=True)

            def show(r):
                print(f"  rtt {r['rtt_s'] * 1e3:7.2f} ms (measured {r['rtt_measured_s'] * 1e3:7.2f} ms): "
                      f"{r['throughput_bps'] / 1e6:9.1f} MB/s  ({r['throughput_bps'] * 8 / 1e9:.3f} Gbit/s)", flush=True)

            records = sweep(rtts, args.streams, args.seconds, sndbuf, repeats=args.repeats, rate_bps=rate,
                            progress=show)
            rtt = np.array([r["rtt_s"] for r in records])
            tput = np.array([r["throughput_bps"] for r in records])
        else:
            rtt, tput = load_measurements(args.measurements)
            config["measurements"] = os.path.abspath(args.measurements)
            print(f"{rtt.size} measurements from {args.measurements}", flush=True)
        fit = fit_profile(rtt, tput, capacity=capacity, criterion=args.criterion)
    except (ValueError, OSError, ConnectionError) as exc:
        print(f"rao: {exc}", file=sys.stderr)
        return 2
    print(fit.summary())
    if args.output:
        paths = write_outputs(args.output, rtt, tput, fit, records, config)
        print("wrote " + ", ".join(paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
