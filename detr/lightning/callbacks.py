"""Callbacks for the training system: validation images with boxes drawn, training speed, an
exponential moving average of the weights, and the ``detr predict`` writer (a COCO results json with
file names)."""

from __future__ import annotations

import logging
import time
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
from detr.predictions_io import detection_labels, draw_boxes, write_predictions_json
from detr.predictor import Prediction, select_detections

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


def budget_lr_factor(spent: float, budget: float, decay_fraction: float) -> float:
    """The learning-rate factor of a linear decay to zero over the last ``decay_fraction`` of ``budget``
    (seconds or steps) when ``spent`` of it is used: 1 before the decay, 0 at the end and after."""
    if decay_fraction <= 0:
        return 1.0
    return min(1.0, max(0.0, (budget - spent) / (decay_fraction * budget)))


class TrainingSpeed(L.Callback):
    """Log training throughput and time, so AP can be read against wall time; optionally, a budget of
    training time and a learning-rate decay over its end.

    At the end of every training epoch (per process) logs ``time/train_images_per_second`` (images of
    that epoch over its wall time, data loading included, validation excluded) and
    ``time/train_seconds`` (cumulative training wall time since fit started, validation excluded; it
    is also logged at each validation, next to val/AP). Lightning's ThroughputMonitor measures over a
    fixed window of batches, which short CPU runs never fill; this measures whole epochs.

    Args:
        max_train_seconds: stop fit once this much training time has passed (validation excluded), the
            way Lightning's ``max_time`` stops it (after the batch, with a last validation), but counting
            only training: a budget of "10 minutes of training" that validating more often does not
            shorten.
        lr_decay_fraction: over the last ``lr_decay_fraction`` of ``max_train_seconds``, every learning
            rate falls linearly to zero with the training time spent ("warmup-stable-decay": a run that
            knows its budget ends at a low learning rate instead of being cut off at a high one). The
            factor multiplies what the optimizer's schedulers set (theirs are chainable: warm-up, step
            decay), and the ranks of a DDP run apply rank 0's factor.

    The training time spent and the learning-rate factor are saved in checkpoints: a resumed run goes on
    with the budget that is left.
    """

    def __init__(self, max_train_seconds: float | None = None, lr_decay_fraction: float = 0.0) -> None:
        super().__init__()
        if max_train_seconds is not None and max_train_seconds <= 0:
            raise ValueError(f"TrainingSpeed: max_train_seconds must be > 0, got {max_train_seconds}")
        if not 0.0 <= lr_decay_fraction <= 1.0:
            raise ValueError(f"TrainingSpeed: lr_decay_fraction must be in [0, 1], got {lr_decay_fraction}")
        if lr_decay_fraction > 0 and max_train_seconds is None:
            raise ValueError("TrainingSpeed: lr_decay_fraction needs max_train_seconds (the budget it ends)")
        self.max_train_seconds = max_train_seconds
        self.lr_decay_fraction = lr_decay_fraction
        self.train_seconds = 0.0
        self.lr_factor = 1.0  # the factor applied to every learning rate now
        self._epoch_images = 0
        self._epoch_seconds = 0.0
        self._since: float | None = None
        self._clock = time.perf_counter  # tests substitute a simulated clock

    def _spent(self) -> float:
        return self.train_seconds + (self._clock() - self._since if self._since is not None else 0.0)

    def _pause(self) -> None:
        if self._since is not None:
            elapsed = self._clock() - self._since
            self._epoch_seconds += elapsed
            self.train_seconds += elapsed
            self._since = None

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch_images, self._epoch_seconds = 0, 0.0
        self._since = self._clock()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._epoch_images += int(batch[0].shape[0])
        if self.max_train_seconds is None or self._since is None:
            return
        # rank 0's clock decides for every process (as Lightning's Timer does), in one broadcast a step: all
        # stop at the same batch and take the next step with the same learning rate
        spent = float(trainer.strategy.broadcast(self._spent()))
        if spent >= self.max_train_seconds:
            trainer.should_stop = True
        if self.lr_decay_fraction:
            self._scale_learning_rates(trainer, budget_lr_factor(spent, self.max_train_seconds, self.lr_decay_fraction))

    def _scale_learning_rates(self, trainer: L.Trainer, factor: float) -> None:
        """Make ``factor`` the decay's share of every learning rate for the next step. Applied as the ratio
        to the previous factor, after the schedulers stepped, so their own (multiplicative) changes carry
        through."""
        if factor == self.lr_factor:
            return
        ratio = factor / self.lr_factor if self.lr_factor > 0 else 0.0
        for optimizer in trainer.optimizers:
            for group in optimizer.param_groups:
                group["lr"] *= ratio
        self.lr_factor = factor

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pause()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._since = self._clock()

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            pl_module.log("time/train_seconds", self.train_seconds)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pause()
        pl_module.log("time/train_seconds", self.train_seconds)
        if self._epoch_seconds > 0:
            pl_module.log("time/train_images_per_second", self._epoch_images / self._epoch_seconds)

    def state_dict(self) -> dict[str, Any]:
        return {"train_seconds": self._spent(), "lr_factor": self.lr_factor}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.train_seconds = float(state_dict.get("train_seconds", 0.0))
        self.lr_factor = float(state_dict.get("lr_factor", 1.0))


class PredictionsWriter(BasePredictionWriter):
    """Write what ``detr predict`` predicted as one COCO results json (``image_id``, ``file_name``,
    ``category_id`` in the data set's ids, ``bbox`` pixel xywh, ``score``), the same format as
    ``tools/predict.py`` (:func:`detr.predictions_io.write_predictions_json`).

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
        if not trainer.is_global_zero:
            return
        category_map = getattr(pl_module, "category_map", None)
        by_image: dict[int, Prediction] = {}
        failed: dict[int, tuple[str, str]] = {}
        for item in flat:
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
        output_path = self.output_path or Path(trainer.log_dir or trainer.default_root_dir) / "predictions.json"
        write_predictions_json(output_path, list(by_image.values()), category_map=category_map)
        self.failed = list(failed.values())
        for file_name, reason in self.failed:
            logger.error("no predictions for %s: %s", file_name, reason)
        if self.failed:
            logger.error("%d of %d images could not be predicted (listed above); %s holds the others",
                         len(self.failed), len(failed) + len(by_image), output_path)
