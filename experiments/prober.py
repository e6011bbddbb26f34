"""A general learned prober on the capacity controller, trained on its advantage over the default.

``python -m automdt.experiments prober train --seeds 0,1,2,3,4 -o DIR`` trains, per seed, a network
with PPO on the training families (:mod:`automdt.agents.families`; never the ablation's held-out
generator) that chooses per stage and interval one of :data:`CHOICES`:

* ``capacity``: the capacity controller's proposal (what the default runs);
* ``hold``: the counts that ran;
* ``best``: the counts of the best interval of the last ten (:class:`~automdt.experiments.selector.GeneralSelector`);
* ``down`` / ``up``: a probe, :data:`STEP` times fewer or more threads than ran (at least one).

A probe is a measurement the capacity controller cannot ask for: its curves extrapolate from the
counts it has seen, so a stage stuck at its thread bound, or one whose samples keep being dropped
as a change, is never tried elsewhere. The controller records whatever ran, so a probe's sample
becomes part of its curve.

The network sees :class:`~automdt.experiments.selector.GeneralSelector`'s input plus, per stage,
whether it is at the thread bound, how many counts the capacity controller has measured and its
noise estimate. The reward is the interval's utility over the oracle's *minus the default's on the
same path with the same noise* (a shadow run of ``shield:capacity``, :func:`automdt.agents.tuned_training.make_vec_env`):
the advantage, so that the path's difficulty does not drown what the network adds. The output
layer starts with ``capacity`` ahead, so training starts from the default.

``prober:PATH`` in the ablation's controller list scores a trained file under the shield.
"""
from __future__ import annotations

import io
import math
import os
import sys
import time
import zipfile
from typing import List, Optional, Sequence

import numpy as np

from automdt.agents import families as F
from automdt.agents import tuned as T
from automdt.experiments.selector import GeneralSelector, train_parser
from automdt.policy_contract import K_DEFAULT, Observation, Triple, clamp_triple

CHOICES = ("capacity", "hold", "best", "down", "up")
"""Per stage, what the network may choose (the first three as in :data:`automdt.agents.tuned.CHOICES`)."""
DOWN, UP = 3, 4
STEP = 1.5
"""Factor of a probe's change of a stage's count."""
EXTRA = 3
"""Inputs per stage and interval beyond the selector's."""
FRAME = T.FRAME_DIM + 3 * EXTRA
"""Inputs per interval."""
IN_DIM = FRAME * T.FRAME_STACK
NET_ARCH = [64, 64]


class Prober(GeneralSelector):
    """The general selector with probes (module docstring)."""

    name = "prober"

    def observe(self, obs: Observation) -> List[float]:
        super().observe(obs)
        extra: List[float] = []
        for s, st in enumerate(self.base.stages):
            extra += [1.0 if int(obs.threads[s]) >= self.max_threads else 0.0,
                      min(len(st.table), 8) / 8.0,
                      min(st.noise, 0.5) * 2.0]
        last = self.frames[-1]
        if len(last) == T.FRAME_DIM:
            last.extend(extra)  # the first interval's frame is repeated: extended once, it holds for all
        return [x for f in self.frames for x in f]

    def choose(self, choice: Sequence[int]) -> Triple:
        assert self.obs is not None, "observe before choose"
        if self.retired is not None:
            return self.proposal
        m = self.max_threads
        current = clamp_triple(self.obs.threads, m)
        best = clamp_triple(self.prior, m)
        out = []
        for c, p, n, b in zip(choice, self.proposal, current, best):
            if c == DOWN:
                out.append(max(1, min(n - 1, int(math.floor(n / STEP)))))
            elif c == UP:
                out.append(min(m, max(n + 1, int(math.ceil(n * STEP)))))
            else:
                out.append(p if c == T.CAPACITY else n if c == T.HOLD else b)
        return clamp_triple(tuple(out), m)  # type: ignore[arg-type]


def train(timesteps: int, out: str, seed: int = 0, advantage: bool = True, keep_bias: float = T.KEEP_BIAS) -> str:
    """Train one seed's prober on the training families; writes ``out`` and its sidecar in the
    tuned policy format (:func:`automdt.agents.tuned.write_tuned`)."""
    from automdt.agents.capacity import CapacityPolicy
    from automdt.agents.tuned_training import learn

    arrays, done, reason = learn(lambda: Prober(), lambda rng: F.episode(rng, F.FAMILIES[int(rng.integers(len(F.FAMILIES)))]),
                                 timesteps, seed=seed, obs_dim=IN_DIM, choices=len(CHOICES),
                                 shadow=(lambda m: CapacityPolicy(max_threads=m)) if advantage else None,
                                 keep_bias=keep_bias)
    meta = {"learned": "network", "prior": {"threads": [1, 1, 1], "tpt": [1.0, 1.0, 1.0], "rate": 1.0},
            "k": K_DEFAULT, "choices": list(CHOICES), "frame_stack": T.FRAME_STACK, "in_dim": IN_DIM,
            "policy_kwargs": {"net_arch": list(NET_ARCH), "activation_fn": "Tanh"},
            "trained_on": {"families": list(F.FAMILIES)},
            "training": {"timesteps": done, "stop_reason": reason, "seed": seed, "advantage": advantage,
                         "keep_bias": keep_bias}}
    T.write_tuned(out, meta, arrays)  # the tuned format's zip and sidecar (sha256, float32 arrays only)
    return out


def load(path: str, max_threads: int = 32) -> Prober:
    """A trained prober (the tuned format's checks, numpy inference, no pickle)."""
    from automdt.agents.ppo import ActorMLP

    p, _ = T.check_tuned_file(path)
    with zipfile.ZipFile(p) as zf:
        raw = zf.read(T.WEIGHTS_ENTRY)
    with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    actor = ActorMLP(arrays, "Tanh", [len(CHOICES)] * 3, in_dim=IN_DIM)
    return Prober(actor, max_threads=max_threads)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p, t = train_parser("prober", __doc__, "the prober")
    t.add_argument("--reward", choices=("advantage", "fraction"), default="advantage",
                   help="advantage over a shadow default run (default) or the fraction of the oracle")
    t.add_argument("--keep-bias", type=float, default=T.KEEP_BIAS,
                   help=f"logits by which 'capacity' leads when training starts (default {T.KEEP_BIAS})")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    for seed in (int(x) for x in a.seeds.split(",")):
        t0 = time.monotonic()
        path = train(a.timesteps, os.path.join(a.out, f"seed{seed}.zip"), seed=seed, advantage=a.reward == "advantage",
                     keep_bias=a.keep_bias)
        print(f"prober: {path} ({a.timesteps} steps in {time.monotonic() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
