"""``detr-panoptic predict``'s output: the detection json plus COCO panoptic PNGs and json.

:class:`PanopticPredictionsWriter` is :class:`detr.lightning.callbacks.PredictionsWriter` (``predictions.json``)
that also writes, for a mask model's predictions (:meth:`PanopticSystem.predict_step`'s ``panoptic``), each
image's PNG as ``panoptic/<image name>.png`` and ``panoptic.json`` beside ``predictions.json``: the layout
``detr-predict --task panoptic`` writes, by the same functions (:func:`detr.inference.panoptic_outputs.
write_panoptic_predictions`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L

from detr.inference.outputs import unique_file_names
from detr.inference.panoptic_outputs import write_panoptic_predictions
from detr.inference.prediction import Prediction
from detr.lightning.callbacks import PredictionsWriter

logger = logging.getLogger(__name__)


class PanopticPredictionsWriter(PredictionsWriter):
    """:class:`PredictionsWriter` plus the panoptic PNGs and json (module docstring).

    Args: those of :class:`PredictionsWriter`; ``output_path`` names ``predictions.json``, and the panoptic
    outputs go into its folder. ``panoptic_json`` is the written json after a run (None without masks).
    """

    def __init__(self, output_path: str | None = None, score_threshold: float = 0.0, overwrite: bool = False) -> None:
        super().__init__(output_path=output_path, score_threshold=score_threshold, overwrite=overwrite)
        self.panoptic_json: Path | None = None

    def write(self, trainer: L.Trainer, pl_module: L.LightningModule, items: list[Prediction]
              ) -> dict[int, Prediction]:
        written = super().write(trainer, pl_module, items)
        finished = [prediction for prediction in written.values() if prediction.panoptic is not None]
        if not finished:
            return written
        names = unique_file_names([Path(p.file_name or f"{p.image_id}.png") for p in finished])
        self.panoptic_json = write_panoptic_predictions(
            self.output_file(trainer).parent, finished, [f"{Path(name).stem}.png" for name in names],
            pl_module.category_map, pl_module.is_thing, record=self.record)
        return written
