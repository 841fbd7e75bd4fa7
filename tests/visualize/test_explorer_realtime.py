"""The attention explorer on D-FINE (3, 6 and 3 sampling points per level), DEIMv2 (DINOv3) and RF-DETR (its decoder's
cross-attention is the shared deformable attention over its projector's one level; instance masks): detr-explore on
this project's checkpoint writes a page whose sampling points and weights, decoded back from the HTML, equal the
Predictor's, at each level's own stride; a level with fewer points than the largest count has its missing points at
weight 0 and the page counts each level's own points; RF-DETR's page carries every query's mask. A model that
returns no attention (an exported file) is refused in one line. (RT-DETR: test_explorer_rtdetr.py.)"""

from __future__ import annotations

import base64

import numpy as np
import pytest

from detr.commands import explore
from detr.inference.predictor import Predictor
from detr.visualize.explorer import write_attention_explorer
from detr.visualize.explorer.data import POINT_UNITS, WEIGHT_UNITS
from tests.helpers import REPO, read_sampling_page
from tests.helpers_realtime import EVAL_SIZES, tiny_checkpoint, tiny_model

PHOTO = REPO / "data" / "photos" / "chelsea.png"

pytestmark = pytest.mark.usefixtures("one_thread")

#: Per family: the strides of its levels and each level's sampling points (D-FINE's S-X counts).
LEVELS = {"dfine": ((8, 16, 32), (3, 6, 3)), "deimv2": ((8, 16, 32), (2, 2, 2)), "rfdetr": ((14,), (4,))}


@pytest.mark.parametrize("family", sorted(LEVELS))
def test_detr_explore_writes_the_sampling_points_the_predictor_reports(family, tmp_path, capsys):
    checkpoint = tiny_checkpoint(family, tmp_path)
    out = tmp_path / "pages"
    status = explore.main([str(PHOTO), "--checkpoint", str(checkpoint), "--out", str(out), "--device", "cpu",
                           "--threshold", "0.0"])
    assert status == 0 and str(out / "chelsea.html") in capsys.readouterr().out
    data = read_sampling_page(out / "chelsea.html")
    predictor = Predictor.from_checkpoint(checkpoint, device="cpu", optimize=False)
    prediction = predictor.predict(PHOTO, threshold=0.0, return_attention=True)[0]
    sampling = prediction.sampling
    strides, points_per_level = LEVELS[family]
    layers, queries = predictor.model.config.num_decoder_layers, predictor.model.num_queries
    heads = sampling.weights.shape[2]
    shape = [layers, queries, heads, len(strides), max(points_per_level)]
    assert data["kind"] == "sampling" and (data["num_layers"], data["num_queries"], data["num_heads"]) == tuple(
        shape[:3])
    assert data["sampling"]["shape"] == shape == list(sampling.weights.shape)
    side = EVAL_SIZES[family]
    assert [level["stride"] for level in data["feature"]["levels"]] == list(sampling.strides) == list(strides)
    assert [[level["height"], level["width"]] for level in data["feature"]["levels"]] == [
        [side // stride] * 2 for stride in strides]
    assert [level["points"] for level in data["feature"]["levels"]] == list(points_per_level)  # the page counts
    height, width = prediction.image_size
    pixels = data["sampling"]["points"] * np.array([width, height])
    assert np.abs(pixels - sampling.points.numpy()).max() <= 0.5 / POINT_UNITS * max(width, height) + 1e-3
    assert np.abs(data["sampling"]["weights"] - sampling.weights.numpy()).max() <= 0.5 / WEIGHT_UNITS + 1e-7
    for level, count in enumerate(points_per_level):  # a level's own points weigh, the padding does not
        assert (sampling.weights[..., level, :count] > 0).all()
        assert (sampling.weights[..., level, count:] == 0).all() and (data["sampling"]["weights"][..., level,
                                                                                                  count:] == 0).all()
    assert data["prediction_layers"] == list(range(1, layers + 1)) and data["no_object_label"] is None
    if predictor.predicts_masks:  # every query's mask probabilities, at stride 4 of the square input
        masks = data["masks"]
        assert masks["shape"] == [queries, side // 4, side // 4] and masks["stride"] == 4
        assert len(base64.b64decode(masks["maps"])) == queries * (side // 4) ** 2
    else:
        assert "masks" not in data


def test_a_model_without_attention_is_refused_in_one_line(tmp_path, capsys):
    exported = tmp_path / "rtdetr.onnx"  # refused by its kind, before it is read
    exported.write_bytes(b"")
    status = explore.main([str(PHOTO), "--checkpoint", str(exported), "--out", str(tmp_path / "pages")])
    err = capsys.readouterr().err
    assert status != 0 and err.count("\n") == 1 and "rtdetr.onnx is an exported file" in err
    assert "PyTorch checkpoint" in err and not (tmp_path / "pages").exists()
    model = tiny_model("rtdetr")
    model.attention_kind = None  # what a runtime backend's detector says
    with pytest.raises(ValueError, match="returns no attention maps or sampling points"):
        write_attention_explorer(model, [PHOTO], tmp_path / "pages")
    assert not (tmp_path / "pages").exists()
