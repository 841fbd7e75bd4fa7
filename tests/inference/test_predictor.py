"""detr.inference.predictor: Predictor = model + PostProcess; boxes on the original (EXIF-rotated) image; any input mode."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from detr import CategoryMap, PostProcess, build_detr
from detr.data.collate import pad_images
from detr.data.transforms import make_eval_transform
from detr.inference.images import to_rgb_array
from detr.inference.prediction import AttentionMaps
from detr.inference.predictor import NonFiniteOutputError, Predictor
from tests.helpers import fixed_box_model

SIZES = dict(min_size=64, max_size=100)
NAMES = CategoryMap(category_ids=(3, 5, 7, 9, 11), names=("ant", "bee", "cat", "dog", "eel"))


def save_official(model: torch.nn.Module, path) -> str:
    torch.save({"model": model.state_dict()}, path)
    return str(path)


@pytest.fixture
def checkpoint(tmp_path, tiny_model) -> str:
    return save_official(tiny_model, tmp_path / "tiny.pth")


def test_predictor_equals_model_and_postprocess(checkpoint, tiny_model):
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 256, (70, 110, 3), dtype=np.uint8), rng.integers(0, 256, (90, 60, 3), dtype=np.uint8)]
    predictor = Predictor.from_checkpoint(checkpoint, device="cpu", num_heads=2, batch_size=2,
                                          category_map=NAMES, **SIZES)
    predictions = predictor.predict(arrays, all_queries=True)

    transform = make_eval_transform(**SIZES)
    images, mask = pad_images([transform(image=a, bboxes=np.zeros((0, 4)), labels=[])["image"] for a in arrays])
    with torch.no_grad():
        expected = PostProcess(clip=True)(tiny_model(images, mask), torch.tensor([a.shape[:2] for a in arrays]))

    for prediction, reference in zip(predictions, expected):
        assert len(prediction) == tiny_model.num_queries
        torch.testing.assert_close(prediction.scores, reference["scores"])
        torch.testing.assert_close(prediction.boxes, reference["boxes"])
        assert torch.equal(prediction.labels, reference["labels"])
        assert prediction.label_names == [NAMES.names[int(i)] for i in reference["labels"]]
        assert prediction.attention is None
        # The threshold keeps exactly the queries above it, with their query index.
        ranked = reference["scores"].sort(descending=True).values
        threshold = float(ranked[4] + ranked[5]) / 2  # midway, so float rounding cannot move a query across
        kept = prediction.above(threshold)
        assert torch.equal(kept.query_indices, torch.nonzero(reference["scores"] > threshold).flatten())
    thresholded = predictor.predict(arrays, threshold=threshold)  # same batch, so the same padding
    assert torch.equal(thresholded[1].scores, predictions[1].scores[predictions[1].scores > threshold])


def test_boxes_land_on_exif_rotated_original(tmp_path, tiny_config):
    # Stored 60 (h) × 100 (w); EXIF orientation 6 ("rotate 90° clockwise") displays it 100 × 60.
    box = (0.25, 0.5, 0.2, 0.4)  # normalised cxcywh in the image the model sees (the displayed one)
    model = fixed_box_model(tiny_config, box, label=2)
    stored = np.zeros((60, 100, 3), dtype=np.uint8)
    stored[:, :10] = 255  # a white band on the stored left edge ends on the displayed top
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "rotated.jpg"
    Image.fromarray(stored).save(path, exif=exif)
    assert to_rgb_array(path)[:5].mean() > 200  # the band is on top: orientation was applied

    predictor = Predictor(model, category_map=NAMES, device="cpu", threshold=0.5, **SIZES)
    for source in (path, Image.open(path)):
        (prediction,) = predictor.predict(source)
        assert prediction.image_size == (100, 60)
        assert len(prediction) == tiny_config.num_queries
        assert set(prediction.label_names) == {"cat"}
        cx, cy, w, h = box
        expected = torch.tensor([(cx - w / 2) * 60, (cy - h / 2) * 100, (cx + w / 2) * 60, (cy + h / 2) * 100])
        torch.testing.assert_close(prediction.boxes, expected.expand(len(prediction), 4), atol=1e-3, rtol=0)
    assert predictor.predict(str(path))[0].file_name == "rotated.jpg"


def test_grayscale_and_rgba_inputs(tiny_model):
    predictor = Predictor(tiny_model, device="cpu", threshold=0.0, **SIZES)
    rng = np.random.default_rng(1)
    gray = rng.integers(0, 256, (50, 80), dtype=np.uint8)
    rgb = np.repeat(gray[:, :, None], 3, axis=2)
    rgba = np.concatenate([rgb, np.full((50, 80, 1), 7, np.uint8)], axis=2)
    inputs = [gray, gray[:, :, None], rgba, Image.fromarray(gray, "L"), Image.fromarray(rgba, "RGBA"),
              torch.from_numpy(rgb).permute(2, 0, 1)]
    reference = predictor.predict(rgb, all_queries=True)[0]
    for prediction in predictor.predict(inputs, all_queries=True):
        assert prediction.image_size == (50, 80)
        torch.testing.assert_close(prediction.scores, reference.scores)
        torch.testing.assert_close(prediction.boxes, reference.boxes)
        assert prediction.label_names[0] == f"class {int(reference.labels[0])}"  # no category map


def test_invalid_inputs_name_the_fix(tiny_model):
    predictor = Predictor(tiny_model, device="cpu", **SIZES)
    with pytest.raises(ValueError, match="uint8"):
        predictor.predict(np.zeros((20, 20, 3), np.float32))
    with pytest.raises(ValueError, match="transpose"):
        predictor.predict(np.zeros((3, 20, 20, 2), np.uint8))
    with pytest.raises(ValueError, match="precision must be one of 'fp32', 'bf16', 'fp16', got 'fp8'"):
        Predictor(tiny_model, precision="fp8")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="category_map"):
        Predictor(tiny_model, category_map=CategoryMap.coco())
    # P11: a panoptic overlap of -3 failed every image, a threshold of NaN kept nothing
    for option, value in [("threshold", math.nan), ("panoptic_threshold", 2.0), ("panoptic_overlap_threshold", -3.0),
                          ("min_size", 0), ("max_size", -1)]:
        with pytest.raises(ValueError, match=option):
            Predictor(tiny_model, device="cpu", **{option: value})


def test_a_url_or_a_folder_given_as_an_image_says_what_to_do(tiny_model, tmp_path):
    """A URL was "does not exist" with its // collapsed to /, a folder "restore or replace the file"."""
    from detr.inference.outputs import collect_image_paths

    predictor = Predictor(tiny_model, device="cpu", **SIZES)
    with pytest.raises(ValueError, match=r"'https://example\.com/cat\.jpg' is a URL: .*Download it first"):
        predictor.predict("https://example.com/cat.jpg")
    with pytest.raises(ValueError, match=rf"{tmp_path} is a folder, not an image file: .*collect_image_paths") as error:
        predictor.predict(tmp_path)
    assert "restore or replace" not in str(error.value)
    with pytest.raises(ValueError, match="a URL: download the image first"):
        collect_image_paths(["https://example.com/cat.jpg"])  # detr-predict's inputs


