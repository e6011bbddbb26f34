"""Policies: one protocol (:class:`Policy`), PPO and the baselines from the papers.

Importing this package never imports torch, stable-baselines3 or gymnasium, and neither does
``automdt.agents.ppo`` (numpy inference; loaded lazily by :func:`make_policy` for ``ppo`` specs).
Only ``automdt.agents.ppo_sb3``, ``automdt.agents.training`` (when it trains) and
``automdt.agents.callbacks`` use torch and SB3. The names
below load lazily (PEP 562), so ``automdt.agents.base`` (what the controller needs) costs nothing.
"""
from __future__ import annotations

from automdt.lazy import lazy_attributes

_WHERE = {
    "Policy": "base",
    "clamp_triple": "base",
    "FalconPolicy": "falcon",
    "HeuristicPolicy": "heuristic",
    "MarlinPolicy": "marlin",
    "ModelBasedPolicy": "model_based",
    "available_policies": "registry",
    "make_policy": "registry",
    "register_policy": "registry",
    "StaticPolicy": "static",
    "globus_policy": "static",
}

__all__ = ["Policy", "clamp_triple", "make_policy", "available_policies", "register_policy", "StaticPolicy",
           "globus_policy", "MarlinPolicy", "FalconPolicy", "HeuristicPolicy", "ModelBasedPolicy"]


__getattr__, __dir__ = lazy_attributes(__name__, _WHERE, globals())
