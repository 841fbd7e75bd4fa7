"""GPU throughput of DETR at the authors' sizes: training and inference images/s, peak memory, MFU.

    .venv/bin/python benchmarks/gpu_throughput.py                        # a CUDA machine: the whole table
    .venv/bin/python benchmarks/gpu_throughput.py --sections infer --compile off
    .venv/bin/python benchmarks/gpu_throughput.py --quick --device cpu   # checks the script itself (tiny model)

Sections (``--sections``, comma-separated):
- ``train``: one training step = forward, Hungarian matching, set loss, backward, gradient clipping
  (0.1) and a fused AdamW step, on synthetic batches whose image sizes follow the train augmentation
  (shortest side 480..800, long side at most 1333, padded per batch) and then on the real pipeline
  (``data/coco-mini`` through the train transform and a DataLoader with pinned memory and persistent
  workers): the gap between the two is the loader's cost. Per precision (fp32, tf32, bf16 autocast)
  and with and without ``torch.compile``: images/s, peak GPU memory, host synchronisations in one step
  (``torch.cuda.set_sync_debug_mode``), and model FLOPs utilisation.
- ``infer``: forward at 800×1333 after ``optimize_for_inference()`` at batch 1, 8 and 32, per precision
  and compile setting: images/s and MFU.
- ``sdpa``: bf16 training with and without cuDNN's fused attention, from the same weights and data: the
  first non-finite step of each (cuDNN's masked-attention backward returns NaN on Hopper GPUs).
- ``loss``: ``--loss-steps`` steps on the real pipeline in fp32 and in bf16 from the same weights and
  data order; prints the mean loss of the last quarter of each (bf16 should train as fp32 does).

With ``--authors DIR`` (a checkout of facebookresearch/detr; default ``.authors/detr`` where it exists)
the training table gets the authors' own training step (``benchmarks/authors_detr.py``) on the same
batches and card, eager, fp32 and tf32 (their code has no mixed precision), and the loss section trains
their model from the same initial weights on the same data: the speed ratio and the loss are measured
side by side.

FLOPs are counted with torch's flop formulas (benchmarks/arithmetic.py ``counted_flops``: matrix products,
convolutions and attention; a training step counts forward and backward). MFU = achieved FLOP/s over the card's
dense peak for the precision (``--peak-tflops`` overrides the built-in table of H100 / H200 / A100 figures).
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.helpers (the tiny model of --quick)

from arithmetic import counted_flops  # noqa: E402
from authors_detr import AuthorsTrainer  # noqa: E402
from machine import describe_machine  # noqa: E402

from detr.data.coco import CocoDetection  # noqa: E402
from detr.data.collate import collate_detection, pad_images  # noqa: E402
from detr.data.transforms import make_train_transform  # noqa: E402
from detr.lightning.datamodule import seed_worker_transform  # noqa: E402
from detr.lightning.options import RuntimeOptions
from detr.lightning.system import DetrSystem  # noqa: E402
from detr.models.detr_family import DetrConfig  # noqa: E402
from tests.helpers import TINY  # noqa: E402

PRECISIONS = ("fp32", "tf32", "bf16")
# Dense peak TFLOP/s per precision (the vendors' data sheets, without sparsity).
PEAK_TFLOPS = {
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0},
    "H100": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4},  # SXM
    "H200": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4},
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0},
}


@dataclass
class Setting:
    precision: str
    compiled: bool
    authors: bool = False  # the authors' code (facebookresearch/detr), not ours

    def __str__(self) -> str:
        return f"{'authors ' if self.authors else ''}{self.precision}{' compile' if self.compiled else ''}"


def peak_flops(device: torch.device, precision: str, override: float | None) -> float | None:
    if override:
        return override * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):  # "H100 PCIe" before "H100"
        if key in name:
            return PEAK_TFLOPS[key][precision] * 1e12
    return None


def set_precision(precision: str) -> Any:
    """TF32 switches for fp32 / tf32; the autocast context for the forward pass."""
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return lambda device: (torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext())


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_sizes(rng: random.Random, max_size: int, scales: list[int]) -> tuple[int, int]:
    """One training image size: a COCO-like 4:3 photo resized as the train augmentation resizes it."""
    short = rng.choice(scales)
    long = min(round(short * rng.choice((4 / 3, 3 / 2, 1.0, 16 / 9))), max_size)
    return (short, long) if rng.random() < 0.5 else (long, short)


def synthetic_batches(batch_size: int, device: torch.device, *, scales: list[int], max_size: int,
                      num_classes: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor, list[dict]]]:
    """A few padded batches on the device with random images and 1..12 boxes an image."""
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(4):
        images = [torch.randn(3, *train_sizes(rng, max_size, scales), generator=generator) for _ in range(batch_size)]
        batch, mask = pad_images(images)
        targets = []
        for _ in range(batch_size):
            n = rng.randint(1, 12)
            centre = torch.rand(n, 2, generator=generator) * 0.6 + 0.2
            size = torch.rand(n, 2, generator=generator) * 0.3 + 0.05
            targets.append({"boxes": torch.cat([centre, size], 1).to(device),
                            "labels": torch.randint(1, num_classes, (n,), generator=generator).to(device)})
        batches.append((batch.to(device), mask.to(device), targets))
    return batches


def to_device(batch: tuple[torch.Tensor, torch.Tensor, list[dict]], device: torch.device) -> tuple:
    images, mask, targets = batch
    moved = [{k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in t.items()} for t in targets]
    return images.to(device, non_blocking=True), mask.to(device, non_blocking=True), moved


class Trainer:
    """The training step of :class:`DetrSystem` without Lightning's loop around it."""

    def __init__(self, model_config: DetrConfig, device: torch.device, setting: Setting, seed: int = 0,
                 compile_backend: str = "inductor") -> None:
        torch.manual_seed(seed)
        runtime = RuntimeOptions(channels_last=device.type == "cuda")
        self.system = DetrSystem(detr=model_config, runtime=runtime).to(device).train()
        self.device = device
        self.autocast = set_precision(setting.precision)
        self.forward: Callable = self.system.model
        if setting.compiled:
            # Inductor's coalesce tiling analysis does not handle symbolic sizes: with dynamic=True it fails the
            # compile of DETR's forward on CUDA (AssertionError in tiling_utils.get_pw_red_splits, torch 2.11;
            # pytorch/pytorch#181563). Padded batch sizes vary every step, so the shapes stay dynamic.
            torch._inductor.config.triton.coalesce_tiling_analysis = False
            self.forward = torch.compile(self.system.model, dynamic=True, backend=compile_backend)
        self.optimizer = torch.optim.AdamW(self.system.parameter_groups(), lr=1e-4, weight_decay=1e-4, fused=True)

    def step(self, batch: tuple) -> torch.Tensor:
        images, mask, targets = batch
        with self.autocast(self.device):
            outputs = self.forward(images, mask, targets=targets)
        losses = self.system.compute_losses(outputs, targets)
        self.optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        self.grad_norm = torch.nn.utils.clip_grad_norm_(self.system.model.parameters(), 0.1, foreach=True)
        self.optimizer.step()
        return losses["loss"].detach()


