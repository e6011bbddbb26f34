"""Where the default controller's headroom is: two privileged controllers for the ablation.

Both know the held-out case's true path, one interval late (what a perfect estimator could know
after measuring an interval):

* ``capacity-true``: the capacity controller (:class:`~automdt.agents.capacity.CapacityPolicy`)
  whose measured curves are replaced by the true capacity curves of the path in force during the
  previous interval, and whose noise estimate is the path's true noise. Its decisions (margins,
  hysteresis, the utility solve) are the default's. Where it scores well above ``capacity``, the
  default loses in *estimation*; where it does not, in decisions and probing.
* ``oracle-lag1``: the oracle triple of the path in force during the previous interval, with no
  margin and no hysteresis: the best any controller reacting one interval late can do.

``python -m automdt.experiments ablation --controllers default,capacity,capacity-true,oracle-lag1``
scores them beside the others.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional

import numpy as np

from automdt.agents.capacity import CapacityPolicy
from automdt.policy_contract import K_DEFAULT, Observation, Triple, clamp_triple
from automdt.simulator.oracle import oracle
from automdt.simulator.profile import Profile

LABELS = ("capacity-true", "oracle-lag1")
"""The ablation labels of this module's controllers."""


def true_curves(profile: Profile) -> List[List[float]]:
    """Per stage, the capacity at 1..max_threads threads, made monotone as the capacity
    controller's curves are (the best of fewer threads)."""
    n = np.arange(1, profile.max_threads + 1)
    caps = np.stack([profile.capacities((k, k, k)) for k in n], axis=1)  # (3, m)
    return [list(np.maximum.accumulate(c)) for c in caps]


class _KnownStage:
    """A stand-in for the capacity controller's per-stage estimator that knows the true curve."""

    def __init__(self, curve: List[float], noise: float) -> None:
        self._curve = curve
        self.noise = noise
        self.table = {1: [[curve[0], 0]]}  # measured: the controller solves for this stage
        self.fitted = (0.0, 0.0)  # a fitted shape: the controller uses the mean curve, no optimism

    def curve(self, m: int, z: float = 0.0) -> List[float]:
        c = self._curve
        return [c[min(i, len(c) - 1)] for i in range(m)]


class TrueCapacityPolicy(CapacityPolicy):
    """The capacity controller with the true curves of the path, one interval late.

    :param path_at: the profile in force during interval ``step`` (0-based).
    """

    name = "capacity-true"

    def __init__(self, path_at: Callable[[int], Profile], max_threads: Optional[int] = None,
                 k: float = K_DEFAULT) -> None:
        self.path_at = path_at
        super().__init__(k=k, max_threads=max_threads)

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        self.step = 0
        return super().reset(max_threads, seed)

    def observe(self, obs: Observation) -> None:
        """Instead of measuring: the true curves of the path in force during the previous interval."""
        prof = self.path_at(max(0, self.step - 1))
        self.step += 1
        self.stages = [_KnownStage(c, float(prof.noise)) for c in true_curves(prof)]  # type: ignore[misc]


class LaggedOraclePolicy:
    """The oracle triple of the path in force during the previous interval."""

    name = "oracle-lag1"

    def __init__(self, path_at: Callable[[int], Profile], max_threads: int = 32, k: float = K_DEFAULT) -> None:
        self.path_at = path_at
        self.k = float(k)
        self.max_threads = int(max_threads)
        self._cache: dict = {}

    def _best(self, prof: Profile) -> Triple:
        key = id(prof)
        if key not in self._cache:
            self._cache[key] = oracle(prof, self.k).threads
        return self._cache[key]

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        self.max_threads, self.step = int(max_threads), 0
        return clamp_triple(self._best(self.path_at(0)), self.max_threads)

    def act(self, obs: Observation) -> Triple:
        prof = self.path_at(max(0, self.step - 1))
        self.step += 1
        return clamp_triple(self._best(prof), self.max_threads)


def make(label: str, case: Any) -> Any:
    """The controller for ``label`` (:data:`LABELS`) on an ablation case."""
    m = case.profile.max_threads
    if label == "capacity-true":
        return TrueCapacityPolicy(case.profile_at, max_threads=m)
    if label == "oracle-lag1":
        return LaggedOraclePolicy(case.profile_at, max_threads=m)
    raise ValueError(f"unknown headroom controller {label!r}; valid: {', '.join(LABELS)}")
