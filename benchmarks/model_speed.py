"""Model speed: R50 forward latency at COCO size (fp32 and bf16 autocast) and a tiny training step.

    .venv/bin/python benchmarks/model_speed.py [--repeats 5] [--height 800 --width 1066] [--skip-r50]

Prints the machine, then one line per measurement (median over repeats, after warm-up). Random
weights: speed does not depend on them. Measurements and targets: docs/measurements/speed.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext

import torch
from machine import describe_machine

from detr import HungarianMatcher, SetCriterion, build_detr


def timed(fn, repeats: int, warmup: int, device: torch.device) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def forward_latency(device: torch.device, height: int, width: int, repeats: int, optimized: bool) -> dict[str, float]:
    torch.manual_seed(0)
    model = build_detr().eval().to(device)
    variant = "as built"
    if optimized:
        model.optimize_for_inference()
        variant = "optimize_for_inference (BN folded, channels_last)"
    images = torch.randn(1, 3, height, width, device=device)
    mask = torch.zeros(1, height, width, dtype=torch.bool, device=device)
    results, boxes = {}, {}
    for precision in ("fp32", "bf16"):
        autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext())

        def run():
            with torch.inference_mode(), autocast:
                boxes[precision] = model(images, mask).boxes.float()

        times = timed(run, repeats, warmup=2, device=device)
        results[precision] = statistics.median(times)
        print(f"R50 forward {height}x{width} batch 1 {device.type} {precision} [{variant}]: "
              f"median {results[precision]:.3f} s (min {min(times):.3f}, max {max(times):.3f}, n={repeats})",
              flush=True)
    difference = (boxes["bf16"] - boxes["fp32"]).abs().max().item()
    print(f"  bf16 vs fp32 boxes, max abs difference (normalised, random weights): {difference:.4f}")
    return results


def training_step_time(repeats: int) -> float:
    torch.manual_seed(0)
    model = build_detr(backbone="resnet18", hidden_dim=128, num_heads=8, num_encoder_layers=3,
                       num_decoder_layers=3, dim_feedforward=512, num_queries=20, num_classes=5).train()
    criterion = SetCriterion(5, HungarianMatcher(), num_decoder_layers=3)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, weight_decay=1e-4)
    images, mask = torch.randn(16, 3, 128, 128), torch.zeros(16, 128, 128, dtype=torch.bool)
    targets = [{"labels": torch.randint(0, 5, (3,)), "boxes": torch.rand(3, 4) * 0.4 + 0.3} for _ in range(16)]

    def step():
        losses = criterion(model(images, mask), targets)
        loss = sum(losses[k] * w for k, w in criterion.weight_dict.items())
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        optimizer.step()

    times = timed(step, repeats, warmup=2, device=torch.device("cpu"))
    median = statistics.median(times)
    print(f"tiny training step (R18, hidden 128, 3+3 layers, 20 queries, batch 16 at 128x128) cpu fp32: "
          f"median {median:.3f} s = {16 / median:.1f} images/s (n={repeats})", flush=True)
    return median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--height", type=int, default=800)
    parser.add_argument("--width", type=int, default=1066)
    parser.add_argument("--skip-r50", action="store_true", help="only the tiny training step")
    args = parser.parse_args()
    print(describe_machine(), flush=True)
    if not args.skip_r50:
        for optimized in (False, True):
            forward_latency(torch.device("cpu"), args.height, args.width, args.repeats, optimized)
            if torch.cuda.is_available():
                forward_latency(torch.device("cuda"), args.height, args.width, max(args.repeats, 20), optimized)
    training_step_time(args.repeats)


if __name__ == "__main__":
    main()
