"""detr.visualize.figures: paper Fig. 6 (decoder) and Fig. 3 (encoder) attention figures."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from detr import CategoryMap, build_detr
from detr.inference.predictor import Predictor
from detr.visualize.figures import decoder_attention_figure, encoder_attention_figure, select_queries
from tests.helpers import TINY, load_tool

NAMES = CategoryMap(category_ids=(1, 2, 3, 4, 5), names=("ant", "bee", "cat", "dog", "eel"))


@pytest.fixture(scope="module")
def predictor(tmp_path_factory) -> Predictor:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ckpt") / "tiny.pth"
    torch.save({"model": build_detr(TINY, dropout=0.0).state_dict()}, path)
    return Predictor.from_checkpoint(path, device="cpu", num_heads=TINY.num_heads, category_map=NAMES,
                                     min_size=64, max_size=100)


def overlay(ax) -> np.ndarray:
    """The attention map of a panel: its last image artist's data."""
    return np.asarray(ax.get_images()[-1].get_array())


@pytest.mark.parametrize("mode", ["L", "RGBA"])
def test_one_normalised_panel_per_kept_query(predictor, mode):
    rng = np.random.default_rng(0)
    channels = {"L": (), "RGBA": (4,)}[mode]
    image = Image.fromarray(rng.integers(0, 256, (60, 90, *channels), dtype=np.uint8), mode)
    (prediction,) = predictor.predict(image, return_attention=True)
    threshold = float(prediction.attention.scores.median())
    kept = select_queries(prediction, threshold=threshold)
    assert 0 < kept.numel() < 10

    figure = decoder_attention_figure(image, prediction, threshold=threshold)
    assert len(figure.axes) == kept.numel()
    for ax, query in zip(figure.axes, kept.tolist()):
        values = overlay(ax)
        assert values.shape == (60, 90)
        assert values.min() == pytest.approx(0.0) and values.max() == pytest.approx(1.0)
        name = ax.get_title().rsplit(" ", 1)[0]
        assert name in NAMES.names
    scores = [float(ax.get_title().rsplit(" ", 1)[1]) for ax in figure.axes]
    assert scores == sorted(scores, reverse=True)  # best first

    top = decoder_attention_figure(image, prediction, top_k=3, layer=0, head=1)
    assert len(top.axes) == 3 and "layer 1/2, head 1" in top.get_suptitle()
    figure.savefig(io.BytesIO(), format="png", dpi=30)  # renders


def test_all_queries_grid_names_no_object(predictor):
    image = np.zeros((64, 64, 3), np.uint8)
    (prediction,) = predictor.predict(image, return_attention=True)
    attention = prediction.attention  # make query 0 a sure "no object", query 1 a likely "dog"
    attention.scores[:2] = torch.tensor([0.001, 0.97])
    attention.labels[1] = 3
    attention.no_object_scores[:2] = torch.tensor([0.998, 0.02])
    figure = decoder_attention_figure(image, prediction, all_queries=True)
    assert len(figure.axes) == 10
    assert figure.axes[0].get_title() == "no object 1.00"
    assert figure.axes[1].get_title() == "dog 0.97"
    assert all(overlay(ax).shape == (64, 64) for ax in figure.axes)


def test_encoder_figure_points(predictor):
    image = np.zeros((60, 90), np.uint8)
    (prediction,) = predictor.predict(image, return_attention=True)
    figure = encoder_attention_figure(image, prediction, points=[(10.0, 10.0), (80.0, 50.0)])
    assert len(figure.axes) == 3  # the image with points, then one map per point
    for ax in figure.axes[1:]:
        values = overlay(ax)
        assert values.shape == (60, 90) and values.max() == pytest.approx(1.0)
    assert len(encoder_attention_figure(image, prediction, num_points=3).axes) == 4
    with pytest.raises(ValueError, match="outside"):
        encoder_attention_figure(image, prediction, points=[(100.0, 10.0)])


