"""The installed commands: every [project.scripts] entry resolves to a ``main``, every command module is
installed, the tools/ scripts run the same functions, and a command runs as a script and as a module."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
COMMAND_MODULES = sorted(path.stem for path in (REPO / "detr" / "commands").glob("*.py") if path.stem != "__init__")


def _entry_point(target: str):
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_installed_command_resolves_to_a_main(name: str) -> None:
    assert callable(_entry_point(SCRIPTS[name]))


def test_every_command_module_is_installed_under_its_name() -> None:
    installed = {target.partition(":")[0] for target in SCRIPTS.values()}
    assert {f"detr.commands.{module}" for module in COMMAND_MODULES} <= installed
    for module in COMMAND_MODULES:
        assert SCRIPTS["detr-" + module.replace("_", "-")] == f"detr.commands.{module}:main"
    assert {"detr", "detr-panoptic"} <= set(SCRIPTS)


def test_every_tool_script_runs_the_command_of_its_name() -> None:
    """tools/check_dataset.py ran detr-check-data and tools/explore_attention.py detr-explore: a reader of the
    README's `python tools/<name>.py` could not find them. tools/<name>.py runs detr-<name> (underscores as
    hyphens), and every command module has its script."""
    for path in sorted((REPO / "tools").glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"tool_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.main is _entry_point(SCRIPTS["detr-" + path.stem.replace("_", "-")]), path.name
    assert sorted(path.stem for path in (REPO / "tools").glob("*.py")) == COMMAND_MODULES


@pytest.mark.parametrize("module", ["predict", "explore", "visualize_attention", "export", "convert", "serve"])
def test_every_command_that_takes_a_checkpoint_says_the_same_of_it(module: str, capsys) -> None:
    """The commands described their checkpoint argument each in its own words, and most left out released
    names, directories or 'list'; one help now says what load_checkpoint reads (the ONNX file only where the
    command runs it)."""
    from detr.inference.command_line import CHECKPOINT_HELP, ONNX_HELP

    with pytest.raises(SystemExit):
        importlib.import_module(f"detr.commands.{module}").main(["--help"])
    text = " ".join(capsys.readouterr().out.split()).replace("- ", "-")  # argparse wraps lines after a hyphen
    assert " ".join(CHECKPOINT_HELP.split()) in text
    assert (" ".join(ONNX_HELP.split()) in text) == (module in ("predict", "serve"))


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)


def test_a_command_runs_as_a_tools_script_and_as_a_module() -> None:
    script = _run("tools/check_data.py", "--help")
    assert script.returncode == 0, script.stderr
    module = _run("-m", "detr.commands.check_data", "--help")
    assert module.returncode == 0, module.stderr
    assert "annotations_json" in script.stdout and "annotations_json" in module.stdout


def test_demo_outside_a_clone_names_the_missing_config(tmp_path: Path, capsys) -> None:
    from detr.commands import demo

    with pytest.raises(SystemExit) as exit_info:
        demo.main([], repository=tmp_path)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert str(tmp_path / "configs" / "demo_shapes_cpu.yaml") in error and "--config" in error


def test_the_huggingface_extra_installs_what_loading_a_converted_directory_needs() -> None:
    """`pip install .[huggingface]` then transformers' from_pretrained on a detr-convert directory failed: the
    extra had safetensors only, not transformers and the timm backbone it builds."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {requirement.split(">")[0].split("=")[0].strip() for requirement in extras["huggingface"]}
    assert {"safetensors", "transformers", "timm"} <= names


