"""The attention explorer's page data: decoded back from the HTML, it equals the model's attention."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from detr import build_detr
from detr.categories import CategoryMap
from detr.data.collate import pad_images
from detr.inference.predictor import Predictor
from detr.models.config import ModelMeta
from detr.visualize.explorer import (
    explorer_data,
    feature_stride,
    quantize_maps,
    render_explorer_html,
    write_attention_explorer,
)
from tests.helpers import tiny_config_with

DATA_BLOCK = re.compile(r'<script type="application/json" id="explorer-data">(.*?)</script>', re.S)


def tiny_model(**overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_detr(tiny_config_with(**overrides)).eval()


def image(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def read_page(path: Path) -> dict:
    """The embedded data with its maps decoded to float32 arrays, as the page's script reads them."""
    match = DATA_BLOCK.search(path.read_text(encoding="utf-8"))
    assert match, "no data block in the page"
    data = json.loads(match.group(1))
    for part in ("decoder", "encoder"):
        shape = data[part]["shape"]
        codes = np.frombuffer(base64.b64decode(data[part]["maps"]), dtype=np.uint8).reshape(shape)
        scales = np.frombuffer(base64.b64decode(data[part]["scales"]), dtype="<f4").reshape(shape[:-2])
        data[part]["values"] = codes.astype(np.float32) / 255 * scales[..., None, None]
        data[part]["scales"] = scales
    return data


def test_page_data_equals_model_attention(tmp_path: Path) -> None:
    model = tiny_model()
    pixels = image(90, 140)
    page, = write_attention_explorer(model, [pixels], tmp_path, min_size=96, max_size=160, device="cpu")
    data = read_page(page)

    tensor = Predictor(model, device="cpu", min_size=96, max_size=160).preprocess(pixels)  # [3, 96, 149]
    batch, mask = pad_images([tensor])
    with torch.no_grad():
        outputs = model(batch, mask, return_attention=True)
    num_layers, _, num_heads, num_queries, h, w = outputs.attention.decoder_heads.shape
    assert (data["num_layers"], data["num_heads"], data["num_queries"]) == (2, 2, 10)
    assert (data["feature"]["height"], data["feature"]["width"], data["feature"]["stride"]) == (h, w, 32) == (3, 5, 32)
    assert (data["image"]["height"], data["image"]["width"]) == tuple(tensor.shape[1:]) == (96, 149)
    assert (data["image"]["original_height"], data["image"]["original_width"]) == (90, 140)
    assert data["decoder"]["values"].shape == (num_layers, num_heads + 1, num_queries, h, w)

    decoder = data["decoder"]["values"]
    tolerance = data["decoder"]["scales"][..., None, None] / 510 + 1e-6  # half a quantisation step
    expected_heads = outputs.attention.decoder_heads[:, 0].numpy()  # [L, heads, Q, h, w]
    expected_mean = outputs.attention.decoder[:, 0].numpy()  # [L, Q, h, w]
    assert np.all(np.abs(decoder[:, :num_heads] - expected_heads) <= tolerance[:, :num_heads])
    assert np.all(np.abs(decoder[:, num_heads] - expected_mean) <= tolerance[:, num_heads])
    layer, head, query = 1, 1, 7  # one spot check spelled out
    np.testing.assert_allclose(decoder[layer, head, query], expected_heads[layer, head, query], atol=2e-3)
    assert np.argmax(decoder[layer, head, query]) == np.argmax(expected_heads[layer, head, query])

    encoder = data["encoder"]["values"]  # [h*w, h, w]
    expected_encoder = outputs.attention.encoder[0].numpy()  # [h*w, h, w], no padding here
    assert np.all(np.abs(encoder - expected_encoder) <= data["encoder"]["scales"][:, None, None] / 510 + 1e-6)

    # Per-layer boxes and top classes: aux outputs for layer 1, pred_* for layer 2.
    assert data["prediction_layers"] == [1, 2]
    for k, layer_outputs in enumerate([outputs.aux[0], outputs]):
        np.testing.assert_allclose(data["boxes"][k], layer_outputs.boxes[0].numpy(), atol=1e-5)
        top = layer_outputs.logits[0].softmax(-1).topk(5)
        assert data["top_classes"][k] == top.indices.tolist()
        np.testing.assert_allclose(data["top_probs"][k], top.values.numpy(), atol=1e-4)
    scores, labels = outputs.logits[0].softmax(-1)[:, :-1].max(-1)
    np.testing.assert_allclose(data["scores"], scores.numpy(), atol=1e-4)
    assert data["labels"] == labels.tolist()
    assert data["class_names"] == [f"class {i}" for i in range(5)] + ["no object"]


