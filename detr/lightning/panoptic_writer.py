"""``detr-panoptic predict``'s output: the detection json plus COCO panoptic PNGs and json.

:class:`PanopticPredictionsWriter` is :class:`detr.lightning.callbacks.PredictionsWriter` (``predictions.json``)
that also writes, for a mask model's predictions (:meth:`PanopticSystem.predict_step`'s ``panoptic``), each
image's PNG as ``panoptic/<image name>.png`` and ``panoptic.json`` beside ``predictions.json``: the layout
``tools/predict.py --task panoptic`` writes, by the same functions (:func:`detr.panoptic_io.
write_panoptic_predictions`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning as L
import torch.distributed as dist

from detr.lightning.callbacks import PredictionsWriter
from detr.panoptic_io import write_panoptic_predictions
from detr.predictions_io import unique_file_names
from detr.predictor import PanopticSegmentation, select_detections

logger = logging.getLogger(__name__)


class PanopticPredictionsWriter(PredictionsWriter):
    """:class:`PredictionsWriter` plus the panoptic PNGs and json (module docstring).

    Args: those of :class:`PredictionsWriter`; ``output_path`` names ``predictions.json``, and the panoptic
    outputs go into its folder. ``panoptic_json`` is the written json after a run (None without masks).
    """

    def __init__(self, output_path: str | None = None, score_threshold: float = 0.0) -> None:
        super().__init__(output_path=output_path, score_threshold=score_threshold)
        self.panoptic_json: Path | None = None

    def write_on_epoch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, predictions: Any, batch_indices: Any
    ) -> None:
        super().write_on_epoch_end(trainer, pl_module, predictions, batch_indices)
        flat = [item for batch in predictions for item in batch]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, flat)
            flat = [item for part in gathered for item in part]
        if not trainer.is_global_zero:
            return
        items: dict[int, dict[str, Any]] = {}
        for item in flat:  # each image once (the distributed sampler repeats images); unreadable ones left out
            if item.get("panoptic") is not None and item.get("error") is None:
                items.setdefault(item["image_id"], item)
        if not items:
            return
        category_map = getattr(pl_module, "category_map", None)
        chosen = list(items.values())
        names = unique_file_names([Path(item["file_name"] or f"{item['image_id']}.png") for item in chosen])
        finished = []
        for item in chosen:
            prediction = select_detections(item, image_size=tuple(item["orig_size"]), category_map=category_map,
                                           threshold=self.score_threshold, file_name=item.get("file_name"),
                                           image_id=item["image_id"])
            prediction.panoptic = PanopticSegmentation(item["panoptic"]["id_map"], item["panoptic"]["segments_info"])
            finished.append(prediction)
        output_path = Path(self.output_path) if self.output_path else \
            Path(trainer.log_dir or trainer.default_root_dir) / "predictions.json"
        self.panoptic_json = write_panoptic_predictions(
            output_path.parent, finished, [f"{Path(name).stem}.png" for name in names],
            category_map, getattr(pl_module, "is_thing", None))
