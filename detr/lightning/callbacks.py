"""Callbacks for the training system: validation images with boxes drawn, training throughput, a budget
of training time, an exponential moving average of the weights, and the ``detr predict`` writer (a COCO
results json with file names)."""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import BasePredictionWriter, WeightAveraging
from PIL import Image
from torch.optim.swa_utils import get_ema_multi_avg_fn
from torchvision.ops import box_convert

from detr.categories import CategoryMap
from detr.data import transforms
from detr.lightning.schedule import LinearDecayToZero
from detr.inference.outputs import detection_labels, draw_boxes, write_predictions_json
from detr.inference.predictor import Prediction, select_detections

logger = logging.getLogger(__name__)

def denormalize(image: torch.Tensor, size: torch.Tensor | tuple[int, int]) -> torch.Tensor:
    """ImageNet-normalised float [3, H, W] (padded) → uint8 [3, h, w] of its unpadded ``size`` = (h, w)."""
    height, width = (int(v) for v in size)
    return transforms.denormalize(image[:, :height, :width]).cpu()


def save_png(image: torch.Tensor, path: str | Path) -> None:
    """Write a uint8 [3, h, w] tensor as a PNG file."""
    Image.fromarray(image.permute(1, 2, 0).cpu().numpy()).save(path)


def draw_detections(
    image: torch.Tensor,
    *,
    boxes_xyxy: torch.Tensor,
    labels: torch.Tensor,
    scores: torch.Tensor | None = None,
    true_boxes_xyxy: torch.Tensor | None = None,
    true_labels: torch.Tensor | None = None,
    category_map: CategoryMap | None = None,
) -> torch.Tensor:
    """Draw true boxes (green) and predicted boxes (red, "name score") on ``image`` (uint8 [3, h, w]).

    Boxes are pixel xyxy in ``image``'s own coordinates. Returns a new uint8 [3, h, w] tensor.
    """

    def name(label: int) -> str:
        return category_map.name(label) if category_map is not None else str(label)

    canvas = image
    if true_boxes_xyxy is not None:
        true_names = [name(int(l)) for l in true_labels] if true_labels is not None else None
        canvas = draw_boxes(canvas, true_boxes_xyxy, true_names, "lime", line_width=2)
    texts = detection_labels([name(int(l)) for l in labels], scores)
    return draw_boxes(canvas, boxes_xyxy, texts, "red", line_width=1)


def draw_batch_item(
    images: torch.Tensor,
    index: int,
    target: dict[str, Any],
    detection: dict[str, torch.Tensor],
    *,
    score_threshold: float,
    category_map: CategoryMap | None,
    min_size: int = 0,
) -> torch.Tensor:
    """Image ``index`` of a batch with its targets and post-processed detections (pixel xyxy in the
    ORIGINAL image, rescaled here to the drawn image) drawn; uint8 [3, h, w]. Images whose short side is
    below ``min_size`` are enlarged first so that the labels stay readable."""
    image = denormalize(images[index], target["size"].tolist())  # unpadded, as the model saw it
    scale = max(1.0, min_size / min(image.shape[-2:]))
    if scale > 1.0:
        enlarged = torch.nn.functional.interpolate(image[None].float(), scale_factor=scale, mode="bilinear")
        image = enlarged[0].round().clamp(0, 255).to(torch.uint8)
    height, width = image.shape[-2:]
    orig_h, orig_w = target["orig_size"].tolist()
    keep = detection["scores"] >= score_threshold
    scale = torch.tensor([width / orig_w, height / orig_h] * 2)
    boxes = detection["boxes"][keep].float().cpu() * scale
    true_boxes = None
    if "boxes" in target and len(target["boxes"]):
        true_boxes = box_convert(target["boxes"].float().cpu(), "cxcywh", "xyxy") * torch.tensor([width, height] * 2)
    return draw_detections(
        image, boxes_xyxy=boxes, labels=detection["labels"][keep], scores=detection["scores"][keep],
        true_boxes_xyxy=true_boxes, true_labels=target.get("labels"), category_map=category_map,
    )


