"""The accuracy gate of a deployment: the box AP of the very file that ships, beside its latency.

:func:`accuracy_gate` runs the PyTorch model and each exported file (any :class:`detr.Predictor`) on the same
COCO-format set, one image at a time, and reports for each its box AP and AP50 (pycocotools, every query kept as
COCO evaluation keeps them, the boxes clipped at the image's edges as the Predictor returns them: ``detr
validate`` scores unclipped boxes, as the authors' evaluation, so its AP of the same model is up to a few tenths
lower), its latency per image (median and 95th percentile of the whole predict call:
resize, forward, post-processing; the image already decoded) and its size (an exported file's bytes, an IR's
``.bin`` included; the PyTorch model's weights as fp32 tensors, not its checkpoint file, which may hold the
optimiser's state too); an artifact that loses more
than ``max_ap_drop`` AP points against the PyTorch model fails the gate. ``detr-export --evaluate`` runs it on
the file it wrote.
"""

from __future__ import annotations

import contextlib
import io
import math
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pycocotools.coco import COCO
from tqdm import tqdm

from detr.data.file_names import resolve_file_name
from detr.evaluation.analysis import evaluate_results
from detr.inference.images import to_rgb_array
from detr.inference.outputs import predictions_to_coco_results
from detr.inference.predictor import Predictor

#: the default largest AP loss (in AP points, 0-100) an exported file may have against the PyTorch model
MAX_AP_DROP = 1.0


@dataclass
class GateRow:
    """One model's line of the gate: ``name`` (e.g. "pytorch (cpu, fp32)"), the file it came from (None for an
    in-memory model), box AP and AP50 in points (0-100), latency in seconds, size in bytes (an exported file's;
    a PyTorch model's weights; None: unknown)."""

    name: str
    path: Path | None
    ap: float
    ap50: float
    latency_median: float
    latency_p95: float
    size_bytes: int | None = None


@dataclass
class GateReport:
    """The reference's row, then each artifact's, and the largest AP drop allowed."""

    reference: GateRow
    artifacts: list[GateRow] = field(default_factory=list)
    max_ap_drop: float = MAX_AP_DROP
    num_images: int = 0

    def __post_init__(self) -> None:
        check_max_ap_drop(self.max_ap_drop)

    def drop(self, row: GateRow) -> float:
        return self.reference.ap - row.ap

    @property
    def failed(self) -> list[GateRow]:
        return [row for row in self.artifacts if self.drop(row) > self.max_ap_drop]

    @property
    def passed(self) -> bool:
        return not self.failed

    def table(self) -> str:
        header = (f"{'model':<58}{'box AP':>8}{'AP50':>8}{'AP drop':>9}{'latency ms':>12}{'p95 ms':>9}"
                  f"{'size MB':>9}")
        title = (f"accuracy gate on {self.num_images} images (batch 1, this machine; an artifact fails past "
                 f"{self.max_ap_drop:g} AP points lost)")
        lines = [title, "(box AP of the Predictor's detections, clipped at the image's edges; detr validate scores "
                        "unclipped boxes, as the authors; size: the file's, PyTorch's the weights' alone)", header]
        for row in [self.reference, *self.artifacts]:
            drop = "" if row is self.reference else f"{self.drop(row):+.2f}"
            size = f"{row.size_bytes / 1e6:.1f}" if row.size_bytes is not None else "-"
            lines.append(f"{row.name:<58}{row.ap:>8.2f}{row.ap50:>8.2f}{drop:>9}{row.latency_median * 1e3:>12.1f}"
                         f"{row.latency_p95 * 1e3:>9.1f}{size:>9}")
        return "\n".join(lines)


def file_size(path: Path | None) -> int | None:
    """Bytes of a model file with what it needs beside it (an OpenVINO .xml's .bin); None for no file."""
    if path is None or not path.is_file():
        return None
    weights = path.with_suffix(".bin") if path.suffix.lower() == ".xml" else None
    return path.stat().st_size + (weights.stat().st_size if weights is not None and weights.is_file() else 0)


