"""Panoptic model parity at full size: detr.DETRPanoptic against the literal per-query reference of the tests.

    .venv/bin/python benchmarks/panoptic_parity.py                      # R50, random weights (default init)
    .venv/bin/python benchmarks/panoptic_parity.py --checkpoint detr-r50-panoptic-00ce5173.pth

Loads one state dict (a released panoptic file, or a randomly initialised R50 panoptic model with random
frozen-BatchNorm statistics and GroupNorm affines) into both, runs a padded batch of two images and prints
the largest absolute difference of pred_logits, pred_boxes and pred_masks. Slow on a CPU: the reference
runs the mask head once per query.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.reference_*

from detr import build_detr_panoptic, load_checkpoint  # noqa: E402
from tests.reference_detr import ReferenceDETR  # noqa: E402
from tests.reference_segmentation import ReferencePanoptic  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", help="an authors' panoptic release file (default: random weights)")
    parser.add_argument("--height", type=int, default=160)
    parser.add_argument("--width", type=int, default=224)
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.checkpoint:
        model = load_checkpoint(args.checkpoint)
    else:
        model = build_detr_panoptic().eval()
        with torch.no_grad():
            for name, tensor in [*model.named_buffers(), *model.named_parameters()]:
                if name.endswith("running_mean"):
                    tensor.normal_(0, 0.1)
                elif name.endswith("running_var") or (".gn" in name and name.endswith("weight")):
                    tensor.uniform_(0.5, 1.5)
                elif ".gn" in name:
                    tensor.normal_(0, 0.1)
    detr, config = model.detr, model.config
    channels = [1024, 512, 256] if config.backbone in ("resnet50", "resnet101") else [256, 128, 64]
    reference = ReferencePanoptic(
        ReferenceDETR(detr.backbone[0].body, detr.backbone.num_channels, config.hidden_dim, config.num_heads,
                      config.num_encoder_layers, config.num_decoder_layers, config.dim_feedforward,
                      model.num_queries, model.num_classes),
        channels, config.hidden_dim, config.num_heads).eval()
    reference.load_state_dict(model.state_dict())
    height, width = args.height, args.width
    images = torch.zeros(2, 3, height, width)
    mask = torch.ones(2, height, width, dtype=torch.bool)
    images[0], mask[0] = torch.randn(3, height, width), False
    images[1, :, : height * 3 // 4, : width * 3 // 4] = torch.randn(3, height * 3 // 4, width * 3 // 4)
    mask[1, : height * 3 // 4, : width * 3 // 4] = False
    with torch.no_grad():
        ours, ref = model(images, mask), reference(images, mask)
    for key, value in (("pred_logits", ours.logits), ("pred_boxes", ours.boxes), ("pred_masks", ours.masks)):
        difference = (value - ref[key]).abs().max().item()
        print(f"{key:12s} {tuple(value.shape)}  max |ours − reference| = {difference:.2e}  "
              f"(max |value| {value.abs().max().item():.2f})")


if __name__ == "__main__":
    main()
