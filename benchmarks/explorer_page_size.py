"""How large an attention-explorer page is, and what it is made of, at a real photo's size.

    .venv/bin/python benchmarks/explorer_page_size.py                     # Deformable DETR, the authors' size
    .venv/bin/python benchmarks/explorer_page_size.py --architecture detr  # the paper's DETR, 100 queries
    .venv/bin/python benchmarks/explorer_page_size.py --photo my.jpg --min-size 800 --max-size 1333

Builds a random-weight model at the authors' size (R50, 256 wide, 6 + 6 layers, 8 heads; Deformable DETR:
4 levels x 4 points, FFN 1024, 300 queries, 91 classes, box refinement with ``--box-refine``), writes the
photo's page with :func:`detr.visualize.explorer.write_attention_explorer` (the eval resize, the image run
alone) and prints the page's bytes with the parts of its data: the attention, the JPEG, the boxes and the
classes. The attention is stored in fixed-width codes, so its size does not depend on the weights; the boxes'
and classes' JSON only by a few digits.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path

import torch

from detr import build_detr
from detr.visualize.explorer import write_attention_explorer

REPO = Path(__file__).resolve().parents[1]
DATA_BLOCK = re.compile(r'<script type="application/json" id="explorer-data">(.*?)</script>', re.S)


def compact(value) -> int:
    """Characters of ``value`` as the page embeds it (compact JSON)."""
    return len(json.dumps(value, separators=(",", ":")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--architecture", choices=("deformable", "detr"), default="deformable")
    parser.add_argument("--box-refine", action="store_true", help="Deformable DETR with box refinement")
    parser.add_argument("--photo", type=Path, default=REPO / "data" / "photos" / "000000039769.png")
    parser.add_argument("--min-size", type=int, default=800)
    parser.add_argument("--max-size", type=int, default=1333)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.architecture == "deformable":
        model = build_detr(architecture="deformable", class_head="sigmoid", num_queries=300, dim_feedforward=1024,
                           num_classes=91, box_refine=args.box_refine)
    else:
        model = build_detr(num_classes=91)
    model.eval()
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        page, = write_attention_explorer(model, [args.photo], folder, device="cpu", min_size=args.min_size,
                                         max_size=args.max_size)
        seconds = time.perf_counter() - start
        text = page.read_text(encoding="utf-8")
    data = json.loads(DATA_BLOCK.search(text).group(1))
    size = len(text.encode("utf-8"))
    attention = {key: compact(data[key]) for key in ("sampling", "decoder", "encoder") if key in data}
    parts = {**attention, "jpeg": len(data["image"]["src"]), "boxes": compact(data["boxes"]),
             "classes": compact(data["top_classes"]) + compact(data["top_probs"])}
    print(f"{args.architecture}: {data['num_queries']} queries, {data['num_layers']} decoder layers, "
          f"{data['num_heads']} heads; input {data['image']['width']} x {data['image']['height']} "
          f"({args.photo.name}); page written in {seconds:.1f} s")
    print(f"page: {size:,} bytes ({size / 1024:,.0f} KiB, {size / 2**20:.2f} MiB)")
    for name, characters in parts.items():
        print(f"  {name:<9} {characters:>12,} bytes")
    if "sampling" in data:  # what keeping the last decoder layer only would weigh
        layers = data["num_layers"]
        last_only = size - attention["sampling"] * (layers - 1) / layers
        print(f"  (the last layer's points alone: a page of about {last_only / 1024:,.0f} KiB)")


if __name__ == "__main__":
    main()
