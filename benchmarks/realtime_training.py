"""CPU training step of the real-time DETRs beside transformers' own training path, on the same weights.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/realtime_training.py [--models rtdetr_r18 dfine_s rfdetr_nano]
        [--batch 2] [--threads 2] [--rounds 5] [--components] [--profile[-shapes]]
        [--omp-passive] [--direct-convolutions] [--flops] [--count-ops]

Each model of the released layout (benchmarks/realtime_speed.py's ``MODELS``: RT-DETR-R18 and D-FINE-S at 640 × 640,
RF-DETR-Nano at 384 × 384) is built by transformers with random weights, saved with ``save_pretrained`` and loaded
with ``detr.load_checkpoint``, so both sides start from the same weights. Both train on the same batch (the two
photos of tests.helpers_rtdetr, repeated to ``--batch``) and the same targets (seeded random boxes, 2-7 per image,
80 classes). A step is, on both sides: the model in training mode, forward with the targets (RT-DETR's and D-FINE's
contrastive denoising, RF-DETR's 13 Group DETR groups), the full loss (transformers: ``labels=`` to
``*ForObjectDetection``, its ``outputs.loss``; ours: :func:`detr.loss.build.build_criterion`'s criterion with the
configs' recipe, weighted by its ``weight_dict``), backward, gradient clipping at a global norm of 0.1 and a fused
AdamW step. Dropout is off on both sides (transformers' RF-DETR decoder defaults to 0.1, the authors train with 0),
so the steps do the same work.

Before timing, the losses are checked equal: one forward of each side in training mode with denoising switched
off on both (transformers ``config.num_denoising = 0``, ours the decoder's ``denoising = False``), same weights,
same targets; compared: transformers' total ``loss`` with ours (the weighted sum), and every weighted term of
transformers' ``loss_dict`` (its names mapped to ours: tests/helpers_rtdetr.our_term_name) with ours. The D-FINE
check builds our criterion without GO-LSD's union (``matching_union=False``: transformers matches layer by layer)
and leaves out the terms transformers does not train (the last layer's FGL, the first layer's plain head:
tests/loss/test_criterion_dfine.py); the timed step uses the authors' criterion (with the union).

Timing: ``--rounds`` rounds after a warm-up round; each round runs every model's two sides one step each, in
alternating order, so that both share the machine's load; printed: the median of each side's step, the median of
the per-round ratios (ours / transformers) and the load average before and after. ``--components`` adds the
breakdown (forward hooks and timers): backbone, encoder (RF-DETR: the projector), decoder, matcher, loss (the
criterion or transformers' loss function, the matcher included), backward, optimizer (clipping and AdamW).
``--profile`` ends with torch.profiler's top operators of two steps of each side per model (``--profile-shapes``: each
operator's input shapes apart, so that a row is a layer). ``--rfdetr-package`` adds a
third side for RF-DETR: the authors' ``rfdetr`` package's model of the preset (its own random weights, the same
layout) and its criterion, in the same rounds (its loss is not checked against ours: other weights).
``--omp-passive`` sets ``OMP_WAIT_POLICY=PASSIVE`` for the process (both sides): on a loaded machine a spinning
OpenMP thread waits at every parallel region's barrier for a descheduled one, and the parts made of many small
kernels (the fused AdamW: 7-11 s against 0.3 s passive, 2 threads, load 9) take several times longer by chance.
``--direct-convolutions`` adds a side: our step (the same model and optimizer) with the convolutions by oneDNN's
direct kernel only, as before Winograd's wide 3 × 3 ones and the NHWC depthwise ones
(detr/models/layers/conv_norm.py ``training_conv``), in the same rounds.
``--count-ops`` ends with one more step of each side counted by a dispatch mode (tests/helpers_cuda.py's
``DeviceReads``): the operations dispatched in its forward and loss, its backward and its optimizer step (views
included: a GPU launches a kernel for most of the others, and a host-bound GPU step pays each launch), and the
operations that would read a device value back (``.item()``, a boolean mask's indexing, ``nonzero``, ...), every
one of them, the host-side ones of the matching included.
Results: docs/measurements/speed.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

if "--omp-passive" in sys.argv:  # before torch starts its OpenMP pool
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.helpers_*

from arithmetic import floor_table, product_rate  # noqa: E402
from realtime_speed import MODELS, SIZE, SIZES, pair_of_models, rfdetr_package_model  # noqa: E402

from detr.lightning.param_groups import parameter_groups  # noqa: E402
from detr.models.layers.conv_norm import direct_convolutions  # noqa: E402
from detr.loss.build import build_criterion  # noqa: E402
from detr.models.build import recipe_for  # noqa: E402
from tests.helpers_cuda import DeviceReads  # noqa: E402
from tests.helpers_rtdetr import our_term_name, square_photos  # noqa: E402

#: The configs' recipes (configs/rtdetr_r18vd_coco.yaml, dfine_s_coco.yaml, rfdetr_base_coco.yaml): loss settings
#: and optimizer settings.
LOSS = {"rtdetr": {"cost_class": 2.0, "cost_bbox": 5.0, "cost_giou": 2.0},
        "dfine": {"cost_class": 2.0, "cost_bbox": 5.0, "cost_giou": 2.0, "loss_fgl": 0.15, "loss_ddf": 1.5},
        "rfdetr": {"cost_class": 2.0, "cost_bbox": 5.0, "cost_giou": 2.0}}
OPTIMIZER = {"rtdetr": {"lr": 1e-4, "lr_backbone": 1e-5},
             "dfine": {"lr": 2e-4, "lr_backbone": 1e-4},
             "rfdetr": {"lr": 1e-4, "lr_backbone": 1.5e-4, "lr_layer_decay": 0.8, "lr_component_decay": 0.7}}
CLIP, WEIGHT_DECAY, NUM_CLASSES = 0.1, 1e-4, 80
PARTS = ("backbone", "encoder", "decoder", "matcher", "loss", "backward", "optimizer")


def build_our_training(model: torch.nn.Module, family: str, **criterion_options
                       ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Our side's criterion and optimizer for ``model``, as DetrSystem builds them: the recipe of the model's
    family (:func:`detr.models.build.recipe_for`; ``family`` names it in messages only), ``criterion_options``
    replacing loss recipe fields."""
    criterion = build_criterion(model.config, **criterion_options)
    optimizer = recipe_for(model.config).optimizer
    groups = parameter_groups(model, lr=optimizer.lr, lr_backbone=optimizer.lr_backbone,
                              lr_layer_decay=optimizer.lr_layer_decay, lr_component_decay=optimizer.lr_component_decay)
    return criterion, torch.optim.AdamW(groups, lr=optimizer.lr, weight_decay=optimizer.weight_decay, fused=True)


