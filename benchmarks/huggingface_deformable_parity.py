"""Full-size parity against Hugging Face transformers for Deformable DETR's four variants (R50, timm backbone).

    .venv/bin/python benchmarks/huggingface_deformable_parity.py [--out /tmp/hf_deformable] [--threads 2]
    .venv/bin/python benchmarks/huggingface_deformable_parity.py --variants plain two_stage --size 640

For each variant (plain, box refinement, refinement + two-stage, single-scale) a transformers
``DeformableDetrForObjectDetection`` of the authors' size (R50, 256 wide, 6 + 6 layers, 8 heads, 4 points,
FFN 1024, 300 queries, 91 COCO labels) with random weights is saved with ``save_pretrained``;
``detr.load_checkpoint`` loads the directory; both run on a padded batch of two photos (shortest side
``--size``, 800 by default: 800 × 1203 and 800 × 800); then this project's ``save_pretrained_deformable``
writes it back and transformers' ``from_pretrained`` reads it. Printed: the max abs differences of logits and
boxes in both directions and each side's forward time. Needs transformers and timm.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.helpers

from machine import describe_machine  # noqa: E402

import detr  # noqa: E402
from detr.categories import CategoryMap  # noqa: E402
from detr.checkpoints.huggingface_deformable import save_pretrained_deformable  # noqa: E402
from detr.data.collate import pad_images  # noqa: E402
from detr.data.transforms import IMAGENET_MEAN, IMAGENET_STD  # noqa: E402
from tests.helpers import randomise  # noqa: E402

PHOTOS = Path(__file__).resolve().parents[1] / "data" / "photos"
VARIANTS = {"plain": {}, "box_refine": {"with_box_refine": True},
            "two_stage": {"with_box_refine": True, "two_stage": True}, "single_scale": {"num_feature_levels": 1}}


def photo_batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    mean, std = torch.tensor(IMAGENET_MEAN)[:, None, None], torch.tensor(IMAGENET_STD)[:, None, None]
    tensors = []
    for name, (width, height) in (("chelsea.png", (round(size * 1203 / 800), size)), ("astronaut.png", (size, size))):
        image = Image.open(PHOTOS / name).convert("RGB").resize((width, height), Image.BILINEAR)
        pixels = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float() / 255
        tensors.append((pixels - mean) / std)
    return pad_images(tensors)


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="/tmp/hf_deformable", help="scratch folder for the saved directories")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--size", type=int, default=800, help="shortest side of the photos")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    import transformers

    if args.threads:
        torch.set_num_threads(args.threads)
    print(describe_machine(), f"\ntransformers {transformers.__version__}", flush=True)
    images, mask = photo_batch(args.size)
    coco = CategoryMap.coco()
    out = Path(args.out)
    for variant in args.variants:
        config = transformers.DeformableDetrConfig(
            backbone="resnet50", use_timm_backbone=True, use_pretrained_backbone=False, num_labels=91,
            id2label=dict(enumerate(coco.names)), **VARIANTS[variant])
        torch.manual_seed(0)
        theirs = transformers.DeformableDetrForObjectDetection(config).eval()
        randomise(theirs, 0)
        hf_dir = out / f"hf-{variant}"
        shutil.rmtree(hf_dir, ignore_errors=True)
        theirs.save_pretrained(hf_dir)
        ours = detr.load_checkpoint(hf_dir)
        with torch.no_grad():
            a, ours_seconds = timed(lambda: ours(images, mask))
            b, theirs_seconds = timed(lambda: theirs(pixel_values=images, pixel_mask=(~mask).long()))
        ours_dir = out / f"ours-{variant}"
        shutil.rmtree(ours_dir, ignore_errors=True)
        save_pretrained_deformable(ours, ours_dir)
        back = transformers.DeformableDetrForObjectDetection.from_pretrained(ours_dir).eval()
        with torch.no_grad():
            c = back(pixel_values=images, pixel_mask=(~mask).long())
        print(f"{variant}: batch {tuple(images.shape)}, {ours.config.num_queries} queries, "
              f"{ours.config.num_feature_levels} level(s); forward ours {ours_seconds:.1f} s, transformers "
              f"{theirs_seconds:.1f} s\n"
              f"  transformers → detr: max |Δ logits| {(a.logits - b.logits).abs().max():.2e}, "
              f"max |Δ boxes| {(a.boxes - b.pred_boxes).abs().max():.2e}\n"
              f"  detr → transformers: max |Δ logits| {(a.logits - c.logits).abs().max():.2e}, "
              f"max |Δ boxes| {(a.boxes - c.pred_boxes).abs().max():.2e}", flush=True)


if __name__ == "__main__":
    main()
