"""What a request brings → what the model takes: image bytes → ``uint8`` RGB ``[H, W, 3]``, and the query
parameters ``threshold``, ``task``, ``slice`` / ``slice_overlap``, ``prompt`` and ``text_threshold``, each refused with
a :class:`RequestError` that names the problem.

The bytes are decoded as :func:`detr.data.images.decode_image` decodes a file (PIL, EXIF orientation applied,
any mode → RGB), so the server sees the pixels the :class:`~detr.inference.predictor.Predictor` sees for the
same file. The header is read before any pixel is decoded (:func:`decoded_bytes`), so an image too large for
the server, or a decompression bomb (a small file that claims a huge pixel count, at any size above
:data:`BOMB_MIN_PIXELS`), costs nothing to refuse, and the server can hold back a decode until the memory
it takes is free (:class:`detr.serving.budget.DecodedBytesBudget`).
"""

from __future__ import annotations

import io
import math
import warnings

import numpy as np
from PIL import Image, ImageOps

from detr.data.images import pil_to_rgb_array
from detr.inference.grounding import prompt_phrases
from detr.inference.slicing import SliceSettings

TASKS = ("detection", "instances", "panoptic")

#: The most pixels (height × width) an image may have: 40 MP, a large camera's frame. DETR resizes to
#: 800 px anyway; more pixels only cost decoding time and memory.
DEFAULT_MAX_PIXELS = 40_000_000

#: Raw RGB bytes per file byte above which an image counts as a decompression bomb rather than a photo: a
#: JPEG or PNG photo compresses 5 to 20 times, a bomb thousands of times.
BOMB_RATIO = 200.0

#: Pixels from which the compression ratio is checked: below, even a blank image decodes to at most 12 MB
#: (a flat drawing or an empty frame may well compress more than :data:`BOMB_RATIO`); above, a file that
#: compresses more is a bomb whatever ``max_pixels`` allows (38 kB PNGs of 39.6 MP, under the 40 MP limit,
#: took a server from 1.3 to 3.8 GB with 16 clients).
BOMB_MIN_PIXELS = 4_000_000

#: The most model inputs (tiles and the whole image) one ``?slice=`` request may take: an 8 × 8 grid, a 4000-px
#: image at ``slice=640`` with the default overlap, or 2560 px at ``slice=320``.
DEFAULT_MAX_TILES = 64


class RequestError(ValueError):
    """A request the server refuses: an HTTP status (4xx) and a message that names the problem and the fix.

    Attributes:
        status: the HTTP status code to answer with.
        kind: a short machine-readable name of the problem, e.g. ``"not_an_image"``.
    """

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind

    def to_json(self) -> dict[str, str]:
        """The response body: ``{"error": kind, "detail": message}``."""
        return {"error": self.kind, "detail": str(self)}


