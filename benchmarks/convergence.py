"""Convergence on a CPU budget (docs/convergence.md): train one configuration on the synthetic shapes set
for a fixed time and print COCO AP / AP50 (pycocotools) at regular points, with images per second.

    .venv/bin/python benchmarks/convergence.py --preset paper --minutes 10 --eval-every 2
    .venv/bin/python benchmarks/convergence.py --preset best --minutes 10 --eval-every 2 --jsonl runs.jsonl
    .venv/bin/python benchmarks/convergence.py --preset best --set lr=2e-4 --set num_queries=30
    .venv/bin/python benchmarks/convergence.py --step-time paper anchor best   # ms per training step

Data: the shapes set of :mod:`detr.data.shapes` (2000 train / 200 val images, 128 px, five classes),
rendered in memory with the same per-image seeds as ``tools/make_shapes.py`` (no JPEG round trip), or
any COCO-layout folder with ``--data-root`` (e.g. data/shapes after ``tools/make_shapes.py``). Labels
are contiguous (0..K-1); evaluation maps them back to category ids.

Training is a plain PyTorch loop (no Lightning trainer) over the model, criterion and parameter groups
that :class:`detr.lightning.DetrSystem` builds from the same arguments: AdamW with a separate backbone
learning rate, weight decay, gradient clipping at global norm ``clip``, optional linear warm-up, an optional
linear decay to zero over the budget's end (``lr_decay_fraction``, as the demo's ``TrainingSpeed`` does it),
horizontal flips. The budget is training time only (evaluation excluded), on the wall clock, or a number of
steps (``--train-steps``: runs on a drifting machine, or two at once with ``--threads 1``, stay comparable). On shared cores the wall clock charges a
run for its neighbours' load, so every evaluation line also prints the load average, the step count
and images/s: runs made under different load compare by step count. ``--clock cpu`` counts process CPU
time / threads instead; it is no cure (OpenMP threads spin while they wait for a descheduled sibling,
and that spinning counts as CPU time).

Presets (``--preset``) are the configurations measured in docs/convergence.md: ``paper`` (the authors'
settings on the small model), one per option alone, and ``best``. ``--set key=value`` overrides any field of
:class:`RunConfig` (values parsed as JSON, else kept as strings).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import io
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from detr.categories import CategoryMap
from detr.criterion import SetCriterion
from detr.data import transforms
from detr.lightning import DetrSystem
from detr.lightning.callbacks import budget_lr_factor
from detr.postprocess import PostProcess

IMAGENET_MEAN = torch.tensor(transforms.IMAGENET_MEAN).view(1, 3, 1, 1)
IMAGENET_STD = torch.tensor(transforms.IMAGENET_STD).view(1, 3, 1, 1)


@dataclass
class RunConfig:
    """Everything one run depends on: DetrSystem arguments (model, loss, learning rates), loop, data."""

    # --- build_detr (a small model for 128-px images) ---
    backbone: str = "resnet18"
    hidden_dim: int = 128
    num_heads: int = 8
    num_encoder_layers: int = 3
    num_decoder_layers: int = 3
    dim_feedforward: int = 1024
    dropout: float = 0.1
    num_queries: int = 20
    backbone_norm: str = "frozen_batch_norm"
    backbone_trainable_layers: int = 3
    backbone_last_stage: str = "layer4"
    query_type: str = "learned"
    class_head: str = "softmax"
    denoising: bool = False
    denoising_groups: int = 5
    denoising_label_noise: float = 0.2
    denoising_box_noise: float = 0.4
    anchor_local_attention: float = 0.0
    query_groups: int = 1
    dense_aux_head: bool = False
    # --- matcher and criterion ---
    cost_class: float = 1.0
    cost_bbox: float = 5.0
    cost_giou: float = 2.0
    loss_ce: float = 1.0
    loss_bbox: float = 5.0
    loss_giou: float = 2.0
    eos_coef: float = 0.1
    # --- optimiser ---
    lr: float = 1e-4
    lr_backbone: float = 1e-5
    weight_decay: float = 1e-4
    clip: float = 0.1
    warmup_steps: int = 0
    lr_drop_at: float = 0.0  # multiply every lr by lr_drop_gamma after this fraction of the budget (0: never)
    lr_drop_gamma: float = 0.1
    lr_decay_fraction: float = 0.0  # > 0: every lr falls linearly to zero over this last share of the budget
    batch_size: int = 16
    autocast_bf16: bool = False
    channels_last: bool = False  # run the backbone in NHWC (oneDNN's preferred layout)
    backbone_bf16: bool = False  # the backbone in bfloat16 autocast, the transformer in float32
    ema_decay: float = 0.0  # > 0: also evaluate an exponential moving average of the weights (and BN buffers)
    # --- data ---
    hflip: bool = True
    seed: int = 0

    def system_kwargs(self, num_classes: int) -> dict[str, Any]:
        """The fields :class:`detr.lightning.DetrSystem` takes (model, matching, loss, learning rates),
        plus ``num_classes``: the benchmark builds what the Lightning demo trains."""
        accepted = inspect.signature(DetrSystem.__init__).parameters
        return {k: v for k, v in dataclasses.asdict(self).items() if k in accepted} | {"num_classes": num_classes}


_FROM_SCRATCH = {"backbone_norm": "batch_norm", "backbone_trainable_layers": 5, "lr_backbone": 1e-4}
_FOCAL = {"class_head": "sigmoid", "cost_class": 2.0, "loss_ce": 2.0}

#: name → overrides of RunConfig's defaults (the paper's recipe on the small model); results: docs/convergence.md.
PRESETS: dict[str, dict[str, Any]] = {
    "paper": {},
    "scratch_backbone": dict(_FROM_SCRATCH),
    "layer3": {"backbone_last_stage": "layer3"},
    "anchor": {"query_type": "anchor"},
    "denoising": {"query_type": "anchor", "denoising": True},
    "focal": dict(_FOCAL),
    "warmup_lr": {"lr": 4e-4, "lr_backbone": 4e-4, "warmup_steps": 200},
    "anchor_local": {"query_type": "anchor", "anchor_local_attention": 4.0},
    # The four from-scratch options together at the paper's lr.
    "combined_paper_lr": {**_FROM_SCRATCH, "backbone_last_stage": "layer3", "query_type": "anchor",
                          "denoising": True, **_FOCAL},
    "query_groups": {"query_type": "anchor", "query_groups": 3},
    "dense_aux": {"dense_aux_head": True},
    # Best measured (docs/convergence.md has the runs): every option above except query groups (no gain for
    # their step time), lr 5e-4 with a 50-step warm-up and a linear decay to zero over the budget's last
    # 30 %, no dropout, channels_last backbone, batch 8 (twice the updates of batch 16 in the same time), a
    # lighter transformer (FFN 512, 20 queries, 2 encoder layers, 2 denoising groups: on a budget of minutes
    # a cheaper step reaches more). The weights' EMA (``--set ema_decay=0.99``) adds nothing once the
    # learning rate decays; the bfloat16 backbone's net effect on a 10-minute budget is not settled.
    "best": {**_FROM_SCRATCH, "backbone_last_stage": "layer3", "query_type": "anchor", "denoising": True,
             **_FOCAL, "anchor_local_attention": 4.0, "dense_aux_head": True, "num_queries": 20, "dropout": 0.0,
             "dim_feedforward": 512, "denoising_groups": 2, "num_encoder_layers": 2,
             "lr": 5e-4, "lr_backbone": 5e-4, "warmup_steps": 50, "lr_decay_fraction": 0.3, "channels_last": True,
             "backbone_bf16": True, "batch_size": 8},
}


def build_run_config(preset: str, overrides: list[str]) -> RunConfig:
    if preset not in PRESETS:
        raise SystemExit(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    values = dict(PRESETS[preset])
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or key not in fields:
            raise SystemExit(f"--set {item!r}: expected key=value with key one of {sorted(fields)}")
        try:
            values[key] = json.loads(raw)
        except json.JSONDecodeError:
            values[key] = raw
    return RunConfig(**values)


# ----------------------------------------------------------------------------------------------- data
@dataclass
class DetectionSet:
    """In-memory split: images uint8 [N, 3, S, S]; per image labels int64 [T] (contiguous) and boxes
    float [T, 4] normalised cxcywh; ``coco`` the pycocotools ground truth; ``category_map``."""

    images: torch.Tensor
    labels: list[torch.Tensor]
    boxes: list[torch.Tensor]
    image_ids: list[int]
    coco: Any
    category_map: CategoryMap = field(repr=False)


def _to_set(pixels: list[np.ndarray], annotations: list[list[dict]], image_ids: list[int], coco_dict: dict,
            category_map: CategoryMap) -> DetectionSet:
    from detr.data.coco import coco_from_dict

    images = torch.from_numpy(np.stack(pixels)).permute(0, 3, 1, 2).contiguous()
    size = torch.tensor([images.shape[3], images.shape[2]] * 2, dtype=torch.float32)  # w, h, w, h
    labels, boxes = [], []
    for objects in annotations:
        xywh = torch.tensor([o["bbox"] for o in objects], dtype=torch.float32).reshape(-1, 4)
        cxcywh = torch.cat([xywh[:, :2] + xywh[:, 2:] / 2, xywh[:, 2:]], dim=1) / size
        labels.append(torch.tensor([category_map.category_id_to_label(o["category_id"]) for o in objects],
                                   dtype=torch.int64))
        boxes.append(cxcywh)
    return DetectionSet(images, labels, boxes, image_ids, coco_from_dict(coco_dict), category_map)


def render_shapes(num_train: int, num_val: int, seed: int) -> tuple[DetectionSet, DetectionSet]:
    """The shapes set of detr.data.shapes, rendered in memory (same per-image seeds as its files)."""
    from detr.data.shapes import SHAPE_NAMES, ShapesConfig, render_shapes_image

    config = ShapesConfig(num_train=num_train, num_val=num_val, seed=seed)
    categories = [{"id": i + 1, "name": name} for i, name in enumerate(SHAPE_NAMES)]
    category_map = CategoryMap.from_coco_categories(categories, contiguous=True)
    splits = []
    for split_index, count in enumerate((num_train, num_val)):
        pixels, annotations, coco_images, coco_annotations = [], [], [], []
        for index in range(count):
            image, objects = render_shapes_image(np.random.default_rng([seed, split_index, index]), config)
            objects = [{"category_id": o.category_id, "bbox": list(o.bbox_xywh), "area": o.area} for o in objects]
            pixels.append(image)
            annotations.append(objects)
            coco_images.append({"id": index + 1, "width": config.image_size, "height": config.image_size})
            for o in objects:
                coco_annotations.append({"id": len(coco_annotations) + 1, "image_id": index + 1, "iscrowd": 0, **o})
        coco_dict = {"images": coco_images, "annotations": coco_annotations, "categories": categories}
        splits.append(_to_set(pixels, annotations, list(range(1, count + 1)), coco_dict, category_map))
    return splits[0], splits[1]


def cached_shapes(num_train: int, num_val: int, seed: int, cache_dir: Path | None) -> tuple[DetectionSet, DetectionSet]:
    """:func:`render_shapes`, kept as a tensor file in ``cache_dir`` (rendering 2,200 images takes a minute)."""
    if cache_dir is None:
        return render_shapes(num_train, num_val, seed)
    from detr.data.coco import coco_from_dict

    path = cache_dir / f"shapes_{num_train}_{num_val}_{seed}.pt"
    if path.is_file():
        stored = torch.load(path, weights_only=False)  # our own cache file
        return tuple(DetectionSet(**{**split, "coco": coco_from_dict(split["coco"])}) for split in stored)
    splits = render_shapes(num_train, num_val, seed)
    cache_dir.mkdir(parents=True, exist_ok=True)
    torch.save([{**dataclasses.asdict(split), "coco": split.coco.dataset, "category_map": split.category_map}
                for split in splits], path)
    return splits


def load_coco_folder(root: Path) -> tuple[DetectionSet, DetectionSet]:
    """A COCO-layout folder (train2017/, val2017/, annotations/instances_*.json) of equal-size images."""
    from detr.data.images import load_rgb_image

    splits = []
    category_map = None
    for split in ("train2017", "val2017"):
        data = json.loads((root / "annotations" / f"instances_{split}.json").read_text())
        category_map = category_map or CategoryMap.from_coco_categories(data["categories"], contiguous=True)
        by_image: dict[int, list[dict]] = {}
        for a in data["annotations"]:
            if not a.get("iscrowd", 0):
                by_image.setdefault(a["image_id"], []).append(a)
        images = sorted(data["images"], key=lambda i: i["id"])
        pixels = [load_rgb_image(root / split / i["file_name"]) for i in images]
        annotations = [by_image.get(i["id"], []) for i in images]
        splits.append(_to_set(pixels, annotations, [i["id"] for i in images], data, category_map))
    return splits[0], splits[1]


def make_batch(data: DetectionSet, index: torch.Tensor, hflip: bool, generator: torch.Generator
               ) -> tuple[torch.Tensor, torch.Tensor, list[dict[str, torch.Tensor]]]:
    """A batch (images normalised, mask all False: the images share one size, targets)."""
    images = data.images[index].float().div_(255)
    targets = []
    flips = torch.rand(len(index), generator=generator) < 0.5 if hflip else torch.zeros(len(index), dtype=torch.bool)
    for row, (i, flip) in enumerate(zip(index.tolist(), flips.tolist())):
        boxes = data.boxes[i].clone()
        if flip:
            images[row] = images[row].flip(-1)
            boxes[:, 0] = 1 - boxes[:, 0]
        targets.append({"labels": data.labels[i], "boxes": boxes})
    images = (images - IMAGENET_MEAN) / IMAGENET_STD
    mask = torch.zeros(images.shape[0], images.shape[2], images.shape[3], dtype=torch.bool)
    return images, mask, targets


# ------------------------------------------------------------------------------------------ training
def build_training(config: RunConfig, num_classes: int) -> tuple[torch.nn.Module, SetCriterion, torch.optim.Optimizer]:
    """The model, criterion and parameter groups as :class:`DetrSystem` builds them; AdamW without its
    schedulers (this loop warms up and decays by itself)."""
    torch.manual_seed(config.seed)
    system = DetrSystem(**config.system_kwargs(num_classes))
    optimizer = torch.optim.AdamW(system.parameter_groups(), lr=config.lr, weight_decay=config.weight_decay,
                                  fused=True)
    for group in optimizer.param_groups:
        group["base_lr"] = group["lr"]
    return system.model, system.criterion, optimizer


def train_step(model: torch.nn.Module, criterion: SetCriterion, optimizer: torch.optim.Optimizer, config: RunConfig,
               step: int, images: torch.Tensor, mask: torch.Tensor, targets: list[dict[str, torch.Tensor]],
               lr_scale: float = 1.0) -> dict[str, float]:
    """One optimizer step at ``base_lr`` × warm-up × ``lr_scale`` (the budget's decay)."""
    warmup = min(1.0, (step + 1) / config.warmup_steps) if config.warmup_steps else 1.0
    for group in optimizer.param_groups:
        group["lr"] = group["base_lr"] * warmup * lr_scale
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if config.autocast_bf16 else contextlib.nullcontext())
    with autocast:
        outputs = model(images, mask, targets=targets)
    losses = criterion(outputs, targets)
    loss = sum(losses[name] * weight for name, weight in criterion.weight_dict.items())
    if not torch.isfinite(loss):
        raise FloatingPointError(f"non-finite loss at step {step}: {({k: float(v) for k, v in losses.items()})}")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if config.clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip)
    optimizer.step()
    return {"loss": loss.item(), "class_error": losses["class_error"].item(), "loss_giou": losses["loss_giou"].item()}


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: DetectionSet, class_head: str, batch_size: int = 50) -> dict[str, float]:
    """COCO AP / AP50 (pycocotools, maxDets 100, every query kept) on ``data``."""
    from detr.evaluation import CocoEvaluator

    was_training = model.training
    model.eval()
    postprocess = PostProcess(class_head=class_head)
    evaluator = CocoEvaluator(data.coco, category_map=data.category_map)
    size = torch.tensor([data.images.shape[2], data.images.shape[3]])
    for start in range(0, len(data.images), batch_size):
        index = torch.arange(start, min(start + batch_size, len(data.images)))
        images, mask, _ = make_batch(data, index, False, torch.Generator())
        detections = postprocess(model(images, mask), size.repeat(len(index), 1))
        evaluator.update([data.image_ids[i] for i in index.tolist()], detections)
    with contextlib.redirect_stdout(io.StringIO()):
        evaluation = evaluator.compute()
        agnostic = class_agnostic_ap50(data.coco, evaluation.results, evaluation.image_ids)
    model.train(was_training)
    return {"AP": evaluation.stats["AP"], "AP50": evaluation.stats["AP50"], "AP50_agnostic": agnostic}


