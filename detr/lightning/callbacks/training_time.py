"""Training time: a clock that validation does not advance, the throughput it logs, and a budget of it that
ends ``fit`` at a step count fixed early (so that the learning-rate schedule stays a function of the step)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import lightning as L

from detr.lightning.schedule import LinearDecayToZero

logger = logging.getLogger(__name__)


class TrainingClock:
    """Seconds of training: a clock that runs only between :meth:`start` and :meth:`pause` (the callbacks
    below pause it for validation). ``now`` is the time source (tests substitute a simulated one)."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.now = now
        self.seconds = 0.0  # up to the last pause
        self._since: float | None = None

    def start(self) -> None:
        if self._since is None:
            self._since = self.now()

    def pause(self) -> None:
        if self._since is not None:
            self.seconds += self.now() - self._since
            self._since = None

    def spent(self) -> float:
        """Training seconds so far, the running stretch included."""
        return self.seconds + (self.now() - self._since if self._since is not None else 0.0)


class _TrainingTime(L.Callback):
    """Runs a :class:`TrainingClock` over the training batches of ``fit``: validation excluded, the
    seconds saved in checkpoints (a resumed run goes on counting)."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = TrainingClock()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.clock.start()  # a run resumed in mid-epoch gets no on_train_epoch_start

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.clock.start()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.clock.pause()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self.clock.start()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.clock.pause()

    def state_dict(self) -> dict[str, Any]:
        return {"train_seconds": self.clock.spent()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.clock.seconds = float(state_dict.get("train_seconds", 0.0))


class TrainingThroughput(_TrainingTime):
    """Log training throughput and time, so AP can be read against training time.

    ``time/train_images_per_second``: each training epoch's images over its training time (per process;
    data loading included, validation excluded), at the epoch's end. ``time/train_seconds``: training
    time since the run started (validation excluded, resumed runs included), at every epoch's end and
    every validation (beside val/AP: the x axis of the demo's and the benchmark's AP curves).

    Lightning's ``ThroughputMonitor`` does not do this: its time restarts at every ``fit`` and is not logged
    beside the validation metrics (docs/measurements/convergence.md, "Training time").
    """

    def __init__(self) -> None:
        super().__init__()
        self._epoch_images = 0
        self._epoch_started_at = 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._epoch_images, self._epoch_started_at = 0, self.clock.spent()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self._epoch_images, self._epoch_started_at = 0, self.clock.spent()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._epoch_images += int(batch[0].shape[0])

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            pl_module.log("time/train_seconds", self.clock.spent())

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        pl_module.log("time/train_seconds", self.clock.seconds)
        epoch_seconds = self.clock.seconds - self._epoch_started_at
        if epoch_seconds > 0:
            pl_module.log("time/train_images_per_second", self._epoch_images / epoch_seconds)


class TimeBudget(_TrainingTime):
    """End ``fit`` after a budget of training time (validation not counted), at a step count fixed early,
    so that the learning-rate schedule stays a function of the step.

    ``max_train_seconds`` is "10 minutes of training" that validating more often does not shorten. The
    learning-rate decay (:class:`detr.lightning.schedule.LinearDecayToZero`, the training system's
    ``lr_decay_fraction``) needs the run's total step count. When the trainer bounds the run by
    ``max_steps``, that bound is the user's word: the run trains exactly that many steps and the time
    budget does not stop it (also when a resume asks for more steps than the budget's run had). With
    ``max_epochs`` the scheduler already has the count and this callback only adds the time limit. Otherwise this callback measures the step rate and, once ``calibration_fraction`` of the
    budget is spent, or when the decay would start if that comes first, fixes the total once: the steps
    taken plus the steps the rest of the budget holds at the rate measured so far in this ``fit``. From
    then on the decay and the stop follow the step count alone (two runs that fix the same count train
    with the same learning rates, whatever their machines' speed did afterwards). The time limit stays as
    a safety stop at ``max_train_seconds × (1 + time_tolerance)`` once the count is fixed (the rate drifts
    a little: a run may overrun its budget by that share to end its decay), with a warning if it comes
    first (a machine that slowed down: the decay is cut short).

    Why fix it at all rather than follow the clock: a decay driven by the wall clock differs between two
    runs of one config as soon as their speeds differ, and cannot be repeated from a checkpoint.
    Why that early: the decay must not start before the count is known, and a later fix measures the rate
    over more steps; ``calibration_fraction`` caps it for runs without a decay.

    Stops like Lightning's ``max_time``: after the batch, with the validation that a stop triggers. In DDP,
    rank 0's clock decides for every process (as Lightning's ``Timer`` does), so all stop at the same step
    and fix the same count. The training time spent and the fixed count are saved in checkpoints: a
    resumed run goes on with the rest of its budget and the same count.

    Args:
        max_train_seconds: the budget of training time, in seconds.
        calibration_fraction: share of the budget after which the step count is fixed at the latest.
        time_tolerance: once the step count is fixed, the share by which the run may overrun
            ``max_train_seconds`` to reach it.
    """

    def __init__(self, max_train_seconds: float, calibration_fraction: float = 0.5,
                 time_tolerance: float = 0.1) -> None:
        super().__init__()
        if max_train_seconds is None or max_train_seconds <= 0:
            raise ValueError(f"TimeBudget: max_train_seconds must be > 0, got {max_train_seconds}")
        if not 0.0 < calibration_fraction <= 1.0:
            raise ValueError(f"TimeBudget: calibration_fraction must be in (0, 1], got {calibration_fraction}")
        if time_tolerance < 0:
            raise ValueError(f"TimeBudget: time_tolerance must be >= 0, got {time_tolerance}")
        self.max_train_seconds = float(max_train_seconds)
        self.calibration_fraction = calibration_fraction
        self.time_tolerance = time_tolerance
        self.total_steps: int | None = None
        self._fix_at = calibration_fraction
        self._start_step, self._start_seconds = 0, 0.0
        self._steps_bound = False  # the trainer's max_steps ends the run, not the clock

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        decays = decay_schedulers(trainer)
        known = [scheduler.total_steps for scheduler in decays if scheduler.total_steps is not None]
        self._steps_bound = trainer.max_steps > 0
        if self._steps_bound:  # this run's own bound wins over a count restored from a checkpoint, and the clock
            self.total_steps = trainer.max_steps
            logger.info("TimeBudget: trainer.max_steps %d bounds this run: it trains to step %d, whatever the %.0f s "
                        "budget", trainer.max_steps, trainer.max_steps, self.max_train_seconds)
        elif self.total_steps is None and known:  # the trainer's max_epochs (or a checkpoint) set it
            self.total_steps = min(known)
        if self.total_steps is not None:
            for scheduler in decays:
                scheduler.set_total_steps(self.total_steps)
        self._fix_at = min([self.calibration_fraction] + [1.0 - scheduler.decay_fraction for scheduler in decays])
        self._start_step, self._start_seconds = trainer.global_step, self.clock.spent()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # one broadcast a step: every process sees rank 0's training time
        spent = float(trainer.strategy.broadcast(self.clock.spent()))
        step = trainer.global_step
        if self.total_steps is None and spent >= self._fix_at * self.max_train_seconds and step > self._start_step:
            self.fix_total_steps(trainer, int(trainer.strategy.broadcast(self.estimate_total_steps(step, spent))))
        limit = self.max_train_seconds * (1.0 + self.time_tolerance if self.total_steps is not None else 1.0)
        if self.total_steps is not None and step >= self.total_steps:
            trainer.should_stop = True
        elif spent >= limit and not self._steps_bound:
            trainer.should_stop = True
            if self.total_steps is not None:
                logger.warning("TimeBudget: %.0f s of training spent at step %d of the %d planned: stopped by the "
                               "time limit (budget + time_tolerance), before the learning-rate decay ended", spent,
                               step, self.total_steps)

    def seconds_per_step(self, step: int, spent: float) -> float:
        """Training seconds a step at this fit's rate so far (``spent`` training seconds at ``step``)."""
        return max(spent - self._start_seconds, 1e-9) / max(step - self._start_step, 1)

    def estimate_total_steps(self, step: int, spent: float) -> int:
        """``step`` plus the steps that the rest of the budget holds at this fit's step rate so far."""
        return step + int(max(self.max_train_seconds - spent, 0.0) / self.seconds_per_step(step, spent))

    def fix_total_steps(self, trainer: L.Trainer, total_steps: int) -> None:
        """Make ``total_steps`` the run's length: for the stop and every decay scheduler."""
        self.total_steps = max(total_steps, trainer.global_step)
        for scheduler in decay_schedulers(trainer):
            scheduler.set_total_steps(self.total_steps)
        logger.info("TimeBudget: the run ends after %d steps (fixed at step %d from the step rate; time limit %.0f s)",
                    self.total_steps, trainer.global_step, self.max_train_seconds)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "total_steps": self.total_steps}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.total_steps = state_dict.get("total_steps")


def decay_schedulers(trainer: L.Trainer) -> list[LinearDecayToZero]:
    """The trainer's :class:`LinearDecayToZero` schedulers (those whose total step count a budget fixes)."""
    return [config.scheduler for config in trainer.lr_scheduler_configs
            if isinstance(config.scheduler, LinearDecayToZero)]


def time_budget_of(callbacks: list[L.Callback]) -> TimeBudget | None:
    """The :class:`TimeBudget` among ``callbacks``, or None."""
    return next((callback for callback in callbacks if isinstance(callback, TimeBudget)), None)
