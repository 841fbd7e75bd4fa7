"""Image decoding: every file mode becomes RGB uint8, EXIF orientation is applied, bad files name themselves."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from detr.data.images import (
    ImageFilesDataset,
    ImageLoadError,
    decode_image,
    list_image_files,
    load_rgb_image,
    read_image_header,
)
from detr.data.transforms import make_eval_transform

JSON = Path("annotations/instances_train2017.json")


def _save_with_orientation(image: Image.Image, path: Path, orientation: int) -> None:
    exif = Image.Exif()
    exif[0x0112] = orientation
    image.save(path, exif=exif.tobytes(), quality=95)


def test_rgb_jpeg_round_trip(tmp_path: Path) -> None:
    pixels = np.zeros((20, 30, 3), np.uint8)
    pixels[:, :15] = (200, 30, 40)
    Image.fromarray(pixels).save(tmp_path / "a.png")
    out = load_rgb_image(tmp_path / "a.png")
    assert out.dtype == np.uint8 and out.shape == (20, 30, 3)
    np.testing.assert_array_equal(out, pixels)
    assert out.flags.writeable


def test_grayscale_becomes_three_equal_channels(tmp_path: Path) -> None:
    gray = np.arange(12 * 10, dtype=np.uint8).reshape(12, 10)
    Image.fromarray(gray, mode="L").save(tmp_path / "gray.png")
    out = load_rgb_image(tmp_path / "gray.png")
    assert out.shape == (12, 10, 3)
    for channel in range(3):
        np.testing.assert_array_equal(out[:, :, channel], gray)


def test_rgba_drops_alpha(tmp_path: Path) -> None:
    rgba = np.zeros((8, 8, 4), np.uint8)
    rgba[..., 0], rgba[..., 3] = 255, 0  # fully transparent red
    Image.fromarray(rgba, mode="RGBA").save(tmp_path / "rgba.png")
    out = load_rgb_image(tmp_path / "rgba.png")
    assert out.shape == (8, 8, 3)
    assert (out[..., 0] == 255).all() and (out[..., 1:] == 0).all()


def test_palette_with_transparency(tmp_path: Path) -> None:
    image = Image.new("P", (6, 5))
    image.putpalette([0, 0, 0, 10, 200, 30] + [0] * 762)
    image.paste(1, (0, 0, 3, 5))
    image.save(tmp_path / "palette.png", transparency=0)
    out = load_rgb_image(tmp_path / "palette.png")
    assert out.shape == (5, 6, 3)
    np.testing.assert_array_equal(out[0, 0], [10, 200, 30])


def test_cmyk_jpeg(tmp_path: Path) -> None:
    Image.new("CMYK", (16, 16), (0, 255, 255, 0)).save(tmp_path / "cmyk.jpg", quality=95)  # red in CMYK
    out = load_rgb_image(tmp_path / "cmyk.jpg")
    assert out.shape == (16, 16, 3) and out.dtype == np.uint8
    red, green, blue = out.reshape(-1, 3).mean(0)
    assert red > 200 and green < 60 and blue < 60


def test_sixteen_bit_is_scaled_not_clipped(tmp_path: Path) -> None:
    values = np.array([[0, 257 * 100, 32768, 65535]], dtype=np.uint16)
    Image.fromarray(values).save(tmp_path / "deep.png")
    assert Image.open(tmp_path / "deep.png").mode.startswith("I")
    out = load_rgb_image(tmp_path / "deep.png")
    np.testing.assert_array_equal(out[0, :, 0], [0, 100, 128, 255])
    assert (out[..., 0] == out[..., 2]).all()


def test_exif_orientation_is_applied(tmp_path: Path) -> None:
    stored = np.zeros((40, 60, 3), np.uint8)  # stored landscape, red block top-left
    stored[:10, :20] = (255, 0, 0)
    _save_with_orientation(Image.fromarray(stored), tmp_path / "rotated.jpg", orientation=6)
    decoded = decode_image(tmp_path / "rotated.jpg")
    assert decoded.exif_orientation == 6 and decoded.stored_size == (40, 60)
    assert decoded.pixels.shape == (60, 40, 3)  # displayed portrait
    expected = np.rot90(stored, k=-1)  # orientation 6: rotate 90 degrees clockwise to display
    assert np.abs(decoded.pixels.astype(int) - expected.astype(int)).mean() < 4
    assert decoded.pixels[:20, -10:, 0].mean() > 200  # the block moved to the top-right
    assert read_image_header(tmp_path / "rotated.jpg").size == (60, 40)  # from the header alone


def test_missing_file_names_file_and_json(tmp_path: Path) -> None:
    with pytest.raises(ImageLoadError, match="does not exist") as info:
        load_rgb_image(tmp_path / "nope.jpg", annotations_file=JSON)
    assert "nope.jpg" in str(info.value) and str(JSON) in str(info.value)
    assert isinstance(info.value, ValueError)
    assert info.value.path == tmp_path / "nope.jpg" and info.value.annotations_file == JSON


def test_truncated_jpeg(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(tmp_path / "full.jpg")
    data = (tmp_path / "full.jpg").read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageLoadError, match="truncated") as info:
        load_rgb_image(tmp_path / "cut.jpg", annotations_file=JSON)
    assert "cut.jpg" in str(info.value) and str(JSON) in str(info.value)


def test_text_file_named_jpg(tmp_path: Path) -> None:
    (tmp_path / "notes.jpg").write_text("this is not an image\n")
    with pytest.raises(ImageLoadError, match="not an image") as info:
        load_rgb_image(tmp_path / "notes.jpg", annotations_file=JSON)
    assert "notes.jpg" in str(info.value)
    with pytest.raises(ImageLoadError, match="notes.jpg"):
        read_image_header(tmp_path / "notes.jpg")


def test_error_survives_worker_reraise_and_pickle() -> None:
    # torch's DataLoader re-raises a worker's exception as exc_type(message): that must work.
    error = ImageLoadError("image file 'x.jpg' is broken", path="x.jpg")
    assert "x.jpg" in str(type(error)(str(error)))
    assert str(pickle.loads(pickle.dumps(error))) == str(error)


def test_image_files_dataset_over_folder(tmp_path: Path) -> None:
    Image.new("RGB", (40, 20), (10, 20, 30)).save(tmp_path / "b.png")
    Image.new("L", (20, 30)).save(tmp_path / "a.jpg")
    (tmp_path / "readme.txt").write_text("skip me")
    assert [p.name for p in list_image_files(tmp_path)] == ["a.jpg", "b.png"]
    dataset = ImageFilesDataset(tmp_path, transform=make_eval_transform(min_size=32, max_size=64))
    image, target = dataset[1]
    assert image.dtype == torch.float32 and tuple(image.shape) == (3, 32, 64)
    assert target["orig_size"].tolist() == [20, 40] and target["size"].tolist() == [32, 64]
    assert target["file_name"].endswith("b.png") and int(target["image_id"]) == 1


def test_image_files_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        list_image_files(tmp_path / "missing")
    with pytest.raises(ValueError, match="holds no image file"):
        list_image_files(tmp_path)
    (tmp_path / "bad.jpg").write_text("no")
    dataset = ImageFilesDataset([tmp_path / "bad.jpg"], transform=make_eval_transform())
    image, target = dataset[0]  # one bad file must not stop a predict run: a placeholder says why
    assert target["file_name"].endswith("bad.jpg") and "cannot identify image file" in target["error"]
    assert target["orig_size"].tolist() == [0, 0] and image.shape == (3, 32, 32)


def test_a_file_error_gives_no_data_set_advice(tmp_path: Path) -> None:
    # The loader serves predict, the explorer and the Predictor too: a file given to them is not in any
    # annotation json, so "remove it from the json / skip_bad_images" would mislead; the data set adds that.
    (tmp_path / "notes.jpg").write_text("this is not an image\n")
    for call in (lambda: load_rgb_image(tmp_path / "notes.jpg"), lambda: load_rgb_image(tmp_path / "absent.jpg")):
        with pytest.raises(ImageLoadError) as info:
            call()
        message = str(info.value)
        assert "skip_bad_images" not in message and "annotation" not in message
        assert "jpg" in message and "replace" in message
