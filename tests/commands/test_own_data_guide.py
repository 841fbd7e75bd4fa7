"""docs/guides/own-data.md runs as written: its setup and its six commands (check, convert, fine-tune, validate,
predict, export) on the tiny YOLO folder the guide makes, each exiting 0, and each output line the guide shows
that holds no number (numbers move with the machine) printed by the command; the data commands' output whole.

Each command runs in a fresh Python process from the console-script table of pyproject.toml (the commands need not
be installed), in a folder where ``configs/`` is the repository's, as in a clone."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import REPO

GUIDE = REPO / "docs" / "guides" / "own-data.md"
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
#: The six steps, in the guide's order: what each step's command starts with.
STEPS = ("detr-check-data", "detr-convert-data", "detr fit", "detr validate", "detr-predict", "detr-export")
#: Commands whose output is the same on every machine: shown whole in the guide.
EXACT = ("detr-check-data", "detr-convert-data")


@dataclass
class Step:
    """A command of the guide and the output shown under it (None: none shown)."""

    section: str
    command: str
    shown: str | None


def guide_steps(text: str) -> list[Step]:
    """Every command of the guide's ``bash`` blocks (continuation lines joined, comments dropped) in order, each
    with the ``text`` block that follows its block, if one does before the next ``bash`` block."""
    steps: list[Step] = []
    section = ""
    for match in re.finditer(r"^## ([^\n]*)$|^```(\w*)\n(.*?)^```$", text, flags=re.M | re.S):
        if match.group(1) is not None:
            section = match.group(1)
        elif match.group(2) == "bash":
            lines = match.group(3).replace("\\\n", " ").splitlines()
            steps += [Step(section, line.split(" #")[0].strip(), None) for line in lines
                      if line.strip() and not line.startswith("#")]
        elif match.group(2) == "text" and steps and steps[-1].shown is None:
            steps[-1].shown = match.group(3)
    return steps


def run_command(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``command`` (an installed command's name and its arguments) in ``cwd``, stdout and stderr together."""
    name, *args = shlex.split(command)
    assert name in SCRIPTS, f"{command!r}: not a command of this package"
    module, _, function = SCRIPTS[name].partition(":")
    code = f"import sys; sys.argv[0] = {name!r}; from {module} import {function}; sys.exit({function}())"
    environment = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "COLUMNS": "120"}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=environment, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)


def test_the_guide_has_six_numbered_commands() -> None:
    numbered = [step for step in guide_steps(GUIDE.read_text()) if re.match(r"\d\. ", step.section)]
    assert [step.command.startswith(start) for step, start in zip(numbered, STEPS)] == [True] * 6, \
        [step.command for step in numbered]
    assert len(numbered) == 6 and all(step.shown for step in numbered)


@pytest.mark.slow
def test_the_guide_runs_as_written(tmp_path: Path) -> None:
    (tmp_path / "configs").symlink_to(REPO / "configs")
    for step in guide_steps(GUIDE.read_text()):
        result = run_command(step.command, tmp_path)
        assert result.returncode == 0, f"{step.command}\n{result.stdout[-3000:]}"
        if step.shown is None:
            continue
        printed = result.stdout.splitlines()
        if step.command.startswith(EXACT):
            assert step.shown.splitlines() == printed, f"{step.command}\n{result.stdout}"
            continue
        for line in step.shown.splitlines():
            if line != "..." and not re.search(r"\d", line):
                assert line in printed, f"{step.command}: {line!r} not printed\n{result.stdout[-3000:]}"
