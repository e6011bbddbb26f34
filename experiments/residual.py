"""A learned residual on the capacity controller: does learning add to the best non-learned controller?

``python -m automdt.experiments.residual train --timesteps N -o residual.zip`` trains a PPO policy
(stable-baselines3) that corrects the capacity controller's proposal, with the shield in the loop,
on the training families (:mod:`automdt.agents.families`; never the ablation's held-out
generator). ``residual`` in the ablation's controller list
(``python -m automdt.experiments ablation --controllers default,residual,...``) runs the trained
file of :data:`MODEL_FILE` under the shield.

The design follows "a bounded residual around a model's proposal" (as Orca scales Cubic's window):

* the base is :class:`~automdt.agents.capacity.CapacityPolicy`; each interval it proposes a triple;
* the network reads the policy input the PPO agent reads (the encoded interval, derived features,
  :data:`FRAME_STACK` frames; :mod:`automdt.simulator.pipeline`) and the proposal, and chooses per
  stage one of :data:`RESIDUALS`: scale by 0.75, minus one, keep, plus one, scale by 1.33;
* the shield (:class:`~automdt.agents.shield.Shield`, the same object as in transfers) filters
  the result, in training and in evaluation;
* the action layer starts with the "keep" choice :data:`KEEP_BIAS` logits ahead, so training starts
  from the base controller and the network learns where to depart from it;
* the reward is the interval's utility (the papers', ``k = 1.02``, normalised by the path's
  achievable rate), so what is learned is what the ablation scores.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from automdt.agents import families as F
from automdt.agents.capacity import CapacityPolicy
from automdt.agents.shield import Shield
from automdt.policy_contract import Observation, Triple, clamp_triple

FEATURES = ("noise_level", "need", "spare", "drain")
FRAME_STACK = 4
ENCODE_MAX = 64
"""Thread bound the inputs are scaled by (the largest bound of the training families and more)."""
RESIDUALS: Tuple[Tuple[float, int], ...] = ((0.75, 0), (1.0, -1), (1.0, 0), (1.0, 1), (1.33, 0))
"""Per stage: ``round(proposal * factor) + add``."""
KEEP = 2
KEEP_BIAS = 4.0
"""Logits by which "keep" leads the other choices at the start of training."""
MODEL_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "residual.zip")


def apply_residual(base: Triple, action: Sequence[int], max_threads: int) -> Triple:
    """The proposal ``base`` corrected by one :data:`RESIDUALS` choice per stage."""
    out = []
    for b, a in zip(base, action):
        factor, add = RESIDUALS[int(a)]
        out.append(round(b * factor) + add)
    return clamp_triple(out, max_threads)


class Agent:
    """One transfer's base controller, shield and network input."""

    def __init__(self) -> None:
        from automdt.simulator.pipeline import PolicyInput

        self.dim = PolicyInput(1, ENCODE_MAX, FEATURES, FRAME_STACK).dim + 3
        self.reset(32)

    def reset(self, max_threads: int) -> Triple:
        from automdt.simulator.pipeline import ObservationEncoder, PolicyInput

        self.max_threads = int(max_threads)
        self.base = CapacityPolicy(max_threads=self.max_threads)
        self.shield = Shield(None, self.max_threads)
        self.encoder = ObservationEncoder(ENCODE_MAX)
        self.input = PolicyInput(1, ENCODE_MAX, FEATURES, FRAME_STACK)
        self.first = True
        self.obs: Optional[Observation] = None
        return self.base.reset(self.max_threads)

    def observe(self, obs: Observation) -> np.ndarray:
        """The network input after ``obs`` (the base controller has seen it and proposed)."""
        self.obs = obs
        self.proposal = self.base.act(obs)
        enc = self.encoder.encode(obs).reshape(1, -1)
        x = self.input.reset(enc) if self.first else self.input.step(enc)[0]
        self.first = False
        return np.concatenate([x[0], np.asarray(self.proposal, dtype=np.float32) / ENCODE_MAX]).astype(np.float32)

    def choose(self, action: Sequence[int]) -> Triple:
        assert self.obs is not None, "observe before choose"
        return self.shield.filter(self.obs, apply_residual(self.proposal, action, self.max_threads))


