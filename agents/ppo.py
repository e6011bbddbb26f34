"""The AutoMDT agent: a PPO policy trained offline in the buffer simulator, behind :class:`Policy`.

A policy file is a stable-baselines3 zip (``model.save``) plus a metadata sidecar next to it
(``<file>.json``, written by :func:`automdt.agents.training.train`). The shipped default policy is
``automdt/data/default_policy.zip``; ``load_policy("ppo")`` (or ``"default"``) loads it.

Loading never unpickles anything. An SB3 zip stores some entries (the spaces, the policy class
and keyword arguments, the schedules) with cloudpickle, and ``PPO.load`` unpickles them, so an
attacker who can write the file can run code as whoever loads it. :meth:`PPOPolicy.load` instead
rebuilds the network from the JSON sidecar and the simulator's own spaces and reads only the
weights (``policy.pth``, through ``torch.load(weights_only=True)``). It still refuses a file
that other users can write (group- or world-writable, or owned by someone else): the same file
may be handed to SB3 tools that do unpickle, and a swapped file would change the transfer's
behaviour anyway.

torch and stable-baselines3 are imported at the top of this module and only inside
:func:`automdt.agents.training.train` elsewhere; the CLI imports this module lazily, so
transfers with a non-PPO policy never pay for torch.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import stat
import zipfile
from importlib import resources
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Union

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import ActorCriticPolicy

from automdt.agents.base import clamp_triple
from automdt.simulator.env import (
    ACTION_HEADS,
    OBS_NAMES,
    ObservationEncoder,
    action_to_threads,
    make_action_space,
    make_observation_space,
)
from automdt.simulator.types import Observation, Triple

__all__ = [
    "PPOPolicy",
    "DEFAULT_POLICY_NAMES",
    "default_policy_path",
    "load_policy",
    "policy_metadata",
    "sha256_file",
    "POLICY_FORMAT",
    "FEATURES",
    "add_features",
    "FeatureState",
]

_THREADS = [OBS_NAMES.index(f"{st}/threads") for st in ("read", "net", "write")]
_EFFICIENCY = [OBS_NAMES.index(f"{st}/thread_efficiency") for st in ("read", "net", "write")]

POLICY_FORMAT = "automdt-ppo/1"
"""Value of ``format`` in the metadata sidecar; bumped when the file layout changes."""

DEFAULT_POLICY_NAMES = ("ppo", "default")
"""Names that :func:`load_policy` resolves to the shipped default policy."""

_ACTIVATIONS = {"Tanh": th.nn.Tanh, "ReLU": th.nn.ReLU, "ELU": th.nn.ELU, "LeakyReLU": th.nn.LeakyReLU}
"""Activation functions a policy file may name (by class name; nothing else is accepted)."""


FEATURES = ("spare_threads", "noise_level", "debiased_spare", "need", "spare", "drain")
"""Derived inputs a policy may add to the simulator's encoding (metadata ``features``).

``spare_threads`` (3 inputs): per stage, the threads it could shed at its best per-thread rate so
far, ``n_i * (1 - efficiency_i)``, clipped to [0, :data:`SPARE_CAP`] and divided by it. It is a
pure function of the encoding (thread counts and thread efficiencies), spelled out because a small
network finds the product hard to learn precisely, and precision is what settles a stage on
exactly the threads it needs.

``noise_level`` (1 input): how noisy this transfer's throughputs are: the running mean, since the
start of the transfer, of ``|log(t_i / t_i,prev)|`` (median over the three stages) over the
intervals in which no thread count changed, divided by :data:`NOISE_SCALE` and clipped to [0, 1].

``debiased_spare`` (3 inputs): ``spare_threads`` with the efficiency corrected for the noise. The
efficiency reference is a running *maximum* of noisy per-thread rates, so it reads high by about
the noise amplitude, and a stage at exactly the threads it needs shows ``n * (1 - efficiency)``
of about ``n * noise * sqrt(3) * 0.6``: one spare thread is real on a quiet path and noise on a
noisy one. This input uses ``min(1, efficiency * (1 + DEBIAS * level))``, where ``level`` is the
unscaled ``noise_level`` (about ``1.15 * noise``), so it reads about 0 at the needed count
whatever the noise.

