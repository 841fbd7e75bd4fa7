"""detr.visualize.analysis_figures: the worst-case gallery reads images by the data sets' file-name rule."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from detr.evaluation.analysis import Case
from detr.visualize.analysis_figures import gallery_figure


def test_the_gallery_reads_no_file_outside_the_images_folder(tmp_path: Path) -> None:
    """A ground truth's '../x.png' was read from outside --images; 'sub\\\\a.png' is sub/a.png."""
    (tmp_path / "images" / "sub").mkdir(parents=True)
    Image.new("RGB", (40, 30), (200, 10, 10)).save(tmp_path / "outside.png")
    Image.new("RGB", (40, 30), (10, 200, 10)).save(tmp_path / "images" / "sub" / "a.png")
    cases = [Case("missed", 1, "../outside.png", gt_box=[5, 5, 10, 10], gt_name="thing"),
             Case("missed", 2, "sub\\a.png", gt_box=[5, 5, 10, 10], gt_name="thing")]
    figure, missing = gallery_figure(cases, tmp_path / "images")
    assert figure is not None and missing == ["../outside.png"]