def test_help_of_every_command_answers_before_importing_torch() -> None:
    """Every command parsed its arguments after importing torch (and Lightning), so `--help` took 8-18 s on
    a 2-core machine: each command's --help must print without loading torch, Lightning or the image pipeline.
    `detr SUBCOMMAND --help` is LightningCLI's and needs the classes it describes; `detr --help` does not."""
    code = f"""
import contextlib, importlib, io, sys
heavy = ("torch", "lightning", "cv2", "albumentations", "matplotlib")
for name, target in {sorted(SCRIPTS.items())!r}:
    module, _, function = target.partition(":")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        status = getattr(importlib.import_module(module), function)(["--help"])
        assert status == 0, (name, status)
    loaded = [m for m in heavy if m in sys.modules]
    if loaded:
        print(f"{{name}} --help imported {{loaded}}")
        break
"""
    result = _run("-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "", result.stdout


def test_checkpoint_list_prints_the_released_models_without_importing_torch() -> None:
    """N15: `detr-predict --checkpoint list` imported every model family (and torch) to print a table of
    names: 14 s on a quiet machine. The table is data (detr/checkpoints/released.json)."""
    code = """
import contextlib, io, sys
from detr.commands import predict
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
    predict.main(["--checkpoint", "list"])
print(sorted(m for m in ("torch", "detr.checkpoints", "detr.models") if m in sys.modules))
print(out.getvalue())
"""
    result = _run("-c", code)
    assert result.returncode == 0, result.stderr
    loaded, _, table = result.stdout.partition("\n")
    assert loaded == "[]", loaded
    from detr.checkpoints.released import PRETRAINED_MODELS, describe

    assert all(f"{name} " in table and model.file_name in table for name, model in PRETRAINED_MODELS.items())
    assert table.strip() == describe()


def test_the_hub_folder_is_torch_hubs(monkeypatch, tmp_path) -> None:
    import torch

    from detr.inference.command_line import torch_hub_dir

    monkeypatch.setattr(torch.hub, "_hub_dir", None)  # as no program has set it (other tests set_dir)
    for variable, value in (("TORCH_HOME", str(tmp_path / "home")), ("XDG_CACHE_HOME", str(tmp_path / "xdg"))):
        monkeypatch.delenv("TORCH_HOME", raising=False)
        monkeypatch.setenv(variable, value)
        assert torch_hub_dir() == Path(torch.hub.get_dir())


def test_help_texts_name_every_family(capsys) -> None:
    """N14: RF-DETR (and DEIMv2) were missing from `detr --help` and `detr-export --help`; the families the help
    texts name are the list of families (detr.models.FAMILIES), not written out per command; `detr --help` also
    lists each family's presets."""
    from detr.commands import export
    from detr.inference.command_line import FAMILY_NAMES, PREDICT_ONLY_FAMILIES, PRESET_NAMES
    from detr.lightning.command import overview
    from detr.models import FAMILIES

    assert list(FAMILY_NAMES) == [family.name for family in FAMILIES] == list(PRESET_NAMES)
    assert PREDICT_ONLY_FAMILIES == tuple(family.name for family in FAMILIES if family.recipe is None)
    assert {family.name: tuple(family.presets) for family in FAMILIES} == PRESET_NAMES
    assert all(f"{name}" in overview("detr") for names in PRESET_NAMES.values() for name in names)
    with pytest.raises(SystemExit):
        export.main(["--help"])
    for text in (overview("detr"), capsys.readouterr().out):
        words = " ".join(text.split())
        assert all(f" {name}" in words for name in FAMILY_NAMES.values()), words


def test_the_commands_precisions_are_the_predictors() -> None:
    """--precision's choices (written out so that --help does not import torch) are the Predictor's precisions."""
    from detr.inference.command_line import PRECISIONS
    from detr.inference.predictor import AUTOCAST_DTYPES, Precision

    assert PRECISIONS == tuple(AUTOCAST_DTYPES) == typing.get_args(Precision)


def test_the_readme_lists_every_extra() -> None:
    """N14: `.[serve]` was missing from the README's list of extras."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    [line] = [line for line in (REPO / "README.md").read_text().splitlines() if "extras: " in line]
    assert all(f".[{extra}]" in line for extra in extras), line
