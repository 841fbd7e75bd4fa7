"""Export DETR for deployment, and check every exported file against the PyTorch model.

Three formats, each with dynamic batch, height and width (one file serves every image size and batch), but for
a model whose input contract is a fixed square (the real-time DETRs, RT-DETR and D-FINE: ``input_spec.resize``
"square"): its file takes that square only (static height and width, ``detr.static_input_size`` in the metadata;
the Predictor resizes every image to it) with a dynamic batch:

- ONNX (``.onnx``), run by ONNX Runtime (:class:`detr.checkpoints.onnx.OnnxDetector`). Inputs ``images``
  float32 [B, 3, H, W] (normalised, zero-padded) and ``padding_mask`` bool [B, H, W] (True = padding);
  outputs ``pred_logits`` and ``pred_boxes`` as :meth:`detr.models.DETR.forward` (and ``pred_masks``, mask logits
  [B, Q, H / 4, W / 4], for a model that predicts instance masks: RF-DETR's segmentation models). With
  ``postprocess=True`` the post-processing is in the graph too: input ``orig_sizes`` int64 [B, 2]
  (height, width of the original images), outputs ``scores`` [B, Q], ``labels`` int64 [B, Q] and ``boxes``
  [B, Q, 4] pixel xyxy, scored as :class:`detr.PostProcess` scores (the same functions), so a deployment
  needs no Python; for a model with ``detections_per_image`` k (the real-time DETRs) they are its k best
  (query, class) pairs, best first, [B, k] (:func:`detr.inference.postprocess.top_k_pairs`); with instance masks
  also ``mask_logits`` [B, k, H / 4, W / 4], each kept pair's query's mask logits at stride 4 of the input (the
  originals differ in size: resizing to each and thresholding at 0 is the caller's). The category map,
  the eval resize, the class head and the top-k travel in the file's ``metadata_props`` (JSON strings;
  :func:`detr.checkpoints.onnx.read_onnx_metadata`).
- ``torch.export`` programs (``.pt2``): the same inputs and outputs, loaded with ``torch.export.load``;
  the metadata travels as the extra file ``detr.json``.
- OpenVINO IR (``.xml`` + ``.bin``), converted from the ONNX graph, weights in fp32, run on the CPU by
  OpenVINO (:class:`detr.checkpoints.openvino.OpenVinoDetector`); the metadata travels in its ``rt_info``.

Why the ``torch.export``-based ONNX exporter (``torch.onnx.export(..., dynamo=True)``) and not the
TorchScript-based one (``dynamo=False``): torch.export reasons about the dynamic sizes symbolically, so a
size baked into the graph is an export error instead of a file that is silently wrong at other sizes; the
TorchScript-based exporter wrote a graph for the anchor-query decoder that ONNX Runtime cannot run (a MatMul
shape mismatch in the conditional cross-attention, even at the export size), and it is deprecated since
torch 2.9. It exports faster; nothing else speaks for it.

Why ``.pt2`` and not TorchScript: scripting needs the model rewritten in TorchScript's subset (dict outputs,
Literal options, the denoising dataclass), and tracing records one path through the Python branches
(padding checks, whether a batch is padded) and may bake sizes without an error; torch.export traces the
same code with checked dynamic dimensions, and torch.jit is deprecated in its favour.

Every export is verified (:func:`verify_export`): the file runs on a padded batch of two images of different
sizes and on one image of a third size, and its outputs are compared with the PyTorch model's.

Every file is written whole or not at all (:mod:`detr.atomic_files`): :func:`export` writes into a staging folder
beside ``path``, verifies there, and only then moves the file (an IR's ``.xml`` with its ``.bin``) into place, so
a full disk, a failed verification or an interruption leaves an earlier file at ``path`` as it was.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from detr.atomic_files import move_into_place, staging_folder, write_path_atomically
from detr.categories import CategoryMap
from detr.checkpoints.deployed import open_deployed
from detr.checkpoints.formats import CheckpointError, ExportError
from detr.checkpoints.openvino import write_ir
from detr.inference.postprocess import boxes_to_pixels, scores_and_labels, top_k_pairs
from detr.models.detector import Detector
from detr.models.layers.deformable_attention import BilinearKernel, use_bilinear_kernel

logger = logging.getLogger(__name__)

ExportFormat = Literal["onnx", "pt2", "openvino"]
#: the file suffix of each format (the predictor and detr-serve choose the runtime by it)
FORMAT_SUFFIXES = {"onnx": ".onnx", "pt2": ".pt2", "openvino": ".xml"}

#: fp32 tolerances of :func:`verify_export` (max abs difference): normalised boxes, logits (class and mask), scores.
BOX_TOLERANCE = 1e-4
LOGIT_TOLERANCE = 1e-3
SCORE_TOLERANCE = 1e-4


class DeployModel(nn.Module):
    """DETR with tensor inputs and a tuple of tensor outputs, as an exported graph has them.

    forward(images [B, 3, H, W], padding_mask bool [B, H, W]) → (pred_logits, pred_boxes) of the last decoder
    layer; with ``postprocess``: forward(images, padding_mask, orig_sizes int64 [B, 2] (height, width)) →
    (scores [B, Q], labels int64 [B, Q], boxes [B, Q, 4] pixel xyxy), scored by :mod:`detr.inference.postprocess`;
    for a model with ``detections_per_image`` k, the k best (query, class) pairs: [B, k] each, best first. A model
    that predicts masks adds its mask logits: pred_masks [B, Q, H / 4, W / 4]; post-processed, mask_logits
    [B, k, H / 4, W / 4] of the kept pairs' queries. A keypoint model (``keypoint_schema``) adds its raw keypoints
    after them: pred_keypoints [B, Q, C_k · K_max, 8] (:mod:`detr.models.layers.keypoint_head`); post-processed,
    keypoints [B, k, C_k · K_max, 8] of the kept pairs' queries (decoded outside the graph:
    :func:`detr.inference.postprocess_keypoints.grouppose_keypoints`).
    """

    def __init__(self, model: Detector, *, postprocess: bool = False) -> None:
        super().__init__()
        self.model, self.postprocess = model, postprocess

    @property
    def input_names(self) -> list[str]:
        return ["images", "padding_mask"] + (["orig_sizes"] if self.postprocess else [])

    @property
    def output_names(self) -> list[str]:
        names = ["scores", "labels", "boxes"] if self.postprocess else ["pred_logits", "pred_boxes"]
        if self.model.predicts_masks:
            names.append("mask_logits" if self.postprocess else "pred_masks")
        if self.model.keypoint_schema is not None:
            names.append("keypoints" if self.postprocess else "pred_keypoints")
        return names

    def forward(self, images: Tensor, padding_mask: Tensor, orig_sizes: Tensor | None = None) -> tuple[Tensor, ...]:
        outputs = self.model(images, padding_mask)
        masks = (outputs.masks,) if self.model.predicts_masks else ()
        keypoints = (outputs.keypoints,) if self.model.keypoint_schema is not None else ()
        if not self.postprocess:
            return outputs.logits, outputs.boxes, *masks, *keypoints
        assert orig_sizes is not None, "a post-processing graph takes orig_sizes"
        top_k = self.model.detections_per_image
        if top_k is None:
            scores, labels = scores_and_labels(outputs.logits, self.model.class_head)
            return scores, labels, boxes_to_pixels(outputs.boxes, orig_sizes), *masks, *keypoints
        scores, labels, queries = top_k_pairs(outputs.logits, top_k)
        boxes = outputs.boxes.gather(1, queries[..., None].expand(-1, -1, 4))
        if masks:  # the kept pairs' queries' masks (a query kept for two classes: its mask twice)
            height, width = outputs.masks.shape[-2:]
            masks = (outputs.masks.gather(1, queries[..., None, None].expand(-1, -1, height, width)),)
        if keypoints:  # likewise their keypoints
            slots, channels = outputs.keypoints.shape[-2:]
            keypoints = (outputs.keypoints.gather(1, queries[..., None, None].expand(-1, -1, slots, channels)),)
        return scores, labels, boxes_to_pixels(boxes, orig_sizes), *masks, *keypoints


def prepare_for_export(model: Detector, *, bilinear_kernel: BilinearKernel = "grid_sample") -> Detector:
    """A copy of ``model`` ready to trace: eval mode (training-only parts, i.e. denoising queries, extra
    query groups and the dense head, are then inactive), frozen BatchNorms folded into the convolutions,
    float32, no autocast; deformable attention's bilinear sampling computed with ``bilinear_kernel``
    ("gather": no GridSample in the graph, the same outputs). The caller's model is left as it was."""
    if not isinstance(model, Detector):
        raise ExportError(f"only a detr Detector exports (a model of detr.build_detr or detr.load_checkpoint), got "
                          f"{type(model).__name__}")
    if not model.exportable:
        raise ExportError(f"{type(model).__name__} does not export: an exported file (ONNX, OpenVINO) exports no "
                          "further, and a panoptic model's mask head is not part of the export (export its detector: "
                          "model.box_detector)")
    prepared = copy.deepcopy(model).float().eval().cpu()
    prepared.optimize_for_inference(fold_batch_norm=True, channels_last=False)
    prepared.use_autocast(None)
    use_bilinear_kernel(prepared, bilinear_kernel)
    return prepared


