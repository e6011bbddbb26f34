"""Episodes whose path changes mid-episode: a moving bottleneck, a link that halves and recovers.

Real transfers run for minutes to hours while the disks, the link and the hosts' other work
change under them. A policy trained only on paths that stay put has never seen the buffers and
throughputs of a bottleneck that moves. :class:`ProfileChanges` (the ``changes=`` option of
:class:`~automdt.simulator.env.BufferSimEnv`, :class:`~automdt.simulator.vector.BatchedBufferSim`
and :func:`automdt.agents.training.train`) makes some episodes change their profile at random
steps:

* each episode has ``max_changes`` change slots; each is used with probability ``probability``
  at a step drawn uniformly from ``window`` (fractions of the episode); a step with several
  used slots takes the last one;
* on a fixed profile a change multiplies each stage's per-thread rate and bandwidth by its own
  log-uniform factor from ``factor_range`` (relative to the episode's start profile, so a later
  change may also undo an earlier one), which moves the bottleneck whenever the factors reorder
  the stages; ``link_only=True`` changes the network stage's bandwidth alone (a link whose rate
  changes while a connection's window/RTT rate stays);
* with ``random_profiles`` a change draws a new random profile (:func:`random_profile_arrays`)
  unless ``redraw=False``.

The staging buffers, the noise level and the stages' contention stay. The reward's normalisation
(``scale``, the path's achievable rate) follows the profile in force, so a well-tuned policy
still earns just under 3 per step after a change.

Randomness: with changes on, each reset draws :meth:`ProfileChanges.n_uniforms` more uniforms at
the *end* of the per-reset block (after the noise block of :data:`automdt.simulator.dynamics.U_LAYOUT`),
so the profile, start state and noise of an episode are those of the same seed without changes.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

import numpy as np

from automdt.simulator.profile import N_PROFILE_UNIFORMS, random_profile_arrays

__all__ = ["ProfileChanges"]

_PER_SLOT = 2 + 6  # used?, step, then 3 tpt and 3 bandwidth factors


@dataclass(frozen=True)
class ProfileChanges:
    """How episodes change their profile (see the module docstring).

    :param probability: chance that each change slot is used.
    :param max_changes: change slots per episode.
    :param window: ``(lo, hi)`` fractions of the episode in which changes fall.
    :param factor_range: ``(lo, hi)`` of the log-uniform factor applied to each stage's TPT and B.
    :param link_only: change only the network stage (bandwidth and per-connection rate together).
    :param redraw: with ``random_profiles``, draw a whole new random profile (default) instead of
        scaling the episode's one.
    """

    probability: float = 0.5
    max_changes: int = 2
    window: tuple[float, float] = (0.15, 0.85)
    factor_range: tuple[float, float] = (0.25, 4.0)
    link_only: bool = False
    redraw: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"probability must be in [0, 1], got {self.probability}")
        if int(self.max_changes) < 1:
            raise ValueError(f"max_changes must be >= 1, got {self.max_changes}")
        lo, hi = self.window
        if not 0.0 <= lo <= hi <= 1.0:
            raise ValueError(f"window must be 0 <= lo <= hi <= 1 (fractions of the episode), got {self.window}")
        flo, fhi = self.factor_range
        if not 0.0 < flo <= fhi:
            raise ValueError(f"factor_range must be 0 < lo <= hi, got {self.factor_range}")
        object.__setattr__(self, "window", (float(lo), float(hi)))
        object.__setattr__(self, "factor_range", (float(flo), float(fhi)))
        object.__setattr__(self, "max_changes", int(self.max_changes))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "ProfileChanges | None":
        """From :meth:`to_dict` (or a policy's metadata); ``None`` stays ``None``."""
        if d is None:
            return None
        kw = dict(d)
        for key in ("window", "factor_range"):
            if key in kw:
                kw[key] = tuple(kw[key])
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["window"], d["factor_range"] = list(self.window), list(self.factor_range)
        return d

    def n_uniforms(self, random_profiles: bool) -> int:
        """Uniforms one reset draws for the changes (appended to the reset's block)."""
        per = _PER_SLOT + (N_PROFILE_UNIFORMS if random_profiles and self.redraw else 0)
        return self.max_changes * per

    def draw(self, u: np.ndarray, tpt: np.ndarray, bw: np.ndarray, episode_steps: int, max_threads: int,
             random_profiles: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The change plan of ``m`` new episodes.

        :param u: (m, :meth:`n_uniforms`) uniforms.
        :param tpt: (m,3) start per-thread rates; ``bw``: (m,3) start bandwidths.
        :return: ``at`` (m, K) int, the step whose interval first runs on slot k's profile (0: slot
            unused); ``new_tpt`` and ``new_bw`` (m, K, 3).
        """
        m, k = u.shape[0], self.max_changes
        per = self.n_uniforms(random_profiles) // k
        slots = u.reshape(m, k, per)
        used = slots[:, :, 0] < self.probability
        lo = max(1, int(np.floor(self.window[0] * episode_steps)))
        hi = max(lo, int(np.ceil(self.window[1] * episode_steps)))
        at = lo + np.minimum(np.floor(slots[:, :, 1] * (hi - lo + 1)), hi - lo).astype(np.int64)
        at = np.where(used, np.minimum(at, episode_steps), 0)
        if random_profiles and self.redraw:
            arr = random_profile_arrays(slots[:, :, _PER_SLOT:].reshape(m * k, N_PROFILE_UNIFORMS), max_threads)
            return at, arr["tpt"].reshape(m, k, 3), arr["bandwidth"].reshape(m, k, 3)
        flo, fhi = self.factor_range
        f = np.exp(np.log(flo) + slots[:, :, 2:8] * (np.log(fhi) - np.log(flo)))  # (m, K, 6)
        ft, fb = f[:, :, 0:3], f[:, :, 3:6]
        if self.link_only:  # the link's rate changes; a connection's window/RTT rate does not
            ft = np.ones_like(ft)
            fb = np.where(np.arange(3) == 1, fb, 1.0)
        return at, tpt[:, None, :] * ft, bw[:, None, :] * fb
