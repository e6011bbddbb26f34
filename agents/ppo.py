"""The AutoMDT agent: a PPO policy trained offline in the buffer simulator, behind :class:`Policy`.

A policy is **two files that travel together**: a stable-baselines3 zip (``model.save``, plus
an ``automdt_actor.npz`` entry with the actor's weights as plain arrays) and a metadata sidecar
next to it (``<file>.json``, read by :func:`policy_metadata`, written by :func:`write_policy_metadata`
from :func:`automdt.agents.training.train`). The shipped general
PPO network is ``automdt/data/default_policy.zip`` (the file's name is historical: what
``automdt transfer`` runs by default is the shield over the capacity controller,
:data:`automdt.agents.registry.DEFAULT_POLICY`); ``load_policy("ppo")`` loads it.

Inference is numpy only. This module imports neither torch, stable-baselines3 nor gymnasium:
:class:`PPOPolicy` runs the actor network (a few matrix products, :class:`ActorMLP`) on the
weights exported at training time, behind the same numpy input pipeline the training
environments use (:mod:`automdt.simulator.pipeline`). Loading checks everything (the files, the
metadata against :mod:`automdt.simulator.contract`, the arrays' names, dtypes and shapes from
their ``.npy`` headers) with the standard library; numpy itself is imported when the policy first
acts, so a transfer that ends within its first control interval never pays for it. The torch side (rebuilding the SB3
network, exporting its weights) is :mod:`automdt.agents.ppo_sb3`; ``train``, ``simulate``,
experiments and notebooks use it, ``transfer``/``receive``/``explore``/``verify`` never do.

Loading never unpickles anything. An SB3 zip stores some entries (the spaces, the policy class
and keyword arguments, the schedules) with cloudpickle, and ``PPO.load`` unpickles them, so an
attacker who can write the file can run code as whoever loads it. :meth:`PPOPolicy.load` reads
only the JSON sidecar and the ``.npz`` arrays (``numpy.load(allow_pickle=False)``). It still
refuses a policy file or sidecar that other users can write (group- or world-writable, or owned
by someone else): the same file may be handed to SB3 tools that do unpickle, and a swapped file
would change the transfer's behaviour anyway.
"""
from __future__ import annotations

import ast
import hashlib
import importlib
import io
import json
import os
import stat
import struct
import zipfile
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from automdt.agents.base import Features, OwnStart, PolicyBase, clamp_triple
from automdt.policy_contract import K_DEFAULT
from automdt.simulator.contract import (  # noqa: F401
    ACTION_HEADS,
    FEATURES,
    OBS_DIM,
    feature_dim,
    space_descriptions,
)
from automdt.simulator.types import Observation, Triple

_PIPELINE_NAMES = ("DEBIAS", "NOISE_PRIOR", "NOISE_SCALE", "SPARE_CAP", "FeatureState", "ObservationEncoder",
                   "PolicyInput", "add_features")


def __getattr__(name: str) -> Any:
    """The pipeline's names, re-exported from this module without importing numpy up front."""
    if name in _PIPELINE_NAMES:
        return getattr(importlib.import_module("automdt.simulator.pipeline"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "PPOPolicy",
    "ActorMLP",
    "DEFAULT_POLICY_NAMES",
    "WEIGHTS_ENTRY",
    "default_policy_path",
    "load_policy",
    "policy_metadata",
    "write_policy_metadata",
    "not_a_policy_error",
    "check_policy_file",
    "sha256_file",
    "POLICY_FORMAT",
    "FEATURES",
    "add_features",  # noqa: F822  (served by the module __getattr__ above)
    "FeatureState",  # noqa: F822
]

POLICY_FORMAT = "automdt-ppo/1"
"""Value of ``format`` in the metadata sidecar; bumped when the file layout changes."""

DEFAULT_POLICY_NAMES = ("ppo", "default")
"""Names that :func:`load_policy` resolves to the shipped PPO network (``automdt/data/default_policy.zip``;
the transfer's default controller is another policy, :data:`automdt.agents.registry.DEFAULT_POLICY`)."""

WEIGHTS_ENTRY = "automdt_actor.npz"
"""The zip entry holding the actor's weights for numpy inference (``numpy.savez``: the SB3
state-dict names ``mlp_extractor.policy_net.<i>.weight|bias`` and ``action_net.weight|bias``,
float32). :func:`automdt.agents.ppo_sb3.add_numpy_weights` adds it to an older file."""

ACTIVATIONS = ("Tanh", "ReLU", "ELU", "LeakyReLU")
"""Activation functions a policy file may name (by torch class name; nothing else is accepted)."""



def _np_activation(name: str) -> Callable[[Any], Any]:
    import numpy as np

    activations: Dict[str, Callable[[Any], Any]] = {
        "Tanh": np.tanh,
        "ReLU": lambda x: np.maximum(x, np.float32(0.0)),
        "ELU": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))).astype(np.float32),
        "LeakyReLU": lambda x: np.where(x > 0, x, np.float32(0.01) * x).astype(np.float32),
    }
    return activations[name]