def test_maps_are_cropped_to_the_unpadded_region() -> None:
    model = tiny_model()
    predictor = Predictor(model, device="cpu", min_size=64, max_size=200)
    small, large = predictor.preprocess(image(64, 64, 1)), predictor.preprocess(image(64, 128, 2))
    batch, mask = pad_images([large, small])  # the small image is padded on the right
    with torch.no_grad():
        outputs = model(batch, mask, return_attention=True)
    padded_h, padded_w = outputs.attention.feature_mask.shape[-2:]
    data = explorer_data(outputs, index=1, image=np.zeros((64, 64, 3), np.uint8), original_size=(64, 64),
                         class_names=[f"c{i}" for i in range(6)], title="small")
    h, w = data["feature"]["height"], data["feature"]["width"]
    assert (h, w) == (2, 2) and (padded_h, padded_w) == (2, 4)
    codes = np.frombuffer(base64.b64decode(data["decoder"]["maps"]), np.uint8).reshape(data["decoder"]["shape"])
    scales = np.frombuffer(base64.b64decode(data["decoder"]["scales"]), "<f4").reshape(codes.shape[:3])
    expected = outputs.attention.decoder[:, 1, :, :h, :w].numpy()  # [L, Q, h, w]
    np.testing.assert_allclose(codes[:, -1] / 255 * scales[:, -1, :, None, None], expected, atol=2e-3)
    encoder = np.frombuffer(base64.b64decode(data["encoder"]["maps"]), np.uint8).reshape(data["encoder"]["shape"])
    assert encoder.shape == (h * w, h, w)
    # Rows over the unpadded region still sum to one after the crop (the padding held no attention).
    np.testing.assert_allclose(expected.sum(axis=(-1, -2)), 1.0, atol=1e-5)


def test_quantize_maps_error_and_zero_maps() -> None:
    maps = torch.rand(3, 4, 5, 6) ** 4
    maps[0, 0] = 0
    codes, scales = quantize_maps(maps)
    assert codes.dtype == np.uint8 and scales.dtype == np.float32 and scales.shape == (3, 4)
    decoded = codes / 255 * scales[..., None, None]
    assert np.all(np.abs(decoded - maps.numpy()) <= scales[..., None, None] / 510 + 1e-7)
    assert scales[0, 0] == 0 and not codes[0, 0].any()
    assert codes.reshape(12, -1).max(axis=1)[1:].tolist() == [255] * 11  # each map's peak uses the full range
    with pytest.raises(ValueError, match="non-negative"):
        quantize_maps(-maps)


def test_feature_stride_rounds_up_like_resnet() -> None:
    assert feature_stride((800, 1066), (25, 34)) == 32
    assert feature_stride((40, 40), (2, 2)) == 32  # 40 / 2 = 20, yet ResNet's stride is 32
    assert feature_stride((800, 1066), (50, 67)) == 16  # DC5


def test_page_is_self_contained_and_names_classes(tmp_path: Path) -> None:
    model = tiny_model(aux_loss=False)
    names = ("cat", "dog", "</script><b>", "cup", "tie")
    model.meta = ModelMeta(category_map=CategoryMap(category_ids=(1, 2, 3, 4, 5), names=names))
    paths = write_attention_explorer(model, [image(70, 90, 3), image(80, 60, 4)], tmp_path, min_size=64,
                                     max_size=128, device="cpu", threshold=0.0)
    assert [p.name for p in paths] == ["image_000.html", "image_001.html", "index.html"]
    text = paths[0].read_text(encoding="utf-8")
    # No external resources: no src/href to the network, no script or stylesheet files.
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', text)
    assert "<script src" not in text and 'rel="stylesheet"' not in text and "@import" not in text
    data = read_page(paths[0])
    assert data["class_names"] == list(names) + ["no object"]
    assert data["prediction_layers"] == [2]  # no aux outputs: only the last layer has boxes
    assert len(data["boxes"]) == 1
    assert text.count("</script>") == 2  # the hostile class name stays inside its JSON string
    index = paths[-1].read_text(encoding="utf-8")
    assert 'href="image_000.html"' in index and 'href="image_001.html"' in index
    assert "&lt;/script&gt;&lt;b&gt;" in index and "</script><b>" not in index  # threshold 0: all listed


def test_page_names_follow_files_and_stay_unique(tmp_path: Path) -> None:
    from PIL import Image

    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        Image.fromarray(image(40, 50)).save(tmp_path / folder / "photo.png")
    paths = write_attention_explorer(tiny_model(), [tmp_path / "a" / "photo.png", tmp_path / "b" / "photo.png"],
                                     tmp_path / "out", min_size=64, max_size=96, device="cpu")
    assert [p.name for p in paths] == ["photo.html", "photo_1.html", "index.html"]
    assert read_page(paths[1])["title"] == "photo.png"


