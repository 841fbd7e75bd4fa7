"""A quiet console for a timed run: one line per validation (step, training seconds, AP, AP50) and, once the
step rate is measured, what the budget is expected to hold; in place of progress bars."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L

from detr.lightning.callbacks.training_time import TimeBudget


class ProgressLines(L.Callback):
    """Write one line per validation of ``fit`` and, once, the step rate that a :class:`TimeBudget` measured.

    Args:
        write: where each line goes (e.g. ``print`` to the terminal).
        budget: the run's :class:`TimeBudget` (its clock gives the training seconds, validation excluded;
            its rate the expected step count). Place this callback after it in the trainer's callbacks.
        on_rate: called once with (expected total steps, seconds per step) when at least ``rate_steps``
            steps and ``rate_fraction`` of the budget are spent (or when training ends before that).
        rate_steps: the fewest steps the rate is measured over (the first steps are slow: warm-up, caches).
        rate_fraction: the share of the budget after which the rate is reported.
    """

    def __init__(self, write: Callable[[str], None], budget: TimeBudget,
                 on_rate: Callable[[int, float], None] | None = None, rate_steps: int = 20,
                 rate_fraction: float = 0.05) -> None:
        super().__init__()
        self.write = write
        self.budget = budget
        self.on_rate = on_rate
        self.rate_steps = rate_steps
        self.rate_fraction = rate_fraction
        self.expected_steps: int | None = None
        self.seconds_per_step: float | None = None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        spent = self.budget.clock.spent()
        if (self.expected_steps is None and trainer.global_step >= self.rate_steps
                and spent >= self.rate_fraction * self.budget.max_train_seconds):
            self._report_rate(trainer.global_step, spent)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.expected_steps is None and trainer.global_step > 0:  # a budget too short to reach the mark
            self._report_rate(trainer.global_step, self.budget.clock.spent())

    def _report_rate(self, step: int, spent: float) -> None:
        self.seconds_per_step = self.budget.seconds_per_step(step, spent)
        self.expected_steps = (self.budget.total_steps if self.budget.total_steps is not None
                               else self.budget.estimate_total_steps(step, spent))
        if self.on_rate is not None:
            self.on_rate(self.expected_steps, self.seconds_per_step)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        metrics = trainer.callback_metrics
        if "val/AP" not in metrics:  # no ground truth: losses only
            return
        self.write(f"step {trainer.global_step:6d}  {self.budget.clock.spent():7.1f} s  "
                   f"AP {float(metrics['val/AP']):.3f}  AP50 {float(metrics['val/AP50']):.3f}")
