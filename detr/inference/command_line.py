"""Command-line options shared by the tools that run a checkpoint on images (``detr-predict``,
``detr-explore``, ``detr-visualize-attention``)."""

from __future__ import annotations

import argparse

from detr.models.inputs import EVAL_MAX_SIZE, EVAL_MIN_SIZE


def add_resize_arguments(parser: argparse.ArgumentParser) -> None:
    """``--min-size`` / ``--max-size`` (default None: the size the checkpoint was validated at, else the
    authors' 800 / 1333; see :class:`detr.inference.predictor.Predictor`)."""
    parser.add_argument("--min-size", type=int, default=None,
                        help=f"eval resize: shortest side (default: the checkpoint's validation size, else {EVAL_MIN_SIZE})")
    parser.add_argument("--max-size", type=int, default=None,
                        help=f"eval resize: longest side cap (default: the checkpoint's validation size, else {EVAL_MAX_SIZE})")
