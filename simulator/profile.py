"""Path profiles: the parameters of the buffer simulator, fitted from an exploration run.

A :class:`Profile` holds, for each stage (read, network, write), the per-thread throughput
``tpt`` and the stage bandwidth ``bandwidth`` (both bytes/s), the staging-buffer capacities
(bytes), the control interval, the thread bound and the per-interval capacity noise. A stage with
``n`` threads can move at most :func:`capacity` ``= min(n * tpt, bandwidth)`` bytes/s.

Profiles are stored as YAML (bytes/s and bytes)::

    stages:
      read:  {tpt: 40.0e+6, bandwidth: 400.0e+6}
      net:   {tpt: 120.0e+6, bandwidth: 400.0e+6}
      write: {tpt: 120.0e+6, bandwidth: 400.0e+6}
    buffers: {sender: 268435456, receiver: 268435456}
    interval_s: 1.0
    max_threads: 32
    noise: 0.05          # optional: relative std of per-interval capacity noise
    samples: [...]       # optional raw exploration samples (or a path to a CSV/JSONL)

Numbers written as ``40.0e6`` (which YAML 1.1 reads as a string) are accepted too.

Contention (optional, per stage): ``contention`` (sigma) and ``coherency`` (kappa) divide the
capacity by the Universal Scalability Law's denominator ``1 + sigma (n - 1) + kappa n (n - 1)``,
so that the per-thread throughput falls as threads are added and, past a peak, the stage moves
less with more threads (a disk or a CPU shared by too many workers). Both default to 0 and are
written only when set, so older profiles load and save unchanged::

    stages:
      write: {tpt: 30.0e+6, bandwidth: 300.0e+6, contention: 0.02, coherency: 0.001}
"""
from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from automdt.policy_contract import STAGES


CAPACITY_MODELS: tuple[str, str] = ("min", "concave")
"""``"min"``: ``min(n*tpt, B)`` (the AutoMDT model). ``"concave"``: ``B*n/(n + B/tpt)``, the
``alpha*n/(n+gamma)`` contention form of Rao et al. with the same initial slope ``tpt`` and the
same asymptote ``B`` (it never quite reaches ``B``)."""

N_PROFILE_UNIFORMS = 16
"""How many uniforms :meth:`Profile.random` consumes (fixed, so that seeded streams line up)."""


class ProfileError(ValueError):
    """A profile (file or dict) is malformed; the message names the source and the field."""


def _num(value: Any, where: str, *, positive: bool = True, allow_zero: bool = False) -> float:
    """Coerce ``value`` to a finite float, accepting numeric strings such as ``"40.0e6"``."""
    if isinstance(value, bool):
        raise ProfileError(f"{where} must be a number, got {value!r}")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ProfileError(f"{where} must be a number, got {value!r}") from None
    if not isinstance(value, (int, float, np.integer, np.floating)):
        raise ProfileError(f"{where} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ProfileError(f"{where} must be finite, got {value!r}")
    if positive and (value < 0 or (value == 0 and not allow_zero)):
        need = ">= 0" if allow_zero else "> 0"
        raise ProfileError(f"{where} must be {need}, got {value!r}")
    return value


def _int(value: Any, where: str, minimum: int = 1) -> int:
    v = _num(value, where, positive=False)
    if v != int(v) or v < minimum:
        raise ProfileError(f"{where} must be an integer >= {minimum}, got {value!r}")
    return int(v)


@dataclass(frozen=True)
class StageProfile:
    """One stage of the pipeline.

    :param tpt: per-thread throughput in bytes/s (what one thread moves when nothing else limits it).
    :param bandwidth: stage bandwidth in bytes/s (the most all threads together can move).
    :param tpt_spread: relative uncertainty (robust std / value) of ``tpt`` from the fit; 0 if known.
    :param bandwidth_spread: relative uncertainty of ``bandwidth`` from the fit; 0 if known.
    :param contention: USL sigma in [0, 1): each thread beyond the first adds this share of work
        for all (0: none; see the module docstring).
    :param coherency: USL kappa in [0, 1]: pairwise overhead between threads; above 0 the stage's
        capacity peaks and then falls with more threads (0: none).
    """

    tpt: float
    bandwidth: float
    tpt_spread: float = 0.0
    bandwidth_spread: float = 0.0
    contention: float = 0.0
    coherency: float = 0.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, where: str = "stage") -> None:
        """Raise :class:`ProfileError` if a value is not a positive finite number."""
        for name in ("tpt", "bandwidth"):
            object.__setattr__(self, name, _num(getattr(self, name), f"{where}.{name} (bytes/s)"))
        for name in ("tpt_spread", "bandwidth_spread", "contention", "coherency"):
            object.__setattr__(self, name, _num(getattr(self, name), f"{where}.{name}", allow_zero=True))
        if self.contention >= 1.0:
            raise ProfileError(f"{where}.contention is the USL sigma and must be in [0, 1), got {self.contention!r}")
        if self.coherency > 1.0:
            raise ProfileError(f"{where}.coherency is the USL kappa and must be in [0, 1], got {self.coherency!r}")

    @property
    def has_contention(self) -> bool:
        return bool(self.contention or self.coherency)

    def to_dict(self) -> dict[str, float]:
        d = {"tpt": float(self.tpt), "bandwidth": float(self.bandwidth)}
        if self.tpt_spread:
            d["tpt_spread"] = float(self.tpt_spread)
        if self.bandwidth_spread:
            d["bandwidth_spread"] = float(self.bandwidth_spread)
        if self.contention:
            d["contention"] = float(self.contention)
        if self.coherency:
            d["coherency"] = float(self.coherency)
        return d


