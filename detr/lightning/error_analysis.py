"""The error analysis after an evaluation of the training system: the HTML report in the evaluation
directory and the figures in TensorBoard.

:class:`detr.lightning.system.DetrSystem` calls :func:`write_error_analysis` after ``detr validate`` and
``detr test`` (``error_analysis``), and in ``detr fit`` after every N-th validation when
``error_analysis_every_n_validations`` asks for it. It reuses the COCOeval of the evaluation where that
was pycocotools' (its per-image matches), so the analysis adds a fraction of the evaluation's time plus the
figures; after faster-coco-eval, which keeps no per-image matches, it runs pycocotools' evaluation of the
results once more (minutes on COCO val: docs/measurements/evaluation.md).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning as L

from detr.evaluation import CocoEvaluation
from detr.evaluation.analysis import analyze
from detr.evaluation.tide import ERROR_TYPES
from detr.visualize.analysis_report import analysis_figures, write_analysis_report

logger = logging.getLogger(__name__)


def _tensorboard_experiments(trainer: L.Trainer) -> list[Any]:
    from lightning.pytorch.loggers import TensorBoardLogger

    return [lg.experiment for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]


def _images_dir(trainer: L.Trainer, stage: str) -> Path | None:
    datamodule = getattr(trainer, "datamodule", None)
    dataset = getattr(datamodule, f"{stage}_dataset", None) or getattr(datamodule, "val_dataset", None)
    images_dir = getattr(dataset, "images_dir", None)
    return Path(images_dir) if images_dir is not None else None


def write_error_analysis(
    trainer: L.Trainer, stage: str, evaluation: CocoEvaluation, coco_gt: Any, directory: Path
) -> Path | None:
    """Analyse ``evaluation`` (its COCOeval when it kept one, else its results json) against ``coco_gt``,
    write ``directory/<stage>_analysis/report.html`` with its figures, and add the figures and the dAP
    per error type to every TensorBoard logger (tags ``<stage>_analysis/...``). Returns the page, or
    None without evaluated images. Call it on the global-zero process only."""
    if not evaluation.image_ids:
        return None
    analysis = analyze(coco_gt, evaluation.results, coco_eval=evaluation.coco_eval, image_ids=evaluation.image_ids)
    figures = analysis_figures(analysis)
    step = trainer.global_step
    for experiment in _tensorboard_experiments(trainer):
        for name, figure in figures.items():
            experiment.add_figure(f"{stage}_analysis/{name}", figure, global_step=step, close=False)
        for error_type in ERROR_TYPES:
            experiment.add_scalar(f"{stage}_analysis/dAP50_{error_type}", analysis.errors.delta_ap[error_type], step)
    page = write_analysis_report(
        analysis, directory / f"{stage}_analysis", images_dir=_images_dir(trainer, stage), figures=figures,
        title=f"{stage} error analysis, epoch {trainer.current_epoch}, step {step}",
    )
    logger.info("%s error analysis (%s):\n%s", stage, page, analysis.summary_text())
    return page