def make_trainer(args: argparse.Namespace, device: torch.device, setting: Setting) -> Trainer | AuthorsTrainer:
    if setting.authors:
        set_precision(setting.precision)
        return AuthorsTrainer(args.authors, args.model, device)
    return Trainer(args.model, device, setting, compile_backend=args.compile_backend)


def count_syncs(fn: Callable[[], Any], device: torch.device) -> int | None:
    """Host synchronisations that ``fn`` makes (CUDA only): torch warns once per synchronising call."""
    if device.type != "cuda":
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def timed_steps(step: Callable[[Any], Any], batches: Any, steps: int, warmup: int, device: torch.device) -> float:
    iterator = iter(batches)
    for _ in range(warmup):
        step(next(iterator))
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step(next(iterator))
    synchronize(device)
    return time.perf_counter() - start


def real_loader(args: argparse.Namespace, device: torch.device) -> DataLoader:
    dataset = CocoDetection(f"{args.data}/train2017", f"{args.data}/annotations/instances_train2017.json",
                            transform=make_train_transform(scales=args.scales, max_size=args.max_size, seed=0))
    return DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                      collate_fn=collate_detection, worker_init_fn=seed_worker_transform, drop_last=True,
                      pin_memory=device.type == "cuda", persistent_workers=args.workers > 0,
                      generator=torch.Generator().manual_seed(0))


def forever(loader: DataLoader, device: torch.device):
    for batch in itertools.chain.from_iterable(itertools.repeat(loader)):
        yield to_device(batch, device)


def mfu(images_per_second: float, flops_per_image: float, peak: float | None) -> str:
    return f"{100 * images_per_second * flops_per_image / peak:5.1f} %" if peak else "  n/a"


def memory(device: torch.device) -> str:
    return f"{torch.cuda.max_memory_allocated(device) / 2**30:6.2f} GiB" if device.type == "cuda" else "   n/a"