def static_input_size(model: Detector, eval_size: tuple[int, int] | None = None) -> int | None:
    """The side of the square a model whose input contract is a fixed square (``input_spec.resize`` "square":
    RT-DETR, D-FINE) is exported at: ``eval_size[0]`` where given, else its input contract's size; None for a
    model that takes any size (the paper's DETR, Deformable DETR: dynamic height and width)."""
    if model.input_spec.resize != "square":
        return None
    return int(eval_size[0]) if eval_size is not None else int(model.input_spec.size)


def example_inputs(model: Detector, *, postprocess: bool,
                   batch_sizes: list[tuple[int, int]] | None = None,
                   seed: int = 0, square: int | None = None) -> tuple[Tensor, ...]:
    """A zero-padded batch of random normalised images (one per (height, width) in ``batch_sizes``,
    default two of different sizes) with its mask, and orig_sizes if ``postprocess``. With ``square`` (a model of
    :func:`static_input_size`), every image is that square of pixels in [0, 1], without padding; the
    ``batch_sizes`` are then the original images' sizes only."""
    stride = model.coarsest_stride
    sizes = batch_sizes or [(4 * stride + 3, 5 * stride + 7), (3 * stride + 5, 6 * stride + 1)]
    generator = torch.Generator().manual_seed(seed)
    if square is not None:
        images = torch.rand(len(sizes), 3, square, square, generator=generator)
        mask = torch.zeros(len(sizes), square, square, dtype=torch.bool)
        if not postprocess:
            return images, mask
        return images, mask, torch.tensor([[2 * h + 1, 2 * w + 3] for h, w in sizes], dtype=torch.int64)
    height, width = max(h for h, _ in sizes), max(w for _, w in sizes)
    images = torch.zeros(len(sizes), 3, height, width)
    mask = torch.ones(len(sizes), height, width, dtype=torch.bool)
    for index, (h, w) in enumerate(sizes):
        images[index, :, :h, :w] = torch.randn(3, h, w, generator=generator)
        mask[index, :h, :w] = False
    if not postprocess:
        return images, mask
    # original images larger than the model's input, as after the eval resize
    orig_sizes = torch.tensor([[2 * h + 1, 2 * w + 3] for h, w in sizes], dtype=torch.int64)
    return images, mask, orig_sizes


