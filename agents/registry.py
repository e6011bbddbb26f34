"""Build a policy from a short spec string (CLI, experiments, configs).

Specs:

* ``static:R,N,W``: fixed thread counts;
* ``globus``: Globus-like concurrency 4 x parallelism 8, i.e. ``(4, 32, 4)`` clipped;
* ``marlin``, ``falcon``, ``heuristic`` (Arslan et al.), ``model`` (Jung et al.), ``topdown``
  (adaptiSeq's knee search): the baselines;
* ``capacity``: the model-based controller on capacity curves measured from busy-time counters;
* ``shield:SPEC``: the policy ``SPEC`` under the shield (:class:`~automdt.agents.shield.Shield`);
* ``default``: :data:`DEFAULT_POLICY`, what ``automdt transfer`` runs without ``--policy``;
* a path ending in ``.zip``: a trained policy file under the shield (what ``automdt train``
  writes: a tuned policy, :mod:`automdt.agents.tuned`, or a PPO network,
  :mod:`automdt.agents.ppo`; numpy inference, no torch);
* ``ppo:PATH``: the same file *without* the shield (an explicit bare run); ``ppo`` the shipped
  PPO network, bare;
* ``oracle``: the simulator's oracle, from ``automdt.simulator.oracle`` (simulator only; needs
  ``profile=`` unless that module provides ``oracle_policy``);
* ``MODULE:FACTORY`` (e.g. ``mylab.policies:GreedyPolicy``): a policy of one's own, from any
  importable module (installed, or on ``PYTHONPATH``); ``FACTORY`` is a class or function called as
  ``FACTORY(max_threads=..., **kw)`` (or ``FACTORY(**kw)`` if it takes no ``max_threads``) that
  returns an object with ``reset`` and ``act`` (:class:`~automdt.policy_contract.Policy`).

Keyword arguments go to the policy's constructor (or to the loader), e.g.
``make_policy("heuristic", 32, rtt_s=0.02, avg_file_size=64 << 20)``. More names can be added
with :func:`register_policy`.
"""
from __future__ import annotations

import importlib
import re
from typing import Any, Callable, Dict, List

from typing import Union

from automdt.agents.base import Policy, PolicyBase, as_policy
from automdt.agents.static import StaticPolicy, globus_policy, parse_static

PolicyFactory = Callable[..., Policy]
"""``factory(max_threads=..., **kw) -> Policy``."""

# The baselines are imported when asked for ("module:name"), so that building one policy (e.g.
# the shipped PPO one, on the transfer path) does not import them all (and numpy with them).
_FACTORIES: Dict[str, Union[PolicyFactory, str]] = {
    "globus": globus_policy,
    "marlin": "automdt.agents.marlin:MarlinPolicy",
    "falcon": "automdt.agents.falcon:FalconPolicy",
    "heuristic": "automdt.agents.heuristic:HeuristicPolicy",
    "model": "automdt.agents.model_based:ModelBasedPolicy",
    "topdown": "automdt.agents.topdown:TopDownPolicy",
    "capacity": "automdt.agents.capacity:CapacityPolicy",
}
_ALIASES: Dict[str, str] = {"arslan": "heuristic", "jung": "model", "model-based": "model", "model_based": "model"}

DEFAULT_POLICY = "shield:capacity"
"""The spec ``automdt transfer`` runs when no ``--policy`` is given (also ``--policy default``):
the counter-fitted model controller under the shield, the best controller of the ablation
(``python -m automdt.experiments ablation``)."""

SHIELD_PREFIX = "shield:"
"""``shield:SPEC`` wraps the policy ``SPEC`` in :class:`~automdt.agents.shield.Shield`."""

ORACLE_FACTORY = "oracle_policy"
"""Factory ``automdt.simulator.oracle`` may provide for the ``oracle`` spec:
``oracle_policy(max_threads=..., **kw) -> Policy``. Without it, ``oracle`` needs
``profile=...`` and holds the triple of ``automdt.simulator.oracle.oracle(profile, k)``."""


