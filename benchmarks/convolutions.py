"""A training step's convolutions on the CPU, one at a time: oneDNN's direct kernel against the algorithm
``detr.models.layers.conv_norm.training_conv`` picks (Winograd's F(4 × 4, 3 × 3) for wide 3 × 3 ones, NHWC for
depthwise 5 × 5 ones), forward and backward (the input's and the weight's gradients), and each one's distance from
the float64 convolution.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/convolutions.py [--threads 2] [--repeats 5] [--batch 2]

The shapes are those of RT-DETR-R18's and D-FINE-S's steps at 640 × 640 and DETR-R50's at 512 × 683 (batch 2, or
``--batch``); each time is the fastest of ``--repeats`` after a warm-up (ms); error: the largest difference from
float64 relative to the largest value, of the output and of both gradients. "used" says whether ``training_conv`` takes the other
algorithm for that shape (``winograd_pays``: the thresholds come from this table). Results:
docs/measurements/speed.md, "Winograd".
"""

from __future__ import annotations

import argparse
import os
import time

if "OMP_WAIT_POLICY" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # before torch starts its OpenMP pool

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from detr.models.layers.cpu_kernels import depthwise_conv_nhwc  # noqa: E402
from detr.models.layers.winograd import winograd_conv3x3, winograd_pays  # noqa: E402

#: (input [N, C, H, W], output channels, kernel, groups)
SHAPES = [((2, 256, 80, 80), 256, 3, 1), ((2, 256, 40, 40), 256, 3, 1), ((2, 512, 40, 40), 512, 3, 1),
          ((2, 128, 80, 80), 128, 3, 1), ((2, 256, 64, 86), 256, 3, 1), ((2, 128, 64, 86), 128, 3, 1),
          ((2, 128, 40, 40), 128, 3, 1), ((2, 256, 20, 20), 256, 3, 1), ((2, 512, 20, 20), 512, 3, 1),
          ((2, 64, 160, 160), 64, 3, 1), ((2, 64, 80, 80), 64, 3, 1),
          ((2, 64, 40, 40), 64, 5, 64), ((2, 128, 20, 20), 128, 5, 128)]


def fastest(function, repeats: int) -> float:
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=2, help="images per batch (the shapes' first dimension)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}")
    print("| input | filter | direct (ms) | other (ms) | other / direct | used | error direct | error other |")
    print("|---|---|---|---|---|---|---|---|")
    generator = torch.Generator().manual_seed(0)
    for shape, out_channels, kernel, groups in SHAPES:
        shape = (args.batch, *shape[1:])
        conv = torch.nn.Conv2d(shape[1], out_channels, kernel, padding=kernel // 2, groups=groups, bias=False)
        x = torch.randn(shape, generator=generator).requires_grad_()
        weight = (torch.randn(conv.weight.shape, generator=generator) * 0.05).requires_grad_()
        grad = torch.randn(shape[0], out_channels, *shape[2:], generator=generator)

        def direct(x, weight):
            return F.conv2d(x, weight, None, 1, kernel // 2, 1, groups)

        if kernel == 3:
            other, used, name = (lambda x, weight: winograd_conv3x3(x, weight)), winograd_pays(conv, x), "Winograd"
        else:
            other, name = (lambda x, weight: depthwise_conv_nhwc(conv, x, weight, None)), "NHWC"
            used = True
        exact = [t.double().detach().requires_grad_() for t in (x, weight)]
        exact_out = direct(*exact)
        exact_out.backward(grad.double())
        errors = []
        for function in (direct, other):
            leaves = [t.detach().clone().requires_grad_() for t in (x, weight)]
            out = function(*leaves)
            out.backward(grad)
            errors.append(max(float((a.double() - b).abs().max() / b.abs().max())
                              for a, b in ((out.detach(), exact_out.detach()), (leaves[0].grad, exact[0].grad),
                                           (leaves[1].grad, exact[1].grad))))
        times = [fastest(lambda function=function: function(x, weight).backward(grad), args.repeats)
                 for function in (direct, other)]
        filter_text = f"{out_channels} × {shape[1] // groups} × {kernel} × {kernel}" + (
            " depthwise" if groups > 1 else "")
        print(f"| {' × '.join(map(str, shape))} | {filter_text} | {times[0]:.1f} | {times[1]:.1f} ({name}) | "
              f"{times[1] / times[0]:.2f} | {'yes' if used else 'no'} | {errors[0]:.1e} | {errors[1]:.1e} |",
              flush=True)


if __name__ == "__main__":
    main()
