"""The stable-baselines3 callbacks of :func:`automdt.agents.training.train`, composed the SB3 way.

One evaluation callback with children, as SB3's ``EvalCallback`` with
``StopTrainingOnRewardThreshold``, plus independent callbacks in a ``CallbackList``::

    evals = OracleEvalCallback(
        score, policy_metadata, eval_every=4096,
        callback_after_eval=CallbackList([TensorBoardEvalLogger(folder), EvalHookCallback(hook)]),
        callback_on_new_best=StopTrainingOnOracleFraction(0.95),
    )
    model.learn(total, callback=CallbackList([evals, StopTrainingOnWallTime(600, started),
                                              AnnealEntropy(0.01, total), RichProgressCallback(total, evals)]))

The score of a network is what the transfer path would get: the numpy
:class:`~automdt.agents.ppo.PPOPolicy` on a copy of the current weights, run in the simulator
on the evaluation profiles, as a fraction of the oracle's utility
(:func:`automdt.agents.training.evaluate`). Evaluations never touch the global random number
generators, so adding or removing a callback that only watches (TensorBoard, progress) leaves the
trained network unchanged.

This module imports torch and stable-baselines3; :mod:`automdt.agents.training` imports it only
when it trains.
"""
from __future__ import annotations

import copy
import logging
import math
import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Union

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback, EventCallback

from automdt.agents.ppo import PPOPolicy
from automdt.agents.training import EvalPoint

log = logging.getLogger(__name__)

__all__ = [
    "OracleEvalCallback",
    "StopTrainingOnOracleFraction",
    "EvalHookCallback",
    "TensorBoardEvalLogger",
    "StopTrainingOnWallTime",
    "AnnealEntropy",
    "RichProgressCallback",
]


