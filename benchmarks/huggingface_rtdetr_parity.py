"""Full-size parity against Hugging Face transformers for RT-DETR and RT-DETRv2 (random weights, 640 × 640).

    .venv/bin/python benchmarks/huggingface_rtdetr_parity.py [--threads 2] [--repeats 3]
    .venv/bin/python benchmarks/huggingface_rtdetr_parity.py --variants r18 v2_r50 --size 320

For each variant a transformers ``RTDetrForObjectDetection`` / ``RTDetrV2ForObjectDetection`` of the released
models' layout (ResNet-vd 18 with 3 decoder layers or 50 with 6, 256 wide, 8 heads, 3 levels × 4 points, FFN
1024, 300 queries, 80 labels) gets random weights everywhere, is saved with ``save_pretrained`` and loaded with
``detr.load_checkpoint``; both run on two photos resized to ``--size`` squares (pixels / 255). Printed: the max
abs differences of logits and boxes as loaded; after ``optimize_for_inference`` (RepVGG re-parameterised,
BatchNorms folded, the backbone in NHWC: what the Predictor runs), whose float rounding reorders proposals whose
scores tie to 1e-7 in the top-k selection, the same up to query order: the max abs difference of the sorted
sigmoid scores over queries × classes and of each box to the nearest box of transformers' image; and the
median forward time of transformers,
of the model as loaded and optimized, over ``--repeats`` alternating runs after one warm-up each (batch 2,
float32, ``torch.inference_mode``). Needs transformers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.helpers_rtdetr

from machine import describe_machine

import detr
from tests.helpers_rtdetr import hf_model, square_photos

#: The released models' layout: (backbone, version, decoder layers, options of the transformers config).
FULL = {"encoder_hidden_dim": 256, "d_model": 256, "encoder_ffn_dim": 1024, "decoder_ffn_dim": 1024,
        "decoder_in_channels": [256] * 3, "num_queries": 300, "encoder_attention_heads": 8,
        "decoder_attention_heads": 8}
VARIANTS = {
    "r18": ("resnet18", 1, {"decoder_layers": 3}),
    "r50": ("resnet50", 1, {"decoder_layers": 6}),
    "v2_r50": ("resnet50", 2, {"decoder_layers": 6}),
    "v2_r18_discrete": ("resnet18", 2, {"decoder_layers": 3, "decoder_method": "discrete"}),
}


def seconds(fn, *args, **kwargs) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def up_to_query_order(ours, theirs) -> str:
    """"Δ scores / Δ boxes" of two outputs compared as sets of queries: the sorted sigmoid scores over queries ×
    classes, and each of our boxes against the nearest of transformers' boxes of the same image."""
    scores = (ours.logits.sigmoid().flatten(1).sort(dim=1).values
              - theirs.logits.sigmoid().flatten(1).sort(dim=1).values).abs().max()
    nearest = max(float(torch.cdist(a, b, p=float("inf")).min(1).values.max())
                  for a, b in zip(ours.boxes, theirs.pred_boxes))
    return f"{float(scores):.2e} / {nearest:.2e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--size", type=int, default=640)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(describe_machine())
    images = square_photos(args.size)
    mask = torch.zeros(images.shape[0], args.size, args.size, dtype=torch.bool)
    print("| variant | max abs Δ logits / boxes: as loaded | optimized: Δ sorted scores / nearest box | "
          "forward: transformers | ours | optimized |")
    print("|---|---|---|---|---|---|")
    for name in args.variants:
        backbone, version, options = VARIANTS[name]
        hf = hf_model(backbone, 80, version=version, **{**FULL, **options})
        with tempfile.TemporaryDirectory() as directory:
            hf.save_pretrained(directory)
            ours = detr.load_checkpoint(directory)
            optimized = detr.load_checkpoint(directory).optimize_for_inference()
        times: dict[str, list[float]] = {"theirs": [], "ours": [], "optimized": []}
        with torch.inference_mode():  # warm-ups, and the outputs compared
            theirs, mine, fast = hf(pixel_values=images), ours(images, mask), optimized(images, mask)
            for _ in range(args.repeats):
                times["theirs"].append(seconds(hf, pixel_values=images))
                times["ours"].append(seconds(ours, images, mask))
                times["optimized"].append(seconds(optimized, images, mask))
        as_loaded = (f"{float((mine.logits - theirs.logits).abs().max()):.2e} / "
                     f"{float((mine.boxes - theirs.pred_boxes).abs().max()):.2e}")
        deltas = [as_loaded, up_to_query_order(fast, theirs)]
        medians = [f"{statistics.median(times[side]):.2f} s" for side in ("theirs", "ours", "optimized")]
        print(f"| {name} | {' | '.join(deltas)} | {' | '.join(medians)} |", flush=True)


if __name__ == "__main__":
    main()
