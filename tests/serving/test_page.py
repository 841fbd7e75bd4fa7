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