def _dynamic_shapes(model: Detector, postprocess: bool, square: int | None = None) -> dict[str, dict[int, Any]]:
    Dim = torch.export.Dim
    if square is not None:  # a fixed square: only the batch is dynamic
        batch = Dim("batch", min=1)
        shapes = {"images": {0: batch}, "padding_mask": {0: batch}}
        if postprocess:
            shapes["orig_sizes"] = {0: batch}
        return shapes
    limits = {"min": model.min_image_size}
    if model.max_image_size is not None:
        limits["max"] = model.max_image_size
    batch, height, width = Dim("batch", min=1), Dim("height", **limits), Dim("width", **limits)
    shapes: dict[str, dict[int, Any]] = {"images": {0: batch, 2: height, 3: width},
                                         "padding_mask": {0: batch, 1: height, 2: width}}
    if postprocess:
        shapes["orig_sizes"] = {0: batch}
    return shapes


def _torch_export(model: Detector, postprocess: bool, bilinear_kernel: BilinearKernel = "grid_sample",
                  eval_size: tuple[int, int] | None = None) -> tuple[torch.export.ExportedProgram, DeployModel]:
    prepared = prepare_for_export(model, bilinear_kernel=bilinear_kernel)
    module = DeployModel(prepared, postprocess=postprocess).eval()
    square = static_input_size(prepared, eval_size)
    inputs = example_inputs(prepared, postprocess=postprocess, square=square)
    try:
        with torch.no_grad():
            program = torch.export.export(module, inputs, strict=False,
                                          dynamic_shapes=_dynamic_shapes(prepared, postprocess, square))
    except Exception as error:  # torch.export's errors are many types; name the model and keep the cause
        sizes = "height and width" if square is None else f"images of {square} × {square}"
        raise ExportError(f"torch.export could not trace this model with a dynamic batch and {sizes} "
                          f"(config {model.config}): {str(error).splitlines()[0]}") from error
    return program, module


