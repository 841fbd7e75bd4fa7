"""The training system's settings besides the model and its recipe, as records: how the model runs
(:class:`RuntimeOptions`: ``model.runtime.*``) and how it is evaluated (:class:`EvaluationOptions`:
``model.evaluation.*``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class RuntimeOptions:
    """How the model runs in training: the same numbers up to float rounding, another speed.

    Args:
        channels_last: run the backbone in NHWC memory layout, which oneDNN (CPU) and cuDNN prefer
            (benchmarks/convergence.py --step-time measures the speed).
        fold_batch_norm: fold the backbone's frozen BatchNorms into their convolutions in training's forward and
            backward (:meth:`detr.models.detector.Detector.use_folded_batch_norm`): the same losses and gradients up
            to float rounding, the state dict unchanged; on by default (docs/measurements/speed.md, "Training step
            against the authors"); a model without frozen BatchNorms has nothing to fold.
        backbone_bf16: run the backbone's convolutions in bfloat16 autocast, the transformer in float32
            (:meth:`detr.models.detector.Detector.use_autocast`): for CPUs with AMX / AVX512-BF16, where Lightning's
            ``bf16-mixed`` would also put attention in bfloat16, whose CPU backward is slow. Not needed on GPUs (use
            ``precision: bf16-mixed``). The weights stay float32, and :func:`detr.load_checkpoint` runs them in
            float32.
    """

    channels_last: bool = False
    fold_batch_norm: bool = True
    backbone_bf16: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class EvaluationOptions:
    """How validation and test evaluate the model (:class:`detr.lightning.evaluation.EvaluationSchedule`).

    Args:
        evaluator_backend: "auto" (faster_coco_eval where installed, else pycocotools; the log says which ran),
            "pycocotools" (the reference) or "faster_coco_eval" (the same numbers, seconds instead of minutes on
            COCO val: docs/measurements/evaluation.md).
        evaluation_dir: where each COCO evaluation writes its per-class AP table and COCO results json (default:
            ``<trainer.log_dir>/evaluation``; "" disables writing).
        error_analysis: after ``detr validate`` / ``detr test``, write an error analysis (per-class AP, PR curves,
            confusion matrix, TIDE's AP lost per error type, worst cases) as
            ``<evaluation_dir>/<stage>_analysis/report.html`` and log its figures to TensorBoard
            (:mod:`detr.lightning.error_analysis`).
        error_analysis_every_n_validations: in ``detr fit``, also after every N-th validation (0: never; it adds
            the figures' time to a validation).
    """

    evaluator_backend: Literal["auto", "pycocotools", "faster_coco_eval"] = "auto"
    evaluation_dir: str | None = None
    error_analysis: bool = True
    error_analysis_every_n_validations: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


__all__ = ["EvaluationOptions", "RuntimeOptions"]
