"""Fine-tuning on a few images (docs/models/dfine.md, "Fine-tuning on small data"): a model trained on the shapes set
(circle, square, triangle, ellipse, star) fine-tuned onto a second synthetic set whose classes are two of those
and three new ones (circle, triangle, cross, arrow, semicircle: ``detr-make-shapes --shapes``), from 50 or 200
training images; COCO AP on the second set's 200 validation images against steps, for this project's defaults and
for one change at a time.

    .venv/bin/python benchmarks/finetune.py --source runs/dfine_shapes_cpu-seed0.ckpt --threads 1
    # the source model: benchmarks/convergence.py --preset configs/dfine_shapes_cpu.yaml --seeds 0 \
    #     --train-steps 1000 --eval-every-steps 250 --save-dir runs/   (trained here when --source is not given)
    .venv/bin/python benchmarks/finetune.py --source S.ckpt --variants defaults lr_quarter --images 50
    # sources of one quality: each family's source trained until its AP on the shapes set reaches 0.6
    .venv/bin/python benchmarks/finetune.py --preset configs/rfdetr_shapes_cpu.yaml --source-ap 0.6 0.5 \
        --source-steps 8000 --source-eval-every 250 --variants recipe --images 200 --threads 1
    # the same source, fine-tuned with another seed (--tune: the fine-tunes only; --set: the source's recipe too)
    .venv/bin/python benchmarks/finetune.py --preset configs/rfdetr_shapes_cpu.yaml --source-ap 0.6 0.5 \
        --source-steps 8000 --source-eval-every 250 --variants recipe --images 200 --threads 1 --tune seed=1

Each run is what :mod:`benchmarks.convergence` trains (``detr fit``'s system, data module and trainer, in this
process) from the preset's recipe (``--preset``, default configs/dfine_shapes_cpu.yaml: lr 5e-4 with a 50-step
warm-up and a linear decay to zero over the last 30 % of the run, batch 8, 128-px squares, flips), started from the
source model (``--model.init_checkpoint``) with its class rows carried by name (``--model.init_classes by_name``:
circle and triangle start from their trained rows, the three new classes fresh), fitted to ``--steps`` steps.
"defaults" adds what this benchmark chose: the real-time DETRs' augmentations (photometric distortion, zoom-out,
IoU crop; for the paper's DETR and Deformable DETR, whose input is not a square, DETR's own multi-scale resize and
random crop at its authors' sizes scaled to the 128-px images); "defaults_ema" adds an EMA of the weights (decay
0.99) to them; the other variants change one thing of the recipe each (:data:`VARIANTS`): the start (from scratch;
class rows fresh; rows by label, which gives the new set's triangle the source's square row), a quarter of the
learning rates, a step drop two thirds into the run instead of the final decay, the EMA, and D-FINE's own schedule
(a 500-step warm-up, a constant lr, EMA 0.9999 over 1000 warm-up updates); "lr_double_ema" is twice the recipe's
learning rates with the EMA ("lr_double_ema_constant": without the final decay). Compare runs by step: the
machine's load changes their time, not their steps.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from convergence import REPO, build_run_config, run, shapes_root, yaml_image_size  # noqa: E402

from detr.data.shapes import ShapesConfig, write_shapes_dataset  # noqa: E402
from detr.lightning.datamodule import AUTHORS_SIZES, sizes_for  # noqa: E402

#: The second set's classes: two of the source's (their rows carry over by name) and three new ones.
TARGET_SHAPES = ("circle", "triangle", "cross", "arrow", "semicircle")
PRESET = REPO / "configs" / "dfine_shapes_cpu.yaml"

#: name → what the run changes from the preset's recipe: ``--set`` items of benchmarks/convergence.py, with
#: {lr_quarter}, {lr_backbone_quarter}, {lr_double}, {lr_backbone_double} and {drop_epoch} filled in from the preset
#: and the run's length. "defaults" is what this benchmark chose for fine-tuning (the recipe with the real-time DETRs'
#: augmentations); every other variant is one change to the recipe, but "defaults_ema" (the defaults with an EMA of
#: the weights) and "lr_double_ema" (twice the learning rates with an EMA; "lr_double_ema_constant" without the final
#: decay too).
VARIANTS: dict[str, list[str]] = {
    "defaults": ['data={{"augmentation": "rtdetr"}}'],
    "recipe": [],
    "scratch": ["init_checkpoint=null"],
    "rows_fresh": ["init_classes=fresh"],
    "rows_by_label": ["init_classes=by_label"],
    "lr_quarter": ["lr={lr_quarter}", "lr_backbone={lr_backbone_quarter}"],
    "lr_drop": ["lr_decay_fraction=0.0", "lr_drop_epochs=[{drop_epoch}]"],
    "ema": ["ema_decay=0.99"],
    "defaults_ema": ['data={{"augmentation": "rtdetr"}}', "ema_decay=0.99"],
    # twice the recipe's learning rates with an EMA of the weights: a 300-step fine-tune is still climbing at its end
    "lr_double_ema": ["lr={lr_double}", "lr_backbone={lr_backbone_double}", "ema_decay=0.99"],
    # the same at a constant rate after the warm-up (RF-DETR's authors train at a constant rate with an EMA)
    "lr_double_ema_constant": ["lr={lr_double}", "lr_backbone={lr_backbone_double}", "ema_decay=0.99",
                               "lr_decay_fraction=0.0"],
    # D-FINE's own schedule (configs/dfine/include/optimizer.yml): a 500-step linear warm-up, then a constant lr
    # (its step drop at epoch 500 never comes), the weights' EMA at 0.9999 over 1000 warm-up updates
    "authors_schedule": ["warmup_steps=500", "lr_decay_fraction=0.0", "ema_decay=0.9999", "ema_warmup_steps=1000"],
}
#: the variants that run on every ``--images`` size (the others on the first only)
EVERY_SIZE = ("defaults", "recipe", "scratch", "lr_double_ema", "lr_double_ema_constant")


def target_root(num_train: int, num_val: int, cache_dir: Path) -> Path:
    """The second set with ``num_train`` training images (the first ``num_train`` of any larger one: image i depends
    only on the seed, the split and i) and ``num_val`` validation images, written if missing."""
    shapes = ShapesConfig(num_train=num_train, num_val=num_val, seed=1, shapes=TARGET_SHAPES)
    root = cache_dir / f"finetune_{num_train}_{num_val}"
    write_shapes_dataset(root, shapes)
    return root


def variant_settings(name: str, preset: str, source: Path | None, *, images: int, steps: int,
                     common: list[str] = ()) -> list[str]:
    """The ``--set`` items of one run: ``common`` (every run's), the source model, then the variant's changes."""
    recipe = build_run_config(preset, list(common))
    batches_per_epoch = math.ceil(images / recipe.batch_size)
    lr, lr_backbone = recipe.system.get("lr", 1e-4), recipe.system.get("lr_backbone", 1e-5)
    values = {"lr_quarter": lr / 4, "lr_backbone_quarter": lr_backbone / 4, "lr_double": lr * 2,
              "lr_backbone_double": lr_backbone * 2, "drop_epoch": max(1, round(steps * 2 / 3 / batches_per_epoch))}
    start = [f"init_checkpoint={source}"] if source is not None else []
    changes = [item.format(**values) for item in VARIANTS[name]]
    if recipe.square_size is None:  # the paper's DETR and Deformable DETR: no square resize in their input contract
        changes = [detr_augmentation(yaml_image_size(Path(preset))) if item.startswith("data=") else item
                   for item in changes]
    return [*common, *start, *changes]


def detr_augmentation(image_size: int) -> str:
    """The ``--set`` item of DETR's own augmentation (flip, multi-scale resize, the random crop branch) at the
    authors' sizes scaled from their 800 px to ``image_size`` (``--data.image_size``'s rule), evaluated at the
    images' size: what the DETR and Deformable DETR fine-tuning configs train with, in place of the real-time
    DETRs' square pipeline, which their input contract refuses."""
    sizes = sizes_for(image_size, AUTHORS_SIZES)
    return "data=" + json.dumps({name: list(value) if isinstance(value, (list, tuple)) else value
                                 for name, value in sizes.items() if not name.startswith("eval_")})


