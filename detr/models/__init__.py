"""DETR's parts: backbone, position encodings, transformer and the composed model."""

from detr.models.detr import DETR, MLP, build_detr

__all__ = ["DETR", "MLP", "build_detr"]
