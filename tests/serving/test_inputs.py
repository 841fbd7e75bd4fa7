"""Request bytes → RGB arrays as the Predictor reads the same file, and every refusal's status and kind."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from detr.data.images import load_rgb_image
from detr.serving.inputs import RequestError, decode_image_bytes, decoded_bytes, parse_task, parse_threshold

PHOTOS = Path(__file__).resolve().parents[2] / "data" / "photos"


def encode(image: Image.Image, image_format: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=image_format, **options)
    return buffer.getvalue()


@pytest.mark.parametrize("name", ["chelsea.png", "grace_hopper.jpg", "coffee.png"])
def test_decoded_bytes_equal_the_file_as_the_predictor_loads_it(name: str) -> None:
    path = PHOTOS / name
    np.testing.assert_array_equal(decode_image_bytes(path.read_bytes()), load_rgb_image(path))


def test_exif_orientation_is_applied_and_other_formats_read(tmp_path: Path) -> None:
    pixels = np.zeros((20, 40, 3), np.uint8)
    pixels[:, :10] = 255
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to display
    data = encode(Image.fromarray(pixels), "JPEG", exif=exif.tobytes(), quality=95)
    assert decode_image_bytes(data).shape == (40, 20, 3)
    (tmp_path / "rotated.jpg").write_bytes(data)
    np.testing.assert_array_equal(decode_image_bytes(data), load_rgb_image(tmp_path / "rotated.jpg"))
    for image_format in ("WEBP", "BMP", "GIF", "TIFF"):
        assert decode_image_bytes(encode(Image.fromarray(pixels), image_format)).shape == (20, 40, 3)
    assert decode_image_bytes(encode(Image.fromarray(pixels[:, :, 0]), "PNG")).shape == (20, 40, 3)  # grey → RGB


def refusal(data: bytes, **options) -> tuple[int, str]:
    with pytest.raises(RequestError) as caught:
        decode_image_bytes(data, **options)
    assert caught.value.to_json()["detail"] == str(caught.value)
    return caught.value.status, caught.value.kind


def test_refusals_name_the_problem() -> None:
    photo = (PHOTOS / "chelsea.png").read_bytes()
    jpeg = (PHOTOS / "grace_hopper.jpg").read_bytes()
    assert refusal(b"") == (400, "empty_body")
    assert refusal(b'{"image": "cat.jpg"}') == (400, "not_an_image")
    assert refusal(photo[:40]) == (400, "truncated_image")  # the signature, the header cut off
    assert refusal(photo[: len(photo) // 2]) == (400, "truncated_image")
    assert refusal(jpeg[: len(jpeg) // 2]) == (400, "truncated_image")
    noise = np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    assert refusal(encode(Image.fromarray(noise), "PNG"), max_pixels=100_000) == (413, "image_too_large")
    flat = encode(Image.new("L", (3000, 3000)), "PNG")  # 9 MP of zeros in a few kB
    assert refusal(flat, max_pixels=1_000_000) == (413, "decompression_bomb")


def test_a_flat_image_is_a_bomb_at_any_size_above_the_floor() -> None:
    """The ratio used to be checked only above max_pixels: a 38 kB PNG of 39.6 MP decoded under the default
    40 MP limit, and sixteen of them at once took a server to 3.8 GB."""
    from detr.serving.inputs import BOMB_MIN_PIXELS, DEFAULT_MAX_PIXELS

    side = math.isqrt(BOMB_MIN_PIXELS) + 1
    flat = encode(Image.new("L", (side, side)), "PNG")  # a few kB
    assert side * side < DEFAULT_MAX_PIXELS
    assert refusal(flat) == (413, "decompression_bomb")
    with pytest.raises(RequestError, match="decompression bomb"):
        decoded_bytes(flat)  # from the header: nothing decoded
    # below the floor a blank frame is no threat and decodes as before
    assert decode_image_bytes(encode(Image.new("L", (1000, 1000)), "PNG")).shape == (1000, 1000, 3)


def test_decoded_bytes_are_read_from_the_header() -> None:
    """What the server reserves before decoding: the image in its file's mode and its RGB array."""
    pixels = np.zeros((20, 40, 3), np.uint8)
    assert decoded_bytes(encode(Image.fromarray(pixels), "PNG")) == 20 * 40 * (3 + 3)
    assert decoded_bytes(encode(Image.fromarray(pixels[:, :, 0]), "PNG")) == 20 * 40 * (1 + 3)
    assert decoded_bytes(encode(Image.new("RGBA", (40, 20)), "PNG")) == 20 * 40 * (4 + 3)


def test_query_parameters() -> None:
    assert parse_threshold(None, 0.7) == 0.7 and parse_threshold("0", 0.7) == 0.0 and parse_threshold("1", 0.7) == 1
    for bad in ("1.01", "-0.5", "nan", "inf", "high", ""):
        with pytest.raises(RequestError) as caught:
            parse_threshold(bad, 0.7)
        assert (caught.value.status, caught.value.kind) == (422, "bad_threshold")
    assert parse_task(None) == "detection" and parse_task("panoptic") == "panoptic"
    with pytest.raises(RequestError, match="detection, instances, panoptic"):
        parse_task("segment")