class DrawValidationPredictions(L.Callback):
    """At each validation, draw the first ``num_images`` validation images with true (green) and
    predicted (red, score >= ``score_threshold``) boxes, enlarged to a short side of at least ``min_size``
    pixels; add them to TensorBoard loggers and write PNGs
    to ``output_dir`` (default ``<trainer.log_dir>/val_images``), overwritten at every validation.

    Needs ``validation_step`` to return ``{"detections": ...}`` (as :class:`DetrSystem` does).
    """

    def __init__(
        self, num_images: int = 4, score_threshold: float = 0.5, output_dir: str | None = None, min_size: int = 384
    ) -> None:
        super().__init__()
        self.num_images = num_images
        self.min_size = min_size
        self.score_threshold = score_threshold
        self.output_dir = output_dir
        self._drawn: list[tuple[int, torch.Tensor]] = []

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._drawn = []

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero or len(self._drawn) >= self.num_images:
            return
        if not isinstance(outputs, dict) or "detections" not in outputs:
            return
        images, _, targets = batch
        category_map = getattr(pl_module, "category_map", None)
        for index, (target, detection) in enumerate(zip(targets, outputs["detections"])):
            if len(self._drawn) >= self.num_images:
                break
            drawing = draw_batch_item(images, index, target, detection, score_threshold=self.score_threshold,
                                      category_map=category_map, min_size=self.min_size)
            self._drawn.append((int(target["image_id"]), drawing))

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._drawn:
            return
        directory = self.images_directory(trainer)
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
        for image_id, drawing in self._drawn:
            for experiment in _tensorboard_writers(trainer):
                experiment.add_image(f"val_predictions/{image_id}", drawing, global_step=trainer.global_step)
            if directory is not None:
                save_png(drawing, directory / f"{image_id}.png")
        logger.info("drew %d validation images%s", len(self._drawn), f" into {directory}" if directory else "")
        self._drawn = []

    def images_directory(self, trainer: L.Trainer) -> Path | None:
        """Where the PNGs go: ``output_dir``, else ``<trainer.log_dir>/val_images``, else nowhere."""
        if self.output_dir:
            return Path(self.output_dir)
        return Path(trainer.log_dir) / "val_images" if trainer.log_dir else None


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


def _tensorboard_writers(trainer: L.Trainer) -> list[Any]:
    from lightning.pytorch.loggers import TensorBoardLogger

    return [lg.experiment for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]


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

    Why not Lightning's ``ThroughputMonitor``: it reports samples/s only once a window of batches is full
    (100 by default) and over that window; its ``train|time`` restarts at every ``fit`` (a resumed run's
    curve would start again at 0) and is logged every ``log_every_n_steps`` steps, not beside the
    validation metrics (where the AP curve reads it); without a ``flops_per_batch`` on the module it warns
    in every run (measured with Lightning 2.6 on CPU runs of tens of steps).
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
    ``lr_decay_fraction``) needs the run's total step count. When the trainer bounds the run
    (``max_steps``, or ``max_epochs``), the scheduler already has it and this callback only adds the
    time limit. Otherwise this callback measures the step rate and, once ``calibration_fraction`` of the
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

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        decays = decay_schedulers(trainer)
        known = [scheduler.total_steps for scheduler in decays if scheduler.total_steps is not None]
        if trainer.max_steps > 0:  # this run's own bound wins over a count restored from a checkpoint
            self.total_steps = trainer.max_steps
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
        elif spent >= limit:
            trainer.should_stop = True
            if self.total_steps is not None:
                logger.warning("TimeBudget: %.0f s of training spent at step %d of the %d planned: stopped by the "
                               "time limit (budget + time_tolerance), before the learning-rate decay ended", spent,
                               step, self.total_steps)

    def estimate_total_steps(self, step: int, spent: float) -> int:
        """``step`` plus the steps that the rest of the budget holds at this fit's step rate so far."""
        rate = (step - self._start_step) / max(spent - self._start_seconds, 1e-9)
        return step + int(rate * max(self.max_train_seconds - spent, 0.0))

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
    """The :class:`TimeBudget` among ``callbacks`` (also inside a deprecated :class:`TrainingSpeed`), or None."""
    for callback in callbacks:
        if isinstance(callback, TimeBudget):
            return callback
        if isinstance(callback, TrainingSpeed) and callback.budget is not None:
            return callback.budget
    return None


