"""The CPU cost of multi-scale deformable attention against dense attention, at the paper's sizes.

    .venv/bin/python benchmarks/deformable_attention.py                    # 800 x 1066 input, 1 thread
    .venv/bin/python benchmarks/deformable_attention.py --height 512 --width 683 --threads 2

One attention layer (projections included; forward only, batch 1, float32, ``torch.inference_mode``) at
hidden size 256 and 8 heads, for an input image of the given size, whose ResNet levels are at strides 8,
16, 32 and 64 (Deformable DETR's 4 levels; DETR's encoder sees the stride-32 map alone):

- encoder self-attention: every position of the feature maps attends. Deformable: 4 levels x 4 points per
  head (:class:`detr.models.layers.deformable_attention.MultiScaleDeformableAttention`, grid_sample). Dense:
  ``nn.MultiheadAttention`` (PyTorch's SDPA kernel) over the stride-32 map (the paper's DETR) and over all
  four levels (what dense attention would cost on Deformable DETR's input).
- decoder cross-attention: 300 queries attend to the encoder output, deformable against dense over all levels.

The deformable rows run once per kernel of the same sampling: grid_sample (the authors' PyTorch form, and what
an export writes by default), the "gather" kernel (four index gathers, what ``detr-export --sampling-kernel
gather`` writes for runtimes without a correct GridSample), and the "embedding_bag" kernel (what PyTorch runs
when no gradient is needed: every cell read and weighted in one ``embedding_bag``).

Prints one row per case: the tokens, the median time of ``--repeats`` runs after one warm-up, and the
multiply-accumulates of the attention proper (sampling and weighting for the deformable kind, QK^T and AV
for the dense kind; the linear projections are in the times but not in that column).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from detr.models.layers.deformable_attention import MultiScaleDeformableAttention, use_bilinear_kernel

HIDDEN, HEADS, POINTS, QUERIES = 256, 8, 4, 300


def level_shapes(height: int, width: int) -> list[tuple[int, int]]:
    """The (h, w) of the stride-8, 16, 32 and 64 maps of a ResNet on an image of height x width."""
    shapes = []
    h, w = math.ceil(height / 4), math.ceil(width / 4)  # conv1 + maxpool; then layer2, 3, 4 and the extra conv
    for _ in range(4):
        h, w = math.ceil(h / 2), math.ceil(w / 2)
        shapes.append((h, w))
    return shapes


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def deformable_case(queries: int, shapes: list[tuple[int, int]], repeats: int, kernel: str = "grid_sample") -> float:
    attention = MultiScaleDeformableAttention(HIDDEN, HEADS, len(shapes), POINTS).eval()
    use_bilinear_kernel(attention, kernel)
    tokens = sum(h * w for h, w in shapes)
    query, value = torch.randn(1, queries, HIDDEN), torch.randn(1, tokens, HIDDEN)
    reference = torch.rand(1, queries, len(shapes), 2)
    mask = torch.zeros(1, tokens, dtype=torch.bool)
    return median_seconds(lambda: attention(query, reference, value, shapes, mask), repeats)


def dense_case(queries: int, tokens: int, repeats: int) -> float:
    attention = nn.MultiheadAttention(HIDDEN, HEADS, batch_first=True).eval()
    query, value = torch.randn(1, queries, HIDDEN), torch.randn(1, tokens, HIDDEN)
    return median_seconds(lambda: attention(query, value, value, need_weights=False), repeats)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--height", type=int, default=800)
    parser.add_argument("--width", type=int, default=1066)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-dense-multiscale-encoder", action="store_true",
                        help="skip the slowest case (dense self-attention over every level)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shapes = level_shapes(args.height, args.width)
    all_tokens = sum(h * w for h, w in shapes)
    stride32 = shapes[2][0] * shapes[2][1]
    deformable_macs = lambda q: q * HEADS * len(shapes) * POINTS * (HIDDEN // HEADS) * 5  # 4 bilinear taps + weight
    dense_macs = lambda q, k: 2 * q * k * HIDDEN
    kernels = [("deformable, 4 levels x 4 points", "grid_sample"), ("deformable, the gather kernel", "gather"),
               ("deformable, the embedding bag", "embedding_bag")]
    cases = [("encoder", kind, all_tokens, all_tokens,
              lambda kernel=kernel: deformable_case(all_tokens, shapes, args.repeats, kernel),
              deformable_macs(all_tokens)) for kind, kernel in kernels]
    cases += [
        ("encoder", "dense, stride-32 map (DETR)", stride32, stride32,
         lambda: dense_case(stride32, stride32, args.repeats), dense_macs(stride32, stride32)),
    ]
    if not args.skip_dense_multiscale_encoder:
        cases.append(("encoder", "dense, all 4 levels", all_tokens, all_tokens,
                      lambda: dense_case(all_tokens, all_tokens, 1), dense_macs(all_tokens, all_tokens)))
    cases += [("decoder", kind, QUERIES, all_tokens,
               lambda kernel=kernel: deformable_case(QUERIES, shapes, args.repeats, kernel), deformable_macs(QUERIES))
              for kind, kernel in kernels]
    cases += [
        ("decoder", "dense, all 4 levels", QUERIES, all_tokens,
         lambda: dense_case(QUERIES, all_tokens, args.repeats), dense_macs(QUERIES, all_tokens)),
        ("decoder", "dense, stride-32 map (DETR)", QUERIES, stride32,
         lambda: dense_case(QUERIES, stride32, args.repeats), dense_macs(QUERIES, stride32)),
    ]
    print(f"input {args.height} x {args.width}: levels {shapes} = {all_tokens} tokens; stride 32: {stride32}; "
          f"{args.threads} thread(s), torch {torch.__version__}")
    print(f"{'layer':<8} {'attention':<34} {'queries':>8} {'keys':>8} {'ms':>10} {'attention GMAC':>15}")
    with torch.inference_mode():
        for layer, kind, queries, keys, run, macs in cases:
            print(f"{layer:<8} {kind:<34} {queries:>8} {keys:>8} {run() * 1000:>10.1f} {macs / 1e9:>15.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