def weights_size(model: object) -> int:
    """Bytes of a PyTorch model's weights (parameters and buffers) as fp32 tensors: what its exported file holds,
    where a training checkpoint also holds the optimiser's state."""
    return sum(4 * tensor.numel() for tensor in model.state_dict().values()  # type: ignore[attr-defined]
               if tensor.is_floating_point())


def read_evaluation_set(images: str | Path, annotations: str | Path) -> COCO:
    """The COCO-format set of the gate, checked: the annotation file and every image it lists (``images``/
    ``file_name``) exist.

    Raises:
        FileNotFoundError: the annotation file or an image it lists is missing (named).
    """
    images, annotations = Path(images), Path(annotations)
    if not annotations.is_file():
        raise FileNotFoundError(f"annotation file {annotations} does not exist")
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its loading
        coco_gt = COCO(str(annotations))
    # a file name outside the images folder is refused (detr.data.file_names), naming the json and the image
    missing = [record["file_name"] for record in coco_gt.dataset["images"]
               if not resolve_file_name(images, record["file_name"], annotations_file=annotations,
                                        image_id=record["id"]).is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} images of {annotations} are not in {images} (first: {missing[0]})")
    return coco_gt


def evaluate_predictor(predictor: Predictor, coco_gt: COCO, images: Path, *, name: str, path: Path | None = None,
                       progress: bool = True) -> GateRow:
    """Box AP and per-image latency of ``predictor`` on every image of ``coco_gt`` (files under ``images``)."""
    predictions, latencies = [], []
    records = coco_gt.dataset["images"]
    for record in tqdm(records, desc=name, unit="image", disable=not progress, leave=False):
        pixels = to_rgb_array(resolve_file_name(images, record["file_name"], image_id=record["id"]))
        start = time.perf_counter()
        prediction = predictor.predict(pixels, all_queries=True)[0]
        latencies.append(time.perf_counter() - start)
        prediction.image_id = int(record["id"])
        predictions.append(prediction)
    results = predictions_to_coco_results(predictions, category_map=predictor.category_map)
    stats = evaluate_results(coco_gt, results).stats
    p95 = statistics.quantiles(latencies, n=20)[-1] if len(latencies) > 1 else latencies[0]
    return GateRow(name, path, 100 * float(stats[0]), 100 * float(stats[1]), statistics.median(latencies), p95,
                   file_size(path))


def check_max_ap_drop(max_ap_drop: float) -> None:
    """Raise ``ValueError`` unless ``max_ap_drop`` is a finite number of AP points >= 0: a NaN passed every
    artifact (no drop is greater than NaN), turning the gate off."""
    if not (isinstance(max_ap_drop, (int, float)) and 0 <= max_ap_drop < math.inf):
        raise ValueError(f"max_ap_drop is in AP points and must be a finite number >= 0, got {max_ap_drop!r}")


def accuracy_gate(reference: Predictor, artifacts: Mapping[Path, Predictor], images: str | Path,
                  annotations: str | Path | COCO, *, max_ap_drop: float = MAX_AP_DROP, progress: bool = True) -> GateReport:
    """Evaluate ``reference`` (the PyTorch model; its row's size: its weights, :func:`weights_size`) and each
    artifact (file → its predictor) on the COCO-format set ``annotations`` (a json, or its
    :func:`read_evaluation_set`; images under ``images``): :class:`GateReport` (``passed``, ``table()``).

    Raises:
        FileNotFoundError: the annotation file or an image it lists is missing (named).
    """
    check_max_ap_drop(max_ap_drop)  # before the evaluation, not after it
    images = Path(images)
    coco_gt = annotations if isinstance(annotations, COCO) else read_evaluation_set(images, annotations)
    row = evaluate_predictor(reference, coco_gt, images, name=reference.backend, progress=progress)
    if reference.model.backend == "pytorch":
        row.size_bytes = weights_size(reference.model)
    report = GateReport(row, max_ap_drop=max_ap_drop, num_images=len(coco_gt.dataset["images"]))
    for path, predictor in artifacts.items():
        report.artifacts.append(evaluate_predictor(predictor, coco_gt, images, name=f"{path.name}: {predictor.backend}",
                                                   path=path, progress=progress))
    return report
