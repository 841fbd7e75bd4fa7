"""Run an exported DETR ONNX file (:mod:`detr.checkpoints.export`) with ONNX Runtime, behind the model's own forward contract.

:class:`OnnxDetector` takes the place of a :class:`detr.models.DETR` in :class:`detr.Predictor`: the same call,
``(images, padding_mask) →`` :class:`~detr.models.outputs.DetectorOutput` (logits and boxes), and the same
attributes the predictor reads (``meta``, ``config``, ``num_classes``, ``class_head``), which come from the file's metadata.
onnxruntime is imported only here, when a file is opened, so ``import detr`` does not need it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from detr.categories import CategoryMap
from detr.checkpoints.formats import CheckpointError
from detr.models.config import DetrConfig, ModelMeta
from detr.models.detector import Detector
from detr.models.outputs import DetectorOutput

logger = logging.getLogger(__name__)

#: Keys of the ONNX file's ``metadata_props`` written by :func:`detr.checkpoints.export.export_onnx` (values are JSON).
METADATA_KEYS = ("detr.outputs", "detr.class_head", "detr.num_classes", "detr.category_map", "detr.eval_size",
                 "detr.min_image_size", "detr.model_config")


def import_onnxruntime() -> Any:
    """onnxruntime, or an ImportError that says how to install it."""
    try:
        import onnxruntime
    except ImportError as error:
        raise ImportError("running an ONNX file needs onnxruntime: pip install onnxruntime "
                          "(or onnxruntime-gpu for CUDA)") from error
    return onnxruntime


def read_onnx_metadata(path: str | Path) -> dict[str, Any]:
    """The DETR metadata of an exported ONNX file, JSON-decoded: outputs ("raw" or "postprocessed"),
    class_head, num_classes, category_map (dict or None), eval_size ([min, max] or None), min_image_size,
    model_config. Raises :class:`CheckpointError` naming the file if it is not an ONNX model or was not written by
    :func:`detr.checkpoints.export.export_onnx`."""
    ort = import_onnxruntime()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # only the metadata is read
    session = open_session(ort, path, options, ["CPUExecutionProvider"])
    return _decode_metadata(session.get_modelmeta().custom_metadata_map, path)


def open_session(ort: Any, path: str | Path, options: Any, providers: list) -> Any:
    """``ort.InferenceSession`` of ``path``; a file ONNX Runtime cannot parse (truncated, empty, not ONNX)
    raises :class:`CheckpointError` naming it, instead of onnxruntime's "INVALID_PROTOBUF" or "No graph was
    found in the protobuf", which say neither which file nor what to do."""
    if not Path(path).is_file():
        raise CheckpointError(f"ONNX file {path} does not exist")
    state = ort.capi.onnxruntime_pybind11_state
    unreadable = (state.InvalidProtobuf, state.InvalidArgument, state.InvalidGraph, state.Fail)
    try:
        return ort.InferenceSession(str(path), options, providers=providers)
    except unreadable as error:
        size = Path(path).stat().st_size
        raise CheckpointError(
            f"{path} ({size} bytes) is not an ONNX model ONNX Runtime can open: truncated, empty or another kind "
            f"of file ({str(error).strip()}). Export it again with detr-export CHECKPOINT --out {path}") from error


def _decode_metadata(props: dict[str, str], path: str | Path) -> dict[str, Any]:
    missing = [key for key in METADATA_KEYS if key not in props]
    if missing:
        raise CheckpointError(f"{path} lacks the DETR metadata {missing}: export it with detr-export "
                         f"(detr.checkpoints.export.export_onnx), which records the class head, categories and eval resize")
    return {key.removeprefix("detr."): json.loads(props[key]) for key in METADATA_KEYS}


