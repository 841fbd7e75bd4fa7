"""The ``detr`` CLI: unknown keys are refused, links fill num_classes/category map, and a two-step fit on a tiny
shapes set writes logs, COCO metrics, drawn images and loadable checkpoints. Every config parsing, printing and
holding its recipe is tests/lightning/test_configs.py's."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import warnings
from pathlib import Path

import pytest
from jsonargparse import ArgumentParser

from detr import load_checkpoint
from detr.lightning.cli import DetrCLI, main, make_cli
from detr.lightning.datamodule import DetrDataModule
from detr.lightning.panoptic_datamodule import PanopticDataModule
from detr.lightning.panoptic_system import PanopticSystem
from detr.lightning.system import DetrSystem
from detr.models.family import families
from tests.helpers import TINY_CLI_MODEL, tiny_fit_args

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TINY_MODEL = TINY_CLI_MODEL


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _no_pytest_argv(monkeypatch) -> None:
    monkeypatch.setattr("sys.argv", ["detr"])  # LightningCLI warns when sys.argv and args both have arguments


def test_an_unknown_model_key_is_refused_by_name(tmp_path: Path, capsys) -> None:
    """A detector option outside model.detr (or any key no constructor has), in a YAML file or on the command
    line, stops the CLI with an error that names it."""
    config = tmp_path / "flat.yaml"
    config.write_text("model:\n  backbone: resnet18\n  lr: 1.0e-4\n")
    with pytest.raises(SystemExit) as exit_info:
        make_cli(["--config", str(config)], run=False)
    assert exit_info.value.code == 2
    assert "does not accept option 'backbone'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        make_cli(["--model.hidden_dim=64"], run=False)
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --model.hidden_dim=64" in capsys.readouterr().err


def test_links_fill_num_classes_and_category_map(tiny_shapes_root: Path, tmp_path: Path) -> None:
    cli = make_cli(["--config", str(CONFIGS / "demo_shapes_cpu.yaml"), f"--data.root={tiny_shapes_root}",
                f"--trainer.default_root_dir={tmp_path}", *TINY_MODEL], run=False)
    assert cli.model.model.num_classes == cli.datamodule.num_classes == 5
    assert cli.model.category_map == cli.datamodule.category_map
    assert cli.model.category_map.names == ("circle", "square", "triangle", "ellipse", "star")


def test_fit_two_steps_writes_logs_metrics_images_and_checkpoints(tiny_shapes_root: Path, tmp_path: Path,
                                                                  recwarn) -> None:
    where = {"save_dir": str(tmp_path), "name": "logs", "version": ""}
    loggers = json.dumps([
        {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": where},
        {"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": where},
    ])
    main([
        "fit", "--config", str(CONFIGS / "demo_shapes_cpu.yaml"), f"--data.root={tiny_shapes_root}",
        "--data.batch_size=4", "--data.val_batch_size=2", "--data.num_workers=0", *TINY_MODEL,
        f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger={loggers}", "--trainer.max_epochs=1",
        "--trainer.max_time=null", "--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false",
    ])
    # torch's LeafSpec deprecation, raised in Lightning's code, is no news to a detr user
    assert not [str(w.message) for w in recwarn if "LeafSpec" in str(w.message)]
    log_dir = tmp_path / "logs"
    with (log_dir / "metrics.csv").open() as file:
        rows = list(csv.DictReader(file))
    columns = set(rows[0])
    for name in ("train/loss", "train/loss_ce", "train/loss_bbox", "train/loss_giou", "train/loss_ce_0",
                 "train/class_error", "train/cardinality_error", "val/loss", "val/AP", "val/AP50", "val/AP75",
                 "val/APs", "val/APm", "val/APl", "val/AR100", "time/train_images_per_second"):
        assert name in columns, name
    assert any(row["val/AP"] for row in rows)
    assert (log_dir / "evaluation" / "val_predictions.json").is_file()
    assert "circle" in (log_dir / "evaluation" / "val_per_class_ap.txt").read_text()
    assert len(list((log_dir / "val_images").glob("*.png"))) == 4
    assert list(log_dir.glob("events.out.tfevents*"))
    checkpoints = sorted(p.name for p in (log_dir / "checkpoints").glob("*.ckpt"))
    assert "last.ckpt" in checkpoints and len(checkpoints) == 2  # last + best val/AP
    model = load_checkpoint(log_dir / "checkpoints" / "last.ckpt")
    assert model.num_classes == 5 and model.meta.category_map.names[0] == "circle"

    # `detr predict` from that checkpoint writes a COCO results json with file names and data set ids
    writer = json.dumps([{"class_path": "detr.lightning.callbacks.PredictionsWriter",
                          "init_args": {"output_path": str(tmp_path / "predict" / "predictions.json")}}])
    main([
        "predict", "--config", str(CONFIGS / "demo_shapes_cpu.yaml"), f"--data.root={tiny_shapes_root}",
        f"--data.predict_images={tiny_shapes_root / 'val2017'}", "--data.val_batch_size=3", "--data.num_workers=0",
        *TINY_MODEL, f"--trainer.callbacks={writer}", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
        f"--ckpt_path={log_dir / 'checkpoints' / 'last.ckpt'}",
    ])
    predictions = json.loads((tmp_path / "predict" / "predictions.json").read_text())
    names = {Path(p["file_name"]).name for p in predictions}
    assert names == {p.name for p in (tiny_shapes_root / "val2017").glob("*.jpg")}
    assert len(predictions) == 4 * 10  # every query of every image (score_threshold 0)
    assert {p["category_id"] for p in predictions} <= {1, 2, 3, 4, 5}


def test_max_steps_0_is_refused_by_its_flag(tiny_shapes_root, tmp_path, monkeypatch) -> None:
    """It used to fail inside the schedule: `ValueError: LinearDecayToZero: total_steps must be >= 1`."""
    monkeypatch.setattr("sys.argv", ["detr"])
    with pytest.raises(ValueError, match=r"^--trainer\.max_steps must be >= 1 \(or -1: no step limit\), got 0"):
        main(tiny_fit_args(tiny_shapes_root, tmp_path / "run", "--trainer.max_steps=0"))


def test_no_hosted_logger_advertisement(tiny_shapes_root: Path, tmp_path: Path, caplog) -> None:
    """Lightning printed "💡 Tip: ... litlogger ..." on every command, an advertisement no detr user asked for."""
    import logging

    with caplog.at_level(logging.INFO):
        assert main(tiny_fit_args(tiny_shapes_root, tmp_path / "run", "--trainer.max_steps=1")) == 0
    messages = [record.getMessage() for record in caplog.records]
    assert any("GPU available" in message for message in messages)  # Lightning's own lines are there
    assert not any("litlogger" in message for message in messages)


class _Parsed(Exception):
    """Raised with LightningCLI's parser instead of parsing: the options themselves, without running anything."""


