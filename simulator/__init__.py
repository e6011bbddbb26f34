"""Gymnasium simulator of the two staging buffers between the read, network and write stages.

Public API (see each module): :mod:`~automdt.simulator.profile` (``Profile``, ``StageProfile``,
``capacity``, ``ProfileError``), :mod:`~automdt.simulator.env` (``BufferSimEnv`` registered as
``automdt/BufferSim-v0``, ``action_to_threads``, ``utility``),
:mod:`~automdt.simulator.vector` (``BatchedBufferSim``), :mod:`~automdt.simulator.pipeline`
(``ObservationEncoder`` and the rest of the policy's numpy input pipeline),
:mod:`~automdt.simulator.task` (``SimTask``: every setting of a simulated transfer but its profile),
:mod:`~automdt.simulator.changes` (``ProfileChanges``: episodes whose profile changes
mid-episode). The stable-baselines3
adapter lives in :mod:`automdt.simulator.sb3` and is not imported here (it pulls in torch).

The names below are loaded lazily (PEP 562): importing ``automdt.simulator.types`` or
``automdt.simulator.pipeline`` (what the live transfer path needs) does not import gymnasium;
``from automdt.simulator import BufferSimEnv`` still works and imports it then.
"""
from __future__ import annotations

from automdt.lazy import lazy_attributes

_WHERE = {
    "ENV_ID": "env",
    "BufferSimEnv": "env",
    "action_to_threads": "env",
    "make_action_space": "env",
    "make_observation_space": "env",
    "utility": "env",
    "ACTION_HEADS": "dynamics",
    "OBS_DIM": "dynamics",
    "OBS_NAMES": "dynamics",
    "ObservationEncoder": "pipeline",
    "STAGES": "profile",
    "Profile": "profile",
    "ProfileError": "profile",
    "StageProfile": "profile",
    "capacity": "profile",
    "Observation": "types",
    "Triple": "types",
    "BatchedBufferSim": "vector",
    "ProfileChanges": "changes",
    "SimTask": "task",
}

__all__ = sorted(_WHERE)


__getattr__, __dir__ = lazy_attributes(__name__, _WHERE, globals())