``need`` (3 inputs): per stage, the threads the current flow needs at the stage's reference
per-thread rate, ``n_i * utilization_i * efficiency_i`` (efficiency debiased as above), divided by
the thread bound: the count the ``absolute`` action head sets a stage to that only has to carry
what flows now. ``spare`` (3 inputs): ``n_i`` minus that, clipped to [0, :data:`SPARE_CAP`] and
divided by it: threads waiting on a buffer and threads a stage's bandwidth makes useless, both.

``drain`` (2 inputs): per buffer, the share of its content lost in the last interval,
``max(0, -change of fill) / fill`` clipped to [0, 1]: near 1 the buffer empties within an
interval or two. A full sender buffer says an upstream stage *was* ahead; a high ``drain`` says it
no longer is.

``noise_level``, ``debiased_spare``, ``need`` and ``spare`` carry state across intervals
(:class:`FeatureState`) but are computed from the encodings alone (an interval's current and
previous throughputs share one reference), so the training environments and the live controller
see the same values.
"""

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

_FEATURE_DIMS = {"spare_threads": 3, "noise_level": 1, "debiased_spare": 3, "need": 3, "spare": 3, "drain": 2}
_STATEFUL = ("noise_level", "debiased_spare", "need", "spare")
_UTIL = [OBS_NAMES.index(f"{st}/utilization") for st in ("read", "net", "write")]
_FILL = [OBS_NAMES.index(f"buffer/{b}_fill") for b in ("sender", "receiver")]
_TREND = [OBS_NAMES.index(f"buffer/{b}_trend") for b in ("sender", "receiver")]
_TPUT = [OBS_NAMES.index(f"{st}/throughput") for st in ("read", "net", "write")]
_PREV_THREADS = [OBS_NAMES.index(f"prev/{st}/threads") for st in ("read", "net", "write")]
_PREV_TPUT = [OBS_NAMES.index(f"prev/{st}/throughput") for st in ("read", "net", "write")]


def feature_dim(features: Sequence[str]) -> int:
    """Number of inputs the derived ``features`` add to one encoding."""
    return sum(_FEATURE_DIMS[f] for f in features)


def _spare(n: np.ndarray, eff: np.ndarray) -> np.ndarray:
    return (np.clip(n * (1.0 - eff), 0.0, SPARE_CAP) / SPARE_CAP).astype(np.float32)


def add_features(enc: np.ndarray, features: Sequence[str], max_threads: int,
                 state: Optional["FeatureState"] = None) -> np.ndarray:
    """Append the derived ``features`` (:data:`FEATURES`) to encoded observations ``(N, OBS_DIM)``
    (or one ``(OBS_DIM,)``).

    Used identically by the training environments and by :class:`PPOPolicy`. Stateful features
    need ``state``, which this call updates with ``enc`` (one row per transfer, in order).
    """
    if not features:
        return enc
    unknown = [f for f in features if f not in _FEATURE_DIMS]
    if unknown:
        raise ValueError(f"unknown policy feature {unknown[0]!r}; known: {FEATURES}")
    level = None
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
            fill = enc[..., _FILL]
            change = 2.0 * (enc[..., _TREND] - 0.5)
            parts.append(np.clip(np.maximum(-change, 0.0) / np.maximum(fill - change, 0.01), 0.0, 1.0)
                         .astype(np.float32))
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


def _not_a_policy(path: Union[str, os.PathLike], why: str) -> ValueError:
    return ValueError(f"{os.fspath(path)}: not an AutoMDT policy ({why})")


def sha256_file(path: Union[str, os.PathLike]) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def default_policy_path() -> Path:
    """Path of the shipped default policy (``automdt/data/default_policy.zip``)."""
    res = resources.files("automdt").joinpath("data", "default_policy.zip")
    return Path(os.fspath(res))  # type: ignore[arg-type]  # the package is installed as files


def policy_metadata(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """Read the metadata sidecar ``<path>.json`` of a policy file (no checks beyond JSON)."""
    meta_path = Path(os.fspath(path) + ".json")
    try:
        with open(meta_path, "r", encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise _not_a_policy(path, f"no metadata file {meta_path.name} next to it") from None
    except (OSError, ValueError) as e:
        raise _not_a_policy(path, f"unreadable metadata {meta_path.name}: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != POLICY_FORMAT:
        raise _not_a_policy(path, f"metadata {meta_path.name} is not format {POLICY_FORMAT!r}")
    return meta


def _check_not_writable_by_others(path: Path) -> None:
    st = path.stat()
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ValueError(
            f"{path}: refusing to load a policy file writable by other users "
            f"(mode {stat.S_IMODE(st.st_mode):o}); fix with `chmod go-w {path}`"
        )
    if st.st_uid not in (os.getuid(), 0):
        raise ValueError(
            f"{path}: refusing to load a policy file owned by another user (uid {st.st_uid}); "
            "copy it to a file you own"
        )


def _space_to_json(space: spaces.Space) -> Dict[str, Any]:
    """Describe a space in plain JSON (what the metadata sidecar records)."""
    if isinstance(space, spaces.Box):
        return {
            "type": "Box",
            "shape": list(space.shape),
            "dtype": str(space.dtype),
            "low": np.asarray(space.low).ravel().tolist(),
            "high": np.asarray(space.high).ravel().tolist(),
        }
    if isinstance(space, spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": np.asarray(space.nvec).ravel().tolist(),
                "start": np.asarray(getattr(space, "start", np.zeros_like(space.nvec))).ravel().tolist()}
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    raise TypeError(f"unsupported space {space!r}")


def _space_summary(d: Any) -> str:
    """A short form of :func:`_space_to_json`'s output for error messages."""
    if not isinstance(d, dict):
        return repr(d)
    if d.get("type") == "Box":
        return f"Box{tuple(d.get('shape', ()))}"
    if d.get("type") == "MultiDiscrete":
        return f"MultiDiscrete{d.get('nvec')}"
    return str(d.get("type"))