def _plain(value: Any) -> bool:
    """Whether ``value`` is plain data that JSON keeps: scalars, and lists, tuples and string-keyed dicts of them."""
    if isinstance(value, (str, int, float, bool, type(None))):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(item) for item in value)
    return isinstance(value, dict) and all(isinstance(key, str) and _plain(item) for key, item in value.items())


def metadata(model: Detector, *, postprocess: bool, category_map: CategoryMap | None = None,
             eval_size: tuple[int, int] | None = None) -> dict[str, str]:
    """The metadata an exported file carries, as JSON strings keyed ``detr.*``."""
    category_map = category_map if category_map is not None else model.meta.category_map
    eval_size = eval_size if eval_size is not None else model.meta.eval_size
    options = model.config.to_dict() if model.config is not None else {}
    # tuples of scalars (RF-DETR's ViT stages) and records (RF-DETR's ViT, D-FINE's decoder) too: JSON lists and
    # objects, tuples and records again in the family's config
    config = {key: value for key, value in options.items() if _plain(value)}
    square = static_input_size(model, eval_size)
    values = {
        "outputs": "postprocessed" if postprocess else "raw",
        "class_head": model.class_head,
        "num_classes": model.num_classes,
        "category_map": category_map.to_dict() if category_map is not None else None,
        "eval_size": list(eval_size) if eval_size is not None else None,
        "min_image_size": model.min_image_size,
        "model_config": config,
        "score_threshold": model.meta.score_threshold,
        "input_spec": dataclasses.asdict(model.input_spec.replace(
            size=eval_size[0], max_size=eval_size[1]) if eval_size is not None else model.input_spec),
        "detections_per_image": model.detections_per_image,
        "static_input_size": [square, square] if square is not None else None,
        "predicts_masks": model.predicts_masks,
        "keypoints": None if model.keypoint_schema is None else {
            "num_keypoints_per_class": list(model.keypoint_schema.counts), "trace_alpha": model.keypoint_trace_alpha},
    }
    return {f"detr.{key}": json.dumps(value) for key, value in values.items()}


@contextlib.contextmanager
def _quiet_onnxscript() -> Iterator[None]:
    """The ONNX optimiser logs a warning for every Split it does not fold; they say nothing to a user."""
    quiet = logging.getLogger("onnxscript")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        yield
    finally:
        quiet.setLevel(level)


def export_onnx(model: Detector, path: str | Path, *, postprocess: bool = False,
                category_map: CategoryMap | None = None, eval_size: tuple[int, int] | None = None,
                bilinear_kernel: BilinearKernel = "grid_sample") -> Path:
    """Export ``model`` (a :class:`DETR`; not modified) to the ONNX file ``path`` (see the module doc).

    category_map, eval_size: recorded in the metadata; default the model's own (set by
    :func:`detr.load_checkpoint`). Not verified here: :func:`export` verifies.
    """
    try:
        import onnxscript  # noqa: F401  (the torch.export-based ONNX exporter needs it)
    except ImportError as error:
        raise ImportError("ONNX export needs onnx and onnxscript: pip install onnx onnxscript onnxruntime") from error
    path = Path(path)
    program, module = _torch_export(model, postprocess, bilinear_kernel, eval_size)
    try:
        with _quiet_onnxscript(), torch.no_grad():
            onnx_program = torch.onnx.export(program, dynamo=True, input_names=module.input_names,
                                             output_names=module.output_names, external_data=False,
                                             optimize=True, verbose=False)
    except Exception as error:  # the exporter's errors are many types; keep the cause
        raise ExportError(f"the traced model could not be converted to ONNX: {str(error).splitlines()[0]}") from error
    onnx_program.model.metadata_props.update(
        metadata(module.model, postprocess=postprocess, category_map=category_map, eval_size=eval_size))
    return write_path_atomically(path, lambda staged: onnx_program.save(str(staged), external_data=False))


