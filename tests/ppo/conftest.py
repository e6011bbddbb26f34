"""Fixtures of the PPO tests: a tiny training configuration and one tiny trained policy."""
from __future__ import annotations

import pytest

from automdt.simulator.profile import Profile, StageProfile

MB = 1e6
GIB = 2**30

TINY_TIMESTEPS = 1024
"""Four rollouts of the tiny configuration: seconds of training, enough to exercise everything."""


def tiny_config():
    from automdt.agents.training import PPOConfig

    return PPOConfig(num_envs=16, n_steps=16, batch_size=128, n_epochs=2)


def tiny_train(out, seed=0, **kw):
    from automdt.agents.training import train

    kw.setdefault("timesteps", TINY_TIMESTEPS)
    kw.setdefault("eval_every", 512)
    kw.setdefault("eval_steps", 20)
    kw.setdefault("progress", False)
    kw.setdefault("config", tiny_config())
    kw.setdefault("target_fraction", None)
    return train(Profile.default(), out, seed=seed, **kw)


def held_out_profiles():
    """Hand-written read-, network- and write-bound paths (not drawn from any training seed).

    Per-thread rates and bandwidths in MB/s; 1 GiB staging buffers; 2% capacity noise.
    """

    def prof(read, net, write):
        return Profile(read=StageProfile(read[0] * MB, read[1] * MB), net=StageProfile(net[0] * MB, net[1] * MB),
                       write=StageProfile(write[0] * MB, write[1] * MB), sender_buffer=GIB, receiver_buffer=GIB,
                       max_threads=32, noise=0.02)

    return {
        # slow source disk: 50 MB/s per reader up to 500 MB/s; fast network and destination
        "read-bound": prof((50, 500), (200, 2000), (150, 1500)),
        # 10 Gbit/s path at 100 MB/s per TCP connection; fast disks
        "net-bound": prof((300, 3000), (100, 1250), (250, 2500)),
        # slow destination disk: 60 MB/s per writer up to 900 MB/s
        "write-bound": prof((400, 4000), (500, 5000), (60, 900)),
    }


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    """A policy trained for :data:`TINY_TIMESTEPS` (seconds) and its :class:`TrainReport`."""
    out = tmp_path_factory.mktemp("tiny") / "policy.zip"
    return tiny_train(out, seed=0)