def test_attention_is_cropped_to_the_image(tiny_model):
    predictor = Predictor(tiny_model, device="cpu", batch_size=2, **SIZES)
    wide, tall = np.zeros((64, 100, 3), np.uint8), np.zeros((100, 64, 3), np.uint8)
    predictions = predictor.predict([wide, tall], threshold=0.0, return_attention=True)
    for prediction in predictions:
        attention = prediction.attention
        h, w = attention.feature_size
        # The model's feature mask is the pixel mask (batch padded to 100 x 100, 4 x 4 features) sampled by
        # nearest interpolation: feature row j is unpadded iff pixel row floor(j * 100 / 4) is.
        assert (h, w) == tuple(sum(25 * j < s for j in range(4)) for s in attention.input_size)
        assert attention.decoder.shape == (2, 10, h, w)
        assert attention.decoder_heads.shape == (2, 2, 10, h, w)
        assert attention.encoder.shape == (h, w, h, w)
        # Rows sum to 1 over the unpadded positions, so nothing was cut off.
        torch.testing.assert_close(attention.decoder.sum((-2, -1)), torch.ones(2, 10))
        torch.testing.assert_close(attention.encoder.sum((-2, -1)), torch.ones(h, w))
        assert attention.to_image(attention.decoder[-1]).shape == (10, *prediction.image_size)
    assert predictions[0].attention.feature_size != predictions[1].attention.feature_size


def test_forward_keeps_aux_outputs_only_when_asked(tiny_model):
    """The attention explorer shows every decoder layer's boxes: Predictor.forward(aux_outputs=True) returns
    the model's aux_outputs (on the CPU, float32); the fast path drops them."""
    predictor = Predictor(tiny_model, device="cpu", **SIZES)
    images, padding_mask = pad_images([predictor.preprocess(np.zeros((64, 100, 3), np.uint8))])
    assert predictor.forward(images, padding_mask).aux == []
    outputs = predictor.forward(images, padding_mask, return_attention=True, aux_outputs=True)
    with torch.no_grad():
        expected = tiny_model(images, padding_mask)
    assert len(outputs.aux) == len(expected.aux) == 1  # 2 decoder layers
    for key in ("logits", "boxes"):
        torch.testing.assert_close(getattr(outputs.aux[0], key), getattr(expected.aux[0], key))
        torch.testing.assert_close(getattr(outputs, key), getattr(expected, key))
    assert outputs.attention is not None


