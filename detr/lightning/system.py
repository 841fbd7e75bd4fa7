"""The training system: DETR + Hungarian set loss + COCO evaluation, as a LightningModule.

The model (:func:`detr.build_detr`), the matcher, the criterion and the post-processor are plain modules;
this file only wires them into Lightning's loops, so the model works without Lightning (in a notebook, an
exporter) and the training loop can change without touching it.
The model is one family's config (a :class:`detr.models.config.ModelConfig`: the ``model.detr`` keys of a
LightningCLI YAML, stored in checkpoints); ``num_classes`` (``model.detr.num_classes``) and ``category_map`` are linked from the
data module by the CLI.

The loss and the optimizer are the family's recipe (:mod:`detr.models.recipe`: ``model.loss.*``,
``model.optimizer.*``; DETR's: paper section 4 and appendix A.4, AdamW, lr 1e-4, backbone lr 1e-5, weight decay
1e-4, step decay ×0.1 at ``lr_drop_epochs``); gradient clipping (0.1, global norm) and precision are Trainer
settings in configs/.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from pathlib import Path
from typing import Any, Literal, TypeVar

import lightning as L
import torch

from detr.categories import CategoryMap, class_name_key
from detr.checkpoints import CheckpointError, read_checkpoint
from detr.checkpoints.finetune import check_same_family, class_report, initial_state
from detr.checkpoints.formats import checkpoint_record, key_mismatch
from detr.evaluation import CocoEvaluation, CocoEvaluator
from detr.evaluation.coco_evaluator import scored_detections
from detr.inference.postprocess import PostProcess
from detr.inference.postprocess_keypoints import PostProcessKeypoints
from detr.inference.postprocess_masks import PostProcessMasks, PostProcessPanoptic
from detr.inference.predict import predictions_from_outputs
from detr.inference.prediction import Prediction
from detr.lightning.batch_size import resolve_auto_batch_size
from detr.lightning.callbacks import time_budget_of
from detr.lightning.checkpointing import restore_rng_states, save_rng_states, seed_each_process
from detr.lightning.evaluation import EvaluationSchedule
from detr.lightning.migrate import migrate_hyperparameters
from detr.lightning.options import EvaluationOptions, RuntimeOptions
from detr.lightning.param_groups import parameter_groups
from detr.lightning.schedule import fit_saved_schedulers, follow_this_runs_settings, learning_rate_schedulers
from detr.loss.build import build_criterion
from detr.loss.keypoint_terms import check_keypoint_labels
from detr.models.backbone import PretrainedWeightsError, cpu_has_bfloat16
from detr.models.build import build_detr, recipe_for
from detr.models.config import ModelConfig, ModelMeta
from detr.models.detr_family import DetrConfig
from detr.models.family import config_from_dict
from detr.models.detector import Detector
from detr.models.inputs import InputSpec
from detr.models.outputs import DetectorOutput
from detr.models.recipe import LossRecipe, OptimizerRecipe, Recipe

logger = logging.getLogger(__name__)

#: Queries whose masks are upsampled at once for mask AP (each a float map at the input size).
_MASK_CHUNK = 32

Batch = tuple[torch.Tensor, torch.Tensor, list[dict[str, Any]]]
_Record = TypeVar("_Record", LossRecipe, OptimizerRecipe, RuntimeOptions, EvaluationOptions)


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite; raised instead of writing non-finite weights."""


class SettingError(ValueError):
    """A setting of the run (a command-line flag or YAML key) that cannot work; the message names it and the
    fix. The ``detr`` command prints it as one line (:mod:`detr.lightning.command`)."""


