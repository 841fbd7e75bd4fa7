"""A family is a folder: tests/toy_family/ declares a config, a builder, a preset and its record, with no change
under detr/, and every command runs it: ``detr fit``, ``detr validate``, the Predictor, ``detr-export`` (ONNX) and
``detr-serve``'s application. docs/layout.md's "what a new family adds" is the checklist in that folder's
docstring."""

from __future__ import annotations

import io

import pytest
from fastapi.testclient import TestClient
from PIL import Image

import tests.toy_family as toy
from detr import Predictor, load_checkpoint
from detr.commands import export
from detr.lightning.cli import main
from detr.models.family import family_named, family_of
from detr.serving.app import create_app
from detr.serving.service import DetectionService
from tests.helpers import REPO

pytestmark = pytest.mark.usefixtures("one_thread")

FIT = ["--trainer.max_steps=2", "--trainer.max_epochs=-1", "--trainer.check_val_every_n_epoch=1",
       "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--data.batch_size=2",
       "--data.val_batch_size=2", "--data.num_workers=0", "--data.train_scales=[64]", "--data.train_max_size=64",
       "--data.crop_resize_scales=[64]", "--data.crop_min_size=64", "--data.crop_max_size=64",
       "--data.eval_min_size=64", "--data.eval_max_size=64", "--model.backbone_bf16=false"]


def test_the_toy_family_is_one_record_found_by_its_config():
    assert family_named("toy") is toy.FAMILY and family_of(toy.toy_tiny()) is toy.FAMILY


def test_a_family_from_tests_trains_validates_predicts_exports_and_serves(tiny_shapes_root, tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", ["detr"])
    run = tmp_path / "run"
    common = ["--model.detr", "toy_tiny", f"--data.root={tiny_shapes_root}", *FIT,
              f"--trainer.default_root_dir={run}"]
    assert main(["fit", *common]) in (0, None)
    checkpoint = run / "checkpoints" / "last.ckpt"
    model = load_checkpoint(checkpoint)
    assert isinstance(model.config, toy.ToyConfig) and model.config.num_classes == 5
    assert main(["validate", *common, f"--ckpt_path={checkpoint}"]) in (0, None)

    predictor = Predictor.from_checkpoint(checkpoint, device="cpu")
    photo = REPO / "tests" / "data" / "chelsea.png"
    [prediction] = predictor.predict(photo, all_queries=True)
    assert len(prediction.labels) == model.config.num_queries

    assert export.main([str(checkpoint), "--out", str(tmp_path / "toy.onnx")]) == 0
    assert (tmp_path / "toy.onnx").is_file()

    image = io.BytesIO()
    Image.open(photo).convert("RGB").save(image, format="PNG")
    with TestClient(create_app(DetectionService(predictor, model_name="toy"))) as client:
        response = client.post("/predict", files={"image": ("chelsea.png", image.getvalue(), "image/png")})
    assert response.status_code == 200, response.text
