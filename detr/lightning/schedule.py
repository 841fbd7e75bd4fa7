"""The training system's learning-rate schedule (:func:`learning_rate_schedulers`), and the decay of a run
that knows its length: linear to zero over the last share of its steps (:class:`LinearDecayToZero`).

A function of the optimizer step only, so two runs of the same step count train with the same learning
rates whatever the machine's speed ("warmup-stable-decay": warm-up, a constant plateau, then this decay).
The run's total step count is ``trainer.max_steps`` (or max_epochs × batches) when the trainer has one;
a run bounded by training time instead gets it from :class:`detr.lightning.callbacks.TimeBudget`, which
fixes it once, early, from the measured step rate. Plain torch: a scheduler the training system returns
from ``configure_optimizers``; Lightning steps it after every optimizer step and saves it in checkpoints.

DEIM's FlatCosine (:class:`FlatCosine`, Huang et al. 2025, Intellindust/DEIM ``engine/optim/lr_scheduler.py``):
the rates flat to an epoch, then a half cosine down to ``gamma`` × themselves by a later epoch, flat after.
"""

from __future__ import annotations

import logging
import math
from bisect import bisect_right
from collections import Counter
from typing import Any

import lightning as L
import torch

logger = logging.getLogger(__name__)


def decay_factor(step: int, total_steps: int | None, decay_fraction: float) -> float:
    """The learning-rate factor of optimizer step ``step`` (0-based) in a run of ``total_steps`` steps whose
    last ``decay_fraction`` decays linearly to zero: 1 before the decay, ``(total - step) / (fraction ·
    total)`` in it (the last step trains at a small positive rate), 0 from ``total_steps`` on; 1 while
    ``total_steps`` is unknown (None)."""
    if total_steps is None or decay_fraction <= 0:
        return 1.0
    return min(1.0, max(0.0, (total_steps - step) / (decay_fraction * total_steps)))


class FactorScheduler(torch.optim.lr_scheduler.LRScheduler):
    """A scheduler that multiplies every learning rate by a closed-form :meth:`factor` of the optimizer step,
    chainable: it applies the change of its own factor to what the other schedulers set (``applied_factor``: the
    factor in the optimizer's rates now, kept in ``state_dict``). Subclasses set their fields, then call
    ``super().__init__`` last (``applied_factor`` 1.0 among them), and implement :meth:`factor`."""

    def factor(self, step: int) -> float:
        raise NotImplementedError

    def get_lr(self) -> list[float]:
        factor = self.factor(self.last_epoch)
        ratio = factor / self.applied_factor if self.applied_factor > 0 else 0.0
        self.applied_factor = factor
        return [group["lr"] * ratio for group in self.optimizer.param_groups]


