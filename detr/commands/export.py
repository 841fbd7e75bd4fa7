"""Export a DETR checkpoint to ONNX (or a torch.export .pt2 program) and verify the file.

    detr-export detr-r50-e632da11.pth --format onnx --out detr-r50.onnx
    detr-export RUN/checkpoints/last.ckpt --postprocess --out detector.onnx   # scores, labels, pixel boxes in the graph

CHECKPOINT is anything detr.load_checkpoint reads. Batch, height and width are dynamic. The file is run
(ONNX Runtime for .onnx) on a padded batch of two sizes and on one image of a third size and compared with
the PyTorch model; the differences are printed. If they exceed the tolerance the file is renamed to
OUT.failed and the exit status is 1. Run the .onnx with: detr-predict IMAGES --checkpoint OUT.
"""

from __future__ import annotations

import argparse
import logging
import sys

from detr.inference.command_line import add_checkpoint_argument, one_line_errors


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_argument(parser, positional=True)
    parser.add_argument("--out", required=True, help="output file (.onnx or .pt2)")
    parser.add_argument("--format", choices=("onnx", "pt2"), default="onnx",
                        help="onnx (ONNX Runtime) or pt2 (torch.export program; torch.export.load)")
    parser.add_argument("--postprocess", action="store_true",
                        help="put the post-processing in the graph: input orig_sizes [B, 2] (h, w); outputs "
                             "scores, labels, boxes (pixel xyxy)")
    args = parser.parse_args(argv)
    if not args.out.endswith(f".{args.format}"):  # the predictor chooses its backend by the suffix
        parser.error(f"--out must end in .{args.format} for --format {args.format}, got {args.out}")
    from detr.checkpoints import load_checkpoint  # after --help: torch
    from detr.checkpoints.export import export
    from detr.checkpoints.formats import ExportError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    model = load_checkpoint(args.checkpoint)
    try:
        verification = export(model, args.out, format=args.format, postprocess=args.postprocess)
    except ExportError as error:
        print(f"export failed: {error}", file=sys.stderr)
        return 1
    print(f"verified {args.out} against the PyTorch model (max abs differences):")
    print(verification.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
