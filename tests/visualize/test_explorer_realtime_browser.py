"""The attention explorer page of a D-FINE model (3, 6 and 3 sampling points per level) in a real browser: a click
on a box draws each level's own points only, and the summary and the caption count them so (the padding slots up
to six per level weigh 0 and are not points). Needs Chromium (tests/browser.py); skipped without it unless CI is
set."""

from __future__ import annotations

from pathlib import Path

import pytest

from detr.visualize.explorer import write_attention_explorer
from tests.browser import CLICKABLE_OTHER_BOX, DevToolsPipe, Page
from tests.helpers import REPO, read_sampling_page
from tests.helpers_realtime import tiny_model

PHOTO = REPO / "data" / "photos" / "chelsea.png"

#: [head, level] of each drawn point
DRAWN_LEVELS = """Array.from(document.querySelectorAll('#overlay circle.point')).map(c => [Number(c.dataset.head),
  Number(c.dataset.level)])"""


@pytest.mark.slow  # a browser
def test_a_dfine_page_draws_and_counts_each_levels_own_points(chromium: str, tmp_path: Path) -> None:
    model = tiny_model("dfine")
    page_path, = write_attention_explorer(model, [PHOTO], tmp_path / "pages", threshold=0.0, device="cpu")
    heads = read_sampling_page(page_path)["num_heads"]
    browser = DevToolsPipe(chromium, tmp_path / "chromium-profile")
    try:
        page = Page(browser)
        page.navigate(page_path.as_uri())
        page.wait_until("document.body.dataset.ready === 'true'")
        assert "3, 6, 3 points per head on those levels" in page.evaluate(
            "document.getElementById('summary').textContent")
        target = page.evaluate(CLICKABLE_OTHER_BOX)
        assert target is not None, "no clickable box tag found"
        page.click(target["x"], target["y"])
        drawn = page.evaluate(DRAWN_LEVELS)
        assert sorted(drawn) == sorted([head, level] for head in range(heads)
                                       for level, count in enumerate((3, 6, 3)) for _ in range(count))
        assert f"; {heads * 12} points," in page.evaluate("document.getElementById('caption').textContent")
        assert page.errors() == []
    finally:
        browser.close()
