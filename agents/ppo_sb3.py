"""The torch side of a policy file: the SB3 network, rebuilt pickle-free, and its numpy export.

Training (:mod:`automdt.agents.training`), fine-tuning (``init_from``), notebooks and the
numpy/torch equivalence test use this module; the live controller never does (it runs
:class:`automdt.agents.ppo.PPOPolicy` on the exported arrays).

* :func:`load_network` rebuilds the stable-baselines3 ``ActorCriticPolicy`` from the JSON
  sidecar and the simulator's own spaces and reads only the weights (``policy.pth``, through
  ``torch.load(weights_only=True)``), after every check of
  :func:`automdt.agents.ppo.check_policy_file`.
* :func:`write_numpy_weights` adds the actor's weights to a policy zip as
  :data:`automdt.agents.ppo.WEIGHTS_ENTRY` (what numpy inference reads); ``train`` calls it.
* ``python -m automdt.agents.ppo_sb3 POLICY.zip [...]`` adds them to a policy file written by an
  older automdt (rewrites the zip atomically and updates the sidecar's sha256).
"""
from __future__ import annotations

import argparse
import io
import os
import pickle
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import ActorCriticPolicy

from automdt.agents import ppo as ppo_mod
from automdt.simulator.env import make_action_space
from automdt.simulator.sb3 import policy_observation_space

__all__ = ["load_network", "actor_arrays", "write_numpy_weights", "add_numpy_weights", "simulator_spaces",
           "space_to_json"]

_ACTIVATIONS = {"Tanh": th.nn.Tanh, "ReLU": th.nn.ReLU, "ELU": th.nn.ELU, "LeakyReLU": th.nn.LeakyReLU}
assert set(_ACTIVATIONS) == set(ppo_mod.ACTIVATIONS)


def space_to_json(space: spaces.Space) -> Dict[str, Any]:
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


def simulator_spaces(frame_stack: int = 1, features: Sequence[str] = (), action_head: str = "target",
                     max_threads: int = 32) -> "tuple[spaces.Space, spaces.Space]":
    """Observation and action spaces of the network (they do not depend on the profile; the
    ``absolute`` action head depends on the thread bound).

    One frame is the simulator's encoding followed by the derived ``features``; with
    ``frame_stack`` > 1 the observation is that many frames side by side, oldest first (as
    :class:`automdt.simulator.pipeline.FrameStack`).
    """
    return policy_observation_space(features, frame_stack), make_action_space(action_head, max_threads)


def _policy_kwargs(path: Path, raw: Any) -> Dict[str, Any]:
    ppo_mod.hidden_sizes(path, raw)  # the same checks as numpy loading
    kwargs = dict(raw)
    kwargs["activation_fn"] = _ACTIVATIONS[kwargs.get("activation_fn", "Tanh")]
    return kwargs


def load_network(path: Union[str, os.PathLike]) -> ActorCriticPolicy:
    """The SB3 network of a policy file, without unpickling anything (see the module docstring).

    :raises ValueError: one line, as :meth:`automdt.agents.ppo.PPOPolicy.load`.
    """
    p, meta = ppo_mod.check_policy_file(path)
    kwargs = _policy_kwargs(p, meta.get("policy_kwargs"))
    try:
        with zipfile.ZipFile(p) as zf:
            names = set(zf.namelist())
            if "data" not in names or "policy.pth" not in names:
                raise ppo_mod.not_a_policy_error(p, "zip has no SB3 'data' and 'policy.pth' entries")
            with zf.open("policy.pth") as f:
                state = th.load(f, map_location="cpu", weights_only=True)
    except (zipfile.BadZipFile, pickle.UnpicklingError, RuntimeError, OSError, EOFError) as e:
        raise ppo_mod.not_a_policy_error(p, f"unreadable weights: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    obs_space, act_space = simulator_spaces(meta.get("frame_stack", 1), meta.get("features", []),
                                            meta.get("action_head", "step"), meta.get("max_threads", 32))
    try:
        network = ActorCriticPolicy(obs_space, act_space, lambda _: 0.0, **kwargs)
    except (TypeError, ValueError, AssertionError) as e:
        raise ppo_mod.not_a_policy_error(p, f"bad policy_kwargs in its metadata: {e}") from None
    try:
        network.load_state_dict(state, strict=True)
    except (RuntimeError, TypeError, AttributeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ppo_mod.not_a_policy_error(p, f"weights do not fit the recorded network: {first}") from None
    network.set_training_mode(False)
    return network


def actor_arrays(network: ActorCriticPolicy) -> Dict[str, np.ndarray]:
    """The actor's weights (hidden layers and action head) as float32 numpy arrays, by SB3 name."""
    out = {}
    for k, v in network.state_dict().items():
        if k.startswith("mlp_extractor.policy_net.") or k.startswith("action_net."):
            out[k] = v.detach().cpu().numpy().astype(np.float32)
    return out


def _npz_bytes(arrays: Dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, allow_pickle=False, **arrays)  # numeric arrays only
    return buf.getvalue()


def write_numpy_weights(zip_path: Union[str, os.PathLike], network: ActorCriticPolicy) -> List[str]:
    """Put the actor's arrays into ``zip_path`` as :data:`~automdt.agents.ppo.WEIGHTS_ENTRY`
    (replacing an older one); the zip is rewritten atomically (temporary file, rename).

    :return: the array names written.
    """
    arrays = actor_arrays(network)
    p = Path(os.fspath(zip_path))
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    os.close(fd)
    try:
        with zipfile.ZipFile(p) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                if info.filename != ppo_mod.WEIGHTS_ENTRY:
                    dst.writestr(info, src.read(info.filename))
            entry = zipfile.ZipInfo(ppo_mod.WEIGHTS_ENTRY, date_time=(1980, 1, 1, 0, 0, 0))
            entry.compress_type = zipfile.ZIP_DEFLATED
            dst.writestr(entry, _npz_bytes(arrays))
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException:
        os.unlink(tmp)
        raise
    return sorted(arrays)


def numpy_weights_metadata(names: Sequence[str]) -> Dict[str, Any]:
    """The sidecar's ``numpy_weights`` record."""
    return {"entry": ppo_mod.WEIGHTS_ENTRY, "arrays": list(names), "reader": "numpy.load(allow_pickle=False)"}


def add_numpy_weights(path: Union[str, os.PathLike]) -> Path:
    """Add numpy weights to a policy file written before they existed (the file must pass every
    loading check); updates the sidecar's ``sha256`` and ``numpy_weights``. Returns the path."""
    network = load_network(path)
    p = Path(os.fspath(path))
    names = write_numpy_weights(p, network)
    meta = ppo_mod.policy_metadata(p)
    meta["numpy_weights"] = numpy_weights_metadata(names)
    meta["sha256"] = ppo_mod.sha256_file(p)
    ppo_mod.write_policy_metadata(p, meta)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m automdt.agents.ppo_sb3",
        description="Add the numpy weights (automdt_actor.npz) that the transfer path reads to policy files "
                    "written by an older automdt. Needs torch; rewrites each zip atomically and updates its "
                    "sidecar's sha256.")
    ap.add_argument("policy", nargs="+", help="policy .zip files (each with its .zip.json sidecar)")
    args = ap.parse_args(argv)
    for path in args.policy:
        try:
            add_numpy_weights(path)
        except ValueError as e:
            print(f"automdt: {e}", file=sys.stderr)
            return 2
        print(f"{path}: numpy weights added ({ppo_mod.WEIGHTS_ENTRY})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
