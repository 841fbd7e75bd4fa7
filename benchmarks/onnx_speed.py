"""ONNX Runtime and OpenVINO against PyTorch: R50 DETR forward latency on the CPU, one image at COCO size.

    .venv/bin/python benchmarks/onnx_speed.py [--repeats 5] [--threads 2] [--height 800 --width 1066]
                                              [--onnx r50.onnx] [--no-int8] [--no-openvino]

Random weights (build_detr defaults: R50, 6 + 6 layers, 100 queries): speed does not depend on them.
Compared in one process, in alternating runs (one run of each backend per round, median over rounds,
after one warm-up each), all with the same number of threads:

- PyTorch eager, fp32, after ``model.optimize_for_inference()`` (BatchNorm folded, channels-last);
- ONNX Runtime, CPUExecutionProvider, fp32, graph optimisations ORT_ENABLE_ALL (the file of
  ``detr.checkpoints.export.export_onnx``, verified against the model first);
- the same file after ``onnxruntime.quantization.quantize_dynamic`` (int8 weights, activations quantised
  at run time; MatMul and Gemm only, i.e. the transformer and heads: the convolutions stay fp32),
  with the output differences it costs;
- OpenVINO on the CPU, fp32 asked for explicitly (``detr.checkpoints.openvino.OpenVinoDetector``; the IR of
  ``detr-export --format openvino``, converted from the same ONNX file), when openvino is installed.

Needs onnx, onnxscript and onnxruntime. Prints the machine, then a table.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from machine import describe_machine

from detr import build_detr
from detr.checkpoints.export import export


def ort_session(path: Path, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--height", type=int, default=800)
    parser.add_argument("--width", type=int, default=1066)
    parser.add_argument("--onnx", type=Path, default=None,
                        help="reuse this export of build_detr() with seed 0 (written there if missing)")
    parser.add_argument("--no-int8", action="store_true", help="skip the dynamic int8 quantisation")
    parser.add_argument("--no-openvino", action="store_true", help="skip the OpenVINO row")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(describe_machine(), flush=True)

    torch.manual_seed(0)
    model = build_detr().eval()
    workdir = Path(tempfile.mkdtemp(prefix="onnx_speed_"))
    onnx_path = args.onnx or workdir / "detr_r50.onnx"
    if not onnx_path.exists():
        start = time.perf_counter()
        export(model, onnx_path)  # verified against the PyTorch model before it is timed
        print(f"exported and verified {onnx_path} in {time.perf_counter() - start:.0f} s", flush=True)
    model.optimize_for_inference()

    generator = torch.Generator().manual_seed(1)
    images = torch.randn(1, 3, args.height, args.width, generator=generator)
    mask = torch.zeros(1, args.height, args.width, dtype=torch.bool)
    feeds = {"images": images.numpy(), "padding_mask": mask.numpy()}

    def run_torch() -> tuple[np.ndarray, np.ndarray]:
        with torch.inference_mode():
            out = model(images, mask)
        return out.logits.numpy(), out.boxes.numpy()

    backends = {"PyTorch eager fp32 (optimize_for_inference)": run_torch}
    fp32 = ort_session(onnx_path, args.threads)
    backends["ONNX Runtime fp32 (ORT_ENABLE_ALL)"] = lambda: tuple(fp32.run(None, feeds))
    if not args.no_int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        int8_path = workdir / "detr_r50_int8.onnx"
        quantize_dynamic(str(onnx_path), str(int8_path), weight_type=QuantType.QInt8,
                         op_types_to_quantize=["MatMul", "Gemm"])
        int8 = ort_session(int8_path, args.threads)
        backends["ONNX Runtime int8 dynamic (MatMul/Gemm)"] = lambda: tuple(int8.run(None, feeds))
    if not args.no_openvino:
        from detr.checkpoints.openvino import OpenVinoDetector, write_ir

        try:
            ir = OpenVinoDetector(write_ir(onnx_path, workdir / "detr_r50.xml"), threads=args.threads)
        except ImportError:
            print("openvino is not installed: no OpenVINO row")
        else:
            backends["OpenVINO fp32 (CPU)"] = lambda: tuple(ir.infer(feeds))

    outputs = {name: run() for name, run in backends.items()}  # warm-up, and the outputs compared below
    times: dict[str, list[float]] = {name: [] for name in backends}
    for _ in range(args.repeats):
        for name, run in backends.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)

    reference_name = next(iter(backends))
    reference = statistics.median(times[reference_name])
    logits_ref, boxes_ref = outputs[reference_name]
    print(f"\nR50 forward, batch 1, {args.height}x{args.width}, CPU, {args.threads} threads, "
          f"{args.repeats} alternating rounds (median; min-max)")
    print(f"{'backend':<46}{'median s':>10}{'min-max s':>16}{'vs PyTorch':>12}{'max |Δ logits|':>16}"
          f"{'max |Δ boxes|':>15}{'max |Δ score|':>15}")
    scores_ref = torch.from_numpy(logits_ref).softmax(-1)[..., :-1].max(-1).values
    for name in backends:
        median = statistics.median(times[name])
        logits, boxes = outputs[name]
        scores = torch.from_numpy(logits).softmax(-1)[..., :-1].max(-1).values
        print(f"{name:<46}{median:>10.3f}{min(times[name]):>8.3f}-{max(times[name]):<7.3f}{median / reference:>12.2f}"
              f"{np.abs(logits - logits_ref).max():>16.2e}{np.abs(boxes - boxes_ref).max():>15.2e}"
              f"{(scores - scores_ref).abs().max().item():>15.2e}")
    print("Δ: against PyTorch fp32; boxes normalised cxcywh (× image size for pixels); random weights.")


if __name__ == "__main__":
    main()
