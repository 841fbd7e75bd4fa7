"""Image files → RGB uint8 arrays, whatever the file holds; and a data set over plain image files.

Every decoding failure (missing file, truncated JPEG, a text file named ``.jpg``, an unsupported mode) becomes
an :class:`ImageLoadError` that names the file and, when known, the annotation json that lists it. A
``ValueError`` subclass, so a DataLoader worker that hits one re-raises it in the main process with the
file name in the message instead of a bare PIL traceback: a broken data set names the file to fix. The
loader's advice fits any caller (replace the file); a data set adds its own (leave the image out of the json,
``skip_bad_images``), since predict, the explorer and the Predictor read files no json lists.

EXIF orientation is applied (``PIL.ImageOps.exif_transpose``) before anything else looks at the pixels, so
the array is the photo as viewers show it; annotations are expected in that displayed frame, which is the
frame labelling tools draw on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps

logger = logging.getLogger(__name__)

#: File suffixes :func:`list_image_files` treats as images (lower case).
IMAGE_SUFFIXES: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")

#: EXIF tag 0x0112 (Orientation); 1 means "as stored".
EXIF_ORIENTATION_TAG = 0x0112

_SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N")

#: What an :class:`ImageLoadError` from the loader advises: true whoever asked for the file.
FILE_ADVICE = "restore or replace the file with a complete copy of the image"


class ImageLoadError(ValueError):
    """An image file is missing, truncated, not an image, or does not match its annotation entry.

    Constructible from a message alone, so DataLoader workers can re-raise it in the main process.

    Attributes:
        path: the image file, when known.
        annotations_file: the annotation json that lists the image, when known.
    """

    def __init__(
        self, message: str, *, path: str | Path | None = None, annotations_file: str | Path | None = None
    ) -> None:
        super().__init__(message)
        self.path = None if path is None else Path(path)
        self.annotations_file = None if annotations_file is None else Path(annotations_file)


@dataclass(frozen=True)
class DecodedImage:
    """A decoded image file.

    pixels: uint8 [H, W, 3] RGB, EXIF orientation applied (H, W are the displayed size).
    exif_orientation: the file's EXIF orientation tag (1..8; 1 when absent).
    stored_size: (height, width) of the pixels as stored in the file, before the orientation.
    """

    pixels: np.ndarray
    exif_orientation: int
    stored_size: tuple[int, int]


def _where(path: Path, annotations_file: str | Path | None) -> str:
    listed = f" (listed in annotation file '{annotations_file}')" if annotations_file is not None else ""
    return f"image file '{path}'{listed}"


def _scale_to_uint8(values: np.ndarray, mode: str) -> np.ndarray:
    """High-bit-depth single-channel values → uint8 [H, W].

    16-bit modes are scaled by 255/65535 (as an image viewer shows them). PIL's own ``convert("RGB")``
    clips them at 255 instead, which turns most 16-bit images white. 32-bit "I"/"F" images have no fixed
    range: floats ("F") within 0..1 are scaled by 255 (kept, they would all round to black), other values
    in 0..255 are kept, 0..65535 treated as 16-bit, anything larger scaled by its maximum.
    """
    values = values.astype(np.float64)
    finite = values[np.isfinite(values)]
    if mode in _SIXTEEN_BIT_MODES:
        scale = 255.0 / 65535.0
    elif mode == "F" and finite.size and 0.0 <= float(finite.min()) and float(finite.max()) <= 1.0:
        logger.info("a float image with values in [0, 1]: scaled by 255")
        scale = 255.0
    else:
        peak = float(np.nanmax(values)) if values.size else 0.0
        scale = 1.0 if peak <= 255 else (255.0 / 65535.0 if peak <= 65535 else 255.0 / peak)
    return np.clip(np.nan_to_num(values * scale), 0, 255).round().astype(np.uint8)


def pil_to_rgb_array(image: Image.Image) -> np.ndarray:
    """A PIL image in any mode → uint8 [H, W, 3] RGB (a writable copy).

    Grayscale is repeated over the channels, palette images are expanded, CMYK and YCbCr are converted by
    PIL, 16-bit images are scaled (not clipped) to 8 bits, and an alpha channel is dropped, as the authors'
    ``Image.convert("RGB")`` does.
    """
    mode = image.mode
    if mode in _SIXTEEN_BIT_MODES or mode in ("I", "F"):
        gray = _scale_to_uint8(np.asarray(image), mode)
        return np.repeat(gray[:, :, None], 3, axis=2)
    if mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")  # avoids PIL's warning about palette transparency
    if image.mode != "RGB":
        image = image.convert("RGB")
    return np.array(image, dtype=np.uint8)


def decode_image(path: str | Path, *, annotations_file: str | Path | None = None) -> DecodedImage:
    """Decode one image file completely (so truncation is found here, not later).

    Args:
        path: the image file.
        annotations_file: the annotation json that lists it; only used in error messages.

    Raises:
        ImageLoadError: the file is missing, unreadable, truncated, not an image, or in a mode that cannot
            become RGB. The message names the file, the json and the fix.
    """
    path = Path(path)
    where = _where(path, annotations_file)
    fix = FILE_ADVICE
    if not path.is_file():
        reason = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise ImageLoadError(f"{where} {reason}; {fix}", path=path, annotations_file=annotations_file)
    try:
        with Image.open(path) as image:
            image.load()  # full decode: a truncated file fails here (PIL.ImageFile.LOAD_TRUNCATED_IMAGES stays off)
            orientation = int(image.getexif().get(EXIF_ORIENTATION_TAG, 1) or 1)
            stored_size = (image.height, image.width)
            oriented = ImageOps.exif_transpose(image)
            pixels = pil_to_rgb_array(oriented)
    except Image.UnidentifiedImageError as error:
        raise ImageLoadError(
            f"{where} is not an image PIL can read ({error}); {fix}", path=path, annotations_file=annotations_file
        ) from error
    except Exception as error:  # PIL raises OSError, SyntaxError, ValueError, struct.error ... by format
        raise ImageLoadError(
            f"{where} could not be decoded ({type(error).__name__}: {error}), the file is probably truncated "
            f"or corrupt; {fix}",
            path=path,
            annotations_file=annotations_file,
        ) from error
    if pixels.ndim != 3 or pixels.shape[2] != 3 or min(pixels.shape[:2]) < 1:
        raise ImageLoadError(
            f"{where} decoded to an array of shape {pixels.shape}, not [H, W, 3] with H, W >= 1; {fix}",
            path=path,
            annotations_file=annotations_file,
        )
    return DecodedImage(pixels=pixels, exif_orientation=orientation, stored_size=stored_size)


def load_rgb_image(path: str | Path, *, annotations_file: str | Path | None = None) -> np.ndarray:
    """Decode an image file to uint8 [H, W, 3] RGB with EXIF orientation applied (see :func:`decode_image`)."""
    return decode_image(path, annotations_file=annotations_file).pixels


@dataclass(frozen=True)
class ImageHeader:
    """What an image file's header says, without decoding its pixels.

    size: (height, width) as displayed (EXIF orientation applied).
    exif_orientation: the EXIF orientation tag (1..8; 1 when absent).
    stored_size: (height, width) as stored in the file, before the orientation.
    """

    size: tuple[int, int]
    exif_orientation: int
    stored_size: tuple[int, int]


def read_image_header(path: str | Path, *, annotations_file: str | Path | None = None) -> ImageHeader:
    """The displayed and stored size and the EXIF orientation, from the header only: no full decode.

    Raises:
        ImageLoadError: missing file or not an image.
    """
    path = Path(path)
    where = _where(path, annotations_file)
    if not path.is_file():
        raise ImageLoadError(f"{where} does not exist; {FILE_ADVICE}", path=path, annotations_file=annotations_file)
    try:
        with Image.open(path) as image:
            height, width = image.height, image.width
            orientation = int(image.getexif().get(EXIF_ORIENTATION_TAG, 1) or 1)
    except Exception as error:
        raise ImageLoadError(
            f"{where} is not an image PIL can read ({type(error).__name__}: {error}); {FILE_ADVICE}",
            path=path,
            annotations_file=annotations_file,
        ) from error
    # Orientations 5..8 transpose the axes (EXIF 2.3, tag 0x0112).
    size = (width, height) if orientation in (5, 6, 7, 8) else (height, width)
    return ImageHeader(size=size, exif_orientation=orientation, stored_size=(height, width))


def list_image_files(images: str | Path | Sequence[str | Path]) -> list[Path]:
    """A folder (its image files, sorted by name, not recursive) or an explicit list of files → paths.

    Raises:
        ValueError: the folder does not exist or holds no image file.
    """
    if isinstance(images, (str, Path)):
        folder = Path(images)
        if folder.is_file():
            return [folder]
        if not folder.is_dir():
            raise ValueError(f"image folder '{folder}' does not exist; pass an existing folder or a list of files")
        paths = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not paths:
            raise ValueError(
                f"image folder '{folder}' holds no image file (suffixes {', '.join(IMAGE_SUFFIXES)})"
            )
        return paths
    paths = [Path(p) for p in images]
    if not paths:
        raise ValueError("the list of image files is empty; pass at least one file")
    return paths


class ReplacesUnreadableSamples:
    """``__getitem__`` for a data set whose sample ``i`` is :meth:`_load` ``(i)``: an :class:`ImageLoadError`
    (a file missing, undecodable or mis-sized) is raised, or, with ``skip_unreadable``, warned about once per
    file while the next sample takes its place; the sample that took it carries ``"skipped_files"`` in its
    target, so a training loop can count them (loader workers keep no shared state). A file that passed the
    start-up check but fails mid-run must not end a long run.

    The data set sets ``skip_unreadable``, ``num_skipped`` (0), ``warned_files`` (an empty set) and
    ``annotations_file``, and provides ``_load(index)``, ``image_path(index)`` and ``_skip_advice(path)``
    (the fix a warning names after "restore or replace the file, or").
    """

    skip_unreadable: bool
    num_skipped: int
    warned_files: set[Path]
    annotations_file: Path

    def _load(self, index: int) -> tuple[torch.Tensor, dict[str, Any]]:
        raise NotImplementedError

    def image_path(self, index: int) -> Path:
        raise NotImplementedError

    def _skip_advice(self, path: Path) -> str:
        raise NotImplementedError

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, Any]]:
        skipped: list[str] = []
        size = len(self)  # type: ignore[arg-type]
        for attempt in range(size):
            current = (index + attempt) % size
            try:
                image, target = self._load(current)
            except ImageLoadError as error:
                if not self.skip_unreadable:
                    raise
                self.num_skipped += 1
                path = error.path if error.path is not None else self.image_path(current)
                skipped.append(str(path))
                if path not in self.warned_files:
                    self.warned_files.add(path)
                    cause = error.__cause__
                    logger.warning("skipping image file '%s' (%s), another image takes its place; restore or replace the "
                                   "file, or %s", path, f"{type(cause).__name__}: {cause}" if cause is not None
                                   else error, self._skip_advice(path))
                continue
            if skipped:
                target["skipped_files"] = skipped
            return image, target
        raise ImageLoadError(f"every image of annotation file '{self.annotations_file}' failed to load",
                             annotations_file=self.annotations_file)


class ImageFilesDataset(torch.utils.data.Dataset):
    """Plain image files without annotations, for prediction.

    Sample ``i`` is ``(image, target)``: ``image`` float [3, h, w] from ``transform`` (see
    :mod:`detr.data.transforms`), ``target`` = ``{"image_id": int64 scalar (= i), "orig_size": int64 [2]
    (h, w) of the decoded image, "size": int64 [2] (h, w) after the transform, "file_name": str (the path)}``.
    :func:`detr.data.collate.collate_detection` batches these.

    A file that cannot be read or transformed does not stop the run: its sample is a 32 x 32 black
    placeholder whose target has ``orig_size`` (0, 0) and ``"error"``: the reason; callers leave it out
    and report it (:class:`detr.lightning.callbacks.PredictionsWriter` does).
    """

    def __init__(
        self, images: str | Path | Sequence[str | Path], *, transform: Callable[..., dict[str, Any]]
    ) -> None:
        self.paths = list_image_files(images)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, Any]]:
        path = self.paths[index]
        try:
            pixels = load_rgb_image(path)
            out = self.transform(image=pixels, bboxes=np.zeros((0, 4), np.float32), labels=np.zeros(0, np.int64))
        except ImageLoadError as error:
            return self._placeholder(index, _reason(error))
        except Exception as error:  # e.g. OpenCV's resize on a 1-pixel-thin image
            return self._placeholder(index, f"the eval transform failed on its {pixels.shape[1]}x{pixels.shape[0]} "
                                            f"pixels: {type(error).__name__}: {error}")
        image = out["image"]
        target = {
            "image_id": torch.tensor(index, dtype=torch.int64),
            "orig_size": torch.tensor(pixels.shape[:2], dtype=torch.int64),
            "size": torch.tensor(tuple(image.shape[-2:]), dtype=torch.int64),
            "file_name": str(path),
        }
        return image, target

    def _placeholder(self, index: int, reason: str) -> tuple[torch.Tensor, dict[str, Any]]:
        logger.warning("cannot use image file '%s': %s", self.paths[index], reason)
        size = torch.tensor((32, 32), dtype=torch.int64)
        target = {"image_id": torch.tensor(index, dtype=torch.int64), "orig_size": torch.zeros(2, dtype=torch.int64),
                  "size": size, "file_name": str(self.paths[index]), "error": reason}
        return torch.zeros(3, 32, 32), target


def _reason(error: ImageLoadError) -> str:
    """What the decoder said, without the advice of the message (the placeholder's reason is read by people
    who passed the file themselves)."""
    cause = error.__cause__
    return f"{type(cause).__name__}: {cause}" if cause is not None else str(error).split(";")[0]
