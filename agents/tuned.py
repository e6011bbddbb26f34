"""A policy trained for one path: the default controller plus a learned selector, in numpy.

``automdt train --profile P`` writes one (:mod:`automdt.agents.tuned_training`). The policy is
the default's capacity controller (:class:`~automdt.agents.capacity.CapacityPolicy`), started at
the explored profile's optimum, and a small network trained with PPO in the simulator on P and
the paths near it (:mod:`automdt.agents.neighbourhood`). Every interval the capacity controller
measures and proposes; the network chooses, per stage, one of :data:`CHOICES`:

* ``capacity``: the capacity controller's proposal (what the default runs);
* ``hold``: the counts that ran (no change on a noisy measurement);
* ``prior``: the explored profile's optimum (what the path needs if it is still the one explored).

The network's input (:func:`features`) says how far the measured path is from the explored one:
per stage the measured rate per busy thread against the profile's, the stage's utilisation, the
counts that ran, the proposal and the prior on a log scale, the delivered rate against the
profile's optimum, the buffers' fill; :data:`FRAME_STACK` intervals of it. Its output layer
starts with ``capacity`` :data:`KEEP_BIAS` logits ahead, so training starts from the default.

**Trust.** The network was trained on the paths near the explored one, and its choices mean
nothing on a path far from them. Each stage's measured capacity (its ``n`` threads' rate while
busy, sampled as the capacity controller samples it) is compared with what the explored profile
predicts at ``n`` (:attr:`TunedPolicy.trust`, written by training: the neighbourhood's reach). When
a stage carries less than the lower bound, or more than the upper one, in :data:`DISTRUST`
consecutive samples, the network is retired for the rest of the run and a fresh capacity controller
drives alone from its start: the default, measuring the path it finds.

A file without a network (``learned: none`` in its metadata: training found no gain that held
on the validation paths) runs the capacity controller from the profile's optimum, or from the
default's start.

Whenever a trained file drives a transfer or a simulation by its path, the shield wraps it
(:mod:`automdt.agents.registry`). Inference is numpy (the actor of :mod:`automdt.agents.ppo`);
loading reads the JSON sidecar and the ``.npz`` arrays, never a pickle.
"""
from __future__ import annotations

import io
import json
import math
import os
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from automdt.agents.capacity import MIN_BUSY_S, CapacityPolicy
from automdt.policy_contract import K_DEFAULT, STAGES, Features, Observation, OwnStart, PolicyBase, Triple, clamp_triple, finite

FORMAT = "automdt-tuned/1"
"""Value of ``format`` in a tuned policy's sidecar."""
CHOICES = ("capacity", "hold", "prior")
"""Per stage, what the network may choose."""
CAPACITY, HOLD, PRIOR = range(3)
FRAME_STACK = 3
"""Intervals of input the network sees."""
FRAME_DIM = 3 * 7 + 4
"""Numbers per interval of :func:`features`."""
KEEP_BIAS = 4.0
"""Logits by which ``capacity`` leads the other choices when training starts."""
LOG_CLIP = 3.0
"""Bound of the log-ratio inputs (a factor of e^3 ~ 20 either way)."""
WEIGHTS_ENTRY = "automdt_actor.npz"
"""The zip entry with the network's weights (the names :class:`automdt.agents.ppo.ActorMLP` reads)."""
DISTRUST = 2
"""Consecutive samples outside the trusted band after which the network is retired."""
LEARNED = ("network", "prior", "none")
"""What a file's learned part is: the selector network, the profile's start alone, or nothing
(the default controller)."""


def _log_ratio(a: float, b: float) -> float:
    if a <= 0.0 or b <= 0.0:
        return 0.0
    return max(-LOG_CLIP, min(LOG_CLIP, math.log(a / b)))


def features(obs: Observation, proposal: Triple, prior: Triple, prior_tpt: Sequence[float],
             prior_rate: float, step: int) -> List[float]:
    """One interval's :data:`FRAME_DIM` inputs (see the module docstring)."""
    out: List[float] = []
    busy = obs.busy_s
    wait = obs.wait_s
    for s in range(3):
        n = max(1, int(obs.threads[s]))
        rate = finite(obs.throughput_bps[s])
        b = finite(busy[s]) if busy is not None else 0.0
        w = finite(wait[s]) if wait is not None else 0.0
        per = rate * obs.interval_s / b if b > 0.01 else 0.0
        out += [
            _log_ratio(per, prior_tpt[s]),
            1.0 if per > 0.0 else 0.0,
            b / (b + w) if b + w > 0.0 else 0.0,
            math.log2(n) / 6.0,
            _log_ratio(proposal[s], n),
            _log_ratio(prior[s], n),
            min(4.0, rate / prior_rate) if prior_rate > 0.0 else 0.0,
        ]
    fills = tuple(obs.buffer_fill) + (0.0, 0.0)
    out += [float(fills[0]), float(fills[1]),
            min(4.0, finite(obs.throughput_bps[2]) / prior_rate) if prior_rate > 0.0 else 0.0,
            min(step, 10) / 10.0]
    return out