_HIDDEN = "mlp_extractor.policy_net."
_ACTION = "action_net."


def not_a_policy_error(path: Union[str, os.PathLike], why: str) -> ValueError:
    """The one-line error of every loading check: ``<path>: not an AutoMDT policy (<why>)``."""
    return ValueError(f"{os.fspath(path)}: not an AutoMDT policy ({why})")


def sha256_file(path: Union[str, os.PathLike]) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def default_policy_path() -> Path:
    """Path of the shipped PPO network (``automdt/data/default_policy.zip``).

    One ``joinpath`` argument per call: with two, ``importlib.resources`` breaks when a stray
    ``automdt`` directory (e.g. ``/tmp/automdt``, the job locks' fallback home) on ``sys.path``
    turns the package into a namespace package.
    """
    res = resources.files("automdt").joinpath("data").joinpath("default_policy.zip")
    return Path(os.fspath(res))  # type: ignore[call-overload]  # the package is installed as files


def _sidecar(path: Union[str, os.PathLike]) -> Path:
    return Path(os.fspath(path) + ".json")


def policy_metadata(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """Read the metadata sidecar ``<path>.json`` of a policy file (no checks beyond JSON)."""
    meta_path = _sidecar(path)
    try:
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise not_a_policy_error(path, f"no metadata file {meta_path.name} next to it; a policy is two files that "
                                  f"travel together: copy {Path(os.fspath(path)).name} and {meta_path.name}") from None
    except (OSError, ValueError) as e:
        raise not_a_policy_error(path, f"unreadable metadata {meta_path.name}: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != POLICY_FORMAT:
        raise not_a_policy_error(path, f"metadata {meta_path.name} is not format {POLICY_FORMAT!r}")
    return meta


def write_policy_metadata(path: Union[str, os.PathLike], meta: Mapping[str, Any]) -> Path:
    """Write the metadata sidecar ``<path>.json`` of a policy file atomically (a temporary file,
    mode 0644, then a rename): the writer of what :func:`policy_metadata` reads.

    :return: the sidecar's path.
    """
    meta_path = _sidecar(path)
    tmp = meta_path.with_name(meta_path.name + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, meta_path)
    return meta_path


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


def _space_summary(d: Any) -> str:
    """A short form of a space's JSON description for error messages."""
    if not isinstance(d, dict):
        return repr(d)
    if d.get("type") == "Box":
        return f"Box{tuple(d.get('shape', ()))}"
    if d.get("type") == "MultiDiscrete":
        return f"MultiDiscrete{d.get('nvec')}"
    return str(d.get("type"))


def check_policy_file(path: Union[str, os.PathLike]) -> Tuple[Path, Dict[str, Any]]:
    """Every check a policy file passes before anything in it is used; returns (path, metadata).

    The file and its sidecar must be regular files that no other user can write; the zip must
    match the sidecar's sha256; the sidecar's ``frame_stack``, ``features``, spaces and
    ``max_threads`` must fit this simulator. Shared by :meth:`PPOPolicy.load` and
    :func:`automdt.agents.ppo_sb3.load_network`.

    :raises ValueError: one line, ``"<path>: not an AutoMDT policy (<why>)"`` or
        ``"<path>: refusing ..."``.
    """
    p = Path(os.fspath(path))
    if not p.is_file():
        raise not_a_policy_error(p, "no such file" if not p.exists() else "not a regular file")
    _check_not_writable_by_others(p)
    if not zipfile.is_zipfile(p):
        raise not_a_policy_error(p, "not a zip archive")
    side = _sidecar(p)
    if side.exists():
        if not side.is_file():
            raise not_a_policy_error(p, f"metadata {side.name} is not a regular file")
        _check_not_writable_by_others(side)
    meta = policy_metadata(p)
    digest = sha256_file(p)
    if meta.get("sha256") and meta["sha256"] != digest:
        raise not_a_policy_error(p, f"sha256 {digest[:12]}... does not match its metadata {str(meta['sha256'])[:12]}...")
    stack = meta.get("frame_stack", 1)
    if not isinstance(stack, int) or isinstance(stack, bool) or not 1 <= stack <= 64:
        raise not_a_policy_error(p, f"bad frame_stack {stack!r} in its metadata")
    features = meta.get("features", [])
    if not isinstance(features, list) or any(f not in FEATURES for f in features):
        raise not_a_policy_error(p, f"unknown features {features!r} in its metadata (known: {list(FEATURES)})")
    max_threads = meta.get("max_threads", 32)
    if not isinstance(max_threads, int) or isinstance(max_threads, bool) or max_threads < 1:
        raise not_a_policy_error(p, f"bad max_threads {max_threads!r} in its metadata")
    head = meta.get("action_head", "step")  # files without it were written for the first head
    if head not in ACTION_HEADS:
        raise not_a_policy_error(p, f"unknown action_head {head!r} in its metadata (known: {list(ACTION_HEADS)})")
    for key, want in zip(("observation_space", "action_space"), space_descriptions(stack, features, head, max_threads)):
        if meta.get(key) != want:
            got, have = _space_summary(meta.get(key)), _space_summary(want)
            if got == have:
                have += " with other bounds"
            raise not_a_policy_error(p, f"trained for {key} {got}, this simulator has {have}"
                                + ("; retrain it with `automdt train`" if key == "observation_space" else ""))
    return p, meta


def hidden_sizes(path: Union[str, os.PathLike], policy_kwargs: Any) -> Tuple[List[int], str]:
    """The actor's hidden layer sizes and activation name recorded in ``policy_kwargs``."""
    if not isinstance(policy_kwargs, Mapping):
        raise not_a_policy_error(path, "metadata has no policy_kwargs")
    allowed = {"net_arch", "activation_fn", "ortho_init", "log_std_init", "share_features_extractor"}
    unknown = set(policy_kwargs) - allowed
    if unknown:
        raise not_a_policy_error(path, f"unsupported policy_kwargs {sorted(unknown)}")
    act = policy_kwargs.get("activation_fn", "Tanh")
    if act not in ACTIVATIONS:
        raise not_a_policy_error(path, f"unknown activation {act!r}")
    arch = policy_kwargs.get("net_arch", [64, 64])
    if isinstance(arch, Mapping):
        arch = arch.get("pi")
    if not isinstance(arch, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in arch):
        raise not_a_policy_error(path, f"bad net_arch {policy_kwargs.get('net_arch')!r} in its policy_kwargs")
    return list(arch), str(act)


def actor_layout(shapes: Mapping[str, Tuple[int, ...]], nvec: Sequence[int],
                 in_dim: Optional[int] = None) -> Tuple[List[Tuple[str, str]], int, List[int]]:
    """Check that arrays of these shapes form an actor (hidden ``Linear`` layers, then an action
    layer with ``sum(nvec)`` outputs, taking ``in_dim`` inputs); numpy is not needed.

    :return: the (weight, bias) names in order (the action layer last), the input width and the
        hidden layer sizes.
    :raises ValueError: naming what does not fit.
    """
    layers: Dict[int, Dict[str, Tuple[int, ...]]] = {}
    head: Dict[str, Tuple[int, ...]] = {}
    for name, shape in shapes.items():
        if name.startswith(_HIDDEN):
            idx, _, kind = name[len(_HIDDEN):].partition(".")
            if not idx.isdigit() or kind not in ("weight", "bias"):
                raise ValueError(f"unexpected array {name}")
            layers.setdefault(int(idx), {})[kind] = tuple(shape)
        elif name in (_ACTION + "weight", _ACTION + "bias"):
            head[name[len(_ACTION):]] = tuple(shape)
        else:
            raise ValueError(f"unexpected array {name}")
    order: List[Tuple[str, str]] = []
    hidden: List[int] = []
    width = in_dim
    blocks = [(f"hidden layer {i}", f"{_HIDDEN}{i}.", layers[i]) for i in sorted(layers)]
    blocks.append(("action layer", _ACTION, head))
    for what, prefix, layer in blocks:
        w, b = layer.get("weight"), layer.get("bias")
        if w is None or b is None or len(w) != 2 or len(b) != 1 or w[0] != b[0]:
            raise ValueError(f"{what}: weight and bias do not form a linear layer")
        if width is not None and w[1] != width:
            raise ValueError(f"{what}: takes {w[1]} inputs, gets {width}")
        if in_dim is None and not order:
            in_dim = w[1]
        order.append((prefix + "weight", prefix + "bias"))
        hidden.append(w[0])
        width = w[0]
    if hidden[-1] != sum(nvec):
        raise ValueError(f"action layer has {hidden[-1]} outputs, the action space {sum(nvec)}")
    assert in_dim is not None
    return order, int(in_dim), hidden[:-1]


def npz_headers(raw: bytes) -> Dict[str, Tuple[str, bool, Tuple[int, ...]]]:
    """``{array name: (dtype descr, fortran_order, shape)}`` of an ``.npz`` archive, read from the
    ``.npy`` headers (NumPy's documented format: magic, version, a header length, a dict literal)
    with the standard library. Raises ``ValueError`` for anything else."""
    out = {}
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        for name in zf.namelist():
            if not name.endswith(".npy"):
                raise ValueError(f"unexpected member {name}")
            with zf.open(name) as f:
                head = f.read(12)
                if len(head) < 10 or head[:6] != b"\x93NUMPY" or head[6] not in (1, 2, 3):
                    raise ValueError(f"{name} is not a .npy array")
                if head[6] == 1:
                    (hlen,), start = struct.unpack("<H", head[8:10]), 10
                else:
                    (hlen,), start = struct.unpack("<I", head[8:12]), 12
                text = (head[start:] + f.read(hlen - (len(head) - start))).decode("latin1" if head[6] < 3 else "utf8")
            try:
                d = ast.literal_eval(text.strip())
            except (ValueError, SyntaxError):
                raise ValueError(f"{name}: unreadable .npy header") from None
            if (not isinstance(d, dict) or not isinstance(d.get("descr"), str) or not isinstance(d.get("shape"), tuple)
                    or not all(isinstance(n, int) and n >= 0 for n in d["shape"])):
                raise ValueError(f"{name}: unreadable .npy header")
            out[name[:-4]] = (d["descr"], bool(d.get("fortran_order")), d["shape"])
    return out


class ActorMLP:
    """The actor of an SB3 ``ActorCriticPolicy`` in numpy: hidden ``Linear`` + activation layers,
    then the action logits (one block of ``nvec[i]`` logits per sub-action).

    Generic in the network shape and the action head: everything comes from the arrays, the
    activation name and ``nvec`` (the policy's ``MultiDiscrete`` action space).

    :param arrays: SB3 state-dict names (``mlp_extractor.policy_net.<i>.weight|bias``,
        ``action_net.weight|bias``) to float32 arrays; other actor-irrelevant names are refused.
    :param activation: one of :data:`ACTIVATIONS`.
    :param nvec: choices per sub-action.
    :param in_dim: expected input width (checked).
    :raises ValueError: if the arrays do not form that network.
    """

    def __init__(self, arrays: Mapping[str, Any], activation: str, nvec: Sequence[int],
                 in_dim: Optional[int] = None) -> None:
        import numpy as np

        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}")
        self.activation = activation
        self._act = _np_activation(activation)
        self.nvec = [int(n) for n in nvec]
        self._split = np.cumsum(self.nvec)[:-1]
        arrs = {name: np.asarray(a) for name, a in arrays.items()}
        for name, a in arrs.items():
            if a.dtype != np.float32 or not np.all(np.isfinite(a)):
                raise ValueError(f"array {name} is not finite float32")
        order, self.in_dim, self.hidden_sizes = actor_layout({k: a.shape for k, a in arrs.items()}, self.nvec, in_dim)
        # stored (in, out): x @ W + b
        self.layers = [(np.ascontiguousarray(arrs[w].T), arrs[b]) for w, b in order[:-1]]
        w, b = order[-1]
        self.head = (np.ascontiguousarray(arrs[w].T), arrs[b])

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any], activation: str, nvec: Sequence[int]) -> "ActorMLP":
        """From a torch state dict (tensors are converted with ``.detach().cpu().numpy()``; the
        value network's entries are ignored)."""
        import numpy as np

        arrays = {}
        for k, v in state.items():
            if k.startswith(_HIDDEN) or k.startswith(_ACTION):
                arrays[k] = np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v, dtype=np.float32)
        return cls(arrays, activation, nvec)

    def logits(self, x: Any) -> Any:
        """Action logits, shape ``(N, sum(nvec))``, for inputs ``(N, in_dim)`` (or one row)."""
        import numpy as np

        h = np.asarray(x, dtype=np.float32).reshape(-1, self.in_dim)
        for w, b in self.layers:
            h = self._act(h @ w + b)
        w, b = self.head
        return h @ w + b

    def mode(self, x: Any) -> Any:
        """The most likely action, shape ``(N, len(nvec))`` int64."""
        import numpy as np

        parts = np.split(self.logits(x), self._split, axis=1)
        return np.stack([p.argmax(axis=1) for p in parts], axis=1).astype(np.int64)

    def sample(self, x: Any, rng: Any) -> Any:
        """An action drawn from the per-sub-action categorical distributions, ``(N, len(nvec))``."""
        import numpy as np

        out = []
        for p in np.split(self.logits(x).astype(np.float64), self._split, axis=1):
            e = np.exp(p - p.max(axis=1, keepdims=True))
            cdf = np.cumsum(e / e.sum(axis=1, keepdims=True), axis=1)
            u = rng.random((p.shape[0], 1))
            out.append(np.minimum((cdf < u).sum(axis=1), p.shape[1] - 1))
        return np.stack(out, axis=1).astype(np.int64)


