"""Deformable DETR's sampling-point figure: the Predictor's SamplingPoints (pixels of the original image, one
weight per point), the figure per object and level, and detr-visualize-attention on a Deformable checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detr import build_detr
from detr.checkpoints import save_checkpoint
from detr.commands import visualize_attention
from detr.inference.predictor import Predictor
from detr.visualize.sampling import level_shares, sampling_points_figure
from tests.helpers import REPO, randomise, tiny_config_with

PHOTO = REPO / "data" / "photos" / "chelsea.png"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    model = build_detr(tiny_config_with(architecture="deformable", class_head="sigmoid", num_points=3,
                                        dropout=0.0, box_refine=True)).eval()
    randomise(model, 1)
    model.meta = model.meta.replace(eval_size=(160, 240))
    return model


def test_the_predictor_gives_sampling_points_in_image_pixels(model):
    prediction = Predictor(model, device="cpu").predict(PHOTO, threshold=0.0, return_attention=True)[0]
    sampling = prediction.sampling
    config = model.config
    assert prediction.attention is None and sampling is not None
    assert sampling.points.shape == (config.num_decoder_layers, config.num_queries, config.num_heads,
                                     config.num_feature_levels, 3, 2)
    assert sampling.strides == (8, 16, 32, 64)
    assert torch.allclose(sampling.weights.sum((-1, -2)), torch.ones(()), atol=1e-5)
    height, width = prediction.image_size
    # reference points lie inside the image; the points around them mostly too (a random model's offsets
    # reach a few cells out)
    inside = ((sampling.points[..., 0] >= -0.5 * width) & (sampling.points[..., 0] <= 1.5 * width)
              & (sampling.points[..., 1] >= -0.5 * height) & (sampling.points[..., 1] <= 1.5 * height))
    assert inside.float().mean() > 0.9
    shares = level_shares(prediction, 0)
    assert shares.shape == (4,) and abs(float(shares.sum()) - 1) < 1e-5


def test_the_figure_has_a_panel_per_object_and_level(model):
    prediction = Predictor(model, device="cpu").predict(PHOTO, threshold=0.0, return_attention=True)[0]
    figure = sampling_points_figure(PHOTO, prediction, top_k=2)
    panels = [ax for ax in figure.axes if ax.images]
    assert len(panels) == 2 * 4
    assert all(len(ax.collections) == model.config.num_heads for ax in panels)  # one scatter per head
    with pytest.raises(ValueError, match="pass the image that was predicted"):
        sampling_points_figure(np.zeros((10, 10, 3), dtype=np.uint8), prediction)


def test_detr_visualize_attention_draws_a_deformable_checkpoint(model, tmp_path, capsys):
    checkpoint = save_checkpoint(model, tmp_path / "deformable.ckpt")
    out = tmp_path / "sampling.png"
    status = visualize_attention.main([str(PHOTO), "--checkpoint", str(checkpoint), "--out", str(out),
                                       "--top-k", "2", "--device", "cpu"])
    assert status == 0 and out.stat().st_size > 10_000
    assert "deformable sampling points" in capsys.readouterr().out
    # --encoder has no figure to draw on a deformable encoder: it says so (it was ignored without a word)
    status = visualize_attention.main([str(PHOTO), "--checkpoint", str(checkpoint), "--out", str(out),
                                       "--top-k", "2", "--device", "cpu", "--encoder"])
    assert status == 0 and "no encoder figure" in capsys.readouterr().err