class _ParserOnly(DetrCLI):
    def parse_arguments(self, parser, args) -> None:
        raise _Parsed(parser)


@pytest.mark.parametrize("panoptic", [False, True], ids=["detr", "detr-panoptic"])
def test_every_option_of_the_model_and_data_has_a_meaning_in_help(panoptic: bool) -> None:
    """`detr fit --help` listed `(type: ..., default: ...)` alone for --model.init_checkpoint, every
    --model.detr.* and --data.root: the docstrings' sections were not in the Google form LightningCLI reads.
    Every option of this project's classes (the system, the detector's config, the data module, the callbacks
    the CLI adds) must come with a sentence."""
    system, data = (PanopticSystem, PanopticDataModule) if panoptic else (DetrSystem, DetrDataModule)
    with pytest.raises(_Parsed) as parsed:
        _ParserOnly(system, data, args=[], run=False)
    ours = ("--model.", "--data.", "--data_check.", "--last_checkpoint.", "--overwrite_run")
    options = {option: action.help for action in parsed.value.args[0]._actions for option in action.option_strings
               if option.startswith(ours) and not option.endswith("+")  # "+": jsonargparse's append to a list
               and action.help != "Path to a configuration file."}  # a nested class's --model.detr CONFIG
    assert {"--model.init_checkpoint", "--model.detr", "--model.detr.help", "--data.root",
            "--model.optimizer.lr"} <= set(options)
    # a family's fields: `detr fit --model.detr.help DFINEConfig` (or after --model.detr CLASS), as jsonargparse
    # describes a subclass
    for family in families():
        fields = ArgumentParser()
        fields.add_class_arguments(family.config_class, "model.detr")
        options.update({option: action.help for action in fields._actions for option in action.option_strings
                        if option.startswith("--model.detr.") and action.help != "Path to a configuration file."})
    assert {"--model.detr.num_queries", "--model.detr.decoder.max_num_bins"} <= set(options)
    without = sorted(option for option, text in options.items() if not text or text.startswith("(type"))
    assert not without, f"options without a sentence in --help: {without}"
    assert "checkpoint" in options["--model.init_checkpoint"] and "COCO" in options["--data.root"]