class OracleEvalCallback(EventCallback):
    """Evaluate the network before training and every ``eval_every`` timesteps; keep the best one.

    Each evaluation appends an :class:`~automdt.agents.training.EvalPoint` to :attr:`curve`, then
    triggers ``callback_after_eval`` (every evaluation; a false return stops training: stop reason
    ``"hook"``), then, from ``select_from`` timesteps on, keeps the network if it beats the best
    so far and triggers ``callback_on_new_best`` (a false return stops training: ``"target"``).
    Unlike SB3's ``EvalCallback`` it counts timesteps (not calls) and scores with ``score``.

    :param score: ``score(policy) -> {"mean", "min", "per_profile", ...}`` (a bound
        :func:`automdt.agents.training.evaluate`).
    :param policy_metadata: the metadata of the numpy policy evaluated (thread bound, input
        pipeline, action head).
    :param eval_every: timesteps between evaluations.
    :param select_from: timesteps before which networks are evaluated but never kept.
    :param started: ``time.perf_counter()`` at the start of training (the curve's wall clock).
    """

    def __init__(
        self,
        score: Callable[[PPOPolicy], Dict[str, Any]],
        policy_metadata: Mapping[str, Any],
        eval_every: int,
        select_from: float = 0.0,
        started: Optional[float] = None,
        callback_on_new_best: Optional[BaseCallback] = None,
        callback_after_eval: Optional[BaseCallback] = None,
    ) -> None:
        super().__init__(callback_after_eval)
        self.callback_on_new_best = callback_on_new_best
        if callback_on_new_best is not None:
            callback_on_new_best.parent = self
        self.score = score
        self.policy_metadata = dict(policy_metadata)
        self.eval_every = int(eval_every)
        self.select_from = select_from
        self.started = time.perf_counter() if started is None else started
        self.curve: List[EvalPoint] = []
        self.last_eval: Optional[Dict[str, Any]] = None
        """The latest evaluation's result (of the network at ``curve[-1].timesteps``)."""
        self.best_fraction = -math.inf
        self.best_state: Optional[Dict[str, Any]] = None
        """A copy of the kept network's ``state_dict``; None until one is kept."""
        self.best_timesteps = 0
        self.best_eval: Optional[Dict[str, Any]] = None
        self.stop_reason: Optional[str] = None
        """``"hook"`` or ``"target"`` once an evaluation stopped training (the latest wins)."""
        self.target_wall_s: Optional[float] = None
        """Wall seconds of the evaluation that reached the target."""
        self._next_eval = self.eval_every
        self._rewards: List[float] = []
        self._stop_at_next_step = False

    def _init_callback(self) -> None:
        if self.callback_on_new_best is not None:
            self.callback_on_new_best.init_callback(self.model)

    def _on_training_start(self) -> None:
        super()._on_training_start()
        # SB3 cannot stop from here: a "stop" of the first evaluation ends training at the first step
        self._stop_at_next_step = not self.evaluate(0)

    def _on_step(self) -> bool:
        if self._stop_at_next_step:
            return False
        self._rewards.append(float(np.mean(self.locals["rewards"])))
        if self.num_timesteps < self._next_eval:
            return True
        self._next_eval += self.eval_every
        if not self.evaluate(self.num_timesteps):
            return False
        self._rewards = []
        return True

    def evaluate(self, num_timesteps: int) -> bool:
        """Evaluate the current network as at ``num_timesteps``; False when training should stop."""
        policy = PPOPolicy(self.model.policy, deterministic=True, metadata=self.policy_metadata)
        res = self.score(policy)
        wall = time.perf_counter() - self.started
        rewards = self._rewards
        self.curve.append(EvalPoint(num_timesteps, round(wall, 3), float(np.mean(rewards)) if rewards else float("nan"),
                                    res["mean"], res["min"]))
        self.last_eval = res
        if self.callback is not None and not self.callback.on_step():
            self.stop_reason = "hook"
            self._keep_if_best(num_timesteps, res)
            return False
        if num_timesteps < self.select_from:
            return True
        new_best = self._keep_if_best(num_timesteps, res)
        log.info("eval at %d steps: %.3f of the oracle (min %.3f)", num_timesteps, res["mean"], res["min"])
        if new_best and self.callback_on_new_best is not None and not self.callback_on_new_best.on_step():
            self.stop_reason, self.target_wall_s = "target", wall
            return False
        return True

    def _keep_if_best(self, num_timesteps: int, res: Dict[str, Any]) -> bool:
        if num_timesteps < self.select_from or not res["mean"] > self.best_fraction:
            return False
        self.best_fraction, self.best_timesteps, self.best_eval = res["mean"], num_timesteps, res
        self.best_state = copy.deepcopy(self.model.policy.state_dict())
        return True

    def finish(self, num_timesteps: int, ran_to_budget: bool) -> None:
        """After ``learn``: evaluate the final network if training ran its whole budget and it was
        not evaluated yet; if no network was kept (stopped before ``select_from``), keep the last
        one."""
        if ran_to_budget and self.curve[-1].timesteps != num_timesteps:
            self.evaluate(num_timesteps)
        if self.best_state is None:
            if self.curve[-1].timesteps != num_timesteps:
                self.evaluate(num_timesteps)
            assert self.last_eval is not None
            self.best_fraction, self.best_timesteps, self.best_eval = (self.last_eval["mean"], self.curve[-1].timesteps,
                                                                       self.last_eval)
            self.best_state = copy.deepcopy(self.model.policy.state_dict())

    @property
    def last_point(self) -> EvalPoint:
        return self.curve[-1]


class StopTrainingOnOracleFraction(BaseCallback):
    """Child of :class:`OracleEvalCallback` (``callback_on_new_best``): stop once the kept network
    reaches ``target`` of the oracle's utility (SB3's ``StopTrainingOnRewardThreshold``)."""

    parent: OracleEvalCallback

    def __init__(self, target: float) -> None:
        super().__init__()
        self.target = target

    def _on_step(self) -> bool:
        return not self.parent.best_fraction >= self.target


class EvalHookCallback(BaseCallback):
    """Child of :class:`OracleEvalCallback` (``callback_after_eval``): calls
    ``hook(timesteps, fraction_of_oracle)`` after every evaluation; a true return stops training
    (e.g. Optuna pruning)."""

    parent: OracleEvalCallback

    def __init__(self, hook: Callable[[int, float], Any]) -> None:
        super().__init__()
        self.hook = hook

    def _on_step(self) -> bool:
        point = self.parent.last_point
        return not self.hook(point.timesteps, point.fraction_of_oracle)