def make_targets(batch: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Per image 2-7 boxes (normalised cxcywh) of random classes among 80."""
    generator = torch.Generator().manual_seed(seed)
    targets = []
    for _ in range(batch):
        count = int(torch.randint(2, 8, (), generator=generator))
        centres = torch.rand(count, 2, generator=generator) * 0.6 + 0.2
        sizes = torch.rand(count, 2, generator=generator) * 0.3 + 0.05
        targets.append({"labels": torch.randint(0, NUM_CLASSES, (count,), generator=generator),
                        "boxes": torch.cat([centres, sizes], 1)})
    return targets


def without_dropout(model: torch.nn.Module) -> None:
    """Every dropout of ``model`` at 0 (nn.Dropout modules and the float ``*dropout`` attributes that
    transformers' layers pass to ``nn.functional.dropout``)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name in ("dropout", "activation_dropout", "attention_dropout", "drop_prob"):
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)


def set_denoising(ours: torch.nn.Module, theirs: torch.nn.Module, on: bool, count: int) -> None:
    for module in ours.modules():
        if isinstance(getattr(module, "denoising", None), bool):
            module.denoising = on
    if hasattr(theirs.config, "num_denoising"):
        theirs.config.num_denoising = count if on else 0


class Timer:
    """Seconds per named part, summed until :meth:`clear`: forward hooks on modules, wrapped callables."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def watch(self, name: str, module: torch.nn.Module) -> None:
        started: list[float] = []
        module.register_forward_pre_hook(lambda *_: started.append(time.perf_counter()))
        module.register_forward_hook(lambda *_: self.add(name, started.pop()))

    def wrap(self, name: str, function: Callable) -> Callable:
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.add(name, start)
        return timed

    def add(self, name: str, start: float) -> None:
        self.seconds[name] += time.perf_counter() - start

    def clear(self) -> None:
        self.seconds.clear()


def watch_ours(timer: Timer, model: torch.nn.Module, criterion: torch.nn.Module) -> None:
    timer.watch("backbone", model.backbone)
    if hasattr(model, "projector"):
        for projector in model.projector:
            timer.watch("encoder", projector)
    else:
        timer.watch("encoder", model.encoder)
    timer.watch("decoder", model.decoder)
    timer.watch("matcher", criterion.matcher)
    timer.watch("loss", criterion)


def watch_theirs(timer: Timer, model: torch.nn.Module) -> None:
    inner = model.model
    if hasattr(inner.backbone, "projector"):  # RF-DETR
        timer.watch("backbone", inner.backbone.backbone)
        timer.watch("encoder", inner.backbone.projector)
    else:
        timer.watch("backbone", inner.backbone)
        timer.watch("encoder", inner.encoder)
        for projection in inner.encoder_input_proj:
            timer.watch("encoder", projection)
    timer.watch("decoder", inner.decoder)
    import transformers.loss.loss_lw_detr as lw
    import transformers.loss.loss_rt_detr as rt
    for matcher in (rt.RTDetrHungarianMatcher, lw.LwDetrHungarianMatcher):
        if not getattr(matcher.forward, "timed", False):
            matcher.forward = _timed_forward(matcher.forward)
    timer.watch("model", inner)  # the loss: the forward's time outside the inner model


_ACTIVE: list[Timer] = []


def _timed_forward(forward: Callable) -> Callable:
    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return forward(self, *args, **kwargs)
        finally:
            if _ACTIVE:
                _ACTIVE[-1].add("matcher", start)
    timed.timed = True
    return timed


class Side:
    """One side's training step on one model: ``step()`` runs it, ``timer`` holds its parts."""

    def __init__(self, step: Callable[[], torch.Tensor], timer: Timer) -> None:
        self.step, self.timer = step, timer


def backward_and_update(model, optimizer, loss: torch.Tensor, timer: Timer) -> torch.Tensor:
    """The step after the loss, alike on both sides: backward, clipping at :data:`CLIP`, the optimizer."""
    start = time.perf_counter()
    loss.backward()
    timer.add("backward", start)
    start = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP, foreach=True)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    timer.add("optimizer", start)
    return loss.detach()


