"""Export a DETR checkpoint to ONNX, OpenVINO or a torch.export .pt2 program, and verify the file.

    detr-export detr-r50-e632da11.pth --format onnx --out detr-r50.onnx
    detr-export RUN/checkpoints/last.ckpt --postprocess --out detector.onnx  # scores, labels, pixel boxes in the graph
    detr-export last.ckpt --format openvino --out detector.xml  # OpenVINO IR (+ detector.bin), fp32, CPU
    detr-export last.ckpt --format openvino --out detector.xml --evaluate data/coco-mini/val2017 \
        data/coco-mini/annotations/instances_val2017.json      # the accuracy gate: AP of the file, latency
    detr-export last.ckpt --format openvino --out detector.xml --int8 --calibration train2017/ \
        --evaluate val2017/ instances_val2017.json              # + detector-int8.xml, both gated

CHECKPOINT is anything detr.load_checkpoint reads, of every family: DETR, Deformable DETR, RT-DETR, D-FINE,
DEIMv2 and RF-DETR. Batch, height and width are dynamic (a model whose input is a fixed square, RT-DETR, D-FINE,
DEIMv2 and RF-DETR, takes that square only: batch dynamic, height and width its eval size). A deformable model's
sampling is GridSample in the file unless --sampling-kernel gather writes it as index gathers. The file is run
(ONNX Runtime for .onnx, OpenVINO for .xml) on a padded batch of two sizes and on one image of a third size and compared with
the PyTorch model; the differences are printed. If they exceed the tolerance the file is renamed to
OUT.failed and the exit status is 1. Run the file with: detr-predict IMAGES --checkpoint OUT.

With --int8 (.onnx or .xml) the verified fp32 file is then quantised after training, calibrated on
--calibration images prepared as the model takes them, into OUT-int8.onnx / OUT-int8.xml (NNCF for OpenVINO,
ONNX Runtime's static QDQ for ONNX; the convolutions, the matrix products stay fp32: see
detr.inference.quantize). --int8-scope all quantises the matrix products too (all but the heads' last layers):
for models whose arithmetic is mostly matrix products, such as RF-DETR's ViT; gate it with --evaluate. An INT8 file
cannot match PyTorch to 1e-4: its accuracy is what --evaluate measures.

With --evaluate IMAGES JSON (a COCO-format set) the PyTorch model and every file written are then evaluated
on it, one image at a time: one table of box AP, AP50, latency (median, p95) and file size. A file that loses
more than --max-ap-drop AP points is renamed to FILE.failed and the exit status is 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from detr.inference.command_line import (
    add_checkpoint_argument,
    non_negative_float,
    one_line_errors,
    positive_int,
)


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
    parser.add_argument("--sampling-kernel", choices=("grid_sample", "gather"), default="grid_sample",
                        help="how deformable attention's bilinear sampling is written: grid_sample (GridSample) or "
                             "gather (index gathers, no GridSample in the file: for TensorRT and runtimes without a "
                             "correct GridSample; the same outputs, verified the same way)")
    parser.add_argument("--evaluate", nargs=2, metavar=("IMAGES", "JSON"), default=None,
                        help="the accuracy gate: evaluate the PyTorch model and the exported file on this COCO-format "
                             "set (image folder, annotation json) and print AP and latency side by side")
    parser.add_argument("--max-ap-drop", type=non_negative_float, default=None,
                        help="AP points (0-100) the file may lose against PyTorch under --evaluate "
                             "(default: detr.inference.gate.MAX_AP_DROP, 1)")
    parser.add_argument("--int8", action="store_true",
                        help="also write OUT-int8.onnx / OUT-int8.xml, quantised after training (needs --calibration)")
    parser.add_argument("--calibration", nargs="+", metavar="IMAGES", default=None,
                        help="image files or folders to calibrate --int8 on (training images, not the --evaluate set)")
    parser.add_argument("--calibration-size", type=positive_int, default=300,
                        help="at most this many calibration images (default 300)")
    parser.add_argument("--int8-scope", choices=("convolutions", "all"), default="convolutions",
                        help="what --int8 quantises: the convolutions (default; the matrix products stay fp32) or all "
                             "(the matrix products too, but the heads' last layers: for ViT models; check --evaluate)")
    args = parser.parse_args(argv)
    from detr.checkpoints import load_checkpoint  # after --help: torch
    from detr.checkpoints.export import FORMAT_SUFFIXES, export
    from detr.checkpoints.formats import ExportError
    from detr.inference.gate import MAX_AP_DROP, accuracy_gate
    from detr.inference.predictor import Predictor
    from detr.inference.quantize import calibration_feeds, quantize

    if args.max_ap_drop is None:
        args.max_ap_drop = MAX_AP_DROP
    suffix = FORMAT_SUFFIXES[args.format]
    if not args.out.endswith(suffix):  # the predictor chooses its backend by the suffix
        parser.error(f"--out must end in {suffix} for --format {args.format}, got {args.out}")
    if args.int8 and args.format == "pt2":
        parser.error("--int8 quantises an .onnx or .xml file: use --format onnx or --format openvino")
    if args.int8 and (not args.calibration or args.postprocess):
        parser.error("--int8 needs --calibration IMAGES (and a file without --postprocess)")
    if args.calibration_size < 1:
        parser.error(f"--calibration-size must be at least 1, got {args.calibration_size}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    model = load_checkpoint(args.checkpoint)
    try:
        verification = export(model, args.out, format=args.format, postprocess=args.postprocess,
                              bilinear_kernel=args.sampling_kernel)
    except ExportError as error:
        print(f"export failed: {error}", file=sys.stderr)
        return 1
    print(f"verified {args.out} against the PyTorch model (max abs differences):")
    print(verification.table())
    written = [Path(args.out)]
    if args.int8:
        out = Path(args.out)
        int8_path = out.with_name(f"{out.stem}-int8{out.suffix}")
        feeds = calibration_feeds(model.input_spec, args.calibration, limit=args.calibration_size)
        quantize(out, int8_path, feeds, scope=args.int8_scope)
        written.append(int8_path)
        what = "convolutions" if args.int8_scope == "convolutions" else "convolutions and matrix products"
        print(f"wrote {int8_path}: INT8 {what} calibrated on {len(feeds)} images"
              + ("" if args.evaluate else "; its accuracy is unchecked: add --evaluate IMAGES JSON for its AP"))
    if args.evaluate is None:
        return 0
    images, annotations = args.evaluate
    reference = Predictor(model, device="cpu", optimize=True)
    artifacts = {path: Predictor.from_checkpoint(path, device="cpu") for path in written}
    source = Path(args.checkpoint)
    report = accuracy_gate(reference, artifacts, images, annotations,
                           max_ap_drop=args.max_ap_drop, reference_path=source if source.is_file() else None)
    print(report.table())
    for row in report.failed:
        failed = row.path.with_name(row.path.name + ".failed")
        row.path.replace(failed)
        print(f"accuracy gate failed: {row.path} loses {report.drop(row):.2f} AP points "
              f"(at most {args.max_ap_drop:g}); moved to {failed}", file=sys.stderr)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