def test_a_run_without_an_epoch_limit_shows_no_negative_epoch_count(tiny_shapes_root, tmp_path) -> None:
    """Lightning's rich progress bar wrote "Epoch 3/-2" (max_epochs - 1) for the configs whose step limit or
    time budget ends the run (max_epochs: -1)."""
    from detr.lightning.cli import EpochProgressBar

    args = tiny_fit_args(tiny_shapes_root, tmp_path / "run")[1:]  # without the subcommand: run=False
    args = [arg for arg in args if not arg.startswith("--trainer.enable_progress_bar")]
    cli = make_cli(args, run=False)
    bar = cli.trainer.progress_bar_callback
    assert isinstance(bar, EpochProgressBar) and cli.trainer.max_epochs == -1
    bar.setup(cli.trainer, cli.model, stage="fit")  # as the fit does: the bar reads the trainer's limits
    assert bar._get_train_description(3).strip() == "Epoch 3"


def test_lightning_warnings_that_contradict_the_project_are_not_shown(tiny_shapes_root, tmp_path) -> None:
    """A mid-epoch resume warned "your dataloader is not resumable" (docs/guides/train-on-your-data.md says the rest of the epoch
    comes from a fresh shuffle, on purpose), and an epoch that ended before the first validation warned that
    ModelCheckpoint "could not find the monitored key" val/AP, which the validation logs."""
    out = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # 2 steps an epoch, validation every second epoch: epoch 0 ends at step 2 with no val/AP yet
        main(tiny_fit_args(tiny_shapes_root, out, "--trainer.max_steps=1", "--trainer.check_val_every_n_epoch=2"))
        main(tiny_fit_args(tiny_shapes_root, out, "--trainer.max_steps=3", "--trainer.check_val_every_n_epoch=2",
                           f"--ckpt_path={out / 'checkpoints' / 'last.ckpt'}"))  # resumes at step 1 of 2
    shown = [str(w.message) for w in caught]
    assert not [m for m in shown if "not resumable" in m or "could not find the monitored key" in m], shown


def test_the_command_line_says_nothing_about_its_own_arguments(monkeypatch) -> None:
    """`detr fit ...` opened with Lightning's four-line warning that args and sys.argv were both given: the
    command passes sys.argv[1:] itself, so the warning was about nothing a user did."""
    from detr.lightning.command import main as command_main

    config = CONFIGS / "detr_r50_coco.yaml"
    monkeypatch.setattr("sys.argv", ["detr", "fit", "--config", str(config), "--print_config"])
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("default")
        with contextlib.suppress(SystemExit):
            command_main()
    assert not [w for w in caught if "args parameter" in str(w.message)]


def test_fit_on_a_yolo_folder_as_it_is(tmp_path: Path) -> None:
    """`detr fit --data.root` on a YOLO data set (format given, and told from the path): it trains, validates
    (COCO AP against the labels read as COCO) and records the data.yaml's class names in the checkpoint."""
    from tests.helpers import YOLO_NAMES, write_yolo_set

    data_yaml = write_yolo_set(tmp_path / "data")
    assert main(tiny_fit_args(tmp_path / "data", tmp_path / "run", "--data.format=yolo", "--trainer.max_steps=2",
                              "--data.val_batch_size=2")) == 0
    assert "cat" in (tmp_path / "run" / "evaluation" / "val_per_class_ap.txt").read_text()
    model = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert list(model.meta.category_map.names) == YOLO_NAMES
    assert main(tiny_fit_args(data_yaml, tmp_path / "again", "--trainer.max_steps=1")) == 0


def test_fit_on_a_voc_folder_as_it_is(tmp_path: Path) -> None:
    """The same on a Pascal VOC folder: its difficult box is left out of training and ignored by the evaluation."""
    from tests.helpers import write_voc_set

    root = write_voc_set(tmp_path / "voc")
    assert main(tiny_fit_args(root, tmp_path / "run", "--trainer.max_steps=1", "--data.batch_size=2",
                              "--data.val_batch_size=1")) == 0
    assert list(load_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt").meta.category_map.names) == [
        "cat", "dog", "person"]


def test_help_lists_every_family_and_its_presets(capsys) -> None:
    """`detr --help` and `detr fit --help` end with the model families and their presets, the names a config's
    model.detr takes."""
    for args in (["--help"], ["fit", "--help"]):
        with pytest.raises(SystemExit):
            main(args)
        printed = capsys.readouterr().out
        for family in families():
            assert f"{family.title} ({family.config_class.__name__})" in printed
            assert all(name in printed for name in family.presets)
