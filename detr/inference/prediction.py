"""What a prediction run returns per image: :class:`Prediction` (boxes, scores, labels; masks and a panoptic
segmentation for a panoptic model; keypoints for a keypoint model) and the :class:`AttentionMaps` that
``return_attention=True`` adds."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from detr.categories import CategoryMap
from detr.models.outputs import DetectorOutput

if TYPE_CHECKING:
    import supervision as sv


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

    @classmethod
    def from_outputs(
        cls,
        outputs: DetectorOutput,
        result: dict[str, Tensor],
        *,
        index: int,
        input_size: tuple[int, int],
        image_size: tuple[int, int],
        stride: int,
        category_map: CategoryMap | None,
        class_head: str,
    ) -> AttentionMaps:
        """Image ``index``'s attention cut out of a batch's outputs (``model(..., return_attention=True)``) and
        cropped to its unpadded feature region; ``result`` is that image's :class:`detr.PostProcess` output."""
        attention = outputs.attention
        if attention is None:
            raise ValueError("the model output has no attention maps; call it with return_attention=True (a "
                             "dense-attention detector: DETR, the anchor detector, the panoptic model)")
        feature_mask = attention.feature_mask[index].bool()  # [H', W'] True = padding
        full_h, full_w = feature_mask.shape
        h, w = unpadded_feature_size(feature_mask)
        encoder = attention.encoder[index].reshape(full_h, full_w, full_h, full_w)[:h, :w, :h, :w]
        logits = outputs.logits[index].float()
        return cls(
            decoder=attention.decoder[:, index, :, :h, :w].float().contiguous(),
            decoder_heads=attention.decoder_heads[:, index, :, :, :h, :w].float().contiguous(),
            encoder=encoder.float().contiguous(),
            scores=result["scores"].float(),
            labels=result["labels"].long(),
            no_object_scores=logits.softmax(-1)[:, -1] if class_head == "softmax" else None,
            boxes=result["boxes"].float(),
            stride=int(stride),
            input_size=input_size,
            image_size=image_size,
            category_map=category_map,
        )

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


def unpadded_feature_size(feature_mask: Tensor) -> tuple[int, int]:
    """``(h, w)`` of one image's unpadded feature region from its feature mask bool ``[H', W']`` (True =
    padding, which is at the bottom and right)."""
    return int((~feature_mask[:, 0]).sum()), int((~feature_mask[0, :]).sum())


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
class SamplingPoints:
    """Where a Deformable DETR's decoder cross-attention looked for one image (the paper's Fig. 5 / 6 kind
    of view): for every decoder layer and query, ``num_points`` points per head and feature level.

    points: float32 ``[L, Q, heads, levels, P, 2]``, (x, y) in pixels of the original image (up to the
        rounding of the batch padding to whole cells of each level). weights: float32
        ``[L, Q, heads, levels, P]``, each head's attention weights (summing to 1 over levels and points).
    strides: input pixels per cell of each level (8, 16, 32, 64 for the paper's four levels; the model's
        :attr:`detr.models.outputs.SamplingOutput.strides`).
    scores: float32 ``[Q]``, every query's best class score (to choose queries beyond the kept detections).
    """

    points: Tensor
    weights: Tensor
    strides: tuple[int, ...]
    scores: Tensor

    @classmethod
    def from_outputs(cls, outputs: DetectorOutput, result: dict[str, Tensor], *, index: int,
                     image_size: tuple[int, int]) -> SamplingPoints:
        """Image ``index``'s points out of a batch's outputs (``model(..., return_attention=True)``: its
        ``sampling``); ``result`` is that image's :class:`detr.PostProcess` output; ``image_size`` is the
        original image's (height, width)."""
        sampling = outputs.sampling
        if sampling is None:
            raise ValueError("the model output has no sampling points: a Deformable DETR's forward(..., "
                             "return_attention=True) gives them")
        height, width = image_size
        scale = torch.tensor([width, height], dtype=torch.float32)
        return cls(points=sampling.points[:, index].float() * scale,
                   weights=sampling.weights[:, index].float(), strides=tuple(sampling.strides),
                   scores=result["scores"].float())


