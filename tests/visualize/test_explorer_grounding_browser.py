"""A Grounding DINO explorer page (detr-explore --prompt) in headless Chromium (tests/browser.py): the selected
query's attention over the prompt is drawn as one chip per token, grouped by phrase, each showing the data's weight
for the shown layer and head (or their mean), and each phrase's share. Without Chromium the test is skipped, unless
the environment variable CI is set: then it fails. The screenshot is kept in ``$DETR_TEST_ARTIFACTS``.
"""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest

from detr.visualize.explorer.data import WEIGHT_UNITS
from tests.browser import DevToolsPipe, Page, artifacts_dir
from tests.helpers import REPO, read_sampling_page

PHOTO = REPO / "data" / "photos" / "000000039769.png"
PROMPT = "a cat. a remote control."

#: Per phrase group: its name ("" for [CLS], [SEP] and delimiters) and its chips as [token, weight text].
DRAWN_TOKENS = """Array.from(document.querySelectorAll('#prompt-tokens .phrase')).map(g => [
  (g.querySelector('.phrase-name') || {textContent: ''}).textContent,
  Array.from(g.querySelectorAll('.token')).map(t => [t.querySelector('.token-text').textContent,
                                                     t.querySelector('.token-weight').textContent])])"""


def _shown(weights: np.ndarray) -> list[str]:
    return [f"{100 * weight:.1f}%" for weight in weights]


@pytest.mark.slow  # a browser
def test_the_page_draws_the_query_s_attention_over_the_prompt(chromium: str, grounding_directory, tmp_path: Path):
    import detr
    from detr.visualize.explorer import write_attention_explorer

    model = detr.load_checkpoint(grounding_directory)
    page_path, = write_attention_explorer(model, [PHOTO], tmp_path / "pages", threshold=0.0, device="cpu",
                                          prompt=PROMPT)
    data = read_sampling_page(page_path)
    text = data["text"]
    weights = np.frombuffer(base64.b64decode(text["weights"]), "<u2").reshape(text["shape"]) / WEIGHT_UNITS

    browser = DevToolsPipe(chromium, tmp_path / "chromium-profile")
    try:
        page = Page(browser)
        page.navigate(page_path.as_uri())
        page.wait_until("document.body.dataset.ready === 'true'")
        assert page.evaluate("document.getElementById('prompt-section').hidden") is False
        assert PROMPT in page.evaluate("document.getElementById('summary').textContent")
        page.evaluate("window.detrExplorer.selectQuery(3)")
        query, layer = 3, page.evaluate("window.detrExplorer.state.layer")
        groups = page.evaluate(DRAWN_TOKENS)
        assert [name for name, _ in groups] == ["", "a cat", "", "a remote control", ""]
        assert [token for _, chips in groups for token, _ in chips] == text["tokens"]
        mean = weights[layer, query].mean(0)  # the page starts on the mean over heads
        assert [shown for _, chips in groups for _, shown in chips] == _shown(mean)
        shares = page.evaluate("Array.from(document.querySelectorAll('#prompt-phrases tr')).map(r => r.textContent)")
        assert shares[0].startswith("a cat") and shares[0].endswith(_shown([mean[1:3].sum()])[0])

        page.evaluate("window.detrExplorer.setHead(1); window.detrExplorer.setLayer(0)")
        groups = page.evaluate(DRAWN_TOKENS)
        assert [shown for _, chips in groups for _, shown in chips] == _shown(weights[0, query, 1])
        assert "layer 1, head 2" in page.evaluate("document.getElementById('prompt-title').textContent")
        (artifacts_dir() / "explorer_grounding_chromium.png").write_bytes(page.screenshot())
        assert page.errors() == []
    finally:
        browser.close()