class TrainingSpeed(TrainingThroughput):
    """Deprecated: use :class:`TrainingThroughput`, :class:`TimeBudget` and the training system's
    ``lr_decay_fraction`` (``model.lr_decay_fraction``).

    Kept so that configs that name it still run: it logs what :class:`TrainingThroughput` logs, holds a
    :class:`TimeBudget` of ``max_train_seconds`` when given, and hands ``lr_decay_fraction`` to the system
    (which then decays over the last share of the run's steps instead of its wall-clock seconds).
    """

    def __init__(self, max_train_seconds: float | None = None, lr_decay_fraction: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= lr_decay_fraction <= 1.0:
            raise ValueError(f"TrainingSpeed: lr_decay_fraction must be in [0, 1], got {lr_decay_fraction}")
        if lr_decay_fraction > 0 and max_train_seconds is None:
            raise ValueError("TrainingSpeed: lr_decay_fraction needs max_train_seconds (the budget it ends)")
        warnings.warn(
            "detr.lightning.callbacks.TrainingSpeed is deprecated: replace it with "
            "detr.lightning.callbacks.TrainingThroughput and detr.lightning.callbacks.TimeBudget "
            "(init_args: max_train_seconds), and move lr_decay_fraction to the model (model.lr_decay_fraction)",
            FutureWarning, stacklevel=2,
        )
        self.budget = TimeBudget(max_train_seconds) if max_train_seconds is not None else None
        self.lr_decay_fraction = lr_decay_fraction

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self.lr_decay_fraction:
            return
        current = pl_module.hparams.get("lr_decay_fraction")
        if current is None:
            raise ValueError(f"TrainingSpeed(lr_decay_fraction=...): {type(pl_module).__name__} has no "
                             "lr_decay_fraction argument; use TimeBudget and the system's own schedule")
        if current and current != self.lr_decay_fraction:
            raise ValueError(f"TrainingSpeed: lr_decay_fraction {self.lr_decay_fraction} conflicts with the model's "
                             f"lr_decay_fraction {current}; set it on the model only")
        pl_module.hparams.lr_decay_fraction = self.lr_decay_fraction  # read by configure_optimizers, which runs later

    def _forward(self, hook: str, *args: Any) -> None:
        if self.budget is not None:
            getattr(self.budget, hook)(*args)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._forward("on_train_start", trainer, pl_module)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self._forward("on_train_epoch_start", trainer, pl_module)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        super().on_train_batch_end(trainer, pl_module, *args)
        self._forward("on_train_batch_end", trainer, pl_module, *args)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_start(trainer, pl_module)
        self._forward("on_validation_start", trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        self._forward("on_validation_end", trainer, pl_module)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        self._forward("on_train_epoch_end", trainer, pl_module)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "budget": self.budget.state_dict() if self.budget is not None else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)  # also reads the old TrainingSpeed's train_seconds
        if self.budget is not None:
            self.budget.load_state_dict(state_dict.get("budget") or {"train_seconds": self.clock.seconds})


class PredictionsWriter(BasePredictionWriter):
    """Write what ``detr predict`` predicted as one COCO results json (``image_id``, ``file_name``,
    ``category_id`` in the data set's ids, ``bbox`` pixel xywh, ``score``), the same format as
    ``tools/predict.py`` (:func:`detr.inference.outputs.write_predictions_json`).

    Args:
        output_path: the json file (parents created); default ``predictions.json`` in ``trainer.log_dir`` (the
            ``detr`` CLI: ``<trainer.default_root_dir>/predict/``), else in ``trainer.default_root_dir``.
        score_threshold: keep detections scoring above it (0: every query, as COCO evaluation wants).

    Under DDP the processes' predictions are gathered and written once, each image once.

    An image that could not be read or resized, or whose predictions are not finite (NaN weights), is
    logged and left out; the rest is written, and ``failed`` lists ``(file name, reason)`` (``detr
    predict`` then exits with status 1).
    """

    def __init__(self, output_path: str | None = None, score_threshold: float = 0.0) -> None:
        super().__init__(write_interval="epoch")
        self.output_path = output_path
        self.score_threshold = score_threshold
        self.failed: list[tuple[str, str]] = []

    def write_on_epoch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, predictions: Any, batch_indices: Any
    ) -> None:
        flat = [item for batch in predictions for item in batch]  # one dataloader: list of batch outputs
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, flat)
            flat = [item for part in gathered for item in part]
        if trainer.is_global_zero:
            self.write(trainer, pl_module, flat)

    def output_file(self, trainer: L.Trainer) -> Path:
        """Where ``predictions.json`` goes (see ``output_path``)."""
        return Path(self.output_path or Path(trainer.log_dir or trainer.default_root_dir) / "predictions.json")

    def write(self, trainer: L.Trainer, pl_module: L.LightningModule, items: list[dict[str, Any]]
              ) -> dict[int, Prediction]:
        """Write every process's prediction ``items`` (on rank 0); returns the written predictions by image id
        (each image once, the failed ones left out), for subclasses that write more of them."""
        category_map = getattr(pl_module, "category_map", None)
        by_image: dict[int, Prediction] = {}
        failed: dict[int, tuple[str, str]] = {}
        for item in items:
            if item["image_id"] in by_image or item["image_id"] in failed:  # the distributed sampler repeats images
                continue
            reason = item.get("error")
            if reason is None and not all(bool(torch.isfinite(item[k]).all()) for k in ("scores", "boxes")):
                reason = "the model's outputs are not finite (NaN or inf weights?)"
            if reason is not None:
                failed[item["image_id"]] = (str(item.get("file_name")), reason)
                continue
            by_image[item["image_id"]] = select_detections(
                item, image_size=tuple(item["orig_size"]), category_map=category_map,
                threshold=self.score_threshold, file_name=item.get("file_name"), image_id=item["image_id"],
            )
        output_path = self.output_file(trainer)
        write_predictions_json(output_path, list(by_image.values()), category_map=category_map)
        self.failed = list(failed.values())
        for file_name, reason in self.failed:
            logger.error("no predictions for %s: %s", file_name, reason)
        if self.failed:
            logger.error("%d of %d images could not be predicted (listed above); %s holds the others",
                         len(self.failed), len(failed) + len(by_image), output_path)
        return by_image
