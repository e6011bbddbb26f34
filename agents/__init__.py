"""Policies: one protocol (:class:`Policy`), PPO and the baselines from the papers.

Importing this package never imports torch, stable-baselines3 or gymnasium, and neither does
``automdt.agents.ppo`` (numpy inference; loaded lazily by :func:`make_policy` for ``ppo`` specs).
Only ``automdt.agents.ppo_sb3`` and ``automdt.agents.training`` use torch and SB3.
"""
from automdt.agents.base import Policy, clamp_triple
from automdt.agents.falcon import FalconPolicy
from automdt.agents.heuristic import HeuristicPolicy
from automdt.agents.marlin import MarlinPolicy
from automdt.agents.model_based import ModelBasedPolicy
from automdt.agents.registry import available_policies, make_policy, register_policy
from automdt.agents.static import StaticPolicy, globus_policy

__all__ = ["Policy", "clamp_triple", "make_policy", "available_policies", "register_policy", "StaticPolicy",
           "globus_policy", "MarlinPolicy", "FalconPolicy", "HeuristicPolicy", "ModelBasedPolicy"]
