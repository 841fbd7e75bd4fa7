"""A frame of a tracked video's explorer page in headless Chromium (tests/browser.py): each track's trail is drawn,
a tracked query's box is labelled with its track id (and shown whatever the threshold), a track no query matches is
drawn from the file, and the page's script runs without an error."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from detr.inference.predictor import Predictor
from detr.visualize.explorer import render_explorer_html
from detr.visualize.explorer.pages import explorer_page_data
from detr.visualize.explorer.tracks import add_tracks
from tests.browser import DevToolsPipe, Page, artifacts_dir
from tests.serving.helpers import spread_out_model


def test_tracks_are_drawn_on_the_frame(chromium: str, tmp_path: Path) -> None:
    pixels = np.random.default_rng(0).integers(0, 256, (128, 192, 3), dtype=np.uint8)
    data = explorer_page_data(Predictor(spread_out_model(), device="cpu"), pixels, title="clip.mp4 frame 5",
                              threshold=1.0)  # no query above the threshold: only tracked ones are drawn
    cx, cy, w, h = data["boxes"][-1][3]
    x, y, w, h = (cx - w / 2) * 192, (cy - h / 2) * 128, w * 192, h * 128
    record = {"source": "clip.mp4", "tracker": "bytetrack", "tracks": [
        {"id": 7, "category_id": 3, "label_name": "circle",
         "boxes": [[frame, x - 5 + frame, y, w, h, 0.9] for frame in range(1, 6)]},  # query 3's box in frame 5
        {"id": 9, "category_id": 7, "label_name": "square",
         "boxes": [[4, 10, 10, 20, 20, 0.8], [5, 12, 11, 20, 20, 0.8]]},  # nowhere near a query: drawn from the file
    ]}
    add_tracks(data, record, 5, trail_length=3)
    assert [t["query"] for t in data["tracks"]["tracks"]] == [3, None]
    page_path = tmp_path / "frame.html"
    page_path.write_text(render_explorer_html(data), encoding="utf-8")

    browser = DevToolsPipe(chromium, tmp_path / "chromium-profile")
    try:
        page = Page(browser)
        page.navigate(page_path.as_uri())
        page.wait_until("document.body.dataset.ready === 'true'")
        assert page.evaluate("document.querySelectorAll('#overlay .track-trail').length") == 2
        assert page.evaluate("document.querySelectorAll('#overlay .track-box').length") == 1
        assert page.evaluate("document.querySelector('#overlay .track-label').textContent") == "id 9 square 0.80"
        shown = page.evaluate("Array.from(document.querySelectorAll('#overlay .box')).map(b => b.dataset.query)")
        assert "3" in shown
        assert page.evaluate("document.querySelector('#overlay .box[data-query=\"3\"] text').textContent") \
            .startswith("#3 id 7 ")
        assert "frame 5 of clip.mp4, 2 tracks" in page.evaluate("document.getElementById('summary').textContent")
        (artifacts_dir() / "explorer_tracks_chromium.png").write_bytes(page.screenshot())
        assert page.errors() == []
    finally:
        browser.close()
