"""The attention explorer in a real browser: headless Chromium driven over the DevTools protocol
(tests/browser.py). Without Chromium the test is skipped, unless the environment variable CI is set: then it
fails.

The screenshot is kept as an artifact in ``$DETR_TEST_ARTIFACTS`` (default ``outputs/test_artifacts``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch

from detr import build_detr
from detr.visualize.explorer import write_attention_explorer
from tests.browser import CLICKABLE_OTHER_BOX, DevToolsPipe, Page, artifacts_dir
from tests.helpers import tiny_config_with

REPO = Path(__file__).resolve().parents[2]
PHOTO = Path(__file__).resolve().parents[1] / "data" / "chelsea.png"  # scikit-image's sample photo, in the repository

# A checksum of the main canvas's pixels: changes whenever the drawn map changes.
CANVAS_CHECKSUM = """(() => {
  const c = document.getElementById('main-canvas');
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let s = 0; for (let i = 0; i < d.length; i += 1) s = (s * 31 + d[i]) % 2147483647; return s; })()"""


# A point of the image that is on no box edge or tag, with the feature cell the page should pick.
FREE_IMAGE_POINT = """(() => {
  const r = document.getElementById('overlay').getBoundingClientRect(), e = window.detrExplorer;
  const [H, W] = e.imageSize;
  for (let fy = 0.9; fy > 0.05; fy -= 0.07) for (let fx = 0.9; fx > 0.05; fx -= 0.07) {
    const x = r.left + fx * r.width, y = r.top + fy * r.height, hit = document.elementFromPoint(x, y);
    if (hit && hit.classList.contains('background'))
      return {x: x, y: y, row: Math.floor(fy * H / e.stride), col: Math.floor(fx * W / e.stride)};
  }
  return null; })()"""


def spread_out_model() -> torch.nn.Module:
    """A tiny random DETR whose queries predict visibly different boxes and scores.

    At random init every decoder query attends almost uniformly, so all boxes coincide; larger query
    embeddings and box/class heads spread them out so that boxes can be told apart and clicked.
    """
    torch.manual_seed(0)
    model = build_detr(tiny_config_with(num_decoder_layers=3, num_queries=12))
    with torch.no_grad():
        model.query_embed.weight.mul_(10)
        model.bbox_embed.layers[-1].weight.mul_(10)
        model.class_embed.weight.mul_(10)
    return model



def test_explorer_page_in_chromium(chromium: str, tmp_path: Path) -> None:
    synthetic = np.zeros((120, 90, 3), np.uint8)
    synthetic[30:90, 20:70] = 200
    page_path, _, index_path = write_attention_explorer(spread_out_model(), [PHOTO, synthetic], tmp_path / "pages",
                                                        threshold=0.0, min_size=160, max_size=240, device="cpu")
    artifacts = artifacts_dir()

    browser = DevToolsPipe(chromium, tmp_path / "chromium-profile")
    try:
        index = Page(browser)
        index.navigate(index_path.as_uri())
        links = index.evaluate("Array.from(document.querySelectorAll('a.card')).map(a => a.getAttribute('href'))")
        assert links == [page_path.name, "image_001.html"]
        assert index.evaluate("Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
        assert index.errors() == []

        page = Page(browser)
        page.navigate(page_path.as_uri())
        page.wait_until("document.body.dataset.ready === 'true'")
        state = "window.detrExplorer.state"
        assert page.evaluate(f"{state}.mode") == "decoder"
        assert page.evaluate("document.querySelectorAll('#overlay .box').length") == 12  # threshold 0: all boxes

        # A click on a predicted box's tag selects that query.
        first_query = page.evaluate(f"{state}.query")
        target = page.evaluate(CLICKABLE_OTHER_BOX)
        assert target is not None, "no clickable box tag found"
        page.click(target["x"], target["y"])
        assert page.evaluate(f"{state}.query") == target["query"] != first_query
        assert page.evaluate("document.querySelector('#overlay .box.selected').dataset.query") == str(target["query"])
        assert page.evaluate("document.querySelector('#query-list tr.current').dataset.query") == str(target["query"])

        # Changing the layer (a click on the layer button) changes the map.
        before = page.evaluate(CANVAS_CHECKSUM)
        assert page.evaluate(f"{state}.layer") == 2
        button = page.evaluate("(() => { const r = document.querySelector('label:has(#layer-1) span')"
                               ".getBoundingClientRect(); return {x: r.left + r.width / 2, "
                               "y: r.top + r.height / 2}; })()")
        page.click(button["x"], button["y"])
        assert page.evaluate(f"{state}.layer") == 0
        assert page.evaluate(CANVAS_CHECKSUM) != before
        assert "layer 1/3" in page.evaluate("document.getElementById('caption').textContent")

        # A click on the image away from the boxes shows the encoder map of that feature position.
        before = page.evaluate(CANVAS_CHECKSUM)
        point = page.evaluate(FREE_IMAGE_POINT)
        assert point is not None, "every sampled image point is covered by a box"
        page.click(point["x"], point["y"])
        assert page.evaluate(f"{state}.mode") == "encoder"
        assert page.evaluate(f"{state}.encoderPosition") == [point["row"], point["col"]]
        assert page.evaluate(CANVAS_CHECKSUM) != before
        assert page.evaluate("document.getElementById('caption').textContent").startswith("Encoder self-attention")
        (artifacts / "explorer_chromium_encoder.png").write_bytes(page.screenshot())

        # Back to a decoder view for the main screenshot: the clicked query, head 1, its per-layer boxes.
        page.evaluate(f"window.detrExplorer.selectQuery({target['query']}); window.detrExplorer.setHead(0)")
        screenshot = page.screenshot()
        assert screenshot[:8] == b"\x89PNG\r\n\x1a\n"
        (artifacts / "explorer_chromium.png").write_bytes(screenshot)
        shutil.copy(page_path, artifacts / "explorer_page.html")

        assert page.errors() == []
    finally:
        browser.close()
