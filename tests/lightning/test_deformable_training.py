"""Deformable DETR through the training system: two steps of the plain and the two-stage model (the encoder
proposals' loss included), the authors' slower rate for sampling offsets and reference points, and a
checkpoint that loads back as the same model."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from detr import CategoryMap, load_checkpoint
from detr.lightning import DetrSystem
from detr.lightning.options import EvaluationOptions
from detr.models.recipe import LossRecipe, OptimizerRecipe
from tests.helpers import ANIMALS, animal_data, animal_samples, collate_unpadded, tiny_config_with

DEFORMABLE = tiny_config_with(num_classes=3, architecture="deformable", class_head="sigmoid", num_points=2,
                              num_feature_levels=2)

pytestmark = pytest.mark.usefixtures("one_thread")


def _system(**changes) -> DetrSystem:
    torch.manual_seed(0)
    return DetrSystem(detr=DEFORMABLE.replace(**changes), loss=LossRecipe(cost_class=2.0, loss_ce=2.0),
                      optimizer=OptimizerRecipe(lr=2e-4, lr_backbone=2e-5),
                      category_map=CategoryMap.from_coco_categories(ANIMALS, contiguous=True),
                      evaluation=EvaluationOptions(evaluation_dir=""))


@pytest.mark.parametrize("changes", [{}, {"box_refine": True, "two_stage": True}])
def test_two_training_steps_log_every_term_and_the_checkpoint_loads(tmp_path, changes) -> None:
    system = _system(**changes)
    before = system.model.transformer.level_embed.detach().clone()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=2, limit_val_batches=1, num_sanity_val_steps=0,
                        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
                        logger=L.pytorch.loggers.CSVLogger(tmp_path), default_root_dir=tmp_path)
    trainer.fit(system, datamodule=animal_data())
    logged = trainer.logged_metrics
    names = ["train/loss", "train/loss_ce", "train/loss_bbox", "train/loss_giou", "train/loss_ce_0", "val/AP"]
    if changes:
        names += ["train/loss_ce_enc", "train/loss_bbox_enc", "train/loss_giou_enc"]
    for name in names:
        assert name in logged and torch.isfinite(logged[name]), name
    assert not torch.equal(before, system.model.transformer.level_embed)  # it trained
    path = tmp_path / "deformable.ckpt"
    trainer.save_checkpoint(path)
    model = load_checkpoint(path)
    assert model.config == system.model.config
    images, mask, _ = collate_unpadded(animal_samples()[:2])
    system.model.eval()
    with torch.no_grad():
        assert torch.allclose(model(images, mask).boxes, system.model(images, mask).boxes)


def test_sampling_offsets_and_reference_points_train_at_a_tenth_of_the_rate() -> None:
    system = _system()
    (optimizer,), _ = system.configure_optimizers()
    groups = {group["name"]: group for group in optimizer.param_groups}
    assert groups["sampling_offsets"]["lr"] == pytest.approx(2e-5) and groups["transformer"]["lr"] == 2e-4
    slow = {id(p) for n, p in system.model.named_parameters() if "sampling_offsets" in n or "reference_points" in n}
    assert {id(p) for p in groups["sampling_offsets"]["params"]} == slow
    trainable = {id(p) for p in system.model.parameters() if p.requires_grad}
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == trainable


def test_the_encoder_proposals_are_matched_class_agnostically() -> None:
    system = _system(box_refine=True, two_stage=True)
    images, mask, targets = collate_unpadded(animal_samples()[:2])
    outputs = system(images, mask)
    losses = system.compute_losses(outputs, targets)
    assert system.criterion.weight_dict["loss_bbox_enc"] == 5.0
    # the same loss as the encoder outputs with every target relabelled 0
    binary = [{**t, "labels": torch.zeros_like(t["labels"])} for t in targets]
    direct = system.criterion.layer_losses(outputs.proposals, binary, system.reduced_num_boxes(targets))
    assert torch.allclose(losses["loss_ce_enc"], direct["loss_ce"])
