"""A training step's convolutions on the CPU, one at a time: oneDNN's direct kernel in NCHW against the way
``detr.models.layers.conv_norm`` runs them (Winograd's F(4 × 4, 3 × 3) for wide 3 × 3 ones, NHWC for depthwise 5 × 5
ones and for the backbones' stride-4 part, a 1 × 1 convolution of an upsampled concatenation by parts), forward and
backward (the inputs' and the weight's gradients), and each one's distance from the float64 convolution; then the
real-time backbones' stride-4 part (stem and first stage) forward and backward in NCHW and in NHWC.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/convolutions.py [--threads 2] [--repeats 5] [--batch 2]

The shapes are those of RT-DETR-R18's and D-FINE-S's steps at 640 × 640 and DETR-R50's at 512 × 683 (batch 2, or
``--batch``); each time is the fastest of ``--repeats`` after a warm-up (ms); error: the largest difference from
float64 relative to the largest value, of the output and of the gradients. "used" says whether a training step
takes the other way for that shape (``winograd_pays``: the thresholds come from this table; ``stride_four_nhwc``:
the layers at stride 4 or less). Results: docs/measurements/speed.md, "Winograd" and "The stride-4 part".
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

if "OMP_WAIT_POLICY" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # before torch starts its OpenMP pool

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from detr.models.dfine.hgnetv2 import HGNetV2  # noqa: E402
from detr.models.layers.conv_norm import UpsampledConcat, concat_conv, direct_convolutions  # noqa: E402
from detr.models.layers.cpu_kernels import depthwise_conv_nhwc  # noqa: E402
from detr.models.layers.winograd import winograd_conv3x3, winograd_pays  # noqa: E402
from detr.models.rtdetr.resnet_vd import ResNetVd  # noqa: E402

#: (input [N, C, H, W], output channels, kernel, groups, stride, the other way: "winograd" (3 × 3), "nhwc" or
#: "concat" (the input's first half a map of half the size, upsampled 2×))
SHAPES = [((2, 256, 80, 80), 256, 3, 1, 1, "winograd"), ((2, 256, 40, 40), 256, 3, 1, 1, "winograd"),
          ((2, 512, 40, 40), 512, 3, 1, 1, "winograd"), ((2, 128, 80, 80), 128, 3, 1, 1, "winograd"),
          ((2, 256, 64, 86), 256, 3, 1, 1, "winograd"), ((2, 128, 64, 86), 128, 3, 1, 1, "winograd"),
          ((2, 128, 40, 40), 128, 3, 1, 1, "winograd"), ((2, 256, 20, 20), 256, 3, 1, 1, "winograd"),
          ((2, 512, 20, 20), 512, 3, 1, 1, "winograd"), ((2, 64, 160, 160), 64, 3, 1, 1, "winograd"),
          ((2, 64, 80, 80), 64, 3, 1, 1, "winograd"),
          ((2, 64, 40, 40), 64, 5, 64, 1, "nhwc"), ((2, 128, 20, 20), 128, 5, 128, 1, "nhwc"),
          ((2, 3, 640, 640), 32, 3, 1, 2, "nhwc"), ((2, 32, 320, 320), 32, 3, 1, 1, "nhwc"),
          ((2, 32, 320, 320), 64, 3, 1, 1, "nhwc"), ((2, 64, 160, 160), 64, 3, 1, 1, "nhwc"),
          ((2, 512, 80, 80), 512, 1, 1, 1, "concat"), ((2, 512, 80, 80), 256, 1, 1, 1, "concat"),
          ((2, 512, 40, 40), 512, 1, 1, 1, "concat")]

#: the backbones whose stride-4 part a training step runs in NHWC: name → a function that builds one
BACKBONES = {"ResNet-18-vd (RT-DETR-R18)": lambda: ResNetVd("resnet18"),
             "HGNetV2-B0 (D-FINE-S)": lambda: HGNetV2("hgnetv2_b0", learnable_affine=True)}


def fastest(function, repeats: int) -> float:
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times) * 1000


def inputs_of(shape, kind: str, generator: torch.Generator) -> list[torch.Tensor]:
    """The leaves a row's convolution reads besides its weight: the map, or a concatenation's two parts."""
    if kind != "concat":
        return [torch.randn(shape, generator=generator)]
    batch, channels, height, width = shape
    return [torch.randn(batch, channels // 2, height // 2, width // 2, generator=generator),
            torch.randn(batch, channels - channels // 2, height, width, generator=generator)]


def convolution_rows(args: argparse.Namespace) -> None:
    print("| input | filter | direct (ms) | other (ms) | other / direct | used | error direct | error other |")
    print("|---|---|---|---|---|---|---|---|")
    generator = torch.Generator().manual_seed(0)
    for shape, out_channels, kernel, groups, stride, kind in SHAPES:
        shape = (args.batch, *shape[1:])
        conv = torch.nn.Conv2d(shape[1], out_channels, kernel, stride, padding=kernel // 2, groups=groups, bias=False)
        leaves = inputs_of(shape, kind, generator) + [torch.randn(conv.weight.shape, generator=generator) * 0.05]
        trained = [shape[1] != 3 or index > 0 for index in range(len(leaves))]  # the images get no gradient
        outputs = conv._conv_forward(torch.empty(1, *shape[1:]), leaves[-1], None).shape[-2:]
        grad = torch.randn(shape[0], out_channels, *outputs, generator=generator)

        def direct(*leaves):
            x = UpsampledConcat(*leaves[:2]).tensor() if kind == "concat" else leaves[0]
            return F.conv2d(x, leaves[-1], None, stride, kernel // 2, 1, groups)

        if kind == "winograd":
            other, used, name = (lambda x, weight: winograd_conv3x3(x, weight)), winograd_pays(conv, leaves[0]), kind
        elif kind == "concat":
            other, used = (lambda coarse, fine, weight: concat_conv(conv, UpsampledConcat(coarse, fine), weight, None)
                           ), True
            name = "by parts"
        elif groups > 1:
            other, used, name = (lambda x, weight: depthwise_conv_nhwc(conv, x, weight, None)), True, "NHWC"
        else:  # a layer of the stride-4 part (stride_four_nhwc), whose maps, weights and gradients are all NHWC
            other, used, name = (lambda x, weight: direct(x, weight)), True, "NHWC"
        nhwc = kind == "nhwc" and groups == 1
        grads = {direct: grad, other: grad.contiguous(memory_format=torch.channels_last) if nhwc else grad}

        def leaves_of(dtype: torch.dtype, function=direct) -> list[torch.Tensor]:
            layout = torch.channels_last if nhwc and function is not direct else torch.contiguous_format
            return [leaf.detach().to(dtype).contiguous(memory_format=layout).requires_grad_(wanted)
                    for leaf, wanted in zip(leaves, trained)]

        exact = leaves_of(torch.float64)
        exact_out = direct(*exact)
        exact_out.backward(grad.double())
        errors = []
        for function in (direct, other):
            copies = leaves_of(torch.float32, function)
            out = function(*copies)
            out.backward(grads[function])
            pairs = [(out.detach(), exact_out.detach())] + [(a.grad, b.grad) for a, b in zip(copies, exact)
                                                             if a.requires_grad]
            errors.append(max(float((a.double() - b).abs().max() / b.abs().max()) for a, b in pairs))
        times = [fastest(lambda function=function, live=leaves_of(torch.float32, function):
                         function(*live).backward(grads[function]), args.repeats) for function in (direct, other)]
        filter_text = f"{out_channels} × {shape[1] // groups} × {kernel} × {kernel}" + (
            " depthwise" if groups > 1 else "") + (f", stride {stride}" if stride > 1 else "")
        input_text = " × ".join(map(str, shape)) + (" (half of it upsampled 2×)" if kind == "concat" else "")
        print(f"| {input_text} | {filter_text} | {times[0]:.1f} | {times[1]:.1f} ({name}) | "
              f"{times[1] / times[0]:.2f} | {'yes' if used else 'no'} | {errors[0]:.1e} | {errors[1]:.1e} |",
              flush=True)


def stride_four_rows(args: argparse.Namespace) -> None:
    """Each backbone (random weights, training mode, frozen norms as released) up to its second stage's input:
    forward and backward (of the sum), all in NCHW (``direct_convolutions``) and in NHWC, as a training step runs
    it (``stride_four_nhwc``)."""
    print("\n| backbone, stem and first stage | NCHW (ms) | NHWC (ms) | NHWC / NCHW |")
    print("|---|---|---|---|")
    images = torch.rand(args.batch, 3, 640, 640, generator=torch.Generator().manual_seed(1))
    for name, build in BACKBONES.items():
        backbone = build().train()
        stem, first = ((backbone.conv1, backbone.res_layers[0]) if isinstance(backbone, ResNetVd)
                       else (backbone.stem, backbone.stages[0]))

        def part(layout: str, backbone=backbone, stem=stem, first=first) -> None:
            x = stem(images.contiguous(memory_format=torch.channels_last) if layout == "NHWC" else images)
            if isinstance(backbone, ResNetVd):
                x = F.max_pool2d(x, kernel_size=3, stride=2, padding=1)
            first(x).contiguous().sum().backward()

        times = {}
        for layout in ("NCHW", "NHWC"):
            with direct_convolutions() if layout == "NCHW" else contextlib.nullcontext():
                times[layout] = fastest(lambda layout=layout: part(layout), args.repeats)
        print(f"| {name} | {times['NCHW']:.1f} | {times['NHWC']:.1f} | {times['NHWC'] / times['NCHW']:.2f} |",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=2, help="images per batch (the shapes' first dimension)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}")
    convolution_rows(args)
    stride_four_rows(args)


if __name__ == "__main__":
    main()
