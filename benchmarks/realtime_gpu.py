"""The real-time families on a GPU: training images/s and peak memory beside transformers' training path, inference
images/s of every family, and the accuracy gate of trained models in bf16, fp16 and ONNX.

    python benchmarks/realtime_gpu.py --sections train --batches 8 16 --modes eager     # a CUDA machine
    python benchmarks/realtime_gpu.py --sections train --batches 8 --modes compiled
    python benchmarks/realtime_gpu.py --sections infer
    python benchmarks/realtime_gpu.py --sections gate --checkpoints RUN/checkpoints/last.ckpt ... \\
        --images data/shapes/val2017 --annotations data/shapes/annotations/instances_val2017.json
    python benchmarks/realtime_gpu.py --quick --device cpu --compile-backend eager      # rehearsal (tiny sizes)

Sections (``--sections``):
- ``train``: RT-DETR-R18, D-FINE-S and RF-DETR-Nano of the released layouts (benchmarks/realtime_speed.py's
  ``MODELS``) built by transformers with random weights, saved and loaded by ``detr.load_checkpoint``: both sides
  start from the same weights. The losses are first checked equal (benchmarks/realtime_training.py's
  ``check_losses``: one forward each with denoising off, every weighted term to 1e-4). Then per batch size and
  mode (``eager``, ``compiled``: ``torch.compile`` of the model, the loss eager as the Lightning module runs it;
  transformers' model with its loss inside the compiled forward) each side trains ``--steps`` steps from those
  weights on the same batch (the two photos repeated, seeded random targets) in bf16 autocast: forward, loss,
  backward, clipping at 0.1, fused AdamW (our side: the family's recipe's parameter groups). Printed per row:
  images/s over the steps after ``--warmup`` (the first step's seconds: compilation), peak GPU memory, the host
  synchronisations of one more step (``torch.cuda.set_sync_debug_mode``; "-" off CUDA), and the
  mean loss of the last tenth of the steps on each side (they train the same model on the same batch: they
  should end close; denoising queries are drawn at random on each side). ``--rfdetr-package`` adds a third side
  for RF-DETR: the authors' ``rfdetr`` package's model of the preset (its own random weights, the same layout)
  and its criterion, trained the same way (only its model code is imported: benchmarks/rfdetr_package_parity.py).
- ``infer``: forward and post-processing (300 detections) at batch 1 and 32, square inputs (RF-DETR at its
  release's), the transformers side for the families it has; our model after ``optimize_for_inference()``; fp32,
  bf16 and fp16 autocast, eager, and bf16 compiled (ours). images/s over ``--infer-iterations`` after warm-up.
- ``gate``: each ``--checkpoints`` file through :func:`detr.inference.gate.accuracy_gate` on ``--images`` /
  ``--annotations`` (one image at a time): PyTorch fp32 on the device as the reference, then bf16 and fp16
  autocast on the device, and the ONNX file ``detr-export --sampling-kernel gather`` writes (ONNX Runtime on the
  device where onnxruntime has CUDA, else the CPU). A row that loses more than ``--max-ap-drop`` AP is named.

Results: docs/measurements/gpu.md. ``--quick`` (the CPU rehearsal, benchmarks/gpu_session.sh) runs every code
path at 128-pixel inputs and a few steps.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.helpers_*

from gpu_throughput import count_syncs  # noqa: E402
from machine import describe_machine  # noqa: E402
from realtime_speed import DETR_SIZE, MODELS, SIZE, SIZES, pair_of_models  # noqa: E402
from realtime_training import (OPTIMIZER, WEIGHT_DECAY, build_our_training, check_losses,  # noqa: E402
                               make_targets, our_side, package_side, rfdetr_package_training, their_side,
                               without_dropout)

import detr  # noqa: E402
from detr.inference.postprocess import PostProcess  # noqa: E402
from detr.inference.predictor import AUTOCAST_DTYPES  # noqa: E402
from tests.helpers_rtdetr import square_photos  # noqa: E402

#: the families transformers does not have here, timed on our side only: (preset or None for DETR-R50, input)
OURS_ONLY = {"deimv2_l": ("deimv2_l", (SIZE, SIZE)), "deformable_detr": ("deformable_detr", DETR_SIZE),
             "detr_r50": (None, DETR_SIZE)}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory(device: torch.device) -> str:
    return f"{torch.cuda.max_memory_allocated(device) / 2**30:.2f}" if device.type == "cuda" else "-"


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def autocast(device: torch.device, precision: str) -> torch.autocast:
    """The autocast of a Predictor's ``precision`` (:data:`AUTOCAST_DTYPES`; disabled for fp32) on ``device``."""
    dtype = AUTOCAST_DTYPES[precision]
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


