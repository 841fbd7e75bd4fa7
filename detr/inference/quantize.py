"""INT8 after training: quantise an exported file with the model's own preprocessing as calibration.

Two runtimes, each with its own tool, both calibrated on a few hundred images prepared exactly as the model
takes them (its :class:`~detr.models.inputs.InputSpec`: resize, normalisation; one image per batch, no
padding):

- OpenVINO IR (``.xml``): NNCF's post-training quantisation (``nncf.quantize``, ``ModelType.TRANSFORMER``,
  which keeps the attention softmax and the normalisations in floating point);
- ONNX (``.onnx``): ONNX Runtime's static quantisation in the QDQ format (per-channel int8 weights, uint8
  activations) of the convolutions and matrix products.

What is quantised was chosen by measurement with the accuracy gate (:mod:`detr.inference.gate`, the demo's
model on its 200 validation images, box AP 60.13 in fp32; docs/guides/deploy.md): quantising every convolution and
matrix product lost 4.2 AP with NNCF (4.1 with the heads' last layers kept in fp32; 19.6 with ONNX Runtime);
the convolutions alone lost 0.03 and 0.08. So ``scope="convolutions"`` (the default) quantises the
convolutions (the backbone, most of a DETR's arithmetic) and keeps every matrix product (the transformer and
the heads) in fp32; ``scope="all"`` quantises the matrix products too, all but the heads' last layers. Neither
tool is imported by ``import detr``.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from detr.inference.images import to_rgb_array
from detr.inference.outputs import collect_image_paths
from detr.models.inputs import InputSpec

logger = logging.getLogger(__name__)

#: the default number of calibration images
CALIBRATION_SIZE = 300
#: what is quantised: "convolutions" (the default: matrix products stay fp32) or "all" (the heads' last layers
#: stay fp32)
Scope = Literal["convolutions", "all"]


def calibration_feeds(input_spec: InputSpec, images: Sequence[str | Path], *,
                      limit: int = CALIBRATION_SIZE) -> list[dict[str, np.ndarray]]:
    """The graph inputs of up to ``limit`` images (files, folders or patterns) prepared as the model takes them:
    ``{"images": float32 [1, 3, h, w], "padding_mask": bool [1, h, w]}`` each (one image, no padding).

    Raises:
        ValueError: no image, naming the inputs.
    """
    paths = collect_image_paths(images)[:limit]
    if not paths:
        raise ValueError(f"no calibration images in {', '.join(map(str, images))}")
    feeds = []
    for path in paths:
        tensor = input_spec.prepare(to_rgb_array(path))
        feeds.append({"images": tensor[None].numpy(),
                      "padding_mask": np.zeros((1, *tensor.shape[-2:]), dtype=bool)})
    logger.info("calibrating on %d images", len(feeds))
    return feeds


def _import(module: str, package: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"INT8 quantisation of this format needs {package}: pip install {package} "
                          f"(or pip install detr-lightning[{extra}])") from error


def quantize_openvino(xml: str | Path, out: str | Path, feeds: Sequence[dict[str, np.ndarray]], *,
                      scope: Scope = "convolutions") -> Path:
    """NNCF's INT8 quantisation of the IR ``xml`` (written by :func:`detr.checkpoints.export.export_openvino`)
    into ``out``; its rt_info (the model's record) is kept and records ``precision`` "int8"."""
    from detr.checkpoints.openvino import import_openvino

    check_scope(scope)
    nncf, ov = _import("nncf", "nncf", "openvino"), import_openvino()
    model = ov.Core().read_model(str(xml))
    ignored = (nncf.IgnoredScope(types=["MatMul"]) if scope == "convolutions"
               else nncf.IgnoredScope(names=head_nodes(model), validate=False))
    quantized = nncf.quantize(model, nncf.Dataset(list(feeds)), model_type=nncf.ModelType.TRANSFORMER,
                              subset_size=len(feeds), ignored_scope=ignored)
    quantized.set_rt_info('"int8"', ["detr", "precision"])
    ov.save_model(quantized, str(out), compress_to_fp16=False)
    return Path(out)


def check_scope(scope: str) -> None:
    if scope not in ("convolutions", "all"):
        raise ValueError(f"INT8 scope must be 'convolutions' or 'all', got {scope!r}")


def head_nodes(model: Any) -> list[str]:
    """Names of the OpenVINO nodes of the heads' last layers: the matrix products feeding the graph's
    outputs through nothing but element-wise ops (bias, sigmoid of the boxes)."""
    names: list[str] = []
    for output in model.outputs:
        node = output.get_node().input_value(0).get_node()
        for _ in range(8):  # walk up through Add / Sigmoid / Convert to the product
            if node.get_type_name() == "MatMul":
                names.append(node.get_friendly_name())
                break
            if node.get_input_size() == 0:
                break
            node = node.input_value(0).get_node()
    return names


class _Feeds:
    """ONNX Runtime's CalibrationDataReader over a list of feeds."""

    def __init__(self, feeds: Sequence[dict[str, np.ndarray]]) -> None:
        self._iterator: Iterator[dict[str, np.ndarray]] = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._iterator, None)


