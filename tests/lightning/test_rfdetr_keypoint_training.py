"""RF-DETR with keypoints through `detr fit`: a tiny GroupPose keypoint model trains a few steps on the synthetic
keypoint set (``detr-make-shapes --keypoints``) with every keypoint term and the validation's OKS AP logged, and its
checkpoint predicts each detection's keypoints; a keypoint model on data without keypoints, or with other counts, is refused in one line."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from detr import Predictor, load_checkpoint
from detr.data.shapes import ShapesConfig, write_shapes_dataset
from detr.lightning.cli import main
from detr.lightning.system import SettingError

pytestmark = pytest.mark.usefixtures("one_thread", "bare_argv")

COUNTS = [1, 4, 3, 2, 5]  # circle, square, triangle, ellipse, star
TINY = {"family": "rfdetr", "hidden_dim": 32, "num_heads": 4, "cross_attention_heads": 8, "dim_feedforward": 64,
        "num_decoder_layers": 2, "num_queries": 6, "query_groups": 2, "projector_blocks": 1,
        "pretrained_backbone": False, "keypoint_projector": True, "num_keypoints_per_class": COUNTS,
        "vit": {"width": 32, "depth": 2, "heads": 2, "mlp_dim": 64, "out_indices": [1, 2], "patch_size": 8,
                "num_windows": 2, "position_size": 64}}


@pytest.fixture(scope="module")
def keypoint_shapes(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("keypoint_shapes")
    write_shapes_dataset(root, ShapesConfig(num_train=4, num_val=2, image_size=64, min_object_size=12,
                                            max_object_size=24, keypoints=True, seed=3))
    return root


def _args(tmp_path: Path, data_root: Path, *extra: str, **detector) -> list[str]:
    config = tmp_path / "keypoints.yaml"
    config.write_text(yaml.safe_dump({
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "devices": 1, "precision": "32-true", "num_sanity_val_steps": 0},
        "model": {"detr": {**TINY, **detector}},
        "data": {"square_size": 64, "normalize": True, "keypoints": True},
    }))
    return ["fit", "--config", str(config), f"--data.root={data_root}", "--data.batch_size=2",
            "--data.val_batch_size=2", "--data.num_workers=0", f"--trainer.default_root_dir={tmp_path / 'run'}",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.max_epochs=-1",
            "--trainer.log_every_n_steps=1", *extra]


def test_fit_trains_the_keypoint_terms_and_the_checkpoint_predicts_keypoints(keypoint_shapes, tmp_path):
    assert main(_args(tmp_path, keypoint_shapes, "--trainer.max_steps=2")) == 0
    with (tmp_path / "run" / "metrics.csv").open() as file:
        rows = list(csv.DictReader(file))
    terms = [f"train/loss_keypoints_{term}{suffix}" for term in ("l1", "findable", "visible", "nll")
             for suffix in ("", "_0", "_enc")]
    logged = [float(row[name]) for row in rows for name in terms if row.get(name)]
    assert len(logged) == 2 * len(terms) and all(math.isfinite(value) for value in logged)
    assert any(row.get("val/keypoint_AP") for row in rows) and any(row.get("val/AP") for row in rows)  # OKS AP
    model = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert model.config.num_keypoints_per_class == tuple(COUNTS)
    image = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    prediction = Predictor(model).predict_arrays([image], threshold=0.0)[0]
    assert prediction.keypoints is not None and prediction.keypoints.shape == (len(prediction.boxes), 5, 3)
    # the data's skeletons (1-based outline edges in its json) kept by the checkpoint, 0-based, for drawing
    skeletons = model.meta.category_map.skeletons
    assert skeletons[1] == ((0, 1), (1, 2), (2, 3), (3, 0)) and skeletons[4][-1] == (4, 0)  # square, star


def test_detr_predict_draws_the_checkpoints_skeletons(keypoint_shapes, tmp_path, monkeypatch):
    from detr.inference import outputs

    assert main(_args(tmp_path, keypoint_shapes, "--trainer.max_steps=1")) == 0
    drawn = []
    real = outputs.draw_prediction
    monkeypatch.setattr(outputs, "draw_prediction",
                        lambda image, prediction, **kwargs: drawn.append(prediction.keypoint_skeletons)
                        or real(image, prediction, **kwargs))
    predictor = Predictor(load_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt"))
    outputs.predict_files(predictor, [next((keypoint_shapes / "val2017").iterdir())], tmp_path / "out",
                          all_queries=True)
    assert drawn and drawn[0][1] == ((0, 1), (1, 2), (2, 3), (3, 0))
    # predictions.json lists each detection's own points, as many as its category names in the data's json
    names = {c["id"]: len(c["keypoints"]) for c in json.loads((keypoint_shapes / "annotations" /
                                                               "instances_val2017.json").read_text())["categories"]}
    written = json.loads((tmp_path / "out" / "predictions.json").read_text())
    assert written and all(len(entry["keypoints"]) == 3 * names[entry["category_id"]] for entry in written)


@pytest.mark.parametrize(("extra", "detector", "message"), [
    (["--data.keypoints=false"], {}, "--data.keypoints true"),
    ([], {"num_keypoints_per_class": [1, 4, 3, 2, 4]}, r"num_keypoints_per_class \[1,4,3,2,5\]"),
], ids=["no keypoints", "other counts"])
def test_a_keypoint_model_on_data_that_cannot_train_it_is_refused(keypoint_shapes, tmp_path, extra, detector,
                                                                  message):
    with pytest.raises(SettingError, match=message) as error:
        main(_args(tmp_path, keypoint_shapes, "--trainer.max_steps=1", *extra, **detector))
    assert "\n" not in str(error.value)