def select(choice: Sequence[int], proposal: Triple, current: Triple, prior: Triple) -> Triple:
    """The counts for one :data:`CHOICES` index per stage."""
    return tuple(p if c == CAPACITY else h if c == HOLD else q  # type: ignore[return-value]
                 for c, p, h, q in zip(choice, proposal, current, prior))


class TunedPolicy(PolicyBase):
    """The capacity controller with a learned per-stage selector (see the module docstring).

    :param prior: the explored profile's optimum (the start, and the ``prior`` choice).
    :param prior_tpt: the profile's per-thread rates (bytes/s), read, net, write.
    :param prior_rate: the profile's optimum rate (bytes/s).
    :param actor: an :class:`automdt.agents.ppo.ActorMLP`, a function that loads one, or None
        (no network: the capacity controller alone).
    :param start: ``"prior"`` (start at the profile's optimum) or ``"default"`` (the capacity
        controller's own start).
    :param metadata: the file's sidecar, if any.
    :param trust: per stage ``(capacity by count, lowest factor, highest factor)``: the explored
        profile's capacity at ``n`` threads (index ``n - 1``) and how far a measurement may lie
        from it before it counts against the network (see the module docstring); None: always
        trusted.
    """

    def __init__(self, prior: Triple, prior_tpt: Sequence[float], prior_rate: float, actor: Any = None, *,
                 start: str = "prior", max_threads: int = 32, k: float = K_DEFAULT,
                 metadata: Optional[Dict[str, Any]] = None, label: str = "tuned",
                 trust: Optional[Sequence[Tuple[Sequence[float], float, float]]] = None) -> None:
        self.prior = clamp_triple(prior, 1 << 30)
        self.prior_tpt = [float(x) for x in prior_tpt]
        self.prior_rate = float(prior_rate)
        self._actor = actor
        self.k = float(k)
        self.metadata = dict(metadata or {})
        self.name = label
        self.base = CapacityPolicy(k=self.k, max_threads=max_threads)
        self.trust = [([float(c) for c in caps], float(lo), float(hi)) for caps, lo, hi in trust] if trust else None
        if start == "prior":
            self.start_source = "profile"
            self.start_threads: Triple = self.prior
        else:
            self.start_source = "policy"
            self.start_threads = self.base.start_threads
        self.reset(max_threads)

    @property
    def has_network(self) -> bool:
        return self._actor is not None

    @property
    def actor(self) -> Any:
        if self._actor is not None and not hasattr(self._actor, "mode"):
            self._actor = self._actor()
        return self._actor

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        self.max_threads = int(max_threads)
        self.base.reset(self.max_threads, seed)
        start = clamp_triple(self.start_threads, self.max_threads)
        self.base.start_from(start)
        self.frames: List[List[float]] = []
        self.step = 0
        self.proposal: Triple = start
        self.obs: Optional[Observation] = None
        self._last: Optional[Triple] = None
        self._outside = [0, 0, 0]
        self.retired: Optional[str] = None
        """Why the network stopped driving (None while it drives)."""
        return start

    def start_from(self, threads: Triple) -> None:
        self.base.start_from(threads)

    def features(self) -> Features:
        """It takes a start (the profile's optimum, or the capacity controller's) and is asked in a
        run's tail: the capacity controller sizes the writers that drain the buffers."""
        return Features(start=OwnStart(self.start_threads, self.start_source), asked_in_tail=True)

    def annotation(self) -> Dict[str, Any]:
        """What the transfer's interval log records about the selector."""
        if not self.has_network:
            return {}
        return {"tuned": "selector" if self.retired is None else f"capacity ({self.retired})"}

    def _check_trust(self, obs: Observation) -> None:
        """Count the stages' samples outside the trusted band; retire the network after :data:`DISTRUST`."""
        last, self._last = self._last, tuple(int(n) for n in obs.threads)  # type: ignore[assignment]
        if (self.trust is None or self._actor is None or self.retired is not None or obs.busy_s is None
                or last is None):
            return
        for s, (caps, lo, hi) in enumerate(self.trust):
            n, busy = int(obs.threads[s]), finite(obs.busy_s[s])
            if busy < MIN_BUSY_S or last[s] != n or n > len(caps):
                continue  # no sample, as for the capacity controller
            ratio = n * finite(obs.throughput_bps[s]) * obs.interval_s / busy / caps[n - 1]
            self._outside[s] = self._outside[s] + 1 if not lo <= ratio <= hi else 0
            if self._outside[s] >= DISTRUST:
                self.retired = f"{STAGES[s]} carried {ratio:.2g}x the explored capacity at {n} threads"
                # a fresh capacity controller, as the default starts: from counts that measure every stage
                self.base.reset(self.max_threads)
                return

    def observe(self, obs: Observation) -> List[float]:
        """Let the capacity controller measure and propose; return the network's input."""
        self.obs = obs
        retired = self.retired
        self._check_trust(obs)
        self.proposal = self.base.act(obs) if self.retired is None or retired is not None else self.base.current
        frame = features(obs, self.proposal, clamp_triple(self.prior, self.max_threads), self.prior_tpt,
                         self.prior_rate, self.step)
        self.step += 1
        self.frames = ([frame] * FRAME_STACK if not self.frames else self.frames[1:] + [frame])
        return [x for f in self.frames for x in f]

    def choose(self, choice: Sequence[int]) -> Triple:
        """The counts for the network's ``choice`` after :meth:`observe`."""
        assert self.obs is not None, "observe before choose"
        if self.retired is not None:
            return self.proposal
        current = clamp_triple(self.obs.threads, self.max_threads)
        return clamp_triple(select(choice, self.proposal, current, clamp_triple(self.prior, self.max_threads)),
                            self.max_threads)

    def act(self, obs: Observation) -> Triple:
        x = self.observe(obs)
        if self.actor is None or self.retired is not None:
            return self.proposal
        return self.choose([int(c) for c in self.actor.mode(x)[0]])


