"""`detr-demo` (`make demo`): train a small DETR on the synthetic shapes set on the CPU, evaluate it, write
outputs/demo/. Run it in a clone of the repository: it trains with configs/demo_shapes_cpu.yaml.

    detr-demo                      # data/shapes (made if missing), 10 minutes of training
    detr-demo --minutes 2          # a shorter run
    detr-demo --data-root DIR      # any COCO-layout set (DIR/train2017, val2017, annotations)

Steps: make data/shapes with the generator of detr-make-shapes if it is missing; `detr fit` with
configs/demo_shapes_cpu.yaml under a training time budget; evaluate the best checkpoint (val/AP) with
pycocotools; print the COCO table and the AP curve; write into outputs/demo/: metrics.json (AP, AP50, AP75,
APs, APm, APl, AR100), predictions.json (COCO results), per_class_ap.txt, ap_curve.csv, val_images/*.png,
checkpoints/, metrics.csv + TensorBoard events, the attention figure (attention.png) and an attention-explorer
page for one validation image (explorer/<image>.html: open it in a browser).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from detr.checkpoints import load_checkpoint
from detr.data.shapes import ShapesConfig, write_shapes_dataset
from detr.evaluation import STAT_NAMES, write_coco_results
from detr.inference.images import to_rgb_array
from detr.inference.predictor import Predictor
from detr.lightning.callbacks import time_budget_of
from detr.lightning.cli import make_cli
from detr.visualize.explorer import write_attention_explorer
from detr.visualize.figures import decoder_attention_figure


def choose_threads() -> int:
    """Torch threads for training: every core this process may run on. The data are read in the training
    process (the demo config has no loader worker), so no core is kept back; a run on a machine that is
    busy with other work can pass ``--threads``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def ap_curve(metrics_csv: Path) -> list[dict[str, float]]:
    """(epoch, step, training seconds, AP, AP50) at every validation of the fit, from the CSV logger's
    metrics.csv (the final re-evaluation of the best checkpoint has no training time and is left out)."""
    with metrics_csv.open() as file:
        rows = [row for row in csv.DictReader(file) if row.get("val/AP") and row.get("time/train_seconds")]
    return [{"epoch": int(float(r["epoch"])), "step": int(float(r["step"])),
             "train_seconds": round(float(r["time/train_seconds"]), 1),
             "AP": float(r["val/AP"]), "AP50": float(r["val/AP50"])} for r in rows]


def attention_outputs(image: Path, checkpoint: Path, out: Path) -> Path:
    """The decoder attention of the 4 best queries on ``image`` (``out``/attention.png) and an
    attention-explorer page for it (``out``/explorer/<image stem>.html, returned), both at the size the
    checkpoint was validated at (it carries the data module's eval size)."""
    model = load_checkpoint(checkpoint)
    pixels = to_rgb_array(image)
    prediction = Predictor(model, device="cpu").predict(pixels, return_attention=True)[0]
    decoder_attention_figure(pixels, prediction, top_k=4).savefig(out / "attention.png", dpi=120)
    return write_attention_explorer(model, [image], out / "explorer", device="cpu")[0]


def main(argv: list[str] | None = None, *, repository: Path | None = None) -> int:
    """Run the demo; ``repository`` (default: the current folder) holds configs/ and receives data/shapes
    and outputs/demo unless the arguments name other places."""
    repository = Path.cwd() if repository is None else repository
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(repository / "configs" / "demo_shapes_cpu.yaml"))
    parser.add_argument("--data-root", default=None,
                        help="a COCO-layout set (default: data/shapes, written by the shapes generator if missing)")
    parser.add_argument("--out", default=str(repository / "outputs" / "demo"))
    parser.add_argument("--minutes", type=float, default=10.0, help="training budget (validation not counted)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: every core of this process)")
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error(f"--minutes must be > 0 (minutes of training), got {args.minutes:g}")
    if not Path(args.config).is_file():
        parser.error(f"--config {args.config} does not exist: run the demo in a clone of the repository (it holds "
                     "configs/demo_shapes_cpu.yaml) or pass --config")
    start = time.perf_counter()
    out = Path(args.out)
    data_root = Path(args.data_root) if args.data_root is not None else repository / "data" / "shapes"
    if args.data_root is None and write_shapes_dataset(data_root, ShapesConfig()):
        print(f"wrote the synthetic shapes set to {data_root} ({time.perf_counter() - start:.0f} s)")
    for stale in ("checkpoints", "val_images"):  # this script's own outputs of an earlier run
        shutil.rmtree(out / stale, ignore_errors=True)
    threads = args.threads or choose_threads()
    torch.set_num_threads(threads)
    print(f"training for {args.minutes:g} minutes on {threads} thread(s); outputs in {out}")

    seconds = args.minutes * 60
    cli = make_cli(["--config", args.config, f"--data.root={data_root}", f"--trainer.default_root_dir={out}"],
                   run=False)
    budget = time_budget_of(cli.trainer.callbacks)
    if budget is None:
        raise SystemExit(f"{args.config}: the demo needs the detr.lightning.callbacks.TimeBudget callback "
                         "(it ends training after --minutes of training time); add it under trainer.callbacks")
    budget.max_train_seconds = seconds  # training time: the validations in between are not counted
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    train_wall = time.perf_counter() - start

    best = cli.trainer.checkpoint_callback.best_model_path or None
    cli.trainer.validate(cli.model, datamodule=cli.datamodule, ckpt_path=best, verbose=False)
    evaluation = cli.model.last_evaluation
    # pycocotools reports -1 where the ground truth has no object of that size (APl on 128 px images):
    # undefined, written as null rather than as a number.
    metrics = {k: (v if (v := evaluation.stats[k]) >= 0 else None) for k in STAT_NAMES}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    write_coco_results(out / "predictions.json", evaluation.results)
    (out / "per_class_ap.txt").write_text(evaluation.per_class_table() + "\n\n" + evaluation.summary + "\n")
    curve = ap_curve(out / "metrics.csv")
    with (out / "ap_curve.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=["epoch", "step", "train_seconds", "AP", "AP50"])
        writer.writeheader()
        writer.writerows(curve)

    first_val = sorted((data_root / "val2017").glob("*.jpg"))[:1]
    explorer = attention_outputs(first_val[0], Path(best), out) if best and first_val else None

    print(f"\nCOCO evaluation of {best or 'the last weights'} on {len(evaluation.image_ids)} validation images:")
    print(evaluation.summary)
    print(evaluation.stats_table())
    print("\n" + evaluation.per_class_table())
    print("\nAP curve (training seconds exclude validation):")
    for point in curve:
        print(f"  epoch {point['epoch']:3d}  step {point['step']:5d}  {point['train_seconds']:7.1f} s  "
              f"AP {point['AP']:.3f}  AP50 {point['AP50']:.3f}")
    print(f"\nwall time {time.perf_counter() - start:.0f} s (training {train_wall:.0f} s). Outputs in {out}:")
    for name in ("metrics.json", "predictions.json", "per_class_ap.txt", "ap_curve.csv", "val_images",
                 "attention.png", "checkpoints", "metrics.csv"):
        if (out / name).exists():
            print(f"  {out / name}")
    if explorer is not None:
        print(f"attention explorer of validation image {first_val[0].name}: open {explorer} in a browser")
    report = out / "evaluation" / "val_analysis" / "report.html"  # written by the final validate
    if report.exists():
        print(f"error analysis (AP lost per error type, confusion matrix, worst cases): open {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