def quantize_onnx(path: str | Path, out: str | Path, feeds: Sequence[dict[str, np.ndarray]], *,
                  scope: Scope = "convolutions") -> Path:
    """ONNX Runtime's static QDQ quantisation of the ONNX file ``path`` into ``out``, its metadata kept
    (``detr.precision`` "int8" added)."""
    import onnx

    check_scope(scope)
    quantization = _import("onnxruntime.quantization", "onnxruntime", "export")
    model = onnx.load(str(path))
    exclude = onnx_head_nodes(model) if scope == "all" else []
    reader = type("Reader", (_Feeds, quantization.CalibrationDataReader), {})(feeds)
    quantization.quantize_static(
        str(path), str(out), reader, quant_format=quantization.QuantFormat.QDQ, per_channel=True,
        activation_type=quantization.QuantType.QUInt8, weight_type=quantization.QuantType.QInt8,
        op_types_to_quantize=["Conv"] if scope == "convolutions" else ["Conv", "MatMul", "Gemm"],
        nodes_to_exclude=exclude)
    quantized = onnx.load(str(out))
    properties = {entry.key: entry.value for entry in model.metadata_props}
    properties["detr.precision"] = '"int8"'
    del quantized.metadata_props[:]
    for key, value in properties.items():
        quantized.metadata_props.add(key=key, value=value)
    onnx.save(quantized, str(out))
    return Path(out)


def onnx_head_nodes(model: Any) -> list[str]:
    """Names of the ONNX nodes of the heads' last layers: the MatMul / Gemm nearest each graph output, walking
    up through element-wise ops."""
    producers = {name: node for node in model.graph.node for name in node.output}
    names: list[str] = []
    for output in model.graph.output:
        node = producers.get(output.name)
        for _ in range(8):
            if node is None:
                break
            if node.op_type in ("MatMul", "Gemm"):
                names.append(node.name)
                break
            node = producers.get(node.input[0])
    return names


#: the quantiser of each exported format, by suffix
QUANTIZERS = {".xml": quantize_openvino, ".onnx": quantize_onnx}


def quantize(path: str | Path, out: str | Path, feeds: Sequence[dict[str, np.ndarray]], *,
             scope: Scope = "convolutions") -> Path:
    """INT8 quantisation of the exported file ``path`` (``.xml``: NNCF; ``.onnx``: ONNX Runtime) into ``out``."""
    suffix = Path(path).suffix.lower()
    if suffix not in QUANTIZERS:
        raise ValueError(f"INT8 quantisation takes an .onnx or .xml file, got {path}")
    return QUANTIZERS[suffix](path, out, feeds, scope=scope)
