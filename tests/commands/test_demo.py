"""detr-demo's console: one line per validation, the step count it expects and, on a budget too small for the
recipe, how much time to give it; everything else in OUT/demo.log. One short run in-process serves the tests."""

from __future__ import annotations

import contextlib
import csv
import io
import re
import sys
from pathlib import Path

import pytest
import torch

from detr.commands import demo
from detr.data.shapes import ShapesConfig, write_shapes_dataset
from detr.lightning.callbacks.training_time import TrainingClock

REPOSITORY = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^step +\d+ +[\d.]+ s  AP [\d.]+  AP50 [\d.]+$")
# what the console used to show: progress bars, Lightning's notices, the model summary, pycocotools' summary
NOISE = ["COCO eval:", "Epoch ", "weights_only", "LeafSpec", "Total FLOPs", "Total params", "Seed set to",
         "GPU available", "Average Precision", "Warning"]


class SteppedTime:
    """A time source that advances 0.5 s at every reading: the training clocks read it once a step, so the
    budget's decisions (its step count, the lines it prints) follow the run, not the machine's speed."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        self.seconds += 0.5
        return self.seconds


@pytest.fixture(scope="module")
def short_run(tmp_path_factory) -> tuple[str, Path]:
    """The demo on 16 training images (2 steps an epoch) for 3 seconds of training (simulated: half a second a
    reading of the clock, see SteppedTime), on one thread: its console output and its output folder."""
    root = tmp_path_factory.mktemp("demo")
    write_shapes_dataset(root / "shapes", ShapesConfig(num_train=16, num_val=8))
    threads, argv = torch.get_num_threads(), sys.argv
    sys.argv = ["detr-demo"]  # LightningCLI warns when sys.argv holds arguments besides its own
    console = io.StringIO()
    clock_init = TrainingClock.__init__
    try:
        with contextlib.redirect_stdout(console), pytest.MonkeyPatch.context() as patch:
            patch.setattr(TrainingClock, "__init__", lambda self, now=None: clock_init(self, SteppedTime()))
            assert demo.main(["--minutes", "0.05", "--threads", "1", "--data-root", str(root / "shapes"),
                              "--out", str(root / "out")], repository=REPOSITORY) == 0
    finally:
        torch.set_num_threads(threads)
        sys.argv = argv
    return console.getvalue(), root / "out"


def test_one_line_per_validation_and_no_library_noise(short_run) -> None:
    console, out = short_run
    with (out / "ap_curve.csv").open() as file:
        validations = list(csv.DictReader(file))
    lines = [line for line in console.splitlines() if LINE.match(line)]
    assert len(validations) >= 2 and len(lines) == len(validations)
    assert [int(line.split()[1]) for line in lines] == [int(row["step"]) + 1 for row in validations]
    for noise in NOISE:
        assert noise not in console, noise


def test_the_full_log_holds_what_the_console_leaves_out(short_run) -> None:
    console, out = short_run
    log = (out / "demo.log").read_text()
    for held in ("Seed set to 0", "Total params", "COCO box evaluation at epoch", "Average Precision"):
        assert held in log, held
    for line in console.splitlines()[:5]:  # what the console says is in the log too
        assert line in log
    # LastCheckpoint says weights_only itself, so Lightning has no notice to log after each save
    assert "`weights_only` was not set" not in log


def test_the_expected_steps_and_the_advice_for_a_budget_too_small(short_run) -> None:
    console, _ = short_run
    expected = re.search(r"about ([\d,]+) steps in 0.05 minutes on this machine \(([\d.]+) s a step\)", console)
    assert expected is not None, console
    assert "that is too few for the recipe's target" in console
    minutes = int(re.search(r'make demo DEMO_ARGS="--minutes (\d+)"', console).group(1))
    assert minutes >= demo.RECIPE_STEPS * float(expected.group(2)) / 60
    assert f"fewer than the {demo.RECIPE_STEPS:,} the recipe needs" in console


def test_expectation_advises_only_a_machine_too_slow_for_the_recipe() -> None:
    fast = demo.expectation(3302, 0.18, 10)
    assert fast == ["about 3,302 steps in 10 minutes on this machine (0.18 s a step)"]
    slow = demo.expectation(540, 1.1, 10)
    assert len(slow) == 2 and "too few for the recipe's target" in slow[1]
    assert 'DEMO_ARGS="--minutes 20"' in slow[1] and "detr-demo --minutes 20" in slow[1]  # 1,000 × 1.1 s + 5 %


def test_quiet_console_takes_over_a_handler_whose_stream_is_closed(tmp_path) -> None:
    """A StreamHandler left on a logger by an earlier run whose console is gone (pytest's captured stderr of
    an earlier test) made the demo fail at its start: flushing a closed stream raised ValueError."""
    import logging

    from detr.commands.demo import quiet_console

    gone = io.TextIOWrapper(io.BytesIO())  # as pytest's capture: flushing it once closed raises
    handler = logging.StreamHandler(gone)
    logger = logging.getLogger("detr_test_closed_console")
    logger.addHandler(handler)
    gone.close()
    try:
        with quiet_console(tmp_path / "demo.log", console=io.StringIO()) as say:
            say("a line")
            logger.warning("into the log")
        assert handler.stream is gone  # given back as it was
        assert "into the log" in (tmp_path / "demo.log").read_text()
    finally:
        logger.removeHandler(handler)


def test_an_out_holding_a_previous_run_is_refused_and_left_as_it_was(tmp_path, capsys) -> None:
    """The demo's folder is also `detr fit`'s for the demo config: a training run's checkpoints and a user's
    own drawings there were deleted without a word before the demo started."""
    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "last.ckpt").write_bytes(b"a training run's weights")
    (out / "val_images").mkdir()
    (out / "val_images" / "mine.png").write_bytes(b"a user's image")
    status = demo.main(["--minutes", "0.05", "--data-root", str(tmp_path / "absent"), "--out", str(out)],
                       repository=REPOSITORY)
    error = capsys.readouterr().err
    assert status == 2
    assert error.count("\n") == 1 and "last.ckpt" in error and "--overwrite" in error and "--out" in error
    assert (out / "checkpoints" / "last.ckpt").read_bytes() == b"a training run's weights"
    assert (out / "val_images" / "mine.png").read_bytes() == b"a user's image"
    assert not (out / "run.lock").exists()


def test_overwrite_deletes_the_previous_runs_files_and_nothing_else(tmp_path) -> None:
    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    (out / "val_images").mkdir()
    previous = [out / "checkpoints" / "last.ckpt", out / "metrics.csv", out / "metrics.json", out / "demo.log",
                out / "events.out.tfevents.1.host", out / "val_images" / "3.png"]
    for path in previous:
        path.write_bytes(b"previous run")
    (out / "outputs.txt").write_text("val_images/3.png\n")  # the previous demo's manifest
    mine = [out / "val_images" / "mine.png", out / "notes.txt"]
    for path in mine:
        path.write_bytes(b"the user's")
    with demo.claim_demo_folder(out, overwrite=True):
        assert (out / "run.lock").is_file()  # held: a second run into out is refused meanwhile
        assert not any(path.exists() for path in previous)
        assert all(path.read_bytes() == b"the user's" for path in mine)
        (out / "val_images" / "5.png").write_bytes(b"this run's drawing")
    assert not (out / "run.lock").exists()
    # the next --overwrite knows this run's drawing, not the user's files
    assert (out / "outputs.txt").read_text().splitlines() == ["val_images/5.png"]


def test_a_second_demo_into_its_own_folder_replaces_the_first(tmp_path) -> None:
    """`make demo` twice runs twice: a previous demo run (every file in the manifest) is replaced without
    --overwrite, and a user's files stay."""
    out = tmp_path / "out"
    with demo.claim_demo_folder(out, overwrite=False):
        (out / "checkpoints").mkdir()
        for name in ("demo.log", "metrics.json", "checkpoints/last.ckpt", "events.out.tfevents.1.host"):
            (out / name).write_bytes(b"first demo")
    (out / "notes.txt").write_bytes(b"the user's")  # written after the run: not in its manifest
    with demo.claim_demo_folder(out, overwrite=False):
        assert not (out / "demo.log").exists() and not (out / "checkpoints" / "last.ckpt").exists()
        assert (out / "notes.txt").read_bytes() == b"the user's"


def test_the_manifest_lists_what_the_run_wrote(short_run) -> None:
    """What a later --overwrite deletes: the run's drawings and checkpoints, named in the folder's manifest."""
    _, out = short_run
    listed = set((out / "outputs.txt").read_text().splitlines())
    assert {"metrics.json", "demo.log", "checkpoints/last.ckpt"} <= listed
    assert any(name.startswith("val_images/") for name in listed)
    assert "run.lock" not in listed and not (out / "run.lock").exists()
