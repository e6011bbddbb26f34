"""The one protocol every policy implements, in the simulator and on the live engine.

:class:`Policy` and :func:`clamp_triple` live in :mod:`automdt.policy_contract` (standard library
only); this module re-exports them where the policies look for them.
"""
from __future__ import annotations

from automdt.policy_contract import (Features, Observation, OwnStart, Policy, PolicyBase, PolicyWrapper, Triple,
                                     as_policy, clamp_triple)

__all__ = ["Features", "Observation", "OwnStart", "Policy", "PolicyBase", "PolicyWrapper", "Triple", "as_policy",
           "clamp_triple"]
