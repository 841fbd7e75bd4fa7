"""Every numeric option of every command is range-checked where it is parsed: a value out of range (0 images per
batch, a probability of 2, a negative timeout, NaN, inf) is argparse's one-line usage error naming the option
(exit 2), never a traceback after the model loads. The options are read off the commands' own parsers, so a
new option cannot escape the rule."""

from __future__ import annotations

import argparse
import importlib
import math

import pytest

from detr.inference.command_line import NumberRange, bounded_int, positive_float, positive_int, probability

from .test_commands import SCRIPTS

#: the commands built with argparse (``detr`` and ``detr-panoptic`` are LightningCLI's: their values are checked
#: by the constructors they reach, as SettingError lines)
ARGPARSE_COMMANDS = sorted(name for name, target in SCRIPTS.items() if target.startswith("detr.commands."))


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def command_parser(name: str, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser ``name``'s main builds, caught when it parses (nothing runs)."""
    def catch(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Parsed(self)

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", catch)
        with pytest.raises(_Parsed) as caught:
            main(name)([])
    return caught.value.parser


def main(name: str):
    module, _, function = SCRIPTS[name].partition(":")
    return getattr(importlib.import_module(module), function)


def out_of_range(kind: NumberRange) -> list[str]:
    """Values just outside ``kind``'s range, and the ones no range takes (NaN, infinities, text)."""
    values = ["nan", "inf", "-inf", "x"]
    step = 1 if kind.kind is int else 0.5
    if kind.low is not None:
        values.append(f"{kind.low if kind.low_open else kind.low - step:g}")
    if kind.high is not None:
        values.append(f"{kind.high if kind.high_open else kind.high + step:g}")
    if kind.kind is int:
        values.append("1.5")
    return values


def numeric_options(name: str, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, NumberRange]]:
    parser = command_parser(name, monkeypatch)
    return [(action.option_strings[0], action.type) for action in parser._actions
            if isinstance(action.type, NumberRange)]


@pytest.mark.parametrize("name", ARGPARSE_COMMANDS)
def test_no_command_parses_a_number_without_its_range(name: str, monkeypatch) -> None:
    """``type=int`` / ``type=float`` took -1, 0, NaN and inf; every numeric option now names its range."""
    parser = command_parser(name, monkeypatch)
    unchecked = [action.option_strings or action.dest for action in parser._actions if action.type in (int, float)]
    assert not unchecked, f"{name}: {unchecked} parse numbers without a range (use the types of command_line)"


@pytest.mark.parametrize("name", ARGPARSE_COMMANDS)
def test_every_numeric_option_refuses_values_out_of_range_in_one_line(name: str, monkeypatch, capsys) -> None:
    """S18, P11, C4, EX7: detr-serve --batch-timeout -1 / --threshold nan, detr-predict --batch-size 0 /
    --panoptic-overlap -3, detr-make-shapes' numbers, detr-export --max-ap-drop nan: each a traceback or accepted
    (NaN turned the export's accuracy gate off)."""
    options = numeric_options(name, monkeypatch)
    for option, kind in options:
        for value in out_of_range(kind):
            with pytest.raises(SystemExit) as exit_info:
                main(name)([f"{option}={value}"])
            error = capsys.readouterr().err
            assert exit_info.value.code == 2, (name, option, value)
            assert "Traceback" not in error
            lines = [line for line in error.splitlines() if "error:" in line]
            assert len(lines) == 1 and f"argument {option}:" in lines[0], (name, option, value, error)


def test_the_cases_of_the_sweep_are_among_the_checked_options(monkeypatch) -> None:
    checked = {name: dict(numeric_options(name, monkeypatch)) for name in ARGPARSE_COMMANDS}
    assert checked["detr-serve"]["--batch-timeout"].low == 0 and checked["detr-serve"]["--threshold"] is probability
    assert {"--threshold", "--panoptic-threshold", "--panoptic-overlap"} <= {
        option for option, kind in checked["detr-predict"].items() if kind is probability}
    assert checked["detr-predict"]["--batch-size"] is positive_int
    assert checked["detr-predict"]["--min-size"] is positive_int
    assert checked["detr-export"]["--max-ap-drop"].low == 0
    assert {"--num-train", "--image-size", "--empty-fraction", "--seed"} <= set(checked["detr-make-shapes"])


@pytest.mark.parametrize(("kind", "good", "bad"), [
    (probability, ["0", "1", "0.5", "1e-3"], ["-0.1", "1.01", "nan", "inf"]),
    (positive_int, ["1", "8"], ["0", "-1", "1.0", "nan"]),
    (positive_float, ["1e-9", "20"], ["0", "-0", "-1", "inf", "nan"]),
    (bounded_int(0, 65535), ["0", "65535"], ["-1", "65536"]),
])
def test_number_types(kind: NumberRange, good: list[str], bad: list[str]) -> None:
    for value in good:
        assert math.isclose(kind(value), float(value))
    for value in bad:
        with pytest.raises(argparse.ArgumentTypeError, match=r"out of range|is not"):
            kind(value)


def test_make_shapes_sizes_that_contradict_each_other_are_one_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main("detr-make-shapes")(["--image-size", "32", "--max-object-size", "48", "--out", "unused"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error and "--max-object-size" in error


@pytest.mark.parametrize("value", ["nan,3", "3,inf", "-1,2", "3"])
def test_an_encoder_point_out_of_range_is_a_usage_error(value: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main("detr-visualize-attention")([f"--encoder-points={value}"])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "argument --encoder-points: a reference point is X,Y" in error
