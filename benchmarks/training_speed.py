"""Our DETR training step against the authors' (facebookresearch/detr) on the CPU, from the same weights and batch.

    PYTHONPATH=. .venv/bin/python benchmarks/training_speed.py                     # R50, batch 2, 512×683, 2 threads
    PYTHONPATH=. .venv/bin/python benchmarks/training_speed.py --size 800x1066
    PYTHONPATH=. .venv/bin/python benchmarks/training_speed.py --variants "plain;channels_last;all"

One step = forward, Hungarian matching with the auxiliary layers, the set loss, backward, gradient clipping at
0.1 and AdamW with the two learning rates (1e-4; backbone 1e-5), DETR-R50 (the paper's config, 91 classes). Ours
is :class:`detr.lightning.system.DetrSystem`'s step (its model, ``compute_losses``, ``parameter_groups``) without
Lightning's loop; theirs is :class:`authors_detr.AuthorsTrainer` (a checkout of facebookresearch/detr,
``--authors``). Our weights are random (no ImageNet download) and copied into theirs: the state-dict keys are
the same. The batch: two random images, the second narrower and zero-padded (as a COCO batch is), 1..12 boxes
each.

``--variants``: ';'-separated sets of our speed-ups (``,``-separated names of :data:`OPTIONS`; "plain" = none,
"all" = every one but the comparisons (compile, torch_dropout, nchw_frozen_stages), "default" = what ``DetrSystem`` does by default); every variant and the authors'
step run alternately in one process, so that the machine's load falls on all alike. Per variant: the median
step time, the median of the per-round ratios ours / theirs, and where our step's time goes (backbone,
encoder, decoder, matcher, loss, backward, clip, optimiser; "other" = input projection, position encoding,
heads, loss sum).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

if "--omp-passive" in sys.argv:  # before torch starts its OpenMP pool
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from authors_detr import AuthorsTrainer  # noqa: E402
from machine import describe_machine  # noqa: E402

from detr.data.collate import pad_images  # noqa: E402
from detr.lightning.options import RuntimeOptions
from detr.lightning.system import DetrSystem  # noqa: E402
from detr.models.detr_family import DetrConfig  # noqa: E402
from detr.models.layers import attention  # noqa: E402
from detr.models.layers.conv_norm import direct_convolutions  # noqa: E402

#: Our speed-ups, each switched on by name in ``--variants``.
OPTIONS = {
    "channels_last": "the backbone in NHWC (RuntimeOptions(channels_last=True))",
    "fold_batch_norm": "every frozen BatchNorm folded into its convolution in training "
                       "(RuntimeOptions(fold_batch_norm=True))",
    "fused_adamw": "AdamW(fused=True) (else the for-loop AdamW, torch's CPU default)",
    "foreach_clip": "clip_grad_norm_(foreach=True) (else one norm per tensor)",
    "compile": "torch.compile of the model's forward (inductor)",
    "torch_dropout": "torch's own dropout draw (F.dropout, Bernoulli) instead of "
                     "detr.models.layers.cpu_kernels.dropout's (as before it; a comparison, not a speed-up)",
    "nchw_frozen_stages": "the frozen stem and layer1 in NCHW, as the trained stages (else NHWC on the CPU: "
                          "the backbone's frozen_stages_channels_last; a comparison, not a speed-up)",
    "direct_convolutions": "every convolution by oneDNN's direct kernel, as before the wide 3 × 3 ones ran by "
                           "Winograd (detr.models.layers.conv_norm.direct_convolutions; a comparison, not a "
                           "speed-up)",
}
#: Options that are not speed-ups of ours, left out of "all".
NOT_IN_ALL = ("compile", "torch_dropout", "nchw_frozen_stages", "direct_convolutions")
DEFAULT = ("fold_batch_norm", "fused_adamw", "foreach_clip")  # what DetrSystem does by default


def parse_variants(text: str) -> dict[str, tuple[str, ...]]:
    variants = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        if item == "plain":
            names: tuple[str, ...] = ()
        elif item == "all":
            names = tuple(name for name in OPTIONS if name not in NOT_IN_ALL)
        elif item == "default":
            names = DEFAULT
        else:
            names = tuple(name.strip() for name in item.split(","))
            unknown = [name for name in names if name not in OPTIONS]
            if unknown:
                raise SystemExit(f"--variants: unknown option(s) {unknown}; choose from {sorted(OPTIONS)}, "
                                 "'plain', 'all' or 'default'")
        variants[item] = names
    return variants


def make_batch(height: int, width: int, num_classes: int, seed: int = 0) -> tuple:
    """Two images ([3, H, W] and [3, H, W − 64], padded to W) and 1..12 random boxes each."""
    generator = torch.Generator().manual_seed(seed)
    images = [torch.randn(3, height, width, generator=generator),
              torch.randn(3, height, width - 64, generator=generator)]
    batch, mask = pad_images(images)
    targets = []
    for count in (5, 12):
        centre = torch.rand(count, 2, generator=generator) * 0.6 + 0.2
        size = torch.rand(count, 2, generator=generator) * 0.3 + 0.05
        targets.append({"boxes": torch.cat([centre, size], 1),
                        "labels": torch.randint(1, num_classes, (count,), generator=generator)})
    return batch, mask, targets


class Timer:
    """Wall time per phase of our step, by forward hooks on the modules (the CPU runs synchronously)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.started: dict[str, float] = {}

    def watch_method(self, owner: object, name: str, phase: str) -> None:
        """Time calls of ``owner.name`` (a module that its parent calls by a method other than ``forward``)."""
        method = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            result = method(*args, **kwargs)
            self.add(phase, time.perf_counter() - start)
            return result
        setattr(owner, name, timed)

    def watch(self, module: torch.nn.Module, phase: str) -> None:
        module.register_forward_pre_hook(lambda *_: self.started.__setitem__(phase, time.perf_counter()))
        module.register_forward_hook(lambda *_: self.add(phase, time.perf_counter() - self.started[phase]))

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] += seconds


