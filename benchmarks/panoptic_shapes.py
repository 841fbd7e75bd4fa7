"""Panoptic segmentation on the synthetic shapes set on a CPU budget: the box stage, then the mask stage on
the frozen box model (configs/demo_shapes_panoptic_boxes_cpu.yaml, configs/demo_shapes_panoptic_cpu.yaml),
and the curve: box AP after every box-stage epoch, PQ / SQ / RQ (things, stuff) after every mask-stage epoch,
against steps and minutes of training (validation excluded).

    .venv/bin/python benchmarks/panoptic_shapes.py                                  # the demo budgets: 10 + 5 min
    .venv/bin/python benchmarks/panoptic_shapes.py --box-steps 1500 --mask-steps 500   # bounded by steps
    .venv/bin/python benchmarks/panoptic_shapes.py --curve-only --out outputs/panoptic_shapes   # print a finished run
    .venv/bin/python benchmarks/panoptic_shapes.py --curve-only --thresholds 0.3 0.4 0.5 0.6 0.7 0.85
    .venv/bin/python benchmarks/panoptic_shapes.py --curve-only --thresholds 0.2 0.3 --overlaps 0.8 --plot curve.png
    .venv/bin/python benchmarks/panoptic_shapes.py --masks-only --overwrite --mask-steps 500 --set=--model.optimizer.lr=2e-3
    .venv/bin/python benchmarks/panoptic_shapes.py --curve-only --things 0.2 0.3   # what the box model finds

The budgets are the configs' (TimeBudget: 600 s and 300 s of training). On cores shared with other work a
time budget buys fewer steps: ``--box-steps`` / ``--mask-steps`` bound a stage by steps instead (the time
limit is lifted), which is how runs on differently loaded machines compare. ``--threads 1`` avoids the
intra-op thread barriers that stall a process on oversubscribed cores (measured: 0.09 steps/s with 2 threads
vs 0.8 with 1 under a load of 7 on 2 cores). ``--thresholds`` re-scores the final mask model's validation
PQ at other panoptic score thresholds (one forward pass; the authors' 0.85 is for softmax probabilities).
Runs go into ``--out``/boxes and ``--out``/masks (fresh folders: ``--overwrite`` replaces earlier runs).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Any

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
BOXES_CONFIG = REPO / "configs" / "demo_shapes_panoptic_boxes_cpu.yaml"
MASKS_CONFIG = REPO / "configs" / "demo_shapes_panoptic_cpu.yaml"
CURVE_COLUMNS = ("val/AP", "val/AP50", "val/PQ", "val/SQ", "val/RQ", "val/PQ_th", "val/PQ_st", "val/mask_AP")


def without_time_limit(config: Path, out: Path) -> Path:
    """A config file that replaces ``config``'s callbacks by the same list with TimeBudget's limit lifted (to
    be given after ``config``): a run bounded by ``--trainer.max_steps``."""
    data = yaml.safe_load(config.read_text())
    callbacks = data.get("trainer.callbacks") or data.get("trainer", {}).get("callbacks")
    if callbacks is None:  # the mask config keeps the box config's callbacks
        callbacks = yaml.safe_load(BOXES_CONFIG.read_text())["trainer"]["callbacks"]
    for callback in callbacks:
        if callback["class_path"].endswith(".TimeBudget"):
            callback["init_args"]["max_train_seconds"] = 1e9
    path = out / f"{config.stem}_steps.yaml"
    path.write_text(yaml.safe_dump({"trainer": {"callbacks": callbacks}}))
    return path


def run_stage(config: Path, run_dir: Path, steps: int | None, extra: list[str], overwrite: bool) -> None:
    from detr.lightning.cli import panoptic_main

    args = ["fit", "--config", str(config)]
    if steps is not None:
        args += ["--config", str(without_time_limit(config, run_dir.parent)), f"--trainer.max_steps={steps}"]
    args += [f"--trainer.default_root_dir={run_dir}", "--trainer.enable_progress_bar=false",
             f"--overwrite_run={str(overwrite).lower()}", *extra]
    print("detr-panoptic", " ".join(args), flush=True)
    panoptic_main(args)


def read_curve(run_dir: Path) -> list[dict[str, Any]]:
    """One row per validation of a run's metrics.csv: epoch, steps (trained), train_minutes and the metrics of
    :data:`CURVE_COLUMNS` it logged."""
    rows = []
    with (run_dir / "metrics.csv").open() as file:
        for row in csv.DictReader(file):
            if not row.get("val/AP"):
                continue
            seconds = row.get("time/train_seconds")
            # metrics.csv's step of a validation is the last optimizer step's index: steps trained = step + 1
            rows.append({"epoch": int(row["epoch"]), "steps": int(row["step"]) + 1,
                         "train_minutes": float(seconds) / 60 if seconds else float("nan"),
                         **{name: float(row[name]) for name in CURVE_COLUMNS if row.get(name)}})
    return rows


def format_curve(stage: str, rows: list[dict[str, Any]]) -> str:
    lines = [f"{'stage':6} {'epoch':>5} {'steps':>6} {'min':>6} " + " ".join(f"{n[4:]:>8}" for n in CURVE_COLUMNS)]
    for row in rows:
        values = " ".join(f"{row[n]:8.3f}" if n in row else f"{'':8}" for n in CURVE_COLUMNS)
        lines.append(f"{stage:6} {row['epoch']:5d} {row['steps']:6d} {row['train_minutes']:6.1f} {values}")
    return "\n".join(lines)


def validation_set(checkpoint: Path, data_root: Path, image_size: int) -> tuple[torch.nn.Module, Any]:
    """The checkpoint's model (eval mode) and the shapes validation set labelled with its category map, resized
    for evaluation to ``image_size``."""
    from detr import load_checkpoint
    from detr.data.coco_panoptic import CocoPanoptic
    from detr.data.transforms import make_eval_transform

    model = load_checkpoint(checkpoint).eval()
    dataset = CocoPanoptic(data_root / "val2017", data_root / "annotations" / "panoptic_val2017.json",
                           category_map=model.meta.category_map,
                           transform=make_eval_transform(min_size=image_size, max_size=image_size))
    return model, dataset


@torch.no_grad()
def things_found(checkpoint: Path, data_root: Path, thresholds: list[float], *, image_size: int = 128
                 ) -> dict[float, dict[str, int]]:
    """What the box model (a box- or mask-stage checkpoint) finds of the validation things, per score
    threshold: ground truths, predictions above it (things), ground truths with a prediction of their class
    at box IoU > 0.5 (found), with one only of another class (wrong_class), and the extra predictions of the
    right class on an already found one (duplicates)."""
    from torchvision.ops import box_convert, box_iou

    from detr.data.collate import collate_detection
    from detr.inference.postprocess import PostProcess

    model, dataset = validation_set(checkpoint, data_root, image_size)
    thing_ids = {int(c["id"]) for c in dataset.categories if c.get("isthing")}
    is_thing = torch.tensor([category_id in thing_ids for category_id in model.meta.category_map.category_ids])
    postprocess = PostProcess(class_head=model.class_head)
    counts = {t: dict.fromkeys(("truths", "predictions", "found", "wrong_class", "duplicates"), 0) for t in thresholds}
    for images, padding_mask, targets in torch.utils.data.DataLoader(dataset, batch_size=20,
                                                                     collate_fn=collate_detection):
        sizes = torch.stack([t["orig_size"] for t in targets])
        for target, detection in zip(targets, postprocess(model(images, padding_mask), sizes)):
            height, width = target["orig_size"].tolist()
            things = is_thing[target["labels"]]
            truth = box_convert(target["boxes"][things], "cxcywh", "xyxy") * torch.tensor([width, height] * 2)
            truth_labels = target["labels"][things]
            predicted = is_thing[detection["labels"]]
            for threshold, count in counts.items():
                keep = predicted & (detection["scores"] > threshold)
                boxes, labels = detection["boxes"][keep], detection["labels"][keep]
                overlap = box_iou(truth, boxes) > 0.5
                same = overlap & (truth_labels[:, None] == labels[None])
                count["truths"] += len(truth)
                count["predictions"] += len(boxes)
                count["found"] += int(same.any(1).sum())
                count["wrong_class"] += int((overlap.any(1) & ~same.any(1)).sum())
                count["duplicates"] += int((same.sum(1) - 1).clamp(min=0).sum())
    return counts


def plot_curves(boxes: list[dict[str, Any]], masks: list[dict[str, Any]], path: Path) -> None:
    """The two stages' curves side by side (box AP50 / AP, then PQ / PQ_th / PQ_st against mask steps)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 3.4), layout="constrained")
    left, right = figure.subplots(1, 2)
    for name, label in (("val/AP50", "AP50"), ("val/AP", "AP")):
        left.plot([r["steps"] for r in boxes], [r.get(name, float("nan")) for r in boxes], marker="o", label=label)
    left.set(title="stage 1: boxes (things and stuff)", xlabel="training steps", ylim=(0, 1))
    for name, label in (("val/PQ", "PQ"), ("val/PQ_th", "PQ things"), ("val/PQ_st", "PQ stuff")):
        right.plot([r["steps"] for r in masks], [r.get(name, float("nan")) for r in masks], marker="o", label=label)
    right.axhline(0.5, color="grey", linestyle=":", linewidth=1)
    right.set(title="stage 2: mask head on the frozen detector", xlabel="training steps", ylim=(0, 1))
    for axes in (left, right):
        axes.grid(alpha=0.3)
        axes.legend(loc="lower right")
    figure.savefig(path, dpi=110)
    print(f"wrote {path}")