def _policy_kwargs_from_json(path: Path, raw: Any) -> Dict[str, Any]:
    if not isinstance(raw, dict):
        raise _not_a_policy(path, "metadata has no policy_kwargs")
    kwargs = dict(raw)
    name = kwargs.get("activation_fn", "Tanh")
    if name not in _ACTIVATIONS:
        raise _not_a_policy(path, f"unknown activation {name!r}")
    kwargs["activation_fn"] = _ACTIVATIONS[name]
    allowed = {"net_arch", "activation_fn", "ortho_init", "log_std_init", "share_features_extractor"}
    unknown = set(kwargs) - allowed
    if unknown:
        raise _not_a_policy(path, f"unsupported policy_kwargs {sorted(unknown)}")
    return kwargs


class PPOPolicy:
    """A trained PPO network acting through the simulator's observation encoding and action map.

    Every interval, :meth:`act` encodes the :class:`Observation` with an
    :class:`~automdt.simulator.env.ObservationEncoder` (the same one the training env used), asks
    the network for an action and maps it to thread counts with
    :func:`~automdt.simulator.env.action_to_threads` relative to the threads that were active.

    Thread counts are encoded against the thread bound the policy was *trained* with (metadata
    ``max_threads``), so a count means to the network what it meant in training; the bound
    given to :meth:`reset` (e.g. the receiver's ``--max-threads``) only clamps the output.

    :param network: the SB3 actor-critic network (``model.policy``).
    :param deterministic: take the mode of the action distribution (the default) instead of
        sampling from it.
    :param start_threads: thread counts :meth:`reset` returns (clamped to ``max_threads``).
    :param metadata: the policy file's metadata, if it came from a file.
    :param path: the policy file, if any.
    """

    name = "ppo"

    def __init__(
        self,
        network: ActorCriticPolicy,
        *,
        deterministic: bool = True,
        start_threads: Triple = (1, 1, 1),
        metadata: Optional[Dict[str, Any]] = None,
        path: Optional[Path] = None,
    ) -> None:
        self.network = network
        self.deterministic = deterministic
        self.start_threads = tuple(int(x) for x in start_threads)
        self.metadata = dict(metadata or {})
        self.path = path
        self.train_max_threads = int(self.metadata.get("max_threads", 32))
        self.max_threads = self.train_max_threads
        self._encoder = ObservationEncoder(self.train_max_threads)
        self.frame_stack = int(self.metadata.get("frame_stack", 1))
        self.features = tuple(self.metadata.get("features", ()))
        self.action_head = str(self.metadata.get("action_head", "step"))  # files without it: the first head
        width = self._encoder.observation_space.shape[0] + feature_dim(self.features)
        self._features = FeatureState(1)
        self._stack = np.zeros(self.frame_stack * width, dtype=np.float32)
        self._gen_state: Optional[th.Tensor] = None
        space = network.action_space
        if not isinstance(space, spaces.MultiDiscrete):
            raise TypeError(f"PPOPolicy needs a MultiDiscrete action space, got {space}")
        self._nvec = [int(n) for n in np.asarray(space.nvec).ravel()]

    @classmethod
    def load(cls, path: Union[str, os.PathLike], *, deterministic: bool = True) -> "PPOPolicy":
        """Load a policy file written by :func:`automdt.agents.training.train`.

        Nothing in the zip is unpickled (see the module docstring); the weights must fit the
        network described by the metadata and the current simulator's spaces.

        :raises ValueError: one line, ``"<path>: not an AutoMDT policy (<why>)"``, if the file is
            missing, not a zip, lacks its metadata, does not match its recorded sha256, was
            trained for other observation/action spaces, or holds weights of another shape; or
            ``"<path>: refusing ..."`` if other users can write it.
        """
        p = Path(os.fspath(path))
        if not p.is_file():
            raise _not_a_policy(p, "no such file" if not p.exists() else "not a regular file")
        _check_not_writable_by_others(p)
        if not zipfile.is_zipfile(p):
            raise _not_a_policy(p, "not a zip archive")
        meta = policy_metadata(p)
        digest = sha256_file(p)
        if meta.get("sha256") and meta["sha256"] != digest:
            raise _not_a_policy(p, f"sha256 {digest[:12]}... does not match its metadata {str(meta['sha256'])[:12]}...")

        stack = meta.get("frame_stack", 1)
        if not isinstance(stack, int) or not 1 <= stack <= 64:
            raise _not_a_policy(p, f"bad frame_stack {stack!r} in its metadata")
        features = meta.get("features", [])
        if not isinstance(features, list) or any(f not in FEATURES for f in features):
            raise _not_a_policy(p, f"unknown features {features!r} in its metadata (known: {list(FEATURES)})")
        head = meta.get("action_head", "step")
        if head not in ACTION_HEADS:
            raise _not_a_policy(p, f"unknown action_head {head!r} in its metadata (known: {list(ACTION_HEADS)})")
        max_threads = meta.get("max_threads", 32)
        if not isinstance(max_threads, int) or max_threads < 1:
            raise _not_a_policy(p, f"bad max_threads {max_threads!r} in its metadata")
        obs_space, act_space = _simulator_spaces(stack, features, head, max_threads)
        for key, space in (("observation_space", obs_space), ("action_space", act_space)):
            want = _space_to_json(space)
            if meta.get(key) != want:
                got = _space_summary(meta.get(key))
                have = _space_summary(want)
                if got == have:
                    have += " with other bounds"
                raise _not_a_policy(p, f"trained for {key} {got}, this simulator has {have}"
                                    + ("; retrain it (`automdt train`)" if key == "observation_space" else ""))
        kwargs = _policy_kwargs_from_json(p, meta.get("policy_kwargs"))

        try:
            with zipfile.ZipFile(p) as zf:
                names = set(zf.namelist())
                if "data" not in names or "policy.pth" not in names:
                    raise _not_a_policy(p, "zip has no SB3 'data' and 'policy.pth' entries")
                with zf.open("policy.pth") as f:
                    state = th.load(f, map_location="cpu", weights_only=True)
        except (zipfile.BadZipFile, pickle.UnpicklingError, RuntimeError, OSError, EOFError) as e:
            raise _not_a_policy(p, f"unreadable weights: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None

        try:
            network = ActorCriticPolicy(obs_space, act_space, lambda _: 0.0, **kwargs)
        except (TypeError, ValueError, AssertionError) as e:
            raise _not_a_policy(p, f"bad policy_kwargs in its metadata: {e}") from None
        try:
            network.load_state_dict(state, strict=True)
        except (RuntimeError, TypeError, AttributeError) as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise _not_a_policy(p, f"weights do not fit the recorded network: {first}") from None
        network.set_training_mode(False)
        start = tuple(meta.get("start_threads", (1, 1, 1)))
        return cls(network, deterministic=deterministic, start_threads=start, metadata=meta, path=p)  # type: ignore[arg-type]

    # -- Policy protocol ------------------------------------------------------------------------

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        """Start a new transfer with thread counts in ``[1, max_threads]``.

        :param seed: seeds the action sampling when ``deterministic`` is False (the sampling
            uses a private torch generator state, never the global one).
        """
        if int(max_threads) < 1:
            raise ValueError(f"max_threads must be >= 1, got {max_threads}")
        self.max_threads = int(max_threads)
        self._encoder.reset()
        self._features.reset()
        self._stack[:] = 0.0
        if seed is not None:
            with th.random.fork_rng(devices=[]):
                th.manual_seed(int(seed))
                self._gen_state = th.random.get_rng_state()
        else:
            self._gen_state = None
        return clamp_triple(self.start_threads, self.max_threads)

    def act(self, obs: Observation) -> Triple:
        """Return the thread counts for the next interval."""
        enc = add_features(self._encoder.encode(obs), self.features, self.train_max_threads, self._features)
        if self.frame_stack > 1:  # exactly as SB3 VecFrameStack: shift left, newest last
            self._stack = np.roll(self._stack, -enc.shape[0])
            self._stack[-enc.shape[0]:] = enc
            x = self._stack
        else:
            x = enc
        if self.deterministic:
            action = self._mode(x)
        else:
            with th.random.fork_rng(devices=[]):
                if self._gen_state is not None:
                    th.random.set_rng_state(self._gen_state)
                action, _ = self.network.predict(x, deterministic=False)
                self._gen_state = th.random.get_rng_state()
        threads = action_to_threads(action, tuple(obs.threads), self.max_threads, self.action_head,
                                    self.train_max_threads)
        return clamp_triple(threads, self.max_threads)

    def _mode(self, x: np.ndarray) -> np.ndarray:
        """The most likely action, as ``network.predict(x, deterministic=True)`` but ~10x cheaper.

        SB3's ``predict`` builds a distribution object (one ``Categorical`` per stage, with
        argument validation) for every call; the mode only needs the actor's logits.
        """
        net = self.network
        with th.inference_mode():
            obs = th.as_tensor(x, dtype=th.float32).reshape(1, -1)
            logits = net.action_net(net.mlp_extractor.forward_actor(net.pi_features_extractor(obs)))[0]
            parts = th.split(logits, self._nvec)
            return np.array([int(th.argmax(part)) for part in parts], dtype=np.int64)

    def __repr__(self) -> str:
        where = f" {self.path}" if self.path else ""
        return f"<PPOPolicy{where} deterministic={self.deterministic}>"


def _simulator_spaces(frame_stack: int = 1, features: Sequence[str] = (), action_head: str = "absolute",
                      max_threads: int = 32) -> "tuple[spaces.Space, spaces.Space]":
    """Observation and action spaces of the network (they do not depend on the profile).

    One frame is the simulator's encoding followed by the derived ``features``; with
    ``frame_stack`` > 1 the observation is that many frames side by side, oldest first (SB3
    ``VecFrameStack`` on a 1-D ``Box``).
    """
    obs = make_observation_space()
    extra = feature_dim(features)
    if extra:
        obs = spaces.Box(low=np.concatenate([obs.low, np.zeros(extra, np.float32)]),
                         high=np.concatenate([obs.high, np.ones(extra, np.float32)]), dtype=obs.dtype)
    if frame_stack > 1:
        obs = spaces.Box(low=np.tile(obs.low, frame_stack), high=np.tile(obs.high, frame_stack), dtype=obs.dtype)
    return obs, make_action_space(action_head, max_threads)


def load_policy(path_or_name: Union[str, os.PathLike], *, deterministic: bool = True) -> PPOPolicy:
    """Load a PPO policy by file path, or ``"ppo"``/``"default"`` for the shipped default policy."""
    if isinstance(path_or_name, str) and path_or_name.lower() in DEFAULT_POLICY_NAMES:
        return PPOPolicy.load(default_policy_path(), deterministic=deterministic)
    return PPOPolicy.load(path_or_name, deterministic=deterministic)