class OnnxDetector(Detector):
    """An exported DETR ONNX file run by ONNX Runtime, called like the model.

    Args:
        path: a file written by :func:`detr.checkpoints.export.export_onnx`.
        device: "cuda…" uses ONNX Runtime's CUDAExecutionProvider when the installed onnxruntime has it
            (onnxruntime-gpu), else the CPU with a warning; default CPU.
        threads: ONNX Runtime's intra-op threads (default: its own choice).

    Attributes: ``meta`` (:class:`detr.models.config.ModelMeta`: category map, eval size), ``config``
    (:class:`DetrConfig`), ``num_classes``, ``class_head``, ``postprocessed`` (the file outputs scores, labels and pixel boxes), ``session`` (the
    ``onnxruntime.InferenceSession``), ``backend`` (a description, e.g. "onnxruntime (CPUExecutionProvider)").
    It holds no torch parameters: ``.to()`` and ``.eval()`` change nothing. As a :class:`Detector` it returns
    no attention (``attention_kind`` None), predicts no masks and does not export again.
    """

    attention_kind = None
    exportable = False

    def __init__(self, path: str | Path, *, device: str | torch.device | None = None,
                 threads: int | None = None) -> None:
        super().__init__()
        ort = import_onnxruntime()
        self.path = Path(path)
        providers = ["CPUExecutionProvider"]
        if device is not None and torch.device(device).type == "cuda":
            if "CUDAExecutionProvider" in ort.get_available_providers():
                index = torch.device(device).index or 0
                providers = [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
            else:
                logger.warning("device %s asked for, but this onnxruntime has no CUDAExecutionProvider "
                               "(install onnxruntime-gpu): running %s on the CPU", device, self.path.name)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads is not None:
            options.intra_op_num_threads = threads
        self.session = open_session(ort, self.path, options, providers)
        meta = _decode_metadata(self.session.get_modelmeta().custom_metadata_map, self.path)
        self.postprocessed = meta["outputs"] == "postprocessed"
        self.class_head = meta["class_head"]
        self.num_classes = int(meta["num_classes"])
        self.meta = ModelMeta(
            category_map=CategoryMap.from_dict(meta["category_map"]) if meta["category_map"] else None,
            eval_size=tuple(meta["eval_size"]) if meta["eval_size"] else None)
        self._min_image_size = int(meta["min_image_size"])
        # files of models built without build_detr record no config: the class head and class count are all
        # the predictor needs, and they are recorded on their own
        self.config = (DetrConfig.from_dict(meta["model_config"], where=str(self.path)) if meta["model_config"]
                       else DetrConfig(num_classes=self.num_classes, class_head=self.class_head))
        self.num_queries = self.config.num_queries
        self.output_names = [output.name for output in self.session.get_outputs()]
        self.backend = f"onnxruntime ({self.session.get_providers()[0]})"
        logger.info("opened %s with %s", self.path, self.backend)

    @property
    def min_image_size(self) -> int:
        return self._min_image_size

    @property
    def stride(self) -> int:
        raise ValueError(f"{self.path.name} keeps no feature maps (an ONNX file holds the predictions only): use the "
                         "PyTorch checkpoint for attention maps")

    def describe(self) -> str:
        return f"{super().describe()}, {self.backend}" if self.config is not None else self.backend

    def optimize_for_inference(self, *, fold_batch_norm: bool = True, channels_last: bool = True) -> OnnxDetector:
        """Nothing to do: ONNX Runtime optimises the graph when it opens the file (the export folded the
        frozen BatchNorms already)."""
        return self

    def forward(self, images: Tensor, padding_mask: Tensor, return_attention: bool = False,
                targets: list[dict[str, Tensor]] | None = None) -> DetectorOutput:
        """images float [B, 3, H, W] (normalised, zero-padded), padding_mask bool [B, H, W] (True = padding)
        → :class:`DetectorOutput` (logits and boxes of the last layer, CPU tensors) as the PyTorch model's
        forward (no aux layers; ``targets`` are not read). A file exported with post-processing runs through
        :meth:`detect` instead."""
        if return_attention:
            raise ValueError(f"attention maps are not available from the ONNX file {self.path.name}: the export "
                             f"keeps only the predictions. Use the PyTorch checkpoint for attention figures")
        if self.postprocessed:
            raise ValueError(f"{self.path.name} was exported with post-processing: it needs orig_sizes [B, 2] and "
                             "returns scores, labels and pixel boxes (OnnxDetector.detect). detr.Predictor "
                             "post-processes itself: export without --postprocess for it")
        logits, boxes = self._run(images, padding_mask)
        return DetectorOutput(logits, boxes, class_head=self.class_head)

    def detect(self, images: Tensor, padding_mask: Tensor, orig_sizes: Tensor) -> dict[str, Tensor]:
        """A file exported with post-processing: images and padding_mask as :meth:`forward`, orig_sizes int64
        [B, 2] (height, width) → {"scores" [B, Q], "labels" int64 [B, Q], "boxes" [B, Q, 4] pixel xyxy}."""
        if not self.postprocessed:
            raise ValueError(f"{self.path.name} was exported without post-processing: call it with images and "
                             "padding_mask only (OnnxDetector(...)(images, padding_mask))")
        return dict(zip(self.output_names, self._run(images, padding_mask, orig_sizes)))

    def _run(self, images: Tensor, padding_mask: Tensor, orig_sizes: Tensor | None = None) -> list[Tensor]:
        min_size = self.min_image_size
        if images.shape[-2] < min_size or images.shape[-1] < min_size:
            raise ValueError(f"{self.path.name} takes images of at least {min_size} × {min_size} pixels "
                             f"(a feature map of 2 × 2), got {tuple(images.shape[-2:])}")
        feeds = {"images": images.detach().float().cpu().numpy(),
                 "padding_mask": padding_mask.detach().bool().cpu().numpy()}
        if orig_sizes is not None:
            feeds["orig_sizes"] = orig_sizes.detach().long().cpu().numpy()
        return [torch.from_numpy(np.asarray(value)) for value in self.session.run(None, feeds)]
