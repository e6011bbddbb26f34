"""Policies: one protocol (:class:`Policy`), PPO and the baselines from the papers."""
from automdt.agents.base import Policy, clamp_triple

__all__ = ["Policy", "clamp_triple"]
