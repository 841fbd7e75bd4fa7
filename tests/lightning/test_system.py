"""DetrSystem: a training step with its logs, optimizer groups, checkpoints that carry the model config and
category map, prediction output, and the non-finite loss guard."""

from __future__ import annotations

import logging

import lightning as L
import pytest
import torch

from detr import CategoryMap, load_checkpoint
from detr.evaluation import resolve_backend
from detr.lightning import DetrSystem, NonFiniteLossError
from detr.lightning.options import EvaluationOptions, RuntimeOptions
from detr.models.detr_family import DetrConfig
from detr.models.recipe import LossRecipe, OptimizerRecipe
from tests.helpers import ANIMALS, animal_data, animal_samples, collate_unpadded, tiny_config_with

TINY = tiny_config_with(num_classes=3, backbone_last_stage="layer3")

pytestmark = pytest.mark.usefixtures("one_thread")


def _system(detr: DetrConfig = TINY, **settings) -> DetrSystem:
    torch.manual_seed(0)
    category_map = CategoryMap.from_coco_categories(ANIMALS, contiguous=True)
    return DetrSystem(detr=detr, **settings, category_map=category_map, evaluation=EvaluationOptions(evaluation_dir=""))


def _trainer(tmp_path, **kwargs) -> L.Trainer:
    options = dict(accelerator="cpu", devices=1, max_steps=2, limit_val_batches=2, num_sanity_val_steps=0,
                   enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
                   logger=L.pytorch.loggers.CSVLogger(tmp_path), default_root_dir=tmp_path)
    options.update(kwargs)
    return L.Trainer(**options)


def test_fit_logs_every_term_and_coco_stats(tmp_path, caplog) -> None:
    system = _system()
    trainer = _trainer(tmp_path, enable_checkpointing=False)
    with caplog.at_level(logging.INFO, logger="detr.lightning.evaluation"):
        trainer.fit(system, datamodule=animal_data())
    backend = resolve_backend("auto")  # faster_coco_eval where installed
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("COCO evaluation on")]
    assert said == [f"COCO evaluation on {backend} (evaluator_backend 'auto'), once on rank 0 of 1 process(es)"]
    assert system.last_evaluation.backend == backend
    logged = trainer.logged_metrics
    for name in ("train/loss", "train/loss_ce", "train/loss_bbox", "train/loss_giou", "train/loss_ce_0",
                 "train/loss_bbox_0", "train/loss_giou_0", "train/class_error", "train/cardinality_error",
                 "val/loss", "val/AP", "val/AP50", "val/AP75", "val/APs", "val/APm", "val/APl", "val/AR100"):
        assert name in logged, name
    assert {"train/loss", "train/class_error", "val/AP"} <= set(trainer.progress_bar_metrics)
    assert system.last_evaluation is not None and system.last_evaluation.image_ids == [1, 2, 3, 4]
    assert {r["category_id"] for r in system.last_evaluation.results} <= {4, 9, 17}  # data set ids
    # the validation's best threshold is the system's, and goes into its checkpoints: the commands' default
    assert system.last_evaluation.best_threshold is not None
    assert system.score_threshold == system.last_evaluation.best_threshold
    checkpoint: dict = {}
    system.on_save_checkpoint(checkpoint)
    assert checkpoint["detr"]["score_threshold"] == system.score_threshold
    restored = _system()
    restored.on_load_checkpoint(checkpoint)
    assert restored.score_threshold == system.score_threshold


def test_a_validation_without_a_best_threshold_records_none_and_says_so(tmp_path, caplog, monkeypatch) -> None:
    """TH3: where F1 is 0 at every threshold the validation recorded 0.95 (or kept an older run's threshold)
    as these weights' best: it records none, and says so."""
    from detr.evaluation import coco_evaluator

    monkeypatch.setattr(coco_evaluator, "f1_best_threshold", lambda coco_eval: None)
    system = _system()
    system.score_threshold = 0.4  # what an earlier validation found
    with caplog.at_level(logging.WARNING, logger="detr.lightning.system"):
        _trainer(tmp_path, enable_checkpointing=False, limit_val_batches=1).fit(system, datamodule=animal_data())
    assert system.score_threshold is None
    assert any("no best threshold is recorded" in record.getMessage() for record in caplog.records)


def test_bf16_mixed_precision_trains_with_a_float32_loss(tmp_path) -> None:
    system = _system()
    trainer = _trainer(tmp_path, enable_checkpointing=False, precision="bf16-mixed", limit_val_batches=1)
    trainer.fit(system, datamodule=animal_data())
    assert torch.isfinite(trainer.logged_metrics["train/loss"])
    assert trainer.logged_metrics["train/loss"].dtype == torch.float32
    assert "val/AP" in trainer.logged_metrics


