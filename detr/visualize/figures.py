"""Attention figures of the DETR paper, as matplotlib ``Figure`` objects (never shown, never global).

- :func:`decoder_attention_figure` (paper Fig. 6): for every detected object, its box and the decoder
  cross-attention of its query (last layer, mean over heads, by default), upsampled to the image and
  overlaid; or, with ``all_queries=True``, a grid of every query titled with its class and score,
  "no object" included.
- :func:`encoder_attention_figure` (paper Fig. 3): the last encoder layer's self-attention of a few
  reference points, given or placed at the centres of the detected objects.

Both take the original image and a :class:`detr.inference.prediction.Prediction` made with
``Predictor.predict(..., return_attention=True)``; its :class:`~detr.inference.prediction.AttentionMaps` are
already cropped to the unpadded part of the feature map, so the maps line up with the image.
Save with ``figure.savefig(path)``; no pyplot state is touched.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor

from detr.inference.images import ImageInput, to_rgb_array
from detr.inference.prediction import AttentionMaps, Prediction
from detr.visualize.drawing import add_box, label_color, matplotlib_color

_NO_OBJECT_COLOR = "#bbbbbb"


def select_queries(
    prediction: Prediction, *, threshold: float | None = None, top_k: int | None = None
) -> Tensor:
    """Query indices to show, best score first, int64 ``[K]``.

    ``top_k``: the ``top_k`` queries with the highest class score (no-object excluded), whatever it is;
    else ``threshold``: every query scoring strictly above it; else the queries the prediction kept.
    """
    attention = _require_attention(prediction)
    scores = attention.scores  # [Q], best real class
    if top_k is not None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        return scores.argsort(descending=True)[: min(top_k, scores.numel())]
    if threshold is not None:
        queries = torch.nonzero(scores > threshold).flatten()
    else:
        queries = prediction.query_indices.long()
    return queries[scores[queries].argsort(descending=True)]


def decoder_attention_maps(
    attention: AttentionMaps, queries: Tensor, *, layer: int = -1, head: int | None = None
) -> Tensor:
    """Cross-attention of ``queries`` upsampled to the original image, each scaled to [0, 1].

    Args:
        queries: int64 ``[K]`` query indices.
        layer: decoder layer (Python indexing: -1 is the last, as in the paper's Fig. 6).
        head: one attention head, or None for the mean over heads.

    Returns float32 ``[K, H, W]`` (``H, W`` = the original image size).
    """
    num_layers, num_heads = attention.decoder_heads.shape[:2]
    if not -num_layers <= layer < num_layers:
        raise ValueError(
            f"layer must be in [{-num_layers}, {num_layers - 1}] (the model has {num_layers} decoder layers), "
            f"got {layer}"
        )
    if head is not None and not 0 <= head < num_heads:
        raise ValueError(f"head must be in [0, {num_heads - 1}] (the model has {num_heads} heads), got {head}")
    maps = attention.decoder[layer] if head is None else attention.decoder_heads[layer, head]  # [Q, h, w]
    return normalize_maps(attention.to_image(maps[queries.long()]))


def encoder_attention_maps(attention: AttentionMaps, points: Sequence[tuple[float, float]]) -> Tensor:
    """Last encoder layer's self-attention of reference ``points`` (pixel ``(x, y)`` in the original
    image), upsampled to the image and scaled to [0, 1]: float32 ``[P, H, W]``."""
    cells = [attention.feature_position(x, y) for x, y in points]
    maps = torch.stack([attention.encoder[row, col] for row, col in cells]) if cells else attention.encoder[:0, 0]
    return normalize_maps(attention.to_image(maps))


def normalize_maps(maps: Tensor) -> Tensor:
    """Scale each map ``[..., H, W]`` to [0, 1] by its own minimum and maximum (constant maps → 0)."""
    flat = maps.flatten(-2)
    low = flat.min(dim=-1, keepdim=True).values
    high = flat.max(dim=-1, keepdim=True).values
    return ((flat - low) / (high - low).clamp_min(1e-12)).reshape(maps.shape)


def decoder_attention_figure(
    image: ImageInput,
    prediction: Prediction,
    *,
    layer: int = -1,
    head: int | None = None,
    threshold: float | None = None,
    top_k: int | None = None,
    all_queries: bool = False,
    columns: int | None = None,
    panel_size: float | None = None,
    cmap: str = "inferno",
    alpha: float = 0.75,
) -> Figure:
    """Paper Fig. 6: one panel per shown query with its box and its decoder cross-attention overlaid.

    Args:
        image: the original image the prediction was made on (path, PIL, array or tensor).
        prediction: from ``Predictor.predict(..., return_attention=True)``.
        layer, head: which decoder layer (default the last) and head (default the mean over heads).
        threshold, top_k: which queries to show (see :func:`select_queries`); default: the prediction's.
        all_queries: show every query instead, titled with its most likely outcome and its probability:
            "no object" when that beats every class (softmax head), else the best class.
        columns: panels per row (default: up to 4, or 10 for all queries).
        panel_size: width of one panel in inches (default 3.5, or 1.8 for all queries).
        cmap, alpha: colour map and maximum opacity of the attention overlay.

    Each panel's last image artist holds its map, float ``[H, W]`` in [0, 1]. A panel's title is
    ``"<name> <score>"`` with the query index in its corner (``"<query>: <name> <score>"`` in grids of
    more than 16 panels).
    """
    array, attention = _image_and_attention(image, prediction)
    queries = torch.arange(attention.scores.numel()) if all_queries else select_queries(
        prediction, threshold=threshold, top_k=top_k
    )
    maps = decoder_attention_maps(attention, queries, layer=layer, head=head)
    num_layers, num_heads = attention.decoder_heads.shape[:2]
    layer_number = layer % num_layers + 1
    source = f"mean of {num_heads} heads" if head is None else f"head {head}"
    if panel_size is None:
        panel_size = 1.8 if all_queries else 3.5
    if queries.numel() == 0:
        figure, axes = _grid(1, 1, array.shape, panel_size)
        _show(axes[0], array)
        axes[0].set_title("no query above the threshold: lower it or use top_k", fontsize=10)
        return figure
    cols = columns or (min(10, queries.numel()) if all_queries else min(4, queries.numel()))
    figure, axes = _grid(queries.numel(), cols, array.shape, panel_size)
    small = all_queries and queries.numel() > 16
    for ax, query, attention_map in zip(axes, queries.tolist(), maps):
        label, score = int(attention.labels[query]), float(attention.scores[query])
        # In the grid a query is titled with its most likely outcome, which may be "no object".
        no_object = (
            all_queries
            and attention.no_object_scores is not None
            and float(attention.no_object_scores[query]) > score
        )
        if no_object:
            score = float(attention.no_object_scores[query])
        color = _NO_OBJECT_COLOR if no_object else matplotlib_color(label_color(label))  # as in drawn images
        _show(ax, array, attention_map, cmap=cmap, alpha=alpha)
        add_box(ax, attention.boxes[query], color, dashed=no_object, line_width=1.2 if small else 2.5)
        name = "no object" if no_object else attention.label_name(label)
        title = f"{query}: {name} {score:.2f}" if small else f"{name} {score:.2f}"  # small panels: no corner tag
        ax.set_title(title, fontsize=7 if small else 11, color="black", pad=2)
        if not small:
            ax.text(0.01, 0.01, f"query {query}", transform=ax.transAxes, fontsize=8, color="white",
                    va="bottom", ha="left", bbox={"facecolor": "black", "alpha": 0.5, "pad": 1.5, "linewidth": 0})
    figure.suptitle(
        f"decoder cross-attention, layer {layer_number}/{num_layers}, {source}",
        fontsize=8 if small else 12,
    )
    return figure


def encoder_attention_figure(
    image: ImageInput,
    prediction: Prediction,
    *,
    points: Sequence[tuple[float, float]] | None = None,
    num_points: int = 4,
    columns: int | None = None,
    panel_size: float = 3.5,
    cmap: str = "inferno",
    alpha: float = 0.75,
) -> Figure:
    """Paper Fig. 3: the image with reference points, then each point's encoder self-attention.

    Args:
        points: reference points as pixel ``(x, y)`` in the original image; default: the centres of the
            ``num_points`` best detections (then a 2 × 2 lattice of the image if it has too few).
        columns: panels per row (default: all in one row up to 5 panels).

    The first panel is the image with numbered points; each further panel's last image artist holds
    that point's map, float ``[H, W]`` in [0, 1].
    """
    array, attention = _image_and_attention(image, prediction)
    height, width = array.shape[:2]
    chosen = list(points) if points is not None else default_reference_points(prediction, num_points=num_points)
    for x, y in chosen:
        if not (0 <= x < width and 0 <= y < height):
            raise ValueError(f"reference point ({x}, {y}) lies outside the {width}x{height} image; give pixel (x, y)")
    maps = encoder_attention_maps(attention, chosen)
    count = len(chosen) + 1
    figure, axes = _grid(count, columns or min(count, 5), array.shape, panel_size)
    _show(axes[0], array)
    axes[0].set_title("reference points", fontsize=11)
    for number, ((x, y), ax, attention_map) in enumerate(zip(chosen, axes[1:], maps), start=1):
        _point(axes[0], x, y, number)
        _show(ax, array, attention_map, cmap=cmap, alpha=alpha)
        _point(ax, x, y, number)
        ax.set_title(f"point {number} ({x:.0f}, {y:.0f})", fontsize=11)
    figure.suptitle("encoder self-attention, last layer, mean over heads", fontsize=12)
    return figure


def default_reference_points(prediction: Prediction, *, num_points: int = 4) -> list[tuple[float, float]]:
    """Centres of the best-scoring detections, one per feature cell, topped up with a lattice of the image.

    Returns up to ``num_points`` pixel ``(x, y)`` in the original image.
    """
    height, width = prediction.image_size
    order = prediction.scores.argsort(descending=True)
    centres = [(float(x0 + x1) / 2, float(y0 + y1) / 2) for x0, y0, x1, y1 in prediction.boxes[order].tolist()]
    lattice = [(fx * width, fy * height) for fy in (0.25, 0.75) for fx in (0.25, 0.75)]
    points: list[tuple[float, float]] = []
    cells: set[tuple[int, int]] = set()
    for x, y in centres + lattice:
        x, y = min(max(x, 0.0), width - 1.0), min(max(y, 0.0), height - 1.0)
        # Two points in one feature cell would show the same map.
        cell = prediction.attention.feature_position(x, y) if prediction.attention is not None else (round(x), round(y))
        if cell in cells:
            continue
        cells.add(cell)
        points.append((x, y))
        if len(points) == num_points:
            break
    return points


def _require_attention(prediction: Prediction) -> AttentionMaps:
    if prediction.attention is None:
        raise ValueError(
            "prediction has no attention maps; make it with Predictor.predict(image, return_attention=True)"
        )
    return prediction.attention


def _image_and_attention(image: ImageInput, prediction: Prediction) -> tuple[np.ndarray, AttentionMaps]:
    attention = _require_attention(prediction)
    array = to_rgb_array(image)
    if tuple(array.shape[:2]) != tuple(attention.image_size):
        raise ValueError(
            f"image is {array.shape[0]}x{array.shape[1]} but the prediction was made on a "
            f"{attention.image_size[0]}x{attention.image_size[1]} image; pass the image that was predicted"
        )
    return array, attention


def _grid(count: int, columns: int, image_shape: tuple[int, ...], panel_size: float) -> tuple[Figure, list[Axes]]:
    """A figure with ``count`` image panels in rows of ``columns``; unused grid cells removed."""
    columns = max(1, min(columns, count))
    rows = math.ceil(count / columns)
    aspect = image_shape[0] / image_shape[1]
    title_space = 0.35 if panel_size >= 2.5 else 0.25
    size = (columns * panel_size, rows * (panel_size * aspect + title_space) + 0.4)
    figure = Figure(figsize=size, layout="constrained")
    axes = list(np.atleast_1d(figure.subplots(rows, columns, squeeze=False)).ravel())
    for ax in axes[count:]:
        figure.delaxes(ax)
    for ax in axes[:count]:
        ax.set_axis_off()
    return figure, axes[:count]


def _show(
    ax: Axes, array: np.ndarray, attention_map: Tensor | None = None, *, cmap: str = "inferno", alpha: float = 0.75
) -> None:
    """The image, dimmed, under an attention overlay whose opacity follows the map, so the image shows
    through where the query does not look."""
    if attention_map is None:
        ax.imshow(array)
        return
    values = attention_map.numpy()
    ax.imshow((array * 0.7).astype(np.uint8))
    ax.imshow(values, cmap=cmap, vmin=0.0, vmax=1.0, alpha=alpha * values, interpolation="bilinear")


def _point(ax: Axes, x: float, y: float, number: int) -> None:
    ax.plot([x], [y], marker="o", markersize=9, markerfacecolor="#00e5ff", markeredgecolor="black", markeredgewidth=1.5)
    ax.annotate(str(number), (x, y), xytext=(6, 6), textcoords="offset points", color="white", fontsize=10,
                fontweight="bold", bbox={"facecolor": "black", "alpha": 0.6, "pad": 1.5, "linewidth": 0})
