"""Types shared by the simulator, the policies and the live controller.

They live in :mod:`automdt.policy_contract` (standard library only, so a transfer speaks the
contract without importing this package); this module re-exports them for the simulator's code
and for researchers' imports.
"""
from __future__ import annotations

from automdt.policy_contract import Observation, Triple

__all__ = ["Observation", "Triple"]