class TensorBoardEvalLogger(BaseCallback):
    """Child of :class:`OracleEvalCallback` (``callback_after_eval``): writes SB3's TensorBoard logs
    (``train/*``, ``time/*``) to a new ``PPO_<n>`` run directory under ``folder`` and every
    evaluation as ``eval/fraction_of_oracle``, ``eval/min_fraction_of_oracle`` and
    ``eval/mean_step_reward``. Call :meth:`close` after the last evaluation."""

    parent: OracleEvalCallback

    def __init__(self, folder: Union[str, os.PathLike]) -> None:
        super().__init__()
        self.folder = os.fspath(folder)

    def _init_callback(self) -> None:
        from stable_baselines3.common.utils import configure_logger

        self.model.set_logger(configure_logger(0, self.folder, "PPO", True))

    def _on_step(self) -> bool:
        point = self.parent.last_point
        self.logger.record("eval/fraction_of_oracle", point.fraction_of_oracle)
        self.logger.record("eval/min_fraction_of_oracle", point.min_fraction_of_oracle)
        if not math.isnan(point.mean_reward):  # NaN: no training step since the previous evaluation
            self.logger.record("eval/mean_step_reward", point.mean_reward)
        self.logger.dump(step=point.timesteps)
        return True

    def close(self) -> None:
        self.logger.close()


class StopTrainingOnWallTime(BaseCallback):
    """Stop after ``max_seconds`` of wall time since ``started`` (a ``time.perf_counter()``);
    :attr:`stopped` says whether it did. Makes the result depend on the machine."""

    def __init__(self, max_seconds: float, started: Optional[float] = None) -> None:
        super().__init__()
        self.max_seconds = max_seconds
        self.started = time.perf_counter() if started is None else started
        self.stopped = False

    def _on_step(self) -> bool:
        if time.perf_counter() - self.started >= self.max_seconds:
            self.stopped = True
            return False
        return True


class AnnealEntropy(BaseCallback):
    """Decay PPO's entropy bonus linearly from ``ent_coef`` to 0 over ``total_timesteps`` (set at
    each rollout's end, read by the update that follows)."""

    def __init__(self, ent_coef: float, total_timesteps: int) -> None:
        super().__init__()
        self.ent_coef = ent_coef
        self.total_timesteps = total_timesteps

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        self.model.ent_coef = self.ent_coef * max(0.0, 1.0 - self.num_timesteps / self.total_timesteps)


class RichProgressCallback(BaseCallback):
    """A rich progress bar of the timesteps, with the latest and best fraction of the oracle of
    ``evals`` once a network has been kept. Shown from construction to :meth:`close`."""

    def __init__(self, total_timesteps: int, evals: Optional[OracleEvalCallback] = None) -> None:
        super().__init__()
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.total_timesteps = int(total_timesteps)
        self.evals = evals
        self.progress = Progress(
            TextColumn("[bold]training PPO"), BarColumn(), MofNCompleteColumn(),
            TextColumn("steps"), TimeElapsedColumn(), TextColumn("{task.fields[status]}"),
        )
        self.task = self.progress.add_task("train", total=self.total_timesteps, status="")
        self.progress.start()
        self._closed = False

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        self.progress.update(self.task, completed=min(self.num_timesteps, self.total_timesteps))
        ev = self.evals
        if ev is not None and ev.best_state is not None:
            self.progress.update(self.task, status=f"oracle fraction {ev.last_point.fraction_of_oracle:.3f} "
                                                   f"(best {ev.best_fraction:.3f})")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.progress.stop()


def silence_logger(model: Any) -> None:
    """Give ``model`` an SB3 logger without outputs: SB3's default one creates an empty
    ``$SB3_LOGDIR`` or ``/tmp/SB3-<time>`` directory on every ``learn()`` (AutoMDT's trainers
    write their own curves, and a TensorBoard run sets its own logger)."""
    from stable_baselines3.common.logger import Logger

    model.set_logger(Logger(folder=None, output_formats=[]))
