"""OpenVINO: export a detector to OpenVINO's IR (``.xml`` + ``.bin``) and run it on the CPU behind the detector
contract.

:func:`write_ir` converts the ONNX graph of :func:`detr.checkpoints.export.export_onnx` with
``openvino.convert_model`` and keeps the weights in fp32 (``compress_to_fp16=False``); the ``detr.*`` metadata
travels in the IR's ``rt_info`` (:func:`detr.checkpoints.export.export_openvino` does both). :class:`OpenVinoDetector` compiles it for the CPU with an explicit inference
precision: OpenVINO runs bf16 by default on CPUs that have bfloat16 instructions, which would change the
outputs without a word, so fp32 is asked for unless bf16 is chosen (and the CPU has it). openvino is imported
only here, so ``import detr`` does not need it (``pip install detr-lightning[openvino]``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from detr.atomic_files import write_path_atomically
from detr.checkpoints.deployed import METADATA_KEYS, OPTIONAL_METADATA_KEYS, DeployedDetector
from detr.checkpoints.formats import CheckpointError

logger = logging.getLogger(__name__)

Precision = Literal["fp32", "bf16"]
#: our precision names → OpenVINO's INFERENCE_PRECISION_HINT
PRECISION_HINTS = {"fp32": "f32", "bf16": "bf16"}


def import_openvino() -> Any:
    """openvino, or an ImportError that says how to install it."""
    try:
        import openvino
    except ImportError as error:
        raise ImportError("OpenVINO export and inference need openvino: pip install openvino "
                          "(or pip install detr-lightning[openvino])") from error
    return openvino


def cpu_has_bf16() -> bool:
    """Whether OpenVINO's CPU plugin can run bf16 on this machine (bfloat16 instructions: AVX512-BF16, AMX)."""
    return "BF16" in import_openvino().Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def check_precision(precision: str) -> None:
    """Raise :class:`CheckpointError` (a ValueError, shown by the commands as one line) for a precision OpenVINO
    cannot run here, naming the fix."""
    if precision not in PRECISION_HINTS:
        raise CheckpointError(f"OpenVINO precision must be one of {sorted(PRECISION_HINTS)}, got {precision!r}")
    if precision == "bf16" and not cpu_has_bf16():
        raise CheckpointError("precision bf16 needs a CPU with bfloat16 instructions (AVX512-BF16 or AMX), which this "
                              "one lacks: use fp32 (--precision fp32)")


def write_ir(onnx_path: str | Path, path: str | Path) -> Path:
    """Convert the ONNX file ``onnx_path`` (an export of :func:`detr.checkpoints.export.export_onnx`) to the IR
    ``path`` (``.xml``, its weights beside it in ``.bin``), weights kept in fp32, its ``detr.*`` metadata in the
    IR's rt_info."""
    import onnx  # a dependency of the ONNX export that wrote the file

    ov = import_openvino()
    properties = {entry.key: entry.value for entry in onnx.load(str(onnx_path)).metadata_props}
    converted = ov.convert_model(str(onnx_path))
    for key, value in properties.items():
        if key.startswith("detr."):
            converted.set_rt_info(value, ["detr", key.removeprefix("detr.")])
    return save_ir(converted, path)


def save_ir(model: Any, path: str | Path) -> Path:
    """``openvino.save_model`` of ``model`` to ``path`` (``.xml`` and its ``.bin``), weights as they are (no fp16
    compression), whole or not at all (:func:`detr.atomic_files.write_path_atomically`: a full disk leaves an
    earlier IR there as it was, never a new ``.xml`` beside a truncated ``.bin``)."""
    ov, path = import_openvino(), Path(path)
    return write_path_atomically(path, lambda staged: ov.save_model(model, str(staged), compress_to_fp16=False),
                                 companions=[path.with_suffix(".bin")])


def read_rt_info(model: Any) -> dict[str, str]:
    """The ``detr.*`` properties an IR carries in its rt_info (as an ONNX file's metadata_props)."""
    properties = {}
    for key in METADATA_KEYS + OPTIONAL_METADATA_KEYS:
        name = key.removeprefix("detr.")
        if model.has_rt_info(["detr", name]):
            properties[key] = model.get_rt_info(["detr", name]).astype(str)
    return properties


class OpenVinoDetector(DeployedDetector):
    """An exported OpenVINO IR run on the CPU, called like the model (see :class:`DeployedDetector`).

    Args:
        path: an ``.xml`` written by :func:`detr.checkpoints.export.export_openvino` (its ``.bin`` beside it).
        device: only the CPU runs it; "cuda…" warns and runs on the CPU.
        threads: OpenVINO's inference threads (default: its own choice, every core).
        precision: "fp32" (default; asked for explicitly) or "bf16" (a CPU with bfloat16 instructions only).

    ``compiled`` is the ``openvino.CompiledModel``; ``backend`` e.g. "openvino (CPU, fp32)".
    """

    kind = "OpenVINO"

    def __init__(self, path: str | Path, *, device: str | torch.device | None = None, threads: int | None = None,
                 precision: Precision = "fp32") -> None:
        super().__init__(path)
        ov = import_openvino()
        check_precision(precision)
        if device is not None and torch.device(device).type != "cpu":
            logger.warning("device %s asked for, but OpenVINO runs %s on the CPU here", device, self.path.name)
        core = ov.Core()
        try:
            model = core.read_model(str(self.path))
        except RuntimeError as error:
            size = self.path.stat().st_size
            raise CheckpointError(
                f"{self.path} ({size} bytes) is not an OpenVINO IR OpenVINO can read (its .bin missing, truncated, "
                f"or another kind of file: {str(error).strip().splitlines()[0]}). Export it again with detr-export "
                f"CHECKPOINT --format openvino --out {self.path}") from error
        self.read_metadata(read_rt_info(model))
        config = {"INFERENCE_PRECISION_HINT": PRECISION_HINTS[precision]}
        if threads is not None:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        self.compiled = core.compile_model(model, "CPU", config)
        self.output_names = [output.get_any_name() for output in self.compiled.outputs]
        self.precision = precision
        self.backend = f"openvino (CPU, {'int8' if self.weights_precision == 'int8' else precision})"
        logger.info("opened %s with %s", self.path, self.backend)

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        results = self.compiled(feeds)
        return [results[output] for output in self.compiled.outputs]
