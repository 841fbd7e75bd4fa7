"""The attention explorer on Deformable DETR: the page's sampling points and weights, decoded back from the
HTML, equal the Predictor's :class:`~detr.inference.prediction.SamplingPoints`; the page is self-contained;
detr-explore writes it from a saved Deformable checkpoint."""

from __future__ import annotations

import base64
import re

import numpy as np
import pytest
import torch

from detr import build_detr
from detr.checkpoints import save_checkpoint
from detr.commands import explore
from detr.data.collate import pad_images
from detr.inference.images import to_rgb_array
from detr.inference.predictor import Predictor
from detr.visualize.explorer import explorer_data, write_attention_explorer
from detr.visualize.explorer.data import POINT_UNITS, WEIGHT_UNITS
from tests.helpers import REPO, randomise, read_sampling_page, tiny_config_with

PHOTO = REPO / "data" / "photos" / "chelsea.png"

pytestmark = pytest.mark.usefixtures("one_thread")


def deformable_model(**changes) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_detr(tiny_config_with(architecture="deformable", class_head="sigmoid", num_points=3,
                                        dropout=0.0, **changes)).eval()
    randomise(model, 1)
    model.meta = model.meta.replace(eval_size=(160, 240))
    return model


@pytest.fixture(scope="module")
def model():
    return deformable_model(box_refine=True)


def test_page_points_equal_the_predictions_sampling_points(model, tmp_path):
    page, = write_attention_explorer(model, [PHOTO], tmp_path, threshold=0.0, device="cpu")
    data = read_sampling_page(page)
    prediction = Predictor(model, device="cpu").predict(PHOTO, threshold=0.0, return_attention=True)[0]
    sampling = prediction.sampling
    config = model.config

    assert data["kind"] == "sampling" and "decoder" not in data and "encoder" not in data
    assert (data["num_layers"], data["num_queries"], data["num_heads"]) == (2, 10, 2)
    assert data["sampling"]["shape"] == [2, 10, 2, 4, 3] == list(sampling.weights.shape)
    assert [level["stride"] for level in data["feature"]["levels"]] == list(sampling.strides) == [8, 16, 32, 64]
    height, width = prediction.image_size
    assert (data["image"]["original_height"], data["image"]["original_width"]) == (height, width) == (300, 451)
    assert (data["image"]["height"], data["image"]["width"]) == (160, 240)  # the eval size the model saw
    # each level's cells over the 160 × 240 input: the image ran alone, so they are the model's spatial shapes
    tensor = Predictor(model, device="cpu").preprocess(to_rgb_array(PHOTO))
    with torch.no_grad():
        outputs = model(*pad_images([tensor]), return_attention=True)
    assert [[level["height"], level["width"]] for level in data["feature"]["levels"]] == \
        outputs.sampling.spatial_shapes.tolist() == [[20, 30], [10, 15], [5, 8], [3, 4]]

    # Points in pixels of the original image, as prediction.sampling has them, to a quantisation step.
    pixels = data["sampling"]["points"] * np.array([width, height])
    tolerance = 0.5 / POINT_UNITS * max(width, height) + 1e-3
    query = int(prediction.query_indices[prediction.scores.argmax()])  # the best detection, spelled out
    np.testing.assert_allclose(pixels[-1, query], sampling.points[-1, query].numpy(), rtol=0, atol=tolerance)
    assert np.abs(pixels - sampling.points.numpy()).max() <= tolerance  # every layer, query, head, level, point
    assert np.abs(data["sampling"]["weights"] - sampling.weights.numpy()).max() <= 0.5 / WEIGHT_UNITS + 1e-7
    np.testing.assert_allclose(data["sampling"]["weights"].sum((-1, -2)), 1.0, atol=1e-3)
    # the per-level shares the page's legend shows: the figure's level_shares
    from detr.visualize.sampling import level_shares

    np.testing.assert_allclose(data["sampling"]["weights"][-1, query].sum(-1).mean(0),
                               level_shares(prediction, query).numpy(), atol=1e-4)
    # boxes and scores as on a dense page: the sigmoid head has no "no object"
    assert data["no_object_label"] is None and len(data["class_names"]) == config.num_classes
    np.testing.assert_allclose(data["scores"], sampling.scores.numpy(), atol=1e-4)
    assert data["prediction_layers"] == [1, 2]


def test_page_is_self_contained_with_an_index(model, tmp_path):
    photos = [PHOTO, REPO / "data" / "photos" / "astronaut.png"]
    paths = write_attention_explorer(model, photos, tmp_path, device="cpu")
    assert [p.name for p in paths] == ["chelsea.html", "astronaut.html", "index.html"]
    text = paths[0].read_text(encoding="utf-8")
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', text)
    assert "<script src" not in text and 'rel="stylesheet"' not in text and "@import" not in text
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text)  # the SVG namespace is the only URL
    assert "Deformable DETR (box refinement), 4 levels × 3 points" in read_sampling_page(paths[0])["model"]
    index = paths[-1].read_text(encoding="utf-8")
    assert 'href="chelsea.html"' in index and 'href="astronaut.html"' in index


def test_explorer_data_of_a_padded_batch_and_its_errors(model):
    predictor = Predictor(model, device="cpu", min_size=64, max_size=200)
    large, small = predictor.preprocess(np.zeros((64, 128, 3), np.uint8)), predictor.preprocess(
        np.zeros((64, 72, 3), np.uint8))
    with torch.no_grad():
        outputs = model(*pad_images([large, small]), return_attention=True)
    common = dict(image=np.zeros((64, 72, 3), np.uint8), original_size=(64, 72), class_names=[f"c{i}" for i in range(5)],
                  title="small", class_head="sigmoid")
    data = explorer_data(outputs, index=1, stride=model.stride, **common)
    # the small image's levels: the cells that cover it, not the padded batch's; points clipped to ±2 sides
    assert [[level["height"], level["width"]] for level in data["feature"]["levels"]] == [[8, 9], [4, 5], [2, 3], [1, 2]]
    assert outputs.sampling.spatial_shapes[:, 1].tolist() == [16, 8, 4, 2]
    codes = np.frombuffer(base64.b64decode(data["sampling"]["points"]), "<i2").reshape(*data["sampling"]["shape"], 2)
    points = outputs.sampling.points[:, 1].clamp(-2, 32767 / POINT_UNITS).numpy()
    np.testing.assert_allclose(codes / POINT_UNITS, points,
                               atol=0.5 / POINT_UNITS + 1e-7)
    with pytest.raises(ValueError, match="stride=model.stride"):
        explorer_data(outputs, index=1, **common)


@pytest.mark.parametrize("changes", [{}, {"box_refine": True, "two_stage": True}], ids=["plain", "two_stage"])
def test_detr_explore_writes_a_deformable_checkpoints_page(tmp_path, capsys, changes):
    checkpoint = save_checkpoint(deformable_model(**changes), tmp_path / "deformable.ckpt")
    out = tmp_path / "pages"
    status = explore.main([str(PHOTO), "--checkpoint", str(checkpoint), "--out", str(out), "--device", "cpu",
                           "--threshold", "0.2"])
    assert status == 0 and str(out / "chelsea.html") in capsys.readouterr().out
    data = read_sampling_page(out / "chelsea.html")
    assert data["kind"] == "sampling" and data["threshold"] == 0.2
    assert data["prediction_layers"] == [1, 2]  # every layer's boxes (aux outputs), refined or not
