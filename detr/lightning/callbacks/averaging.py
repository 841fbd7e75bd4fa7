"""An exponential moving average of the weights, validated and saved in place of the trained weights."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from lightning.pytorch.callbacks import WeightAveraging
from torch.optim.swa_utils import get_ema_multi_avg_fn


class ExponentialMovingAverage(WeightAveraging):
    """An exponential moving average of the weights and BatchNorm statistics, ``avg ← decay · avg + (1 −
    decay) · current`` after every optimizer step from ``start_step`` on; validation, the checkpoints'
    ``state_dict`` and the model after fit hold the average (Lightning's ``WeightAveraging`` does the
    swapping and saving; the trained weights stay in the checkpoint under ``current_model_state``).

    Lightning's own ``EMAWeightAveraging`` updates one tensor at a time; this uses torch's foreach EMA
    (one fused lerp over every tensor), which is faster. What the average adds on the shapes benchmark:
    docs/measurements/convergence.md.

    ``warmup_steps`` > 0: the decay of the n-th update is ``decay · (1 − exp(−n / warmup_steps))``, as the
    real-time DETRs' ModelEMA (RT-DETR: decay 0.9999, 2000 warm-up updates), so that the average follows the
    fast early training instead of holding on to the random initialisation.
    """

    def __init__(self, decay: float = 0.99, start_step: int = 0, warmup_steps: int = 0) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"ExponentialMovingAverage: decay must be in (0, 1), got {decay}")
        if warmup_steps < 0:
            raise ValueError(f"ExponentialMovingAverage: warmup_steps must be >= 0, got {warmup_steps}")
        update = get_ema_multi_avg_fn(decay) if warmup_steps == 0 else ema_with_warmup(decay, warmup_steps)
        super().__init__(use_buffers=True, multi_avg_fn=update)
        self.decay, self.start_step, self.warmup_steps = decay, start_step, warmup_steps

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return step_idx is not None and step_idx >= self.start_step


def ema_with_warmup(decay: float, warmup_steps: int) -> Callable[[list, list, torch.Tensor], None]:
    """The ``multi_avg_fn`` of an EMA whose decay warms up: update n (n = 1 after the copy that starts the
    average) lerps by ``1 − decay · (1 − exp(−n / warmup_steps))``."""

    @torch.no_grad()
    def update(averaged: list[torch.Tensor], current: list[torch.Tensor], num_averaged: torch.Tensor) -> None:
        step_decay = decay * (1 - math.exp(-int(num_averaged) / warmup_steps))
        if torch.is_floating_point(averaged[0]) or torch.is_complex(averaged[0]):
            torch._foreach_lerp_(averaged, current, 1 - step_decay)
        else:  # integer buffers (BatchNorm's step count)
            for average, value in zip(averaged, current, strict=True):
                average.copy_(average * step_decay + value * (1 - step_decay))

    return update
