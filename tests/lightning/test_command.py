"""`detr` and `detr-panoptic` as the shell runs them: the overview of `--help` and the configs it names, and
expected errors as one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from detr.lightning.command import DETECTION_CONFIGS, PANOPTIC_CONFIGS, main, overview
from tests.helpers import tiny_fit_args


class Exploit:
    """A pickle that runs a shell command when loaded."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))

REPO = Path(__file__).resolve().parents[2]


def _named(configs: dict[str, tuple[str, ...]]) -> set[str]:
    return {name.split(" ")[0] for names in configs.values() for name in names}


def test_the_overview_names_every_config_and_only_configs_that_exist() -> None:
    """`detr --help` was Lightning's generic text: it names the configs a user can start from, so a config
    added to configs/ without a line there, or a line whose file went away, would make it untrue."""
    named = _named(DETECTION_CONFIGS) | _named(PANOPTIC_CONFIGS)
    on_disk = {path.name for path in (REPO / "configs").glob("*.yaml")}
    assert named == on_disk
    assert all(f"configs/{name}" in overview("detr") for name in _named(DETECTION_CONFIGS))
    assert all(f"configs/{name}" in overview("detr-panoptic") for name in _named(PANOPTIC_CONFIGS))


def test_help_lists_the_subcommands_and_detr_alone_is_a_usage_error(capsys) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for subcommand in ("fit", "validate", "test", "predict"):
        assert f"\n  {subcommand} " in out
    assert "detr fit --config configs/demo_shapes_cpu.yaml" in out
    assert main([]) == 2  # as argparse: the overview on stderr, since no subcommand was given
    assert "usage: detr {fit,validate,test,predict}" in capsys.readouterr().err


def _one_line_error(capsys, args: list[str], lines_before: int = 2) -> str:
    """Run `detr ARGS` as the shell does; it must exit 2 with one `error:` line, no traceback, and at most
    ``lines_before`` lines before it (jsonargparse's short usage and tip; a run's log once it started);
    returns the error line."""
    try:
        status = main(args)
    except SystemExit as exit_:  # jsonargparse's own usage errors
        status = exit_.code
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) <= lines_before + 1 and lines[-1].startswith("error: "), err
    return lines[-1]


@pytest.mark.usefixtures("one_thread")
def test_expected_errors_of_fit_are_one_line_naming_the_file_or_flag(tiny_shapes_root, tmp_path, capsys,
                                                                     monkeypatch) -> None:
    """An unreadable config, a data root or checkpoint that does not exist, a value out of range and a run
    folder in use came out as 30-130 lines (a traceback, or the usage of every option) with the useful
    sentence last; a YAML file that is empty or does not parse was not even named."""
    monkeypatch.setattr("sys.argv", ["detr"])  # LightningCLI warns when sys.argv and args both have arguments
    monkeypatch.delenv("DETR_DEBUG", raising=False)
    empty, broken = tmp_path / "empty.yaml", tmp_path / "broken.yaml"
    empty.write_text("# nothing yet\n")
    broken.write_text("trainer:\n  max_steps: [1\n")
    line = _one_line_error(capsys, ["fit", "--config", str(empty)])
    assert str(empty) in line and "empty" in line
    line = _one_line_error(capsys, ["fit", "--config", str(broken)])
    assert str(broken) in line and "not valid YAML (line 3" in line

    run = tmp_path / "run"
    fit = tiny_fit_args(tiny_shapes_root, run, "--trainer.max_steps=1")
    missing = tmp_path / "nowhere"
    assert f"data root '{missing}' does not exist" in _one_line_error(capsys, [*fit, f"--data.root={missing}"])
    assert "num_queries must be an integer >= 1" in _one_line_error(capsys, [*fit, "--model.detr.num_queries=0"])
    assert "--model.optimizer.lr must be >= 0, got -1" in _one_line_error(capsys, [*fit, "--model.optimizer.lr=-1"])
    # found once the fit has started: the run's log lines (data checks ...) come first
    line = _one_line_error(capsys, [*fit, "--trainer.max_steps=0"], lines_before=20)
    assert "--trainer.max_steps must be >= 1" in line
    line = _one_line_error(capsys, [*fit, f"--ckpt_path={tmp_path / 'last.ckpt'}"])
    assert f"--ckpt_path {tmp_path / 'last.ckpt'} does not exist" in line
    line = _one_line_error(capsys, [*fit, "--model.init_checkpoint", str(empty)])
    assert str(empty) in line
    evil = tmp_path / "evil.ckpt"  # K3: called "truncated", with torch's advice to load it anyway
    torch.save({"state_dict": {}, "x": Exploit(tmp_path / "pwned")}, evil)
    line = _one_line_error(capsys, [*fit, f"--ckpt_path={evil}"])
    assert f"refused to load {evil}: it carries code" in line and "truncated" not in line
    assert not (tmp_path / "pwned").exists()

    # N4: the README's first detr fit offline (ImageNet weights to download) was a 133-line traceback whose fix
    # was phrased in Python
    import urllib.error

    import torchvision

    def offline(self, *args, **kwargs):
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(torchvision.models.WeightsEnum, "get_state_dict", offline)
    line = _one_line_error(capsys, [*fit, "--model.detr.pretrained_backbone=true"], lines_before=20)
    assert "--model.detr.pretrained_backbone /path/resnet18-f37072fd.pth" in line and "Name or service" in line
    assert "--model.detr.pretrained_backbone false" in line
    monkeypatch.undo()
    monkeypatch.setattr("sys.argv", ["detr"])
    monkeypatch.delenv("DETR_DEBUG", raising=False)

    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.csv").write_text("epoch,step\n")
    assert "holds a previous run" in _one_line_error(capsys, fit, lines_before=20)


def test_debug_shows_the_traceback_of_an_expected_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("sys.argv", ["detr"])
    monkeypatch.delenv("DETR_DEBUG", raising=False)
    args = ["fit", "--config", str(REPO / "configs" / "demo_shapes_cpu.yaml"), f"--data.root={tmp_path / 'none'}"]
    with pytest.raises(ValueError, match="does not exist"):
        main([*args, "--debug"])


def test_only_the_asked_subcommands_parser_is_built(capsys, monkeypatch) -> None:
    """N15: `detr fit --help` built the parsers of fit, validate, test and predict (each describes every option
    of the system, the data and the Trainer: seconds each) to print one. A misspelt subcommand still lists all."""
    from detr.lightning.cli import DetrCLI

    built: list[str] = []
    prepare = DetrCLI._prepare_subcommand_parser

    def counted(self, klass, subcommand, **kwargs):
        built.append(subcommand)
        return prepare(self, klass, subcommand, **kwargs)

    monkeypatch.setattr(DetrCLI, "_prepare_subcommand_parser", counted)
    monkeypatch.setattr("sys.argv", ["detr"])
    with pytest.raises(SystemExit) as exit_:
        main(["validate", "--help"])
    assert exit_.value.code == 0 and built == ["validate"] and "--ckpt_path" in capsys.readouterr().out
    built.clear()
    with pytest.raises(SystemExit):
        main(["fitt"])
    assert built == ["fit", "validate", "test", "predict"]
    assert "invalid choice: 'fitt' (choose from 'fit', 'validate', 'test', 'predict')" in capsys.readouterr().err
