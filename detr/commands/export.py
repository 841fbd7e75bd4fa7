"""Export a DETR checkpoint to ONNX, OpenVINO or a torch.export .pt2 program, and verify the file.

    detr-export detr-r50-e632da11.pth --format onnx --out detr-r50.onnx
    detr-export RUN/checkpoints/last.ckpt --postprocess --out detector.onnx  # scores, labels, pixel boxes in the graph
    detr-export last.ckpt --format openvino --out detector.xml  # OpenVINO IR (+ detector.bin), fp32, CPU
    detr-export last.ckpt --format openvino --out detector.xml --evaluate data/coco-mini/val2017 \
        data/coco-mini/annotations/instances_val2017.json      # the accuracy gate: AP of the file, latency

CHECKPOINT is anything detr.load_checkpoint reads. Batch, height and width are dynamic. The file is run
(ONNX Runtime for .onnx, OpenVINO for .xml) on a padded batch of two sizes and on one image of a third size and compared with
the PyTorch model; the differences are printed. If they exceed the tolerance the file is renamed to
OUT.failed and the exit status is 1. Run the file with: detr-predict IMAGES --checkpoint OUT.

With --evaluate IMAGES JSON (a COCO-format set) the PyTorch model and the file are then both evaluated on it,
one image at a time: one table of box AP, AP50, latency (median, p95) and file size. If the file loses more
than --max-ap-drop AP points it is renamed to OUT.failed and the exit status is 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from detr.inference.command_line import add_checkpoint_argument, one_line_errors


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_argument(parser, positional=True)
    parser.add_argument("--out", required=True, help="output file (.onnx, .xml or .pt2)")
    # detr.checkpoints.export.FORMAT_SUFFIXES' keys, written out so that --help does not wait for torch
    parser.add_argument("--format", choices=("onnx", "openvino", "pt2"), default="onnx",
                        help="onnx (ONNX Runtime), openvino (an OpenVINO IR: .xml and its .bin, run on the CPU) or "
                             "pt2 (torch.export program; torch.export.load)")
    parser.add_argument("--postprocess", action="store_true",
                        help="put the post-processing in the graph: input orig_sizes [B, 2] (h, w); outputs "
                             "scores, labels, boxes (pixel xyxy)")
    parser.add_argument("--evaluate", nargs=2, metavar=("IMAGES", "JSON"), default=None,
                        help="the accuracy gate: evaluate the PyTorch model and the exported file on this COCO-format "
                             "set (image folder, annotation json) and print AP and latency side by side")
    parser.add_argument("--max-ap-drop", type=float, default=None,
                        help="AP points (0-100) the file may lose against PyTorch under --evaluate "
                             "(default: detr.inference.gate.MAX_AP_DROP, 1)")
    args = parser.parse_args(argv)
    from detr.checkpoints import load_checkpoint  # after --help: torch
    from detr.checkpoints.export import FORMAT_SUFFIXES, export
    from detr.checkpoints.formats import ExportError
    from detr.inference.gate import MAX_AP_DROP, accuracy_gate
    from detr.inference.predictor import Predictor

    if args.max_ap_drop is None:
        args.max_ap_drop = MAX_AP_DROP
    suffix = FORMAT_SUFFIXES[args.format]
    if not args.out.endswith(suffix):  # the predictor chooses its backend by the suffix
        parser.error(f"--out must end in {suffix} for --format {args.format}, got {args.out}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    model = load_checkpoint(args.checkpoint)
    try:
        verification = export(model, args.out, format=args.format, postprocess=args.postprocess)
    except ExportError as error:
        print(f"export failed: {error}", file=sys.stderr)
        return 1
    print(f"verified {args.out} against the PyTorch model (max abs differences):")
    print(verification.table())
    if args.evaluate is None:
        return 0
    images, annotations = args.evaluate
    reference = Predictor(model, device="cpu", optimize=True)
    artifact = Predictor.from_checkpoint(args.out, device="cpu")
    source = Path(args.checkpoint)
    report = accuracy_gate(reference, {Path(args.out): artifact}, images, annotations,
                           max_ap_drop=args.max_ap_drop, reference_path=source if source.is_file() else None)
    print(report.table())
    if not report.passed:
        failed = Path(args.out).with_name(Path(args.out).name + ".failed")
        Path(args.out).replace(failed)
        print(f"accuracy gate failed: {args.out} loses {report.drop(report.artifacts[0]):.2f} AP points "
              f"(at most {args.max_ap_drop:g}); moved to {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