class GradientNorms(L.Callback):
    """The global gradient norm the optimizer stepped with (read before the next step zeroes it)."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_before_zero_grad(self, trainer, module, optimizer) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if grads:
            self.norms.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_gradients_are_clipped_to_the_recipes_norm_in_every_precision(tmp_path, precision) -> None:
    """The recipe's gradient_clip_val 0.1 with the fused AdamW: Lightning's bf16-mixed plugin refused it
    ("does not allow for gradient clipping"), so `detr fit --trainer.precision bf16-mixed` failed at the
    first step on every model config."""
    norms = GradientNorms()
    trainer = _trainer(tmp_path, enable_checkpointing=False, precision=precision, gradient_clip_val=0.1, max_steps=4,
                       limit_val_batches=0, callbacks=[norms])
    trainer.fit(_system(), datamodule=animal_data())
    assert trainer.global_step == 4 and len(norms.norms) == 3
    assert max(norms.norms) <= 0.1 * (1 + 1e-3), norms.norms


def test_total_loss_is_the_weighted_sum() -> None:
    system = _system()
    images, mask, targets = collate_unpadded(animal_samples()[:2])
    losses = system.compute_losses(system(images, mask), targets)
    expected = sum(losses[k] * w for k, w in system.criterion.weight_dict.items())
    assert torch.allclose(losses["loss"], expected)
    assert system.criterion.weight_dict["loss_bbox_0"] == 5.0 and system.criterion.weight_dict["loss_giou"] == 2.0
    assert system.reduced_num_boxes(targets) == 3.0
    assert system.reduced_num_boxes([targets[0] | {"labels": torch.zeros(0, dtype=torch.int64)}]) == 1.0  # clamp


def test_optimizer_groups_and_step_decay() -> None:
    system = _system(optimizer=OptimizerRecipe(lr=1e-4, lr_backbone=1e-5, weight_decay=1e-4, lr_drop_epochs=[2]))
    (optimizer,), (schedule,) = system.configure_optimizers()
    scheduler = schedule["scheduler"]
    assert schedule["interval"] == "epoch"
    groups = {g["name"]: g for g in optimizer.param_groups}
    backbone_ids = {id(p) for n, p in system.model.named_parameters() if n.startswith("backbone.") and p.requires_grad}
    assert {id(p) for p in groups["backbone"]["params"]} == backbone_ids
    assert groups["backbone"]["lr"] == 1e-5 and groups["transformer"]["lr"] == 1e-4
    assert all(g["weight_decay"] == 1e-4 for g in optimizer.param_groups)
    trainable = {id(p) for p in system.model.parameters() if p.requires_grad}
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == trainable
    for _ in range(2):
        optimizer.step()
        scheduler.step()
    assert groups["transformer"]["lr"] == pytest.approx(1e-5) and groups["backbone"]["lr"] == pytest.approx(1e-6)


def test_linear_warmup_then_step_decay() -> None:
    system = _system(optimizer=OptimizerRecipe(lr=1e-4, lr_backbone=1e-5, warmup_steps=4, lr_drop_epochs=[1]))
    (optimizer,), (decay, warmup) = system.configure_optimizers()
    assert warmup["interval"] == "step" and decay["interval"] == "epoch"
    lrs = []
    for _ in range(6):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        warmup["scheduler"].step()
    assert lrs[0] == pytest.approx(1e-7) and lrs[4] == pytest.approx(1e-4) and lrs[5] == pytest.approx(1e-4)
    decay["scheduler"].step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-5)


def test_convergence_options_train_and_evaluate(tmp_path) -> None:
    """Anchor queries + denoising + sigmoid/focal head + query groups + dense head + NHWC bfloat16 backbone
    (docs/measurements/convergence.md) go through the same training system."""
    system = _system(TINY.replace(query_type="anchor", denoising=True, denoising_groups=2, class_head="sigmoid",
                                  query_groups=2, dense_aux_head=True), loss=LossRecipe(cost_class=2.0),
                     runtime=RuntimeOptions(channels_last=True, backbone_bf16=True))
    assert "loss_ce_dn" in system.criterion.weight_dict and system.postprocess.class_head == "sigmoid"
    assert system.model.backbone[0].autocast_dtype == torch.bfloat16
    assert "loss_ce_dense" in system.criterion.weight_dict and system.model.backbone[0].channels_last
    assert system.model.backbone[0].body.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    trainer = _trainer(tmp_path, enable_checkpointing=False)
    trainer.fit(system, datamodule=animal_data())
    assert {"train/loss_bbox_dn", "train/loss_ce_dn_0", "train/loss_giou_dense", "val/AP"} <= set(trainer.logged_metrics)
    assert torch.isfinite(trainer.logged_metrics["train/loss"])


def test_checkpoint_carries_config_and_category_map(tmp_path) -> None:
    system = _system()
    trainer = _trainer(tmp_path, max_steps=1, limit_val_batches=0)
    trainer.fit(system, datamodule=animal_data())
    path = tmp_path / "system.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)  # no pickled objects
    assert checkpoint["detr"]["model_config"] == system.model.config.to_dict()
    assert checkpoint["detr"]["category_map"] == {"category_ids": [4, 9, 17], "names": ["cat", "dog", "fish"]}
    assert all(k.startswith(("model.", "criterion.")) for k in checkpoint["state_dict"])

    model = load_checkpoint(path)
    assert model.meta.category_map.names == ("cat", "dog", "fish") and model.num_classes == 3
    images, mask, _ = collate_unpadded(animal_samples()[:2])
    system.eval()
    with torch.no_grad():
        assert torch.allclose(model(images, mask).boxes, system(images, mask).boxes)

    restored = DetrSystem.load_from_checkpoint(path)
    assert restored.category_map == system.category_map


def test_predict_step_returns_every_querys_prediction_as_the_predictor_makes_them() -> None:
    system = _system().eval()
    images, mask, targets = collate_unpadded(animal_samples()[:2])
    targets = [{k: t[k] for k in ("image_id", "orig_size", "size")} | {"file_name": f"{i}.png"}
               for i, t in enumerate(targets)]
    targets[1]["error"] = "cannot read 1.png"  # an unreadable image's placeholder
    with torch.no_grad():
        results = system.predict_step((images, mask, targets), 0)
    assert [r.file_name for r in results] == ["0.png", "1.png"]
    assert results[0].boxes.shape == (10, 4) and results[0].scores.shape == (10,) and results[0].error is None
    assert set(results[0].label_names) <= {"cat", "dog", "fish"}  # the data set's names
    assert len(results[1]) == 0 and results[1].error == "cannot read 1.png"


def test_non_finite_predictions_stop_with_step(tmp_path) -> None:
    system = _system()
    with torch.no_grad():
        system.model.class_embed.bias[0] = float("nan")
    trainer = _trainer(tmp_path, enable_checkpointing=False)
    before = system.model.query_embed.weight.detach().clone()
    with pytest.raises(NonFiniteLossError, match=r"global step 0 \(epoch 0, batch 0\).*logits 20"):
        trainer.fit(system, datamodule=animal_data())
    assert torch.equal(system.model.query_embed.weight, before)  # nothing was written


def test_non_finite_loss_names_step_and_terms(tmp_path, monkeypatch) -> None:
    system = _system()
    trainer = _trainer(tmp_path, enable_checkpointing=False, max_steps=3)
    original = system.criterion.loss_boxes

    def explode_at_third_step(*args, **kwargs):
        losses = original(*args, **kwargs)
        if trainer.global_step == 2:
            losses["loss_giou"] = losses["loss_giou"] * float("inf")
        return losses

    monkeypatch.setattr(system.criterion, "loss_boxes", explode_at_third_step)
    with pytest.raises(NonFiniteLossError, match=r"global step 2 \(epoch 1, batch 0\).*loss_giou=inf"):
        trainer.fit(system, datamodule=animal_data())
    assert trainer.global_step == 2  # the third update never happened


def test_category_map_must_match_num_classes() -> None:
    with pytest.raises(ValueError, match="num_classes"):
        DetrSystem(detr=TINY.replace(num_classes=5), category_map={"category_ids": [1], "names": ["a"]})


@pytest.mark.parametrize("has_bfloat16", [True, False])
def test_backbone_bf16_runs_in_float32_on_a_cpu_without_bfloat16(monkeypatch, tmp_path, has_bfloat16) -> None:
    """On a CPU without AVX512-BF16 / AMX, bfloat16 is emulated and slower: the system falls back to float32."""
    import detr.lightning.system as system_module

    monkeypatch.setattr(system_module, "cpu_has_bfloat16", lambda: has_bfloat16)
    system = _system(runtime=RuntimeOptions(backbone_bf16=True))
    system.trainer = _trainer(tmp_path, enable_checkpointing=False)
    system.setup("fit")
    assert system.model.backbone[0].autocast_dtype == (torch.bfloat16 if has_bfloat16 else None)
