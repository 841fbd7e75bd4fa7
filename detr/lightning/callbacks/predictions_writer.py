"""``detr predict``'s writer: one COCO results json with file names, the format of ``detr-predict``."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import BasePredictionWriter

from detr.evaluation.gather import gather_to_rank_zero
from detr.inference.outputs import PREDICTION_FILES, assign_image_ids, write_predictions_json
from detr.inference.prediction import Prediction
from detr.lightning.run_folder import open_csv_logs
from detr.output_folder import OutputFolder, claim_output_folder

logger = logging.getLogger(__name__)


class PredictionsWriter(BasePredictionWriter):
    """Write what ``detr predict`` predicted as one COCO results json (``image_id``, ``file_name``,
    ``category_id`` in the data set's ids, ``bbox`` pixel xywh, ``score``), the same format as
    ``detr-predict`` (:func:`detr.inference.outputs.write_predictions_json`).

    Args:
        output_path: the json file (parents created); default ``predictions.json`` in ``trainer.log_dir`` (the
            ``detr`` CLI: ``<trainer.default_root_dir>/predict/``), else in ``trainer.default_root_dir``.
        score_threshold: keep detections scoring above it (0: every query, as COCO evaluation wants).
        overwrite: replace the outputs of an earlier run in that folder (``detr predict --overwrite_run true``
            sets it); without it such a folder is refused before anything is predicted.

    The json's folder belongs to one run (:func:`detr.output_folder.claim_output_folder`, held from setup to
    teardown): a second ``detr predict`` into it is refused while this one runs, and afterwards unless it
    overwrites. Image ids are those of ``detr-predict`` (:func:`detr.inference.outputs.assign_image_ids`:
    COCO's ids for numbered file names, else 1, 2, ... in file order).

    Under DDP the processes' predictions are gathered and written once, each image once.

    An image that could not be read or resized, or whose predictions are not finite (NaN weights), is
    logged and left out; the rest is written, and ``failed`` lists ``(file name, reason)`` (``detr
    predict`` then exits with status 1).
    """

    def __init__(self, output_path: str | None = None, score_threshold: float = 0.0, overwrite: bool = False) -> None:
        super().__init__(write_interval="epoch")
        self.output_path = output_path
        self.score_threshold = score_threshold
        self.overwrite = overwrite
        self.failed: list[tuple[str, str]] = []
        self.folder: OutputFolder | None = None  # the claimed folder, while predicting
        self._claim = contextlib.ExitStack()

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "predict" or not trainer.is_global_zero:
            return
        self.folder = self._claim.enter_context(claim_output_folder(
            self.output_file(trainer).parent, overwrite=self.overwrite,
            overwrite_flag="--overwrite_run true (PredictionsWriter(overwrite=True))",
            elsewhere="--trainer.default_root_dir, or the writer's output_path", markers=PREDICTION_FILES))
        open_csv_logs(trainer)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.folder = None
        self._claim.close()

    def record(self, path: Path) -> Path:
        """Note ``path`` in the claimed folder's manifest before writing it (as is outside a claim)."""
        return self.folder.record(path) if self.folder is not None else path

    def write_on_epoch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, predictions: Any, batch_indices: Any
    ) -> None:
        flat = [item for batch in predictions for item in batch]  # one dataloader: list of batch outputs
        gathered = gather_to_rank_zero(flat)  # every process's predictions, on rank 0 (None elsewhere)
        if gathered is not None:
            self.write(trainer, pl_module, [item for part in gathered for item in part])

    def output_file(self, trainer: L.Trainer) -> Path:
        """Where ``predictions.json`` goes (see ``output_path``)."""
        return Path(self.output_path or Path(trainer.log_dir or trainer.default_root_dir) / "predictions.json")

    def write(self, trainer: L.Trainer, pl_module: L.LightningModule, items: list[Prediction]
              ) -> dict[int, Prediction]:
        """Write every process's predictions (on rank 0; ``image_id``: the data set index); returns the written
        ones by that index (each image once, those above ``score_threshold``; the failed ones, with their
        ``error``, left out), for subclasses that write more of them."""
        category_map = pl_module.category_map
        by_image: dict[int, Prediction] = {}
        failed: dict[int, tuple[str, str]] = {}
        for prediction in items:
            index = prediction.image_id
            if index in by_image or index in failed:  # the distributed sampler repeats images
                continue
            if prediction.error is not None:
                failed[index] = (str(prediction.file_name), prediction.error)
                continue
            by_image[index] = prediction.above(self.score_threshold)
        # keyed by data set index until here (each image once); written with the ids detr-predict gives
        assign_image_ids([by_image[index] for index in sorted(by_image)])
        output_path = self.record(self.output_file(trainer))
        write_predictions_json(output_path, list(by_image.values()), category_map=category_map)
        self.failed = list(failed.values())
        kept = ("every query (as COCO evaluation wants; detr-predict keeps those above the checkpoint's score "
                "threshold unless --all-queries)" if self.score_threshold <= 0 else
                f"those scoring above {self.score_threshold:g} (PredictionsWriter's score_threshold)")
        logger.info("%s holds %s", output_path.name, kept)
        for file_name, reason in self.failed:
            logger.error("no predictions for %s: %s", file_name, reason)
        if self.failed:
            logger.error("%d of %d images could not be predicted (listed above); %s holds the others",
                         len(self.failed), len(failed) + len(by_image), output_path)
        return by_image