def make_vec_env(num_envs: int, seed: int) -> Any:
    """An SB3 ``VecEnv`` of ``num_envs`` simulated transfers drawn from the training families."""
    from automdt.simulator.env import BufferSimEnv
    from automdt.simulator.sb3 import ControllerVecEnv

    class ResidualVecEnv(ControllerVecEnv):
        def __init__(self) -> None:
            self.agents = [Agent() for _ in range(num_envs)]
            super().__init__(num_envs, self.agents[0].dim, [len(RESIDUALS)] * 3)
            self.rng = np.random.default_rng(seed)
            self.envs: List[Any] = [None] * num_envs
            self.episodes: List[Any] = [None] * num_envs
            self.steps = [0] * num_envs

        def new_episode(self, i: int) -> np.ndarray:
            ep = F.episode(self.rng, F.FAMILIES[int(self.rng.integers(len(F.FAMILIES)))])
            env = BufferSimEnv(ep.profile, episode_steps=F.STEPS, random_start=False, chunk_bytes=ep.chunk_bytes)
            start = self.agents[i].reset(ep.profile.max_threads)
            _, info = env.reset(seed=int(self.rng.integers(1 << 30)), options={"threads": start})
            self.envs[i], self.episodes[i], self.steps[i] = env, ep, 0
            return self.agents[i].observe(info["observation"])

        def step_one(self, i: int, action: np.ndarray) -> Tuple[np.ndarray, float, bool]:
            env, ep = self.envs[i], self.episodes[i]
            threads = self.agents[i].choose(action)
            for at, prof in ep.events:
                if at == self.steps[i]:
                    env.set_path(prof)
            _, _, _, truncated, info = env.step_threads(threads)
            self.steps[i] += 1
            return self.agents[i].observe(info["observation"]), float(info["sim/utility"]), bool(truncated)

    return ResidualVecEnv()


def train(timesteps: int, out: str, seed: int = 0, num_envs: int = 16, ent_coef: float = 0.005,
          gamma: float = 0.9) -> str:
    """Train the residual network for ``timesteps`` intervals; writes ``out`` (an SB3 zip)."""
    import torch
    from stable_baselines3 import PPO

    venv = make_vec_env(num_envs, seed + 1)
    model = PPO("MlpPolicy", venv, n_steps=64, batch_size=min(512, 64 * num_envs), n_epochs=5, gamma=gamma,
                learning_rate=3e-4,
                ent_coef=ent_coef, policy_kwargs={"net_arch": [64, 64]}, seed=seed, device="cpu", verbose=0)
    from automdt.agents.callbacks import silence_logger

    silence_logger(model)
    with torch.no_grad():  # start from the base controller: "keep" leads on every stage
        bias = model.policy.action_net.bias
        bias.zero_()
        for s in range(3):
            bias[s * len(RESIDUALS) + KEEP] = KEEP_BIAS
    model.learn(int(timesteps))
    model.save(out)
    return out


class ResidualPolicy:
    """A trained residual network on the capacity controller, under the shield (a
    :class:`~automdt.policy_contract.Policy`; needs stable-baselines3 to load the network).

    :param path: the SB3 zip :func:`train` wrote (default :data:`MODEL_FILE`).
    """

    name = "residual"

    def __init__(self, path: str = MODEL_FILE, max_threads: int = 32) -> None:
        from stable_baselines3 import PPO

        self.model = PPO.load(path, device="cpu")
        self.agent = Agent()
        self.agent.reset(max_threads)

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        return self.agent.reset(max_threads)

    def act(self, obs: Observation) -> Triple:
        action, _ = self.model.predict(self.agent.observe(obs), deterministic=True)
        return self.agent.choose(action)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m automdt.experiments.residual", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train the residual network on the training families")
    t.add_argument("--timesteps", type=int, default=2_000_000, help="intervals of training (default 2M: ~25 min)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("-o", "--out", default=MODEL_FILE, help=f"output zip (default {MODEL_FILE})")
    a = p.parse_args(argv)
    t0 = time.monotonic()
    path = train(a.timesteps, a.out, seed=a.seed)
    print(f"residual: {path} ({a.timesteps} steps in {time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