# ---------------------------------------------------------------------------------- files
def _sidecar(path: Union[str, os.PathLike]) -> Path:
    return Path(os.fspath(path) + ".json")


def is_tuned_file(path: Union[str, os.PathLike]) -> bool:
    """Whether ``path``'s sidecar says it is a tuned policy (:data:`FORMAT`)."""
    try:
        with open(_sidecar(path), encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


def check_tuned_file(path: Union[str, os.PathLike]) -> Tuple[Path, Dict[str, Any]]:
    """The checks of :func:`automdt.agents.ppo.check_policy_file` that fit this format (regular
    files no other user can write, the zip's sha256, the recorded prior); returns (path, metadata).

    :raises ValueError: one line, ``"<path>: not an AutoMDT policy (<why>)"`` or ``"<path>: refusing ..."``.
    """
    from automdt.agents import ppo

    p = Path(os.fspath(path))
    if not p.is_file():
        raise ppo.not_a_policy_error(p, "no such file" if not p.exists() else "not a regular file")
    ppo._check_not_writable_by_others(p)
    side = _sidecar(p)
    if not side.is_file():
        raise ppo.not_a_policy_error(p, f"metadata {side.name} is not a regular file")
    ppo._check_not_writable_by_others(side)
    try:
        meta = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ppo.not_a_policy_error(p, f"unreadable metadata {side.name}: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ppo.not_a_policy_error(p, f"metadata {side.name} is not format {FORMAT!r}")
    if not zipfile.is_zipfile(p):
        raise ppo.not_a_policy_error(p, "not a zip archive")
    digest = ppo.sha256_file(p)
    if meta.get("sha256") != digest:
        raise ppo.not_a_policy_error(p, f"sha256 {digest[:12]}... does not match its metadata")
    prior = meta.get("prior")
    if (not isinstance(prior, Mapping) or not _triple_ok(prior.get("threads"))
            or not _numbers_ok(prior.get("tpt"), 3) or not _numbers_ok([prior.get("rate")], 1)):
        raise ppo.not_a_policy_error(p, "no valid prior (threads, tpt, rate) in its metadata")
    if "trust" in meta and parse_trust(meta["trust"]) is None:
        raise ppo.not_a_policy_error(p, "its trust (capacity, low, high per stage) is not valid")
    if meta.get("learned") not in LEARNED:
        raise ppo.not_a_policy_error(p, f"learned must be one of {list(LEARNED)}, got {meta.get('learned')!r}")
    return p, meta


def _triple_ok(t: Any) -> bool:
    return isinstance(t, list) and len(t) == 3 and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in t)


def _numbers_ok(t: Any, n: int) -> bool:
    return (isinstance(t, list) and len(t) == n
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0 for x in t))


