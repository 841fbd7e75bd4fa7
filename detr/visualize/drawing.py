"""Drawing on images, once for every caller: boxes with "name score" labels, panoptic segments, colours.

The prediction files (:func:`detr.inference.outputs.predict_files`), the validation images of training
(:class:`detr.lightning.callbacks.DrawValidationPredictions`), the panoptic outputs and the matplotlib figures
(:mod:`detr.visualize.figures`, :mod:`detr.visualize.analysis_figures`) all draw through this module, so one
class has one colour everywhere and the labels read the same.

- raster images (``uint8`` ``[3, H, W]`` tensors): :func:`draw_boxes` (``torchvision.utils.draw_bounding_boxes``),
  :func:`draw_prediction` (with its instance masks and keypoints, if any), :func:`draw_keypoints_with_skeleton`,
  :func:`draw_detections` (true and predicted boxes), :func:`draw_tracks` (a tracked frame: boxes, ids and trails),
  :func:`draw_panoptic`
  (``torchvision.utils.draw_segmentation_masks``), :func:`save_image`;
- matplotlib axes: :func:`add_box`, :func:`matplotlib_color`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib import font_manager
from matplotlib.axes import Axes
from matplotlib.patches import Rectangle
from PIL import Image, ImageDraw, ImageFont
from torch import Tensor
from torchvision.utils import draw_bounding_boxes, draw_segmentation_masks

from detr.atomic_files import write_atomically
from detr.categories import CategoryMap
from detr.inference.images import ImageInput, to_rgb_array
from detr.inference.prediction import PanopticSegmentation, Prediction

# Tableau-like palette, readable on photos; a label always gets the same colour.
_PALETTE: tuple[tuple[int, int, int], ...] = (
    (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
    (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207), (0, 114, 189), (217, 83, 25),
)


#: Label text heights (px) in drawings: 1/32 of the image's short side within these. Below 8 px the text is no
#: longer readable; 11 px, the former minimum, made each label of a 128-px image half as wide as the image, and
#: the labels covered the objects. Above 36 px a label only hides more of a large photo.
MIN_LABEL_FONT = 8
MAX_LABEL_FONT = 36

#: The colours of :func:`draw_detections`' labels: ground truth (a darker green than its lime boxes, for white
#: text) and predictions.
LEGEND_TRUE: tuple[int, int, int] = (0, 128, 0)
LEGEND_PREDICTED: tuple[int, int, int] = (200, 0, 0)


def label_color(label: int) -> tuple[int, int, int]:
    """RGB colour of a model label (fixed per label, so one class has one colour in every image)."""
    return _PALETTE[int(label) % len(_PALETTE)]


def matplotlib_color(rgb: tuple[int, int, int]) -> tuple[float, float, float]:
    """An 8-bit RGB colour as matplotlib's floats in [0, 1]."""
    return (rgb[0] / 255, rgb[1] / 255, rgb[2] / 255)


def detection_labels(names: Sequence[str], scores: Tensor | None = None) -> list[str]:
    """The text drawn beside each box: "name score" (score to two decimals), or the bare name without scores."""
    if scores is None:
        return list(names)
    return [f"{name} {score:.2f}" for name, score in zip(names, scores.tolist())]


def draw_boxes(
    image: Tensor,
    boxes_xyxy: Tensor,
    labels: Sequence[str] | None,
    colors: str | Sequence[tuple[int, int, int]],
    *,
    line_width: int | None = None,
    font_size: int | None = None,
) -> Tensor:
    """Boxes (pixel ``xyxy`` [N, 4] in ``image``) on ``image`` (``uint8`` ``[3, H, W]``), each label in white
    on a background of its box's colour; one colour for all boxes or one per box. The line width and font
    size scale with the image unless given. Labels go where they cover neither each other nor, where there is
    room, their box (:func:`label_rectangles`): above the box, else inside its top, below it or inside its
    bottom. Returns a new ``uint8`` ``[3, H, W]`` (``image`` itself without boxes).
    """
    if len(boxes_xyxy) == 0:
        return image
    short_side = min(image.shape[-2:])
    # 1 px below a 250-px short side, where 2 px hid small objects' edges; then growing with the image
    width = line_width if line_width is not None else max(1 if short_side < 250 else 2, round(short_side / 250))
    size = font_size if font_size is not None else _font_size(short_side)
    palette = [colors] * len(boxes_xyxy) if isinstance(colors, str) else list(colors)
    boxes = boxes_xyxy.detach().float().cpu()
    drawn = draw_bounding_boxes(image, boxes, colors=palette, width=width)
    if not labels:
        return drawn
    return draw_labels(drawn, boxes, list(labels), palette, font_size=size)