def our_side(model, criterion, optimizer, images, mask, targets, autocast=nullcontext, kernels=nullcontext
             ) -> Side:
    """Our training step; ``autocast``: the context of the forward and loss (none: float32); ``kernels``: the
    context of the whole step (:func:`detr.models.layers.conv_norm.direct_convolutions` for the plain kernels)."""
    timer = Timer()

    def step() -> torch.Tensor:
        with kernels():
            with autocast():
                outputs = model(images, mask, targets=targets)
                losses = criterion(outputs, targets)
                loss = sum(losses[name] * weight for name, weight in criterion.weight_dict.items())
            return backward_and_update(model, optimizer, loss, timer)
    return Side(step, timer)


def their_side(model, optimizer, images, labels, autocast=nullcontext) -> Side:
    """transformers' training step (its loss inside the forward); ``autocast`` as :func:`our_side`'s."""
    timer = Timer()

    def step() -> torch.Tensor:
        _ACTIVE.append(timer)
        start = time.perf_counter()
        try:
            with autocast():
                loss = model(pixel_values=images, labels=labels).loss
        finally:
            _ACTIVE.pop()
            timer.add("forward", start)
        return backward_and_update(model, optimizer, loss, timer)
    return Side(step, timer)


def rfdetr_package_training(name: str, device: torch.device | str = "cpu"):
    """The authors' ``rfdetr`` package's model of ``name``'s preset (its own random weights: the same layout and
    sizes: realtime_speed.rfdetr_package_model), its criterion (``build_criterion_from_config`` with the package's
    default TrainConfig) and its NestedTensor."""
    import importlib

    config_module, lwdetr, model_config, model = rfdetr_package_model(name, torch.device(device).type)
    criterion, _ = lwdetr.build_criterion_from_config(model_config,
                                                      config_module.TrainConfig(dataset_dir=".", output_dir="."))
    nested = importlib.import_module("rfdetr.utilities.tensors").NestedTensor
    return model, criterion, nested


