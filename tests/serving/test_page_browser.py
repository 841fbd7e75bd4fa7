"""detr-serve's page (GET /) in headless Chromium (tests/browser.py) against a running server: pick a photo in
the file input, the boxes of /predict are drawn, a click on one shows that query's decoder attention in the
attention explorer's page (served by /explore). Without Chromium the test is skipped, unless CI is set.

The screenshot is kept as an artifact in ``$DETR_TEST_ARTIFACTS`` (default ``outputs/test_artifacts``).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from tests.browser import DevToolsPipe, Page, artifacts_dir

REPO = Path(__file__).resolve().parents[2]
PHOTO = REPO / "data" / "photos" / "chelsea.png"
FRAME = "document.getElementById('explorer').contentWindow"

# A point (viewport CSS pixels) where a drawn box is the topmost element, for a box whose query is not the one
# the explorer shows now; and that query.
CLICKABLE_BOX = """(() => {
  const shown = %s.detrExplorer.state.query;
  for (const box of document.querySelectorAll('#boxes rect.box')) {
    if (Number(box.dataset.query) === shown) continue;
    const r = box.getBoundingClientRect();
    for (const [fx, fy] of [[0.5, 0.5], [0.3, 0.6], [0.7, 0.4], [0.2, 0.2], [0.8, 0.8]]) {
      const x = r.left + fx * r.width, y = r.top + fy * r.height;
      if (document.elementFromPoint(x, y) === box) return {x: x, y: y, query: Number(box.dataset.query)};
    }
  }
  return null; })()""" % FRAME

# A checksum of the explorer's main canvas: changes whenever the drawn map changes.
CANVAS_CHECKSUM = """(() => {
  const c = %s.document.getElementById('main-canvas');
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let s = 0; for (let i = 0; i < d.length; i += 1) s = (s * 31 + d[i]) %% 2147483647; return s; })()""" % FRAME


def test_page_uploads_draws_boxes_and_shows_attention(chromium: str, server, tmp_path: Path) -> None:
    request = urllib.request.Request(server.url + "/predict", data=PHOTO.read_bytes(), method="POST")
    expected = json.loads(urllib.request.urlopen(request, timeout=60).read())
    assert len(expected["detections"]) >= 2
    artifacts = artifacts_dir()

    browser = DevToolsPipe(chromium, tmp_path / "chromium-profile")
    try:
        page = Page(browser)
        page.navigate(server.url + "/")
        page.wait_until("document.getElementById('model').textContent.includes('tiny.ckpt')")  # /health answered
        assert page.evaluate("Number(document.getElementById('threshold').value)") == expected["threshold"]
        # before any upload the result area is not shown (no broken-image icon): its display rule gives way
        assert page.evaluate("getComputedStyle(document.getElementById('result')).display") == "none"

        # Pick the photo in the file input, as a user does.
        root = page.send("DOM.getDocument")["root"]["nodeId"]
        file_input = page.send("DOM.querySelector", {"nodeId": root, "selector": "#file"})["nodeId"]
        page.send("DOM.setFileInputFiles", {"nodeId": file_input, "files": [str(PHOTO)]})
        page.wait_until("document.body.dataset.detections !== undefined")

        boxes = page.evaluate("Array.from(document.querySelectorAll('#boxes rect.box')).map(r => "
                              "[Number(r.dataset.query), ['x', 'y', 'width', 'height'].map(k => "
                              "Number(r.getAttribute(k)))])")
        assert [query for query, _ in boxes] == [d["query"] for d in expected["detections"]]
        for (_, (x, y, width, height)), detection in zip(boxes, expected["detections"]):
            x0, y0, x1, y1 = detection["box_xyxy"]
            assert abs(x - x0) < 1e-3 and abs(y - y0) < 1e-3 and abs(width - (x1 - x0)) < 1e-3
        assert page.evaluate("document.querySelectorAll('#detections tbody tr').length") == len(boxes)

        # A click on a box: the explorer frame shows that query's decoder cross-attention.
        page.wait_until(f"{FRAME}.document.body && {FRAME}.document.body.dataset.ready === 'true'", timeout=60)
        before = page.evaluate(CANVAS_CHECKSUM)
        target = page.evaluate(CLICKABLE_BOX)
        assert target is not None, "no clickable box found"
        page.click(target["x"], target["y"])
        page.wait_until(f"{FRAME}.detrExplorer.state.query === {target['query']}")
        assert page.evaluate("document.getElementById('explorer').hidden") is False
        assert page.evaluate(f"{FRAME}.detrExplorer.state.mode") == "decoder"
        caption = page.evaluate(f"{FRAME}.document.getElementById('caption').textContent")
        assert caption.startswith(f"Decoder cross-attention: query {target['query']} ")
        assert page.evaluate(CANVAS_CHECKSUM) != before  # another query's map is drawn
        assert page.evaluate("document.querySelector('#boxes rect.selected').dataset.query") == str(target["query"])

        # Nothing came from anywhere but this server.
        sources = page.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
        assert all(source.startswith(server.url) or source.startswith("blob:") for source in sources), sources
        page.evaluate("window.scrollTo(0, 0)")
        (artifacts / "serve_page_chromium.png").write_bytes(page.screenshot())
        assert page.errors() == []
    finally:
        browser.close()
