"""CPU inference of Deformable DETR beside transformers' ``DeformableDetrForObjectDetection``, same weights.

    .venv/bin/python benchmarks/deformable_speed.py [--threads 2] [--repeats 5] [--components]
    .venv/bin/python benchmarks/deformable_speed.py --variant plain --size 800 1066 --kernels grid_sample

The model is the paper's size (R50 from timm, 256 wide, 6 + 6 layers, 8 heads, 4 levels × 4 points, FFN 1024,
300 queries, 91 labels), iterative box refinement and two-stage by default (``--variant``), random weights
(speed does not depend on them). transformers builds it and ``save_pretrained`` writes it; ``detr.load_checkpoint``
reads the directory and ``optimize_for_inference`` prepares it as the Predictor does (frozen BatchNorms folded,
channels-last backbone). Both run a forward and their post-processing (transformers' image processor's
``post_process_object_detection``, ours ``PostProcess(top_k=100)``) on one photo resized to ``--size`` (800 × 1066
by default), float32, batch 1, ``torch.inference_mode``; every repeat runs each side once, in alternating order,
after one warm-up round. With ``--kernels``, ours runs once per bilinear sampling kernel of the deformable
attention (``use_bilinear_kernel``), each in the same rounds. Printed: the largest differences of logits and boxes
against transformers, medians (min-max) and the ratio ours / transformers; ``--components`` adds the medians of
backbone (with the input projections), encoder, decoder and the rest, timed by forward hooks.
Results: docs/measurements/speed.md. Needs transformers and timm.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.helpers

from machine import describe_machine  # noqa: E402
from realtime_speed import Stopwatch, median_text  # noqa: E402

import detr  # noqa: E402
from detr.data.transforms import IMAGENET_MEAN, IMAGENET_STD  # noqa: E402
from detr.inference.postprocess import PostProcess  # noqa: E402
from detr.models.layers.deformable_attention import BILINEAR_KERNELS, use_bilinear_kernel  # noqa: E402
from tests.helpers import randomise  # noqa: E402

PHOTO = Path(__file__).resolve().parents[1] / "data" / "photos" / "chelsea.png"
VARIANTS = {"plain": {}, "box_refine": {"with_box_refine": True},
            "two_stage": {"with_box_refine": True, "two_stage": True}}
COMPONENTS = ("backbone", "encoder", "decoder", "rest", "post-processing")


def photo(height: int, width: int) -> torch.Tensor:
    """The chelsea photo resized to height × width and normalised with ImageNet's mean and std: [1, 3, h, w]."""
    pixels = np.asarray(Image.open(PHOTO).convert("RGB").resize((width, height), Image.BILINEAR))
    tensor = torch.from_numpy(pixels.copy()).permute(2, 0, 1).float() / 255
    return ((tensor - torch.tensor(IMAGENET_MEAN)[:, None, None]) / torch.tensor(IMAGENET_STD)[:, None, None])[None]


def watch_ours(watch: Stopwatch, model) -> None:
    watch.watch("model", model)
    for stage in model.backbone[0].body.values():  # multi_scale_features runs the stages one by one
        watch.watch("backbone", stage)
    for projection in model.input_proj:
        watch.watch("backbone", projection)
    watch.watch("encoder", model.transformer.encoder)
    watch.watch("decoder", model.transformer.decoder)


def watch_theirs(watch: Stopwatch, model) -> None:
    inner = model.model
    watch.watch("model", model)
    watch.watch("backbone", inner.backbone)
    for projection in inner.input_proj:
        watch.watch("backbone", projection)
    watch.watch("encoder", inner.encoder)
    watch.watch("decoder", inner.decoder)


