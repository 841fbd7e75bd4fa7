"""COCO evaluation in the training systems' validation and test: when it runs, what it logs and writes, and when
the error analysis follows.

:class:`EvaluationSchedule` holds the system's evaluation settings; each validation or test epoch it opens a
:class:`detr.evaluation.coco_evaluator.CocoEvaluator` on the data module's ground truth (:meth:`start`), and
at the end (:meth:`finish`) logs the seven COCO statistics (rank 0's numbers on every process), writes the
per-class table and the results json to the evaluation directory and, when asked, the error analysis
(:func:`detr.lightning.error_analysis.write_error_analysis`). The systems feed the evaluator their
post-processed detections in between.

A model that predicts masks is also scored on them, when its ground truth has them (:meth:`start_masks`: the
json's ``segmentation`` of every annotation): a second evaluator with ``iou_type="segm"``, whose statistics are
logged as ``{stage}/mask_AP``, ``{stage}/mask_AP50`` ... beside the boxes' and whose files are
``{stage}_mask_predictions.json`` (COCO "segm" results: RLE ``segmentation``, no ``bbox``, so that pycocotools
reads each detection's area from its mask, as this evaluation does), ``{stage}_mask_metrics.json`` and
``{stage}_mask_per_class_ap.txt``.

A keypoint model is also scored on its keypoints, when its ground truth's categories name them
(:meth:`start_keypoints`): an evaluator with ``iou_type="keypoints"`` (OKS AP, pycocotools), whose ten statistics
are logged as ``{stage}/keypoint_AP`` ... and whose files start ``{stage}_keypoint_``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning as L

from detr.categories import CategoryMap
from detr.evaluation import STAT_NAMES, CocoEvaluation, CocoEvaluator, resolve_backend
from detr.evaluation.keypoints import KEYPOINT_STAT_NAMES
from detr.lightning.error_analysis import write_error_analysis

logger = logging.getLogger(__name__)


def evaluation_dataset(trainer: L.Trainer | None, stage: str) -> Any:
    """The data module's data set of ``stage`` (its validation set where it has none), or None."""
    datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
    return getattr(datamodule, f"{stage}_dataset", None) or getattr(datamodule, "val_dataset", None)


