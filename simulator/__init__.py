"""Gymnasium simulator of the two staging buffers between the read, network and write stages.

Public API (see each module): :mod:`~automdt.simulator.profile` (``Profile``, ``StageProfile``,
``capacity``, ``ProfileError``), :mod:`~automdt.simulator.env` (``BufferSimEnv`` registered as
``automdt/BufferSim-v0``, ``ObservationEncoder``, ``action_to_threads``, ``utility``),
:mod:`~automdt.simulator.vector` (``BatchedBufferSim``), :mod:`~automdt.simulator.changes`
(``ProfileChanges``: episodes whose profile changes mid-episode). The stable-baselines3 adapter lives in
:mod:`automdt.simulator.sb3` and is not imported here (it pulls in torch).
"""
from automdt.simulator.changes import ProfileChanges
from automdt.simulator.env import (
    ENV_ID,
    OBS_DIM,
    OBS_NAMES,
    BufferSimEnv,
    ObservationEncoder,
    action_to_threads,
    make_action_space,
    make_observation_space,
    utility,
)
from automdt.simulator.profile import STAGES, Profile, ProfileError, StageProfile, capacity
from automdt.simulator.types import Observation, Triple
from automdt.simulator.vector import BatchedBufferSim

__all__ = [
    "ENV_ID",
    "OBS_DIM",
    "OBS_NAMES",
    "STAGES",
    "BatchedBufferSim",
    "BufferSimEnv",
    "Observation",
    "ObservationEncoder",
    "Profile",
    "ProfileChanges",
    "ProfileError",
    "StageProfile",
    "Triple",
    "action_to_threads",
    "capacity",
    "make_action_space",
    "make_observation_space",
    "utility",
]
