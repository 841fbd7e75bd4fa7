"""Figures and pages that show what DETR predicts and where its queries look.

- :mod:`detr.visualize.drawing`: every drawing on images (boxes, labels, panoptic segments, colours), once.
- :mod:`detr.visualize.figures`: matplotlib figures (the paper's Fig. 6 decoder attention per detected
  object, Fig. 3 encoder self-attention); functions return figures and never call ``show()``.
- :mod:`detr.visualize.explorer`: one self-contained interactive HTML page per image with every query,
  layer and head.
"""

from detr.visualize.explorer import explorer_data, render_explorer_html, render_index_html, write_attention_explorer
from detr.visualize.figures import (
    decoder_attention_figure,
    default_reference_points,
    encoder_attention_figure,
)

__all__ = ["decoder_attention_figure", "default_reference_points", "encoder_attention_figure", "explorer_data",
           "render_explorer_html", "render_index_html", "write_attention_explorer"]
