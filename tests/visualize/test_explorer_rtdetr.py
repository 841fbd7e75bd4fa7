"""The attention explorer on RT-DETR: detr-explore on this project's RT-DETR checkpoint writes a page whose
sampling points and weights, decoded back from the HTML, equal the Predictor's, over the family's three levels
at its square input; and the checkpoint itself round-trips (config, meta, outputs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detr import build_detr, load_checkpoint
from detr.models.rtdetr.config import RTDETRConfig
from detr.checkpoints import save_checkpoint
from detr.commands import explore
from detr.inference.predictor import Predictor

from detr.visualize.explorer.data import POINT_UNITS, WEIGHT_UNITS
from tests.helpers import REPO, randomise, read_sampling_page

PHOTO = REPO / "data" / "photos" / "chelsea.png"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_detr(RTDETRConfig(class_head="sigmoid", backbone="resnet18", hidden_dim=32, num_heads=4,
                                    dim_feedforward=48, num_decoder_layers=2, num_queries=12, num_classes=5,
                                    dropout=0.0, num_points=2, num_feature_levels=3, num_encoder_layers=6,
                                    denoising=False)).eval()
    randomise(model, 1)
    model.meta = model.meta.replace(eval_size=(160, 160))
    return model


def test_checkpoint_round_trips(model, tmp_path):
    loaded = load_checkpoint(save_checkpoint(model, tmp_path / "rtdetr.ckpt"))
    assert loaded.config == model.config and loaded.meta == model.meta and loaded.input_spec.size == 160
    images = torch.rand(1, 3, 160, 160)
    with torch.no_grad():
        assert torch.equal(loaded(images, torch.zeros(1, 160, 160, dtype=torch.bool)).boxes,
                           model(images, torch.zeros(1, 160, 160, dtype=torch.bool)).boxes)


def test_detr_explore_writes_the_sampling_points_the_predictor_reports(model, tmp_path, capsys):
    checkpoint = save_checkpoint(model, tmp_path / "rtdetr.ckpt")
    out = tmp_path / "pages"
    status = explore.main([str(PHOTO), "--checkpoint", str(checkpoint), "--out", str(out), "--device", "cpu",
                           "--threshold", "0.0"])
    assert status == 0 and str(out / "chelsea.html") in capsys.readouterr().out
    data = read_sampling_page(out / "chelsea.html")
    prediction = Predictor(model, device="cpu").predict(PHOTO, threshold=0.0, return_attention=True)[0]
    sampling = prediction.sampling
    assert data["kind"] == "sampling" and (data["num_layers"], data["num_queries"], data["num_heads"]) == (2, 12, 4)
    assert data["sampling"]["shape"] == [2, 12, 4, 3, 2] == list(sampling.weights.shape)
    assert [level["stride"] for level in data["feature"]["levels"]] == list(sampling.strides) == [8, 16, 32]
    assert [[level["height"], level["width"]] for level in data["feature"]["levels"]] == [[20, 20], [10, 10], [5, 5]]
    height, width = prediction.image_size
    pixels = data["sampling"]["points"] * np.array([width, height])
    assert np.abs(pixels - sampling.points.numpy()).max() <= 0.5 / POINT_UNITS * max(width, height) + 1e-3
    assert np.abs(data["sampling"]["weights"] - sampling.weights.numpy()).max() <= 0.5 / WEIGHT_UNITS + 1e-7
    assert data["prediction_layers"] == [1, 2] and data["no_object_label"] is None
