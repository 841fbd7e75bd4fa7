"""The two backbone layouts a CPU training step uses, measured one piece at a time (docs/measurements/speed.md).

    PYTHONPATH=. .venv/bin/python benchmarks/backbone_layouts.py [--height 512 --width 683] [--threads 2]

1. The frozen stem and layer1 of DETR-R50 (BatchNorms folded as in training), forward, batch 2: NCHW throughout,
   NHWC up to the max pooling, NHWC through layer1 (what ``Backbone.forward_with_stages`` does on the CPU), each
   ending in NCHW for layer2.
2. Each stage's strided 1 × 1 shortcut (layer2's, layer3's, layer4's at that input size), forward and backward:
   the strided convolution against an unstrided one on every second pixel (what ``conv_frozen_norm`` runs on the
   CPU), with the largest difference of their outputs.

Medians of ``--repeats`` runs after two warm-ups, every variant alternating with the others.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from detr import build_detr
from detr.models.backbone import _folded_stage, conv_frozen_norm


def median_ms(variants: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    for run in variants.values():
        run(), run()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, run in variants.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(values) for name, values in times.items()}


def frozen_stages(body: torch.nn.ModuleDict, images: torch.Tensor, nhwc_until: str | None) -> torch.Tensor:
    """The stem and layer1, NHWC up to and including ``nhwc_until`` (None: NCHW throughout), then NCHW."""
    features = images.contiguous(memory_format=torch.channels_last) if nhwc_until else images
    for name, stage in body.items():
        if name == "conv1":
            features = conv_frozen_norm(stage, body["bn1"], features)
        elif name != "bn1":
            features = _folded_stage(stage, features)
        if name == nhwc_until:
            features = features.contiguous()
        if name == "layer1":
            return features
    raise AssertionError("the backbone has no layer1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--height", type=int, default=512)
    parser.add_argument("--width", type=int, default=683)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    images = torch.randn(2, 3, args.height, args.width)
    body = build_detr().train().backbone[0].body

    print(f"1. DETR-R50's frozen stem and layer1, forward, batch 2 at {args.height}×{args.width}, "
          f"{args.threads} threads (median ms)")
    with torch.no_grad():
        layouts = {"NCHW throughout": None, "NHWC to the max pooling": "maxpool", "NHWC through layer1": "layer1"}
        reference = frozen_stages(body, images, None)
        times = median_ms({label: (lambda until=until: frozen_stages(body, images, until))
                           for label, until in layouts.items()}, args.repeats)
        for label, until in layouts.items():
            difference = (frozen_stages(body, images, until) - reference).abs().max().item()
            print(f"  {label:<26}{times[label]:>9.1f}   max |Δ| {difference:.1e}")

    print("\n2. Each stage's strided 1 × 1 shortcut, forward and backward (median ms)")
    height, width = -(-args.height // 4), -(-args.width // 4)  # layer1's map
    for channels in (256, 512, 1024):
        x = torch.randn(2, channels, height, width, requires_grad=channels > 256)  # layer1's output takes no gradient
        weight = torch.randn(2 * channels, channels, 1, 1, requires_grad=True)
        bias = torch.randn(2 * channels)
        gradient = torch.randn(2, 2 * channels, -(-height // 2), -(-width // 2))
        runs = {"strided": lambda: F.conv2d(x, weight, bias, 2).backward(gradient),
                "every 2nd pixel": lambda: F.conv2d(x[..., ::2, ::2], weight, bias).backward(gradient)}
        times = median_ms(runs, args.repeats)
        with torch.no_grad():
            difference = (F.conv2d(x, weight, bias, 2) - F.conv2d(x[..., ::2, ::2], weight, bias)).abs().max().item()
        print(f"  {channels:>4} → {2 * channels:<5} on {height}×{width}: strided {times['strided']:7.1f}, "
              f"every 2nd pixel {times['every 2nd pixel']:7.1f}   max |Δ| {difference:.1e}")
        height, width = -(-height // 2), -(-width // 2)


if __name__ == "__main__":
    main()