def components(seconds: dict[str, float]) -> dict[str, float]:
    parts = dict(seconds)
    parts["rest"] = parts.pop("model") - parts["backbone"] - parts["encoder"] - parts["decoder"]
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=list(VARIANTS), default="two_stage")
    parser.add_argument("--size", type=int, nargs=2, default=(800, 1066), metavar=("HEIGHT", "WIDTH"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--kernels", nargs="+", choices=BILINEAR_KERNELS, default=["grid_sample"],
                        help="the deformable attention's bilinear kernels to time ours with")
    parser.add_argument("--components", action="store_true", help="also time each side's parts")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    from detr.categories import CategoryMap

    config = transformers.DeformableDetrConfig(
        backbone="resnet50", use_timm_backbone=True, use_pretrained_backbone=False, num_labels=91,
        id2label=dict(enumerate(CategoryMap.coco().names)), **VARIANTS[args.variant])
    torch.manual_seed(0)
    theirs = transformers.DeformableDetrForObjectDetection(config).eval()
    randomise(theirs, 0)
    with tempfile.TemporaryDirectory() as directory:
        theirs.save_pretrained(directory)
        ours = detr.load_checkpoint(directory).optimize_for_inference()
    processor = transformers.DeformableDetrImageProcessor()
    postprocess = PostProcess("sigmoid", top_k=100)
    images = photo(*args.size)
    mask = torch.zeros(1, *args.size, dtype=torch.bool)
    sizes = torch.tensor([args.size])

    watches = {"transformers": Stopwatch()}
    watch_theirs(watches["transformers"], theirs)
    for kernel in args.kernels:
        watches[kernel] = Stopwatch()
    # one model, its kernel switched per run: the hooks of every kernel's watch stay on it, so each run clears
    # and reads only its own watch
    watch_ours_model = Stopwatch()
    watch_ours(watch_ours_model, ours)

    def run_theirs() -> None:
        outputs = theirs(pixel_values=images, pixel_mask=(~mask).long())
        start = time.perf_counter()
        processor.post_process_object_detection(outputs, threshold=0.0, target_sizes=sizes, top_k=100)
        watches["transformers"].seconds["post-processing"] += time.perf_counter() - start

    def run_ours(kernel: str) -> None:
        use_bilinear_kernel(ours, kernel)
        outputs = ours(images, mask)
        start = time.perf_counter()
        postprocess(outputs, sizes)
        watch_ours_model.seconds["post-processing"] += time.perf_counter() - start

    with torch.inference_mode():
        reference = theirs(pixel_values=images, pixel_mask=(~mask).long())
        for kernel in args.kernels:
            use_bilinear_kernel(ours, kernel)
            output = ours(images, mask)
            print(f"{kernel}: max |Δ logits| {(output.logits - reference.logits).abs().max():.2e}, "
                  f"max |Δ boxes| {(output.boxes - reference.pred_boxes).abs().max():.2e}", flush=True)
    load_before = os.getloadavg()
    sides = ["transformers", *args.kernels]
    times: dict[str, list[float]] = defaultdict(list)
    parts: dict[str, dict[str, list[float]]] = {side: defaultdict(list) for side in sides}
    with torch.inference_mode():
        for repeat in range(args.repeats + 1):  # round 0: warm-up
            for side in (sides if repeat % 2 == 0 else sides[::-1]):
                watch = watches["transformers"] if side == "transformers" else watch_ours_model
                watch.clear()
                start = time.perf_counter()
                run_theirs() if side == "transformers" else run_ours(side)
                elapsed = time.perf_counter() - start
                if repeat:
                    times[side].append(elapsed)
                    for part, value in components(watch.seconds).items():
                        parts[side][part].append(value)
            print(f"round {repeat} done, load average {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    print(describe_machine())
    print(f"transformers {transformers.__version__}; load average before the timed rounds "
          f"{' '.join(f'{v:.1f}' for v in load_before)}, after {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    print(f"Deformable DETR ({args.variant}), 1 × {args.size[0]} × {args.size[1]}, {args.repeats} alternating "
          "repeats, medians (min-max) in seconds\n")
    theirs_median = statistics.median(times["transformers"])
    print("| run | seconds | / transformers |")
    print("|---|---|---|")
    for side in sides:
        label = "transformers" if side == "transformers" else f"ours (optimized, {side})"
        print(f"| {label} | {median_text(times[side])} | {statistics.median(times[side]) / theirs_median:.2f} |")
    if args.components:
        print("\nmedians in ms")
        print("| part | " + " | ".join(sides) + " |")
        print("|---|" + "---|" * len(sides))
        for part in COMPONENTS:
            print(f"| {part} | " + " | ".join(f"{statistics.median(parts[side][part]) * 1e3:.0f}"
                                             for side in sides) + " |")


if __name__ == "__main__":
    main()