def class_agnostic_ap50(coco_gt: Any, results: list[dict[str, Any]], image_ids: list[int]) -> float:
    """AP50 with every class merged (COCOeval ``useCats=0``): how well the boxes alone are found, so a
    curve shows whether localisation or classification holds AP50 back."""
    from pycocotools.cocoeval import COCOeval

    if not results:
        return 0.0
    coco_eval = COCOeval(coco_gt, coco_gt.loadRes(results), iouType="bbox")
    coco_eval.params.imgIds, coco_eval.params.useCats = image_ids, 0
    coco_eval.evaluate()
    coco_eval.accumulate()
    coco_eval.summarize()
    return float(coco_eval.stats[1])


def run(config: RunConfig, train: DetectionSet, val: DetectionSet, *, minutes: float, eval_every: float,
        clock: str, name: str, jsonl: Path | None, max_steps: int | None = None) -> list[dict[str, Any]]:
    """Train for ``minutes`` of training time, or ``max_steps`` steps when given (the budget then ignores
    the clock, and the learning-rate decay follows steps); evaluate every ``eval_every`` minutes and at
    the end."""
    num_classes = train.category_map.num_classes
    model, criterion, optimizer = build_training(config, num_classes)
    model.train()
    ema = None
    if config.ema_decay > 0:  # the averaged copy Lightning's EMAWeightAveraging keeps, with torch's own EMA
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(config.ema_decay), use_buffers=True)
    threads = torch.get_num_threads()
    now = (lambda: time.process_time() / threads) if clock == "cpu" else time.perf_counter
    generator = torch.Generator().manual_seed(config.seed)
    trained, step, seen, next_eval, dropped = 0.0, 0, 0, eval_every * 60, False
    wall_start, cpu_start = time.perf_counter(), time.process_time()
    curve: list[dict[str, Any]] = []
    last: dict[str, float] = {}
    print(f"[{name}] {json.dumps(dataclasses.asdict(config))}", flush=True)

    def report() -> None:
        metrics = evaluate(model, val, config.class_head)
        point = {"run": name, "train_min": round(trained / 60, 2), "step": step, "epoch": round(seen / len(train.images), 2),
                 "images_per_s": round(seen / max(trained, 1e-9), 1), "AP": round(metrics["AP"], 4),
                 "AP50": round(metrics["AP50"], 4),
                 "AP50_agnostic": round(metrics["AP50_agnostic"], 4), "loss": round(last.get("loss", float("nan")), 3),
                 "class_error": round(last.get("class_error", float("nan")), 1),
                 "wall_min": round((time.perf_counter() - wall_start) / 60, 2),
                 "cpu_min": round((time.process_time() - cpu_start) / 60, 2), "load": round(os.getloadavg()[0], 1)}
        if ema is not None:  # the same run's averaged weights: a paired comparison, free of run-to-run noise
            point |= {f"ema_{k}": round(v, 4) for k, v in evaluate(ema.module, val, config.class_head).items()}
        curve.append(point)
        print(f"[{name}] train {point['train_min']:5.2f} min  step {step:5d}  epoch {point['epoch']:5.2f}  "
              f"{point['images_per_s']:5.1f} img/s  loss {point['loss']:7.3f}  class_error {point['class_error']:5.1f}  "
              f"AP {point['AP']:.4f}  AP50 {point['AP50']:.4f}  (class-agnostic {point['AP50_agnostic']:.4f})  "
              + (f"EMA AP {point['ema_AP']:.4f}  AP50 {point['ema_AP50']:.4f}  " if ema is not None else "")
              + f"(wall {point['wall_min']:.1f} min, "
              f"cpu {point['cpu_min']:.1f} min, load {point['load']})", flush=True)
        if jsonl is not None:
            with jsonl.open("a") as handle:
                handle.write(json.dumps({**point, "config": dataclasses.asdict(config)}) + "\n")

    def progress() -> float:  # share of the budget spent
        return step / max_steps if max_steps else trained / (minutes * 60)

    while progress() < 1:
        order = torch.randperm(len(train.images), generator=generator)
        for start in range(0, len(order) - config.batch_size + 1, config.batch_size):
            index = order[start:start + config.batch_size]
            images, mask, targets = make_batch(train, index, config.hflip, generator)
            if config.lr_drop_at and not dropped and progress() >= config.lr_drop_at:
                dropped = True  # the authors' step decay, placed at a share of the time budget
                for group in optimizer.param_groups:
                    group["base_lr"] *= config.lr_drop_gamma
                    group["lr"] *= config.lr_drop_gamma
            begin = now()
            last = train_step(model, criterion, optimizer, config, step, images, mask, targets,
                              lr_scale=budget_lr_factor(progress(), 1.0, config.lr_decay_fraction))
            if ema is not None:
                ema.update_parameters(model)
            trained += now() - begin
            step += 1
            seen += len(index)
            if trained >= next_eval and progress() < 1:
                report()
                next_eval += eval_every * 60
            if progress() >= 1:
                break
    report()
    return curve


