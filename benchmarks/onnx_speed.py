"""Deployed files against PyTorch and the authors' code: CPU forward latency of one model, one image.

    .venv/bin/python benchmarks/onnx_speed.py [--repeats 5] [--threads 2] [--height 800 --width 1066]
                                              [--onnx r50.onnx] [--no-int8] [--no-openvino]
    .venv/bin/python benchmarks/onnx_speed.py --calibration data/coco-mini/val2017      # + static INT8 rows
    .venv/bin/python benchmarks/onnx_speed.py --model rtdetr_r18 --calibration data/coco-mini/val2017

Random weights (speed does not depend on them): ``detr_r50`` is ``build_detr()`` (R50, 6 + 6 layers, 100
queries) at ``--height`` × ``--width``; the real-time models (``benchmarks/realtime_speed.py``'s layouts) are
built by transformers, saved and loaded with ``detr.load_checkpoint``, at their 640 × 640 square. Compared in
one process, in alternating runs (one run of each backend per round, median over rounds, after one warm-up
each), all with the same number of threads:

- the authors' PyTorch forward (``detr_r50`` only, with ``--authors``: a checkout of facebookresearch/detr,
  default ``.authors/detr`` where it exists; their ``build_model`` with main.py's defaults, our weights loaded,
  eval mode, ``torch.no_grad`` as their ``evaluate``);
- PyTorch eager, fp32, after ``model.optimize_for_inference()`` (BatchNorm folded, channels-last);
- ONNX Runtime, CPUExecutionProvider, fp32, graph optimisations ORT_ENABLE_ALL (the file of
  ``detr.checkpoints.export.export``, verified against the model first);
- the same file after ``onnxruntime.quantization.quantize_dynamic`` (int8 weights, activations quantised
  at run time; MatMul and Gemm only: the convolutions stay fp32), with the output differences it costs;
- OpenVINO on the CPU, fp32 asked for explicitly (``detr.checkpoints.openvino.OpenVinoDetector``; the IR of
  ``detr-export --format openvino``, converted from the same ONNX file), when openvino is installed;
- with ``--calibration IMAGES``: the static INT8 files ``detr-export --int8`` writes
  (``detr.inference.quantize``: ONNX Runtime QDQ and NNCF for the IR, calibrated on ``--calibration-size``
  of those images prepared by the model's input contract, ``--int8-scope`` as ``detr-export``'s).

Needs onnx, onnxscript and onnxruntime (openvino and nncf for their rows). Prints the machine, then a table
with each row's ratio to our PyTorch path and, where measured, to the authors'. The accuracy of these files
is the accuracy gate's (``detr-export --evaluate``, docs/guides/deploy.md): here only their output differences.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from machine import describe_machine

import detr
from detr import build_detr
from detr.checkpoints.export import export, export_onnx, pair_rows
from detr.checkpoints.formats import ExportError
from detr.inference.postprocess import scores_and_labels

Outputs = tuple[np.ndarray, np.ndarray]


def ort_session(path: Path, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def build_model(name: str) -> detr.Detector:
    """The model to time, with random weights, in eval mode (not yet optimized)."""
    torch.manual_seed(0)
    if name == "detr_r50":
        return build_detr().eval()
    from realtime_speed import MODELS, transformers_model

    _, family, backbone, options = MODELS[name]
    with tempfile.TemporaryDirectory() as directory:
        transformers_model(family, backbone, options).save_pretrained(directory)
        return detr.load_checkpoint(directory).eval()


def authors_forward(checkout: str, model: detr.Detector, images: torch.Tensor,
                    mask: torch.Tensor) -> Callable[[], Outputs]:
    """The authors' DETR with ``model``'s weights (their layout is ours), as their ``evaluate`` runs it."""
    from authors_detr import authors_args, import_authors

    models, misc = import_authors(checkout)
    theirs, _, _ = models.build_model(authors_args(model.config, torch.device("cpu")))
    theirs.load_state_dict(model.state_dict())
    theirs.eval()
    samples = misc.NestedTensor(images, mask)

    def run() -> Outputs:
        with torch.no_grad():
            out = theirs(samples)
        return out["pred_logits"].numpy(), out["pred_boxes"].numpy()
    return run


def main() -> None:
    from realtime_speed import MODELS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["detr_r50", *MODELS], default="detr_r50")
    parser.add_argument("--repeats", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--height", type=int, default=800, help="detr_r50's input (the real-time models: 640)")
    parser.add_argument("--width", type=int, default=1066)
    parser.add_argument("--onnx", type=Path, default=None,
                        help="reuse this export of the model with seed 0 (written there if missing)")
    checkout = Path(__file__).resolve().parents[1] / ".authors" / "detr"  # wherever the script is run from
    parser.add_argument("--authors", default=str(checkout) if (checkout / "models").is_dir() else None,
                        help="a checkout of facebookresearch/detr: its forward as a row (detr_r50)")
    parser.add_argument("--no-int8", action="store_true", help="skip the dynamic int8 quantisation")
    parser.add_argument("--no-openvino", action="store_true", help="skip the OpenVINO rows")
    parser.add_argument("--calibration", nargs="+", default=None,
                        help="images (files, folders) for the static INT8 rows")
    parser.add_argument("--calibration-size", type=int, default=16)
    parser.add_argument("--int8-scope", choices=["convolutions", "all"], default="convolutions")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(describe_machine(), flush=True)

    model = build_model(args.model)
    if args.model == "detr_r50":
        height, width = args.height, args.width
    else:  # the real-time models' square: 640, RF-DETR's its release's (the file takes that size only)
        from realtime_speed import SIZE, SIZES

        height = width = SIZES.get(args.model, SIZE)
    workdir = Path(tempfile.mkdtemp(prefix="onnx_speed_"))
    onnx_path = args.onnx or workdir / f"{args.model}.onnx"
    if not onnx_path.exists():
        start = time.perf_counter()
        # verified against the PyTorch model before it is timed; a real-time model at its square
        eval_size = None if args.model == "detr_r50" else (height, width)
        try:
            export(model, onnx_path, eval_size=eval_size)
            print(f"exported and verified {onnx_path} in {time.perf_counter() - start:.0f} s", flush=True)
        except ExportError as error:
            # random weights can leave a two-stage encoder's proposal scores tied to float rounding, so that
            # the file picks other proposals than PyTorch for one image of the batch check; the timing does
            # not depend on it, and the table's differences below show the file's fidelity on the timed image
            print(f"{error}\n(on these random weights; timing the unverified file, whose differences on the timed "
                  "image the table shows)", flush=True)
            export_onnx(model, onnx_path, eval_size=eval_size)

    generator = torch.Generator().manual_seed(1)
    images = torch.randn(1, 3, height, width, generator=generator)
    mask = torch.zeros(1, height, width, dtype=torch.bool)
    feeds = {"images": images.numpy(), "padding_mask": mask.numpy()}
    backends: dict[str, Callable[[], Outputs]] = {}
    if args.authors and args.model == "detr_r50":
        backends["authors' PyTorch fp32 (facebookresearch/detr)"] = authors_forward(args.authors, model, images, mask)
    model.optimize_for_inference()

    def run_torch() -> Outputs:
        with torch.inference_mode():
            out = model(images, mask)
        return out.logits.numpy(), out.boxes.numpy()

    def run_session(session) -> Callable[[], Outputs]:
        return lambda: tuple(session.run(None, feeds)[:2])

    backends["PyTorch eager fp32 (optimize_for_inference)"] = run_torch
    backends["ONNX Runtime fp32 (ORT_ENABLE_ALL)"] = run_session(ort_session(onnx_path, args.threads))
    if not args.no_int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        dynamic_path = workdir / f"{args.model}_int8_dynamic.onnx"
        quantize_dynamic(str(onnx_path), str(dynamic_path), weight_type=QuantType.QInt8,
                         op_types_to_quantize=["MatMul", "Gemm"])
        backends["ONNX Runtime int8 dynamic (MatMul/Gemm)"] = run_session(ort_session(dynamic_path, args.threads))
    calibration = None
    if args.calibration:
        from detr.inference.quantize import calibration_feeds, quantize_onnx

        # prepared at the exported square (a random-weight RF-DETR's own contract names its release's default)
        spec = model.input_spec if args.model == "detr_r50" else model.input_spec.replace(size=height)
        calibration = calibration_feeds(spec, args.calibration, limit=args.calibration_size)
        start = time.perf_counter()
        static_path = quantize_onnx(onnx_path, workdir / f"{args.model}_int8.onnx", calibration,
                                    scope=args.int8_scope)
        print(f"ONNX Runtime QDQ INT8 ({len(calibration)} images) in {time.perf_counter() - start:.0f} s", flush=True)
        backends[f"ONNX Runtime INT8 static QDQ ({args.int8_scope})"] = run_session(
            ort_session(static_path, args.threads))
    if not args.no_openvino:
        from detr.checkpoints.openvino import OpenVinoDetector, write_ir

        try:
            xml = write_ir(onnx_path, workdir / f"{args.model}.xml")
        except ImportError:
            print("openvino is not installed: no OpenVINO rows")
        else:
            ir = OpenVinoDetector(xml, threads=args.threads)
            backends["OpenVINO fp32 (CPU)"] = lambda: tuple(ir.infer(feeds)[:2])
            if calibration is not None:
                from detr.inference.quantize import quantize_openvino

                start = time.perf_counter()
                int8_xml = quantize_openvino(xml, workdir / f"{args.model}_int8.xml", calibration,
                                             scope=args.int8_scope)
                print(f"NNCF INT8 ({len(calibration)} images) in {time.perf_counter() - start:.0f} s", flush=True)
                int8_ir = OpenVinoDetector(int8_xml, threads=args.threads)
                backends[f"OpenVINO INT8 NNCF ({args.int8_scope})"] = lambda: tuple(int8_ir.infer(feeds)[:2])

    outputs = {name: run() for name, run in backends.items()}  # warm-up, and the outputs compared below
    times: dict[str, list[float]] = {name: [] for name in backends}
    load_before = os.getloadavg()
    for round_ in range(args.repeats):
        for name, run in (reversed(backends.items()) if round_ % 2 else backends.items()):
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
        print(f"round {round_ + 1} done, load average {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)

    ours_name = "PyTorch eager fp32 (optimize_for_inference)"
    ours = statistics.median(times[ours_name])
    authors = next((statistics.median(t) for name, t in times.items() if name.startswith("authors")), None)
    logits_ref, boxes_ref = outputs[ours_name]
    class_head = model.class_head

    def scores(logits: np.ndarray) -> torch.Tensor:
        return scores_and_labels(torch.from_numpy(np.asarray(logits, dtype=np.float32)), class_head)[0]

    print(f"\n{args.model} forward, batch 1, {height}x{width}, CPU, {args.threads} threads, {args.repeats} "
          f"alternating rounds (median; min-max); load average before {load_before[0]:.1f}, "
          f"after {os.getloadavg()[0]:.1f}")
    print(f"{'backend':<48}{'median s':>10}{'min-max s':>16}{'vs ours':>9}{'vs authors':>12}"
          f"{'max |Δ logits|':>16}{'max |Δ boxes|':>15}{'max |Δ score|':>15}")
    for name in backends:
        median = statistics.median(times[name])
        logits, boxes = (tensor.numpy() for tensor in pair_rows(  # near-tied queries ranked the other way
            (torch.from_numpy(logits_ref), torch.from_numpy(boxes_ref)),
            (torch.from_numpy(np.asarray(outputs[name][0])), torch.from_numpy(np.asarray(outputs[name][1])))))
        versus_authors = f"{median / authors:.2f}" if authors else "-"
        print(f"{name:<48}{median:>10.3f}{min(times[name]):>8.3f}-{max(times[name]):<7.3f}{median / ours:>9.2f}"
              f"{versus_authors:>12}{np.abs(logits - logits_ref).max():>16.2e}"
              f"{np.abs(boxes - boxes_ref).max():>15.2e}{(scores(logits) - scores(logits_ref)).abs().max().item():>15.2e}")
    print("Δ: against our PyTorch fp32, each row paired with the PyTorch row it matches (as the export's check);"
          " boxes normalised cxcywh (× image size for pixels); random weights.")


if __name__ == "__main__":
    main()
