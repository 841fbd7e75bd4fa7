"""Users' images → ``uint8`` RGB arrays ``[H, W, 3]``, the one form the :class:`~detr.inference.predictor.Predictor`
and the drawing functions take."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Union

import numpy as np
from PIL import Image, ImageOps
from torch import Tensor

from detr.data.images import ImageLoadError, load_rgb_image, pil_to_rgb_array

#: What :meth:`detr.inference.predictor.Predictor.predict` accepts as one image: a file path, a PIL image, a ``uint8`` numpy array
#: ``[H, W]``, ``[H, W, 1]``, ``[H, W, 3]`` or ``[H, W, 4]`` (RGB order, alpha dropped), or a ``uint8``
#: tensor ``[C, H, W]`` as ``torchvision.io.decode_image`` returns it.
ImageInput = Union[str, Path, Image.Image, np.ndarray, Tensor]


#: What a URL starts with (``https://``, ``s3://`` ...): a scheme, then ``://``.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _refuse_a_url_or_folder(path: str | Path) -> None:
    """Raise :class:`ImageLoadError` for a URL or a folder given as an image file, saying what to do: they
    were "does not exist" (the URL's ``//`` collapsed to ``/``) and "restore or replace the file"."""
    if isinstance(path, str) and _URL.match(path):
        raise ImageLoadError(f"{path!r} is a URL: images are read from local files. Download it first (e.g. "
                             "urllib.request.urlretrieve(url, 'image.jpg')), or pass the downloaded bytes as "
                             "PIL.Image.open(io.BytesIO(data))")
    if Path(path).is_dir():
        raise ImageLoadError(f"{path} is a folder, not an image file: pass its image files "
                             f"(detr.inference.outputs.collect_image_paths(['{path}']) lists them), or run "
                             f"detr-predict {path} --out OUT", path=path)


def to_rgb_array(image: ImageInput) -> np.ndarray:
    """Any accepted image input → ``uint8`` RGB array ``[H, W, 3]`` as the user sees the image.

    Paths go through :func:`detr.data.images.load_rgb_image` (EXIF orientation applied, any PIL mode);
    PIL images get the same treatment (``ImageOps.exif_transpose``, then
    :func:`detr.data.images.pil_to_rgb_array`); arrays and tensors are
    taken as already oriented: grayscale is repeated to three channels, a fourth (alpha) channel is dropped.

    Raises:
        ValueError: for arrays of another dtype or shape, naming the shape and the fix.
        detr.data.images.ImageLoadError: (a ValueError) for paths that cannot be read as images.
    """
    if isinstance(image, (str, Path)):
        _refuse_a_url_or_folder(image)
        return load_rgb_image(image)
    if isinstance(image, Image.Image):
        return pil_to_rgb_array(ImageOps.exif_transpose(image))
    if isinstance(image, Tensor):
        if image.ndim != 3 or image.shape[0] not in (1, 3, 4):
            raise ValueError(
                f"image tensor must be [C, H, W] with C in (1, 3, 4), got shape {tuple(image.shape)}; "
                "pass torchvision.io.decode_image output or a numpy HWC array"
            )
        image = image.detach().cpu().permute(1, 2, 0).numpy()
    if not isinstance(image, np.ndarray):
        raise ValueError(
            f"unsupported image input of type {type(image).__name__}; pass a path, a PIL image, "
            "a uint8 numpy array [H, W(, C)] or a uint8 tensor [C, H, W]"
        )
    if image.dtype != np.uint8:
        raise ValueError(
            f"image array has dtype {image.dtype}, expected uint8 in 0..255; convert it first, e.g. "
            "(array * 255).round().clip(0, 255).astype(np.uint8) for floats in [0, 1]"
        )
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in (1, 3, 4):
        raise ValueError(
            f"image array must be [H, W], [H, W, 1], [H, W, 3] or [H, W, 4] (RGB(A) order), got shape "
            f"{image.shape}; a channel-first array needs .transpose(1, 2, 0)"
        )
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise ValueError(f"image array is empty (shape {image.shape})")
    if image.shape[2] == 1:
        image = np.repeat(image, 3, axis=2)
    return np.ascontiguousarray(image[:, :, :3])




def is_single_image(images: object) -> bool:
    """Whether ``images`` is one :data:`ImageInput` (rather than a sequence of them)."""
    return isinstance(images, (str, Path, Image.Image, np.ndarray, Tensor))