def test_figures_need_attention_and_valid_layer(predictor):
    image = np.zeros((64, 64, 3), np.uint8)
    (plain,) = predictor.predict(image)
    with pytest.raises(ValueError, match="return_attention"):
        decoder_attention_figure(image, plain)
    (prediction,) = predictor.predict(image, return_attention=True)
    with pytest.raises(ValueError, match="layer"):
        decoder_attention_figure(image, prediction, layer=2, top_k=1)
    with pytest.raises(ValueError, match="head"):
        decoder_attention_figure(image, prediction, head=2, top_k=1)
    with pytest.raises(ValueError, match="predicted"):
        decoder_attention_figure(np.zeros((32, 32, 3), np.uint8), prediction, top_k=1)


def test_visualize_attention_tool_writes_both_figures(tmp_path):
    torch.manual_seed(0)
    checkpoint = tmp_path / "tiny.pth"
    torch.save({"model": build_detr(TINY, dropout=0.0).state_dict()}, checkpoint)
    image = tmp_path / "gray.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 72), dtype=np.uint8), "L").save(image)
    out = tmp_path / "figures" / "attention.png"
    status = load_tool("visualize_attention").main([
        str(image), "--checkpoint", str(checkpoint), "--out", str(out), "--top-k", "2", "--encoder",
        "--min-size", "64", "--max-size", "100", "--device", "cpu", "--dpi", "40",
    ])
    assert status == 0
    assert Image.open(out).format == "PNG"
    assert Image.open(out.with_name("attention_encoder.png")).format == "PNG"


def test_visualize_attention_tool_prints_the_file_it_writes(tmp_path, capsys):
    """--out NAME without a suffix printed NAME while matplotlib wrote NAME.png; a suffix matplotlib cannot write
    ended in its traceback after the model had run."""
    torch.manual_seed(0)
    checkpoint = tmp_path / "tiny.pth"
    torch.save({"model": build_detr(TINY, dropout=0.0).state_dict()}, checkpoint)
    image = tmp_path / "gray.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 72), dtype=np.uint8), "L").save(image)
    common = [str(image), "--checkpoint", str(checkpoint), "--top-k", "1", "--min-size", "64", "--max-size", "100",
              "--device", "cpu", "--dpi", "40"]
    assert load_tool("visualize_attention").main([*common, "--out", str(tmp_path / "attention"), "--encoder"]) == 0
    printed = capsys.readouterr().out
    for written in (tmp_path / "attention.png", tmp_path / "attention_encoder.png"):
        assert f"-> {written}\n" in printed and Image.open(written).format == "PNG"
    assert not (tmp_path / "attention").exists()
    with pytest.raises(SystemExit) as refusal:
        load_tool("visualize_attention").main([*common, "--out", str(tmp_path / "attention.v2")])
    assert refusal.value.code == 2
    assert "cannot write .v2 figures" in capsys.readouterr().err and not (tmp_path / "attention.v2").exists()


@pytest.mark.parametrize("size", [(500, 1), (1, 500)])  # (width, height)
def test_visualize_attention_tool_names_an_image_too_thin_to_resize(tmp_path, capsys, size):
    """An image whose short side would resize to 0 px (OpenCV's bare "inv_scale_x > 0" before) is reported
    with its file name and size, as detr-predict and the explorer report it, and nothing is drawn."""
    torch.manual_seed(0)
    checkpoint = tmp_path / "tiny.pth"
    torch.save({"model": build_detr(TINY, dropout=0.0).state_dict()}, checkpoint)
    image = tmp_path / "sliver.png"
    Image.new("RGB", size).save(image)
    out = tmp_path / "attention.png"
    status = load_tool("visualize_attention").main([
        str(image), "--checkpoint", str(checkpoint), "--out", str(out), "--min-size", "64", "--max-size", "100",
        "--device", "cpu",
    ])
    err = capsys.readouterr().err
    assert status == 1 and "sliver.png" in err and "too thin" in err and f"{size[0]}×{size[1]}" in err
    assert "cv2" not in err and not out.exists()
