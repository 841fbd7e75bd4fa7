"""The installed commands other than the training CLIs (``detr`` and ``detr-panoptic``:
:mod:`detr.lightning.command`): one module per command, each with ``main(argv=None) -> int`` (the exit status)
and registered under ``[project.scripts]`` in pyproject.toml. ``python -m detr.commands.<name>`` and the
scripts in tools/ run the same functions.

    detr-predict  detr-export  detr-convert  detr-analyze  detr-explore  detr-visualize-attention
    detr-check-data  detr-make-shapes  detr-make-synthetic-coco  detr-demo  detr-serve

Each module parses its arguments before importing torch and the package's heavier layers (inside ``main``,
after ``parse_args``), so that ``--help`` answers at once (tests/commands/test_commands.py checks it).
"""