@torch.no_grad()
def pq_by_threshold(checkpoint: Path, data_root: Path, thresholds: list[float], *, image_size: int = 128,
                    batch_size: int = 16, overlaps: list[float | None] = (None,)
                    ) -> dict[tuple[float, float | None], dict[str, Any]]:
    """Validation PQ of a mask-stage checkpoint at each panoptic score threshold and overlap filter
    (None: the authors' rules; see PostProcessPanoptic), from one forward pass."""
    from detr.data.collate import collate_detection
    from detr.evaluation.panoptic import PanopticQuality
    from detr.inference.postprocess_masks import PostProcessPanoptic

    model, dataset = validation_set(checkpoint, data_root, image_size)
    meta = model.meta
    postprocessors = {(t, o): PostProcessPanoptic(meta.is_thing, threshold=t, class_head=model.class_head,
                                                  category_ids=meta.category_map.category_ids, overlap_threshold=o)
                      for t in thresholds for o in overlaps}
    metrics = {key: PanopticQuality(dataset.categories) for key in postprocessors}
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, collate_fn=collate_detection)
    for images, padding_mask, targets in loader:
        outputs = model(images, padding_mask)
        processed = torch.stack([t["size"] for t in targets])
        original = torch.stack([t["orig_size"] for t in targets])
        truth = [dataset.ground_truth(dataset.index_of_image(int(t["image_id"]))) for t in targets]
        for threshold, postprocess in postprocessors.items():
            for (gt_ids, gt_segments), result in zip(truth, postprocess(outputs, processed, original)):
                metrics[threshold].update(gt_ids, gt_segments, result["id_map"], result["segments_info"])
    return {threshold: metric.compute() for threshold, metric in metrics.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, default=REPO / "data" / "shapes")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "panoptic_shapes")
    parser.add_argument("--box-steps", type=int, default=None, help="bound the box stage by steps, not time")
    parser.add_argument("--mask-steps", type=int, default=None, help="bound the mask stage by steps, not time")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (1 on shared cores)")
    parser.add_argument("--thresholds", type=float, nargs="*", default=[],
                        help="also score the final mask model's PQ at these panoptic thresholds")
    parser.add_argument("--overlaps", type=float, nargs="*", default=[],
                        help="also score --thresholds with Mask2Former's overlap filter at these values (e.g. 0.8)")
    parser.add_argument("--eval-size", type=int, default=128, help="image size of the --thresholds scoring")
    parser.add_argument("--things", type=float, nargs="*", default=[], metavar="THRESHOLD",
                        help="also count what the box stage's final model finds of the validation things at these "
                             "score thresholds (found with the right class, wrong class, duplicates)")
    parser.add_argument("--plot", type=Path, default=None, help="also draw both curves into this image file")
    parser.add_argument("--curve-only", action="store_true", help="train nothing: print the runs in --out")
    parser.add_argument("--masks-only", action="store_true",
                        help="train only the mask stage, on the box stage already in --out/boxes (with --overwrite: "
                             "a new mask stage, e.g. --set=--model.optimizer.lr=4e-3)")
    parser.add_argument("--overwrite", action="store_true", help="replace earlier runs in --out")
    parser.add_argument("--set", action="append", default=[], metavar="--KEY=VALUE",
                        help="a CLI override for both stages, e.g. --set=--model.panoptic_threshold=0.4")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    boxes, masks = args.out / "boxes", args.out / "masks"
    if not args.curve_only:
        from detr.data.shapes import write_shapes_dataset
        from detr.data.shapes_panoptic import write_shapes_panoptic

        if not (args.data_root / "annotations" / "panoptic_val2017.json").is_file():  # the demo's set
            write_shapes_dataset(args.data_root)
            write_shapes_panoptic(args.data_root)
        args.out.mkdir(parents=True, exist_ok=True)
        data = [f"--data.root={args.data_root}"]
        if not args.masks_only:
            run_stage(BOXES_CONFIG, boxes, args.box_steps, data + args.set, args.overwrite)
        run_stage(MASKS_CONFIG, masks, args.mask_steps,
                  data + [f"--model.init_checkpoint={boxes / 'checkpoints' / 'last.ckpt'}"] + args.set, args.overwrite)
    print(format_curve("boxes", read_curve(boxes)))
    print(format_curve("masks", read_curve(masks)))
    if args.plot:
        plot_curves(read_curve(boxes), read_curve(masks), args.plot)
    if args.things:
        counts = things_found(boxes / "checkpoints" / "last.ckpt", args.data_root, args.things, image_size=args.eval_size)
        print(f"{'threshold':>9} {'truths':>6} {'preds':>6} {'found':>6} {'wrong class':>11} {'duplicates':>10}")
        for threshold, count in counts.items():
            print(f"{threshold:9.2f} {count['truths']:6d} {count['predictions']:6d} {count['found']:6d} "
                  f"{count['wrong_class']:11d} {count['duplicates']:10d}")
    if args.thresholds:
        results = pq_by_threshold(masks / "checkpoints" / "last.ckpt", args.data_root, args.thresholds,
                                  image_size=args.eval_size, overlaps=[None, *args.overlaps])
        print(f"{'threshold':>9} {'overlap':>7} {'PQ':>6} {'SQ':>6} {'RQ':>6} {'PQ_th':>6} {'PQ_st':>6}")
        for (threshold, overlap), result in results.items():
            print(f"{threshold:9.2f} {'-' if overlap is None else f'{overlap:.2f}':>7} {result['All']['pq']:6.3f} {result['All']['sq']:6.3f} {result['All']['rq']:6.3f} "
                  f"{result['Things']['pq']:6.3f} {result['Stuff']['pq']:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