def package_side(model, criterion, nested, optimizer, images, mask, targets, autocast=nullcontext) -> Side:
    """The rfdetr package's training step: its model on a NestedTensor with the targets, its criterion weighted
    by its ``weight_dict``, then the same backward, clipping and optimizer."""
    timer = Timer()

    def step() -> torch.Tensor:
        with autocast():
            losses = criterion(model(nested(images, mask), targets), targets)
            loss = sum(losses[name] * weight for name, weight in criterion.weight_dict.items() if name in losses)
        return backward_and_update(model, optimizer, loss, timer)
    return Side(step, timer)


def check_losses(name: str, family: str, ours, theirs, images, mask, targets, labels) -> str:
    """One forward of each side with denoising off: transformers' total and weighted terms against ours.
    Returns a line saying what was compared and the largest difference; raises AssertionError beyond 1e-4
    (relative to the total)."""
    denoising = getattr(theirs.config, "num_denoising", 0)
    set_denoising(ours, theirs, False, denoising)
    criterion = build_criterion(ours.config, **LOSS[family], **({"matching_union": False} if family == "dfine" else {}))
    criterion.to(images.device)
    try:
        with torch.no_grad():
            their_outputs = theirs(pixel_values=images, labels=labels)
            our_losses = criterion(ours(images, mask, targets=targets), targets)
    finally:
        set_denoising(ours, theirs, True, denoising)
    weights = criterion.weight_dict
    layers = ours.config.num_decoder_layers
    class_term = "loss_ce" if family == "rfdetr" else "loss_vfl"
    theirs_weighted = {}
    for their_name, value in their_outputs.loss_dict.items():
        if family == "rfdetr":
            our_name = their_name
        else:
            our_name = our_term_name(their_name, layers, class_term)
        if family == "dfine" and "_aux_" in their_name and not our_name.endswith("_enc"):
            # transformers' model hands its loss L + 1 class and box layers (the first layer's plain head first)
            # beside L corner layers, which its loss zips: its aux layer i is our layer i - 1 (i = 0: our plain
            # head, _pre) for the class and box terms, and pairs them with another layer's corners (FGL, DDF)
            if "fgl" in their_name or "ddf" in their_name:
                continue
            index = int(their_name.rsplit("_", 1)[1])
            our_name = our_name.rsplit("_", 1)[0] + ("_pre" if index == 0 else f"_{index - 1}")
        if our_name in weights:
            weight = 1.0 if family != "rfdetr" else weights[our_name]  # RT-DETR's and D-FINE's loss_dict is weighted
            theirs_weighted[our_name] = float(value) * weight
    total_ours = float(sum(our_losses[n] * w for n, w in weights.items()))
    compared_total = float(sum(our_losses[n] * weights[n] for n in theirs_weighted))
    differences = {n: abs(float(our_losses[n]) * weights[n] - v) for n, v in theirs_weighted.items()}
    left_out = sorted(set(weights) - set(theirs_weighted))
    worst = max(differences, key=differences.get)
    their_total, their_compared = float(their_outputs.loss), sum(theirs_weighted.values())
    line = (f"{name}: {len(differences)} weighted terms compared, largest difference {differences[worst]:.2e} "
            f"({worst}); transformers' loss {their_total:.6f} (the compared terms {their_compared:.6f}), ours over "
            f"the same terms {compared_total:.6f}, ours in all {total_ours:.6f}; ours not compared: "
            f"{', '.join(left_out) or 'none'}")
    tolerance = 1e-4 * max(1.0, abs(their_total))
    if differences[worst] > tolerance or abs(compared_total - their_compared) > tolerance:
        raise AssertionError(f"the losses differ: {line}; {differences}")
    return line