def decoded_bytes(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> int:
    """The memory that decoding ``data`` takes, in bytes, read from its header alone (no pixel decoded): the
    image in the file's own mode and its RGB array (:func:`decode_image_bytes`' checks run first).

    Raises:
        RequestError: as :func:`decode_image_bytes` for everything its header already shows.
    """
    with _open(data) as image:
        return _check_size(image, len(data), max_pixels)


def decode_image_bytes(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """An encoded image (JPEG, PNG, WebP, anything PIL reads) → ``uint8`` RGB ``[H, W, 3]``, EXIF orientation
    applied.

    Raises:
        RequestError: 400 ``empty_body``, ``not_an_image`` or ``truncated_image``; 413 ``image_too_large`` (more
            than ``max_pixels``) or ``decompression_bomb`` (too many pixels for the file's size: more than
            :data:`BOMB_RATIO` raw RGB bytes per file byte in an image of :data:`BOMB_MIN_PIXELS` or more).
    """
    with _open(data) as image:
        _check_size(image, len(data), max_pixels)
        try:
            image.load()  # full decode: a truncated file fails here (LOAD_TRUNCATED_IMAGES stays off)
            array = pil_to_rgb_array(ImageOps.exif_transpose(image))
        except Exception as error:  # OSError, SyntaxError, struct.error ... by format
            raise RequestError(400, "truncated_image", f"the {image.format} image could not be decoded "
                                                       f"({type(error).__name__}: {error}); the file is probably "
                                                       "truncated or corrupt: send a complete copy") from error
    if array.ndim != 3 or array.shape[2] != 3 or min(array.shape[:2]) < 1:
        raise RequestError(400, "not_an_image", f"the image decoded to an array of shape {array.shape}, "
                                                "not [H, W, 3] with H, W >= 1")
    return array


def _open(data: bytes) -> Image.Image:
    """``data`` opened by PIL (the header read, no pixel decoded), or the refusal that says why not."""
    if not data:
        raise RequestError(400, "empty_body", "the request holds no image: send the image file as the request "
                                              "body or as the multipart field 'image'")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(data))
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as error:
        raise RequestError(413, "decompression_bomb", f"the image is a decompression bomb: {error}") from error
    except Exception as error:  # UnidentifiedImageError, or a format plugin's own error on a broken header
        image_format = _format_of_signature(data)
        if image_format is not None:  # the start of an image whose header is cut off
            raise RequestError(400, "truncated_image", f"the body ({len(data)} bytes) starts like a {image_format} "
                                                       f"file but its header could not be read ({error}); the file "
                                                       "is probably truncated: send a complete copy") from error
        raise RequestError(400, "not_an_image", f"the body ({len(data)} bytes, starting {data[:8]!r}) is not an "
                                                "image PIL can read: send a JPEG, PNG, WebP, BMP, GIF or TIFF "
                                                "file") from error


def _check_size(image: Image.Image, file_bytes: int, max_pixels: int) -> int:
    """Refuse an opened image with too many pixels, or too many for its file's size; return the bytes its
    decode takes (:func:`decoded_bytes`)."""
    width, height = image.size
    pixels = width * height
    ratio = 3 * pixels / file_bytes
    if ratio > BOMB_RATIO and pixels >= min(BOMB_MIN_PIXELS, max_pixels + 1):
        raise RequestError(413, "decompression_bomb",
                           f"the image claims {width}×{height} pixels from only {file_bytes} bytes ({ratio:.0f}× "
                           f"compression; photos compress less than {BOMB_RATIO:.0f}×): a decompression bomb. A real "
                           f"image this flat (blank, a drawing) goes through resized below "
                           f"{min(BOMB_MIN_PIXELS, max_pixels)} pixels, or as a JPEG")
    if pixels > max_pixels:
        raise RequestError(413, "image_too_large", f"the image has {width}×{height} = {pixels} pixels, more "
                                                   f"than the server's limit of {max_pixels}; resize it first "
                                                   "(DETR resizes to 800 px anyway)")
    try:
        mode_bytes = len(Image.new(image.mode, (1, 1)).tobytes())
    except ValueError:  # a mode PIL reads but cannot create: count it as wide as the widest common one
        mode_bytes = 4
    return pixels * (mode_bytes + 3)


def _format_of_signature(data: bytes) -> str | None:
    """The image format whose file signature ``data`` starts with (PIL's own checks), else None."""
    Image.init()
    for name, (_, accept) in Image.OPEN.items():
        try:
            if accept is not None and accept(data[:64]):
                return name
        except Exception:  # a plugin's check that needs more bytes
            continue
    return None


def parse_threshold(value: str | None, default: float, name: str = "threshold") -> float:
    """The ``threshold`` query parameter (or another score's: ``name``, e.g. ``text_threshold``): a score in
    [0, 1]; ``default`` when absent.

    Raises:
        RequestError: 422 ``bad_threshold`` (``bad_<name>``) for anything else (text, NaN, out of range).
    """
    if value is None:
        return default
    try:
        threshold = float(value)
    except ValueError:
        threshold = math.nan
    if not 0.0 <= threshold <= 1.0:  # NaN fails this too
        raise RequestError(422, f"bad_{name}", f"{name} must be a score in [0, 1], got {value!r}")
    return threshold


def parse_prompt(value: str | None, *, prompted: bool, model_name: str) -> str | None:
    """The ``prompt`` query parameter: what a prompted model (Grounding DINO) detects, "a cat. a remote control.";
    None when absent from a request to a model that reads none.

    Raises:
        RequestError: 422 ``prompt_required`` when a prompted model gets none, ``prompt_not_read`` when a model
            that detects its trained classes gets one, ``bad_prompt`` for an empty or repeated phrase.
    """
    if value is None:
        if prompted:
            raise RequestError(422, "prompt_required", f"{model_name} detects what a text prompt names: add "
                               "?prompt= to the URL, e.g. /predict?prompt=a%20cat.%20a%20remote%20control.")
        return None
    if not prompted:
        raise RequestError(422, "prompt_not_read", f"{model_name} detects the classes it was trained on and reads "
                           "no prompt: drop ?prompt=, or serve an open-vocabulary checkpoint (a transformers "
                           "Grounding DINO directory)")
    try:
        prompt_phrases(value)
    except ValueError as error:
        raise RequestError(422, "bad_prompt", f"?prompt=: {error}") from error
    return value


def parse_choice(name: str, value: str | None, choices: tuple[str, ...] | list[str], default: str) -> str:
    """A query parameter ``name`` that takes one of ``choices``; ``default`` when absent.

    Raises:
        RequestError: 422 ``unknown_<name>``, listing the choices.
    """
    if value is None:
        return default
    if value not in choices:
        raise RequestError(422, f"unknown_{name}", f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return value


def parse_task(value: str | None) -> str:
    """The ``task`` query parameter: one of :data:`TASKS`; "detection" when absent (422 ``unknown_task``)."""
    return parse_choice("task", value, TASKS, "detection")


def parse_slice(size: str | None, overlap: str | None) -> SliceSettings | None:
    """The ``slice`` (tile side, pixels) and ``slice_overlap`` (fraction in [0, 1), default 0.2) query
    parameters as :class:`SliceSettings`; None without ``slice``.

    Raises:
        RequestError: 422 ``bad_slice`` for a size that is not an integer >= 1, an overlap outside [0, 1), or
            an overlap without a size.
    """
    if size is None:
        if overlap is not None:
            raise RequestError(422, "bad_slice", "slice_overlap needs slice (the tile side in pixels), e.g. "
                               "?slice=640&slice_overlap=0.2")
        return None
    try:
        side = int(size)
        fraction = float(overlap) if overlap is not None else SliceSettings.overlap
        return SliceSettings(size=side, overlap=fraction)
    except ValueError:
        raise RequestError(422, "bad_slice", f"slice is the tile side in pixels, an integer >= 1, and slice_overlap "
                           f"a fraction in [0, 1); got slice={size!r}, slice_overlap={overlap!r}") from None


def check_tiles(settings: SliceSettings, pixels: np.ndarray, max_tiles: int) -> None:
    """Refuse a sliced request whose image takes more than ``max_tiles`` model inputs (tiles and the whole image).

    Raises:
        RequestError: 422 ``too_many_tiles``, naming the count and a slice size that fits.
    """
    height, width = int(pixels.shape[0]), int(pixels.shape[1])
    count = settings.count(height, width)
    if count <= max_tiles:
        return
    fits = next((side for side in range(settings.size, max(height, width) + 1, 32)
                 if SliceSettings(side, overlap=settings.overlap).count(height, width) <= max_tiles),
                max(height, width))
    raise RequestError(422, "too_many_tiles", f"slice={settings.size} with slice_overlap={settings.overlap:g} cuts "
                       f"this {width}x{height} image into {count} model inputs, more than this server's "
                       f"{max_tiles}; use slice={fits} or larger, or a smaller slice_overlap")