def step_time(config: RunConfig, train: DetectionSet, steps: int, name: str) -> float:
    """Median seconds per training step after 3 warm-up steps, by process CPU time / threads (robust to
    other load on shared cores; the wall-clock median is printed too)."""
    model, criterion, optimizer = build_training(config, train.category_map.num_classes)
    model.train()
    generator = torch.Generator().manual_seed(0)
    times, wall = [], []
    threads = torch.get_num_threads()
    for step in range(steps + 3):
        index = torch.randint(len(train.images), (config.batch_size,), generator=generator)
        images, mask, targets = make_batch(train, index, config.hflip, generator)
        begin, begin_wall = time.process_time(), time.perf_counter()
        train_step(model, criterion, optimizer, config, step, images, mask, targets)
        if step >= 3:
            times.append((time.process_time() - begin) / threads)
            wall.append(time.perf_counter() - begin_wall)
    median = float(np.median(times))
    print(f"[{name}] {1000 * median:7.1f} ms/step CPU/threads (wall {1000 * float(np.median(wall)):7.1f} ms; median of "
          f"{steps}, batch {config.batch_size}, {config.batch_size / median:5.1f} img/s)", flush=True)
    return median


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="paper", help=f"one of {sorted(PRESETS)}")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a RunConfig field")
    parser.add_argument("--minutes", type=float, default=10.0, help="training time budget (evaluation excluded)")
    parser.add_argument("--train-steps", type=int, default=None,
                        help="budget in training steps instead of --minutes (comparable across machine speeds)")
    parser.add_argument("--eval-every", type=float, default=2.0, help="minutes of training between evaluations")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="budget clock: wall (default) or process CPU time / threads")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-train", type=int, default=2000)
    parser.add_argument("--num-val", type=int, default=200)
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--data-root", type=Path, default=None, help="COCO-layout folder instead of rendering")
    parser.add_argument("--cache-dir", type=Path, default=Path("/tmp/detr_convergence_cache"),
                        help="where the rendered shapes set is kept between runs")
    parser.add_argument("--jsonl", type=Path, default=None, help="append every evaluation point here")
    parser.add_argument("--name", default=None, help="run name in the output (default: the preset)")
    parser.add_argument("--step-time", nargs="*", default=None, metavar="PRESET",
                        help="only time training steps of these presets (with --set overrides)")
    parser.add_argument("--steps", type=int, default=10, help="steps timed per preset with --step-time")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    if args.data_root is not None:
        train, val = load_coco_folder(args.data_root)
    else:
        train, val = cached_shapes(args.num_train, args.num_val, args.data_seed, args.cache_dir)
    print(f"data: {len(train.images)} train / {len(val.images)} val images {tuple(train.images.shape[2:])}, "
          f"{train.category_map.num_classes} classes ({time.perf_counter() - start:.1f} s); torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    if args.step_time is not None:
        configs = {p: build_run_config(p, args.set) for p in args.step_time or ["paper"]}
        # per image: presets may differ in batch size (best trains with 8, the paper's recipe with 16)
        times = {p: step_time(c, train, args.steps, p) / c.batch_size for p, c in configs.items()}
        if "paper" in times:
            for preset, seconds in times.items():
                print(f"{preset:>18}: {seconds / times['paper']:.2f} × paper's training time per image")
        return 0
    config = build_run_config(args.preset, args.set)
    run(config, train, val, minutes=args.minutes, eval_every=args.eval_every, clock=args.clock,
        name=args.name or args.preset, jsonl=args.jsonl, max_steps=args.train_steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
