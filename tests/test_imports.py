"""`import detr` needs only torch, torchvision and scipy: exporters, notebooks and torch.hub users load the
model without the training stack (Lightning), the image pipeline (albumentations, OpenCV), figures
(matplotlib) or any interop package (transformers, timm, safetensors, onnx, onnxruntime)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("lightning", "albumentations", "cv2", "matplotlib", "transformers", "timm", "safetensors", "onnx",
         "onnxruntime", "pycocotools", "detr.data", "detr.lightning")


def test_import_detr_loads_only_the_model_stack() -> None:
    code = ("import sys, detr; detr.load_checkpoint; detr.build_detr; detr.PostProcess; "
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout
