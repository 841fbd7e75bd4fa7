"""A Deformable DETR's explorer page in headless Chromium (tests/browser.py): a click on a box draws that
query's sampling points where the data puts them, and the level and head controls filter them. Without
Chromium the test is skipped, unless the environment variable CI is set: then it fails.

The screenshot is kept as an artifact in ``$DETR_TEST_ARTIFACTS`` (default ``outputs/test_artifacts``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from detr import build_detr
from detr.visualize.explorer import write_attention_explorer
from tests.browser import CLICKABLE_OTHER_BOX, DevToolsPipe, Page, artifacts_dir
from tests.helpers import REPO, randomise, read_sampling_page, tiny_config_with

PHOTO = REPO / "data" / "photos" / "chelsea.png"


# The drawn points as [head, level, x, y, r] in the image's pixels (the overlay's viewBox).
DRAWN_POINTS = """Array.from(document.querySelectorAll('#overlay circle.point')).map(c => [Number(c.dataset.head),
  Number(c.dataset.level), Number(c.getAttribute('cx')), Number(c.getAttribute('cy')), Number(c.getAttribute('r'))])"""


def drawn_radii(drawn: list, data: dict, layer: int, query: int) -> np.ndarray:
    """The radius of the circle drawn for each of the query's points of ``layer``, [heads, levels, P]: every
    point of the data has a circle of its head and level at its place (to the page's rounding), no circle is
    left over."""
    width, height = data["image"]["width"], data["image"]["height"]
    expected = data["sampling"]["points"][layer, query] * np.array([width, height])  # [heads, levels, P, 2]
    radii = np.zeros(expected.shape[:-1])
    unmatched = list(drawn)
    for index in np.ndindex(*radii.shape):
        head, level, _ = index
        distances = [np.hypot(x - expected[index][0], y - expected[index][1]) if (h, lv) == (head, level) else np.inf
                     for h, lv, x, y, _ in unmatched]
        nearest = int(np.argmin(distances))
        assert distances[nearest] < 0.01, f"no circle drawn at point {index}: {expected[index]}"
        radii[index] = unmatched.pop(nearest)[4]
    assert unmatched == []
    return radii


def button_centre(page: Page, input_id: str) -> dict:
    return page.evaluate(f"(() => {{ const r = document.querySelector('label:has(#{input_id}) span')"
                         ".getBoundingClientRect(); return {x: r.left + r.width / 2, y: r.top + r.height / 2}; })()")


@pytest.mark.slow  # a browser: about 1 s here once Chromium is installed, far more on a loaded machine
def test_clicking_a_box_draws_its_sampling_points(chromium: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_detr(tiny_config_with(architecture="deformable", class_head="sigmoid", num_points=3,
                                        dropout=0.0, box_refine=True)).eval()
    randomise(model, 1)
    model.meta = model.meta.replace(eval_size=(160, 240))
    page_path, = write_attention_explorer(model, [PHOTO], tmp_path / "pages", threshold=0.0, device="cpu")
    data = read_sampling_page(page_path)
    heads, levels, points = data["sampling"]["shape"][2:]  # 2 heads, 4 levels, 3 points
    artifacts = artifacts_dir()

    browser = DevToolsPipe(chromium, tmp_path / "chromium-profile")
    try:
        page = Page(browser)
        page.navigate(page_path.as_uri())
        page.wait_until("document.body.dataset.ready === 'true'")
        state = "window.detrExplorer.state"
        assert page.evaluate("window.detrExplorer.kind") == "sampling"
        assert page.evaluate("document.querySelectorAll('#overlay .box').length") == 10  # threshold 0: all boxes

        # A click on another query's box tag selects it and draws its points: every head's, level's and point's,
        # where the data puts them (the last layer), area ∝ weight.
        target = page.evaluate(CLICKABLE_OTHER_BOX)
        assert target is not None, "no clickable box tag found"
        page.click(target["x"], target["y"])
        query = target["query"]
        assert page.evaluate(f"{state}.query") == query
        drawn = page.evaluate(DRAWN_POINTS)
        assert len(drawn) == heads * levels * points == 24
        radii = drawn_radii(drawn, data, -1, query)
        weights = data["sampling"]["weights"][-1, query]  # [heads, levels, P]
        np.testing.assert_allclose(radii ** 2 / radii.max() ** 2, weights / weights.max(), atol=1e-3)  # area ∝ weight
        caption = page.evaluate("document.getElementById('caption').textContent")
        assert f"query {query}" in caption and "24 points" in caption
        # the legend: one row per level with its stride and the share (mean over heads) of the data
        rows = page.evaluate("Array.from(document.querySelectorAll('#levels tr')).map(r => r.textContent)")
        shares = weights.sum(-1).mean(0)
        assert [row.split("%")[0].endswith(f"{100 * share:.1f}") for row, share in zip(rows, shares)] == [True] * 4
        assert "stride 64" in rows[3]

        # Level 2 alone (a click on its button): that level's points of both heads; then head 1 alone.
        level_button = button_centre(page, "level-2")
        page.click(level_button["x"], level_button["y"])
        assert page.evaluate(f"{state}.level") == 1
        assert sorted({(h, lv) for h, lv, *_ in page.evaluate(DRAWN_POINTS)}) == [(0, 1), (1, 1)]
        head_button = button_centre(page, "head-1")
        page.click(head_button["x"], head_button["y"])
        assert [(h, lv) for h, lv, *_ in page.evaluate(DRAWN_POINTS)] == [(0, 1)] * points
        assert "head 1/2, level 2 (stride 16)" in page.evaluate("document.getElementById('caption').textContent")

        # Back to all levels and heads: layer 1 shows that layer's points.
        page.evaluate("window.detrExplorer.setLevel(4); window.detrExplorer.setHead(2); "
                      "window.detrExplorer.setLayer(0)")
        drawn_radii(page.evaluate(DRAWN_POINTS), data, 0, query)
        (artifacts / "explorer_deformable_chromium.png").write_bytes(page.screenshot())
        assert page.errors() == []
    finally:
        browser.close()