def train_section(args: argparse.Namespace, device: torch.device, settings: list[Setting]) -> None:
    print(f"\n## Training: batch {args.batch_size}, {args.steps} timed steps after {args.warmup} warm-up")
    print("| setting | synthetic img/s | real-data img/s | peak memory | syncs/step | MFU (synthetic) |")
    print("|---|---|---|---|---|---|")
    synthetic = synthetic_batches(args.batch_size, device, scales=args.scales, max_size=args.max_size,
                                  num_classes=args.model.num_classes)
    loader = real_loader(args, device)
    rates: dict[str, float] = {}
    for setting in settings:
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        trainer = make_trainer(args, device, setting)
        seconds = timed_steps(trainer.step, itertools.cycle(synthetic), args.steps, args.warmup, device)
        synthetic_rate = args.steps * args.batch_size / seconds
        peak_memory = memory(device)
        syncs = count_syncs(partial(trainer.step, synthetic[0]), device)
        real_seconds = timed_steps(trainer.step, forever(loader, device), args.steps, args.warmup, device)
        real_rate = args.steps * args.batch_size / real_seconds
        flops = counted_flops(partial(trainer.step, synthetic[0])) / args.batch_size
        print(f"| {setting} | {synthetic_rate:7.1f} | {real_rate:7.1f} | {peak_memory} | "
              f"{syncs if syncs is not None else 'n/a'} | "
              f"{mfu(synthetic_rate, flops, peak_flops(device, setting.precision, args.peak_tflops))} |", flush=True)
        rates[str(setting)] = synthetic_rate
        del trainer
    ours, theirs = rates.get("bf16"), rates.get("authors fp32")
    if ours and theirs:
        print(f"\nours bf16 / authors fp32 (synthetic): {ours / theirs:.2f}x"
              + (f"; / authors tf32: {ours / rates['authors tf32']:.2f}x" if "authors tf32" in rates else ""))


def infer_section(args: argparse.Namespace, device: torch.device, settings: list[Setting]) -> None:
    height, width = args.infer_size
    print(f"\n## Inference at {height}x{width} after optimize_for_inference(), median of {args.steps} runs")
    print("| setting | " + " | ".join(f"batch {b} img/s" for b in args.infer_batches) + " | MFU (largest batch) |")
    print("|---" * (len(args.infer_batches) + 2) + "|")
    torch.manual_seed(0)
    system = DetrSystem(detr=args.model)
    model = system.model.to(device).eval()
    model.optimize_for_inference()
    flops = counted_flops(lambda: model(torch.randn(1, 3, height, width, device=device),
                                   torch.zeros(1, height, width, dtype=torch.bool, device=device)))
    for setting in settings:
        autocast = set_precision(setting.precision)
        forward = torch.compile(model, dynamic=False, backend=args.compile_backend) if setting.compiled else model
        rates = []
        for batch_size in args.infer_batches:
            images = torch.randn(batch_size, 3, height, width, device=device)
            mask = torch.zeros(batch_size, height, width, dtype=torch.bool, device=device)

            def run() -> None:
                with torch.inference_mode(), autocast(device):
                    forward(images, mask)

            for _ in range(args.warmup):
                run()
            times = []
            for _ in range(args.steps):
                synchronize(device)
                start = time.perf_counter()
                run()
                synchronize(device)
                times.append(time.perf_counter() - start)
            rates.append(batch_size / statistics.median(times))
        peak = peak_flops(device, setting.precision, args.peak_tflops)
        print(f"| {setting} | " + " | ".join(f"{rate:7.1f}" for rate in rates) + f" | {mfu(rates[-1], flops, peak)} |",
              flush=True)