@dataclass
class Prediction:
    """Detections of one image; ``N`` kept queries, in query order (sliced inference: merged from the tiles, in
    decreasing score order, :mod:`detr.inference.slicing`).

    boxes: float32 ``[N, 4]``, pixel ``xyxy`` in the original image (EXIF orientation applied).
    scores: float32 ``[N]``, probability of the predicted class (no-object excluded from the max).
    labels: int64 ``[N]``, model labels; ``label_names[i]`` names ``labels[i]``.
    query_indices: int64 ``[N]``, which of the model's queries each detection came from (sliced: a query of the
        tile or whole-image input that found it).
    image_size: ``(height, width)`` of the original image.
    file_name: the input's file name when it was a path, else None.
    image_id: set by callers that number images (prediction files); None otherwise.
    attention: only with ``return_attention=True`` (the paper's DETR: dense attention maps).
    sampling: only with ``return_attention=True`` on a Deformable DETR: its :class:`SamplingPoints`.
    masks: bool ``[N, H, W]``, each detection's instance mask at the original image size; a panoptic model
        only (None otherwise).
    panoptic: the image's :class:`PanopticSegmentation`; only with ``task="panoptic"``.
    keypoints: float32 ``[N, K, 3]``, each detection's K points: pixel x, y in the original image and a per-point
        score (the model's visibility probability); a keypoint model only (None otherwise). A category of fewer
        than K points uses its first ones (:attr:`keypoint_counts`, :meth:`detection_keypoints`), the rest zeros.
    keypoint_counts: a keypoint model's points per model label (its schema's counts; a label past the end has
        none); None: every detection's K points are its own.
    keypoint_skeletons: label → 0-based point pairs joined in drawings (the category map's, from the training
        data's ``skeleton``; :func:`detr.visualize.drawing.draw_prediction` draws them); None: points only.
    error: why the image has no predictions (it could not be read, or the model's outputs for it are not
        finite); None for an image that was predicted. Every prediction command skips such an image and
        reports the reason (:func:`detr.inference.predict.predictions_from_outputs`).
    cut_at: the score threshold its detections were selected with (None: every query kept); :meth:`above`
        with a lower one warns that those detections are already gone.
    track_ids: int64 ``[N]``, each detection's track (:meth:`detr.inference.predictor.Predictor.track`; -1: not in a
        track yet); None outside tracking.
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
    sampling: SamplingPoints | None = field(default=None, repr=False)
    keypoints: Tensor | None = field(default=None, repr=False)
    keypoint_counts: tuple[int, ...] | None = field(default=None, repr=False)
    keypoint_skeletons: dict[int, tuple[tuple[int, int], ...]] | None = field(default=None, repr=False)
    error: str | None = None
    cut_at: float | None = None
    track_ids: Tensor | None = None

    def __len__(self) -> int:
        return int(self.scores.numel())

    def detection_keypoints(self, index: int) -> Tensor | None:
        """Detection ``index``'s own points ``[k, 3]``: the first :attr:`keypoint_counts` of its label of its K
        (all K without counts; none, ``[0, 3]``, for a label without keypoints); None without keypoints."""
        if self.keypoints is None:
            return None
        points = self.keypoints[index]
        if self.keypoint_counts is None:
            return points
        label = int(self.labels[index])
        return points[:self.keypoint_counts[label] if 0 <= label < len(self.keypoint_counts) else 0]

    def above(self, threshold: float) -> Prediction:
        """The detections whose score is strictly above ``threshold`` (attention and panoptic kept as is).

        A threshold below :attr:`cut_at` cannot bring back what the prediction already left out: it warns,
        naming how to keep them (``predict(..., threshold=...)`` or ``all_queries=True``)."""
        if self.cut_at is not None and threshold < self.cut_at:
            warnings.warn(f"this prediction kept only the detections above {self.cut_at:g}: above({threshold:g}) "
                          f"finds no more; predict with threshold={threshold:g} (or all_queries=True) to see them",
                          stacklevel=2)
        keep = self.scores > threshold
        return replace(
            self,
            boxes=self.boxes[keep],
            scores=self.scores[keep],
            labels=self.labels[keep],
            label_names=[name for name, k in zip(self.label_names, keep.tolist()) if k],
            query_indices=self.query_indices[keep],
            masks=None if self.masks is None else self.masks[keep],
            keypoints=None if self.keypoints is None else self.keypoints[keep],
            track_ids=None if self.track_ids is None else self.track_ids[keep],
            cut_at=threshold if self.cut_at is None else max(threshold, self.cut_at),
        )

    def to_supervision(self) -> sv.Detections:
        """These detections as supervision's ``sv.Detections`` (for its annotators, trackers, slicers and metrics).

        ``xyxy`` float32 ``[N, 4]`` pixel corners, ``class_id`` int64 model labels, ``confidence`` float32
        scores, ``data["class_name"]`` the label names, ``mask`` bool ``[N, H, W]`` when the prediction has masks.
        Needs supervision (``pip install 'detr-lightning[supervision]'``).

        A keypoint model's points are supervision's other type, :meth:`to_supervision_keypoints`' ``sv.KeyPoints``
        (its ``VertexAnnotator`` and ``EdgeAnnotator`` draw them), row for row with these detections: the same
        boolean index selects the same objects of both."""
        from detr.data.supervision import import_supervision

        sv = import_supervision()
        return sv.Detections(
            xyxy=self.boxes.detach().float().cpu().numpy().reshape(-1, 4),
            class_id=self.labels.detach().cpu().long().numpy(),
            confidence=self.scores.detach().float().cpu().numpy(),
            mask=None if self.masks is None else self.masks.detach().cpu().bool().numpy(),
            data={"class_name": np.array(self.label_names, dtype=str)},
        )

    def to_supervision_keypoints(self, *, keypoint_threshold: float = 0.5) -> sv.KeyPoints:
        """A keypoint model's points as supervision's ``sv.KeyPoints``, row ``i`` the points of detection ``i``
        (the row of :meth:`to_supervision`'s ``sv.Detections``), as the rfdetr package's keypoint model returns
        them.

        ``xy`` float32 ``[N, K, 2]`` pixel x, y in the original image, ``keypoint_confidence`` float32 ``[N, K]``
        each point's score, ``visible`` bool ``[N, K]`` the points scored above ``keypoint_threshold`` (those
        :func:`detr.visualize.drawing.draw_prediction` draws), ``class_id`` int64 model labels,
        ``detection_confidence`` float32 the detections' scores, ``data["class_name"]`` the label names. A
        category of fewer than K points fills the rest with ``(0, 0)`` scored 0, supervision's missing point.
        Needs supervision (``pip install 'detr-lightning[supervision]'``).

        Raises:
            ValueError: the prediction has no keypoints (the model predicts none).
        """
        if self.keypoints is None:
            raise ValueError("this prediction has no keypoints (its model predicts none): to_supervision_keypoints "
                             "needs a keypoint model's prediction; use to_supervision() for the boxes")
        from detr.data.supervision import import_supervision

        sv = import_supervision()
        points = self.keypoints.detach().float().cpu().numpy()  # [N, K, 3]
        return sv.KeyPoints(
            xy=np.ascontiguousarray(points[..., :2]),
            class_id=self.labels.detach().cpu().long().numpy(),
            keypoint_confidence=np.ascontiguousarray(points[..., 2]),
            detection_confidence=self.scores.detach().float().cpu().numpy(),
            visible=points[..., 2] > keypoint_threshold,
            data={"class_name": np.array(self.label_names, dtype=str)},
        )

    @classmethod
    def from_supervision(cls, detections: sv.Detections, *, image_size: tuple[int, int],
                         category_map: CategoryMap | None = None, file_name: str | None = None,
                         keypoints: sv.KeyPoints | None = None) -> Prediction:
        """supervision's ``sv.Detections`` of one image as a :class:`Prediction` (``image_size``: its
        ``(height, width)``), e.g. ground truth or another detector's output for this package's drawing and
        evaluation.

        Label names come from ``data["class_name"]`` when the detections have it, else from ``category_map``
        (else "class <id>"); detections without ``confidence`` (ground truth) score 1. There are no model
        queries behind them: ``query_indices`` are -1.

        ``keypoints``: the detections' ``sv.KeyPoints``, row for row (:meth:`to_supervision_keypoints`'), as
        :attr:`keypoints` ``[N, K, 3]``: x, y and ``keypoint_confidence`` (without it, 1 for a ``visible`` point
        and 0 for another; 1 for all without either).

        Raises:
            ValueError: the detections have no ``class_id``, or ``keypoints`` holds another number of objects.
        """
        count = len(detections)
        if count and detections.class_id is None:
            raise ValueError("the detections have no class_id: a Prediction needs each detection's class")
        if keypoints is not None and len(keypoints) != count:
            raise ValueError(f"from_supervision: keypoints holds {len(keypoints)} objects but detections {count}; "
                             f"pass the key points of the same objects, row for row")
        labels = torch.as_tensor(np.asarray(detections.class_id if count else [], dtype=np.int64))
        names = detections.data.get("class_name") if detections.data else None
        label_names = ([str(name) for name in names] if names is not None and len(names) == count
                       else [label_name(category_map, int(label)) for label in labels])
        confidence = detections.confidence if detections.confidence is not None else np.ones(count)
        return cls(
            boxes=torch.as_tensor(np.asarray(detections.xyxy, dtype=np.float32)).reshape(-1, 4),
            scores=torch.as_tensor(np.asarray(confidence, dtype=np.float32)),
            labels=labels,
            label_names=label_names,
            query_indices=torch.full((count,), -1, dtype=torch.int64),
            image_size=(int(image_size[0]), int(image_size[1])),
            file_name=file_name,
            masks=None if detections.mask is None else torch.as_tensor(np.asarray(detections.mask, dtype=bool)),
            keypoints=None if keypoints is None else _keypoints_from_supervision(keypoints),
        )


def _keypoints_from_supervision(keypoints: sv.KeyPoints) -> Tensor:
    """``sv.KeyPoints`` → float32 ``[N, K, 3]``: x, y and each point's confidence (else its visibility as 1/0)."""
    xy = np.asarray(keypoints.xy, dtype=np.float32)
    if keypoints.keypoint_confidence is not None:
        score = np.asarray(keypoints.keypoint_confidence, dtype=np.float32)
    elif keypoints.visible is not None:
        score = np.asarray(keypoints.visible, dtype=np.float32)
    else:
        score = np.ones(xy.shape[:2], dtype=np.float32)
    return torch.as_tensor(np.concatenate([xy, score.reshape(*xy.shape[:2], 1)], axis=-1))


