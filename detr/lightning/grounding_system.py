"""Fine-tuning a grounding model (Grounding DINO, MM-Grounding-DINO) on detection data whose category names are
the prompt.

The data set's categories, in label order, make one prompt, "circle. square. triangle."
(:func:`detr.inference.grounding.prompt_text`); every image is read with it, and each box's target is its category's
phrase, as tokens (:mod:`detr.loss.grounding`). :class:`GroundingSystem` is the training system (Lightning), its
loss the grounding set loss with the family's recipe (:mod:`detr.models.grounding.recipe`);
:func:`fine_tune_grounding` reads a transformers directory, trains on a COCO json and writes the fine-tuned model as
a transformers directory again (:func:`detr.checkpoints.grounding_writer.write_grounding_directory`), which the
commands load as they load the released models (``--prompt`` the same category names).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch

from detr.inference.grounding import prompt_phrases, prompt_text
from detr.lightning.param_groups import parameter_groups
from detr.loss.grounding import build_grounding_criterion, check_phrase_labels, phrase_token_maps, with_token_maps
from detr.models.grounding.model import GroundingDINO
from detr.models.grounding.recipe import RECIPE
from detr.models.outputs import DetectorOutput
from detr.models.recipe import LossRecipe, OptimizerRecipe, Recipe

logger = logging.getLogger(__name__)

Batch = tuple[torch.Tensor, torch.Tensor, list[dict[str, torch.Tensor]]]


class GroundingSystem(L.LightningModule):
    """A grounding model trained with the grounding set loss on data whose categories are the prompt's phrases.

    Args:
        model: the :class:`GroundingDINO` to fine-tune, with its tokenizer (``model.tokenizer``: a loaded
            transformers directory has it).
        category_names: label → category name (the data module's ``category_names``, contiguous labels); the prompt
            names them in this order, one phrase each.
        loss, optimizer: recipe fields over the family's (:data:`detr.models.grounding.recipe.RECIPE`; None: its).

    Raises ValueError when the model has no tokenizer, a name is empty or named twice, or the prompt does not give
    one phrase per category (a name holding "." or "?") or is longer than the model reads.
    """

    def __init__(self, model: GroundingDINO, category_names: Sequence[str], *, loss: LossRecipe = LossRecipe(),
                 optimizer: OptimizerRecipe = OptimizerRecipe()) -> None:
        super().__init__()
        if model.tokenizer is None:
            raise ValueError("the grounding model has no tokenizer: load it from a transformers directory with its "
                             "tokenizer files (tokenizer.json or vocab.txt)")
        self.model = model
        self.recipe = Recipe(loss=loss.over(RECIPE.loss), optimizer=optimizer.over(RECIPE.optimizer))
        #: the prompt every image is read with: the category names in label order
        self.prompt = prompt_text(list(category_names))
        phrases = prompt_phrases(self.prompt)
        if len(phrases) != len(category_names):
            raise ValueError(f"the category names {list(category_names)} make {len(phrases)} phrases, not one per "
                             "category: a name must not hold '.' or '?' (rename it in the annotation json)")
        self.phrases = phrases
        text = model.tokenizer(self.prompt, return_tensors="pt")
        self.register_buffer("input_ids", text["input_ids"], persistent=False)
        self.register_buffer("attention_mask", text["attention_mask"], persistent=False)
        token_maps = phrase_token_maps(text["input_ids"][0], model.max_text_len)
        if len(token_maps) != len(category_names):
            raise ValueError(f"the prompt {self.prompt!r} reads as {len(token_maps)} phrases of tokens, not one per "
                             f"category ({len(category_names)}): the tokenizer splits a name at a delimiter token")
        self.register_buffer("token_maps", token_maps, persistent=False)
        self.criterion = build_grounding_criterion(model.config, self.recipe.loss, aux_loss=model.aux_loss)

    def forward(self, images: torch.Tensor, padding_mask: torch.Tensor) -> DetectorOutput:
        """images float [B, 3, H, W] (ImageNet-normalised, zero-padded), padding_mask bool [B, H, W] → the model's
        outputs for the prompt (logits [B, Q, max_text_len] over its tokens)."""
        batch = images.shape[0]
        return self.model(images, padding_mask, self.input_ids.expand(batch, -1),
                          self.attention_mask.expand(batch, -1))

    def reduced_num_boxes(self, targets: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        """Target boxes in the batch, averaged over processes, at least 1: a scalar on the device (not read back,
        as :meth:`detr.lightning.system.DetrSystem.reduced_num_boxes`)."""
        num_boxes = torch.tensor(float(sum(len(t["labels"]) for t in targets)), device=self.device)
        if self._trainer is not None:
            num_boxes = self.trainer.strategy.reduce(num_boxes, reduce_op="sum") / self.trainer.world_size
        return num_boxes.clamp(min=1.0)

    def on_before_batch_transfer(self, batch: Batch, dataloader_idx: int) -> Batch:
        """Every target's label checked against the prompt's phrases on the host, before the batch moves to the
        device (where :func:`with_token_maps` does not read them back)."""
        check_phrase_labels(batch[2], len(self.token_maps))
        return batch

    def compute_losses(self, outputs: DetectorOutput, targets: list[dict[str, torch.Tensor]]
                       ) -> dict[str, torch.Tensor]:
        """Unweighted loss terms plus the weighted total under "loss"; targets: per image labels int64 [T] (the
        category's label) and boxes [T, 4] normalised cxcywh."""
        targets = with_token_maps(targets, self.token_maps)
        losses = self.criterion(outputs, targets, num_boxes=self.reduced_num_boxes(targets))
        losses["loss"] = sum(losses[name] * weight for name, weight in self.criterion.weight_dict.items())
        return losses

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        images, padding_mask, targets = batch
        losses = self.compute_losses(self(images, padding_mask), targets)
        if not torch.isfinite(losses["loss"]):
            raise FloatingPointError(f"the loss is not finite at step {self.global_step}: lower the learning rate "
                                     "(--model.optimizer.lr)")
        self.log_dict({f"train/{name}": value.detach() for name, value in losses.items()}, batch_size=len(targets),
                      prog_bar=False)
        return losses["loss"]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """AdamW over the model's parameter groups (:func:`detr.lightning.param_groups.parameter_groups`: the
        pretrained encoders at ``lr_backbone``, the rest at ``lr``)."""
        recipe = self.recipe.optimizer
        groups = parameter_groups(self.model, lr=recipe.lr, lr_backbone=recipe.lr_backbone)
        return torch.optim.AdamW(groups, lr=recipe.lr, weight_decay=recipe.weight_decay)


def fine_tune_grounding(checkpoint: str | Path, output: str | Path, *, train_images: str | Path,
                        train_annotations: str | Path, max_steps: int, batch_size: int = 2,
                        loss: LossRecipe = LossRecipe(), optimizer: OptimizerRecipe = OptimizerRecipe(),
                        data: dict[str, Any] | None = None, trainer: dict[str, Any] | None = None
                        ) -> tuple[Path, GroundingSystem]:
    """Fine-tune the grounding model of the transformers directory ``checkpoint`` on a COCO json whose category
    names become the prompt, for ``max_steps`` optimizer steps, and write it as a transformers directory at
    ``output`` (its config's ``id2label`` the prompt's phrases).

    Args:
        checkpoint: a transformers (MM-)Grounding DINO directory with its tokenizer.
        output: the directory to write.
        train_images, train_annotations: the images folder and its COCO instances json (category names unique,
            without "." or "?"; labels are the categories in the json's order).
        max_steps: optimizer steps; batch_size: images per step.
        loss, optimizer: recipe fields over :data:`detr.models.grounding.recipe.RECIPE`.
        data: more :class:`detr.lightning.datamodule.DetrDataModule` arguments (``image_size``, ``square_size``,
            ``num_workers`` ...); trainer: more ``lightning.Trainer`` arguments (``accelerator``, ``precision`` ...).

    Returns (the written directory, the trained system: its ``prompt`` and the logged losses)."""
    from detr.checkpoints import load_checkpoint
    from detr.checkpoints.grounding_writer import write_grounding_directory
    from detr.lightning.datamodule import DetrDataModule

    checkpoint = Path(checkpoint)
    datamodule = DetrDataModule(train_images=str(train_images), train_annotations=str(train_annotations),
                                category_ids="contiguous", batch_size=batch_size,
                                **{"num_workers": 0, **(data or {})})
    model = load_checkpoint(checkpoint).train()
    system = GroundingSystem(model, datamodule.category_names, loss=loss, optimizer=optimizer)
    logger.info("fine-tuning %s with the prompt %r", checkpoint, system.prompt)
    options = {"max_steps": max_steps, "logger": False, "enable_checkpointing": False,
               "enable_progress_bar": False, "enable_model_summary": False, "limit_val_batches": 0,
               "gradient_clip_val": 0.1, "log_every_n_steps": 1, **(trainer or {})}
    L.Trainer(**options).fit(system, train_dataloaders=datamodule.train_dataloader())
    written = write_grounding_directory(system.model.eval(), output, like=checkpoint, phrases=system.phrases)
    return written, system


__all__ = ["GroundingSystem", "fine_tune_grounding"]
