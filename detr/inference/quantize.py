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

A calibration image that cannot be read is skipped and counted, as training skips one (:func:`read_calibration`);
the quantised file is written whole or not at all (:mod:`detr.atomic_files`), and NNCF's own log and progress bars
(about 150 lines) are kept off the console: the caller prints what is being done.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from detr.atomic_files import write_path_atomically
from detr.inference.images import to_rgb_array
from detr.inference.outputs import collect_image_paths
from detr.models.inputs import InputSpec

logger = logging.getLogger(__name__)

#: the default number of calibration images
CALIBRATION_SIZE = 300
#: what is quantised: "convolutions" (the default: matrix products stay fp32) or "all" (the heads' last layers
#: stay fp32)
Scope = Literal["convolutions", "all"]


@dataclass
class Calibration:
    """The calibration set :func:`read_calibration` prepared: ``feeds`` (graph inputs, one image each) and the
    files ``skipped`` because they could not be read or prepared (path, reason)."""

    feeds: list[dict[str, np.ndarray]] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)


def read_calibration(input_spec: InputSpec, images: Sequence[str | Path], *,
                     limit: int = CALIBRATION_SIZE) -> Calibration:
    """Up to ``limit`` images (files, folders or patterns, in order) prepared as the model takes them:
    ``{"images": float32 [1, 3, h, w], "padding_mask": bool [1, h, w]}`` each (one image, no padding). A file that
    cannot be read (corrupt, truncated, not an image) is skipped, counted in ``skipped`` and the next one taken.

    Raises:
        ValueError: an input that names no image; or too few readable images (none, or more unreadable than
            readable ones: the wrong folder, or a damaged copy), naming the first unreadable file.
    """
    calibration = Calibration()
    for path in collect_image_paths(images):
        if len(calibration.feeds) == limit:
            break
        try:
            tensor = input_spec.prepare(to_rgb_array(path))
        except ValueError as error:  # ImageLoadError, or an image too small to prepare
            calibration.skipped.append((path, str(error).splitlines()[0]))
            continue
        calibration.feeds.append({"images": tensor[None].numpy(),
                                  "padding_mask": np.zeros((1, *tensor.shape[-2:]), dtype=bool)})
    readable, unreadable = len(calibration.feeds), len(calibration.skipped)
    if unreadable and (readable == 0 or unreadable > readable):
        path, reason = calibration.skipped[0]
        raise ValueError(f"{unreadable} of the {readable + unreadable} calibration images could not be read (first: "
                         f"{path}: {reason}), {readable} could: too few to calibrate on; check --calibration "
                         f"{' '.join(map(str, images))}")
    if unreadable:
        logger.warning("skipped %d calibration image(s) that could not be read (first: %s: %s)", unreadable,
                       *calibration.skipped[0])
    logger.info("calibrating on %d images", readable)
    return calibration


def calibration_feeds(input_spec: InputSpec, images: Sequence[str | Path], *,
                      limit: int = CALIBRATION_SIZE) -> list[dict[str, np.ndarray]]:
    """:func:`read_calibration`'s feeds (unreadable files skipped)."""
    return read_calibration(input_spec, images, limit=limit).feeds


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
    from detr.checkpoints.openvino import save_ir

    torch_extensions = logging.getLogger("torch.utils.cpp_extension")
    level = torch_extensions.level
    torch_extensions.setLevel(logging.ERROR)  # NNCF imports nncf.torch, whose import warns "No CUDA runtime"
    try:
        nncf, ov = _import("nncf", "nncf", "openvino"), import_openvino()
    finally:
        torch_extensions.setLevel(level)
    model = ov.Core().read_model(str(xml))
    ignored = (nncf.IgnoredScope(types=["MatMul"]) if scope == "convolutions"
               else nncf.IgnoredScope(names=head_nodes(model), validate=False))
    with quiet_nncf(nncf):
        quantized = nncf.quantize(model, nncf.Dataset(list(feeds)), model_type=nncf.ModelType.TRANSFORMER,
                                  subset_size=len(feeds), ignored_scope=ignored)
    quantized.set_rt_info('"int8"', ["detr", "precision"])
    return save_ir(quantized, out)


@contextlib.contextmanager
def quiet_nncf(nncf: Any) -> Iterator[None]:
    """NNCF's INFO lines and its rich progress bars (written to stdout) off the console: about 150 lines that say
    nothing a user acts on. Its warnings and errors still show (its logger at WARNING)."""
    level = nncf.nncf_logger.level
    nncf.set_log_level(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        nncf.set_log_level(level)


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
    properties = {entry.key: entry.value for entry in model.metadata_props}
    properties["detr.precision"] = '"int8"'

    def write(staged: Path) -> None:
        quantization.quantize_static(
            str(path), str(staged), reader, quant_format=quantization.QuantFormat.QDQ, per_channel=True,
            activation_type=quantization.QuantType.QUInt8, weight_type=quantization.QuantType.QInt8,
            op_types_to_quantize=["Conv"] if scope == "convolutions" else ["Conv", "MatMul", "Gemm"],
            nodes_to_exclude=exclude)
        quantized = onnx.load(str(staged))
        del quantized.metadata_props[:]
        for key, value in properties.items():
            quantized.metadata_props.add(key=key, value=value)
        onnx.save(quantized, str(staged))

    return write_path_atomically(out, write)


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