class DetrSystem(L.LightningModule):
    """DETR trained with the Hungarian set loss and evaluated with COCO AP.

    One entry per argument, in the form LightningCLI reads: ``detr fit --help`` shows each as the meaning of
    ``--model.<argument>``.

    Args:
        detr: the detector, a family's config (``--model.detr``: a class such as DFINEConfig, then its fields
            ``--model.detr.*``; default: the paper's
            COCO model), including the options for training from scratch on a short budget (query_type,
            class_head, denoising...; docs/measurements/convergence.md); a dict of its fields where the
            hyperparameters of a checkpoint rebuild the system.
        loss: the matching costs, loss weights and loss terms (:class:`detr.models.recipe.LossRecipe`,
            ``--model.loss.*``); a field left None: the family's authors' (:func:`detr.models.build.recipe_for`).
        optimizer: AdamW's rates and decays and the learning-rate schedule
            (:class:`detr.models.recipe.OptimizerRecipe`, ``--model.optimizer.*``); a field left None: the family's.
            The schedule's warm-up may be a share of the run (``warmup_fraction``), whose step count is the
            trainer's ``max_steps`` (or ``max_epochs`` × batches); ``lr_decay_fraction``'s run may also be bounded by
            :class:`detr.lightning.callbacks.TimeBudget`, which fixes the step count from the step rate early on.
        runtime: how the model runs (:class:`detr.lightning.options.RuntimeOptions`: ``--model.runtime.*``,
            channels_last, fold_batch_norm, backbone_bf16).
        evaluation: how it is evaluated (:class:`detr.lightning.options.EvaluationOptions`:
            ``--model.evaluation.*``, the COCO evaluator's backend, its output folder, the error analysis).
        category_map: label → data set category id and name (a :class:`CategoryMap` or its ``to_dict()``);
            linked from the data module by the CLI (not set by hand); stored in checkpoints.
        init_checkpoint: weights to start from: a released model's name such as "detr-r50" (downloaded on
            first use), the authors' release file, a plain state dict in their layout, this project's
            checkpoint or a Hugging Face DETR directory (whatever :func:`detr.load_checkpoint` reads). The
            class heads' rows follow ``init_classes``; any other tensor whose shape differs from the model's keeps
            its fresh initialisation; every key must match. The ImageNet backbone is then not downloaded. Not
            read when ``--ckpt_path`` gives the weights; read again whenever the system is rebuilt from its
            hyperparameters (``load_from_checkpoint``: pass ``init_checkpoint=None`` there if it has moved).
        init_classes: how init_checkpoint's class rows (every class head, a denoising label embedding) start the
            data's classes (:mod:`detr.checkpoints.finetune`): "by_name" (a class the checkpoint names starts
            from its row, wherever its label; a new class fresh), "by_label" (row i for label i when the counts
            agree, else all fresh) or "fresh" (every class row fresh).

    Hyperparameters saved by an earlier version (flat ``lr``, ``loss_ce`` ...) are migrated on load
    (:mod:`detr.lightning.migrate`).
    """

    def __init__(
        self,
        *,
        # model: one family's config (YAML model.detr: a preset, {class_path: DFINEConfig, init_args: ...}, fields)
        detr: ModelConfig | dict[str, Any] = DetrConfig(),  # frozen: a shared default is safe
        loss: LossRecipe = LossRecipe(),  # every field None: the family's
        optimizer: OptimizerRecipe = OptimizerRecipe(),
        runtime: RuntimeOptions = RuntimeOptions(),
        evaluation: EvaluationOptions = EvaluationOptions(),
        category_map: CategoryMap | dict[str, Any] | None = None,
        init_checkpoint: str | None = None,
        init_classes: Literal["by_name", "by_label", "fresh"] = "by_name",
    ) -> None:
        super().__init__()
        config = _model_config(detr)
        family = recipe_for(config)
        #: the loss and optimizer this system trains with: the arguments' fields over the family's recipe
        self.recipe = Recipe(loss=_record(LossRecipe, loss).over(family.loss),
                             optimizer=_record(OptimizerRecipe, optimizer).over(family.optimizer))
        _check_optimizer(self.recipe.optimizer)
        runtime, evaluation = _record(RuntimeOptions, runtime), _record(EvaluationOptions, evaluation)
        if init_checkpoint and config.pretrained_backbone:
            # every backbone tensor comes from init_checkpoint: no ImageNet download (which needs a network)
            logger.info("init_checkpoint given: pretrained_backbone=%r is not loaded", config.pretrained_backbone)
            config = config.replace(pretrained_backbone=False)
        # Hyperparameters stay plain types (the config and the records as dicts, category_map in
        # checkpoint["detr"]), so that checkpoints load with torch.load(weights_only=True) and
        # load_from_checkpoint rebuilds this system.
        self.save_hyperparameters(ignore=["category_map", "detr"])
        self.hparams.update(detr=config.to_dict(), loss=self.recipe.loss.to_dict(),
                            optimizer=self.recipe.optimizer.to_dict(), runtime=runtime.to_dict(),
                            evaluation=evaluation.to_dict())
        try:
            self.model = build_detr(config)
        except PretrainedWeightsError as error:  # offline: the README's first detr fit
            raise SettingError(
                f"--model.detr.pretrained_backbone: could not download {error.url} ({error.reason}); download it "
                f"elsewhere and pass --model.detr.pretrained_backbone /path/{error.file_name}, put it in "
                f"{error.cache}/, or train without ImageNet weights: --model.detr.pretrained_backbone false"
            ) from None
        self.criterion = build_criterion(config, self.recipe.loss)
        if runtime.channels_last:
            self.model.use_channels_last()
        if runtime.fold_batch_norm:
            self.model.use_folded_batch_norm()
        if runtime.backbone_bf16:
            self.model.use_autocast(torch.bfloat16)
        self.postprocess = PostProcess(class_head=config.class_head, top_k=self.detector.detections_per_image)
        #: each detection's mask at the original size, for mask AP (a model that predicts masks)
        self.postprocess_masks = PostProcessMasks() if self.model.predicts_masks else None
        self.category_map = _as_category_map(category_map, config.num_classes)
        self.evaluation = EvaluationSchedule(backend=evaluation.evaluator_backend, directory=evaluation.evaluation_dir,
                                             error_analysis=evaluation.error_analysis,
                                             every_n_validations=evaluation.error_analysis_every_n_validations)
        self.evaluator: CocoEvaluator | None = None
        self.last_evaluation: CocoEvaluation | None = None
        self.mask_evaluator: CocoEvaluator | None = None
        self.last_mask_evaluation: CocoEvaluation | None = None
        #: a keypoint model's post-processing and OKS AP evaluator (None without keypoints)
        self.postprocess_keypoints = PostProcessKeypoints.for_model(self.detector)
        self.keypoint_evaluator: CocoEvaluator | None = None
        #: the score threshold the last validation found best (saved in checkpoints: the commands' default)
        self.score_threshold: float | None = None
        #: the schedule settings a resumed run changed (fit_saved_schedulers), applied at the start of training
        self._schedule_changes: list[str] = []
        #: the tensors of init_checkpoint whose shape differed, and the classes whose rows start fresh (a fine-tune)
        self._fresh_tensors: list[str] = []
        self._fresh_classes: list[str] = []
        if init_checkpoint:
            self.load_initial_weights(init_checkpoint)
        try:
            self.parameter_groups()
        except ValueError as error:  # a decay the model has nothing to apply to: a setting of this run
            raise SettingError(f"--model.optimizer.{error}") from None

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, map_location: Any = None, hparams_file: Any = None,
                             strict: bool | None = None, **kwargs: Any) -> DetrSystem:
        """Lightning's ``load_from_checkpoint``, with the hyperparameters of an earlier version migrated
        (:func:`detr.lightning.migrate.migrate_hyperparameters`); ``kwargs`` replace hyperparameters."""
        saved = {}
        if isinstance(checkpoint_path, (str, os.PathLike)) and Path(checkpoint_path).is_file():
            # memory-mapped: only the hyperparameters are read here
            saved = torch.load(checkpoint_path, weights_only=True, map_location="cpu", mmap=True).get(
                "hyper_parameters") or {}
        migrated = migrate_hyperparameters(dict(saved), where=str(checkpoint_path))
        if migrated is not saved:  # the old flat keys are not arguments any more: passed migrated, over them
            kwargs = {**{key: value for key, value in migrated.items() if key not in saved}, **kwargs}
        return super().load_from_checkpoint(checkpoint_path, map_location=map_location, hparams_file=hparams_file,
                                            strict=strict, **kwargs)

    # ------------------------------------------------------------------ weights
    def load_initial_weights(self, path: str) -> None:
        """Load ``path`` into the model: every tensor that fits, the class rows as ``init_classes`` says
        (:func:`detr.checkpoints.finetune.initial_state`; logged), any other tensor of another shape left fresh.

        This is the fine-tuning recipe of the authors' FAQ (the class head of a COCO checkpoint does not fit
        another data set's classes), with the classes the checkpoint knows carried over by name.
        """
        contents = read_checkpoint(path)
        check_same_family(contents, self.model.config, path)
        source = contents.state_dict
        own = self.model.state_dict()
        unexpected = sorted(set(source) - set(own))
        missing = sorted(set(own) - set(source))
        if unexpected or missing:
            raise ValueError(
                f"init_checkpoint {path} does not match the model's key layout: "
                f"{key_mismatch(missing, unexpected)}; set the model arguments (backbone, num_encoder_layers, "
                "num_decoder_layers, ...) to the checkpoint's"
            )
        initial = initial_state(source, contents.meta.category_map, self.model.config, own, self.category_map,
                                self.hparams.init_classes)
        self.model.load_state_dict(initial.state, strict=False)
        self._fresh_tensors, self._fresh_classes = initial.fresh_tensors, initial.fresh_classes
        for key in initial.fresh_tensors:
            logger.warning("init_checkpoint: %s has shape %s in %s, the model needs %s; it stays freshly "
                           "initialised", key, tuple(source[key].shape), path, tuple(own[key].shape))
        logger.info("%s", class_report(initial, path, self.hparams.init_classes))
        logger.info("init_checkpoint: loaded %d tensors from %s", len(initial.state), path)

    @property
    def detector(self) -> Detector:
        """The box detector: the model itself, or the one a mask model wraps (``model.box_detector``)."""
        return self.model.box_detector

    # ------------------------------------------------------------------ processes
    def setup(self, stage: str) -> None:
        """Seed every process differently once the model is built
        (:func:`detr.lightning.checkpointing.seed_each_process`); check the evaluator backend and that the data
        follows the model's input contract; choose ``--data.batch_size auto``'s batch
        (:mod:`detr.lightning.batch_size`); run the backbone in float32 after all where ``backbone_bf16`` asks
        for bfloat16 on a CPU without it."""
        if (self.detector.autocast_dtype == torch.bfloat16 and self.trainer.strategy.root_device.type == "cpu"
                and not cpu_has_bfloat16()):
            self.detector.use_autocast(None)
            logger.warning("backbone_bf16: this CPU has no bfloat16 instructions (AVX512-BF16 / AMX), where "
                           "bfloat16 is emulated and slower: the backbone runs in float32")
        if stage != "fit" and self._fresh_tensors and not self.trainer.ckpt_path:
            raise SettingError(
                f"--model.init_checkpoint {self.hparams.init_checkpoint}: {len(self._fresh_tensors)} of its tensors "
                f"(e.g. {self._fresh_tensors[0]}) do not fit this model and would {stage} freshly initialised: its "
                f"classes differ from the data's {self.detector.num_classes} (an 80-class COCO model needs "
                "--data.category_ids contiguous)")
        if stage != "fit" and self._fresh_classes and not self.trainer.ckpt_path:
            shown = ", ".join(repr(name) for name in self._fresh_classes[:5])
            raise SettingError(
                f"--model.init_checkpoint {self.hparams.init_checkpoint} was not trained on {len(self._fresh_classes)} "
                f"of the data's classes ({shown}{', ...' if len(self._fresh_classes) > 5 else ''}): their rows would "
                f"{stage} freshly initialised; {stage} a checkpoint trained on these classes, or data without them")
        data = getattr(self.trainer, "datamodule", None)
        if stage == "fit" and self.detector.predicts_masks and getattr(data, "masks", None) is False:
            raise SettingError("--data.masks false: the model predicts instance masks (model.detr.instance_masks), "
                               "whose loss needs each object's mask: set --data.masks true (annotations with "
                               "segmentations, e.g. detr-make-shapes --masks rle)")
        schema = self.detector.keypoint_schema
        if stage == "fit" and schema is not None and data is not None and hasattr(data, "keypoints"):
            self._check_keypoint_data(schema.counts, data)
        if stage in ("fit", "validate", "test"):
            self._check_input_contract()
        resolve_auto_batch_size(self, self.trainer)  # before the loaders, whose length the schedule reads
        if stage in ("fit", "validate", "test"):
            self.evaluation.announce(self.trainer)
        if stage == "fit" and self.trainer.world_size > 1:
            seed_each_process(self.global_rank)

    @staticmethod
    def _check_keypoint_data(counts: tuple[int, ...], data: Any) -> None:
        """Raise :class:`SettingError` when a keypoint model (``counts``: its keypoints per class) is to train on
        data without keypoints, or on data whose classes have other keypoint counts."""
        if not data.keypoints:
            raise SettingError("--data.keypoints false: the model predicts keypoints "
                               "(model.detr.num_keypoints_per_class), whose loss needs each object's keypoints: set "
                               "--data.keypoints true (annotations with keypoints, e.g. detr-make-shapes --keypoints)")
        theirs = list(data.num_keypoints_per_class)
        ours = [*counts, *[0] * (len(theirs) - len(counts))]
        if theirs and ours != theirs:
            raise SettingError(f"--model.detr.num_keypoints_per_class {list(counts)} does not match the data's "
                               f"categories, whose labels have {theirs} keypoints: set "
                               f"--model.detr.num_keypoints_per_class {str(theirs).replace(' ', '')}")

    def _check_input_contract(self) -> None:
        """Raise :class:`SettingError` when the data module's transforms do not follow the model's input
        contract (its resize kind and normalisation: :attr:`detr.models.detector.Detector.input_spec`)."""
        data = getattr(self.trainer, "datamodule", None)
        if data is None or not hasattr(data, "input_spec"):
            return  # loaders given directly: the caller's to match
        theirs, ours = data.input_spec, self.detector.input_spec
        multiple = self.detector.size_multiple
        sides = {"--data.square_size": [getattr(data, "square_size", None)],
                 "--data.multi_scale": list(getattr(data, "multi_scale", None) or [])}
        for flag, values in sides.items():
            wrong = [side for side in values if side is not None and side % multiple]
            if wrong:
                raise SettingError(f"{flag} {wrong if len(values) > 1 else wrong[0]}: the model takes sides that are "
                                   f"multiples of {multiple} ({type(self.detector).__name__}'s input contract); "
                                   f"use multiples of {multiple}")
        if theirs.resize == ours.resize and theirs.mean == ours.mean and theirs.std == ours.std:
            return
        square = ours.resize == "square"
        fix = (f"--data.square_size {ours.size} (any multiple of {multiple})" if square else "no --data.square_size")
        fix += ", --data.normalize false" if ours.mean is None else ", --data.normalize true"
        def pixels(spec: InputSpec) -> str:
            return "ImageNet mean and std" if spec.mean else "pixels / 255"

        raise SettingError(f"the data's transforms ({theirs.resize} resize, {pixels(theirs)}) do not follow the "
                           f"model's input contract ({ours.resize} resize, {pixels(ours)}): set {fix} in the config "
                           "(as configs/rtdetr_shapes_cpu.yaml does for RT-DETR, configs/rfdetr_shapes_cpu.yaml for "
                           "RF-DETR)")

    def on_train_start(self) -> None:
        """A resumed run's schedule follows this run's settings, not the checkpoint's
        (:func:`detr.lightning.schedule.follow_this_runs_settings`)."""
        base_rates = {group["name"]: group["lr"] for group in self.parameter_groups()}
        follow_this_runs_settings(self.trainer, base_rates, self.recipe.optimizer.lr_decay_fraction,
                                  rebuilt=self._schedule_changes)

    # ------------------------------------------------------------------ steps
    def forward(
        self, images: torch.Tensor, padding_mask: torch.Tensor, targets: list[dict[str, Any]] | None = None
    ) -> DetectorOutput:
        """images float [B, 3, H, W] normalised, padding_mask bool [B, H, W] (True = pad) → raw predictions.

        ``targets`` reach the model only in training, where a denoising model builds its noised queries
        from them; evaluation never shows the model its targets."""
        return self.model(images, padding_mask, targets=targets if self.model.training else None)

    def reduced_num_boxes(self, targets: list[dict[str, Any]]) -> torch.Tensor:
        """Target boxes in the batch, averaged over processes, at least 1 (the authors' SetCriterion.forward): a
        float32 scalar on the device, which the criterion divides by without reading it (a GPU step does not wait
        for the host here)."""
        num_boxes = torch.tensor(float(sum(len(t["labels"]) for t in targets)), device=self.device)
        if self._trainer is not None:  # (the sum divided here: NCCL's own average rounds differently)
            num_boxes = self.trainer.strategy.reduce(num_boxes, reduce_op="sum") / self.trainer.world_size
        return num_boxes.clamp(min=1.0)

    def compute_losses(self, outputs: DetectorOutput, targets: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Unweighted loss terms plus the weighted total under "loss"; computed in float32 (also under bf16)."""
        with torch.autocast(device_type=self.device.type, enabled=False):
            losses = self.criterion(outputs, targets, num_boxes=self.reduced_num_boxes(targets))
        weights = self.criterion.weight_dict
        losses["loss"] = sum(losses[name] * weight for name, weight in weights.items())
        return losses

    def on_before_batch_transfer(self, batch: Batch, dataloader_idx: int) -> Batch:
        """A keypoint model's target classes checked against its keypoint schema on the host, before the batch moves
        to the device (where the loss does not read them back)."""
        schema = self.detector.keypoint_schema
        if schema is not None:
            for target in batch[2]:
                if "labels" in target:  # (a predict batch's images may have no annotations)
                    check_keypoint_labels(target["labels"], schema)
        return batch

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        images, padding_mask, targets = batch
        outputs = self(images, padding_mask, targets)
        try:
            losses: dict[str, torch.Tensor] | None = self.compute_losses(outputs, targets)
        except FloatingPointError:  # the matcher refuses non-finite predictions; every process hears of it below
            losses = None
        self._stop_if_non_finite(batch_idx, predictions=outputs, losses=losses)
        self._log_losses("train", losses, batch_size=len(targets))
        return losses["loss"]

    def _stop_if_non_finite(
        self, batch_idx: int, *, predictions: DetectorOutput, losses: dict[str, torch.Tensor] | None
    ) -> None:
        """Raise :class:`NonFiniteLossError` on every process at once if, on any of them, the predictions or the
        loss are NaN/inf, or the loss could not be computed (``losses`` None: the matcher refused the
        predictions). One flag on the device, one all-reduce and one host sync a step."""
        checks = [torch.isfinite(predictions.logits).all(), torch.isfinite(predictions.boxes).all()]
        checks.append(torch.isfinite(losses["loss"]) if losses is not None
                      else torch.zeros((), dtype=torch.bool, device=self.device))
        flag = torch.stack(checks).all().to(torch.int32)
        if self._trainer is not None:  # every process stops together, none left waiting
            flag = self.trainer.strategy.reduce(flag, reduce_op="min")
        if flag.item():
            return
        step = self.trainer.global_step if self._trainer is not None else "n/a"
        bad = {name: int((~torch.isfinite(getattr(predictions, name))).sum()) for name in ("logits", "boxes")}
        what = "the model's predictions" if losses is None or any(bad.values()) else "the training loss"
        terms = ("not computed (the matcher needs finite predictions)" if losses is None
                 else ", ".join(f"{name}={value.item():.6g}" for name, value in sorted(losses.items())))
        raise NonFiniteLossError(
            f"non-finite training values at global step {step} (epoch {self.current_epoch}, batch {batch_idx}): "
            f"{what} on at least one process. Here: non-finite logits {bad['logits']}, boxes "
            f"{bad['boxes']}; loss terms: {terms}. The weights of this step were not updated. Lower the "
            "learning rate, keep gradient clipping (configs: 0.1), check the batch (NaN pixels, zero-size "
            "boxes), or train with precision 32-true."
        )

    def _log_losses(self, stage: str, losses: dict[str, torch.Tensor], batch_size: int) -> None:
        on_step = stage == "train"
        names = list(losses)
        if on_step and self._trainer is not None and (self.trainer.global_step + 1) % self.trainer.log_every_n_steps:
            # The loggers write per-step values only every log_every_n_steps steps; on the other steps only
            # the progress bar's terms are logged (every self.log call costs time on each step).
            names = [name for name in names if name in ("loss", "class_error")]
        for name in names:
            value = losses[name]
            self.log(
                f"{stage}/{name}", value.detach(), batch_size=batch_size, on_step=on_step, on_epoch=not on_step,
                prog_bar=name in ("loss", "class_error"), sync_dist=not on_step,
            )

    # ------------------------------------------------------------------ evaluation
    def _start_evaluation(self, stage: str) -> None:
        self.evaluator = self.evaluation.start(self.trainer, stage, self.category_map)
        self.mask_evaluator = self._start_mask_evaluation(stage)
        self.keypoint_evaluator = (self.evaluation.start_keypoints(self.trainer, stage, self.category_map)
                                   if self.postprocess_keypoints is not None else None)

    def _start_mask_evaluation(self, stage: str) -> CocoEvaluator | None:
        """The mask AP evaluator of a model that predicts masks, on the json's segmentations (None without)."""
        if self.postprocess_masks is None:
            return None
        return self.evaluation.start_masks(self.trainer, stage, self.category_map)

    def _evaluation_step(self, stage: str, batch: Batch) -> dict[str, Any]:
        images, padding_mask, targets = batch
        outputs = self(images, padding_mask)
        losses = self.compute_losses(outputs, targets)
        self._log_losses(stage, losses, batch_size=len(targets))
        orig_sizes = torch.stack([t["orig_size"] for t in targets]).to(self.device)
        detections = self.postprocess(outputs, orig_sizes)
        if self.evaluator is not None:
            self.evaluator.update([int(t["image_id"]) for t in targets], detections)
        self._score_outputs(stage, outputs, targets, detections, orig_sizes)
        return {"detections": detections, "loss": losses["loss"]}

    def _score_outputs(self, stage: str, outputs: DetectorOutput, targets: list[dict[str, Any]],
                       detections: list[dict[str, torch.Tensor]], orig_sizes: torch.Tensor) -> None:
        """Evaluation beyond box AP on one batch: the detections' masks for mask AP, those COCOeval scores
        (:func:`detr.evaluation.coco_evaluator.scored_detections`) at the original size, a few queries at a
        time; a keypoint model's keypoints for OKS AP (scores fused with their uncertainty). The panoptic system
        adds PQ."""
        if self.keypoint_evaluator is not None and outputs.keypoints is not None:
            with_keypoints = self.postprocess_keypoints(outputs.keypoints, detections, orig_sizes)
            self.keypoint_evaluator.update([int(t["image_id"]) for t in targets], with_keypoints)
        if self.mask_evaluator is None or self.postprocess_masks is None or outputs.masks is None:
            return
        processed = [(int(t["size"][0]), int(t["size"][1])) for t in targets]
        padded = (max(h for h, _ in processed), max(w for _, w in processed))
        with_masks = []
        for i, detection in enumerate(detections):
            keep = scored_detections(detection["labels"], detection["scores"]).to(detection["scores"].device)
            kept = {key: value[keep] for key, value in detection.items()}
            target_size = (int(orig_sizes[i][0]), int(orig_sizes[i][1]))
            chunks = [self.postprocess_masks.image_masks(outputs.masks[i, queries], processed[i], padded,
                                                         target_size).cpu()
                      for queries in kept["queries"].split(_MASK_CHUNK)]
            kept["masks"] = torch.cat(chunks) if chunks else torch.zeros(0, *target_size, dtype=torch.bool)
            with_masks.append(kept)
        self.mask_evaluator.update([int(t["image_id"]) for t in targets], with_masks)

    def _finish_evaluation(self, stage: str) -> None:
        if self.evaluator is not None:
            self.last_evaluation = self.evaluation.finish(self, stage, self.evaluator)
            if not self.trainer.sanity_checking:  # the threshold of these weights, or none (not an older one)
                self.score_threshold = self.last_evaluation.best_threshold
                if self.score_threshold is None:
                    logger.warning("%s: F1 is 0 at every score threshold (no detection matched an object at IoU 0.5), "
                                   "so no best threshold is recorded; the checkpoint's users fall back to 0.7 unless "
                                   "given --threshold", stage)
        if self.mask_evaluator is not None:
            self.last_mask_evaluation = self.evaluation.finish(self, stage, self.mask_evaluator)
        if self.keypoint_evaluator is not None:
            self.evaluation.finish(self, stage, self.keypoint_evaluator)

    def on_validation_epoch_start(self) -> None:
        self._start_evaluation("val")

    def validation_step(self, batch: Batch, batch_idx: int) -> dict[str, Any]:
        return self._evaluation_step("val", batch)

    def on_validation_epoch_end(self) -> None:
        self._finish_evaluation("val")

    def on_test_epoch_start(self) -> None:
        self._start_evaluation("test")

    def test_step(self, batch: Batch, batch_idx: int) -> dict[str, Any]:
        return self._evaluation_step("test", batch)

    def on_test_epoch_end(self) -> None:
        self._finish_evaluation("test")

    def predict_step(self, batch: Batch, batch_idx: int) -> list[Prediction]:
        """One :class:`Prediction` per image, every query kept (``image_id``: the data set index; an image that
        could not be read or predicted carries its ``error``; a model that predicts masks: each detection's mask at
        the original size, in the json as RLE): the prediction path of ``detr-predict``
        (:func:`detr.inference.predict.predictions_from_outputs`).
        :class:`detr.lightning.callbacks.PredictionsWriter` writes them to a json."""
        images, padding_mask, targets = batch
        return self._predictions(self(images, padding_mask), targets, masks=self.postprocess_masks)

    def _predictions(self, outputs: DetectorOutput, targets: list[dict[str, Any]],
                     panoptic: PostProcessPanoptic | None = None, masks: PostProcessMasks | None = None
                     ) -> list[Prediction]:
        """The model's outputs for a predict batch → :meth:`predict_step`'s predictions (with ``masks``: each
        detection's mask at the original size)."""
        return predictions_from_outputs(
            outputs, image_sizes=[tuple(int(v) for v in t["orig_size"]) for t in targets],
            input_sizes=[tuple(int(v) for v in t["size"]) for t in targets], class_head=self.detector.class_head,
            category_map=self.category_map, file_names=[t.get("file_name") for t in targets],
            image_ids=[int(t["image_id"]) for t in targets], errors=[t.get("error") for t in targets],
            masks=masks, panoptic=panoptic, top_k=self.detector.detections_per_image,
            keypoints=self.postprocess_keypoints)

    # ------------------------------------------------------------------ optimisation
    def parameter_groups(self) -> list[dict[str, Any]]:
        """The optimizer's parameter groups (:func:`detr.lightning.param_groups.parameter_groups`: the backbone at
        ``lr_backbone``, the rest at ``lr``, Deformable DETR's sampling offsets at ``lr`` × 0.1, RF-DETR's
        layer-wise and component decays), from the recipe's rates."""
        recipe = self.recipe.optimizer
        return parameter_groups(self.model, lr=recipe.lr, lr_backbone=recipe.lr_backbone,
                                lr_layer_decay=recipe.lr_layer_decay, lr_component_decay=recipe.lr_component_decay)

    def configure_optimizers(self) -> tuple[list[torch.optim.Optimizer], list[dict[str, Any]]]:
        """AdamW over :meth:`parameter_groups` and the recipe's learning-rate schedulers
        (:func:`detr.lightning.schedule.learning_rate_schedulers`: step decay, warm-up, decay to zero over the
        run's last steps, whose count the trainer gives or a :class:`TimeBudget` fixes)."""
        recipe = self.recipe.optimizer
        groups = self.parameter_groups()
        # fused: one kernel for every tensor instead of a Python loop over them (on the CPU the default is
        # that loop)
        optimizer = torch.optim.AdamW(groups, lr=recipe.lr, weight_decay=recipe.weight_decay, fused=True)
        decay_fraction = recipe.lr_decay_fraction
        total_steps = None
        if self._trainer is not None:
            planned = self.trainer.estimated_stepping_batches  # max_steps, or max_epochs × batches; else inf
            if planned < 1:
                raise SettingError(_no_training_steps(self.trainer))
        if decay_fraction > 0 and self._trainer is not None:
            total_steps = int(planned) if math.isfinite(planned) else None
            if total_steps is None and time_budget_of(self.trainer.callbacks) is None:
                raise SettingError(
                    f"--model.optimizer.lr_decay_fraction={decay_fraction} decays over the run's last steps, but the "
                    "run has no length: set trainer.max_steps (or max_epochs), or add the callback "
                    "detr.lightning.callbacks.TimeBudget (it fixes the step count of a time-bounded run)"
                )
        schedulers = learning_rate_schedulers(
            optimizer, lr_drop_epochs=list(recipe.lr_drop_epochs), lr_drop_gamma=recipe.lr_drop_gamma,
            warmup_steps=self.warmup_steps(), decay_fraction=decay_fraction, total_steps=total_steps,
            **self._flat_cosine_settings(),
        )
        return [optimizer], schedulers

    def warmup_steps(self) -> int:
        """The warm-up's optimizer steps: the recipe's ``warmup_fraction`` of the run's steps (the trainer's
        ``max_steps``, or ``max_epochs`` × batches; at least 1) where it is > 0, else its ``warmup_steps``.

        Raises :class:`SettingError` for a fraction without a run length (no trainer, or one bounded by time
        alone)."""
        recipe = self.recipe.optimizer
        if recipe.warmup_fraction <= 0:
            return recipe.warmup_steps
        planned = self.trainer.estimated_stepping_batches if self._trainer is not None else math.inf
        if not math.isfinite(planned):
            raise SettingError(
                f"--model.optimizer.warmup_fraction={recipe.warmup_fraction} is a share of the run's steps, but the "
                "run has no length: set trainer.max_steps (or max_epochs), or give the warm-up in steps "
                "(--model.optimizer.warmup_steps N --model.optimizer.warmup_fraction 0)")
        return max(1, round(recipe.warmup_fraction * planned))

    def _flat_cosine_settings(self) -> dict[str, Any]:
        """:func:`learning_rate_schedulers`' FlatCosine arguments: the epochs, the factor and the optimizer steps
        per epoch (the trainer's batches per epoch over its gradient accumulation)."""
        epochs = list(self.recipe.optimizer.lr_flat_cosine_epochs)
        if not epochs:
            return {}
        if self._trainer is None:
            raise SettingError(f"--model.optimizer.lr_flat_cosine_epochs={epochs} counts epochs of the trainer's "
                               "batches: configure the optimizers within a fit")
        batches = self.trainer.num_training_batches  # counted: configure_optimizers asked the planned steps
        if not math.isfinite(batches):
            raise SettingError(f"--model.optimizer.lr_flat_cosine_epochs={epochs} counts epochs, but the run's "
                               "batches per epoch are unknown: give the data a length (a map-style data set)")
        steps_per_epoch = max(1, math.ceil(batches / self.trainer.accumulate_grad_batches))
        return {"flat_cosine_epochs": epochs, "flat_cosine_gamma": self.recipe.optimizer.lr_flat_cosine_gamma,
                "steps_per_epoch": steps_per_epoch}

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """The trainer's ``gradient_clip_val`` (the recipe's global norm 0.1) in every precision.

        Lightning's mixed-precision plugin refuses to clip for a fused optimizer, bf16-mixed included
        ("does not allow for gradient clipping because it performs unscaling of gradients internally"),
        though bf16 has no gradient scaler; with fp16's scaler the gradients are unscaled here first (the
        scaler's step then leaves them as they are), so the fused AdamW clips the true gradients."""
        if not gradient_clip_val:
            return
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        if scaler is not None:
            scaler.unscale_(optimizer)
        parameters = [p for group in optimizer.param_groups for p in group["params"]]
        if gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(parameters, gradient_clip_val, foreach=True)
        else:
            torch.nn.utils.clip_grad_norm_(parameters, gradient_clip_val, foreach=True)

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Add ``checkpoint["detr"]`` (model config + category map, read by :func:`detr.load_checkpoint`) and
        every process's RNG states (so a resumed run continues the same random streams)."""
        checkpoint["detr"] = checkpoint_record(self.detector.config, ModelMeta(
            category_map=self.category_map, score_threshold=self.score_threshold))
        save_rng_states(checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = ModelMeta.from_dict(checkpoint.get("detr") or {})
        self._check_same_model(checkpoint)
        if saved.category_map is not None:
            self._check_same_categories(saved.category_map)
            if self.category_map is None:  # no data linked: the checkpoint's; else the data's (same ids)
                self.category_map = saved.category_map
        if saved.score_threshold is not None:
            self.score_threshold = saved.score_threshold
        if self._trainer is not None and self.trainer.state.fn == "fit":
            _check_steps_left(checkpoint, self.trainer)
            # Restored now, before the fit loop creates the training dataloader's iterator (it draws the
            # shuffling seed); Lightning runs the sanity check in between under isolate_rng.
            restore_rng_states(checkpoint, self.trainer)
            if checkpoint.get("lr_schedulers"):
                # this run's lr_drop_epochs / warmup_steps, not the checkpoint's (Lightning restores them next)
                recipe = self.recipe.optimizer
                checkpoint["lr_schedulers"], self._schedule_changes = fit_saved_schedulers(
                    checkpoint["lr_schedulers"], lr_drop_epochs=list(recipe.lr_drop_epochs),
                    lr_drop_gamma=recipe.lr_drop_gamma, warmup_steps=self.warmup_steps(),
                    decay_fraction=recipe.lr_decay_fraction, global_step=int(checkpoint.get("global_step", 0)),
                    flat_cosine_epochs=list(recipe.lr_flat_cosine_epochs) or None,
                    flat_cosine_gamma=recipe.lr_flat_cosine_gamma)

    def _check_same_categories(self, saved: CategoryMap) -> None:
        """Raise :class:`CheckpointError` when the data's category ids (linked by the CLI) differ from those the
        checkpoint's labels stand for, or when the same ids carry the same names in another order (swapped): a
        resume, ``validate`` or ``test`` on such data scored every label as another category without a word.
        Other names for the same ids (a renamed class) are a warning, and the data's names are kept."""
        data = self.category_map
        if data is None:
            return
        path = (self.trainer.ckpt_path if self._trainer is not None else None) or "<checkpoint>"
        if tuple(data.category_ids) != tuple(saved.category_ids):
            raise CheckpointError(
                f"checkpoint {path} predicts the category ids {list(saved.category_ids)[:10]}"
                f"{' ...' if saved.num_classes > 10 else ''}, the data's annotation json has "
                f"{list(data.category_ids)[:10]}{' ...' if data.num_classes > 10 else ''}: its labels would be scored "
                "as other categories. Use the data set it was trained on, or fine-tune its weights on this one in a "
                f"new run with --model.init_checkpoint {path}")
        renamed = saved.renamed(data)
        if not renamed:
            return
        pairs = "; ".join(f"id {i} is '{old}' in the checkpoint, '{new}' in the json" for i, old, new in renamed[:4])
        pairs += f"; and {len(renamed) - 4} more" if len(renamed) > 4 else ""
        if sorted(class_name_key(old) or "" for _, old, _ in renamed) == sorted(
                class_name_key(new) or "" for _, _, new in renamed):  # the same names on other ids: swapped
            raise CheckpointError(
                f"checkpoint {path} and the data's annotation json give the same category ids other names ({pairs}): "
                "the checkpoint's labels would be scored as the other classes. Use the json it was trained on, or, if "
                f"this json is right, fine-tune its weights on it in a new run with --model.init_checkpoint {path} "
                "(class rows carry over by name)")
        logger.warning("checkpoint %s and the data's annotation json name the same category ids differently (%s): the "
                       "json's names are used and saved; if they are other objects than the checkpoint learnt, "
                       "fine-tune in a new run with --model.init_checkpoint %s instead", path, pairs, path)

    def _check_same_model(self, checkpoint: dict[str, Any]) -> None:
        """Raise :class:`CheckpointError` if the checkpoint's weights do not fit this system's model, naming the
        model options that differ (a resumed run, ``--ckpt_path``, keeps the checkpoint's model; another
        ``--model.detr.*`` option or another data set's class count would otherwise end in torch's bare
        "size mismatch" list). Called before Lightning's strict load, which would refuse the same weights."""
        weights = checkpoint.get("state_dict")
        if not isinstance(weights, dict):
            return
        own = self.state_dict()
        misshapen = [key for key, value in weights.items()
                     if key in own and hasattr(value, "shape") and tuple(value.shape) != tuple(own[key].shape)]
        missing, unexpected = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
        if not (misshapen or missing or unexpected) or not self.strict_loading:
            return
        saved = (checkpoint.get("detr") or {}).get("model_config") or {}
        current = self.detector.config.to_dict()
        options = [f"{name} {saved[name]!r} (checkpoint) vs {current[name]!r} (this run)"
                   for name in current if name in saved and saved[name] != current[name]]
        path = (self.trainer.ckpt_path if self._trainer is not None else None) or "<checkpoint>"
        differs = ("model options " + "; ".join(options) if options else
                   f"tensor shapes {misshapen[:5]}, {key_mismatch(missing, unexpected, shown=5)}")
        raise CheckpointError(
            f"checkpoint {path} holds another model than this run builds: {differs}. A run from --ckpt_path keeps "
            "the checkpoint's model: drop those options (--model.detr.*; num_classes comes from the data set's "
            "annotation json) to resume it, or start a new run in another folder that fine-tunes its weights "
            f"with --model.init_checkpoint {path} (tensors whose shape differs then start fresh)"
        )


def _check_steps_left(checkpoint: dict[str, Any], trainer: L.Trainer) -> None:
    """Raise :class:`CheckpointError` when a resumed fit's ``max_steps`` lies below the checkpoint's step:
    Lightning then ended the run at once, training nothing and saying nothing. (At the step itself the run is
    finished, as a requeued job finds it: that stays a quiet no-op.)"""
    step = int(checkpoint.get("global_step", 0))
    if 0 <= trainer.max_steps < step:
        path = trainer.ckpt_path or "<checkpoint>"
        raise CheckpointError(
            f"checkpoint {path} is at step {step} already and --trainer.max_steps is {trainer.max_steps}: this run "
            f"would train nothing. Give a larger --trainer.max_steps to train on (e.g. {2 * step}), or evaluate the "
            f"checkpoint with detr validate --ckpt_path {path}")


def _no_training_steps(trainer: L.Trainer) -> str:
    """The message for a fit whose trainer plans no optimizer step, naming the flag that says so."""
    if trainer.max_steps == 0:
        flag = "--trainer.max_steps must be >= 1 (or -1: no step limit), got 0"
    elif trainer.max_epochs == 0:
        flag = "--trainer.max_epochs must be >= 1 (or -1: no epoch limit), got 0"
    else:
        flag = ("the training loader has no batches: check --trainer.limit_train_batches and the training set's "
                "size against --data.batch_size")
    return f"{flag}: this fit would train no step (and a schedule's fractions have no steps to be shares of)"


def _model_config(detr: ModelConfig | dict[str, Any] | None) -> ModelConfig:
    """The model's config from the ``detr`` argument: a family's config (the CLI), a dict (the hyperparameters of
    a checkpoint, in either form :func:`detr.models.family.config_from_dict` reads) or None (the paper's model)."""
    if detr is None:
        return DetrConfig()
    if isinstance(detr, dict):
        return config_from_dict(detr, where="DetrSystem(detr=...)")
    return detr


def _record(kind: type[_Record], value: _Record | dict[str, Any] | None) -> _Record:
    """A record argument as its record: itself (the CLI), from a dict of its fields (a checkpoint's
    hyperparameters) or, for None, the record of unset fields."""
    if value is None:
        return kind()
    if isinstance(value, dict):
        names = {field.name for field in dataclasses.fields(kind)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise SettingError(f"{kind.__name__} has no field {', '.join(unknown)}; its fields: "
                               f"{', '.join(sorted(names))}")
        return kind(**value)
    return value


def _check_optimizer(recipe: OptimizerRecipe) -> None:
    """Raise :class:`SettingError` for an optimizer recipe that cannot train (before the fit starts, when AdamW
    or a scheduler would refuse it as a traceback)."""
    for name in ("lr", "lr_backbone", "weight_decay"):
        if not getattr(recipe, name) >= 0:
            raise SettingError(f"--model.optimizer.{name} must be >= 0, got {getattr(recipe, name)}")
    for name in ("lr_layer_decay", "lr_component_decay"):
        if not 0 < getattr(recipe, name) <= 1:
            raise SettingError(f"--model.optimizer.{name} must be in (0, 1] (1: no decay), got {getattr(recipe, name)}")
    for name in ("warmup_fraction", "lr_decay_fraction"):
        if not 0 <= getattr(recipe, name) <= 1:
            raise SettingError(f"--model.optimizer.{name} must be in [0, 1] (a share of the run's steps; 0: none), "
                               f"got {getattr(recipe, name)}")
    if recipe.warmup_steps < 0:
        raise SettingError(f"--model.optimizer.warmup_steps must be >= 0, got {recipe.warmup_steps}")
    epochs = list(recipe.lr_flat_cosine_epochs)
    if epochs and not (len(epochs) == 2 and 0 <= epochs[0] < epochs[1]):
        raise SettingError(f"--model.optimizer.lr_flat_cosine_epochs must be [flat, end] with 0 <= flat < end (DEIM: "
                           f"[64, 120]) or [] (off), got {epochs}")
    if not 0 <= recipe.lr_flat_cosine_gamma <= 1:
        raise SettingError(f"--model.optimizer.lr_flat_cosine_gamma must be in [0, 1] (DEIM: 0.5), got "
                           f"{recipe.lr_flat_cosine_gamma}")


def _as_category_map(category_map: CategoryMap | dict[str, Any] | None, num_classes: int) -> CategoryMap | None:
    if category_map is None:
        return None
    if isinstance(category_map, dict):
        category_map = CategoryMap.from_dict(category_map)
    if category_map.num_classes != num_classes:
        raise ValueError(
            f"category_map has {category_map.num_classes} classes but num_classes is {num_classes}; "
            "let the CLI link both from the data module, or pass a matching map"
        )
    return category_map


__all__ = ["DetrSystem", "NonFiniteLossError", "SettingError"]