def export_program(model: Detector, path: str | Path, *, postprocess: bool = False,
                   category_map: CategoryMap | None = None, eval_size: tuple[int, int] | None = None,
                   bilinear_kernel: BilinearKernel = "grid_sample") -> Path:
    """Export ``model`` with torch.export to ``path`` (``.pt2``); the metadata is the extra file
    ``detr.json``. Load it with :func:`load_program`."""
    path = Path(path)
    program, module = _torch_export(model, postprocess, bilinear_kernel, eval_size)
    values = {k.removeprefix("detr."): json.loads(v) for k, v in
              metadata(module.model, postprocess=postprocess, category_map=category_map, eval_size=eval_size).items()}
    return write_path_atomically(
        path, lambda staged: torch.export.save(program, str(staged), extra_files={"detr.json": json.dumps(values)}))


def export_openvino(model: Detector, path: str | Path, *, postprocess: bool = False,
                    category_map: CategoryMap | None = None, eval_size: tuple[int, int] | None = None,
                    bilinear_kernel: BilinearKernel = "grid_sample") -> Path:
    """Export ``model`` to the OpenVINO IR ``path`` (``.xml`` + ``.bin``): its ONNX graph
    (:func:`export_onnx`, written to a temporary file beside ``path``) converted by OpenVINO, fp32 weights, the
    metadata in the IR's rt_info. Not verified here: :func:`export` verifies."""
    path = Path(path)
    with staging_folder(path.parent) as folder:
        onnx_path = export_onnx(model, folder / "model.onnx", postprocess=postprocess,
                                category_map=category_map, eval_size=eval_size, bilinear_kernel=bilinear_kernel)
        return write_ir(onnx_path, path)


