"""`detr-demo` (`make demo`): train a small DETR on the synthetic shapes set on the CPU, evaluate it, write
outputs/demo/. Run it in a clone of the repository: it trains with configs/demo_shapes_cpu.yaml.

    detr-demo                      # data/shapes (made if missing), 10 minutes of training
    detr-demo --minutes 2          # a shorter run
    detr-demo --data-root DIR      # any COCO-layout set (DIR/train2017, val2017, annotations)

Steps: make data/shapes with the generator of detr-make-shapes if it is missing; `detr fit` with
configs/demo_shapes_cpu.yaml under a training time budget; evaluate the best checkpoint (val/AP) with
pycocotools; print the COCO table; write into outputs/demo/: metrics.json (AP, AP50, AP75,
APs, APm, APl, AR100), predictions.json (COCO results), per_class_ap.txt, ap_curve.csv, val_images/*.png,
checkpoints/, metrics.csv + TensorBoard events, the attention figure (attention.png) and an attention-explorer
page for one validation image (explorer/<image>.html: open it in a browser).

One run per folder, as for `detr fit`: a previous demo run in --out is replaced (a second `make demo` runs as the
first did); an --out that holds another run's files (a training run's checkpoints and logs) is refused, and
--overwrite deletes that run's files first, nothing else there.

The console stays quiet: one line per validation (step, training seconds, AP, AP50) and, once the step rate
is measured, the steps the budget is expected to hold, with the --minutes to ask for when that is fewer than
the recipe needs (RECIPE_STEPS). Everything else (Lightning's messages, warnings, the model summary, the COCO
tables) goes to outputs/demo/demo.log.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from detr.inference.command_line import one_line_errors, positive_float, positive_int
from detr.output_folder import (
    LOCK_NAME,
    MANIFEST_NAME,
    OutputFolder,
    OutputFolderError,
    hold_folders,
    previous_outputs,
    recorded_outputs,
)

# torch, Lightning and the package's training stack are imported inside the functions that run them, so that
# `detr-demo --help` answers without waiting for them.

# Steps of batch 8 that configs/demo_shapes_cpu.yaml needs to reach AP50 0.7 on the shapes set, and that AP50
# (docs/measurements/convergence.md: runs fitted to 1,000 steps end at AP50 0.888 and 0.895 on the generator's seeds 0 and 1;
# the demo fits its schedule to the steps its budget holds, so a machine that holds 1,000 gets there).
RECIPE_STEPS = 1000
RECIPE_AP50 = 0.7


def expectation(expected_steps: int, seconds_per_step: float, minutes: float,
                recipe_steps: int = RECIPE_STEPS, recipe_ap50: float = RECIPE_AP50) -> list[str]:
    """What a budget of ``minutes`` holds at ``seconds_per_step``: one line, and when ``expected_steps`` is
    fewer than ``recipe_steps``, the advice to give it the minutes that would hold them."""
    lines = [f"about {expected_steps:,} steps in {minutes:g} minutes on this machine ({seconds_per_step:.2f} s a step)"]
    if expected_steps < recipe_steps:
        needed = math.ceil(recipe_steps * seconds_per_step / 60 * 1.05)  # 5 %: the rate drifts a little
        lines.append(
            f"that is too few for the recipe's target: AP50 {recipe_ap50:g} needs about {recipe_steps:,} steps (about "
            f"{needed} minutes on this machine), so this run will end at a lower AP. Give it more time: "
            f"make demo DEMO_ARGS=\"--minutes {needed}\" (detr-demo --minutes {needed})")
    return lines


@contextlib.contextmanager
def quiet_console(log_path: Path, console: TextIO | None = None) -> Iterator[Callable[[str], None]]:
    """Send everything printed, logged or warned inside the block to ``log_path``; yield ``say``, which writes
    a line to ``console`` (default: the ``sys.stdout`` of the caller) and to the log.

    Lightning's and the other libraries' logging handlers write to the streams they were given at import, so
    those handlers are pointed at the log for the block; warnings are shown once per place, in the log."""
    console = sys.stdout if console is None else console
    handlers = [handler for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
                if isinstance(logger, logging.Logger) for handler in logger.handlers
                if type(handler) is logging.StreamHandler]
    package_logger = logging.getLogger("detr")
    with log_path.open("w") as log, contextlib.ExitStack() as stack:
        def say(line: str = "") -> None:
            print(line, file=console, flush=True)
            print(line, file=log, flush=True)

        streams = [(handler, _swap_stream(handler, log)) for handler in handlers]
        stack.callback(lambda: [_swap_stream(handler, stream) for handler, stream in streams])
        log_handler = logging.StreamHandler(log)
        log_handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        level = package_logger.level
        package_logger.addHandler(log_handler)
        package_logger.setLevel(logging.INFO)  # the COCO and per-class tables of every evaluation
        stack.callback(package_logger.setLevel, level)
        stack.callback(package_logger.removeHandler, log_handler)
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("default")
        warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: log.write(
            warnings.formatwarning(message, category, filename, lineno, line))
        stack.enter_context(contextlib.redirect_stdout(log))
        stack.enter_context(contextlib.redirect_stderr(log))
        yield say


def _swap_stream(handler: logging.StreamHandler, stream: TextIO | None) -> TextIO | None:
    """``handler.setStream(stream)`` (the old stream back), also when the handler's stream is already closed
    (a handler made for a console that is gone, e.g. a test's captured stderr): there is nothing to flush."""
    if getattr(handler.stream, "closed", False):
        old, handler.stream = handler.stream, stream
        return old
    return handler.setStream(stream)


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
    from detr.checkpoints import load_checkpoint
    from detr.inference.images import to_rgb_array
    from detr.inference.predictor import Predictor
    from detr.visualize.explorer import write_attention_explorer
    from detr.visualize.figures import decoder_attention_figure

    model = load_checkpoint(checkpoint)
    pixels = to_rgb_array(image)
    prediction = Predictor(model, device="cpu").predict(pixels, return_attention=True)[0]
    decoder_attention_figure(pixels, prediction, top_k=4).savefig(out / "attention.png", dpi=120)
    return write_attention_explorer(model, [image], out / "explorer", device="cpu")[0]


#: What a demo run always writes into its folder, besides what marks a training run's folder (checkpoints,
#: metrics.csv, hparams.yaml: :func:`detr.lightning.run_folder.previous_run_files`).
DEMO_FILES = ("demo.log", "metrics.json", "predictions.json", "per_class_ap.txt", "ap_curve.csv", "attention.png")


@contextlib.contextmanager
def claim_demo_folder(out: Path, *, overwrite: bool) -> Iterator[None]:
    """Hold ``out`` (created) for one demo run, as ``detr fit`` holds its run folder.

    A previous demo run there (every file of it listed in the folder's manifest) is replaced, so that a
    second ``make demo`` runs as the first did. A folder that holds files of another run (a training run's
    checkpoints and logs: the demo config's folder is also ``detr fit``'s) is refused, or with ``overwrite``
    that run's files are deleted first: those :data:`DEMO_FILES` and the run-folder files name, its
    TensorBoard events, and those the folder's manifest lists; a user's other files stay. When the block ends, every file it wrote (modified
    since it began) is listed in the manifest, so that a later ``--overwrite`` deletes exactly those
    (validation drawings and explorer pages included).

    Raises:
        OutputFolderError: a live run holds ``out``, or it holds files of a run that is not a previous demo's
            and ``overwrite`` is off.
    """
    from detr.lightning.run_folder import previous_run_files  # Lightning: not for --help

    with hold_folders([out], elsewhere="--out DIR"):
        previous = list(dict.fromkeys([*previous_run_files([out], out / "checkpoints"),
                                       *previous_outputs(out, DEMO_FILES)]))
        own = recorded_outputs(out) | {MANIFEST_NAME}
        foreign = [path for path in previous if path.relative_to(out).as_posix() not in own]
        if previous:
            listed = foreign or previous
            more = f" and {len(listed) - 6} more" if len(listed) > 6 else ""
            shown = ", ".join(str(p) for p in listed[:6]) + more
            if foreign and not overwrite:
                raise OutputFolderError(
                    f"output folder {out} holds another run's files ({shown}); pass --overwrite to start over "
                    "there (deletes that run's files, nothing else), or give this run another folder (--out DIR)")
            reason = "--overwrite" if foreign else "a previous demo run"
            logging.getLogger(__name__).warning("%s: deleting the previous run's files in %s: %s", reason, out, shown)
            for path in [*previous, *sorted(out.glob("events.out.tfevents.*"))]:  # TensorBoard would join two runs
                path.unlink(missing_ok=True)
        started = time.time()
        try:
            yield
        finally:
            folder = OutputFolder(out)
            for path in sorted(out.rglob("*")):
                if (path.is_file() and path.name not in (LOCK_NAME, MANIFEST_NAME)
                        and path.stat().st_mtime >= started):
                    folder.record(path)


@dataclass(frozen=True)
class DemoRun:
    """What :func:`train_and_evaluate` hands back: training seconds (validation excluded), the steps taken,
    the expected steps (None when the rate was never measured) and the explorer page (None if not written)."""

    train_seconds: float
    steps: int
    expected_steps: int | None
    explorer: Path | None


def train_and_evaluate(args: argparse.Namespace, data_root: Path, out: Path, say: Callable[[str], None]) -> DemoRun:
    """Fit the config for ``args.minutes`` of training, evaluate the best checkpoint, write the outputs into
    ``out``; ``say`` gets the lines meant for the user (one per validation, the expectation, the final table)."""
    import torch

    from detr.evaluation import STAT_NAMES, write_coco_results
    from detr.lightning.callbacks import ProgressLines, time_budget_of
    from detr.lightning.cli import make_cli

    say(f"training for {args.minutes:g} minutes on {torch.get_num_threads()} thread(s); outputs in {out}")
    cli = make_cli(["--config", args.config, f"--data.root={data_root}", f"--trainer.default_root_dir={out}",
                    "--trainer.enable_progress_bar=false",  # ProgressLines below says what the bars did
                    "--fit_report.quiet=true"],  # and what FitReport's lines would (it still draws ap_curve.png)
                   run=False)
    budget = time_budget_of(cli.trainer.callbacks)
    if budget is None:
        raise SystemExit(f"{args.config}: the demo needs the detr.lightning.callbacks.TimeBudget callback "
                         "(it ends training after --minutes of training time); add it under trainer.callbacks")
    budget.max_train_seconds = args.minutes * 60  # training time: the validations in between are not counted

    def on_rate(expected_steps: int, seconds_per_step: float) -> None:
        for line in expectation(expected_steps, seconds_per_step, args.minutes):
            say(line)

    lines = ProgressLines(say, budget, on_rate=on_rate)
    cli.trainer.callbacks.append(lines)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    # read now: validate() below restores the best checkpoint's callback states, the clock's seconds included
    train_seconds, steps = budget.clock.spent(), cli.trainer.global_step

    best = cli.trainer.checkpoint_callback.best_model_path or None
    cli.trainer.validate(cli.model, datamodule=cli.datamodule, ckpt_path=best, verbose=False)
    evaluation = cli.model.last_evaluation
    # pycocotools reports -1 where the ground truth has no object of that size (APl on 128 px images):
    # undefined, written as null rather than as a number.
    metrics = {k: (v if (v := evaluation.stats[k]) >= 0 else None) for k in STAT_NAMES}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    write_coco_results(out / "predictions.json", evaluation.results)
    (out / "per_class_ap.txt").write_text(evaluation.per_class_table() + "\n\n" + evaluation.summary + "\n")
    with (out / "ap_curve.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=["epoch", "step", "train_seconds", "AP", "AP50"])
        writer.writeheader()
        writer.writerows(ap_curve(out / "metrics.csv"))

    first_val = sorted((data_root / "val2017").glob("*.jpg"))[:1]
    explorer = attention_outputs(first_val[0], Path(best), out) if best and first_val else None

    say(f"\nCOCO evaluation of {best or 'the last weights'} on {len(evaluation.image_ids)} validation images "
        f"(pycocotools' summary: per_class_ap.txt):")
    say(evaluation.stats_table())
    say("\n" + evaluation.per_class_table())
    if lines.expected_steps is not None and steps < RECIPE_STEPS:
        say(f"\n{steps:,} steps: fewer than the {RECIPE_STEPS:,} the recipe needs for AP50 {RECIPE_AP50:g} "
            f"(see the advice above)")
    return DemoRun(train_seconds=train_seconds, steps=steps, expected_steps=lines.expected_steps,
                   explorer=explorer)


@one_line_errors
def main(argv: list[str] | None = None, *, repository: Path | None = None) -> int:
    """Run the demo; ``repository`` (default: the current folder) holds configs/ and receives data/shapes
    and outputs/demo unless the arguments name other places."""
    repository = Path.cwd() if repository is None else repository
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(repository / "configs" / "demo_shapes_cpu.yaml"))
    parser.add_argument("--data-root", default=None,
                        help="a COCO-layout set (default: data/shapes, written by the shapes generator if missing)")
    parser.add_argument("--out", default=str(repository / "outputs" / "demo"),
                        help="output folder (one run's: see --overwrite)")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over in an --out that holds another run (detr fit's), deleting its files")
    parser.add_argument("--minutes", type=positive_float, default=10.0, help="training budget (validation not counted)")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: every core of this process)")
    args = parser.parse_args(argv)
    if not Path(args.config).is_file():
        parser.error(f"--config {args.config} does not exist: run the demo in a clone of the repository (it holds "
                     "configs/demo_shapes_cpu.yaml) or pass --config")
    import torch

    from detr.data.shapes import ShapesConfig, write_shapes_dataset

    start = time.perf_counter()
    out = Path(args.out)
    with claim_demo_folder(out, overwrite=args.overwrite):
        data_root = Path(args.data_root) if args.data_root is not None else repository / "data" / "shapes"
        if args.data_root is None and write_shapes_dataset(data_root, ShapesConfig()):
            print(f"wrote the synthetic shapes set to {data_root} ({time.perf_counter() - start:.0f} s)")
        threads = args.threads or choose_threads()
        torch.set_num_threads(threads)
        with quiet_console(out / "demo.log") as say:
            result = train_and_evaluate(args, data_root, out, say)
    print(f"\nwall time {time.perf_counter() - start:.0f} s (training {result.train_seconds:.0f} s); full log in "
          f"{out / 'demo.log'}. Outputs in {out}:")
    for name in ("metrics.json", "predictions.json", "per_class_ap.txt", "ap_curve.csv", "val_images",
                 "attention.png", "checkpoints", "metrics.csv"):
        if (out / name).exists():
            print(f"  {out / name}")
    if result.explorer is not None:
        print(f"attention explorer of validation image {result.explorer.stem}: open {result.explorer} in a browser")
    report = out / "evaluation" / "val_analysis" / "report.html"  # written by the final validate
    if report.exists():
        print(f"error analysis (AP lost per error type, confusion matrix, worst cases): open {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