def _read_actor(p: Path, meta: Dict[str, Any]) -> Callable[[], ActorMLP]:
    """Check the zip's numpy weights (names, dtypes, shapes against the metadata) without numpy;
    return a function that loads them (``numpy.load(allow_pickle=False)``) when first needed."""
    arch, activation = hidden_sizes(p, meta.get("policy_kwargs"))
    nvec = meta["action_space"]["nvec"]
    try:
        with zipfile.ZipFile(p) as zf:
            if WEIGHTS_ENTRY not in zf.namelist():
                raise not_a_policy_error(p, f"zip has no {WEIGHTS_ENTRY} (the numpy weights; a file from an older "
                                       f"automdt?): add them with `python -m automdt.agents.ppo_sb3 {p}`")
            raw = zf.read(WEIGHTS_ENTRY)
        headers = npz_headers(raw)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error) as e:
        if isinstance(e, ValueError) and str(e).startswith(str(p)):
            raise
        raise not_a_policy_error(p, f"unreadable weights: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    in_dim = meta["observation_space"]["shape"][0]
    try:
        bad = [k for k, (descr, fortran, _) in headers.items() if descr != "<f4" or fortran]
        if bad:
            raise ValueError(f"array {bad[0]} is not float32")
        _, _, hidden = actor_layout({k: shape for k, (_, _, shape) in headers.items()}, nvec, in_dim)
    except ValueError as e:
        raise not_a_policy_error(p, f"weights do not fit the recorded network: {e}") from None
    if hidden != arch:
        raise not_a_policy_error(p, f"weights do not fit the recorded network: hidden layers {hidden}, net_arch {arch}")

    def load() -> ActorMLP:
        import numpy as np

        try:
            with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
                return ActorMLP({k: npz[k] for k in npz.files}, activation, nvec, in_dim=in_dim)
        except ValueError as e:
            raise not_a_policy_error(p, f"weights do not fit the recorded network: {e}") from None

    return load


def _start_from_metadata(meta: Dict[str, Any]) -> Tuple[Triple, str]:
    """The start a policy file asks for: ``(threads, source)``.

    ``source`` is ``"profile"`` for a policy trained on one profile (the profile's oracle
    triple: stored precomputed in ``start``, or computed here from ``profile`` for older files),
    ``"cold"`` for a general policy whose start was chosen in the simulator
    (:mod:`automdt.agents.cold_start`), ``"policy"`` for an older file's ``start_threads``.
    """
    start = meta.get("start")
    if isinstance(start, Mapping) and isinstance(start.get("threads"), list) and len(start["threads"]) == 3:
        return tuple(int(x) for x in start["threads"]), str(start.get("source", "policy"))  # type: ignore[return-value]
    if isinstance(meta.get("profile"), Mapping):
        from automdt.simulator.oracle import oracle
        from automdt.simulator.profile import Profile, ProfileError

        try:
            prof = Profile.from_dict(meta["profile"], source="policy metadata")
            return oracle(prof, float(meta.get("k", K_DEFAULT))).threads, "profile"
        except (ProfileError, TypeError, ValueError):
            pass
    return tuple(int(x) for x in meta.get("start_threads", (1, 1, 1))), "policy"  # type: ignore[return-value]


class PPOPolicy(PolicyBase):
    """A trained PPO actor acting through the simulator's observation pipeline and action map.

    Every interval, :meth:`act` runs the :class:`Observation` through an
    :class:`~automdt.simulator.pipeline.ObservationEncoder` and a
    :class:`~automdt.simulator.pipeline.PolicyInput` (the derived features and frame stack the
    training environment used), asks the actor for the most likely action and maps it to thread
    counts with :func:`~automdt.simulator.dynamics.actions_to_threads` relative to the threads
    that were active.

    Thread counts are encoded against the thread bound the policy was *trained* with (metadata
    ``max_threads``), so a count means to the network what it meant in training; the bound
    given to :meth:`reset` (e.g. the receiver's ``--max-threads``) only clamps the output.

    :param actor: an :class:`ActorMLP`, a function returning one (loaded on first use), or an SB3
        ``ActorCriticPolicy`` (its actor weights are copied into numpy now; it stays available as
        :attr:`network`).
    :param deterministic: take the mode of the action distribution (the default) instead of
        sampling from it.
    :param start_threads: thread counts :meth:`reset` returns (clamped); default: what the
        metadata asks for (:attr:`start_source` says where it came from).
    :param metadata: the policy file's metadata (``max_threads``, ``frame_stack``, ``features``,
        ``policy_kwargs``, ``action_space``, ``start``...).
    :param path: the policy file, if any.
    :param label: the name reported in logs (``ppo:default``, ``ppo:PATH``); default ``ppo``.

    The policy is the network alone; ``shield:ppo`` (:class:`automdt.agents.shield.Shield`) puts the
    shield around it.
    """

    def __init__(
        self,
        actor: Any,
        *,
        deterministic: bool = True,
        start_threads: Optional[Triple] = None,
        metadata: Optional[Dict[str, Any]] = None,
        path: Optional[Path] = None,
        label: Optional[str] = None,
    ) -> None:
        self.metadata = dict(metadata or {})
        self._network = None
        self._actor: Optional[ActorMLP] = None
        self._load_actor: Optional[Callable[[], ActorMLP]] = None
        if isinstance(actor, ActorMLP):
            self._actor = actor
        elif hasattr(actor, "state_dict"):  # an SB3 network
            self._network = actor
            act = self.metadata.get("policy_kwargs", {}).get("activation_fn")
            if act is None:
                act = type(getattr(actor, "activation_fn", None) or object).__name__
            nvec = [int(n) for n in list(getattr(actor.action_space, "nvec", []))]
            self._actor = ActorMLP.from_state_dict(actor.state_dict(), act, nvec)
        else:
            self._load_actor = actor
        self.deterministic = deterministic
        self.path = path
        self.name = label or "ppo"
        if start_threads is None:
            start_threads, self.start_source = _start_from_metadata(self.metadata)
        else:
            self.start_source = "given"
        self.start_threads: Triple = tuple(int(x) for x in start_threads)  # type: ignore[assignment]
        self.train_max_threads = int(self.metadata.get("max_threads", 32))
        self.max_threads = self.train_max_threads
        self.frame_stack = int(self.metadata.get("frame_stack", 1))
        self.input_features = tuple(self.metadata.get("features", ()))
        """The input features the network was trained with (the sidecar's ``features``)."""
        self.action_head = str(self.metadata.get("action_head", "step"))  # files without it: the first head
        self.input_dim = (OBS_DIM + feature_dim(self.input_features)) * self.frame_stack
        if self._actor is not None and self._actor.in_dim != self.input_dim:
            raise ValueError(f"the actor takes {self._actor.in_dim} inputs, the pipeline gives {self.input_dim}")
        self._encoder: Any = None  # the pipeline's objects: made on the first act (numpy)
        self._input: Any = None
        self._rng: Any = None
        self._seed: Optional[int] = None
        self._last_encoding: Any = None

    @property
    def actor(self) -> ActorMLP:
        """The numpy actor (loaded from the policy file on first use)."""
        if self._actor is None:
            assert self._load_actor is not None
            self._actor = self._load_actor()
        return self._actor

    @classmethod
    def load(cls, path: Union[str, os.PathLike], *, deterministic: bool = True,
             label: Optional[str] = None) -> "PPOPolicy":
        """Load a policy file written by :func:`automdt.agents.training.train`.

        Nothing in the zip is unpickled (see the module docstring) and torch is not needed; the
        weights must fit the network described by the metadata and the current simulator's spaces.

        :param label: the policy's name in logs; default ``ppo:<path>``.
        :raises ValueError: one line, ``"<path>: not an AutoMDT policy (<why>)"``, if the file is
            missing, not a zip, lacks its metadata, does not match its recorded sha256, was
            trained for other observation/action spaces, or holds weights of another shape; or
            ``"<path>: refusing ..."`` if other users can write it or its sidecar.
        """
        p, meta = check_policy_file(path)
        actor = _read_actor(p, meta)
        return cls(actor, deterministic=deterministic, metadata=meta, path=p, label=label or f"ppo:{os.fspath(path)}")

    @property
    def network(self) -> Any:
        """The SB3 ``ActorCriticPolicy`` (torch), rebuilt pickle-free from :attr:`path` on first use
        (for notebooks and tests; inference never needs it)."""
        if self._network is None:
            if self.path is None:
                raise AttributeError("this PPOPolicy has no SB3 network and no file to rebuild it from")
            from automdt.agents.ppo_sb3 import load_network

            self._network = load_network(self.path)
        return self._network

    # -- Policy protocol ------------------------------------------------------------------------

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        """Start a new transfer with thread counts in ``[1, max_threads]``.

        :param seed: seeds the action sampling when ``deterministic`` is False (a private numpy
            generator; no global random state is touched).
        """
        if int(max_threads) < 1:
            raise ValueError(f"max_threads must be >= 1, got {max_threads}")
        self.max_threads = int(max_threads)
        self._encoder = self._input = None  # a fresh pipeline on the first act
        self._seed = seed
        self._rng = None  # made on first use: numpy.random is not imported for deterministic policies
        return clamp_triple(self.start_threads, self.max_threads)

    def features(self) -> Features:
        """It takes a start: a job's history, else :attr:`start_threads` (:attr:`start_source` says
        where those came from)."""
        return Features(start=OwnStart(self.start_threads, self.start_source))

    def network_input(self, obs: Observation) -> Any:
        """Feed one interval through the input pipeline; returns the network input (1, dim)."""
        if self._input is None:
            from automdt.simulator.pipeline import ObservationEncoder, PolicyInput

            self._encoder = ObservationEncoder(self.train_max_threads)
            self._input = PolicyInput(1, self.train_max_threads, self.input_features, self.frame_stack)
        self._last_encoding = self._encoder.encode(obs)
        x, _ = self._input.step(self._last_encoding)
        return x

    def act(self, obs: Observation) -> Triple:
        """Return the thread counts for the next interval."""
        import numpy as np

        from automdt.simulator.dynamics import actions_to_threads, need_from_encoding

        x = self.network_input(obs)
        if self.deterministic:
            action = self.actor.mode(x)
        else:
            if self._rng is None:
                self._rng = np.random.default_rng(self._seed)
            action = self.actor.sample(x, self._rng)
        need = need_from_encoding(self._last_encoding, self.train_max_threads)
        new = actions_to_threads(action.reshape(1, -1), np.asarray(obs.threads, dtype=np.int64).reshape(1, 3),
                                 self.max_threads, self.action_head, self.train_max_threads, need)[0]
        return clamp_triple(new, self.max_threads)

    def _mode(self, x: Any) -> Any:
        """The most likely action for one network input (as SB3 ``predict(deterministic=True)``)."""
        return self.actor.mode(x)[0]

    def __repr__(self) -> str:
        where = f" {self.path}" if self.path else ""
        return f"<PPOPolicy{where} deterministic={self.deterministic}>"


def load_policy(path_or_name: Union[str, os.PathLike], *, deterministic: bool = True) -> PPOPolicy:
    """Load a PPO policy by file path, or ``"ppo"``/``"default"`` for the shipped PPO network
    (named ``ppo:default`` in logs)."""
    if isinstance(path_or_name, str) and path_or_name.lower() in DEFAULT_POLICY_NAMES:
        return PPOPolicy.load(default_policy_path(), deterministic=deterministic, label="ppo:default")
    return PPOPolicy.load(path_or_name, deterministic=deterministic)
