"""Write interactive attention-explorer pages: one self-contained HTML file per image.

    detr-explore photo.jpg --checkpoint detr-r50-e632da11.pth --out explorer/
    detr-explore data/photos/*.png --checkpoint RUN/checkpoints/last.ckpt --out explorer/ --threshold 0.5

Open <out>/<image stem>.html (or <out>/index.html for several images) in any browser; no server or
network is needed. An image that cannot be read or run is reported and skipped (exit status 1), the
other pages are written. The page shows every query's box, decoder cross-attention per layer and head, top-5
classes, boxes per decoder layer, and encoder self-attention for any clicked pixel; for a Deformable DETR, the
clicked query's sampling points per level and head, sized by their weights, instead of the maps.
The pages themselves: detr.visualize.explorer.
"""

from __future__ import annotations

import argparse
import logging
import sys

from detr.inference.command_line import (
    add_checkpoint_argument,
    add_resize_arguments,
    device_argument,
    one_line_errors,
    probability,
)


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images", nargs="+", metavar="IMAGE")
    add_checkpoint_argument(parser)
    parser.add_argument("--out", required=True, help="output folder for the pages")
    parser.add_argument("--threshold", type=probability, default=None,
                        help="initial score threshold of the box display (default: the checkpoint's validated one, "
                             "else 0.7)")
    add_resize_arguments(parser)
    parser.add_argument("--device", type=device_argument, default=None, help="default: CUDA when available, else CPU")
    args = parser.parse_args(argv)
    from detr.checkpoints import load_checkpoint  # after --help: torch
    from detr.checkpoints.deployed import is_deployed
    from detr.checkpoints.formats import CheckpointError
    from detr.visualize.explorer import write_attention_explorer

    logging.basicConfig(level=logging.INFO, format="%(message)s")

    if is_deployed(args.checkpoint):  # one line, not the PyTorch loader's "not a checkpoint torch can read"
        raise CheckpointError(f"{args.checkpoint} is an exported file: it returns no attention, which the explorer "
                              "shows; pass the PyTorch checkpoint it was exported from")
    model = load_checkpoint(args.checkpoint)
    errors: list[tuple[str, str]] = []
    pages = write_attention_explorer(
        model, args.images, args.out, threshold=args.threshold, min_size=args.min_size, max_size=args.max_size,
        device=args.device, errors=errors,
    )
    for page in pages:
        print(f"{page} ({page.stat().st_size / 2**20:.1f} MiB)")
    if errors:  # each was logged with its reason as it was skipped
        print(f"skipped {len(errors)} image(s): {', '.join(image for image, _ in errors)}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