# ----------------------------------------------------------------------------------------------------- training
def train_run(side: str, model, family: str, initial: dict, images, mask, targets, labels, *, device, steps: int,
              warmup: int, compiled: bool, backend: str, package=None, precision: str = "bf16") -> dict:
    """``steps`` training steps (autocast ``precision``) of one side from ``initial``: images/s after ``warmup``,
    first step's seconds, peak memory, losses. ``package``: the rfdetr package's (criterion, NestedTensor)."""
    model.load_state_dict(initial)
    forward = torch.compile(model, backend=backend) if compiled else model  # (its parameters are the model's)
    context = partial(autocast, device, precision)
    if side == "ours":
        criterion, optimizer = build_our_training(model, family)
        step = our_side(forward, criterion.to(device), optimizer, images, mask, targets, context).step
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=OPTIMIZER[family]["lr"], weight_decay=WEIGHT_DECAY,
                                      fused=device.type == "cuda")
        if side == "rfdetr":
            step = package_side(forward, *package, optimizer, images, mask, targets, context).step
        else:
            step = their_side(forward, optimizer, images, labels, context).step

    losses = []
    reset_peak(device)
    synchronize(device)
    start = time.perf_counter()
    losses.append(step())
    synchronize(device)
    first = time.perf_counter() - start
    for _ in range(warmup - 1):
        losses.append(step())
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps - warmup):
        losses.append(step())
    synchronize(device)
    elapsed = time.perf_counter() - start
    values = torch.stack(losses).float().cpu()
    if not torch.isfinite(values).all():
        raise FloatingPointError(f"{side}: a non-finite loss at step {int((~torch.isfinite(values)).nonzero()[0])}")
    tail = values[-max(1, len(values) // 10):]
    syncs = count_syncs(step, device)  # one more step, after the timed ones
    return {"images_s": images.shape[0] * (steps - warmup) / elapsed, "first_s": first, "memory": peak_memory(device),
            "first_loss": float(values[0]), "last_loss": float(tail.mean()),
            "syncs": "-" if syncs is None else str(syncs)}


def train_section(args, device: torch.device) -> None:
    print(f"\n## Training ({args.train_precision}): ours beside transformers, same weights, same batch\n")
    rows = []
    for name in args.models:
        family, theirs, ours = pair_of_models(name)
        square = input_square(args, name)
        for model in (theirs, ours):
            model.to(device).train()
            without_dropout(model)
        photos = square_photos(square)
        check_batch = 2
        images = photos[torch.arange(check_batch) % len(photos)].to(device)
        mask = torch.zeros(check_batch, square, square, dtype=torch.bool, device=device)
        targets = [{k: v.to(device) for k, v in t.items()} for t in make_targets(check_batch)]
        labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
        tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # the check: plain fp32
        try:
            print(check_losses(name, family, ours, theirs, images, mask, targets, labels), flush=True)
        except AssertionError as error:  # reported; the timing still runs
            print(f"CHECK FAILED: {error}", flush=True)
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
        initial = {"theirs": copy.deepcopy(theirs.state_dict()), "ours": copy.deepcopy(ours.state_dict())}
        sides = [("theirs", theirs, None), ("ours", ours, None)]
        if args.rfdetr_package and family == "rfdetr":
            package_model, package_criterion, nested = rfdetr_package_training(name, device)
            package_model.to(device).train()
            without_dropout(package_model)
            initial["rfdetr"] = copy.deepcopy(package_model.state_dict())
            sides.append(("rfdetr", package_model, (package_criterion.to(device), nested)))
        for batch, steps in zip(args.batches, args.steps):
            images = photos[torch.arange(batch) % len(photos)].contiguous().to(device)
            mask = torch.zeros(batch, square, square, dtype=torch.bool, device=device)
            targets = [{k: v.to(device) for k, v in t.items()} for t in make_targets(batch)]
            labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
            for mode in args.modes:
                if args.quick and mode == "compiled" and name != args.models[0]:
                    continue  # the rehearsal compiles one model: the code path, not the table
                result = {}
                for side, model, package in sides:
                    torch.manual_seed(0)
                    try:
                        result[side] = train_run(side, model, family, initial[side], images, mask, targets, labels,
                                                 device=device, steps=steps, warmup=args.warmup,
                                                 compiled=mode == "compiled", backend=args.compile_backend,
                                                 package=package, precision=args.train_precision)
                    except Exception as error:  # noqa: BLE001 - a failed side is reported, the table goes on
                        print(f"FAILED {name} {side} batch {batch} {mode}: {type(error).__name__}: "
                              f"{str(error).splitlines()[0] if str(error) else ''}", flush=True)
                rows.append((name, batch, mode, result))
                print(train_row(name, batch, mode, result), flush=True)
        theirs = ours = sides = None  # the GPU's memory for the next model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(f"\nsteps per run {', '.join(f'{s} at batch {b}' for b, s in zip(args.batches, args.steps))} "
          f"({args.warmup} warm-up), {device}, square inputs (RF-DETR-Nano "
          f"{input_square(args, 'rfdetr_nano')}, else {input_square(args, 'rtdetr_r18')})")
    print("| model | batch | mode | transformers img/s | ours img/s | ours / transformers | first step s (t / o) | "
          "peak GiB (t / o) | last-tenth loss (t / o) | host syncs / step (t / o) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(train_row(*row))
    package_rows = [row for row in rows if "rfdetr" in row[3]]
    if package_rows:
        print("\nthe rfdetr package's training step (its own random weights of the same preset, its criterion):")
        print("| model | batch | mode | rfdetr package img/s | ours img/s | ours / package | "
              "peak GiB (package / ours) |")
        print("|---|---|---|---|---|---|---|")
        for name, batch, mode, result in package_rows:
            package, ours = result["rfdetr"], result.get("ours")
            ratio = f"{ours['images_s'] / package['images_s']:.2f}" if ours else "-"
            print(f"| {MODELS[name][0]} | {batch} | {mode} | {rate(package['images_s'])} | "
                  f"{rate(ours['images_s']) if ours else '-'} | {ratio} | {package['memory']} / "
                  f"{ours['memory'] if ours else '-'} |")


def input_square(args, name: str) -> int:
    """The model's square input: its release's, or ``--square`` (RF-DETR: at least 320, so that its ViT's
    tokens outnumber its 300 queries)."""
    if args.square is None:
        return SIZES.get(name, SIZE)
    return max(args.square, 320) if name.startswith("rfdetr") else args.square


def train_row(name: str, batch: int, mode: str, result: dict) -> str:
    theirs, ours = result.get("theirs"), result.get("ours")

    def value(side, key, spec):
        return format(side[key], spec) if side else "failed"
    ratio = f"{ours['images_s'] / theirs['images_s']:.2f}" if theirs and ours else "-"
    return (f"| {MODELS[name][0]} | {batch} | {mode} | {rate(theirs['images_s']) if theirs else 'failed'} | "
            f"{rate(ours['images_s']) if ours else 'failed'} | {ratio} | {value(theirs, 'first_s', '.1f')} / "
            f"{value(ours, 'first_s', '.1f')} | {value(theirs, 'memory', 's')} / {value(ours, 'memory', 's')} | "
            f"{value(theirs, 'last_loss', '.2f')} / {value(ours, 'last_loss', '.2f')} | "
            f"{value(theirs, 'syncs', 's')} / {value(ours, 'syncs', 's')} |")


# ---------------------------------------------------------------------------------------------------- inference
def time_calls(function, device: torch.device, iterations: int, warmup: int = 2) -> tuple[float, float]:
    """Seconds of the first call (compilation, if any), then seconds per call over ``iterations``."""
    synchronize(device)
    start = time.perf_counter()
    function()
    synchronize(device)
    first = time.perf_counter() - start
    for _ in range(warmup):
        function()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(iterations):
        function()
    synchronize(device)
    return first, (time.perf_counter() - start) / iterations


def infer_section(args, device: torch.device) -> None:
    print("\n## Inference: forward and post-processing (300 detections), images/s\n")
    from transformers import RfDetrImageProcessor, RTDetrImageProcessor
    postprocess = PostProcess("sigmoid", top_k=300)
    rows = []
    names = list(args.models) + [name for name in args.ours_only]
    for name in names:
        if name in OURS_ONLY:
            preset, size = OURS_ONLY[name]
            torch.manual_seed(0)
            ours = detr.build(preset) if preset else detr.build_detr()
            theirs, processor = None, None
            postprocessing = PostProcess(top_k=ours.detections_per_image)
        else:
            family, theirs, ours = pair_of_models(name)
            side = input_square(args, name)
            size = (side, side)
            processor = RfDetrImageProcessor() if family == "rfdetr" else RTDetrImageProcessor()
            postprocessing = postprocess
            theirs.to(device).eval()
        if args.square and name in OURS_ONLY:
            size = (args.square, args.square) if size[0] == size[1] else (args.square, args.square * 4 // 3)
        ours = ours.optimize_for_inference().to(device).eval()
        compiled = torch.compile(ours, backend=args.compile_backend) if "compiled" in args.modes else None
        for batch in args.infer_batches:
            photos = square_photos(max(size))
            images = torch.nn.functional.interpolate(photos, size=size, mode="bilinear")
            images = images[torch.arange(batch) % len(images)].contiguous().to(device)
            mask = torch.zeros(batch, *size, dtype=torch.bool, device=device)
            sizes = torch.tensor([list(size)] * batch, device=device)
            iterations = max(2, args.infer_iterations // (4 if batch > 8 else 1))
            runs = []
            for precision in args.precisions if "eager" in args.modes else ():
                if theirs is not None:
                    runs.append(("transformers", "eager", precision, lambda p=precision: _theirs(
                        theirs, processor, images, sizes, device, p)))
                runs.append(("ours", "eager", precision, lambda p=precision: _ours(
                    ours, postprocessing, images, mask, sizes, device, p)))
            if compiled is not None:
                runs.append(("ours", "compiled", "bf16", lambda: _ours(
                    compiled, postprocessing, images, mask, sizes, device, "bf16")))
            for side, mode, precision, function in runs:
                reset_peak(device)
                try:
                    with torch.inference_mode():
                        first, seconds = time_calls(function, device, iterations)
                except Exception as error:  # noqa: BLE001 - reported, the table goes on
                    print(f"FAILED {name} {side} {mode} {precision} batch {batch}: {type(error).__name__}: "
                          f"{str(error).splitlines()[0] if str(error) else ''}", flush=True)
                    continue
                row = (name, f"{batch} × {size[0]} × {size[1]}", side, mode, precision, batch / seconds, first,
                       peak_memory(device))
                rows.append(row)
                print(infer_row(*row), flush=True)
        ours = theirs = compiled = None  # the GPU's memory for the next model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print("\n| model | input | side | mode | precision | images/s | first call s | peak GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(infer_row(*row))


def infer_row(name, size, side, mode, precision, images_s, first, memory) -> str:
    return f"| {name} | {size} | {side} | {mode} | {precision} | {rate(images_s)} | {first:.2f} | {memory} |"


def rate(images_s: float) -> str:
    """images/s with a decimal on a GPU (61.1) and three figures on a CPU (0.312)."""
    return f"{images_s:.1f}" if images_s >= 10 else f"{images_s:#.3g}"


def _ours(model, postprocess, images, mask, sizes, device, precision):
    with autocast(device, precision):
        outputs = model(images, mask)
    return postprocess(outputs, sizes)


def _theirs(model, processor, images, sizes, device, precision):
    with autocast(device, precision):
        outputs = model(pixel_values=images)
    outputs.logits, outputs.pred_boxes = outputs.logits.float(), outputs.pred_boxes.float()
    return processor.post_process_object_detection(outputs, threshold=0.0, target_sizes=sizes)


# --------------------------------------------------------------------------------------------------------- gate
def gate_section(args, device: torch.device) -> None:
    from detr.inference.gate import accuracy_gate
    from detr.inference.predictor import Predictor
    print(f"\n## Accuracy gate on {args.annotations} ({device}; ONNX: ONNX Runtime)\n")
    work = Path(tempfile.mkdtemp(prefix="realtime_gpu_gate_"))
    annotations = args.annotations
    if args.limit_images:  # the set's first images and their boxes
        data = json.loads(Path(annotations).read_text())
        data["images"] = data["images"][: args.limit_images]
        kept = {image["id"] for image in data["images"]}
        data["annotations"] = [a for a in data["annotations"] if a["image_id"] in kept]
        annotations = work / "annotations.json"
        annotations.write_text(json.dumps(data))
    for checkpoint in args.checkpoints:
        checkpoint = Path(checkpoint)
        if not checkpoint.is_file():
            print(f"SKIPPED {checkpoint}: no such file")
            continue
        title = checkpoint.parent.parent.name if checkpoint.parent.name == "checkpoints" else checkpoint.stem
        reference = Predictor.from_checkpoint(checkpoint, device=device)
        # the same (optimized) model under each half precision's autocast: the checkpoint is read once
        artifacts = {Path(f"pytorch-{precision}"): Predictor(reference.model, device=device, precision=precision)
                     for precision in ("bf16", "fp16")}
        onnx = work / f"{title}.onnx"
        export = subprocess.run([sys.executable, "-m", "detr.commands.export", str(checkpoint), "--format", "onnx",
                                 "--sampling-kernel", "gather", "--out", str(onnx)], capture_output=True, text=True)
        said = (export.stdout + export.stderr).strip().splitlines()
        print(f"{title}: detr-export (ONNX, gather sampling) exit {export.returncode}: {said[-1] if said else ''}")
        if export.returncode == 0:
            artifacts[onnx] = Predictor.from_checkpoint(onnx, device=device)
        report = accuracy_gate(reference, artifacts, args.images, annotations, max_ap_drop=args.max_ap_drop,
                               progress=False)
        print(f"\n### {title} ({checkpoint})\n")
        print(report.table())
        for row in report.failed:
            print(f"GATE FAILED: {title}: {row.name} loses {report.drop(row):.2f} AP (more than {args.max_ap_drop})")
        print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default="train,infer", help="comma-separated: train, infer, gate")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="128-px inputs, 3 steps: checks the script (CPU)")
    parser.add_argument("--models", nargs="+", choices=("rtdetr_r18", "dfine_s", "rfdetr_nano"),
                        default=["rtdetr_r18", "dfine_s", "rfdetr_nano"])
    parser.add_argument("--ours-only", nargs="*", choices=list(OURS_ONLY), default=list(OURS_ONLY),
                        help="families timed on our side only (inference)")
    parser.add_argument("--batches", nargs="+", type=int, default=[8, 16], help="training batch sizes")
    parser.add_argument("--train-precision", choices=("fp32", "bf16"), default="bf16",
                        help="training's autocast (fp32: none, as on a CPU benchmark of record)")
    parser.add_argument("--rfdetr-package", action="store_true",
                        help="RF-DETR also trained by the rfdetr package (on PYTHONPATH: pip install --target DIR "
                             "rfdetr --no-deps)")
    parser.add_argument("--modes", nargs="+", choices=("eager", "compiled"), default=["eager", "compiled"])
    parser.add_argument("--steps", nargs="+", type=int, default=[100, 20],
                        help="training steps per run, per batch size (one value: every batch size)")
    parser.add_argument("--warmup", type=int, default=10, help="of which untimed")
    parser.add_argument("--infer-batches", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--infer-iterations", type=int, default=40)
    parser.add_argument("--precisions", nargs="+", choices=tuple(AUTOCAST_DTYPES), default=["fp32", "bf16", "fp16"])
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--square", type=int, default=None, help="input side for every model (default: theirs)")
    parser.add_argument("--checkpoints", nargs="*", default=[], help="trained checkpoints for the gate")
    parser.add_argument("--images", default="data/shapes/val2017")
    parser.add_argument("--annotations", default="data/shapes/annotations/instances_val2017.json")
    parser.add_argument("--max-ap-drop", type=float, default=1.0)
    parser.add_argument("--limit-images", type=int, default=None, help="the gate on the set's first N images")
    args = parser.parse_args()
    if args.quick:
        args.square = args.square or 128
        args.steps, args.warmup = [3], min(args.warmup, 1)
        args.batches = [min(b, 2) for b in args.batches][:1]
        args.limit_images = args.limit_images or 3
        args.infer_batches = [min(b, 2) for b in args.infer_batches][:2]
        args.infer_iterations = 1
    if len(args.steps) == 1:
        args.steps = args.steps * len(args.batches)
    if len(args.steps) != len(args.batches):
        parser.error(f"--steps: one value, or one per batch size ({len(args.batches)}), got {len(args.steps)}")
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    print(describe_machine())
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    for section in sections:
        {"train": train_section, "infer": infer_section, "gate": gate_section}[section](args, device)


if __name__ == "__main__":
    main()
