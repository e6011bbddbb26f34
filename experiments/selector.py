"""A general learned selector on the capacity controller: does it beat the default without a profile?

``python -m automdt.experiments.selector train --seeds 0,1,2,3,4 -o DIR`` trains, per seed, the
selector network of :mod:`automdt.agents.tuned` with PPO on the training families
(:mod:`automdt.agents.families`; never the ablation's held-out generator), for a transfer with no
profile: what :class:`~automdt.agents.tuned.TunedPolicy` calls the *prior* is the transfer's own
best so far (:class:`GeneralSelector`): the counts of the interval with the best measured utility
within :data:`MEMORY` intervals, each stage's best measured rate per busy thread, and the best
delivered rate. Per stage and interval the network picks the capacity controller's proposal, to
hold the counts, or to return to that best triple, under the shield.

``selector:PATH`` in the ablation's controller list
(``python -m automdt.experiments ablation --controllers default,selector:DIR/seed0.zip``) scores a
trained file on the held-out families.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import deque
from typing import Any, Deque, List, Optional, Sequence, Tuple

import numpy as np

from automdt.agents import families as F
from automdt.agents import tuned as T
from automdt.policy_contract import K_DEFAULT, Observation, Triple, clamp_triple, finite

MEMORY = 10
"""Intervals over which the best triple is remembered."""


class GeneralSelector(T.TunedPolicy):
    """The tuned selector whose prior is the transfer's own best so far (module docstring)."""

    def __init__(self, actor: Any = None, max_threads: int = 32, k: float = K_DEFAULT) -> None:
        super().__init__((1, 1, 1), (1.0, 1.0, 1.0), 1.0, actor, start="default", max_threads=max_threads, k=k,
                         label="selector")

    def reset(self, max_threads: int, seed: Optional[int] = None) -> Triple:
        self.recent: Deque[Tuple[float, Triple]] = deque(maxlen=MEMORY)
        self.prior_tpt = [0.0, 0.0, 0.0]
        self.prior_rate = 0.0
        start = super().reset(max_threads, seed)
        self.prior = start
        return start

    def observe(self, obs: Observation) -> List[float]:
        threads = clamp_triple(obs.threads, self.max_threads)
        rate = finite(obs.throughput_bps[2])
        util = rate * sum(self.k ** -n for n in threads)
        self.recent.append((util, threads))
        self.prior = max(self.recent)[1]
        self.prior_rate = max(self.prior_rate, rate)
        if obs.busy_s is not None:
            for s in range(3):
                b = finite(obs.busy_s[s])
                if b > 0.25:
                    self.prior_tpt[s] = max(self.prior_tpt[s], finite(obs.throughput_bps[s]) * obs.interval_s / b)
        return super().observe(obs)


def load(path: str, max_threads: int = 32) -> GeneralSelector:
    """A trained selector file (written by :func:`train`; the tuned format's loader checks it)."""
    tuned = T.load_tuned(path, max_threads=max_threads)
    return GeneralSelector(tuned._actor, max_threads=max_threads)


def train(timesteps: int, out: str, seed: int = 0) -> str:
    """Train one seed's selector on the training families; writes ``out``."""
    from automdt.agents.tuned_training import NET_ARCH, learn

    arrays, done, reason = learn(GeneralSelector, lambda rng: F.episode(rng, F.FAMILIES[int(rng.integers(len(F.FAMILIES)))]),
                                 timesteps, seed=seed)
    meta = {"learned": "network", "prior": {"threads": [1, 1, 1], "tpt": [1.0, 1.0, 1.0], "rate": 1.0},
            "k": K_DEFAULT, "max_threads": 64, "frame_stack": T.FRAME_STACK, "choices": list(T.CHOICES),
            "policy_kwargs": {"net_arch": list(NET_ARCH), "activation_fn": "Tanh"},
            "trained_on": {"families": list(F.FAMILIES)}, "validation": {"scores": {}},
            "training": {"timesteps": done, "stop_reason": reason, "seed": seed}}
    T.write_tuned(out, meta, arrays)
    return out


def train_parser(name: str, doc: str, what: str) -> Tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command line of a general learned controller's experiment ``name``: the parser and its
    ``train`` subcommand (``--timesteps``, ``--seeds``, ``-o``), for ``what`` (a noun phrase)."""
    p = argparse.ArgumentParser(prog=f"python -m automdt.experiments {name}", description=doc.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help=f"train {what} on the training families, one file per seed")
    t.add_argument("--timesteps", type=int, default=300_000, help="intervals of training per seed (default 300000)")
    t.add_argument("--seeds", default="0", help="comma list of seeds (default 0)")
    t.add_argument("-o", "--out", required=True, help="directory for seed<N>.zip")
    return p, t


def main(argv: Optional[Sequence[str]] = None) -> int:
    p, _ = train_parser("selector", __doc__, "the general selector")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    for seed in (int(x) for x in a.seeds.split(",")):
        t0 = time.monotonic()
        path = train(a.timesteps, os.path.join(a.out, f"seed{seed}.zip"), seed=seed)
        print(f"selector: {path} ({a.timesteps} steps in {time.monotonic() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