def loss_section(args: argparse.Namespace, device: torch.device) -> None:
    print(f"\n## Loss after {args.loss_steps} steps on the real pipeline (same initial weights and data order)")
    settings = [Setting("fp32", compiled=False), Setting("bf16", compiled=False)]
    if args.authors:
        settings.append(Setting("fp32", compiled=False, authors=True))
    initial = None
    for setting in settings:
        trainer = make_trainer(args, device, setting)
        model = trainer.model if setting.authors else trainer.system.model
        if initial is None:  # the authors' model has our state-dict layout (the released checkpoints load into both)
            initial = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(initial)
        torch.manual_seed(0)
        random.seed(0)
        batches = forever(real_loader(args, device), device)
        losses = [trainer.step(next(batches)) for _ in range(args.loss_steps)]
        tail = torch.stack(losses[-max(1, args.loss_steps // 4):]).float()
        print(f"{setting}: first-step loss {losses[0].item():.3f}, mean of the last quarter "
              f"{tail.mean().item():.3f} (std {tail.std().item() if len(tail) > 1 else 0.0:.3f})", flush=True)
        del trainer


def sdpa_section(args: argparse.Namespace, device: torch.device) -> None:
    """bf16 training with and without cuDNN's fused attention (detr.models.layers.attention.TRAINING_SDPA_BACKENDS):
    the first step whose gradient norm or loss is not finite, from the same weights and data."""
    from torch.nn.attention import SDPBackend

    from detr.models.layers import attention

    print(f"\n## bf16 training: the first non-finite step in {args.sdpa_steps} (same initial weights and data)")
    shipped = list(attention.TRAINING_SDPA_BACKENDS)
    initial = None
    for name, backends in (("without cuDNN attention (shipped)", shipped),
                           ("with cuDNN attention (torch's default)", shipped + [SDPBackend.CUDNN_ATTENTION])):
        attention.TRAINING_SDPA_BACKENDS = backends
        trainer = make_trainer(args, device, Setting("bf16", compiled=False))
        if initial is None:
            initial = {k: v.clone() for k, v in trainer.system.model.state_dict().items()}
        trainer.system.model.load_state_dict(initial)
        torch.manual_seed(0)
        batches = forever(real_loader(args, device), device)
        first_bad, losses = None, []
        for index in range(args.sdpa_steps):
            loss = trainer.step(next(batches))
            losses.append(loss)
            if not (torch.isfinite(loss) and torch.isfinite(trainer.grad_norm)):
                first_bad = index + 1
                break
        tail = torch.stack(losses[-10:]).float()
        print(f"{name}: " + (f"non-finite at step {first_bad}" if first_bad else
                             f"finite for {args.sdpa_steps} steps, mean loss of the last 10 {tail.mean().item():.3f}"),
              flush=True)
        del trainer
    attention.TRAINING_SDPA_BACKENDS = shipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sections", default="train,infer,loss")
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--compile", choices=("both", "on", "off"), default="both")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile's backend ('eager' checks the tracing alone, in seconds on a CPU)")
    parser.add_argument("--backbone", default="resnet50")
    parser.add_argument("--batch-size", type=int, default=8, help="training images per step")
    parser.add_argument("--steps", type=int, default=20, help="timed steps (training) or runs (inference)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--workers", type=int, default=8, help="DataLoader workers of the real pipeline")
    parser.add_argument("--infer-batches", default="1,8,32")
    parser.add_argument("--infer-size", default="800x1333")
    parser.add_argument("--loss-steps", type=int, default=300)
    parser.add_argument("--sdpa-steps", type=int, default=100, help="steps of the sdpa section")
    parser.add_argument("--data", default="data/coco-mini", help="COCO-layout folder for the real pipeline")
    parser.add_argument("--authors", default=".authors/detr" if Path(".authors/detr/models").is_dir() else None,
                        help="a checkout of facebookresearch/detr: its training step beside ours")
    parser.add_argument("--authors-precisions", default="fp32,tf32")
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense peak of the card for the precision")
    parser.add_argument("--quick", action="store_true",
                        help="tiny model, 128-px images, 2 steps: checks that the script runs (CPU)")
    args = parser.parse_args()

    device = torch.device(args.device)
    args.infer_batches = [int(b) for b in args.infer_batches.split(",")]
    args.infer_size = tuple(int(v) for v in args.infer_size.split("x"))
    args.scales, args.max_size = list(range(480, 801, 32)), 1333
    args.model = DetrConfig(backbone=args.backbone, num_classes=91)
    if args.quick:
        args.model = TINY.replace(num_classes=91)
        args.scales, args.max_size, args.infer_size = [96, 128], 160, (128, 160)
        args.steps, args.warmup, args.loss_steps, args.workers, args.sdpa_steps = 2, 1, 4, 0, 3
        args.infer_batches = [1, 2]
        args.batch_size = min(args.batch_size, 2)
    precisions = [p for p in args.precisions.split(",") if p]
    compiled = {"both": (False, True), "on": (True,), "off": (False,)}[args.compile]
    settings = [Setting(p, c) for c in compiled for p in precisions]
    if args.authors:
        settings += [Setting(p, compiled=False, authors=True) for p in args.authors_precisions.split(",") if p]
    else:
        print("authors' code: not measured (no checkout of facebookresearch/detr; --authors DIR)")

    print(describe_machine(), flush=True)
    print(f"model: {args.model}")
    sections = args.sections.split(",")
    if "train" in sections:
        train_section(args, device, settings)
    if "infer" in sections:
        infer_section(args, device, [setting for setting in settings if not setting.authors])
    if "loss" in sections:
        loss_section(args, device)
    if "sdpa" in sections:
        sdpa_section(args, device)


if __name__ == "__main__":
    main()
