"""The panoptic training system: the authors' two-stage recipe (paper §4.4) as a LightningModule.

1. Box stage (``masks=False``): the detector alone, trained like :class:`DetrSystem` on every panoptic
   segment's box and class, things and stuff (:class:`detr.lightning.panoptic_datamodule.PanopticDataModule`).
2. Mask stage (``masks=True``, the default): :class:`detr.models.segmentation.DETRPanoptic` starts from the
   box stage's checkpoint (``init_checkpoint``), the detector frozen (``freeze_detr``), and only the mask
   head trains, with focal and DICE losses on the matched queries' masks beside the box losses
   (:class:`detr.loss.masks.MaskLoss`, a part of the criterion :func:`detr.loss.build.build_criterion`
   builds). The authors trained it 25 epochs, the learning rate dropped at 15.

Validation adds, in the mask stage, panoptic quality (:class:`detr.inference.postprocess_masks.PostProcessPanoptic`
→ :class:`detr.evaluation.panoptic.PanopticQuality`: ``val/PQ``, ``val/SQ``, ``val/RQ``, ``val/PQ_th``,
``val/PQ_st``) and mask AP (:class:`detr.inference.postprocess_masks.PostProcessMasks` → the box AP's
:class:`detr.evaluation.coco_evaluator.CocoEvaluator` with ``iou_type="segm"``, on ground truth from the PNGs;
logged as every system's mask AP: ``val/mask_AP``, ``val/mask_AP50`` ...) to the box AP every stage logs. Checkpoints load
with :func:`detr.load_checkpoint` (a :class:`DETRPanoptic` with its category map and ``is_thing``).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import torch
from torch import nn

from detr.categories import CategoryMap
from detr.checkpoints import read_checkpoint
from detr.checkpoints.formats import key_mismatch
from detr.checkpoints.panoptic import is_panoptic_state_dict
from detr.evaluation.coco_evaluator import CocoEvaluator, masks_to_rle
from detr.evaluation.gather import on_rank_zero
from detr.evaluation.panoptic import PanopticQuality, format_panoptic_table
from detr.inference.postprocess_masks import PostProcessMasks, PostProcessPanoptic
from detr.inference.prediction import Prediction
from detr.lightning.evaluation import evaluation_dataset
from detr.lightning.options import EvaluationOptions, RuntimeOptions
from detr.lightning.system import DetrSystem, _model_config
from detr.loss.build import build_criterion
from detr.models.detr_family import DetrConfig
from detr.models.outputs import DetectorOutput
from detr.models.recipe import LossRecipe, OptimizerRecipe
from detr.models.segmentation import DETRPanoptic

logger = logging.getLogger(__name__)


class PanopticSystem(DetrSystem):
    """DETR for panoptic segmentation, either stage of the authors' recipe (module docstring).

    One entry per argument, in the form LightningCLI reads (``detr-panoptic fit --help``); :class:`DetrSystem`'s
    arguments all apply too.

    Args:
        masks: False for the box stage (the plain detector), True for the mask stage.
        freeze_detr: in the mask stage, keep every detector weight (and batch-norm statistic) fixed, as
            the authors did; only ``bbox_attention`` and ``mask_head`` train. A frozen detector with
            training-only queries or heads (denoising, query groups, the dense head) runs in eval mode: they
            would cost time for losses without gradients, and the mask head learns on the queries that
            inference decodes. (The authors' frozen detector kept its dropout; this one keeps it too when
            it has no such parts.)
        panoptic_threshold: class score a query needs to enter the panoptic segmentation (0.85, the authors'
            softmax probability; a sigmoid head's focal scores run lower: the shapes demo uses 0.2).
        panoptic_overlap_threshold: None (the authors' rules) or Mask2Former's overlap filter (0.8): a thing
            query that keeps less than this share of its own mask is dropped, so that two queries on one
            object do not split it (:class:`PostProcessPanoptic`). Both settings are saved in the
            checkpoint, and :class:`detr.Predictor` and ``detr-predict`` use them by default.
        mask_ap: also compute mask AP (COCOeval "segm") in validation.
        categories: the data set's categories with ``id`` and ``isthing`` (linked from the data module by
            the CLI); they decide things and stuff for post-processing and PQ.
        init_checkpoint: in the mask stage the box stage's checkpoint (or a panoptic checkpoint to continue
            from), loaded strictly; in the box stage the weights to start from, as in ``detr fit``.
        detr: the detector, a :class:`detr.models.detr_family.DetrConfig` (``--model.detr.*``), as in ``detr fit``.
        loss, optimizer, runtime, evaluation, category_map, init_classes: as :class:`DetrSystem`'s; the mask
            stage's mask loss weights are the loss recipe's ``loss_mask`` (focal) and ``loss_dice`` (DICE; authors:
            1 and 1).
    """

    def __init__(
        self,
        *,
        masks: bool = True,
        freeze_detr: bool = True,
        panoptic_threshold: float = 0.85,
        panoptic_overlap_threshold: float | None = None,
        mask_ap: bool = True,
        categories: list[dict[str, Any]] | None = None,
        init_checkpoint: str | None = None,
        detr: DetrConfig | dict[str, Any] = DetrConfig(),  # frozen: a shared default is safe
        loss: LossRecipe = LossRecipe(),  # every field None: the family's
        optimizer: OptimizerRecipe = OptimizerRecipe(),
        runtime: RuntimeOptions = RuntimeOptions(),
        evaluation: EvaluationOptions = EvaluationOptions(),
        category_map: CategoryMap | dict[str, Any] | None = None,
        init_classes: Literal["by_name", "by_label", "fresh"] = "by_name",
    ) -> None:
        config = _model_config(detr)
        if not isinstance(config, DetrConfig):
            raise ValueError(f"model.detr: the panoptic mask head sits on the paper's DETR (family 'detr'), got "
                             f"family {config.family!r}")
        if init_checkpoint:  # every detector tensor comes from it: no ImageNet download
            config = config.replace(pretrained_backbone=False)
        # the mask stage loads init_checkpoint itself, strictly: a frozen detector must not keep any
        # freshly initialised tensor, and a panoptic checkpoint also holds the mask head
        super().__init__(detr=config, loss=loss, optimizer=optimizer, runtime=runtime, evaluation=evaluation,
                         category_map=category_map, init_checkpoint=None if masks else init_checkpoint,
                         init_classes=init_classes)
        # (DetrSystem's save_hyperparameters also records this class's arguments, the real init_checkpoint)
        self.postprocess_masks = PostProcessMasks() if masks else None
        self.postprocess_panoptic: PostProcessPanoptic | None = None
        if masks:
            self.model = DETRPanoptic(self.model)
            self.model.meta = self.model.meta.replace(panoptic_threshold=float(panoptic_threshold),
                                                      panoptic_overlap_threshold=panoptic_overlap_threshold)
            if init_checkpoint:
                self._load_mask_stage_weights(init_checkpoint)
            if freeze_detr:
                self.model.detr.requires_grad_(False)
                self._fix_frozen_detector()
            self.criterion = build_criterion(config, self.recipe.loss, masks=True, training_only_parts=not freeze_detr)
        self._use_categories(categories)
        self._panoptic: PanopticQuality | None = None
        self.last_panoptic: dict[str, Any] | None = None


    def _use_categories(self, categories: list[dict[str, Any]] | None) -> None:
        """Set ``categories``, ``is_thing`` and, in the mask stage, the panoptic post-processing they decide."""
        self.categories = [dict(c) for c in categories] if categories is not None else None
        self.is_thing = self._is_thing()
        if not self.model.predicts_masks:
            return
        self.model.meta = self.model.meta.replace(category_map=self.category_map)
        if self.is_thing is not None:
            self.model.meta = self.model.meta.replace(is_thing=tuple(self.is_thing))
            self.postprocess_panoptic = PostProcessPanoptic(
                self.is_thing, threshold=self.hparams.panoptic_threshold, class_head=self.detector.class_head,
                category_ids=None if self.category_map is None else self.category_map.category_ids,
                overlap_threshold=self.hparams.panoptic_overlap_threshold)

    def _is_thing(self) -> list[bool] | None:
        if self.categories is None:
            return None
        thing_ids = {int(c["id"]) for c in self.categories if c.get("isthing")}
        if self.category_map is None:
            return [label in thing_ids for label in range(self.detector.num_classes)]
        return [category_id in thing_ids for category_id in self.category_map.category_ids]

    def _load_mask_stage_weights(self, path: str) -> None:
        contents = read_checkpoint(path)
        panoptic = is_panoptic_state_dict(contents.state_dict)
        target = self.model if panoptic else self.model.detr
        if contents.meta.category_map is not None and self.category_map is not None and \
                contents.meta.category_map != self.category_map:
            raise ValueError(f"init_checkpoint {path} was trained on other categories than this data set's "
                             f"({contents.meta.category_map.num_classes} vs {self.category_map.num_classes} classes, "
                             "or other ids/names): train the box stage on the same panoptic json")
        try:
            missing, unexpected = target.load_state_dict(contents.state_dict, strict=False)
        except RuntimeError as error:  # shapes: another backbone, width or number of classes
            raise ValueError(f"init_checkpoint {path} does not fit the panoptic model: {error}. Set the model "
                             "arguments (backbone, hidden_dim, layers, num_queries) to the box stage's") from error
        if missing or unexpected:
            raise ValueError(
                f"init_checkpoint {path} does not fit the {'panoptic model' if panoptic else 'detector'}: "
                f"{key_mismatch(missing, unexpected)}; the mask stage starts from the box stage's checkpoint "
                "(masks: false) or a panoptic checkpoint")
        logger.info("init_checkpoint: loaded the %s from %s", "panoptic model" if panoptic else "detector", path)

    # ------------------------------------------------------------------ training
    def _fix_frozen_detector(self) -> None:
        """A frozen detector's batch norms run in eval mode, so that their statistics stay fixed too (the
        authors' FrozenBatchNorm2d has none that could move); one with training-only parts runs wholly in
        eval mode (see ``freeze_detr``)."""
        if not (self.model.predicts_masks and self.hparams.freeze_detr):
            return
        detector = self.model.detr
        config = detector.config
        if config.denoising or config.query_groups > 1 or config.dense_aux_head:
            detector.eval()
            return
        for module in detector.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.eval()

    def train(self, mode: bool = True) -> PanopticSystem:
        super().train(mode)
        if mode:
            self._fix_frozen_detector()
        return self

    def on_train_epoch_start(self) -> None:
        self._fix_frozen_detector()  # Lightning restores each module's own mode after validation

    # ------------------------------------------------------------------ evaluation
    def _start_evaluation(self, stage: str) -> None:
        super()._start_evaluation(stage)
        self._panoptic = PanopticQuality(self.categories) if self.postprocess_panoptic is not None else None

    def _start_mask_evaluation(self, stage: str) -> CocoEvaluator | None:
        """Mask AP on the panoptic PNGs' segments, given image by image (:meth:`_add_segm`)."""
        if self.postprocess_masks is None or not self.hparams.mask_ap or not self._panoptic_ground_truth(stage):
            return None
        return CocoEvaluator(iou_type="segm", categories=self.categories or [], category_map=self.category_map,
                             backend=self.evaluation.backend)

    def _panoptic_ground_truth(self, stage: str) -> Any:
        dataset = evaluation_dataset(self._trainer, stage)
        if dataset is None or not hasattr(dataset, "ground_truth"):
            return None
        return dataset

    def _score_outputs(self, stage: str, outputs: DetectorOutput, targets: list[dict[str, Any]],
                       detections: list[dict[str, torch.Tensor]], orig_sizes: torch.Tensor) -> None:
        """PQ and mask AP of the batch, beside DetrSystem's box AP."""
        image_ids = [int(t["image_id"]) for t in targets]
        dataset = self._panoptic_ground_truth(stage)
        if outputs.masks is not None and dataset is not None:
            processed_sizes = torch.stack([t["size"] for t in targets])
            ground_truth = [dataset.ground_truth(dataset.index_of_image(i)) for i in image_ids]
            if self._panoptic is not None:
                panoptic = self.postprocess_panoptic(outputs, processed_sizes, orig_sizes)
                for (gt_ids, gt_segments), result in zip(ground_truth, panoptic):
                    self._panoptic.update(gt_ids, gt_segments, result["id_map"].cpu(), result["segments_info"])
            if self.mask_evaluator is not None:
                masks = self.postprocess_masks(outputs, processed_sizes, orig_sizes)
                self._add_segm(image_ids, ground_truth, masks, detections)

    def _add_segm(self, image_ids: list[int], ground_truth: list[Any], masks: list[torch.Tensor],
                  detections: list[dict[str, torch.Tensor]]) -> None:
        """The batch's ground-truth segments (as COCO RLE annotations) and predicted masks to the mask evaluator."""
        images, annotations = [], []
        for image_id, (gt_ids, gt_segments) in zip(image_ids, ground_truth):
            height, width = gt_ids.shape
            images.append({"id": image_id, "height": int(height), "width": int(width)})
            gt_ids = torch.from_numpy(gt_ids)
            segment_masks = torch.stack([gt_ids == int(s["id"]) for s in gt_segments]) if gt_segments else None
            annotations.append([
                {"image_id": image_id, "category_id": int(segment["category_id"]), "segmentation": rle,
                 "area": float(segment["area"]), "bbox": list(segment["bbox"]), "iscrowd": int(segment.get("iscrowd", 0))}
                for segment, rle in zip(gt_segments, masks_to_rle(segment_masks) if gt_segments else [])])
        self.mask_evaluator.add_ground_truth(images, annotations)
        self.mask_evaluator.update(image_ids, [dict(detection, masks=image_masks)
                                                for detection, image_masks in zip(detections, masks)])

    def _finish_evaluation(self, stage: str) -> None:
        super()._finish_evaluation(stage)
        if self._panoptic is not None:  # every rank's statistics summed on rank 0, PQ computed there once
            results = on_rank_zero(self._panoptic, _panoptic_quality, what="panoptic quality")
            if results is not None:
                self.last_panoptic = results
                for name, value in (("PQ", results["All"]["pq"]), ("SQ", results["All"]["sq"]),
                                    ("RQ", results["All"]["rq"]), ("PQ_th", results["Things"]["pq"]),
                                    ("PQ_st", results["Stuff"]["pq"])):
                    self.log(f"{stage}/{name}", value, prog_bar=name == "PQ", sync_dist=False)
                if self._trainer is None or self.trainer.is_global_zero:
                    logger.info("%s panoptic quality at epoch %d:\n%s", stage, self.current_epoch,
                                format_panoptic_table(results))

    # ------------------------------------------------------------------ prediction
    def predict_step(self, batch: Any, batch_idx: int) -> list[Prediction]:
        """:meth:`DetrSystem.predict_step`'s predictions; in the mask stage each also holds its
        :attr:`~detr.inference.prediction.Prediction.panoptic` segmentation (:class:`PostProcessPanoptic`; the
        data's ``categories`` must be known, from the json or the checkpoint), which
        :class:`detr.lightning.panoptic_writer.PanopticPredictionsWriter` writes as COCO panoptic PNGs and json."""
        images, padding_mask, targets = batch
        outputs = self(images, padding_mask)
        if outputs.masks is not None and self.postprocess_panoptic is None:
            raise ValueError("panoptic prediction needs the data set's categories (things and stuff): they come "
                             "from the panoptic json or from a mask-stage checkpoint (--ckpt_path)")
        return self._predictions(outputs, targets, panoptic=self.postprocess_panoptic if outputs.masks is not None
                                 else None)

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """DetrSystem's ``checkpoint["detr"]`` plus ``is_thing`` per label, the data set's ``categories`` and,
        in the mask stage, ``panoptic_postprocess`` (the panoptic threshold and overlap filter)."""
        super().on_save_checkpoint(checkpoint)
        checkpoint["detr"]["is_thing"] = self.is_thing
        checkpoint["detr"]["categories"] = self.categories
        if self.model.predicts_masks:
            checkpoint["detr"]["panoptic_postprocess"] = self.model.meta.to_dict()["panoptic_postprocess"]

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """DetrSystem's, and the checkpoint's ``categories`` where no data set linked them (``detr-panoptic
        predict`` on plain images)."""
        super().on_load_checkpoint(checkpoint)
        categories = (checkpoint.get("detr") or {}).get("categories")
        if self.categories is None and categories:
            self._use_categories(categories)


def _panoptic_quality(per_process: list[PanopticQuality]) -> dict[str, Any] | None:
    """PQ of every process's statistics summed (None when no process saw an image)."""
    return PanopticQuality.merged(per_process).compute() if sum(m.num_images for m in per_process) else None


__all__ = ["PanopticSystem"]