def test_attention_upsampling_geometry():
    # Feature cell (1, 2) of a 64 × 96 input (stride 32) covers pixels y 32..63, x 64..95; the original
    # image is twice that size, so it lands on y 64..127, x 128..191.
    one_hot = torch.zeros(2, 3)
    one_hot[1, 2] = 1.0
    attention = AttentionMaps(
        decoder=one_hot[None, None], decoder_heads=one_hot[None, None, None], encoder=torch.zeros(2, 3, 2, 3),
        scores=torch.zeros(1), labels=torch.zeros(1, dtype=torch.int64), no_object_scores=None,
        boxes=torch.zeros(1, 4), stride=32, input_size=(64, 96),
        image_size=(128, 192),
    )
    image_map = attention.to_image(one_hot)
    assert image_map.shape == (128, 192)
    row, col = divmod(int(image_map.argmax()), 192)
    assert 64 <= row < 128 and 128 <= col < 192
    assert attention.feature_position(x=150.0, y=100.0) == (1, 2)


def test_bf16_runs(tiny_model):
    predictor = Predictor(tiny_model, device="cpu", precision="bf16", **SIZES)
    (prediction,) = predictor.predict(np.zeros((64, 64, 3), np.uint8), all_queries=True)
    assert prediction.scores.dtype == torch.float32 and prediction.boxes.shape == (10, 4)


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_half_precisions_autocast_and_stay_close_to_fp32(tiny_model, precision, dtype):
    """The model runs in the precision's autocast dtype (float16 autocast works on the CPU in torch 2.14); the
    predictions come back in float32, close to fp32's on the tiny model."""
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 256, (70, 110, 3), dtype=np.uint8), rng.integers(0, 256, (90, 60, 3), dtype=np.uint8)]
    reference = Predictor(tiny_model, device="cpu", batch_size=2, **SIZES).predict(arrays, all_queries=True)
    predictor = Predictor(tiny_model, device="cpu", precision=precision, batch_size=2, **SIZES)
    assert predictor.backend == f"pytorch (cpu, {precision})"
    with torch.inference_mode(), predictor.autocast():
        assert tiny_model(torch.zeros(1, 3, 64, 64), torch.zeros(1, 64, 64, dtype=torch.bool)).logits.dtype == dtype
    predictions = predictor.predict(arrays, all_queries=True)
    # measured: fp16 0.0002 (scores) and 0.04 px (boxes), bf16 0.002 and 0.3 px on boxes up to 90 px
    tolerance = {"fp16": (2e-3, 0.5), "bf16": (1e-2, 2.0)}[precision]
    for prediction, expected in zip(predictions, reference):
        assert prediction.scores.dtype == torch.float32 and prediction.boxes.dtype == torch.float32
        assert (prediction.scores - expected.scores).abs().max() < tolerance[0]
        assert (prediction.boxes - expected.boxes).abs().max() < tolerance[1]


def test_label_names_come_from_the_checkpoint(tmp_path, tiny_config, tiny_model):
    # This project's Lightning checkpoint: the data set's names and ids travel with it.
    lightning = tmp_path / "ours.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in tiny_model.state_dict().items()},
                "detr": {"model_config": tiny_model.config.to_dict(), "category_map": NAMES.to_dict()}}, lightning)
    predictor = Predictor.from_checkpoint(lightning, device="cpu", **SIZES)
    assert predictor.category_map == NAMES
    names = predictor.predict(np.zeros((64, 64, 3), np.uint8), all_queries=True)[0].label_names
    assert set(names) <= set(NAMES.names)

    # An authors' release file (91 classes, no names stored): COCO's names, "N/A" in the id gaps.
    torch.manual_seed(0)
    coco_model = build_detr(tiny_config, num_classes=91, dropout=0.0)
    released = save_official(coco_model, tmp_path / "detr-tiny-coco.pth")
    predictor = Predictor.from_checkpoint(released, device="cpu", num_heads=tiny_config.num_heads, **SIZES)
    assert predictor.category_map == CategoryMap.coco()
    prediction = predictor.predict(np.zeros((64, 64, 3), np.uint8), all_queries=True)[0]
    coco = CategoryMap.coco()
    assert prediction.label_names == [coco.names[int(label)] for label in prediction.labels]
    assert coco.names[17] == "cat" and coco.names[12] == "N/A"


