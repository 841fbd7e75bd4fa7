"""An exponential moving average of the weights, validated and saved in place of the trained weights."""

from __future__ import annotations

from lightning.pytorch.callbacks import WeightAveraging
from torch.optim.swa_utils import get_ema_multi_avg_fn


class ExponentialMovingAverage(WeightAveraging):
    """An exponential moving average of the weights and BatchNorm statistics, ``avg ← decay · avg + (1 −
    decay) · current`` after every optimizer step from ``start_step`` on; validation, the checkpoints'
    ``state_dict`` and the model after fit hold the average (Lightning's ``WeightAveraging`` does the
    swapping and saving; the trained weights stay in the checkpoint under ``current_model_state``).

    Lightning's own ``EMAWeightAveraging`` updates one tensor at a time; this uses torch's foreach EMA
    (one fused lerp over every tensor), which is faster. What the average adds on the shapes benchmark:
    docs/convergence.md.
    """

    def __init__(self, decay: float = 0.99, start_step: int = 0) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"ExponentialMovingAverage: decay must be in (0, 1), got {decay}")
        super().__init__(use_buffers=True, multi_avg_fn=get_ema_multi_avg_fn(decay))
        self.decay, self.start_step = decay, start_step

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return step_idx is not None and step_idx >= self.start_step