def load_program(path: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """A ``.pt2`` file of :func:`export_program` → (callable module with DeployModel's signature, metadata)."""
    extra = {"detr.json": ""}
    program = torch.export.load(str(path), extra_files=extra)
    return program.module(), json.loads(extra["detr.json"]) if extra["detr.json"] else {}


@dataclass
class Verification:
    """Max abs differences between an exported file and the PyTorch model, per output and per check
    (``differences[check][output]``), and the tolerance each output is held to."""

    path: Path
    differences: dict[str, dict[str, float]]
    tolerances: dict[str, float]

    @property
    def passed(self) -> bool:
        return all(diff <= self.tolerances[name] for outputs in self.differences.values()
                   for name, diff in outputs.items())

    def table(self) -> str:
        names = list(self.tolerances)
        lines = [f"{'check':<34}" + "".join(f"{name:>14}" for name in names)]
        for check, outputs in self.differences.items():
            lines.append(f"{check:<34}" + "".join(f"{outputs.get(name, math.nan):>14.2e}" for name in names))
        lines.append(f"{'tolerance':<34}" + "".join(f"{self.tolerances[name]:>14.0e}" for name in names))
        return "\n".join(lines)


def _tolerances(postprocess: bool, masks: bool = False, keypoints: bool = False) -> dict[str, float]:
    if postprocess:  # boxes are compared in normalised units (pixel difference / image size)
        tolerances = {"scores": SCORE_TOLERANCE, "labels": 0.0, "boxes": BOX_TOLERANCE}
    else:
        tolerances = {"pred_logits": LOGIT_TOLERANCE, "pred_boxes": BOX_TOLERANCE}
    if masks:
        tolerances["mask_logits" if postprocess else "pred_masks"] = LOGIT_TOLERANCE
    if keypoints:  # normalised x, y beside logits and log-precisions: held to the logits' tolerance
        tolerances["keypoints" if postprocess else "pred_keypoints"] = LOGIT_TOLERANCE
    return tolerances


def _runner(path: Path, format: ExportFormat, input_names: list[str]):
    if format != "pt2":  # a file its runtime runs, on the CPU: the deployed detector's own graph call
        detector = open_deployed(path)
        return lambda *inputs: tuple(torch.from_numpy(np.asarray(out)) for out in detector.infer(
            {name: tensor.numpy() for name, tensor in zip(input_names, inputs)}))
    module, _ = load_program(path)
    return lambda *inputs: tuple(module(*inputs))


#: Features per row above which an output is left out of :func:`pair_rows`' cost (it is still reordered).
PAIRING_FEATURES = 4096


def pair_rows(expected: tuple[Tensor, ...], actual: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """``actual`` with each image's rows (queries, or the post-processing's kept (query, class) pairs) put in the
    order of the ``expected`` rows they match, one to one (scipy's assignment on the summed max abs differences).

    A model that selects its queries by score (RT-DETR's, D-FINE's and RF-DETR's query selection, the top-k of
    the post-processing) may rank two near-tied candidates either way in another runtime: the same detections in
    another order, not a difference (a random-weight RT-DETR R18 at 640 swapped 10 adjacent pairs of its 300
    queries in ONNX Runtime, each within 5e-7 of its PyTorch row). Rows that differ still differ once paired.
    Outputs whose first two dimensions are not all the same ``[B, N]`` are returned as they are."""
    from scipy.optimize import linear_sum_assignment

    shapes = {tuple(tensor.shape[:2]) for tensor in actual}
    if (not actual or len(shapes) != 1 or actual[0].dim() < 2
            or any(tuple(a.shape) != tuple(e.shape) for a, e in zip(actual, expected, strict=True))):
        return actual
    batch, rows = actual[0].shape[:2]
    paired = [tensor.clone() for tensor in actual]
    for index in range(batch):
        cost = torch.zeros(rows, rows, dtype=torch.float64)
        for want, got in zip(expected, actual, strict=True):
            want_rows, got_rows = want[index].reshape(rows, -1).double(), got[index].reshape(rows, -1).double()
            if want_rows.shape[1] <= PAIRING_FEATURES:
                cost += (want_rows[:, None] - got_rows[None]).abs().amax(-1)
        _, order = linear_sum_assignment(cost.numpy())
        for result, got in zip(paired, actual, strict=True):
            result[index] = got[index][torch.from_numpy(order)]
    return tuple(paired)


def verify_export(model: Detector, path: str | Path, *, format: ExportFormat = "onnx",
                  postprocess: bool = False, eval_size: tuple[int, int] | None = None) -> Verification:
    """Run the exported file and ``model`` (PyTorch, as given) on a padded batch of two images of different
    sizes and on one image of a third size (a model of a fixed square, :func:`static_input_size` at
    ``eval_size``: a batch of two squares and one, of originals of those sizes); return the max abs differences
    (not raising), each image's rows paired first (:func:`pair_rows`: near-tied candidates in another order)."""
    path = Path(path)
    reference = DeployModel(copy.deepcopy(model).float().eval().cpu(), postprocess=postprocess).eval()
    reference.model.use_autocast(None)
    run = _runner(path, format, reference.input_names)
    stride = reference.model.coarsest_stride
    square = static_input_size(reference.model, eval_size)
    names = ("padded batch of 2 (two sizes)", "single image (a third size)") if square is None else (
        f"batch of 2 ({square} squares)", f"single image ({square} square)")
    checks = {
        names[0]: example_inputs(
            reference.model, postprocess=postprocess, seed=1, square=square,
            batch_sizes=[(7 * stride + 5, 9 * stride + 3), (5 * stride + 1, 10 * stride + 13)]),
        names[1]: example_inputs(
            reference.model, postprocess=postprocess, seed=2, square=square,
            batch_sizes=[(6 * stride + 11, 4 * stride + 9)]),
    }
    names = reference.output_names
    differences: dict[str, dict[str, float]] = {}
    for check, inputs in checks.items():
        with torch.no_grad():
            expected = reference(*inputs)
            actual = pair_rows(tuple(expected), tuple(run(*inputs)))
        row = {}
        for name, want, got in zip(names, expected, actual):
            if tuple(want.shape) != tuple(got.shape):
                row[name] = math.inf
                continue
            diff = (got.double() - want.double()).abs()
            if name == "labels":
                diff = (diff > 0).double()  # any label that differs fails
            if name == "boxes":  # pixels → fraction of the original image size
                diff = diff / inputs[2].double().amax(dim=1)[:, None, None]
            row[name] = float(diff.max()) if diff.numel() else 0.0
        differences[check] = row
    return Verification(path, differences, _tolerances(postprocess, reference.model.predicts_masks,
                                                       reference.model.keypoint_schema is not None))


def exported_files(path: str | Path) -> list[Path]:
    """The files an export at ``path`` consists of, the ones beside it first: an OpenVINO IR's ``.bin``, then
    ``path`` itself."""
    path = Path(path)
    return ([path.with_suffix(".bin")] if path.suffix.lower() == ".xml" else []) + [path]


def move_export(staged: str | Path, folder: str | Path, *, suffix: str = "") -> Path:
    """Move the files of the export ``staged`` (:func:`exported_files`, written in a
    :func:`detr.atomic_files.staging_folder`) into ``folder`` under their names plus ``suffix`` (".failed" for a
    file that failed its check), the ``.bin`` before the ``.xml``, each replacing what is there; returns the main
    file's new path."""
    moved = [move_into_place(file, Path(folder) / (file.name + suffix)) for file in exported_files(staged)]
    return moved[-1]


def failed_path(path: str | Path) -> Path:
    """Where a file that failed its check goes (``<path>.failed``): no deployment picks it up by its suffix."""
    return Path(path).with_name(Path(path).name + ".failed")


def write_export(model: Detector, path: str | Path, *, format: ExportFormat = "onnx", postprocess: bool = False,
                 category_map: CategoryMap | None = None, eval_size: tuple[int, int] | None = None,
                 bilinear_kernel: BilinearKernel = "grid_sample") -> Verification:
    """Write ``model`` to ``path`` in ``format`` and verify it there (:func:`verify_export`), moving nothing: the
    caller decides where the file goes (:func:`export`: into place, or ``<path>.failed``). Raises ExportError
    if the model cannot be exported or the file written cannot be read back."""
    if format not in FORMAT_SUFFIXES:
        raise ExportError(f"format must be one of {', '.join(map(repr, FORMAT_SUFFIXES))}, got {format!r}")
    writer = {"onnx": export_onnx, "pt2": export_program, "openvino": export_openvino}[format]
    writer(model, path, postprocess=postprocess, category_map=category_map, eval_size=eval_size,
           bilinear_kernel=bilinear_kernel)
    try:
        return verify_export(model, path, format=format, postprocess=postprocess, eval_size=eval_size)
    except CheckpointError as error:  # written but unreadable: the writer failed without an error of its own
        raise ExportError(f"the file written could not be read back: {error}") from error


def export(model: Detector, path: str | Path, *, format: ExportFormat = "onnx", postprocess: bool = False,
           category_map: CategoryMap | None = None, eval_size: tuple[int, int] | None = None,
           bilinear_kernel: BilinearKernel = "grid_sample") -> Verification:
    """Export ``model`` to ``path`` in ``format`` and verify the file (:func:`verify_export`).

    ``bilinear_kernel`` "gather" writes deformable attention's bilinear sampling as index gathers instead of
    GridSample (for runtimes without a correct GridSample, e.g. TensorRT); it is verified against the model as
    it runs here (its own kernel: in inference, the embedding bag), so the file equals the default export within
    the same tolerances.

    The file is written and verified in a staging folder beside ``path`` and moved into place only when it
    passed, so a failure of any kind (the model does not export, a full disk, an interruption, a file that does
    not reproduce the model) leaves an earlier file at ``path`` as it was.

    Raises ExportError if the model cannot be exported, or if the file's outputs exceed the fp32
    tolerances (boxes 1e-4, logits 1e-3, scores 1e-4; labels equal): the file then goes to
    ``<path>.failed`` (:func:`failed_path`) so that no deployment picks it up, and the message holds the
    differences. ``path`` may not be a folder.
    """
    path = Path(path)
    if path.is_dir():
        example = path / ("model" + FORMAT_SUFFIXES.get(format, ".onnx"))
        raise ExportError(f"{path} is a folder: give the file to write, e.g. {example}")
    with staging_folder(path.parent) as staging:
        staged = staging / path.name
        verification = write_export(model, staged, format=format, postprocess=postprocess, category_map=category_map,
                                    eval_size=eval_size, bilinear_kernel=bilinear_kernel)
        if not verification.passed:
            failed = move_export(staged, path.parent, suffix=".failed")
            raise ExportError(f"the exported file does not reproduce the PyTorch model (moved to {failed}; "
                              f"{path} is unchanged):\n{verification.table()}")
        move_export(staged, path.parent)
    verification.path = path
    logger.info("exported and verified %s", path)
    return verification