class EvaluationSchedule:
    """A training system's COCO evaluation settings, and the count of its fit's validations.

    Args:
        backend: the COCOeval library ("auto", "pycocotools", "faster_coco_eval": :class:`CocoEvaluator`).
        directory: where each evaluation writes its per-class AP table and results json (None: the trainer's
            ``log_dir``/evaluation; "": nowhere).
        error_analysis: after ``validate`` / ``test``, also write the error analysis.
        every_n_validations: in ``fit``, write it after every N-th validation (0: never).
    """

    def __init__(self, *, backend: str = "auto", directory: str | None = None, error_analysis: bool = True,
                 every_n_validations: int = 0) -> None:
        self.backend = backend
        self.directory = directory
        self.error_analysis = error_analysis
        self.every_n_validations = every_n_validations
        self.fit_validations = 0
        self._said_no_masks = False

    def announce(self, trainer: L.Trainer) -> None:
        """Resolve the backend now (a missing package fails at setup, not after an epoch) and log it."""
        backend = resolve_backend(self.backend)
        if trainer.is_global_zero:
            logger.info("COCO evaluation on %s (evaluator_backend %r), once on rank 0 of %d process(es)",
                        backend, self.backend, trainer.world_size)

    def start(self, trainer: L.Trainer, stage: str, category_map: CategoryMap | None) -> CocoEvaluator | None:
        """A fresh evaluator on the ground truth of ``stage``'s data set (``.coco``), or None without one."""
        coco_gt = getattr(evaluation_dataset(trainer, stage), "coco", None)
        if coco_gt is None:
            logger.warning("no COCO ground truth (datamodule.%s_dataset.coco): losses only, no AP", stage)
            return None
        show_progress = trainer.progress_bar_callback is not None and trainer.is_global_zero
        return CocoEvaluator(coco_gt, category_map=category_map, backend=self.backend, progress=show_progress)

    def start_masks(self, trainer: L.Trainer, stage: str, category_map: CategoryMap | None) -> CocoEvaluator | None:
        """A fresh mask evaluator (COCOeval "segm") on the ground truth of ``stage``'s data set, or None when it
        has none or some annotation lacks its ``segmentation`` (said once a run)."""
        coco_gt = getattr(evaluation_dataset(trainer, stage), "coco", None)
        if coco_gt is None:
            return None
        annotations = coco_gt.dataset.get("annotations", [])
        missing = sum(1 for annotation in annotations if not annotation.get("segmentation"))
        if missing:
            if not self._said_no_masks and trainer.is_global_zero:
                logger.warning("the model predicts masks, but %d of the %d annotations of the %s ground truth have "
                               "no segmentation: box AP only (give every annotation its polygons or RLE for mask "
                               "AP)", missing, len(annotations), stage)
            self._said_no_masks = True
            return None
        show_progress = trainer.progress_bar_callback is not None and trainer.is_global_zero
        return CocoEvaluator(coco_gt, iou_type="segm", category_map=category_map, backend=self.backend,
                             progress=show_progress)

    def start_keypoints(self, trainer: L.Trainer, stage: str, category_map: CategoryMap | None
                        ) -> CocoEvaluator | None:
        """A fresh keypoint evaluator (COCOeval "keypoints", OKS AP on pycocotools) on the ground truth of
        ``stage``'s data set, or None when it has none or no category names keypoints."""
        coco_gt = getattr(evaluation_dataset(trainer, stage), "coco", None)
        if coco_gt is None or not any(category.get("keypoints") for category in coco_gt.dataset.get("categories", [])):
            return None
        show_progress = trainer.progress_bar_callback is not None and trainer.is_global_zero
        return CocoEvaluator(coco_gt, iou_type="keypoints", category_map=category_map, progress=show_progress)

    def finish(self, module: L.LightningModule, stage: str, evaluator: CocoEvaluator) -> CocoEvaluation:
        """Compute (every process), log ``{stage}/AP`` ... (masks: ``{stage}/mask_AP`` ...) on every process, and
        on rank 0 log the tables, write the evaluation's files and, when due, the error analysis (of boxes). The
        returned evaluation keeps no COCOeval (its per-image matches are large)."""
        trainer = module.trainer
        boxes = evaluator.iou_type == "bbox"
        kind = {"bbox": "", "segm": "mask_", "keypoints": "keypoint_"}[evaluator.iou_type]
        # the detections of every process go to rank 0 once, rank 0 evaluates, every rank gets its stats
        evaluation = evaluator.compute()
        for name in KEYPOINT_STAT_NAMES if evaluator.iou_type == "keypoints" else STAT_NAMES:
            # the values are rank 0's everywhere: the max over processes keeps them exact where a mean could round
            module.log(f"{stage}/{kind}{name}", evaluation.stats[name], prog_bar=boxes and name == "AP",
                       sync_dist=True, reduce_fx="max")
        if trainer.sanity_checking or not trainer.is_global_zero:
            evaluation.coco_eval = None
            return evaluation
        logger.info(
            "%s COCO %s evaluation at epoch %d (%d images):\n%s\n%s\n%s", stage,
            {"bbox": "box", "segm": "mask", "keypoints": "keypoint"}[evaluator.iou_type],
            module.current_epoch, len(evaluation.image_ids), evaluation.summary, evaluation.stats_table(),
            evaluation.per_class_table(),
        )
        directory = self.output_directory(trainer)
        if directory is not None:
            evaluation.write(directory, prefix=f"{stage}_{kind}")
            if boxes and self.wants_error_analysis(trainer):
                try:
                    write_error_analysis(trainer, stage, evaluation, evaluator.coco_gt, directory)
                except Exception:  # a figure that fails to draw must not end a training run
                    logger.exception("%s error analysis failed; the evaluation itself is complete", stage)
        evaluation.coco_eval = None
        return evaluation

    def wants_error_analysis(self, trainer: L.Trainer) -> bool:
        """After ``validate`` / ``test`` when ``error_analysis``; in fit after every ``every_n_validations``-th
        validation (sanity checks not counted)."""
        if trainer.state.fn != "fit":
            return bool(self.error_analysis)
        self.fit_validations += 1
        return self.every_n_validations > 0 and self.fit_validations % self.every_n_validations == 0

    def output_directory(self, trainer: L.Trainer) -> Path | None:
        if self.directory == "":
            return None
        if self.directory:
            return Path(self.directory)
        return Path(trainer.log_dir) / "evaluation" if trainer.log_dir else None