class LinearDecayToZero(FactorScheduler):
    """Multiply every learning rate by :func:`decay_factor` of the optimizer step; step it once per
    optimizer step (Lightning: ``interval: "step"``).

    Chainable: it applies the change of its own factor to what the other schedulers set (a warm-up
    ``LinearLR``, the epoch ``MultiStepLR``), so the learning rate of a step is their product.

    Args:
        optimizer: the optimizer whose parameter groups it scales.
        decay_fraction: the share (0, 1] of the run's steps over which the rates fall to zero.
        total_steps: the run's optimizer steps; None until known (then no decay yet: see
            :meth:`set_total_steps`).

    ``total_steps`` and the factor applied so far are in ``state_dict`` (hence in Lightning checkpoints).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, decay_fraction: float, total_steps: int | None = None,
                 last_epoch: int = -1) -> None:
        if not 0.0 < decay_fraction <= 1.0:
            raise ValueError(f"LinearDecayToZero: decay_fraction must be in (0, 1], got {decay_fraction}")
        if total_steps is not None and total_steps < 1:
            raise ValueError(f"LinearDecayToZero: total_steps must be >= 1 or None, got {total_steps}")
        self.decay_fraction = decay_fraction
        self.total_steps = total_steps
        self.applied_factor = 1.0  # the factor in the optimizer's learning rates now
        super().__init__(optimizer, last_epoch)

    def set_total_steps(self, total_steps: int) -> None:
        """Fix the run's length; the next ``step()`` applies the factor it gives (fix it before the decay
        would start, or the learning rate jumps to where the decay would be)."""
        if total_steps < 1:
            raise ValueError(f"LinearDecayToZero: total_steps must be >= 1, got {total_steps}")
        self.total_steps = int(total_steps)

    def factor(self, step: int) -> float:
        return decay_factor(step, self.total_steps, self.decay_fraction)


def flat_cosine_factor(step: int, flat_steps: int, end_steps: int, gamma: float) -> float:
    """DEIM's FlatCosine factor of optimizer step ``step`` (0-based), past its warm-up: 1 up to ``flat_steps``,
    ``gamma + (1 - gamma) · ½ (1 + cos(π (step - flat) / (end - flat)))`` between, ``gamma`` from ``end_steps``
    on (the authors' ``flat_cosine_schedule`` over ``init_lr``: flat_iter, total_iter - no_aug_iter, lr_gamma)."""
    if step <= flat_steps:
        return 1.0
    if step >= end_steps:
        return gamma
    return gamma + (1 - gamma) * 0.5 * (1 + math.cos(math.pi * (step - flat_steps) / (end_steps - flat_steps)))


class FlatCosine(FactorScheduler):
    """Multiply every learning rate by :func:`flat_cosine_factor` of the optimizer step; step it once per
    optimizer step (Lightning: ``interval: "step"``). Chainable as :class:`LinearDecayToZero` (it applies the
    change of its own factor), so a warm-up ``LinearLR`` before it multiplies.

    Args:
        optimizer: the optimizer whose parameter groups it scales.
        flat_epochs, end_epochs: the epochs the cosine starts and ends at (DEIM-D-FINE S: 64 and 120, the
            authors' flat_epoch and epoches - no_aug_epoch).
        steps_per_epoch: optimizer steps per epoch (the step counts are these epochs × it).
        gamma: the rates' factor at the end (the authors' lr_gamma, 0.5).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, flat_epochs: int, end_epochs: int, steps_per_epoch: int,
                 gamma: float = 0.5, last_epoch: int = -1) -> None:
        if not 0 <= flat_epochs < end_epochs or steps_per_epoch < 1 or not 0 <= gamma <= 1:
            raise ValueError(f"FlatCosine: needs 0 <= flat_epochs < end_epochs, steps_per_epoch >= 1 and gamma in "
                             f"[0, 1], got {flat_epochs}, {end_epochs}, {steps_per_epoch} and {gamma}")
        self.flat_epochs, self.end_epochs, self.gamma = flat_epochs, end_epochs, gamma
        self.flat_steps, self.end_steps = flat_epochs * steps_per_epoch, end_epochs * steps_per_epoch
        self.applied_factor = 1.0  # the factor in the optimizer's learning rates now
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        return flat_cosine_factor(step, self.flat_steps, self.end_steps, self.gamma)


def schedule_factor(scheduler: torch.optim.lr_scheduler.LRScheduler) -> float:
    """The factor by which one of :func:`learning_rate_schedulers`' schedulers scales the base learning rates
    at its current step (``last_epoch``), in closed form (the schedulers themselves only apply ratios)."""
    step = scheduler.last_epoch
    if isinstance(scheduler, FactorScheduler):
        return scheduler.factor(step)
    if isinstance(scheduler, torch.optim.lr_scheduler.MultiStepLR):
        return scheduler.gamma ** bisect_right(sorted(scheduler.milestones.elements()), step)
    if isinstance(scheduler, torch.optim.lr_scheduler.LinearLR):
        progress = min(scheduler.total_iters, step) / scheduler.total_iters
        return scheduler.start_factor + (scheduler.end_factor - scheduler.start_factor) * progress
    raise TypeError(f"schedule_factor: {type(scheduler).__name__} is not one of learning_rate_schedulers' schedulers")


def resume_schedule(optimizer: torch.optim.Optimizer, schedulers: list[torch.optim.lr_scheduler.LRScheduler],
                    base_lrs: list[float], *, rebuilt: bool = False) -> bool:
    """Make a resumed run's learning rates follow this run's settings; returns whether they changed.

    A checkpoint restores the optimizer's rates and every scheduler's state as the run that wrote it left
    them. The schedulers chain by ratios of their factors, so a rate that reached 0 at the end of a decay
    stays 0 whatever the new length, and other base rates (``--model.optimizer.lr``) never reach the optimizer. When
    ``base_lrs`` (one per parameter group) differ from the schedulers' or a :class:`LinearDecayToZero`'s
    length changed since its last step (:meth:`LinearDecayToZero.set_total_steps`), every rate is set to
    its base × the product of the schedulers' factors at the step reached (:func:`schedule_factor`), and
    the schedulers continue from there; so they are when ``rebuilt`` (:func:`fit_saved_schedulers` gave some
    schedulers this run's settings in place of the checkpoint's). Otherwise nothing is touched (a plain
    resume stays bit-exact).
    """
    decays = [scheduler for scheduler in schedulers if isinstance(scheduler, LinearDecayToZero)]
    length_changed = any(decay.applied_factor != schedule_factor(decay) for decay in decays)
    if (not rebuilt and not length_changed
            and all(list(scheduler.base_lrs) == list(base_lrs) for scheduler in schedulers)):
        return False
    factor = math.prod(schedule_factor(scheduler) for scheduler in schedulers)
    for group, base in zip(optimizer.param_groups, base_lrs, strict=True):
        group["initial_lr"] = base  # what a scheduler built on this optimizer would take as its base
        group["lr"] = base * factor
    for scheduler in schedulers:
        scheduler.base_lrs = list(base_lrs)
        scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]  # get_last_lr(): what a logger reads
        if isinstance(scheduler, FactorScheduler):
            scheduler.applied_factor = schedule_factor(scheduler)
    return True


def learning_rate_schedulers(
    optimizer: torch.optim.Optimizer,
    *,
    lr_drop_epochs: list[int],
    lr_drop_gamma: float,
    warmup_steps: int = 0,
    decay_fraction: float = 0.0,
    total_steps: int | None = None,
    flat_cosine_epochs: list[int] | None = None,
    flat_cosine_gamma: float = 0.5,
    steps_per_epoch: int | None = None,
) -> list[dict[str, Any]]:
    """The schedulers of the training recipe, as Lightning's scheduler configs (``configure_optimizers``).
    They depend on the optimizer step and the epoch only and chain (the factors multiply):

    - "step_decay" (per epoch): × ``lr_drop_gamma`` at each of ``lr_drop_epochs`` (the authors' recipe);
    - "warmup" (per step, when ``warmup_steps`` > 0): linear from 1/1000 to 1 over ``warmup_steps``;
    - "decay" (per step, when ``decay_fraction`` > 0): linear to 0 over the last ``decay_fraction`` of the
      run's ``total_steps`` (:class:`LinearDecayToZero`; None: fixed later by ``set_total_steps``);
    - "flat_cosine" (per step, when ``flat_cosine_epochs`` [flat, end] is given): DEIM's FlatCosine
      (:class:`FlatCosine`) to ``flat_cosine_gamma`` with ``steps_per_epoch``.

    Lightning steps them and keeps their state in checkpoints, so a resumed run continues the schedule;
    :func:`resume_schedule` fits it to a resumed run's own length and base rates.
    """
    step_decay = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=lr_drop_epochs, gamma=lr_drop_gamma)
    schedulers = [{"scheduler": step_decay, "interval": "epoch", "name": "step_decay"}]
    if warmup_steps > 0:
        warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1e-3, end_factor=1.0,
                                                   total_iters=warmup_steps)
        schedulers.append({"scheduler": warmup, "interval": "step", "name": "warmup"})
    if decay_fraction > 0:
        decay = LinearDecayToZero(optimizer, decay_fraction=decay_fraction, total_steps=total_steps)
        schedulers.append({"scheduler": decay, "interval": "step", "name": "decay"})
    if flat_cosine_epochs is not None:
        if steps_per_epoch is None:
            raise ValueError("learning_rate_schedulers: flat_cosine_epochs needs steps_per_epoch")
        flat_cosine = FlatCosine(optimizer, *flat_cosine_epochs, steps_per_epoch, flat_cosine_gamma)
        schedulers.append({"scheduler": flat_cosine, "interval": "step", "name": "flat_cosine"})
    return schedulers


def _kind(state: dict[str, Any]) -> str:
    """Which of :func:`learning_rate_schedulers`' schedulers saved ``state`` (a ``state_dict``)."""
    if "milestones" in state:
        return "step_decay"
    if "flat_steps" in state:
        return "flat_cosine"
    if "total_steps" in state:
        return "decay"
    if "total_iters" in state:
        return "warmup"
    raise ValueError(f"a learning-rate scheduler state with keys {sorted(state)} is none of this project's")


def fit_saved_schedulers(
    saved: list[dict[str, Any]], *, lr_drop_epochs: list[int], lr_drop_gamma: float, warmup_steps: int,
    decay_fraction: float, global_step: int, flat_cosine_epochs: list[int] | None = None,
    flat_cosine_gamma: float = 0.5,
) -> tuple[list[dict[str, Any]], list[str]]:
    """A checkpoint's scheduler states (``checkpoint["lr_schedulers"]``) made to fit the schedulers this run
    builds (:func:`learning_rate_schedulers`' list and order), and the settings that changed.

    Lightning restores the saved states into this run's schedulers in order, each replacing the scheduler's
    settings with the checkpoint's: a resume with another ``lr_drop_epochs`` or ``warmup_steps`` trained on
    the old schedule (or put one scheduler's state into another when the list changed) yet recorded the new
    values. So a scheduler whose settings this run changes, or that the checkpoint does not have, gets only
    its progress (``last_epoch``: epochs for the step decay, optimizer steps for the others): it keeps this
    run's settings, and :func:`follow_this_runs_settings` sets the rates from them at the step reached. The
    decay's length and fraction are fitted there too, so its saved state is kept. Returns ``(saved, [])``
    when nothing changed (the plain resume stays bit-exact).
    """
    by_kind = {_kind(state): state for state in saved}
    changes: list[str] = []
    states: list[dict[str, Any]] = []

    def progress(count: int) -> dict[str, Any]:
        return {"last_epoch": count, "_step_count": count + 1}

    step_decay = by_kind.get("step_decay")
    epochs = int(step_decay["last_epoch"]) if step_decay is not None else 0
    old_drops = sorted(Counter(step_decay["milestones"]).elements()) if step_decay is not None else []
    if old_drops != sorted(lr_drop_epochs):
        changes.append(f"lr_drop_epochs {old_drops} (checkpoint) -> {sorted(lr_drop_epochs)}")
    if step_decay is not None and step_decay["gamma"] != lr_drop_gamma:
        changes.append(f"lr_drop_gamma {step_decay['gamma']:g} (checkpoint) -> {lr_drop_gamma:g}")
    drops_kept = step_decay is not None and not changes
    states.append(step_decay if drops_kept else progress(epochs))

    warmup = by_kind.get("warmup")
    old_warmup = int(warmup["total_iters"]) if warmup is not None else 0
    if old_warmup != warmup_steps:
        changes.append(f"warmup_steps {old_warmup} (checkpoint) -> {warmup_steps}")
    if warmup_steps > 0:
        states.append(warmup if warmup is not None and old_warmup == warmup_steps else progress(global_step))

    decay = by_kind.get("decay")
    if (decay is not None) != (decay_fraction > 0):
        old_fraction = decay["decay_fraction"] if decay is not None else 0
        changes.append(f"lr_decay_fraction {old_fraction:g} (checkpoint) -> {decay_fraction:g}")
    if decay_fraction > 0:
        states.append(decay if decay is not None else progress(global_step))

    flat_cosine = by_kind.get("flat_cosine")
    old = [flat_cosine["flat_epochs"], flat_cosine["end_epochs"]] if flat_cosine is not None else None
    new = list(flat_cosine_epochs) if flat_cosine_epochs is not None else None
    old_gamma = flat_cosine["gamma"] if flat_cosine is not None else None
    if old != new:
        changes.append(f"lr_flat_cosine_epochs {old} (checkpoint) -> {new}")
    if new is not None and old_gamma is not None and old_gamma != flat_cosine_gamma:
        changes.append(f"lr_flat_cosine_gamma {old_gamma:g} (checkpoint) -> {flat_cosine_gamma:g}")
    if new is not None:
        kept = old == new and old_gamma == flat_cosine_gamma
        states.append(flat_cosine if kept else progress(global_step))
    return (states, changes) if changes else (saved, [])


def follow_this_runs_settings(trainer: L.Trainer, base_rates: dict[str, float], decay_fraction: float,
                              rebuilt: list[str] | None = None) -> None:
    """At the start of training: a resumed run's schedule follows this run's settings.

    The checkpoint restored the optimizer's rates and the schedulers as the run that wrote it left them,
    with its length, base rates and ``decay_fraction``. The decay takes this run's length (a time budget's
    fixed count is kept: :class:`detr.lightning.callbacks.TimeBudget`) and fraction, and the rates restart
    from this run's ``base_rates`` (by parameter group name) at the step reached (:func:`resume_schedule`:
    a finished run's rates of 0 would stay 0). ``rebuilt``: the schedule settings that differ from the
    checkpoint's (:func:`fit_saved_schedulers`), whose schedulers start at the step reached with this run's
    settings; the rates are then set from them too, and the message names them."""
    total = trainer.estimated_stepping_batches
    schedulers = [config.scheduler for config in trainer.lr_scheduler_configs]
    for scheduler in schedulers:
        if isinstance(scheduler, LinearDecayToZero):
            scheduler.decay_fraction = decay_fraction  # the checkpoint restored its own
            if math.isfinite(total):
                scheduler.set_total_steps(int(total))
    if trainer.ckpt_path is None or not trainer.optimizers or not schedulers:
        return
    optimizer = trainer.optimizers[0]
    restored = [group["lr"] for group in optimizer.param_groups]
    base_lrs = [base_rates.get(group.get("name"), group["initial_lr"]) for group in optimizer.param_groups]
    checkpoint_base = list(schedulers[0].base_lrs)
    if resume_schedule(optimizer, schedulers, base_lrs, rebuilt=bool(rebuilt)):
        decays = [scheduler for scheduler in schedulers if isinstance(scheduler, LinearDecayToZero)]
        length = (f"; decay to 0 over the last {decays[0].decay_fraction:.0%} of {decays[0].total_steps} steps"
                  if decays and decays[0].total_steps is not None else "")
        changed = f"; schedule {', '.join(rebuilt)}" if rebuilt else ""
        logger.info(
            "resumed from %s at step %d: the learning rates follow this run's settings (base rates %s, the "
            "checkpoint's %s%s%s): now %s, were %s. Other rates or lengths: --model.optimizer.lr, "
            "--model.optimizer.lr_backbone, --model.optimizer.warmup_steps, --model.optimizer.lr_drop_epochs, "
            "--trainer.max_steps", trainer.ckpt_path,
            trainer.global_step, _rates(base_lrs), _rates(checkpoint_base), length, changed,
            _rates([group["lr"] for group in optimizer.param_groups]), _rates(restored),
        )


def _rates(rates: list[float]) -> str:
    return "[" + ", ".join(f"{rate:.3g}" for rate in rates) + "]"


__all__ = ["FlatCosine", "LinearDecayToZero", "decay_factor", "fit_saved_schedulers", "flat_cosine_factor",
           "follow_this_runs_settings", "learning_rate_schedulers", "resume_schedule", "schedule_factor"]
