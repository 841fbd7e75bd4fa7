"""Parity against the authors' ``rfdetr`` package (roboflow/rf-detr) on its own ``.pth`` layout (random weights).

    pip install --target /tmp/rfdetr_pkg rfdetr --no-deps      # a throwaway copy; not a dependency of this project
    PYTHONPATH=/tmp/rfdetr_pkg .venv/bin/python benchmarks/rfdetr_package_parity.py [--models rf-detr-nano ...]

For each released model's preset (``rfdetr.config``: Nano, Small, Base, Seg Small ...) the package builds its model
(``build_model_from_config``, no pretrained weights: nothing is downloaded, 4 classes), every parameter gets random
values, and its state dict is saved as the package saves checkpoints: ``{"model": state_dict, "args": Namespace(<the ModelConfig>,
class_names)}``. ``detr.load_checkpoint`` reads that file; both run two photos at the preset's resolution
(ImageNet-normalised). Printed: the max abs difference of the ViT's stages and the projector's map; of the selected
encoder proposals, logits and boxes (and mask logits), and how many queries selected another cell: random weights
give encoder class scores 1e-7 to 1e-6 apart, which the two implementations' top-k (their projector maps differing
by 1e-5: float rounding) may order differently, a swapped pair of queries then taking each other's learned query and
reference offset, and the decoder's self-attention carrying that to every query of the image.

Only the package's model code is imported (not ``rfdetr/__init__``, which loads its training and download stack);
``requests``, which its file helpers import, is replaced by an empty module when missing (nothing is downloaded).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.helpers

import detr
from tests.helpers import randomise
from tests.helpers_rtdetr import square_photos

PRESETS = {"rf-detr-nano": "RFDETRNanoConfig", "rf-detr-small": "RFDETRSmallConfig", "rf-detr-base": "RFDETRBaseConfig",
           "rf-detr-seg-small": "RFDETRSegSmallConfig"}


def import_package_models() -> types.ModuleType:
    """The package's ``rfdetr.config`` and ``rfdetr.models.lwdetr`` without running its ``__init__`` (once: a second
    call returns the same modules)."""
    if "rfdetr.config" in sys.modules and "rfdetr.models.lwdetr" in sys.modules:
        return sys.modules["rfdetr.config"], sys.modules["rfdetr.models.lwdetr"]
    try:
        import requests  # noqa: F401
    except ImportError:
        sys.modules["requests"] = types.ModuleType("requests")
    spec = importlib.util.find_spec("rfdetr")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the rfdetr package is not on the path: pip install --target DIR rfdetr --no-deps and "
                         "PYTHONPATH=DIR")
    package = types.ModuleType("rfdetr")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["rfdetr"] = package
    return importlib.import_module("rfdetr.config"), importlib.import_module("rfdetr.models.lwdetr")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["rf-detr-nano", "rf-detr-seg-small"], choices=sorted(PRESETS))
    parser.add_argument("--out", default="/tmp/rfdetr_package_parity")
    options = parser.parse_args()
    torch.set_num_threads(2)
    config_module, lwdetr = import_package_models()
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in options.models:
        torch.manual_seed(0)
        # a pretrain_weights name keeps the builder from fetching DINOv2's weights (build_model_from_config loads none)
        model_config = getattr(config_module, PRESETS[name])(pretrain_weights="unused.pth", num_classes=4,
                                                             device="cpu")
        theirs = lwdetr.build_model_from_config(model_config).eval()
        randomise(theirs, 0)
        plain = {key: value for key, value in model_config.model_dump().items()
                 if isinstance(value, (bool, int, float, str, list, type(None)))}
        path = out / f"{name}.pth"
        torch.save({"model": theirs.state_dict(),
                    "args": argparse.Namespace(**plain, class_names=["a", "b", "c", "d"])}, path)
        ours = detr.load_checkpoint(path).eval()
        size = model_config.resolution
        images = (square_photos(size) - torch.tensor([0.485, 0.456, 0.406])[:, None, None]) / torch.tensor(
            [0.229, 0.224, 0.225])[:, None, None]
        with torch.no_grad():
            stages, theirs_stages = ours.backbone(images), theirs.backbone[0].encoder(images)
            projected = ours.projector[0](stages)
            their_output = theirs(images)
            output = ours(images, torch.zeros(2, size, size, dtype=torch.bool))
        features, _, *_ = theirs.backbone(lwdetr.nested_tensor_from_tensor_list(list(images)))
        same = ((their_output["enc_outputs"]["pred_boxes"] - output.proposals.boxes).abs().amax(-1) < 1e-4)  # [B, Q]
        rows = {"ViT stages": max((a - b).abs().max().item() for a, b in zip(stages, theirs_stages)),
                "projector": (features[0].tensors - projected).abs().max().item(),
                "proposal boxes": (their_output["enc_outputs"]["pred_boxes"] - output.proposals.boxes
                                   ).abs().max().item(),
                "logits": (their_output["pred_logits"] - output.logits).abs().max().item(),
                "boxes": (their_output["pred_boxes"] - output.boxes).abs().max().item(),
                }
        if output.masks is not None:
            rows["mask logits"] = (their_output["pred_masks"] - output.masks).abs().max().item()
        print(f"{name} ({ours.describe()}, {size} px): {int((~same).sum())} of {same.numel()} queries selected "
              "another cell")
        for label, value in rows.items():
            print(f"  {label:<26} {value:.2e}")


if __name__ == "__main__":
    main()
