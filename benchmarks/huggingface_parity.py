"""Full-size parity and load times against Hugging Face transformers: DETR R50 and R50-DC5 (timm backbone).

    .venv/bin/python benchmarks/huggingface_parity.py [--out /tmp/hf_parity] [--repeats 3]

For each model: a transformers ``DetrForObjectDetection`` with random weights (91 COCO labels) is saved
with ``save_pretrained``; ``detr.load_checkpoint`` loads the directory (median of ``--repeats`` loads);
both run on a padded batch of two photos (800 × 1203 and 800 × 800); then this project's
``save_pretrained`` writes it back and transformers' ``from_pretrained`` reads it. Printed: load and save
times, and the max abs differences of logits and boxes in both directions. Needs transformers and timm.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
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
from detr.checkpoints.huggingface import save_pretrained  # noqa: E402
from detr.data.collate import pad_images  # noqa: E402
from detr.data.transforms import IMAGENET_MEAN, IMAGENET_STD  # noqa: E402
from tests.helpers import randomise  # noqa: E402

PHOTOS = Path(__file__).resolve().parents[1] / "data" / "photos"


def photo_batch() -> tuple[torch.Tensor, torch.Tensor]:
    mean, std = torch.tensor(IMAGENET_MEAN)[:, None, None], torch.tensor(IMAGENET_STD)[:, None, None]
    tensors = []
    for name, size in (("chelsea.png", (1203, 800)), ("astronaut.png", (800, 800))):
        image = Image.open(PHOTOS / name).convert("RGB").resize(size, Image.BILINEAR)
        pixels = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float() / 255
        tensors.append((pixels - mean) / std)
    return pad_images(tensors)


def timed(fn, repeats: int):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return result, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="/tmp/hf_parity", help="scratch folder for the saved directories")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import transformers

    print(describe_machine(), f"\ntransformers {transformers.__version__}", flush=True)
    images, mask = photo_batch()
    coco = CategoryMap.coco()
    out = Path(args.out)
    for dilation in (False, True):
        tag = "R50-DC5" if dilation else "R50"
        config = transformers.DetrConfig(backbone="resnet50", use_timm_backbone=True, use_pretrained_backbone=False,
                                         dilation=dilation, num_labels=91, id2label=dict(enumerate(coco.names)))
        theirs = transformers.DetrForObjectDetection(config).eval()
        randomise(theirs, 0)
        hf_dir = out / f"hf-{tag}"
        shutil.rmtree(hf_dir, ignore_errors=True)
        theirs.save_pretrained(hf_dir)
        ours, load_seconds = timed(lambda: detr.load_checkpoint(hf_dir), args.repeats)
        with torch.no_grad():
            a = ours(images, mask)
            b = theirs(pixel_values=images, pixel_mask=(~mask).long())
        ours_dir = out / f"ours-{tag}"
        shutil.rmtree(ours_dir, ignore_errors=True)
        _, save_seconds = timed(lambda: save_pretrained(ours, ours_dir), 1)
        back, from_pretrained_seconds = timed(
            lambda: transformers.DetrForObjectDetection.from_pretrained(ours_dir).eval(), 1)
        with torch.no_grad():
            c = back(pixel_values=images, pixel_mask=(~mask).long())
        print(f"{tag}: batch {tuple(images.shape)}; category map is COCO's: {ours.meta.category_map == coco}\n"
              f"  detr.load_checkpoint(transformers dir) median {load_seconds:.2f} s; save_pretrained "
              f"{save_seconds:.2f} s; transformers from_pretrained {from_pretrained_seconds:.2f} s\n"
              f"  transformers → detr: max |Δ logits| {(a.logits - b.logits).abs().max():.2e}, "
              f"max |Δ boxes| {(a.boxes - b.pred_boxes).abs().max():.2e}\n"
              f"  detr → transformers: max |Δ logits| {(a.logits - c.logits).abs().max():.2e}, "
              f"max |Δ boxes| {(a.boxes - c.pred_boxes).abs().max():.2e}", flush=True)


if __name__ == "__main__":
    main()