def source_stem(preset: str, steps: int, settings: list[str]) -> str:
    """The cached source's file name (before ``-ap<AP>.ckpt`` or ``.ckpt``): its preset and steps, and a digest of
    the ``--set`` items when there are any, so that a changed recipe trains its own source (``--tune`` changes
    the fine-tunes only and keeps the source). The digest is of what the items set (a key given twice: its last
    value), whatever their order."""
    stem = f"source-{Path(preset).stem}-{steps}"
    if settings:
        values = dict(item.partition("=")[::2] for item in settings)
        stem += "-" + hashlib.sha1("\n".join(f"{k}={v}" for k, v in sorted(values.items())).encode()).hexdigest()[:8]
    return stem


def source_checkpoint(args: argparse.Namespace) -> Path:
    """``--source``, or the preset trained on the shapes set for ``--source-steps`` (kept in ``--cache-dir``)."""
    if args.source is not None:
        if not args.source.is_file():
            raise SystemExit(f"--source {args.source}: no such file")
        return args.source
    stem = source_stem(args.preset, args.source_steps, args.set)
    if args.source_ap:  # sources of one quality: trained until their AP reaches each of --source-ap, kept at each
        save_at_ap = {ap: args.cache_dir / f"{stem}-ap{ap:g}.ckpt" for ap in args.source_ap}
        path, every = save_at_ap[args.source_ap[0]], args.source_eval_every
    else:
        save_at_ap, path, every = None, args.cache_dir / f"{stem}.ckpt", args.source_steps
    if not path.is_file():
        curve = run(build_run_config(args.preset, args.set), shapes_root(2000, 200, 0, args.cache_dir),
                    minutes=10_000.0, eval_every=0.0, name="source", jsonl=args.source_jsonl,
                    max_steps=args.source_steps, image_size=yaml_image_size(Path(args.preset)),
                    eval_every_steps=every, save=None if save_at_ap else path, save_at_ap=save_at_ap)
        if not path.is_file():
            raise SystemExit(f"the source did not reach AP {args.source_ap[0]} in {args.source_steps} steps (its "
                             f"last: {curve[-1]['AP'] if curve else 'none'}): give more --source-steps")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, default=None, help="the model trained on the shapes set")
    parser.add_argument("--source-steps", type=int, default=1000,
                        help="its training steps when --source is not given (with --source-ap: at most)")
    parser.add_argument("--source-ap", type=float, nargs="+", default=None,
                        help="sources of one quality: train the source until its COCO AP on the shapes' validation "
                             "images reaches each of these (evaluated every --source-eval-every steps), keep a "
                             "model at each, fine-tune from the first")
    parser.add_argument("--source-eval-every", type=int, default=100)
    parser.add_argument("--source-jsonl", type=Path, default=None, help="append the source's evaluation points here")
    parser.add_argument("--preset", default=str(PRESET), help="the recipe (a shapes YAML of configs/)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="change the recipe of every run, the source's too (benchmarks/convergence.py's --set; "
                             "the source is then trained and cached apart)")
    parser.add_argument("--tune", action="append", default=[], metavar="KEY=VALUE",
                        help="change the recipe of the fine-tunes only, after --set (a seed, a learning rate)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--images", type=int, nargs="+", default=[50, 200],
                        help="training images of the second set; every variant runs on the first size, "
                             f"{', '.join(EVERY_SIZE)} on each")
    parser.add_argument("--steps", type=int, default=300, help="training steps per run (its schedule fitted to them)")
    parser.add_argument("--eval-every-steps", type=int, default=50)
    parser.add_argument("--num-val", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache-dir", type=Path, default=Path("/tmp/detr_convergence_cache"))
    parser.add_argument("--jsonl", type=Path, default=None, help="append every evaluation point here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    source = source_checkpoint(args)
    image_size = yaml_image_size(Path(args.preset))
    runs = [(name, args.images[0]) for name in args.variants]
    runs += [(name, images) for images in args.images[1:] for name in EVERY_SIZE if name in args.variants]
    curves: dict[tuple[str, int], list[dict[str, Any]]] = {}
    start = time.perf_counter()
    for name, images in runs:
        root = target_root(images, args.num_val, args.cache_dir)
        settings = variant_settings(name, args.preset, source, images=images, steps=args.steps,
                                    common=[*args.set, *args.tune])
        config = build_run_config(args.preset, settings)
        curves[name, images] = run(config, root, minutes=10_000.0, eval_every=0.0, name=f"{name} {images} images",
                                   jsonl=args.jsonl, max_steps=args.steps, image_size=image_size,
                                   eval_every_steps=args.eval_every_steps)
    steps = sorted({point["step"] for curve in curves.values() for point in curve})
    print(f"\nCOCO AP (AP50) on the second set's {args.num_val} validation images, fine-tuned from {source} "
          f"({args.preset}, {args.steps} steps; {(time.perf_counter() - start) / 60:.1f} min)")
    print("| run | images | " + " | ".join(f"step {s}" for s in steps) + " |")
    print("|---|---|" + "---|" * len(steps))
    for (name, images), curve in curves.items():
        by_step = {point["step"]: point for point in curve}
        cells = [f"{by_step[s]['AP']:.3f} ({by_step[s]['AP50']:.3f})" if s in by_step else "-" for s in steps]
        print(f"| {name} | {images} | " + " | ".join(cells) + " |")
    if args.jsonl is not None:
        print(f"every point: {args.jsonl} ({json.dumps(args.variants)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
