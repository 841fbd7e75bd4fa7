"""Run an exported ONNX file (:mod:`detr.checkpoints.export`) with ONNX Runtime, behind the detector contract.

:class:`OnnxDetector` is the ONNX Runtime :class:`~detr.checkpoints.deployed.DeployedDetector`: it takes the
place of the PyTorch model in :class:`detr.Predictor`, with the same call and the attributes the predictor
reads, which come from the file's metadata. onnxruntime is imported only here, when a file is opened, so
``import detr`` does not need it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from detr.checkpoints.deployed import METADATA_KEYS, DeployedDetector, decode_metadata
from detr.checkpoints.formats import CheckpointError

logger = logging.getLogger(__name__)

__all__ = ["METADATA_KEYS", "OnnxDetector", "import_onnxruntime", "open_session", "read_onnx_metadata"]


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
    return decode_metadata(session.get_modelmeta().custom_metadata_map, path)


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


class OnnxDetector(DeployedDetector):
    """An exported ONNX file run by ONNX Runtime, called like the model (see :class:`DeployedDetector`).

    Args:
        path: a file written by :func:`detr.checkpoints.export.export_onnx`.
        device: "cuda…" uses ONNX Runtime's CUDAExecutionProvider when the installed onnxruntime has it
            (onnxruntime-gpu), else the CPU with a warning; default CPU.
        threads: ONNX Runtime's intra-op threads (default: its own choice).
        precision: "fp32", the precision the file was exported in (there is no other: CheckpointError).

    ``session`` is the ``onnxruntime.InferenceSession``; ``backend`` e.g. "onnxruntime (CPUExecutionProvider)".
    """

    kind = "ONNX"

    def __init__(self, path: str | Path, *, device: str | torch.device | None = None,
                 threads: int | None = None, precision: str = "fp32") -> None:
        super().__init__(path)
        if precision != "fp32":  # a CheckpointError: every command shows it as one line
            raise CheckpointError(f"{self.path} is an ONNX file: it runs in the precision it was exported in (fp32), "
                                  f"not {precision!r}; use --precision fp32 with it, or for bf16 on a CPU export with "
                                  "--format openvino, or use the PyTorch checkpoint")
        ort = import_onnxruntime()
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
        self.read_metadata(self.session.get_modelmeta().custom_metadata_map)
        self.output_names = [output.name for output in self.session.get_outputs()]
        self.backend = f"onnxruntime ({self.session.get_providers()[0]})"
        if self.weights_precision != "fp32":
            self.backend = f"onnxruntime ({self.session.get_providers()[0]}, {self.weights_precision})"
        logger.info("opened %s with %s", self.path, self.backend)

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, feeds)