def test_sigmoid_class_head(tiny_config):
    torch.manual_seed(0)
    model = build_detr(tiny_config, class_head="sigmoid", dropout=0.0).eval()
    predictor = Predictor(model, device="cpu", **SIZES)
    (prediction,) = predictor.predict(np.zeros((64, 80, 3), np.uint8), all_queries=True, return_attention=True)
    assert prediction.attention.no_object_scores is None
    assert prediction.labels.max() < tiny_config.num_classes
    torch.testing.assert_close(prediction.attention.scores, prediction.scores)


def test_resize_defaults_to_the_size_the_checkpoint_was_validated_at(tmp_path, tiny_model):
    # A model trained on 128-px images finds nothing once upscaled to the authors' 800 px: this project's
    # checkpoints carry the data module's eval size (Lightning's datamodule_hyper_parameters).
    ours = tmp_path / "ours.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in tiny_model.state_dict().items()},
                "detr": {"model_config": tiny_model.config.to_dict(), "category_map": None},
                "datamodule_hyper_parameters": {"eval_min_size": 128, "eval_max_size": 160}}, ours)
    predictor = Predictor.from_checkpoint(ours, device="cpu")
    assert (predictor.min_size, predictor.max_size) == (128, 160)
    assert predictor.preprocess(np.zeros((300, 400, 3), np.uint8)).shape == (3, 120, 160)
    assert Predictor.from_checkpoint(ours, device="cpu", min_size=64).min_size == 64  # an explicit size wins
    # Files without it (the authors' releases, plain state dicts) keep the authors' 800 / 1333.
    released = Predictor.from_checkpoint(save_official(tiny_model, tmp_path / "plain.pth"), device="cpu")
    assert (released.min_size, released.max_size) == (800, 1333)


def test_the_threshold_defaults_to_the_one_the_model_was_validated_with(tmp_path, tiny_model):
    """One threshold (0.7, the authors' softmax value) for every model hid the detections of the sigmoid
    models this project trains: a checkpoint carries the threshold its last validation
    found best, and the Predictor (hence every command) starts from it."""
    ours = tmp_path / "ours.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in tiny_model.state_dict().items()},
                "detr": {"model_config": tiny_model.config.to_dict(), "category_map": None, "score_threshold": 0.35}},
               ours)
    predictor = Predictor.from_checkpoint(ours, device="cpu")
    assert (predictor.threshold, predictor.threshold_source) == (0.35, "the checkpoint's validation: best F1")
    given = Predictor.from_checkpoint(ours, device="cpu", threshold=0.5)
    assert (given.threshold, given.threshold_source) == (0.5, "given")
    released = Predictor.from_checkpoint(save_official(tiny_model, tmp_path / "plain.pth"), device="cpu")
    assert (released.threshold, released.threshold_source) == (0.7, "the authors' default")


def test_check_finite_names_the_images_whose_outputs_are_not_finite(tiny_model) -> None:
    predictor = Predictor(tiny_model, device="cpu", min_size=64, max_size=96)
    images = [np.full((64, 80, 3), 100, np.uint8), np.full((64, 80, 3), 200, np.uint8)]
    assert len(predictor.predict_arrays(images, threshold=0.0, check_finite=True)) == 2
    with torch.no_grad():
        tiny_model.class_embed.bias.fill_(float("nan"))
    assert [len(p) for p in predictor.predict_arrays(images, threshold=0.0)] == [0, 0]  # NaN scores keep nothing
    with pytest.raises(NonFiniteOutputError, match="not finite .* for 2 of 2 images") as caught:
        predictor.predict_arrays(images, threshold=0.0, check_finite=True)
    assert caught.value.indices == [0, 1]


def test_above_a_lower_threshold_than_predict_cut_at_warns(tiny_model):
    """prediction.above(0.4) after predict (cut at 0.7) found nothing more, without a word."""
    image = np.zeros((64, 64, 3), np.uint8)
    prediction = Predictor(tiny_model, device="cpu", threshold=0.7).predict(image)[0]
    assert prediction.cut_at == 0.7
    with pytest.warns(UserWarning, match=r"kept only the detections above 0.7: above\(0.4\) finds no more"):
        prediction.above(0.4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert prediction.above(0.8).cut_at == 0.8  # a higher one is fine
        everything = Predictor(tiny_model, device="cpu").predict(image, all_queries=True)[0]
        assert everything.cut_at is None and len(everything.above(0.4)) <= len(everything)