def select_detections(
    result: dict[str, Tensor],
    *,
    image_size: tuple[int, int],
    category_map: CategoryMap | None,
    threshold: float | None,
    file_name: str | None = None,
    image_id: int | None = None,
    keypoint_counts: tuple[int, ...] | None = None,
) -> Prediction:
    """One image's :class:`detr.PostProcess` output → :class:`Prediction`.

    Args:
        result: ``{"scores" [N], "labels" int64 [N], "boxes" [N, 4] pixel xyxy, "queries" int64 [N]}`` for one
            image, and ``"keypoints"`` [N, K, 3] for a keypoint model
            (:func:`detr.inference.postprocess_keypoints.add_keypoints`).
        image_size: ``(height, width)`` of the original image.
        category_map: names the labels; None names them ``"class <label>"``.
        threshold: keep queries whose score is strictly above it; None keeps all queries.
        keypoint_counts: a keypoint model's points per label (:attr:`Prediction.keypoint_counts`).
    """
    scores = result["scores"].detach().float().cpu()
    keep = torch.arange(scores.numel()) if threshold is None else torch.nonzero(scores > threshold).flatten()
    labels = result["labels"].detach().cpu()[keep].long()
    keypoints = result.get("keypoints")
    return Prediction(
        boxes=result["boxes"].detach().float().cpu()[keep],
        scores=scores[keep],
        labels=labels,
        label_names=[label_name(category_map, int(label)) for label in labels],
        query_indices=result["queries"].detach().cpu()[keep].long(),
        image_size=(int(image_size[0]), int(image_size[1])),
        file_name=file_name,
        image_id=image_id,
        cut_at=None if threshold is None else float(threshold),
        keypoints=None if keypoints is None else keypoints.detach().float().cpu()[keep],
        keypoint_counts=None if keypoints is None else keypoint_counts,
        keypoint_skeletons=(category_map.skeleton_by_label() if keypoints is not None and category_map is not None
                            and category_map.skeletons else None),
    )


def label_name(category_map: CategoryMap | None, label: int) -> str:
    """Name of a model label (the map's; "class <label>" without a map)."""
    if category_map is not None:
        return category_map.name(label)
    return f"class {label}"