def capacity_array(tpt: np.ndarray | float, bandwidth: np.ndarray | float, n: np.ndarray | float, model: str = "min",
                   contention: np.ndarray | None = None, coherency: np.ndarray | None = None) -> np.ndarray:
    """Vectorised stage capacity in bytes/s for thread counts ``n`` (broadcasting).

    ``contention``/``coherency`` (USL sigma and kappa, broadcasting like ``tpt``; None: 0) divide
    the model's capacity by ``1 + sigma (n - 1) + kappa n (n - 1)`` (:func:`usl_denominator`).
    """
    lin = n * tpt
    if model == "min":
        out = np.minimum(lin, bandwidth)
    elif model == "concave":
        out = bandwidth * lin / (lin + bandwidth)
    else:
        raise ValueError(f"unknown capacity model {model!r}; use one of {CAPACITY_MODELS}")
    if contention is None and coherency is None:
        return out
    return out / usl_denominator(n, contention, coherency)


def usl_denominator(n: Any, contention: Any = None, coherency: Any = None) -> np.ndarray:
    """``1 + sigma (n - 1) + kappa n (n - 1)``: the Universal Scalability Law's slow-down at ``n`` threads."""
    n = np.asarray(n, dtype=np.float64)
    d = 1.0 + (0.0 if contention is None else np.asarray(contention, dtype=np.float64)) * (n - 1.0)
    if coherency is not None:
        d = d + np.asarray(coherency, dtype=np.float64) * n * (n - 1.0)
    return d


def peak_capacity_array(tpt: np.ndarray, bandwidth: np.ndarray, max_threads: int, model: str = "min",
                        contention: np.ndarray | None = None, coherency: np.ndarray | None = None) -> np.ndarray:
    """The most each stage can move with any count in ``[1, max_threads]`` (shape of ``tpt``).

    Without contention capacities grow with the thread count, so this is the capacity at
    ``max_threads``; with it, the peak may lie below.
    """
    if contention is None and coherency is None:
        return capacity_array(tpt, bandwidth, np.float64(max_threads), model)
    n = np.arange(1, int(max_threads) + 1, dtype=np.float64)
    t = np.asarray(tpt, dtype=np.float64)[..., None]
    b = np.asarray(bandwidth, dtype=np.float64)[..., None]
    s = None if contention is None else np.asarray(contention, dtype=np.float64)[..., None]
    k = None if coherency is None else np.asarray(coherency, dtype=np.float64)[..., None]
    return capacity_array(t, b, n, model, s, k).max(axis=-1)