def test_errors_name_the_fix() -> None:
    model = tiny_model()
    batch, mask = pad_images([torch.zeros(3, 64, 64)])
    with torch.no_grad():
        outputs = model(batch, mask)
    with pytest.raises(ValueError, match="return_attention=True"):
        explorer_data(outputs, index=0, image=np.zeros((64, 64, 3), np.uint8), original_size=(64, 64),
                      class_names=[str(i) for i in range(6)], title="x")
    with torch.no_grad():
        outputs = model(batch, mask, return_attention=True)
    with pytest.raises(ValueError, match="one name per logit"):
        explorer_data(outputs, index=0, image=np.zeros((64, 64, 3), np.uint8), original_size=(64, 64),
                      class_names=["a"], title="x")
    with pytest.raises(ValueError, match="explorer_data"):
        render_explorer_html({"format": "something else"})
    with pytest.raises(ValueError, match="sequence"):
        write_attention_explorer(model, "photo.png", "out")  # type: ignore[arg-type]


def test_sigmoid_head_scores_every_class_without_no_object(tmp_path: Path) -> None:
    """A focal-loss model (class_head="sigmoid") has no no-object logit: scores are sigmoids of all classes."""
    from detr.visualize.explorer import write_attention_explorer

    torch.manual_seed(0)
    model = build_detr(tiny_config_with(num_queries=5, num_classes=3, query_type="anchor",
                                          class_head="sigmoid")).eval()
    with torch.no_grad():
        model.class_embed.bias.copy_(torch.tensor([-3.0, -3.0, 4.0]))  # the last real class must win
    page = write_attention_explorer(model, [image(64, 80)], tmp_path, min_size=64, max_size=96, device="cpu")[0]
    data = read_page(page)
    assert "no object" not in data["class_names"] and len(data["class_names"]) == 3
    assert data["no_object_label"] is None  # the page must not take the last real class for "no object"
    assert data["labels"] == [2] * 5
    assert all(0.9 < score < 1.0 for score in data["scores"])


def test_panoptic_pages_carry_each_querys_mask(tmp_path: Path) -> None:
    """A DETRPanoptic page holds every query's mask probability (stride 4, cropped to the image); detection
    pages hold none (checked in test_page_data_equals_model_attention's page too)."""
    from detr.models.segmentation import build_detr_panoptic

    torch.manual_seed(0)
    model = build_detr_panoptic(tiny_config_with(hidden_dim=128, num_heads=8, num_queries=4, dropout=0.0)).eval()
    pixels = image(70, 100)
    page = write_attention_explorer(model, [pixels], tmp_path, min_size=64, max_size=96, device="cpu")[0]
    data = read_page(page)
    tensor = Predictor(model, device="cpu", min_size=64, max_size=96).preprocess(pixels)  # [3, 64, 91]
    with torch.no_grad():
        outputs = model(*pad_images([tensor]))
    assert data["masks"]["shape"] == [4, 16, 23] and data["masks"]["stride"] == 4  # ceil(64 / 4), ceil(91 / 4)
    codes = np.frombuffer(base64.b64decode(data["masks"]["maps"]), np.uint8).reshape(data["masks"]["shape"])
    expected = outputs.masks[0, :, :16, :23].sigmoid().numpy()
    assert np.all(np.abs(codes / 255 - expected) <= 1 / 510 + 1e-6)

    detector = tiny_model()  # a detection model: no masks key
    detection_page = write_attention_explorer(detector, [pixels], tmp_path / "det", min_size=64, max_size=96,
                                              device="cpu")[0]
    assert "masks" not in read_page(detection_page)

    small, large = (Predictor(model, device="cpu", min_size=64, max_size=200).preprocess(image(64, w, 1))
                    for w in (64, 128))
    with torch.no_grad():
        batch_outputs = model(*pad_images([large, small]), return_attention=True)
    data = explorer_data(batch_outputs, index=1, image=np.zeros((64, 64, 3), np.uint8), original_size=(64, 64),
                         class_names=[f"c{i}" for i in range(6)], title="small")
    assert data["masks"]["shape"] == [4, 16, 16]  # the padded batch's masks cropped to the small image


def test_detr_explore_lists_each_page_once(tmp_path: Path, capsys, caplog) -> None:
    """N14: every page was listed twice (the writer's log line and the command's list)."""
    import logging

    from PIL import Image

    from detr.checkpoints import save_checkpoint
    from detr.commands import explore

    for name, seed in (("a.png", 1), ("b.png", 2)):
        Image.fromarray(image(40, 50, seed)).save(tmp_path / name)
    checkpoint = save_checkpoint(tiny_model(), tmp_path / "tiny.ckpt")
    out = tmp_path / "pages"
    with caplog.at_level(logging.DEBUG):
        status = explore.main([str(tmp_path / "a.png"), str(tmp_path / "b.png"), "--checkpoint", str(checkpoint),
                               "--out", str(out), "--device", "cpu", "--min-size", "64", "--max-size", "96"])
    assert status == 0
    shown = capsys.readouterr().out + "".join(f"{record.getMessage()}\n" for record in caplog.records
                                              if record.levelno >= logging.INFO)
    for page in ("a.html", "b.html", "index.html"):
        assert shown.count(str(out / page)) == 1, shown
