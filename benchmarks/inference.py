"""Images per second of detr.Predictor for DETR R50 at COCO size, fp32 and bf16 (or fp16), CPU and CUDA.

    python benchmarks/inference.py                       # R50, 800 x 1066, every device present
    python benchmarks/inference.py --devices cpu --iterations 3 --warmup 1
    python benchmarks/inference.py --devices cuda --batch-size 4 --iterations 50
    python benchmarks/inference.py --devices cuda --precisions fp32 bf16 fp16

Random-init weights (speed does not depend on the values). The model gets ``optimize_for_inference()``
as in ``Predictor.from_checkpoint`` (``--no-optimize`` to compare). The timed call is the whole
``Predictor.predict`` on uint8 arrays: eval resize and normalisation, padding, the model under
``torch.inference_mode`` (and bf16 or fp16 autocast), post-processing and the threshold. The image is already at
the eval size (800 x 1066), so the resize is a no-op copy. The paper's figure is 28 FPS for R50 on a V100
at batch 1 (Carion et al. 2020, Table 1).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from machine import describe_machine

from detr import build_detr
from detr.inference.predictor import AUTOCAST_DTYPES, Predictor


def measure(predictor: Predictor, images: list[np.ndarray], *, warmup: int, iterations: int) -> list[float]:
    """Seconds per call of ``predictor.predict(images)`` for ``iterations`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        predictor.predict(images)
    times = []
    for _ in range(iterations):
        if predictor.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        predictor.predict(images)  # results come back to the CPU, which synchronises
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", default="resnet50")
    parser.add_argument("--dilation", action="store_true", help="DC5 variant")
    parser.add_argument("--height", type=int, default=800)
    parser.add_argument("--width", type=int, default=1066)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--devices", nargs="+", default=None, help="default: cpu, and cuda when present")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=list(AUTOCAST_DTYPES))
    parser.add_argument("--warmup", type=int, default=None, help="default: 1 on CPU, 5 on CUDA")
    parser.add_argument("--iterations", type=int, default=None, help="default: 3 on CPU, 30 on CUDA")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--no-optimize", action="store_true",
                        help="skip model.optimize_for_inference() (BN folding, channels-last backbone)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = args.devices or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])

    print(describe_machine())
    torch.manual_seed(0)
    model = build_detr(backbone=args.backbone, dilation=args.dilation, pretrained_backbone=False).eval()
    if not args.no_optimize:
        model.optimize_for_inference()  # what Predictor.from_checkpoint does
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (args.height, args.width, 3), dtype=np.uint8) for _ in range(args.batch_size)]
    variant = f"{args.backbone}{'-dc5' if args.dilation else ''}"
    optimized = "plain model" if args.no_optimize else "optimize_for_inference"
    print(f"DETR {variant}, {args.height}x{args.width}, batch {args.batch_size}, {optimized}")
    print(f"{'device':<8}{'precision':<11}{'images/s':>10}{'s/image':>10}{'calls':>7}")
    for device in devices:
        cuda = device.startswith("cuda")
        warmup = args.warmup if args.warmup is not None else (5 if cuda else 1)
        iterations = args.iterations if args.iterations is not None else (30 if cuda else 3)
        for precision in args.precisions:
            predictor = Predictor(model, device=device, precision=precision, batch_size=args.batch_size)
            times = measure(predictor, images, warmup=warmup, iterations=iterations)
            per_image = statistics.median(times) / len(images)
            print(f"{device:<8}{precision:<11}{1 / per_image:>10.2f}{per_image:>10.3f}{iterations:>7}")


if __name__ == "__main__":
    main()
