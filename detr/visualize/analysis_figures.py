"""Figures of an error analysis (:class:`detr.evaluation.analysis.DetectionAnalysis`).

Every function returns a matplotlib ``Figure`` built without pyplot (no global state; ``savefig`` renders
with Agg), so the caller saves it or hands it to TensorBoard's ``add_figure``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from PIL import Image

from detr.data.file_names import file_name_problem, normalise_file_name
from detr.evaluation.analysis import Case, ConfusionMatrix, DetectionAnalysis
from detr.evaluation.tide import ERROR_NAMES, ERROR_TYPES, SPECIAL_ERRORS, ErrorBreakdown
from detr.visualize.drawing import add_box

logger = logging.getLogger(__name__)

GT_COLOR = "#2ca02c"
DET_COLOR = "#d62728"
ERROR_COLORS = {"cls": "#e377c2", "loc": "#17becf", "both": "#9467bd", "dupe": "#bcbd22", "bkg": "#ff7f0e",
                "missed": "#8c564b", "false_positives": "#7f7f7f", "false_negatives": "#c7c7c7"}


def pr_curve_figure(analysis: DetectionAnalysis) -> Figure:
    """Precision against recall averaged over classes (COCOeval's interpolated curves, area "all", 100
    detections) at IoU 0.5 and 0.75; the area under each curve is AP50 / AP75."""
    figure = Figure(figsize=(5.0, 4.0), layout="constrained")
    axes = figure.subplots()
    recall = analysis.recall_thresholds
    for iou, name in (("0.5", "AP50"), ("0.75", "AP75")):
        precision = analysis.overall_precision(iou)
        valid = precision > -1
        axes.plot(recall[valid], precision[valid], label=f"IoU {iou}: {name} {100 * analysis.stats[name]:.1f}")
    axes.set(xlabel="recall", ylabel="precision", xlim=(0, 1), ylim=(0, 1.02), title="Precision-recall, all classes")
    axes.grid(alpha=0.3)
    axes.legend(loc="lower left")
    return figure


def class_pr_curves_figure(analysis: DetectionAnalysis, *, columns: int = 8) -> Figure:
    """One small precision-recall plot per class with ground truth (IoU 0.5 and 0.75), in category order."""
    shown = [k for k, row in enumerate(analysis.per_class) if row["num_gt"] > 0]
    columns = max(1, min(columns, len(shown)))
    rows = max(1, math.ceil(len(shown) / columns))
    height = 1.5 * rows + 0.5
    # a fixed grid instead of the constrained layout, which takes seconds to solve for 80 axes
    figure = Figure(figsize=(1.6 * columns, height))
    figure.subplots_adjust(left=0.02, right=0.98, bottom=0.02, top=1 - 0.45 / height, wspace=0.08, hspace=0.35)
    axes = np.atleast_1d(figure.subplots(rows, columns, squeeze=False, sharex=True, sharey=True)).ravel()
    recall = analysis.recall_thresholds
    for ax, k in zip(axes, shown):
        for iou, color in (("0.5", "C0"), ("0.75", "C1")):
            precision = analysis.precision[iou][k]
            ax.plot(recall, np.clip(precision, 0, None), color=color, linewidth=1.2)
        row = analysis.per_class[k]
        ax.set_title(f"{row['name']}  {100 * row['AP50']:.0f}/{100 * row['AP75']:.0f}", fontsize=8, pad=2)
        ax.grid(alpha=0.3)
    axes[0].set(xlim=(0, 1), ylim=(0, 1.05), xticks=[0, 0.5, 1], yticks=[0, 0.5, 1])
    for ax in axes:
        ax.tick_params(labelleft=False, labelbottom=False, length=0)
    for ax in axes[len(shown):]:
        ax.axis("off")
    figure.suptitle("Precision-recall per class, recall across, precision up (blue IoU 0.5, orange 0.75; "
                    "title: AP50/AP75)", fontsize=10)
    return figure


def confusion_matrix_figure(confusion: ConfusionMatrix, *, max_annotated: int = 20) -> Figure:
    """The confusion matrix as a heat map of counts (log colour scale), true class down, predicted class
    across, with the "background" row and "missed" column; classes that never occur are left out."""
    k = len(confusion.names)
    matrix = confusion.matrix
    used = (matrix[:k].sum(axis=1) + matrix[:, :k].sum(axis=0)) > 0
    keep = np.r_[np.flatnonzero(used), k]
    shown = matrix[np.ix_(keep, keep)]
    labels = [confusion.names[i] for i in keep[:-1]]
    rows, columns = labels + ["background"], labels + ["missed"]
    side = min(24.0, 2.5 + 0.22 * len(keep))
    figure = Figure(figsize=(side + 1.2, side), layout="constrained")
    axes = figure.subplots()
    masked = np.ma.masked_equal(shown, 0)
    image = axes.imshow(masked, cmap="viridis", norm=LogNorm(vmin=1, vmax=max(1, int(shown.max()))),
                        interpolation="nearest")
    figure.colorbar(image, ax=axes, shrink=0.6, label="detections / objects")
    fontsize = 9 if len(keep) <= 20 else 6
    axes.set_xticks(range(len(columns)), columns, rotation=90, fontsize=fontsize)
    axes.set_yticks(range(len(rows)), rows, fontsize=fontsize)
    axes.set_xlabel("predicted class")
    axes.set_ylabel("true class")
    axes.set_title(f"Confusion at IoU {confusion.iou_threshold:g}, score ≥ {confusion.score_threshold:g}")
    for line in (len(keep) - 1.5,):  # set the background row and the missed column apart
        axes.axhline(line, color="0.5", linewidth=0.8)
        axes.axvline(line, color="0.5", linewidth=0.8)
    if len(keep) <= max_annotated:
        for i, j in zip(*np.nonzero(shown)):
            bright = image.norm(shown[i, j]) > 0.6  # viridis turns yellow: dark text there
            axes.text(j, i, str(shown[i, j]), ha="center", va="center", fontsize=8,
                      color="black" if bright else "white")
    return figure


def error_breakdown_figure(errors: ErrorBreakdown) -> Figure:
    """TIDE's dAP per error type as bars (AP50 points) with the error counts, and the dAP of fixing every
    false positive / every false negative."""
    figure = Figure(figsize=(8.0, 3.6), layout="constrained")
    left, right = figure.subplots(1, 2, width_ratios=[3, 1])
    types = list(ERROR_TYPES)
    values = [100 * errors.delta_ap[t] for t in types]
    bars = left.bar(range(len(types)), values, color=[ERROR_COLORS[t] for t in types])
    for bar, t in zip(bars, types):
        left.annotate(f"{bar.get_height():.2f}\n({errors.counts[t]})", (bar.get_x() + bar.get_width() / 2,
                      bar.get_height()), ha="center", va="bottom", fontsize=8)
    left.set_xticks(range(len(types)), [ERROR_NAMES[t].replace(" + ", "+\n").replace(" ", "\n") for t in types],
                    fontsize=8)
    left.set_ylabel("dAP50 (points)")
    left.set_ylim(0, max(values + [1.0]) * 1.3)
    left.set_title(f"AP50 {100 * errors.ap:.1f}: AP lost to each error (count)", fontsize=10)
    special = [100 * errors.delta_ap[t] for t in SPECIAL_ERRORS]
    right.bar(range(2), special, color=[ERROR_COLORS[t] for t in SPECIAL_ERRORS])
    right.set_xticks(range(2), ["false\npositives", "false\nnegatives"], fontsize=8)
    right.set_ylim(0, max(special + [1.0]) * 1.2)
    right.set_title("all FP / FN", fontsize=10)
    return figure


def _crop(case: Case, width: int, height: int, margin: float = 0.35, min_side: float = 64.0) -> tuple[int, ...]:
    boxes = [b for b in (case.det_box, case.gt_box) if b is not None]
    x0 = min(b[0] for b in boxes)
    y0 = min(b[1] for b in boxes)
    x1 = max(b[0] + b[2] for b in boxes)
    y1 = max(b[1] + b[3] for b in boxes)
    pad_x = max((x1 - x0) * margin, (min_side - (x1 - x0)) / 2, 0)
    pad_y = max((y1 - y0) * margin, (min_side - (y1 - y0)) / 2, 0)
    crop = (max(0, int(x0 - pad_x)), max(0, int(y0 - pad_y)), min(width, int(math.ceil(x1 + pad_x))),
            min(height, int(math.ceil(y1 + pad_y))))
    if crop[2] - crop[0] < 2 or crop[3] - crop[1] < 2:  # boxes outside the image: show all of it
        return 0, 0, width, height
    return crop


def case_title(case: Case) -> str:
    """"pred <name> <score>" / "true <name> IoU <iou>" as it applies."""
    parts = []
    if case.det_name is not None:
        parts.append(f"pred {case.det_name} {case.det_score:.2f}")
    if case.gt_name is not None:
        parts.append(f"true {case.gt_name}" + (f" IoU {case.iou:.2f}" if case.iou is not None else ""))
    elif case.iou is not None:
        parts.append(f"best IoU {case.iou:.2f}")
    return "\n".join(parts)


def gallery_figure(
    cases: Sequence[Case], images_dir: str | Path, *, columns: int = 4
) -> tuple[Figure | None, list[str]]:
    """Crops around each case, the true box drawn in green and the prediction in red, labelled.

    Images are ``images_dir / case.file_name`` (:mod:`detr.data.file_names`: a name outside ``images_dir`` is
    not read). Returns the figure (None when no image could be read) and
    the file names that were missing or unreadable (those cases are skipped).
    """
    loaded, missing = [], []
    for case in cases:
        unsafe = case.file_name is not None and file_name_problem(case.file_name) is not None
        path = Path(images_dir) / normalise_file_name(case.file_name) if case.file_name and not unsafe else None
        if path is None or not path.is_file():
            missing.append(case.file_name or f"image {case.image_id}")
            continue
        try:
            with Image.open(path) as image:
                pixels = np.asarray(image.convert("RGB"))
        except OSError as error:
            logger.warning("gallery: cannot read %s (%s)", path, error)
            missing.append(case.file_name)
            continue
        loaded.append((case, pixels))
    if not loaded:
        return None, missing
    columns = max(1, min(columns, len(loaded)))
    rows = math.ceil(len(loaded) / columns)
    figure = Figure(figsize=(2.6 * columns, 2.9 * rows), layout="constrained")
    axes = np.atleast_1d(figure.subplots(rows, columns, squeeze=False)).ravel()
    for ax, (case, pixels) in zip(axes, loaded):
        x0, y0, x1, y1 = _crop(case, pixels.shape[1], pixels.shape[0])
        ax.imshow(pixels[y0:y1, x0:x1], extent=(x0, x1, y1, y0))
        for box, color, dashed in ((case.gt_box, GT_COLOR, False), (case.det_box, DET_COLOR, True)):
            if box is not None:  # COCO xywh
                add_box(ax, (box[0], box[1], box[0] + box[2], box[1] + box[3]), color, dashed=dashed)
        ax.set_xlim(x0, x1)
        ax.set_ylim(y1, y0)
        ax.set_title(case_title(case), fontsize=7)
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in axes[len(loaded):]:
        ax.axis("off")
    error_type = loaded[0][0].error_type
    figure.suptitle(f"{ERROR_NAMES[error_type]}: worst cases (green: true box, red dashed: prediction)", fontsize=9)
    return figure, missing
