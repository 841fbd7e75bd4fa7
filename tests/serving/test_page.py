"""The serve page's markup without a browser (tests/serving/test_page_browser.py drives it in Chromium): what
the page hides stays hidden whatever display its id's rule sets."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "detr" / "serving" / "page.html"


def test_hidden_elements_stay_hidden_under_their_display_rules() -> None:
    """``#result{display:flex}`` overrode the ``hidden`` attribute (the user agent's ``display:none`` loses to
    any author rule), so the page showed a broken-image icon before the first upload and after an error."""
    text = PAGE.read_text()
    style = text[text.index("<style>"):text.index("</style>")]
    hidden_ids = re.findall(r'<\w+ id="([\w-]+)"[^>]*\bhidden\b', text)
    displayed = [name for name in hidden_ids if re.search(r"#%s\{[^}]*display:" % name, style)]
    assert "result" in displayed  # the case this guards: a hidden element whose rule sets a display
    assert re.search(r"\[hidden\]\{display:none !important\}", style), "a [hidden] rule must win over them"


def test_box_labels_keep_their_screen_size_and_stay_inside_a_small_image() -> None:
    """The labels were 12 px of the image: a 128-px image shown 480 px wide drew 45-px text, cut at the right
    edge. The page's placement function (run here in Node) sizes them in screen pixels and keeps them inside."""
    import json
    import shutil
    import subprocess

    import pytest

    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js not found (the placement is checked in Chromium by test_page_browser.py as well)")
    text = PAGE.read_text()
    function = text[text.index("// <label-placement>"):text.index("// </label-placement>")]
    cases = [  # box, text width (image px at that size), image width, height, screen px per image px
        ([100, 2, 127, 30], 40, 128, 128, 480 / 128),   # a small image shown large, a box at the right edge
        ([5, 120, 60, 128], 20, 128, 128, 480 / 128),   # a box at the bottom
        ([10, 10, 200, 100], 60, 1280, 960, 900 / 1280),  # a large photo shown smaller
    ]
    script = function + f"console.log(JSON.stringify({json.dumps(cases)}.map(c => labelPlacement(...c))));"
    places = json.loads(subprocess.run([node, "-e", script], capture_output=True, text=True, check=True).stdout)
    for (box, text_width, width, height, scale), place in zip(cases, places):
        assert place["fontSize"] * scale == pytest.approx(13)  # 13 px on the screen, whatever the image's scale
        assert 0 <= place["x"] and place["x"] + text_width <= width
        assert place["fontSize"] <= place["y"] <= height
    assert "font-size:12px" not in text[text.index("#boxes text"):]


def test_the_prompt_box_shows_for_a_prompted_model_and_goes_into_predict() -> None:
    """A Grounding DINO checkpoint's /predict needs ?prompt= (tests/serving/test_prompt.py): the page shows its
    prompt box when /health says ``prompted``, adds the box's text to /predict, and asks no /explore page then."""
    text = PAGE.read_text()
    assert re.search(r'<label id="prompt-box" hidden>', text) and 'id="prompt"' in text
    assert '$("prompt-box").hidden = !state.prompted' in text and "health.prompted" in text
    assert '"&prompt=" + encodeURIComponent($("prompt").value)' in text
    assert "state.prompted ? Promise.reject" in text