def draw_labels(image: Tensor, boxes_xyxy: Tensor, texts: Sequence[str], colors: Sequence[Any], *,
                font_size: int, avoid: Sequence[tuple[int, int, int, int]] = ()) -> Tensor:
    """``texts`` in white on their colour beside ``boxes_xyxy`` (pixel ``xyxy`` in ``image``, ``uint8``
    ``[3, H, W]``), placed by :func:`label_rectangles` away from each other and from ``avoid``; a new tensor."""
    picture = Image.fromarray(image.permute(1, 2, 0).cpu().numpy())
    draw = ImageDraw.Draw(picture)
    font_file = _font_path()
    height, width = image.shape[-2:]
    font = ImageFont.truetype(font_file, font_size) if font_file else ImageFont.load_default()
    widest = max(draw.textlength(text, font=font) for text in texts) + 2 if texts else 0
    if font_file and widest > width and font_size > MIN_LABEL_FONT:  # a label wider than the image: smaller
        font = ImageFont.truetype(font_file, max(MIN_LABEL_FONT - 2, int(font_size * width / widest)))
    sizes = []
    for text in texts:
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        sizes.append((right - left + 2, bottom - top + 2))
    rectangles = label_rectangles(boxes_xyxy.tolist(), sizes, (height, width), avoid=avoid)
    for text, color, (x0, y0, x1, y1) in zip(texts, colors, rectangles):
        draw.rectangle((x0, y0, x1 - 1, y1 - 1), fill=color)
        left, top, _, _ = draw.textbbox((0, 0), text, font=font)
        draw.text((x0 + 1 - left, y0 + 1 - top), text, fill=(255, 255, 255), font=font)
    return torch.from_numpy(np.asarray(picture).copy()).permute(2, 0, 1)


