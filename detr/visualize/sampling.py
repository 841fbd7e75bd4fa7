"""Deformable DETR's attention figure (the kind of the paper's Fig. 5 and 6): for each detected object, where
its query's decoder cross-attention sampled, one panel per feature level, every head's points coloured by
head and sized by their attention weight, over the image with the object's box.

Takes the original image and a :class:`detr.inference.prediction.Prediction` made by a Deformable DETR with
``Predictor.predict(..., return_attention=True)`` (its ``sampling``). A matplotlib ``Figure``; no pyplot state.
"""

from __future__ import annotations

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.figure import Figure

from detr.inference.images import ImageInput, to_rgb_array
from detr.inference.prediction import Prediction
from detr.visualize.drawing import add_box, label_color, matplotlib_color


def sampling_points_figure(image: ImageInput, prediction: Prediction, *, layer: int = -1,
                           threshold: float | None = None, top_k: int | None = None, max_objects: int = 6,
                           panel_size: float = 3.0, marker_scale: float = 400.0) -> Figure:
    """One row per shown object (best first, at most ``max_objects``), one column per feature level: the
    image dimmed, the object's box, and the query's sampling points of decoder ``layer`` (default the last),
    a colour per head, marker area ∝ attention weight (``marker_scale`` for weight 1).

    threshold, top_k: which queries to show: the ``top_k`` best-scoring, or every query scoring above
    ``threshold``; default the prediction's detections. Each panel's title gives the level's stride and the share of the query's
    attention that went to that level (mean over heads).
    """
    sampling = prediction.sampling
    if sampling is None:
        raise ValueError("the prediction has no sampling points: make it with a Deformable DETR and "
                         "Predictor.predict(..., return_attention=True)")
    array = to_rgb_array(image)
    if tuple(array.shape[:2]) != tuple(prediction.image_size):
        raise ValueError(f"image is {array.shape[0]}x{array.shape[1]} but the prediction was made on a "
                         f"{prediction.image_size[0]}x{prediction.image_size[1]} image; pass the image that was predicted")
    scores = sampling.scores
    if top_k is not None:
        queries = scores.argsort(descending=True)[:top_k]
    else:
        queries = (torch.nonzero(scores > threshold).flatten() if threshold is not None
                   else prediction.query_indices.long())
        queries = queries[scores[queries].argsort(descending=True)]
    queries = queries[:max_objects]
    num_layers, _, num_heads, num_levels = sampling.points.shape[:4]
    layer_number = layer % num_layers + 1
    rows = max(1, queries.numel())
    aspect = array.shape[0] / array.shape[1]
    figure = Figure(figsize=(num_levels * panel_size, rows * (panel_size * aspect + 0.4) + 0.5), layout="constrained")
    axes = np.atleast_2d(figure.subplots(rows, num_levels, squeeze=False))
    colors = [colormaps["tab10"](head % 10) for head in range(num_heads)]
    kept = {int(q): i for i, q in enumerate(prediction.query_indices.tolist())}
    for row, query in enumerate(queries.tolist() or [None]):
        shares = level_shares(prediction, query, layer=layer) if query is not None else None
        for level in range(num_levels):
            ax = axes[row, level]
            ax.set_axis_off()
            ax.imshow((array * 0.6).astype(np.uint8))
            if query is None:
                ax.set_title("no detection: lower the threshold or use top_k", fontsize=9)
                continue
            points = sampling.points[layer, query, :, level]  # [heads, P, 2]
            weights = sampling.weights[layer, query, :, level]  # [heads, P]
            for head in range(num_heads):
                ax.scatter(points[head, :, 0].numpy(), points[head, :, 1].numpy(),
                           s=(weights[head] * marker_scale).numpy(), color=colors[head], edgecolors="white",
                           linewidths=0.4, alpha=0.9)
            if query in kept:
                index = kept[query]
                add_box(ax, prediction.boxes[index], matplotlib_color(label_color(int(prediction.labels[index]))),
                        line_width=1.5)
                name = f"{prediction.label_names[index]} {float(prediction.scores[index]):.2f}, "
            else:
                name = f"query {query} {float(scores[query]):.2f}, "
            ax.set_xlim(0, array.shape[1])
            ax.set_ylim(array.shape[0], 0)
            ax.set_title(f"{name}stride {sampling.strides[level]}: {float(shares[level]):.0%}", fontsize=9)
    figure.suptitle(f"decoder cross-attention sampling points, layer {layer_number}/{num_layers}, "
                    f"{num_heads} heads (colours), area = weight", fontsize=11)
    return figure


def level_shares(prediction: Prediction, query: int, *, layer: int = -1) -> torch.Tensor:
    """The share of ``query``'s attention per feature level (mean over heads), float32 ``[levels]``, summing
    to 1: how much of the query's cross-attention went to each scale."""
    if prediction.sampling is None:
        raise ValueError("the prediction has no sampling points (a Deformable DETR with return_attention=True)")
    return prediction.sampling.weights[layer, query].sum(-1).mean(0)