def count_operations(step: Callable[[], torch.Tensor]) -> tuple[int, int, int, int]:
    """One ``step`` counted (``--count-ops``): operations dispatched in the forward and loss, in backward, in
    clipping and the optimizer, and the reads of device values among all of them."""
    reads, marks = DeviceReads(exempt=False), []
    backward = torch.Tensor.backward

    def marked(tensor, *args, **kwargs):  # the operation counts where backward starts and ends
        marks.append(reads.operations)
        backward(tensor, *args, **kwargs)
        marks.append(reads.operations)

    torch.Tensor.backward = marked
    try:
        with reads:
            step()
    finally:
        torch.Tensor.backward = backward
    return marks[0], marks[-1] - marks[0], reads.operations - marks[-1], len(reads.found)


def median_text(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=("rtdetr_r18", "dfine_s", "rfdetr_nano"),
                        default=["rtdetr_r18", "dfine_s", "rfdetr_nano"])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (0: only the check of the losses)")
    parser.add_argument("--components", action="store_true", help="also time each step's parts")
    parser.add_argument("--profile", action="store_true", help="torch.profiler's top operators of our steps")
    parser.add_argument("--profile-shapes", action="store_true",
                        help="--profile with each operator's input shapes apart (which layer costs what)")
    parser.add_argument("--no-check", action="store_true", help="skip the check that the losses are equal")
    parser.add_argument("--rfdetr-package", action="store_true",
                        help="RF-DETR also trained by the authors' rfdetr package (on PYTHONPATH: pip install "
                             "--target DIR rfdetr --no-deps), a third side of each round")
    parser.add_argument("--channels-last", action="store_true",
                        help="our backbone in NHWC (model.runtime.channels_last), transformers' as it is")
    parser.add_argument("--direct-convolutions", action="store_true",
                        help="add our step with oneDNN's direct kernel only (no Winograd, no NHWC depthwise: "
                             "detr.models.layers.conv_norm.direct_convolutions), as before them")
    parser.add_argument("--omp-passive", action="store_true",
                        help="OMP_WAIT_POLICY=PASSIVE for both sides (the module docstring)")
    parser.add_argument("--count-ops", action="store_true",
                        help="also count each side's operations per step (forward and loss, backward, optimizer) and "
                             "its reads of device values (the module docstring)")
    parser.add_argument("--flops", action="store_true",
                        help="also count each side's dense arithmetic per step and its least time at this machine's "
                             "best product rate (benchmarks/arithmetic.py)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    sides: dict[str, dict[str, Side]] = {}
    for name in args.models:
        square = SIZES.get(name, SIZE)
        photos = square_photos(square)
        images = photos[torch.arange(args.batch) % len(photos)].contiguous()
        mask = torch.zeros(args.batch, square, square, dtype=torch.bool)
        targets = make_targets(args.batch)
        labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
        family, theirs, ours = pair_of_models(name)
        theirs.train()
        ours.train()
        without_dropout(theirs)
        without_dropout(ours)
        if not args.no_check:
            try:
                print(check_losses(name, family, ours, theirs, images, mask, targets, labels), flush=True)
            except AssertionError as error:  # reported, and the timing still runs
                print(f"CHECK FAILED: {error}", flush=True)
        if args.rounds == 0:
            continue
        if args.channels_last:
            ours.use_channels_last()
        criterion, optimizer = build_our_training(ours, family)
        their_optimizer = torch.optim.AdamW(theirs.parameters(), lr=OPTIMIZER[family]["lr"],
                                            weight_decay=WEIGHT_DECAY, fused=True)
        if args.rfdetr_package and family == "rfdetr":
            package_model, package_criterion, nested = rfdetr_package_training(name)
            package_model.train()
            without_dropout(package_model)
            package_optimizer = torch.optim.AdamW(package_model.parameters(), lr=OPTIMIZER[family]["lr"],
                                                  weight_decay=WEIGHT_DECAY, fused=True)
            package = {"rfdetr": package_side(package_model, package_criterion, nested, package_optimizer, images,
                                              mask, targets)}
        else:
            package = {}
        sides[name] = {**package, "theirs": their_side(theirs, their_optimizer, images, labels),
                       "ours": our_side(ours, criterion, optimizer, images, mask, targets)}
        if args.direct_convolutions:  # the same model and optimizer: one more step per round
            sides[name]["direct"] = our_side(ours, criterion, optimizer, images, mask, targets,
                                             kernels=direct_convolutions)
        if args.components:
            watch_theirs(sides[name]["theirs"].timer, theirs)
            watch_ours(sides[name]["ours"].timer, ours, criterion)
    if args.rounds == 0:
        return
    load_before = os.getloadavg()
    times: dict[str, dict[str, list[float]]] = {name: defaultdict(list) for name in sides}
    parts: dict[str, dict[str, dict[str, list[float]]]] = {
        name: {side: defaultdict(list) for side in sides[name]} for name in sides}
    for round_ in range(args.rounds + 1):  # round 0: warm-up
        for name, pair in sides.items():
            for side in sorted(pair, reverse=round_ % 2 == 1):
                pair[side].timer.clear()
                start = time.perf_counter()
                loss = pair[side].step()
                elapsed = time.perf_counter() - start
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"{name} ({side}): the loss is {loss.item()}")
                if round_:
                    times[name][side].append(elapsed)
                    seconds = dict(pair[side].timer.seconds)
                    if side == "theirs" and "model" in seconds:  # their loss: what the forward does after the model
                        seconds["loss"] = seconds.pop("forward") - seconds.pop("model")
                    for part, value in seconds.items():
                        parts[name][side][part].append(value)
        steps = "; ".join(f"{name} {times[name]['theirs'][-1]:.1f} s / {times[name]['ours'][-1]:.1f} s"
                          for name in sides if round_)
        print(f"round {round_} done, load average {os.getloadavg()[0]:.1f}; transformers / ours: {steps}",
              file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    print(f"\ntorch {torch.__version__}, {args.threads} threads, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}, batch {args.batch}, {args.rounds} rounds; "
          f"load average (1 min) {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"{'model':14} {'transformers s':>18} {'ours s':>18} {'ours / transformers':>22}")
    for name in sides:
        ratios = [o / t for o, t in zip(times[name]["ours"], times[name]["theirs"])]
        print(f"{name:14} {median_text(times[name]['theirs']):>18} {median_text(times[name]['ours']):>18} "
              f"{median_text(ratios):>22}")
    for name in sides:
        if "rfdetr" in times[name]:
            ratios = [o / p for o, p in zip(times[name]["ours"], times[name]["rfdetr"])]
            print(f"{name:14} rfdetr package {median_text(times[name]['rfdetr'])} s; ours / package "
                  f"{median_text(ratios)} (the package's own random weights of the same preset)")
    for name in sides:
        if "direct" in times[name]:
            ratios = [o / d for o, d in zip(times[name]["ours"], times[name]["direct"])]
            print(f"{name:14} ours with the direct convolutions only {median_text(times[name]['direct'])} s; "
                  f"ours / that {median_text(ratios)}")
    if args.components:
        for name in sides:
            print(f"\n{name}: medians (s)   transformers     ours")
            for part in PARTS:
                values = [statistics.median(parts[name][side][part]) if parts[name][side][part] else float("nan")
                          for side in ("theirs", "ours")]
                print(f"  {part:12} {values[0]:14.3f} {values[1]:8.3f}")
    if args.flops:  # one more step of each side, counted
        steps = {name: {side: sides[name][side].step for side in ("theirs", "ours")} for name in sides}
        print("\n" + floor_table(steps, {name: statistics.median(times[name]["theirs"]) for name in sides},
                                 product_rate()))
    if args.count_ops:  # one more step of each side, counted
        print("\n| model | side | operations: forward and loss | backward | optimizer | reads of device values |")
        print("|---|---|---|---|---|---|")
        for name in sides:
            for side in ("theirs", "ours"):
                counts = count_operations(sides[name][side].step)
                print(f"| {MODELS[name][0]} | {side} | {' | '.join(str(count) for count in counts)} |")
    if args.profile or args.profile_shapes:
        from torch.profiler import ProfilerActivity, profile
        for name in sides:
            for side_name, side in sides[name].items():
                with profile(activities=[ProfilerActivity.CPU], record_shapes=args.profile_shapes) as profiler:
                    side.step()
                    side.step()
                print(f"\n{MODELS[name][0]}: two steps' top operators, {side_name}")
                print(profiler.key_averages(group_by_input_shape=args.profile_shapes).table(
                    sort_by="self_cpu_time_total", row_limit=30))


if __name__ == "__main__":
    main()