def label_rectangles(boxes_xyxy: Sequence[Sequence[float]], sizes: Sequence[tuple[int, int]],
                     image_size: tuple[int, int], *, avoid: Sequence[tuple[int, int, int, int]] = ()
                     ) -> list[tuple[int, int, int, int]]:
    """Where each box's label goes: pixel ``(x0, y0, x1, y1)`` rectangles of ``sizes`` (width, height) inside
    the image (``image_size`` (H, W)), in box order. The places beside its box (above it, below it, inside its
    top, inside its bottom; each aligned with the box's left edge, then its right edge, moved in where it would
    leave the image) that overlap no label placed before it nor ``avoid`` are ranked by how much of any box
    (its own included) they cover, so that labels leave the objects visible where there is room, in that order
    among equals; if none is free, the first free place down the image's left side; a label that fits nowhere
    free keeps the place above its box."""
    height, width = image_size
    placed: list[tuple[int, int, int, int]] = list(avoid)
    boxes = [tuple(float(v) for v in box) for box in boxes_xyxy]
    rectangles = []
    for (bx0, by0, bx1, by1), (w, h) in zip(boxes, sizes):
        xs = dict.fromkeys(int(min(max(x, 0), max(width - w, 0))) for x in (bx0, bx1 - w))
        near = [(x, int(y)) for y in (by0 - h, by1, by0, by1 - h) if 0 <= y <= height - h for x in xs]

        def free(spot: tuple[int, int]) -> bool:
            return not any(_overlap((spot[0], spot[1], spot[0] + w, spot[1] + h), r) for r in placed)

        def covered(spot: tuple[int, int]) -> float:
            return sum(_overlap_area((spot[0], spot[1], spot[0] + w, spot[1] + h), box) for box in boxes)

        choices = sorted((spot for spot in near if free(spot)), key=covered)  # stable: the order above on ties
        if not choices:
            choices = [(0, y) for y in range(0, max(height - h, 0) + 1, max(h // 2, 1)) if free((0, y))]
        x, y = choices[0] if choices else (next(iter(xs)), int(min(max(by0 - h, 0), max(height - h, 0))))
        rectangle = (x, y, x + w, y + h)
        placed.append(rectangle)
        rectangles.append(rectangle)
    return rectangles


def _overlap(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _overlap_area(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> float:
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


def add_legend(image: Tensor, entries: Sequence[tuple[tuple[int, int, int], str]], *,
               font_size: int | None = None) -> Tensor:
    """``image`` (``uint8`` ``[3, H, W]``) with a white band below it that names what each colour means:
    ``entries`` of (RGB, text), each a filled square and its text, on as many lines as the width needs;
    returns ``uint8`` ``[3, H + band, W]``."""
    size = font_size if font_size is not None else _font_size(min(image.shape[-2:]))
    font_file = _font_path()
    font = ImageFont.truetype(font_file, size) if font_file else ImageFont.load_default()
    height, width = image.shape[-2:]
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    spots, x, line = [], 4, 0  # (x, line) of each entry
    for _, text in entries:
        entry = size + 3 + int(measure.textlength(text, font=font))
        if x > 4 and x + entry > width:
            x, line = 4, line + 1
        spots.append((x, line))
        x += entry + 2 * size
    line_height = size + 6
    picture = Image.new("RGB", (width, height + (line + 1) * line_height + 4), (255, 255, 255))
    picture.paste(Image.fromarray(image.permute(1, 2, 0).cpu().numpy()), (0, 0))
    draw = ImageDraw.Draw(picture)
    for (color, text), (x, line) in zip(entries, spots):
        top = height + 4 + line * line_height
        draw.rectangle((x, top, x + size - 1, top + size - 1), fill=tuple(color))
        draw.text((x + size + 3, top), text, fill=(0, 0, 0), font=font)
    return torch.from_numpy(np.asarray(picture).copy()).permute(2, 0, 1)


#: A skeleton: 0-based keypoint index pairs (COCO's 1-based ``skeleton`` minus 1), one for every label or one per
#: model label.
Skeleton = Sequence[tuple[int, int]] | Mapping[int, Sequence[tuple[int, int]]]


def draw_keypoints_with_skeleton(
    image: Tensor, keypoints: Tensor, labels: Tensor, *, skeleton: Skeleton | None = None,
    threshold: float = 0.5, radius: int | None = None, width: int | None = None,
) -> Tensor:
    """Draw each instance's keypoints (dots with a white rim) and the skeleton's lines between them, in its label's
    colour: ``uint8`` ``[3, H, W]``. (``torchvision.utils.draw_keypoints`` draws every line white, so that one
    person's limbs could not be told from another's.)

    Args:
        image: ``uint8`` ``[3, H, W]``.
        keypoints: float ``[N, K, 3]``: pixel x, y in ``image`` and a score or visibility; a point is drawn when
            its third value is above ``threshold`` (ground truth's v = 1, 2 with the default 0.5), and a line when
            both its ends are.
        labels: int64 ``[N]`` model labels (the colours, and the skeleton of each with a per-label mapping).
        skeleton: 0-based index pairs (one for every label, or ``{label: pairs}``); None: points only.
        radius, width: the points' radius and the lines' width in pixels (None: from the image's size).
    """
    if len(keypoints) == 0:
        return image
    short_side = min(image.shape[-2:])
    radius = radius if radius is not None else max(1, round(short_side / 160))
    width = width if width is not None else max(1, round(short_side / 240))
    picture = Image.fromarray(image.permute(1, 2, 0).cpu().numpy())
    draw = ImageDraw.Draw(picture)
    for points, label in zip(keypoints.detach().float().cpu().tolist(), labels.tolist()):
        color = label_color(int(label))
        shown = [score > threshold for _, _, score in points]
        edges = skeleton.get(int(label), ()) if isinstance(skeleton, Mapping) else (skeleton or ())
        for a, b in edges:
            if max(a, b) < len(points) and shown[a] and shown[b]:
                draw.line((tuple(points[a][:2]), tuple(points[b][:2])), fill=color, width=width)
        for (x, y, _), visible in zip(points, shown):
            if visible:
                draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=color, outline=(255, 255, 255))
    return torch.from_numpy(np.asarray(picture).copy()).permute(2, 0, 1)


def draw_prediction(
    image: ImageInput, prediction: Prediction, *, line_width: int | None = None, font_size: int | None = None,
    mask_alpha: float = 0.45, skeleton: Skeleton | None = None, keypoint_threshold: float = 0.5,
) -> Tensor:
    """Draw the prediction's boxes with "name score" labels, over its instance masks when it has them (alpha
    ``mask_alpha``, each in its box's colour), and its keypoints when it has them (the points scored above
    ``keypoint_threshold``, joined by ``skeleton``, by default the prediction's own
    :attr:`~detr.inference.prediction.Prediction.keypoint_skeletons`: :func:`draw_keypoints_with_skeleton`):
    ``uint8`` ``[3, H, W]``.

    ``image`` is the original image (``uint8`` ``[H, W, 3]`` array, ``[3, H, W]`` tensor or PIL); the
    line width and font size scale with the image unless given.
    """
    canvas = _canvas(image, prediction.image_size, "prediction")
    colors = [label_color(int(label)) for label in prediction.labels]
    if prediction.masks is not None and len(prediction):
        canvas = draw_segmentation_masks(canvas, prediction.masks.cpu().bool(), alpha=mask_alpha, colors=colors)
    if prediction.keypoints is not None:
        joined = skeleton if skeleton is not None else prediction.keypoint_skeletons
        canvas = draw_keypoints_with_skeleton(canvas, prediction.keypoints, prediction.labels, skeleton=joined,
                                              threshold=keypoint_threshold)
    return draw_boxes(canvas, prediction.boxes, detection_labels(prediction.label_names, prediction.scores),
                      colors, line_width=line_width, font_size=font_size)


def draw_tracks(image: ImageInput, prediction: Prediction, trails: dict[int, Sequence[tuple[float, float]]], *,
                line_width: int | None = None) -> Tensor:
    """A tracked frame (:meth:`detr.inference.predictor.Predictor.track`): each tracked detection's box and
    "#id name score" label in its track's colour, and each track's trail, the polyline of its boxes' centres
    (pixel (x, y), oldest first) in ``trails``; detections not in a track are left out. ``uint8`` ``[3, H, W]``."""
    canvas = _canvas(image, prediction.image_size, "prediction")
    track_ids = prediction.track_ids if prediction.track_ids is not None else torch.full((len(prediction),), -1)
    keep = track_ids >= 0
    short_side = min(canvas.shape[-2:])
    width = line_width if line_width is not None else max(1 if short_side < 250 else 2, round(short_side / 250))
    if trails:
        picture = Image.fromarray(canvas.permute(1, 2, 0).numpy())
        draw = ImageDraw.Draw(picture)
        for track_id, points in trails.items():
            if len(points) > 1:
                draw.line([tuple(p) for p in points], fill=label_color(track_id), width=width)
        canvas = torch.from_numpy(np.asarray(picture).copy()).permute(2, 0, 1)
    ids = track_ids[keep].tolist()
    names = [name for name, k in zip(prediction.label_names, keep.tolist()) if k]
    scores = prediction.scores[keep].tolist()
    texts = [f"#{track_id} {name} {score:.2f}" for track_id, name, score in zip(ids, names, scores)]
    return draw_boxes(canvas, prediction.boxes[keep], texts, [label_color(track_id) for track_id in ids],
                      line_width=line_width)


def draw_detections(
    image: Tensor,
    *,
    boxes_xyxy: Tensor,
    labels: Tensor,
    scores: Tensor | None = None,
    true_boxes_xyxy: Tensor | None = None,
    true_labels: Tensor | None = None,
    category_map: CategoryMap | None = None,
) -> Tensor:
    """Draw true boxes (green) and predicted boxes (red, "name score") on ``image`` (uint8 [3, h, w]).

    Boxes are pixel xyxy in ``image``'s own coordinates; labels are named by ``category_map`` (their number
    without one), and no label covers another (the true and the predicted label of one object included).
    Returns a new uint8 [3, h, w] tensor.
    """

    def name(label: int) -> str:
        return category_map.name(label) if category_map is not None else str(label)

    true_boxes = true_boxes_xyxy if true_boxes_xyxy is not None else torch.zeros(0, 4)
    true_names = ([name(int(label)) for label in true_labels] if true_labels is not None and len(true_boxes)
                  else [])
    texts = detection_labels([name(int(label)) for label in labels], scores)
    canvas = draw_bounding_boxes(image, true_boxes.float().cpu(), colors="lime", width=2) if len(true_boxes) else image
    if len(boxes_xyxy):
        canvas = draw_bounding_boxes(canvas, boxes_xyxy.float().cpu(), colors="red", width=1)
    all_boxes = torch.cat([true_boxes.float().cpu(), boxes_xyxy.float().cpu()]) if true_names else boxes_xyxy.cpu()
    all_texts = [*true_names, *texts]
    if not all_texts:
        return canvas
    colors = [LEGEND_TRUE] * len(true_names) + [LEGEND_PREDICTED] * len(texts)
    return draw_labels(canvas, all_boxes.float(), all_texts, colors, font_size=_font_size(min(image.shape[-2:])))


def segment_color(segment: dict[str, Any]) -> tuple[int, int, int]:
    """RGB of a panoptic segment: its label's colour for stuff; things of one class get shades of it, so that
    two instances side by side stay apart."""
    red, green, blue = label_color(int(segment["label"]))
    if not segment.get("isthing", True):
        return red, green, blue
    shift = (int(segment["id"]) * 37) % 96 - 48
    return tuple(int(min(255, max(0, channel + shift))) for channel in (red, green, blue))  # type: ignore[return-value]


def draw_panoptic(image: ImageInput, panoptic: PanopticSegmentation, *, alpha: float = 0.5,
                  font_size: int | None = None) -> Tensor:
    """Segments alpha-blended over ``image`` (the original image), each named at its centroid:
    ``uint8`` ``[3, H, W]``. Void pixels (id 0) stay as they are."""
    id_map = panoptic.id_map.cpu()
    canvas = _canvas(image, tuple(id_map.shape), "segmentation")
    segments = panoptic.segments_info
    if not segments:
        return canvas
    masks = torch.stack([id_map == segment["id"] for segment in segments])  # [S, H, W]
    colors = [segment_color(segment) for segment in segments]
    blended = draw_segmentation_masks(canvas, masks, alpha=alpha, colors=colors)
    picture = Image.fromarray(blended.permute(1, 2, 0).numpy())
    draw = ImageDraw.Draw(picture)
    size = font_size if font_size is not None else _font_size(min(id_map.shape))
    font_file = _font_path()
    font = ImageFont.truetype(font_file, size) if font_file else ImageFont.load_default()
    height, width = id_map.shape
    for mask, segment, color in zip(masks, segments, colors):
        text = segment.get("label_name") or f"class {segment['label']}"
        ys, xs = mask.nonzero(as_tuple=True)
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        # centred on the segment's centroid, kept inside the image
        x = min(max(int(xs.float().mean()) - (right - left) // 2, 0), max(width - (right - left) - 2, 0))
        y = min(max(int(ys.float().mean()) - (bottom - top) // 2, 0), max(height - (bottom - top) - 2, 0))
        left, top, right, bottom = draw.textbbox((x + 1, y + 1), text, font=font)
        draw.rectangle((left - 1, top - 1, right + 1, bottom + 1), fill=color)
        draw.text((x + 1, y + 1), text, fill=(255, 255, 255), font=font)
    return torch.from_numpy(np.asarray(picture).copy()).permute(2, 0, 1)


def save_image(path: str | Path, image: Tensor) -> Path:
    """Write ``image`` (``uint8`` ``[3, H, W]``) to ``path`` atomically, parents created; JPEG (quality 90)
    for a ``.jpg``/``.jpeg`` suffix, else PNG."""
    path = Path(path)
    picture = Image.fromarray(image.permute(1, 2, 0).cpu().numpy())
    jpeg = path.suffix.lower() in (".jpg", ".jpeg")
    options: dict[str, Any] = {"format": "JPEG", "quality": 90} if jpeg else {"format": "PNG"}
    return write_atomically(path, lambda file: picture.save(file, **options))


def add_box(ax: Axes, box_xyxy: Sequence[float] | Tensor, color: Any, *, dashed: bool = False,
            line_width: float = 2.0) -> None:
    """Outline a box (pixel ``xyxy`` in the axes' image) on matplotlib axes ``ax``."""
    x0, y0, x1, y1 = box_xyxy.tolist() if isinstance(box_xyxy, Tensor) else box_xyxy
    ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor=color, linewidth=line_width,
                           linestyle="--" if dashed else "-"))


def _canvas(image: ImageInput, size: tuple[int, ...], what: str) -> Tensor:
    """The original image as ``uint8`` ``[3, H, W]``; a ValueError unless it is ``size`` (H, W)."""
    array = to_rgb_array(image)
    if tuple(array.shape[:2]) != tuple(size):
        raise ValueError(f"image is {array.shape[0]}x{array.shape[1]} but the {what} is for {size[0]}x{size[1]}; "
                         "draw on the image that was predicted")
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def _font_size(short_side: int) -> int:
    """Label text height (px) for an image of ``short_side`` pixels: 1/32 of it, within
    [:data:`MIN_LABEL_FONT`, :data:`MAX_LABEL_FONT`]."""
    return int(min(MAX_LABEL_FONT, max(MIN_LABEL_FONT, round(short_side / 32))))


def _font_path() -> str:
    """A TrueType font for readable labels: matplotlib ships DejaVu Sans (its default when that is missing)."""
    return font_manager.findfont("DejaVu Sans", fallback_to_default=True)
