"""The training system writes an error analysis report after validate / test, and in fit only when asked."""

from __future__ import annotations

import json

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from detr import CategoryMap
from detr.lightning import DetrSystem
from detr.lightning.options import EvaluationOptions
from tests.helpers import ANIMALS, animal_data, tiny_config_with

TINY = tiny_config_with(num_classes=3, backbone_last_stage="layer3")

pytestmark = pytest.mark.usefixtures("one_thread")


def _system(tmp_path, **evaluation) -> DetrSystem:
    torch.manual_seed(0)
    category_map = CategoryMap.from_coco_categories(ANIMALS, contiguous=True)
    return DetrSystem(detr=TINY, category_map=category_map,
                      evaluation=EvaluationOptions(evaluation_dir=str(tmp_path / "evaluation"), **evaluation))


def _trainer(tmp_path, **kwargs) -> L.Trainer:
    options = dict(accelerator="cpu", devices=1, limit_val_batches=2, num_sanity_val_steps=0,
                   enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                   logger=TensorBoardLogger(tmp_path, name="tb"), default_root_dir=tmp_path)
    options.update(kwargs)
    return L.Trainer(**options)


def test_validate_writes_the_report_and_logs_figures(tmp_path) -> None:
    system = _system(tmp_path)
    trainer = _trainer(tmp_path)
    trainer.validate(system, datamodule=animal_data(), verbose=False)
    out = tmp_path / "evaluation" / "val_analysis"
    page = (out / "report.html").read_text()
    for name in ("errors", "pr_curves", "pr_curves_per_class", "confusion_matrix"):
        assert (out / f"{name}.png").stat().st_size > 1000
    assert "data:image/png;base64," in page and "No images folder" in page
    numbers = json.loads((out / "analysis.json").read_text())
    # the evaluation's number: the same COCOeval after pycocotools, pycocotools' again after faster-coco-eval
    assert numbers["stats"]["AP50"] == pytest.approx(system.last_evaluation.stats["AP50"], rel=0, abs=1e-12)
    assert numbers["num_objects"] == 4 and numbers["num_images"] == 4
    assert system.last_evaluation.coco_eval is None  # the large per-image matches are not kept

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(trainer.logger.log_dir))
    events.Reload()
    assert {"val_analysis/errors", "val_analysis/confusion_matrix"} <= set(events.Tags()["images"])
    assert "val_analysis/dAP50_cls" in events.Tags()["scalars"]


def test_fit_analyses_only_every_n_validations(tmp_path) -> None:
    trainer = _trainer(tmp_path / "off", max_epochs=2, limit_train_batches=1)
    trainer.fit(_system(tmp_path / "off"), datamodule=animal_data())
    assert not (tmp_path / "off" / "evaluation" / "val_analysis").exists()

    system = _system(tmp_path / "on", error_analysis_every_n_validations=2)
    trainer = _trainer(tmp_path / "on", max_epochs=3, limit_train_batches=1)
    trainer.fit(system, datamodule=animal_data())
    page = tmp_path / "on" / "evaluation" / "val_analysis" / "report.html"
    assert page.exists() and "epoch 1, step 2" in page.read_text()  # the 2nd of 3 validations


def test_validate_without_analysis(tmp_path) -> None:
    _trainer(tmp_path).validate(_system(tmp_path, error_analysis=False), datamodule=animal_data(), verbose=False)
    assert (tmp_path / "evaluation" / "val_predictions.json").exists()
    assert not (tmp_path / "evaluation" / "val_analysis").exists()
