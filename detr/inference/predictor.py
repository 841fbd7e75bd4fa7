"""Run a trained DETR on users' images: :class:`Predictor` and the per-image :class:`Prediction`.

The predictor does what the authors' evaluation does (models/detr.py PostProcess) on images that
come without annotations: the authors' eval resize (shortest side 800, longest at most 1333), ImageNet
normalisation, zero padding at the bottom and right with a padding mask (the batch contract), the model,
then :class:`detr.PostProcess` with the ORIGINAL image size, so boxes are pixel ``xyxy`` on the image
as the user sees it (EXIF orientation applied). Only then does it keep the queries above a score
threshold, unless all queries are asked for.

It stays on the fast path unless attention is asked for: ``torch.inference_mode``, no attention
weights, optional bf16 autocast. With ``return_attention=True`` every :class:`Prediction` also carries
an :class:`AttentionMaps` cropped to the image's unpadded feature region, which the figures of
:mod:`detr.visualize.figures` draw (paper Fig. 3 and Fig. 6).

With a panoptic model (:class:`detr.DETRPanoptic`, e.g. ``Predictor.from_checkpoint("detr-r50-panoptic")``)
every :class:`Prediction` also carries the instance masks of its detections
(:class:`detr.inference.postprocess_masks.PostProcessMasks`), and with ``task="panoptic"`` (or
:meth:`Predictor.predict_panoptic`) a :class:`PanopticSegmentation` of the whole image
(:class:`detr.inference.postprocess_masks.PostProcessPanoptic`, paper §4.4).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Union

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps
from torch import Tensor, nn

from detr.categories import CategoryMap
from detr.checkpoints import load_checkpoint
from detr.checkpoints.onnx import OnnxDetector
from detr.data.collate import pad_images
from detr.data.images import load_rgb_image, pil_to_rgb_array
from detr.data.transforms import EVAL_MAX_SIZE, EVAL_MIN_SIZE, make_eval_transform
from detr.models.segmentation import DETRPanoptic
from detr.inference.postprocess import PostProcess
from detr.inference.postprocess_masks import PostProcessMasks, PostProcessPanoptic

logger = logging.getLogger(__name__)

#: What :meth:`Predictor.predict` accepts as one image: a file path, a PIL image, a ``uint8`` numpy array
#: ``[H, W]``, ``[H, W, 1]``, ``[H, W, 3]`` or ``[H, W, 4]`` (RGB order, alpha dropped), or a ``uint8``
#: tensor ``[C, H, W]`` as ``torchvision.io.decode_image`` returns it.
ImageInput = Union[str, Path, Image.Image, np.ndarray, Tensor]

Precision = Literal["fp32", "bf16"]

#: "detection": boxes (plus instance masks with a panoptic model); "instances": the same, but a model
#: without masks is refused; "panoptic": also the image's :class:`PanopticSegmentation`. The last two need a
#: panoptic model (:class:`detr.DETRPanoptic`).
Task = Literal["detection", "instances", "panoptic"]


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


@dataclass
class AttentionMaps:
    """Attention of one image, cropped to its unpadded ``h × w`` feature region (``h, w`` below).

    decoder: float32 ``[L, Q, h, w]``, decoder cross-attention per layer and query, mean over heads.
    decoder_heads: float32 ``[L, heads, Q, h, w]``, the same per head.
    encoder: float32 ``[h, w, h, w]``: ``encoder[y, x]`` is the last encoder layer's self-attention
        (mean over heads) of feature position ``(y, x)`` over all positions.
    scores: float32 ``[Q]``, every query's best class score (no-object excluded), as PostProcess scores it.
    labels: int64 ``[Q]``, that class.
    no_object_scores: float32 ``[Q]``, probability of "no object" (softmax head); None for a sigmoid head,
        which has no such class.
    boxes: float32 ``[Q, 4]``, every query's box, pixel ``xyxy`` in the original image.
    stride: backbone stride in resized-image pixels (32; 16 for DC5), feature cell ``(y, x)`` covers
        resized pixels ``[y * stride, (y + 1) * stride)``.
    input_size: ``(height, width)`` of the resized image the model saw (before padding).
    image_size: ``(height, width)`` of the original image.
    category_map: names the labels (None: "class <label>").
    """

    decoder: Tensor
    decoder_heads: Tensor
    encoder: Tensor
    scores: Tensor
    labels: Tensor
    no_object_scores: Tensor | None
    boxes: Tensor
    stride: int
    input_size: tuple[int, int]
    image_size: tuple[int, int]
    category_map: CategoryMap | None = None

    @property
    def feature_size(self) -> tuple[int, int]:
        """``(h, w)`` of the unpadded feature region."""
        return int(self.decoder.shape[-2]), int(self.decoder.shape[-1])

    def to_image(self, maps: Tensor) -> Tensor:
        """Upsample feature maps ``[..., h, w]`` to the original image: float32 ``[..., H, W]``.

        Bilinear, with each feature cell centred on the resized-image pixels it covers; the part of the
        last row and column that reaches past the image (the feature map rounds up) is cut off.
        """
        h, w = self.feature_size
        if tuple(maps.shape[-2:]) != (h, w):
            raise ValueError(f"maps must end in the feature size {(h, w)}, got shape {tuple(maps.shape)}")
        lead = maps.shape[:-2]
        flat = maps.reshape(-1, 1, h, w).float()
        resized = F.interpolate(flat, size=(h * self.stride, w * self.stride), mode="bilinear", align_corners=False)
        resized = resized[..., : self.input_size[0], : self.input_size[1]]
        if tuple(resized.shape[-2:]) != self.image_size:
            resized = F.interpolate(resized, size=self.image_size, mode="bilinear", align_corners=False)
        return resized.reshape(*lead, *self.image_size)

    def label_name(self, label: int) -> str:
        """Name of model label ``label``."""
        return label_name(self.category_map, label)

    def feature_position(self, x: float, y: float) -> tuple[int, int]:
        """Feature cell ``(row, col)`` that holds original-image pixel ``(x, y)``, clamped to the map."""
        h, w = self.feature_size
        row = int(y * self.input_size[0] / self.image_size[0] // self.stride)
        col = int(x * self.input_size[1] / self.image_size[1] // self.stride)
        return min(max(row, 0), h - 1), min(max(col, 0), w - 1)


@dataclass
class PanopticSegmentation:
    """One image's panoptic segmentation in COCO's panoptic format (paper §4.4), at the original image size.

    id_map: int64 ``[H, W]``, the segment id of every pixel: 1, 2, … (0 = void: only when no query is
        confident enough, i.e. above the predictor's ``panoptic_threshold``).
    segments_info: one dict per segment id, in id order: COCO panoptic's ``id``, ``category_id`` (the data
        set's id), ``isthing``, ``area`` (pixels), ``bbox`` (pixel ``[x, y, w, h]``), ``iscrowd`` (0), plus
        ``score`` (class probability), ``label`` (model label) and ``label_name``.
    """

    id_map: Tensor
    segments_info: list[dict[str, Any]]


@dataclass
class Prediction:
    """Detections of one image; ``N`` kept queries, in query order.

    boxes: float32 ``[N, 4]``, pixel ``xyxy`` in the original image (EXIF orientation applied).
    scores: float32 ``[N]``, probability of the predicted class (no-object excluded from the max).
    labels: int64 ``[N]``, model labels; ``label_names[i]`` names ``labels[i]``.
    query_indices: int64 ``[N]``, which of the model's queries each detection came from.
    image_size: ``(height, width)`` of the original image.
    file_name: the input's file name when it was a path, else None.
    image_id: set by callers that number images (prediction files); None otherwise.
    attention: only with ``return_attention=True``.
    masks: bool ``[N, H, W]``, each detection's instance mask at the original image size; a panoptic model
        only (None otherwise).
    panoptic: the image's :class:`PanopticSegmentation`; only with ``task="panoptic"``.
    """

    boxes: Tensor
    scores: Tensor
    labels: Tensor
    label_names: list[str]
    query_indices: Tensor
    image_size: tuple[int, int]
    file_name: str | None = None
    image_id: int | None = None
    attention: AttentionMaps | None = field(default=None, repr=False)
    masks: Tensor | None = field(default=None, repr=False)
    panoptic: PanopticSegmentation | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return int(self.scores.numel())

    def above(self, threshold: float) -> Prediction:
        """The detections whose score is strictly above ``threshold`` (attention and panoptic kept as is)."""
        keep = self.scores > threshold
        return replace(
            self,
            boxes=self.boxes[keep],
            scores=self.scores[keep],
            labels=self.labels[keep],
            label_names=[name for name, k in zip(self.label_names, keep.tolist()) if k],
            query_indices=self.query_indices[keep],
            masks=None if self.masks is None else self.masks[keep],
        )


def select_detections(
    result: dict[str, Tensor],
    *,
    image_size: tuple[int, int],
    category_map: CategoryMap | None,
    threshold: float | None,
    file_name: str | None = None,
    image_id: int | None = None,
) -> Prediction:
    """One image's :class:`detr.PostProcess` output → :class:`Prediction`.

    Args:
        result: ``{"scores" [Q], "labels" int64 [Q], "boxes" [Q, 4] pixel xyxy}`` for one image.
        image_size: ``(height, width)`` of the original image.
        category_map: names the labels; None names them ``"class <label>"``.
        threshold: keep queries whose score is strictly above it; None keeps all queries.
    """
    scores = result["scores"].detach().float().cpu()
    keep = torch.arange(scores.numel()) if threshold is None else torch.nonzero(scores > threshold).flatten()
    labels = result["labels"].detach().cpu()[keep].long()
    return Prediction(
        boxes=result["boxes"].detach().float().cpu()[keep],
        scores=scores[keep],
        labels=labels,
        label_names=[label_name(category_map, int(label)) for label in labels],
        query_indices=keep,
        image_size=(int(image_size[0]), int(image_size[1])),
        file_name=file_name,
        image_id=image_id,
    )


def label_name(category_map: CategoryMap | None, label: int) -> str:
    """Name of a model label (the map's; "class <label>" without a map)."""
    if category_map is not None:
        return category_map.name(label)
    return f"class {label}"


def add_resize_arguments(parser: argparse.ArgumentParser) -> None:
    """``--min-size`` / ``--max-size`` of the tools that run a checkpoint on images (default None: the
    size the checkpoint was validated at, else the authors' 800 / 1333; see :class:`Predictor`)."""
    parser.add_argument("--min-size", type=int, default=None,
                        help=f"eval resize: shortest side (default: the checkpoint's validation size, else {EVAL_MIN_SIZE})")
    parser.add_argument("--max-size", type=int, default=None,
                        help=f"eval resize: longest side cap (default: the checkpoint's validation size, else {EVAL_MAX_SIZE})")


class Predictor:
    """DETR inference on images of any size and mode.

    Build it from a checkpoint with :meth:`from_checkpoint` (released ``{"model": ...}`` files, plain state
    dicts in that layout, and this project's Lightning checkpoints) or from a model and its
    :class:`~detr.categories.CategoryMap`.

    Args:
        model: a :class:`detr.models.DETR` (any module with its forward contract).
        category_map: names and data set ids of the labels; default: ``model.meta.category_map`` if set.
        device: where the model runs; default CUDA when available, else CPU.
        precision: "fp32", or "bf16" for bfloat16 autocast (on CPU and CUDA).
        threshold: default score threshold of :meth:`predict` (the authors' demo uses 0.7).
        batch_size: images per forward pass. Padding depends on the batch, so outputs can differ slightly
            with the batch size, as in the authors' evaluation.
        min_size, max_size: the eval resize (shortest side ``min_size``, longest at most ``max_size``);
            None: the model's ``meta.eval_size`` (what it was validated at in training, set by
            :func:`detr.load_checkpoint` for this project's checkpoints), else the authors' 800 and 1333.
        optimize: call ``model.optimize_for_inference()`` (frozen BatchNorms folded into the convolutions,
            backbone in channels-last), in place: same outputs up to float rounding, faster (docs/speed.md),
            but the model's state dict loses the authors' layout. Default off
            for a model you pass; :meth:`from_checkpoint` turns it on.
        is_thing: panoptic models: per label, thing (True) or stuff; default ``model.meta.is_thing`` (set by
            :func:`detr.load_checkpoint` for COCO panoptic files and this project's panoptic checkpoints).
        panoptic_threshold: class probability a query needs to get a panoptic segment; default: the one the
            model's training run validated with (``model.meta.panoptic_threshold``, this project's panoptic
            checkpoints), else the authors' 0.85.
        panoptic_overlap_threshold: Mask2Former's overlap filter of
            :class:`detr.inference.postprocess_masks.PostProcessPanoptic` (e.g. 0.8); default: the model's
            training run's, else none (the authors' rules).

    The model is put in eval mode and moved to ``device`` in place.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        category_map: CategoryMap | None = None,
        device: str | torch.device | None = None,
        precision: Precision = "fp32",
        threshold: float = 0.7,
        batch_size: int = 1,
        min_size: int | None = None,
        max_size: int | None = None,
        optimize: bool = False,
        is_thing: Sequence[bool] | None = None,
        panoptic_threshold: float | None = None,
        panoptic_overlap_threshold: float | None = None,
    ) -> None:
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"precision must be 'fp32' or 'bf16', got {precision!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold is a probability in [0, 1], got {threshold}")
        self.device = torch.device(device) if device is not None else default_device()
        if optimize:
            model.optimize_for_inference()
        self.model = model.eval().to(self.device)
        self.category_map = category_map if category_map is not None else model.meta.category_map
        num_classes = model.config.num_classes
        if self.category_map is not None and self.category_map.num_classes != num_classes:
            raise ValueError(
                f"category_map has {self.category_map.num_classes} classes but the model predicts "
                f"{num_classes}; pass the category map the model was trained with"
            )
        self.precision: Precision = precision
        self.threshold = float(threshold)
        self.batch_size = int(batch_size)
        trained_size = model.meta.eval_size or (EVAL_MIN_SIZE, EVAL_MAX_SIZE)
        self.min_size = int(min_size if min_size is not None else trained_size[0])
        self.max_size = int(max_size if max_size is not None else trained_size[1])
        self.transform = make_eval_transform(min_size=self.min_size, max_size=self.max_size)
        self.class_head = model.config.class_head
        self.postprocess = PostProcess(class_head=self.class_head)
        #: whether the model predicts masks (``pred_masks``): a :class:`detr.DETRPanoptic`
        self.predicts_masks = isinstance(model, DETRPanoptic)
        self.postprocess_masks = PostProcessMasks()
        meta = model.meta
        if is_thing is None and meta.is_thing is not None:
            is_thing = meta.is_thing
        self.is_thing = list(is_thing) if is_thing is not None else None
        if panoptic_threshold is None:  # what the training run validated with, else the authors' 0.85
            panoptic_threshold = meta.panoptic_threshold if meta.panoptic_threshold is not None else 0.85
        self.panoptic_threshold = float(panoptic_threshold)
        self.panoptic_overlap_threshold = (panoptic_overlap_threshold if panoptic_overlap_threshold is not None
                                           else meta.panoptic_overlap_threshold)
        #: what runs the model, e.g. "pytorch (cpu, fp32)" or "onnxruntime (CPUExecutionProvider)"
        self.backend: str = (model.backend if isinstance(model, OnnxDetector)
                             else f"pytorch ({self.device}, {precision})")
        logger.info("predicting with %s", self.backend)

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        *,
        device: str | torch.device | None = None,
        precision: Precision = "fp32",
        threshold: float = 0.7,
        batch_size: int = 1,
        min_size: int | None = None,
        max_size: int | None = None,
        optimize: bool = True,
        category_map: CategoryMap | None = None,
        is_thing: Sequence[bool] | None = None,
        panoptic_threshold: float | None = None,
        panoptic_overlap_threshold: float | None = None,
        **model_overrides: object,
    ) -> Predictor:
        """Load ``path`` with :func:`detr.load_checkpoint` (``model_overrides`` go to it) and wrap it.

        The label names come from the checkpoint: COCO's (with the gaps of its 91-id space) for the
        authors' files, the training data set's for this project's; ``category_map`` overrides them.
        The model is private to the predictor, so ``optimize`` defaults to on (see :class:`Predictor`).

        A ``.onnx`` file (exported by ``tools/export.py``) runs with ONNX Runtime instead of PyTorch, on
        ``device`` (CUDA when onnxruntime-gpu has it); its metadata holds the label names and eval resize.
        """
        if Path(path).suffix.lower() == ".onnx":
            if precision != "fp32" or model_overrides:
                raise ValueError(f"{path} is an ONNX file: it runs in the precision it was exported in (fp32) "
                                 f"and its architecture is fixed; drop precision={precision!r} and "
                                 f"{sorted(model_overrides)} or use the PyTorch checkpoint")
            model = OnnxDetector(path, device=device if device is not None else default_device())
        else:
            model = load_checkpoint(path, **model_overrides)
        return cls(
            model,
            category_map=category_map,
            device=device,
            precision=precision,
            threshold=threshold,
            batch_size=batch_size,
            min_size=min_size,
            max_size=max_size,
            optimize=optimize,
            is_thing=is_thing,
            panoptic_threshold=panoptic_threshold,
            panoptic_overlap_threshold=panoptic_overlap_threshold,
        )

    def preprocess(self, image: np.ndarray) -> Tensor:
        """``uint8`` RGB ``[H, W, 3]`` → normalised float32 ``[3, h, w]`` after the eval resize."""
        empty = np.zeros((0, 4), dtype=np.float32)
        out = self.transform(image=image, bboxes=empty, labels=np.zeros((0,), dtype=np.int64))
        tensor = out["image"]
        if not isinstance(tensor, Tensor):
            tensor = torch.from_numpy(np.ascontiguousarray(tensor.transpose(2, 0, 1)))
        return tensor.float()

    def predict(
        self,
        images: ImageInput | Sequence[ImageInput],
        *,
        threshold: float | None = None,
        all_queries: bool = False,
        return_attention: bool = False,
        task: Task = "detection",
    ) -> list[Prediction]:
        """Detect objects in one image or a sequence of images; one :class:`Prediction` per image.

        Args:
            images: one :data:`ImageInput` or a sequence of them (mixed kinds and sizes are fine).
            threshold: score threshold for this call (default: the predictor's).
            all_queries: keep every query (no threshold), as COCO evaluation does.
            return_attention: also compute the attention maps (slower; see :class:`AttentionMaps`).
            task: "panoptic" also segments each image (:attr:`Prediction.panoptic`; a panoptic model only);
                see :data:`Task`.

        Raises:
            ValueError: ``task`` "instances" or "panoptic" with a model that predicts no masks, naming the fix.
        """
        self.check_task(task)
        if _is_single_image(images):
            images = [images]  # type: ignore[list-item]
        keep_threshold = None if all_queries else (self.threshold if threshold is None else float(threshold))
        predictions: list[Prediction] = []
        for chunk in _chunks(list(images), self.batch_size):  # type: ignore[arg-type]
            arrays = [to_rgb_array(image) for image in chunk]
            names = [Path(image).name if isinstance(image, (str, Path)) else None for image in chunk]
            predictions.extend(
                self.predict_arrays(
                    arrays, file_names=names, threshold=keep_threshold, return_attention=return_attention, task=task
                )
            )
        return predictions

    __call__ = predict

    def predict_panoptic(
        self, images: ImageInput | Sequence[ImageInput], *, threshold: float | None = None
    ) -> list[Prediction]:
        """:meth:`predict` with ``task="panoptic"``: detections, their masks and :attr:`Prediction.panoptic`."""
        return self.predict(images, threshold=threshold, task="panoptic")

    def check_task(self, task: str) -> None:
        """Raise ``ValueError`` when this predictor cannot do ``task``, naming the fix."""
        if task not in ("detection", "instances", "panoptic"):
            raise ValueError(f"task must be 'detection', 'instances' or 'panoptic', got {task!r}")
        if task == "detection" or self.predicts_masks:
            return
        if self.backend.startswith("onnxruntime"):
            raise ValueError(f"task {task!r} needs the mask head, which ONNX exports ({self.backend}) do not run; "
                             "use the PyTorch panoptic checkpoint (e.g. detr-r50-panoptic)")
        raise ValueError(f"{type(self.model).__name__} is a detection model without a mask head, so it cannot do "
                         f"task {task!r}; load a panoptic checkpoint (e.g. detr-r50-panoptic, or a .pth/.ckpt "
                         "with mask_head.* weights)")

    def _panoptic_postprocess(self) -> PostProcessPanoptic:
        num_classes = self.model.config.num_classes
        if self.is_thing is None:
            raise ValueError("panoptic segmentation needs to know which labels are things and which stuff; this "
                             "checkpoint does not say: pass Predictor(..., is_thing=[one bool per label])")
        if len(self.is_thing) != num_classes:
            raise ValueError(f"is_thing has {len(self.is_thing)} entries but the model predicts {num_classes} "
                             "classes; pass one bool per label")
        category_ids = self.category_map.category_ids if self.category_map is not None else None
        return PostProcessPanoptic(self.is_thing, threshold=self.panoptic_threshold, category_ids=category_ids,
                                   class_head=self.class_head, overlap_threshold=self.panoptic_overlap_threshold)

    def predict_arrays(
        self,
        arrays: Sequence[np.ndarray],
        *,
        file_names: Sequence[str | None] | None = None,
        threshold: float | None,
        return_attention: bool = False,
        task: Task = "detection",
        masks: bool = True,
    ) -> list[Prediction]:
        """One forward pass on already loaded ``uint8`` RGB arrays ``[H, W, 3]`` (one batch, any count).

        ``threshold=None`` keeps all queries. Most callers want :meth:`predict`; this is the step it
        batches, for callers that load images themselves (e.g. to skip unreadable files). ``masks=False``
        leaves out a panoptic model's instance masks (e.g. when every query is kept only to check the scores:
        a full-size mask per query costs memory).
        """
        self.check_task(task)
        if not arrays:
            return []
        inputs = [self.preprocess(array) for array in arrays]
        images, padding_mask = pad_images(inputs)  # the batch contract: zeros bottom/right, True = padding
        outputs = self.forward(images, padding_mask, return_attention=return_attention)
        image_sizes = [(int(a.shape[0]), int(a.shape[1])) for a in arrays]
        target_sizes = torch.tensor(image_sizes, dtype=torch.int64)
        results = self.postprocess(
            {"pred_logits": outputs["pred_logits"], "pred_boxes": outputs["pred_boxes"]}, target_sizes
        )
        file_names = list(file_names) if file_names is not None else [None] * len(arrays)
        input_sizes = [(int(t.shape[1]), int(t.shape[2])) for t in inputs]
        padded_size = (int(images.shape[-2]), int(images.shape[-1]))
        segmentations = None
        if task == "panoptic":
            segmentations = self._panoptic_postprocess()(
                {"pred_logits": outputs["pred_logits"], "pred_masks": outputs["pred_masks"]},
                torch.tensor(input_sizes, dtype=torch.int64), target_sizes,
            )
        predictions = []
        for i, result in enumerate(results):
            prediction = select_detections(
                result,
                image_size=image_sizes[i],
                category_map=self.category_map,
                threshold=threshold,
                file_name=file_names[i],
            )
            if masks and self.predicts_masks:  # the kept detections only: one full-size map each
                prediction.masks = self.postprocess_masks.image_masks(
                    outputs["pred_masks"][i, prediction.query_indices], input_sizes[i], padded_size, image_sizes[i]
                )
            if segmentations is not None:
                segments = [{**segment, "label_name": label_name(self.category_map, segment["label"])}
                            for segment in segmentations[i]["segments_info"]]
                prediction.panoptic = PanopticSegmentation(segmentations[i]["id_map"].cpu(), segments)
            if return_attention:
                input_size = (int(inputs[i].shape[1]), int(inputs[i].shape[2]))
                prediction.attention = _image_attention(
                    outputs, result, i, input_size, image_sizes[i], self.model.stride, self.category_map,
                    self.class_head,
                )
            predictions.append(prediction)
        return predictions

    def forward(self, images: Tensor, padding_mask: Tensor, *, return_attention: bool = False) -> dict[str, Tensor]:
        """The model on a padded batch, under ``torch.inference_mode`` and the chosen precision.

        Returns the model's output dict on the CPU in float32 (aux outputs dropped).
        """
        with torch.inference_mode(), torch.autocast(
            device_type=self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16"
        ):
            outputs = self.model(
                images.to(self.device, non_blocking=True),
                padding_mask.to(self.device, non_blocking=True),
                return_attention=return_attention,
            )
        return {key: value.float().cpu() for key, value in outputs.items() if isinstance(value, Tensor)}


def default_device() -> torch.device:
    """CUDA when available, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _image_attention(
    outputs: dict[str, Tensor],
    result: dict[str, Tensor],
    index: int,
    input_size: tuple[int, int],
    image_size: tuple[int, int],
    stride: int,
    category_map: CategoryMap | None,
    class_head: str,
) -> AttentionMaps:
    """Cut image ``index``'s attention out of the batch outputs, cropped to its unpadded feature region."""
    for key in ("decoder_attention", "decoder_attention_heads", "encoder_attention", "feature_mask"):
        if key not in outputs:
            raise ValueError(f"the model output lacks {key!r}; it must support forward(..., return_attention=True)")
    feature_mask = outputs["feature_mask"][index].bool()  # [H', W'] True = padding
    full_h, full_w = feature_mask.shape
    h = int((~feature_mask[:, 0]).sum())
    w = int((~feature_mask[0, :]).sum())
    encoder = outputs["encoder_attention"][index].reshape(full_h, full_w, full_h, full_w)[:h, :w, :h, :w]
    logits = outputs["pred_logits"][index].float()
    no_object_scores = None
    if class_head == "softmax":
        no_object_scores = logits.softmax(-1)[:, -1]
    return AttentionMaps(
        decoder=outputs["decoder_attention"][:, index, :, :h, :w].float().contiguous(),
        decoder_heads=outputs["decoder_attention_heads"][:, index, :, :, :h, :w].float().contiguous(),
        encoder=encoder.float().contiguous(),
        scores=result["scores"].float(),
        labels=result["labels"].long(),
        no_object_scores=no_object_scores,
        boxes=result["boxes"].float(),
        stride=int(stride),
        input_size=input_size,
        image_size=image_size,
        category_map=category_map,
    )


def _is_single_image(images: object) -> bool:
    return isinstance(images, (str, Path, Image.Image, np.ndarray, Tensor))


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
