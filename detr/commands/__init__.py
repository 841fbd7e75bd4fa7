"""The installed commands other than the training CLIs (``detr`` and ``detr-panoptic``:
:mod:`detr.lightning.cli`): one module per command, each with ``main(argv=None) -> int`` (the exit status)
and registered under ``[project.scripts]`` in pyproject.toml. ``python -m detr.commands.<name>`` and the
scripts in tools/ run the same functions.

    detr-predict  detr-export  detr-convert  detr-analyze  detr-explore  detr-visualize-attention
    detr-check-data  detr-make-shapes  detr-demo

Each module imports what its command needs itself, so that ``import detr`` stays light.
"""