@contextlib.contextmanager
def torch_dropout() -> Iterator[None]:
    """Within the block, the layers' dropout is torch's own draw (``F.dropout``, read at call time)."""
    ours = attention.dropout
    attention.dropout = lambda x, p, training=True: F.dropout(x, p, training)
    try:
        yield
    finally:
        attention.dropout = ours


class OurTrainer:
    """DetrSystem's training step (as Lightning runs it: model, compute_losses, backward, clip, AdamW)."""

    def __init__(self, config: DetrConfig, options: tuple[str, ...], seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.system = DetrSystem(detr=config, runtime=RuntimeOptions(channels_last="channels_last" in options,
                                                                     fold_batch_norm="fold_batch_norm" in options)
                                 ).train()
        self.options = options
        model = self.system.model
        model.backbone[0].frozen_stages_channels_last = "nchw_frozen_stages" not in options
        self.forward = torch.compile(model) if "compile" in options else model
        self.optimizer = torch.optim.AdamW(self.system.parameter_groups(), lr=1e-4, weight_decay=1e-4,
                                           fused="fused_adamw" in options or None,
                                           foreach=False if "fused_adamw" not in options else None)
        self.timer = Timer()
        if "compile" not in options:  # compiled modules run no hooks
            self.timer.watch_method(model.backbone[0], "forward_with_stages", "backbone")
            self.timer.watch(model.transformer.encoder, "encoder")
            self.timer.watch(model.transformer.decoder, "decoder")
        self.timer.watch(self.system.criterion.matcher, "matcher")
        self.timer.watch(self.system.criterion, "criterion")

    def step(self, batch: tuple) -> torch.Tensor:
        with contextlib.ExitStack() as options:
            if "direct_convolutions" in self.options:
                options.enter_context(direct_convolutions())
            if "torch_dropout" in self.options:
                options.enter_context(torch_dropout())
            return self._step(batch)

    def _step(self, batch: tuple) -> torch.Tensor:
        images, mask, targets = batch
        timer = self.timer
        start = time.perf_counter()
        outputs = self.forward(images, mask, targets=targets)
        losses = self.system.compute_losses(outputs, targets)
        loss_value = losses["loss"].item()  # what Lightning's progress bar reads, as the authors' log does
        tick = time.perf_counter()
        timer.add("forward + loss", tick - start)
        self.optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        timer.add("backward", -tick + (tick := time.perf_counter()))
        parameters = [p for group in self.optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(parameters, 0.1, foreach="foreach_clip" in self.options)
        timer.add("clip", -tick + (tick := time.perf_counter()))
        self.optimizer.step()
        timer.add("optimiser", time.perf_counter() - tick)
        return torch.tensor(loss_value)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="512x683", help="H×W of the batch (default 512x683; the paper's 800x1066)")
    parser.add_argument("--variants", default="plain;default;all", help="';'-separated sets of options (see above)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (each runs every trainer once)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--authors", default=".authors/detr", help="a checkout of facebookresearch/detr")
    parser.add_argument("--profile", action="store_true",
                        help="after the rounds, torch.profiler over two steps of the first variant: its top operators")
    parser.add_argument("--omp-passive", action="store_true",
                        help="OMP_WAIT_POLICY=PASSIVE for both sides: on a loaded machine, spinning OpenMP threads "
                             "wait for descheduled ones and a 2-thread step takes up to 10× longer, by chance")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    height, width = (int(value) for value in args.size.lower().split("x"))
    variants = parse_variants(args.variants)
    config = DetrConfig()  # R50, the paper's COCO model
    print(describe_machine(), flush=True)
    print(f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}")
    print(f"DETR-R50, batch 2 at {height}×{width} (second image {width - 64} wide, padded), random weights, "
          f"{args.rounds} rounds after {args.warmup} warm-up")
    for name, description in OPTIONS.items():
        print(f"  {name}: {description}")

    ours = {label: OurTrainer(config, names) for label, names in variants.items()}
    theirs = AuthorsTrainer(args.authors, config, torch.device("cpu"))
    weights = next(iter(ours.values())).system.model.state_dict()
    missing, unexpected = theirs.model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise SystemExit(f"our weights do not fit the authors' model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for trainer in ours.values():
        trainer.system.model.load_state_dict(weights)
    batch = make_batch(height, width, config.num_classes)

    trainers = {"authors": theirs, **ours}
    for _ in range(args.warmup):
        for trainer in trainers.values():
            trainer.step(batch)
    for trainer in ours.values():
        trainer.timer.seconds.clear()
    times: dict[str, list[float]] = defaultdict(list)
    for round_index in range(args.rounds):
        order = list(trainers.items())
        for label, trainer in order if round_index % 2 == 0 else reversed(order):
            start = time.perf_counter()
            trainer.step(batch)
            times[label].append(time.perf_counter() - start)
            print(f"round {round_index}: {label} {times[label][-1]:.3f} s", flush=True)

    authors = times["authors"]
    print(f"\nauthors' step: median {statistics.median(authors):.3f} s")
    print("\n| variant | ours (s) | authors (s) | ours / authors (median of rounds) |")
    print("|---|---|---|---|")
    for label in ours:
        ratios = [mine / theirs_ for mine, theirs_ in zip(times[label], authors)]
        print(f"| {label or 'plain'} | {statistics.median(times[label]):.3f} | {statistics.median(authors):.3f} "
              f"| {statistics.median(ratios):.3f} |")
    print("\nWhere our step's time goes (mean seconds per step):")
    phases = ("backbone", "encoder", "decoder", "other forward", "matcher", "loss", "backward", "clip", "optimiser")
    print("| variant | " + " | ".join(phases) + " |")
    print("|---|" + "---|" * len(phases))
    for label, trainer in ours.items():
        seconds = {phase: value / args.rounds for phase, value in trainer.timer.seconds.items()}
        model_parts = sum(seconds.get(phase, 0.0) for phase in ("backbone", "encoder", "decoder"))
        seconds["loss"] = seconds.get("criterion", 0.0) - seconds.get("matcher", 0.0)
        seconds["other forward"] = seconds["forward + loss"] - model_parts - seconds.get("criterion", 0.0)
        print(f"| {label} | " + " | ".join(f"{seconds.get(phase, float('nan')):.3f}" for phase in phases) + " |")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        label, trainer = next(iter(ours.items()))
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            for _ in range(2):
                trainer.step(batch)
        print(f"\nProfile of two steps of {label!r} (seconds are for both):")
        print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


if __name__ == "__main__":
    main()