def capacity(stage: StageProfile, n: int | float | np.ndarray, model: str = "min") -> float | np.ndarray:
    """Bytes/s a stage can move with ``n`` threads: ``min(n * tpt, bandwidth)`` (with the stage's
    contention, if any, divided by the USL denominator).

    :param stage: the stage parameters.
    :param n: thread count(s).
    :param model: ``"min"`` (default) or ``"concave"`` (see :data:`CAPACITY_MODELS`).
    """
    extra = (np.float64(stage.contention), np.float64(stage.coherency)) if stage.has_contention else (None, None)
    out = capacity_array(np.float64(stage.tpt), np.float64(stage.bandwidth), np.asarray(n, dtype=np.float64), model,
                         *extra)
    return float(out) if np.ndim(out) == 0 else out


@dataclass(frozen=True)
class Profile:
    """Parameters of the buffer simulator for one path (see the module docstring for the YAML).

    :param read: read stage (source disk).
    :param net: network stage (one TCP connection per thread).
    :param write: write stage (destination disk).
    :param sender_buffer: capacity of the sender staging buffer in bytes.
    :param receiver_buffer: capacity of the receiver staging buffer in bytes.
    :param interval_s: control interval in seconds (one environment step).
    :param max_threads: upper bound of every stage's thread count.
    :param noise: relative std of the per-interval multiplicative capacity noise (0 <= noise <= 0.5).
    :param samples: raw exploration samples (list of dicts), a path to a CSV/JSONL file, or None.
    :param meta: free-form metadata (fit diagnostics, provenance).
    :param capacity_model: ``"min"`` or ``"concave"`` (see :data:`CAPACITY_MODELS`).
    """

    read: StageProfile
    net: StageProfile
    write: StageProfile
    sender_buffer: int
    receiver_buffer: int
    interval_s: float = 1.0
    max_threads: int = 32
    noise: float = 0.0
    samples: list | str | None = None
    meta: dict = field(default_factory=dict)
    capacity_model: str = "min"

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self, source: str = "profile") -> None:
        """Check every field; raise :class:`ProfileError` with a message naming it."""
        for name in STAGES:
            st = getattr(self, name)
            if isinstance(st, Mapping):
                st = _stage_from_dict(st, f"{source}: stages.{name}")
                object.__setattr__(self, name, st)
            if not isinstance(st, StageProfile):
                raise ProfileError(f"{source}: stages.{name} must be a StageProfile or a mapping, got {st!r}")
        object.__setattr__(self, "sender_buffer", _int(self.sender_buffer, f"{source}: buffers.sender (bytes)"))
        object.__setattr__(self, "receiver_buffer", _int(self.receiver_buffer, f"{source}: buffers.receiver (bytes)"))
        object.__setattr__(self, "interval_s", _num(self.interval_s, f"{source}: interval_s (seconds)"))
        object.__setattr__(self, "max_threads", _int(self.max_threads, f"{source}: max_threads"))
        noise = _num(self.noise, f"{source}: noise", allow_zero=True)
        if noise > 0.5:
            raise ProfileError(f"{source}: noise is a relative std and must be <= 0.5, got {noise!r}")
        object.__setattr__(self, "noise", noise)
        if self.samples is not None and not isinstance(self.samples, (list, str, os.PathLike)):
            raise ProfileError(f"{source}: samples must be a list, a file path or absent, got {type(self.samples).__name__}")
        if isinstance(self.samples, os.PathLike):
            object.__setattr__(self, "samples", os.fspath(self.samples))
        if not isinstance(self.meta, dict):
            raise ProfileError(f"{source}: meta must be a mapping, got {type(self.meta).__name__}")
        if self.capacity_model not in CAPACITY_MODELS:
            raise ProfileError(f"{source}: capacity_model must be one of {CAPACITY_MODELS}, got {self.capacity_model!r}")

    # ------------------------------------------------------------------ accessors
    @property
    def stages(self) -> tuple[StageProfile, StageProfile, StageProfile]:
        """``(read, net, write)``."""
        return (self.read, self.net, self.write)

    def tpt_array(self) -> np.ndarray:
        """Per-thread throughputs (read, net, write) in bytes/s, shape (3,)."""
        return np.array([s.tpt for s in self.stages], dtype=np.float64)

    def bandwidth_array(self) -> np.ndarray:
        """Stage bandwidths (read, net, write) in bytes/s, shape (3,)."""
        return np.array([s.bandwidth for s in self.stages], dtype=np.float64)

    @property
    def has_contention(self) -> bool:
        """Whether any stage has USL contention or coherency (see the module docstring)."""
        return any(st.has_contention for st in self.stages)

    def contention_arrays(self) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
        """``(sigma (3,), kappa (3,))``, or ``(None, None)`` when no stage has contention."""
        if not self.has_contention:
            return None, None
        return (np.array([s.contention for s in self.stages], dtype=np.float64),
                np.array([s.coherency for s in self.stages], dtype=np.float64))

    def capacities(self, threads: Sequence[int] | np.ndarray) -> np.ndarray:
        """Capacities (bytes/s) of the three stages for a thread triple."""
        return capacity_array(self.tpt_array(), self.bandwidth_array(), np.asarray(threads, dtype=np.float64),
                              self.capacity_model, *self.contention_arrays())

    def peak_capacities(self) -> np.ndarray:
        """The most each stage can move with any thread count up to ``max_threads`` (3,)."""
        return peak_capacity_array(self.tpt_array(), self.bandwidth_array(), self.max_threads, self.capacity_model,
                                   *self.contention_arrays())

    def steady_throughput(self, threads: Sequence[int]) -> float:
        """Steady-state end-to-end throughput (bytes/s): the slowest stage's capacity."""
        return float(self.capacities(threads).min())

    @property
    def achievable_bps(self) -> float:
        """The best steady-state throughput of the path: ``min_i max_n capacity_i(n)``.

        Without contention that is ``min_i capacity_i(max_threads)``, the smallest stage bandwidth
        whenever ``max_threads`` threads can saturate every stage. Rewards and oracle utilities are
        normalised by it.
        """
        return float(self.peak_capacities().min())

    @property
    def bottleneck(self) -> str:
        """Name of the stage with the lowest peak capacity (at ``max_threads`` without contention)."""
        return STAGES[int(np.argmin(self.peak_capacities()))]

    def replace(self, **changes: Any) -> "Profile":
        """A copy with some fields changed (``dataclasses.replace``)."""
        import dataclasses

        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self, include_samples: bool = True) -> dict[str, Any]:
        """The YAML/JSON structure (see the module docstring)."""
        d: dict[str, Any] = {
            "stages": {name: st.to_dict() for name, st in zip(STAGES, self.stages)},
            "buffers": {"sender": int(self.sender_buffer), "receiver": int(self.receiver_buffer)},
            "interval_s": float(self.interval_s),
            "max_threads": int(self.max_threads),
            "noise": float(self.noise),
        }
        if self.capacity_model != "min":
            d["capacity_model"] = self.capacity_model
        if include_samples and self.samples is not None:
            d["samples"] = self.samples
        if self.meta:
            d["meta"] = _plain(self.meta)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "profile") -> "Profile":
        """Build a profile from :meth:`to_dict`'s structure; errors name ``source`` and the field."""
        if not isinstance(d, Mapping):
            raise ProfileError(f"{source}: top level must be a mapping, got {type(d).__name__}")
        known = {"stages", "buffers", "interval_s", "max_threads", "noise", "samples", "meta", "capacity_model"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ProfileError(f"{source}: unknown field(s) {unknown}; expected some of {sorted(known)}")
        stages = d.get("stages")
        if not isinstance(stages, Mapping):
            raise ProfileError(f"{source}: stages must be a mapping with read, net and write")
        st = {}
        for name in STAGES:
            if name not in stages:
                raise ProfileError(f"{source}: stages.{name} is missing")
            st[name] = _stage_from_dict(stages[name], f"{source}: stages.{name}")
        extra = sorted(set(stages) - set(STAGES))
        if extra:
            raise ProfileError(f"{source}: stages has unknown stage(s) {extra}; expected read, net, write")
        buffers = d.get("buffers")
        if not isinstance(buffers, Mapping) or "sender" not in buffers or "receiver" not in buffers:
            raise ProfileError(f"{source}: buffers must be a mapping with sender and receiver (bytes)")
        noise = d.get("noise")
        noise = 0.0 if noise is None else _num(noise, f"{source}: noise", allow_zero=True)
        if noise > 0.5:
            raise ProfileError(f"{source}: noise is a relative std and must be <= 0.5, got {noise!r}")
        meta = d.get("meta") or {}
        if not isinstance(meta, Mapping):
            raise ProfileError(f"{source}: meta must be a mapping, got {type(meta).__name__}")
        samples = d.get("samples")
        if samples is not None and not isinstance(samples, (list, str)):
            raise ProfileError(f"{source}: samples must be a list, a file path or absent, got {type(samples).__name__}")
        model = d.get("capacity_model", "min")
        if model not in CAPACITY_MODELS:
            raise ProfileError(f"{source}: capacity_model must be one of {CAPACITY_MODELS}, got {model!r}")
        return cls(
            read=st["read"], net=st["net"], write=st["write"],
            sender_buffer=_int(buffers["sender"], f"{source}: buffers.sender (bytes)"),
            receiver_buffer=_int(buffers["receiver"], f"{source}: buffers.receiver (bytes)"),
            interval_s=_num(d.get("interval_s", 1.0), f"{source}: interval_s (seconds)"),
            max_threads=_int(d.get("max_threads", 32), f"{source}: max_threads"),
            noise=noise, samples=samples, meta=dict(meta), capacity_model=model,
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Profile":
        """Read a YAML (or JSON) profile; raise :class:`ProfileError` naming the file and the field."""
        import yaml

        path = Path(path)
        try:
            text = path.read_text()
        except OSError as e:
            raise ProfileError(f"{path}: cannot read profile ({e.strerror or e})") from None
        try:
            d = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise ProfileError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
        if d is None:
            raise ProfileError(f"{path}: file is empty")
        return cls.from_dict(d, source=str(path))

    def save(self, path: str | os.PathLike) -> None:
        """Write the profile as YAML (``.json`` suffix: JSON)."""
        import yaml

        path = Path(path)
        d = self.to_dict()
        if path.suffix.lower() == ".json":
            path.write_text(json.dumps(d, indent=2) + "\n")
        else:
            path.write_text(yaml.safe_dump(d, sort_keys=False, default_flow_style=None))

    def load_samples(self, base_dir: str | os.PathLike | None = None) -> list[dict]:
        """The exploration samples as a list of dicts (reading the file if ``samples`` is a path).

        :param base_dir: directory against which a relative ``samples`` path is resolved.
        """
        if self.samples is None:
            return []
        if isinstance(self.samples, list):
            return self.samples
        p = Path(self.samples)
        if not p.is_absolute() and base_dir is not None:
            p = Path(base_dir) / p
        return read_samples(p)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def default(cls) -> "Profile":
        """A read-bound example path (40 MB/s per read thread, 400 MB/s everywhere)."""
        return cls(
            read=StageProfile(40e6, 400e6), net=StageProfile(120e6, 400e6), write=StageProfile(120e6, 400e6),
            sender_buffer=256 * 2**20, receiver_buffer=256 * 2**20,
        )

    @classmethod
    def random(
        cls,
        rng: np.random.Generator,
        max_threads: int = 32,
        interval_s: float = 1.0,
        **ranges: Any,
    ) -> "Profile":
        """A randomised profile for domain randomisation (consumes :data:`N_PROFILE_UNIFORMS` uniforms).

        One stage is chosen as the bottleneck (each equally likely); its bandwidth is log-uniform in
        ``bandwidth_range``; the other two stages are 1-20x faster (log-uniform, capped). Each
        stage's per-thread rate is chosen so that its ideal thread count ``B_min / tpt`` is
        log-uniform in ``[0.5, 1.25*max_threads]`` (below 1: a single thread saturates the
        stage), then clipped to ``tpt_range``. Buffers hold
        0.25-8 s of the bottleneck rate; noise is uniform in ``noise_range``.

        :param rng: the generator (e.g. an env's ``np_random``).
        :param max_threads: thread bound of the profile.
        :param interval_s: control interval of the profile.
        :param ranges: overrides of :data:`RANDOM_RANGES` (``tpt_range``, ``bandwidth_range``, ...).
        """
        u = rng.random((1, N_PROFILE_UNIFORMS))
        arr = random_profile_arrays(u, max_threads, **ranges)
        return cls(
            read=StageProfile(float(arr["tpt"][0, 0]), float(arr["bandwidth"][0, 0])),
            net=StageProfile(float(arr["tpt"][0, 1]), float(arr["bandwidth"][0, 1])),
            write=StageProfile(float(arr["tpt"][0, 2]), float(arr["bandwidth"][0, 2])),
            sender_buffer=int(arr["buffers"][0, 0]), receiver_buffer=int(arr["buffers"][0, 1]),
            interval_s=interval_s, max_threads=max_threads, noise=float(arr["noise"][0]),
            meta={"generator": "Profile.random"},
        )


RANDOM_RANGES: dict[str, tuple[float, float]] = {
    "tpt_range": (20e6, 2e9),  # bytes/s per thread
    "bandwidth_range": (100e6, 10e9),  # bytes/s of the bottleneck stage
    "faster_ratio": (1.0, 20.0),  # other stages' bandwidth / bottleneck bandwidth
    "buffer_seconds": (0.25, 8.0),  # buffer capacity in seconds of the bottleneck rate
    "buffer_bytes": (8 * 2**20, 64 * 2**30),  # clip of the buffer capacities
    "noise_range": (0.0, 0.1),
}
"""Ranges used by :meth:`Profile.random` and by the environments' ``random_profiles`` mode."""


def _loguniform(u: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return np.exp(np.log(lo) + u * (np.log(hi) - np.log(lo)))


def random_profile_arrays(u: np.ndarray, max_threads: int, **ranges: Any) -> dict[str, np.ndarray]:
    """Map uniforms ``u`` (N, :data:`N_PROFILE_UNIFORMS`) to N random profiles, vectorised.

    Returns ``tpt`` (N,3), ``bandwidth`` (N,3), ``buffers`` (N,2) int64 and ``noise`` (N,).
    Used by :meth:`Profile.random` and by the environments (so both draw identical profiles).
    """
    bad = sorted(set(ranges) - set(RANDOM_RANGES))
    if bad:
        raise TypeError(f"unknown range(s) {bad}; expected some of {sorted(RANDOM_RANGES)}")
    r = {**RANDOM_RANGES, **ranges}
    n = u.shape[0]
    bott = np.minimum((u[:, 0] * 3).astype(np.int64), 2)  # bottleneck stage index
    b_min = _loguniform(u[:, 1], *r["bandwidth_range"])
    ratios = _loguniform(u[:, 2:4], *r["faster_ratio"])  # (N,2) for the two other stages
    bw = np.empty((n, 3))
    lo_bw, hi_bw = r["bandwidth_range"]
    rows = np.arange(n)
    others = np.array([[1, 2], [0, 2], [0, 1]])[bott]  # (N,2)
    bw[rows, bott] = b_min
    bw[rows[:, None], others] = np.minimum(b_min[:, None] * ratios, max(hi_bw, 1.0) * 1.0)
    bw = np.maximum(bw, b_min[:, None])
    n_star = _loguniform(u[:, 4:7], 0.5, 1.25 * max_threads)  # < 1: one thread saturates
    tpt = np.clip(b_min[:, None] / n_star, *r["tpt_range"])
    secs = _loguniform(u[:, 7:9], *r["buffer_seconds"])
    buffers = np.clip(b_min[:, None] * secs, *r["buffer_bytes"]).astype(np.int64)
    lo_n, hi_n = r["noise_range"]
    noise = lo_n + u[:, 9] * (hi_n - lo_n)
    return {"tpt": tpt, "bandwidth": bw, "buffers": buffers, "noise": noise}


def _stage_from_dict(d: Any, where: str) -> StageProfile:
    if isinstance(d, StageProfile):
        return d
    if not isinstance(d, Mapping):
        raise ProfileError(f"{where} must be a mapping with tpt and bandwidth (bytes/s), got {d!r}")
    unknown = sorted(set(d) - {"tpt", "bandwidth", "tpt_spread", "bandwidth_spread", "contention", "coherency"})
    if unknown:
        raise ProfileError(f"{where}: unknown field(s) {unknown}; expected tpt, bandwidth, tpt_spread, "
                           "bandwidth_spread, contention, coherency")
    for key in ("tpt", "bandwidth"):
        if key not in d:
            raise ProfileError(f"{where}.{key} is missing (bytes/s)")
    return StageProfile(
        tpt=_num(d["tpt"], f"{where}.tpt (bytes/s)"),
        bandwidth=_num(d["bandwidth"], f"{where}.bandwidth (bytes/s)"),
        tpt_spread=_num(d.get("tpt_spread", 0.0), f"{where}.tpt_spread", allow_zero=True),
        bandwidth_spread=_num(d.get("bandwidth_spread", 0.0), f"{where}.bandwidth_spread", allow_zero=True),
        contention=_usl_param(d, "contention", where),
        coherency=_usl_param(d, "coherency", where),
    )


def _usl_param(d: Mapping[str, Any], key: str, where: str) -> float:
    v = _num(d.get(key, 0.0), f"{where}.{key}", allow_zero=True)
    if (key == "contention" and v >= 1.0) or v > 1.0:
        bound = "[0, 1)" if key == "contention" else "[0, 1]"
        raise ProfileError(f"{where}.{key} is a USL {'sigma' if key == 'contention' else 'kappa'} and must be in "
                           f"{bound}, got {v!r}")
    return v


def _plain(x: Any) -> Any:
    """Convert numpy scalars/arrays and tuples into YAML-safe builtins."""
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return _plain(x.tolist())
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def read_samples(path: str | os.PathLike) -> list[dict]:
    """Read exploration samples from JSONL (one JSON object a line) or CSV.

    CSV columns: ``t, interval_s, threads_read, threads_net, threads_write, bytes_read, ...,
    busy_s_read, ..., wait_s_read, ..., buffer_sender, buffer_receiver``.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ProfileError(f"{p}: cannot read samples ({e.strerror or e})") from None
    if p.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        out = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ProfileError(f"{p}: line {i} is not JSON: {e.msg}") from None
        return out
    rows = list(csv.DictReader(text.splitlines()))
    out = []
    for i, row in enumerate(rows, 2):
        try:
            s: dict[str, Any] = {"t": float(row.get("t", 0.0) or 0.0),
                                 "interval_s": float(row.get("interval_s", 1.0) or 1.0)}
            for key in ("threads", "bytes", "busy_s", "wait_s"):
                cols = [f"{key}_{st}" for st in STAGES]
                if all(c in row and row[c] != "" for c in cols):
                    conv = int if key == "threads" else float
                    s[key] = [conv(float(row[c])) for c in cols]
            if row.get("buffer_sender", "") != "" and row.get("buffer_receiver", "") != "":
                s["buffer"] = [float(row["buffer_sender"]), float(row["buffer_receiver"])]
        except ValueError as e:
            raise ProfileError(f"{p}: row {i}: {e}") from None
        out.append(s)
    return out


def write_samples(samples: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> None:
    """Write samples as JSONL (``.jsonl``) or CSV (any other suffix); see :func:`read_samples`."""
    p = Path(path)
    if p.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        p.write_text("".join(json.dumps(_plain(dict(s))) + "\n" for s in samples))
        return
    cols = ["t", "interval_s"] + [f"{k}_{st}" for k in ("threads", "bytes", "busy_s", "wait_s") for st in STAGES]
    cols += ["buffer_sender", "buffer_receiver"]
    with p.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for s in samples:
            row: list[Any] = [s.get("t", 0.0), s.get("interval_s", 1.0)]
            for k in ("threads", "bytes", "busy_s", "wait_s"):
                v = s.get(k)
                row += list(v) if v is not None else ["", "", ""]
            b = s.get("buffer")
            row += list(b) if b is not None else ["", ""]
            w.writerow(row)