def parse_trust(t: Any) -> Optional[List[Tuple[List[float], float, float]]]:
    """The sidecar's ``trust`` (``{"capacity": [[c(1), ..., c(m)] per stage], "low": [...], "high":
    [... or null for no upper bound]}``) as :class:`TunedPolicy` takes it; None when malformed."""
    if not isinstance(t, Mapping):
        return None
    caps, low, high = t.get("capacity"), t.get("low"), t.get("high")
    if (not isinstance(caps, list) or len(caps) != 3 or not all(isinstance(c, list) and c and _numbers_ok(c, len(c)) for c in caps)
            or not isinstance(low, list) or not _numbers_ok(low, 3) or not isinstance(high, list) or len(high) != 3
            or not all(h is None or _numbers_ok([h], 1) for h in high)):
        return None
    return [([float(x) for x in c], float(lo), math.inf if hi is None else float(hi)) for c, lo, hi in zip(caps, low, high)]


def _actor_loader(p: Path, meta: Dict[str, Any]) -> Any:
    """A function that loads the network (``numpy.load(allow_pickle=False)``), checked first."""
    from automdt.agents import ppo

    arch, activation = ppo.hidden_sizes(p, meta.get("policy_kwargs"))
    nvec = [len(CHOICES)] * 3
    in_dim = FRAME_DIM * FRAME_STACK
    try:
        with zipfile.ZipFile(p) as zf:
            raw = zf.read(WEIGHTS_ENTRY)
        headers = ppo.npz_headers(raw)
        if any(descr != "<f4" or fortran for descr, fortran, _ in headers.values()):
            raise ValueError("arrays are not float32")
        _, _, hidden = ppo.actor_layout({k: shape for k, (_, _, shape) in headers.items()}, nvec, in_dim)
    except (KeyError, zipfile.BadZipFile, OSError, ValueError) as e:
        raise ppo.not_a_policy_error(p, f"unreadable weights: {e}") from None
    if hidden != arch:
        raise ppo.not_a_policy_error(p, f"weights do not fit the recorded network: hidden layers {hidden}, net_arch {arch}")

    def load() -> Any:
        import numpy as np

        with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
            return ppo.ActorMLP({k: npz[k] for k in npz.files}, activation, nvec, in_dim=in_dim)

    return load


def load_tuned(path: Union[str, os.PathLike], max_threads: int = 32, label: Optional[str] = None) -> TunedPolicy:
    """Load a tuned policy file (see :func:`check_tuned_file`); no torch, no pickle."""
    p, meta = check_tuned_file(path)
    prior = meta["prior"]
    actor = _actor_loader(p, meta) if meta["learned"] == "network" else None
    r, n, w = (int(x) for x in prior["threads"])
    return TunedPolicy((r, n, w), prior["tpt"], float(prior["rate"]), actor,
                       start="default" if meta["learned"] == "none" else "prior", max_threads=max_threads,
                       k=float(meta.get("k", K_DEFAULT)), metadata=meta, label=label or f"tuned:{os.fspath(path)}",
                       trust=parse_trust(meta["trust"]) if "trust" in meta else None)


def write_tuned(path: Union[str, os.PathLike], meta: Mapping[str, Any], arrays: Optional[Mapping[str, Any]]) -> None:
    """Write a tuned policy: the zip (the network's float32 arrays, or none) and its sidecar with
    the zip's sha256, each through a temporary file and a rename, mode 0644."""
    import numpy as np

    from automdt.agents import ppo

    p = Path(os.fspath(path))
    buf = io.BytesIO()
    float_arrays: Dict[str, Any] = {k: np.asarray(v, dtype=np.float32) for k, v in (arrays or {}).items()}
    np.savez(buf, allow_pickle=False, **float_arrays)  # numeric arrays only
    tmp = p.with_name(p.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(WEIGHTS_ENTRY, buf.getvalue())
        zf.writestr("README.txt", "An AutoMDT tuned policy: see its .json sidecar (format automdt-tuned/1).\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, p)
    full = dict(meta, format=FORMAT, sha256=ppo.sha256_file(p))
    side = _sidecar(p)
    tmp_side = side.with_name(side.name + ".tmp")
    tmp_side.write_text(json.dumps(full, indent=2) + "\n")
    os.chmod(tmp_side, 0o644)
    os.replace(tmp_side, side)


def path_note(meta: Mapping[str, Any], src: str, dest: str) -> Optional[str]:
    """A one-line note when a transfer from ``src`` to ``dest`` is not the path the file was
    trained for (the explored source and destination recorded in its metadata), else None."""
    trained = meta.get("trained_on") or {}
    want_src, want_dest = trained.get("src"), trained.get("dest")
    if not want_src or not want_dest:
        return None
    def host(d: str) -> Optional[str]:  # HOST:PORT of a remote DEST, None for a local one
        head = d.split("/", 1)[0]
        return head if ":" in head else None

    if os.path.abspath(src) == os.path.abspath(want_src) and host(dest) == host(want_dest):
        return None
    return (f"this policy was trained for {want_src} -> {want_dest} (explored {trained.get('explored', '?')}); "
            f"this transfer is {src} -> {dest}: the default controller's measurements take over where the path differs")
