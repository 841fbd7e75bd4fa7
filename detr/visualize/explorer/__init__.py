"""An interactive, offline attention explorer: one self-contained HTML page per image.

The page shows the image with every query's predicted box. Selecting a box (or a row of the query list)
shows that query's decoder cross-attention for any decoder layer and head (or the mean over heads), its
top-5 classes with probabilities (no-object included) and its box after every decoder layer; clicking any
other pixel shows the last encoder layer's self-attention of that feature position (paper Fig. 3 and 6,
for every query, layer and head instead of the figures' selection). For a Deformable DETR the page shows,
instead of maps, the clicked query's sampling points per feature level and head with their weights (the
Deformable DETR paper's Fig. 5 and 6, for any query, layer, head and level), and each level's share of the
query's attention; it has no encoder view. For a prompted model (Grounding DINO, ``prompt=``) the sampling page
also shows the clicked query's attention over the prompt's tokens per layer and head, grouped by phrase.

Everything is inline in one file (HTML, CSS and JavaScript; the image as JPEG; the maps as base64), so the
page opens from the file system with no server and no network; page sizes: docs/guides/explore.md.

- :mod:`~detr.visualize.explorer.data`: a page's data from the model's outputs (:func:`explorer_data`, its format);
- :mod:`~detr.visualize.explorer.render`: the HTML of a page and of an index;
- :mod:`~detr.visualize.explorer.pages`: :func:`write_attention_explorer`, pages for a model and images;
- :mod:`~detr.visualize.explorer.tracks`: :func:`write_frame_explorer`, a frame of a tracked video with its tracks.
"""

from detr.visualize.explorer.data import DATA_FORMAT, explorer_data, feature_stride, quantize_maps
from detr.visualize.explorer.pages import write_attention_explorer
from detr.visualize.explorer.render import render_explorer_html, render_index_html
from detr.visualize.explorer.tracks import write_frame_explorer

__all__ = [
    "DATA_FORMAT",
    "explorer_data",
    "feature_stride",
    "quantize_maps",
    "render_explorer_html",
    "render_index_html",
    "write_attention_explorer",
    "write_frame_explorer",
]
