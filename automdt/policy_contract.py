"""The policy contract: what a policy sees (:class:`Observation`), what it returns (:data:`Triple`),
the protocol it implements (:class:`Policy`) and :func:`clamp_triple`.

This module is the seam between the policies (``automdt.agents``), the simulator
(``automdt.simulator``) and the live controller (:mod:`automdt.controller`). It uses the standard
library only, so a transfer imports neither the simulator package nor any ML framework to speak
it; ``automdt.simulator.types`` and ``automdt.agents.base`` re-export its names.

An :class:`Observation` is what a policy sees after one control interval, in physical units,
whether it comes from the simulator or from the live engines' counters. Policies normalise it
themselves (the PPO agent through :class:`automdt.simulator.pipeline.ObservationEncoder`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Optional, Protocol, Tuple, runtime_checkable

Triple = Tuple[int, int, int]
"""Thread counts (read, network, write)."""

STAGES = ("read", "net", "write")
"""The three stages, in the order of every triple."""

K_DEFAULT = 1.02
"""Thread-cost base of the utility ``sum_i t_i / K^n_i`` (AutoMDT, Marlin and Falcon use 1.02)."""

BUSY = 0.9
"""Share of a stage's thread-seconds spent busy from which the stage works at its capacity: its
rate is its capacity at that count (the capacity controller's exact sample), and it limits the
transfer (the shield's test)."""


@dataclass(frozen=True)
class Observation:
    """One control interval, as measured.

    :param threads: thread counts (read, net, write) that ran during the interval (on the live
        engine: the counts the engines report, after any clamp of theirs).
    :param throughput_bps: bytes/s moved by each stage (read, net, write) during the interval.
    :param buffer_fill: fill fractions 0..1 of the (sender, receiver) staging buffers at the end
        of the interval.
    :param interval_s: length of the interval in seconds.
    :param max_threads: upper bound of every stage's thread count.
    :param loss: optional network loss ratio (TCP retransmits / segments sent) in the interval,
        0 when unknown; used by the Falcon/Marlin network utility.
    :param buffer_bytes: capacities (sender, receiver) of the staging buffers in bytes.
    :param busy_s: thread-seconds each stage (read, net, write) spent working in the interval
        (throttle sleeps included; the network's time blocked by a full receiver buffer is not
        busy), or None when unknown.
    :param wait_s: thread-seconds each stage spent waiting on a staging buffer (readers on a full
        sender buffer, the network on an empty sender or a full receiver buffer, writers on an
        empty receiver buffer), or None when unknown.
    """

    threads: Triple
    throughput_bps: Tuple[float, float, float]
    buffer_fill: Tuple[float, float]
    interval_s: float = 1.0
    max_threads: int = 32
    loss: float = 0.0
    buffer_bytes: Tuple[int, int] = (0, 0)
    busy_s: Optional[Tuple[float, float, float]] = None
    wait_s: Optional[Tuple[float, float, float]] = None
    extra: dict = field(default_factory=dict, compare=False)


@runtime_checkable
class Policy(Protocol):
    """Chooses the next (read, net, write) thread counts after each control interval.

    A policy is stateful at most across one transfer (or one simulated episode): ``reset`` starts
    afresh. ``act`` is called once per interval with what was measured during it and returns the
    thread counts for the next interval, each in ``[1, max_threads]``.

    A policy that only implements ``reset`` and ``act`` runs everywhere. The optional hooks
    (where it starts, whether it acts in a run's tail, a start given from outside, notes for the
    interval log) are those of :class:`PolicyBase`; a policy declares them by deriving from it.
    """

    name: str

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        """Start a new transfer; return the initial thread counts."""
        ...

    def act(self, obs: Observation) -> Triple:
        """Return the thread counts for the next interval."""
        ...


@dataclass(frozen=True)
class OwnStart:
    """Where a policy that takes a start (``Features.start``) starts when neither ``--threads``
    nor a job's history says otherwise (:mod:`automdt.start`).

    :param threads: the counts (clamped by the run's bounds).
    :param source: what the start log records: ``"policy"`` (the policy's own rule), ``"profile"``
        (an explored profile's optimum), ``"cold"`` (a shipped cold-start model), ``"given"``.
    """

    threads: Triple
    source: str = "policy"


@dataclass(frozen=True)
class Features:
    """What a policy does beyond ``reset`` and ``act``: what the controller and
    :mod:`automdt.start` read from :meth:`PolicyBase.features`.

    :param start: the policy takes a start (a job's history, then this :class:`OwnStart`), or
        None: it starts where its ``reset`` says (after ``--threads``, if given).
    :param asked_in_tail: the policy is asked in a run's tail (the buffers drain, the source is
        read), instead of the controller holding the counts (the capacity controller sizes the
        writers that drain).
    """

    start: Optional[OwnStart] = None
    asked_in_tail: bool = False


class PolicyBase:
    """A policy with the optional hooks, each at its default; derive from it to declare any.

    Wrappers (the shield, a policy of one's own around another) forward every hook to the policy
    they wrap, explicitly: :class:`PolicyWrapper` does.
    """

    name: str = "policy"

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        """Start a new transfer; return the initial thread counts."""
        raise NotImplementedError

    def act(self, obs: Observation) -> Triple:
        """Return the thread counts for the next interval."""
        raise NotImplementedError

    def features(self) -> Features:
        """The hooks this policy declares (:class:`Features`); read once per transfer, after ``reset``."""
        return Features()

    def start_from(self, threads: Triple) -> None:
        """The transfer starts at ``threads`` instead of what ``reset`` returned (``--threads``
        with ``--policy``, a job's history): start the policy's own state there too."""

    def annotation(self) -> Dict[str, Any]:
        """Notes about the last ``act`` for the interval log (JSON values), or ``{}``."""
        return {}


class PolicyWrapper(PolicyBase):
    """A policy around another that forwards every hook of :class:`PolicyBase` to it; a subclass
    overrides what it changes (as Gymnasium's ``Wrapper`` forwards explicitly)."""

    def __init__(self, policy: Any) -> None:
        self.policy: PolicyBase = as_policy(policy)
        self.name = self.policy.name

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        return self.policy.reset(max_threads, seed)

    def act(self, obs: Observation) -> Triple:
        return self.policy.act(obs)

    def features(self) -> Features:
        return self.policy.features()

    def start_from(self, threads: Triple) -> None:
        self.policy.start_from(threads)

    def annotation(self) -> Dict[str, Any]:
        return self.policy.annotation()


class _Plain(PolicyWrapper):
    """A policy with only ``reset`` and ``act`` (and maybe ``name``), given the hooks' defaults."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.name = str(getattr(policy, "name", type(policy).__name__))

    def features(self) -> Features:
        return Features()

    def start_from(self, threads: Triple) -> None:
        return None

    def annotation(self) -> Dict[str, Any]:
        return {}


def as_policy(policy: Any) -> PolicyBase:
    """``policy`` itself when it derives from :class:`PolicyBase`, else it wrapped with the hooks'
    defaults (a policy with only ``reset`` and ``act``)."""
    return policy if isinstance(policy, PolicyBase) else _Plain(policy)


def clamp_triple(t: Iterable[Any], max_threads: int) -> Triple:
    """Round and clip a triple of thread counts into ``[1, max_threads]``."""
    r, n, w = (int(min(max(1, round(float(x))), max_threads)) for x in t)
    return (r, n, w)


def finite(x: Any) -> float:
    """``x`` as a float, with NaN/inf/negative measurements read as 0."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return 0.0
    return v if math.isfinite(v) and v > 0.0 else 0.0
