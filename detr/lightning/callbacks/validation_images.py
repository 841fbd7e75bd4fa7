"""Validation images with their true (green) and predicted (red) boxes and a legend saying which is which, to
TensorBoard and PNG files."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torchvision.ops import box_convert

from detr.categories import CategoryMap
from detr.data.transforms import denormalize
from detr.visualize.drawing import LEGEND_PREDICTED, LEGEND_TRUE, add_legend, draw_detections, save_image

logger = logging.getLogger(__name__)


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
    ORIGINAL image, rescaled here to the drawn image) drawn, and a legend band below it; uint8
    [3, h + band, w]. Images whose short side is below ``min_size`` are enlarged first so that the labels
    stay readable."""
    input_h, input_w = target["size"].tolist()
    image = denormalize(images[index, :, :input_h, :input_w]).cpu()  # unpadded, as the model saw it
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
    drawing = draw_detections(
        image, boxes_xyxy=boxes, labels=detection["labels"][keep], scores=detection["scores"][keep],
        true_boxes_xyxy=true_boxes, true_labels=target.get("labels"), category_map=category_map,
    )
    return add_legend(drawing, [(LEGEND_TRUE, "ground truth"),
                                (LEGEND_PREDICTED, f"prediction (score ≥ {score_threshold:g})")])


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
        for index, (target, detection) in enumerate(zip(targets, outputs["detections"])):
            if len(self._drawn) >= self.num_images:
                break
            drawing = draw_batch_item(images, index, target, detection, score_threshold=self.score_threshold,
                                      category_map=pl_module.category_map, min_size=self.min_size)
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
                save_image(directory / f"{image_id}.png", drawing)
        logger.info("drew %d validation images%s", len(self._drawn), f" into {directory}" if directory else "")
        self._drawn = []

    def images_directory(self, trainer: L.Trainer) -> Path | None:
        """Where the PNGs go: ``output_dir``, else ``<trainer.log_dir>/val_images``, else nowhere."""
        if self.output_dir:
            return Path(self.output_dir)
        return Path(trainer.log_dir) / "val_images" if trainer.log_dir else None


def _tensorboard_writers(trainer: L.Trainer) -> list[Any]:
    from lightning.pytorch.loggers import TensorBoardLogger

    return [lg.experiment for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