def available_policies() -> List[str]:
    """The spec forms :func:`make_policy` accepts, for help texts and error messages."""
    return ["default", "static:R,N,W", *sorted(_FACTORIES), "ppo", "ppo:PATH", "PATH.zip", "oracle",
            "MODULE:FACTORY", "shield:SPEC"]


def register_policy(name: str, factory: PolicyFactory) -> None:
    """Make ``make_policy(name, max_threads, **kw)`` call ``factory(max_threads=..., **kw)``."""
    key = name.strip().lower()
    if not key or ":" in key or key.endswith(".zip") or key in ("static", "ppo", "oracle", "default"):
        raise ValueError(f"cannot register a policy under {name!r}")
    _FACTORIES[key] = factory


def _unknown(spec: str) -> ValueError:
    return ValueError(f"unknown policy {spec!r}; valid: {', '.join(available_policies())}")


def _import_optional(module: str, what: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.startswith(exc.name):
            raise ImportError(f"policy {what!r} needs {module}, which is not available in this installation") from exc
        raise


def _load_ppo(path: str, max_threads: int = 32, **kw: Any) -> PolicyBase:
    """A policy file: a tuned policy when its sidecar says so, else a PPO network."""
    if path.lower() != "ppo" and not kw:
        tuned = _import_optional("automdt.agents.tuned", "tuned")
        if tuned.is_tuned_file(path):
            return tuned.load_tuned(path, max_threads=max_threads)
    ppo = _import_optional("automdt.agents.ppo", "ppo")
    return ppo.load_policy(path, **kw)


def _load_oracle(max_threads: int, **kw: Any) -> Policy:
    oracle = _import_optional("automdt.simulator.oracle", "oracle")
    factory = getattr(oracle, ORACLE_FACTORY, None)
    if factory is not None:
        return as_policy(factory(max_threads=max_threads, **kw))
    # Fallback: the oracle's steady-state triple for a known profile, held fixed.
    solve = getattr(oracle, "oracle", None)
    profile = kw.pop("profile", None)
    if solve is None or profile is None or set(kw) - {"k"}:
        raise ValueError("policy 'oracle' needs profile=<automdt.simulator.profile.Profile> (and optionally k=)")
    best = solve(profile, **kw)
    r, n, w = best.threads
    return StaticPolicy(r, n, w, name="oracle", max_threads=max_threads)


_MODULE_SPEC = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*):([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)$")


def _load_external(raw: str, max_threads: int, **kw: Any) -> Policy:
    """``MODULE:FACTORY``: a policy class or factory function of one's own."""
    import inspect

    m = _MODULE_SPEC.match(raw)
    assert m is not None
    modname, attr = m.groups()
    try:
        obj: Any = importlib.import_module(modname)
    except ModuleNotFoundError as exc:
        if exc.name is not None and modname.startswith(exc.name):
            raise ValueError(f"policy {raw!r}: no module {modname!r} (install it or put it on PYTHONPATH)") from None
        raise
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"policy {raw!r}: module {modname!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"policy {raw!r}: {attr!r} is not a class or function")
    try:
        params = inspect.signature(obj).parameters
        takes = "max_threads" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
    except (TypeError, ValueError):
        takes = True
    try:
        pol = obj(max_threads=max_threads, **kw) if takes else obj(**kw)
    except TypeError as e:
        raise ValueError(f"policy {raw!r}: cannot call {attr}: {e}") from None
    if not (callable(getattr(pol, "reset", None)) and callable(getattr(pol, "act", None))):
        raise ValueError(f"policy {raw!r}: {attr}(...) returned {type(pol).__name__}, which has no reset() and act()")
    if not getattr(pol, "name", None):
        try:
            pol.name = raw
        except (AttributeError, TypeError):
            pass
    return pol


def check_spec(spec: str) -> None:
    """Raise ``ValueError`` for a spec :func:`make_policy` would refuse, without loading anything
    heavy: names and forms are checked, a policy file must exist, a ``MODULE:FACTORY`` module is
    imported. (``make_policy`` may still fail on a file's content.)"""
    import os

    if not isinstance(spec, str) or not spec.strip():
        raise _unknown(str(spec))
    raw = spec.strip()
    key = _ALIASES.get(raw.lower(), raw.lower())
    if key == "default":
        return
    if key.startswith(SHIELD_PREFIX):
        check_spec(raw[len(SHIELD_PREFIX):])
        return
    if key.startswith("static:") or key == "static":
        parse_static(raw, max_threads=1 << 30)
        return
    if key in _FACTORIES or key in ("ppo", "oracle"):
        return
    path = raw[len("ppo:"):].strip() if key.startswith("ppo:") else raw if key.endswith(".zip") else None
    if path is not None:
        if not path:
            raise ValueError("ppo policy spec 'ppo:PATH' needs a path")
        if not os.path.isfile(path):
            raise ValueError(f"policy file {path} not found" if not os.path.exists(path) else
                             f"policy file {path} is not a regular file")
        return
    m = _MODULE_SPEC.match(raw)
    if m is None:
        raise _unknown(raw)
    try:
        mod = importlib.import_module(m.group(1))
    except ModuleNotFoundError as exc:
        if exc.name is not None and m.group(1).startswith(exc.name):
            raise ValueError(f"policy {raw!r}: no module {m.group(1)!r} (install it or put it on PYTHONPATH)") from None
        raise
    obj: Any = mod
    for part in m.group(2).split("."):
        if not hasattr(obj, part):
            raise ValueError(f"policy {raw!r}: module {m.group(1)!r} has no {m.group(2)!r}")
        obj = getattr(obj, part)


def make_policy(spec: str, max_threads: int, **kw: Any) -> PolicyBase:
    """Build the policy named by ``spec`` for a transfer with at most ``max_threads`` per stage.

    The result always has the optional hooks of :class:`~automdt.policy_contract.PolicyBase`: a
    policy of one's own with only ``reset`` and ``act`` gets their defaults
    (:func:`~automdt.policy_contract.as_policy`).

    :param spec: see the module docstring.
    :param max_threads: upper bound of every stage's thread count (``reset`` may override it).
    :param kw: constructor / loader keyword arguments.
    :raises ValueError: for an unknown or malformed spec.
    :raises ImportError: for ``ppo``/``oracle`` when their module is not available.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise _unknown(str(spec))
    if int(max_threads) < 1:
        raise ValueError(f"max_threads must be >= 1, got {max_threads!r}")
    raw = spec.strip()
    key = raw.lower()
    if key == "default":
        return make_policy(DEFAULT_POLICY, max_threads, **kw)
    if key.startswith(SHIELD_PREFIX):
        from automdt.agents.shield import Shield

        return Shield(make_policy(raw[len(SHIELD_PREFIX):], max_threads, **kw), max_threads=int(max_threads))
    if key.startswith("static:") or key == "static":
        if kw:
            raise ValueError(f"static policy takes no options, got {sorted(kw)}")
        return parse_static(raw, max_threads=max_threads)
    key = _ALIASES.get(key, key)
    if key in _FACTORIES:
        factory = _FACTORIES[key]
        if isinstance(factory, str):
            module, _, attr = factory.partition(":")
            factory = _FACTORIES[key] = getattr(importlib.import_module(module), attr)
        return as_policy(factory(max_threads=max_threads, **kw))
    if key == "ppo":
        return _load_ppo("ppo", **kw)
    if key.startswith("ppo:"):
        path = raw[len("ppo:"):].strip()
        if not path:
            raise ValueError("ppo policy spec 'ppo:PATH' needs a path")
        return _load_ppo(path, int(max_threads), **kw)
    if key.endswith(".zip"):  # a trained file drives a transfer under the shield
        from automdt.agents.shield import Shield

        return Shield(_load_ppo(raw, int(max_threads), **kw), max_threads=int(max_threads))
    if key == "oracle":
        return as_policy(_load_oracle(max_threads, **kw))
    if _MODULE_SPEC.match(raw):
        return as_policy(_load_external(raw, max_threads, **kw))
    raise _unknown(raw)
