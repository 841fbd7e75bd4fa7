"""`detr` and `detr-panoptic` as the shell runs them: the overview of `--help` and the configs it names."""

from __future__ import annotations

from pathlib import Path

from detr.lightning.command import DETECTION_CONFIGS, PANOPTIC_CONFIGS, main, overview

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
