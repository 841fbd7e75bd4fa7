"""Export a DETR checkpoint to ONNX, OpenVINO or a torch.export .pt2 program, and verify the file.

    detr-export detr-r50-e632da11.pth --format onnx --out detr-r50.onnx
    detr-export RUN/checkpoints/last.ckpt --postprocess --out detector.onnx  # scores, labels, pixel boxes in the graph
    detr-export last.ckpt --format openvino --out detector.xml  # OpenVINO IR (+ detector.bin), fp32, CPU
    detr-export last.ckpt --format openvino --out detector.xml --evaluate data/coco-mini/val2017 \
        data/coco-mini/annotations/instances_val2017.json      # the accuracy gate: AP of the file, latency
    detr-export last.ckpt --format openvino --out detector.xml --int8 --calibration train2017/ \
        --evaluate val2017/ instances_val2017.json              # + detector-int8.xml, both gated

CHECKPOINT is anything detr.load_checkpoint reads, of every family: DETR, Deformable DETR, RT-DETR, D-FINE,
DEIMv2 and RF-DETR; an open-vocabulary model, Grounding DINO, with --prompt 'a cat. a remote control.' baked in
(its phrases the file's classes, each scored by its best token; the text features constants). Batch, height and
width are dynamic (a model whose input is a fixed square, RT-DETR, D-FINE, DEIMv2 and RF-DETR, takes that square
only: batch dynamic, height and width its eval size). A deformable model's
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
on it, one image at a time: one table of box AP, AP50, latency (median, p95) and size (the file's; PyTorch's: its
weights). A file that loses more than --max-ap-drop AP points is renamed to FILE.failed and the exit status is 1.

Every input (the checkpoint, --calibration, --evaluate's set, --out) is checked before the first export step; an
unreadable calibration image is skipped and counted. Each file is written and checked in a hidden folder beside
--out and moved to its name only after it verified (and passed the gate, under --evaluate): an existing file at
--out (or OUT-int8) is replaced then, and the command says so; until then, and whatever fails (the export, the
verification, the gate, a full disk, Ctrl-C or SIGTERM: exit status 130 / 143), it is kept as it was.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from detr.inference.command_line import (
    add_checkpoint_argument,
    keep_output_on_stop,
    non_negative_float,
    one_line_errors,
    positive_int,
)


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_argument(parser, positional=True)
    parser.add_argument("--out", required=True,
                        help="output file (.onnx, .xml or .pt2); an existing one is replaced once the new one has "
                             "verified (and passed --evaluate's gate), and kept if anything fails")
    # detr.checkpoints.export.FORMAT_SUFFIXES' keys, written out so that --help does not wait for torch
    parser.add_argument("--format", choices=("onnx", "openvino", "pt2"), default="onnx",
                        help="onnx (ONNX Runtime), openvino (an OpenVINO IR: .xml and its .bin, run on the CPU) or "
                             "pt2 (torch.export program; torch.export.load)")
    parser.add_argument("--postprocess", action="store_true",
                        help="put the post-processing in the graph: input orig_sizes [B, 2] (h, w); outputs "
                             "scores, labels, boxes (pixel xyxy)")
    parser.add_argument("--prompt", default=None,
                        help="an open-vocabulary model (Grounding DINO): the prompt to bake into the file, e.g. "
                             "'a cat. a remote control.': its phrases become the file's classes, the text features "
                             "constants (the file takes images only)")
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
    out = Path(args.out)
    # every input before the model loads: a mistake found after the export cost its minutes
    # detr.checkpoints.export.FORMAT_SUFFIXES, written out here (no torch before the checks)
    suffix = {"onnx": ".onnx", "openvino": ".xml", "pt2": ".pt2"}[args.format]
    if out.is_dir():
        parser.error(f"--out {out} is a folder: give the file to write, e.g. {out / ('model' + suffix)}")
    if not args.out.endswith(suffix):  # the predictor chooses its backend by the suffix
        parser.error(f"--out must end in {suffix} for --format {args.format}, got {args.out}")
    if Path(args.checkpoint).exists() and out.exists() and out.resolve() == Path(args.checkpoint).resolve():
        parser.error(f"--out {out} is the checkpoint itself: write the export to another file")
    if args.int8 and args.format == "pt2":
        parser.error("--int8 quantises an .onnx or .xml file: use --format onnx or --format openvino")
    if args.int8 and (not args.calibration or args.postprocess):
        parser.error("--int8 needs --calibration IMAGES (and a file without --postprocess)")
    if args.calibration_size < 1:
        parser.error(f"--calibration-size must be at least 1, got {args.calibration_size}")
    from detr.inference.outputs import collect_image_paths

    calibration_paths = []
    if args.int8:
        try:
            calibration_paths = collect_image_paths(args.calibration)
        except ValueError as error:  # a missing path, an empty folder
            parser.error(f"--calibration: {error}")
    evaluation_set = None
    if args.evaluate is not None:
        from detr.inference.gate import read_evaluation_set  # pycocotools, torch (the Predictor)

        try:
            evaluation_set = read_evaluation_set(*args.evaluate)
        except (FileNotFoundError, ValueError) as error:
            parser.error(f"--evaluate: {error}")
    from detr.checkpoints import load_checkpoint  # after --help: torch
    from detr.checkpoints.formats import ExportError
    from detr.inference.gate import MAX_AP_DROP
    from detr.inference.quantize import read_calibration

    if args.max_ap_drop is None:
        args.max_ap_drop = MAX_AP_DROP
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    model = load_checkpoint(args.checkpoint)
    if model.prompted or args.prompt is not None:
        from detr.inference.fixed_prompt import fix_prompt

        if args.prompt is None:
            parser.error(f"--prompt: {args.checkpoint} is an open-vocabulary model; give the prompt to bake into the "
                         "file, e.g. --prompt 'a cat. a remote control.'")
        try:
            model = fix_prompt(model, args.prompt)
        except ValueError as error:
            parser.error(f"--prompt: {error}")
    feeds = None
    if args.int8:
        try:
            calibration = read_calibration(model.input_spec, calibration_paths, limit=args.calibration_size)
        except ValueError as error:  # too few readable images
            parser.error(f"--calibration: {error}")
        feeds = calibration.feeds
        if calibration.skipped:
            print(f"--calibration: skipped {len(calibration.skipped)} image(s) that could not be read (first: "
                  f"{calibration.skipped[0][0]}: {calibration.skipped[0][1]})", file=sys.stderr)

    def export() -> int:
        try:
            return export_and_check(args, model, feeds, evaluation_set)
        except ExportError as error:
            print(f"export failed: {error}", file=sys.stderr)
            return 1

    return keep_output_on_stop(export, f"nothing was written to {out} (a file there is as it was)")


def export_and_check(args: argparse.Namespace, model: Any, feeds: list | None, evaluation_set: Any) -> int:
    """Write, verify, quantise and gate in a staging folder beside ``--out``; move each file that passed into place
    (the others to FILE.failed). The exit status."""
    from detr.atomic_files import staging_folder
    from detr.checkpoints.export import exported_files, move_export, write_export
    from detr.inference.gate import accuracy_gate
    from detr.inference.predictor import Predictor
    from detr.inference.quantize import quantize

    out = Path(args.out)
    with staging_folder(out.parent) as staging:
        staged = staging / out.name
        verification = write_export(model, staged, format=args.format, postprocess=args.postprocess,
                                    bilinear_kernel=args.sampling_kernel)
        print(f"verified {out} against the PyTorch model (max abs differences):")
        print(verification.table())
        if not verification.passed:
            failed = move_export(staged, out.parent, suffix=".failed")
            print(f"export failed: the exported file does not reproduce the PyTorch model (moved to {failed}; {out} "
                  "is as it was)", file=sys.stderr)
            return 1
        written = {out: staged}  # final path → staged file
        if feeds is not None:
            int8_path = out.with_name(f"{out.stem}-int8{out.suffix}")
            what = "convolutions" if args.int8_scope == "convolutions" else "convolutions and matrix products"
            tool = "NNCF" if out.suffix == ".xml" else "ONNX Runtime"
            print(f"quantising to INT8 ({what}, {tool}) on {len(feeds)} calibration images ...", flush=True)
            written[int8_path] = quantize(staged, staging / int8_path.name, feeds, scope=args.int8_scope)
            print(f"quantised {int8_path}: INT8 {what} calibrated on {len(feeds)} images"
                  + ("" if args.evaluate else "; its accuracy is unchecked: add --evaluate IMAGES JSON for its AP"))
        failed_rows: set[Path] = set()
        if evaluation_set is not None:
            reference = Predictor(model, device="cpu", optimize=True)
            artifacts = {path: Predictor.from_checkpoint(path, device="cpu") for path in written.values()}
            report = accuracy_gate(reference, artifacts, args.evaluate[0], evaluation_set,
                                   max_ap_drop=args.max_ap_drop)
            print(report.table())
            failed_rows = {row.path for row in report.failed}
            drops = {row.path: report.drop(row) for row in report.failed}
        for path, staged_path in written.items():
            if staged_path in failed_rows:
                failed = move_export(staged_path, out.parent, suffix=".failed")
                print(f"accuracy gate failed: {path} loses {drops[staged_path]:.2f} AP points "
                      f"(at most {args.max_ap_drop:g}); moved to {failed}"
                      + ("; the earlier file there is as it was" if path.exists() else ""), file=sys.stderr)
                continue
            replaced = any(file.exists() for file in exported_files(path))
            move_export(staged_path, out.parent)
            print(f"replaced the earlier {path}" if replaced else f"wrote {path}")
    return 1 if failed_rows else 0


if __name__ == "__main__":
    sys.exit(main())
