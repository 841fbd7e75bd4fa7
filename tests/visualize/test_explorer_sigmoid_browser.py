"""The explorer page of a sigmoid-head model in Chromium: its last class is a real class, not "no object".

A softmax head has num_classes + 1 logits, the last one "no object"; a sigmoid (focal) head has
num_classes, all real. The page once took the last name as "no object" whatever the head, so a sigmoid
model's queries whose best class was its last real class were listed as "no object".
"""

from __future__ import annotations

import numpy as np
import torch

from detr import build_detr
from detr.visualize.explorer import write_attention_explorer
from tests.browser import DevToolsPipe, Page
from tests.helpers import tiny_config_with

NO_OBJECT_COLUMN = ("Array.from(document.querySelectorAll('#query-list tr'))"
                    ".map(row => row.cells[3].textContent)")
NO_OBJECT_BARS = "document.querySelectorAll('#classes .bar-fill.no-object').length"


def sigmoid_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_detr(tiny_config_with(num_queries=5, num_classes=3, query_type="anchor",
                                          class_head="sigmoid")).eval()
    with torch.no_grad():
        model.class_embed.bias.copy_(torch.tensor([-3.0, -3.0, 4.0]))  # the last real class wins every query
    return model


def test_sigmoid_model_has_no_no_object_label(chromium: str, tmp_path) -> None:
    image = np.zeros((64, 80, 3), np.uint8)
    image[16:48, 20:60] = 180
    page_path = write_attention_explorer(sigmoid_model(), [image], tmp_path / "pages", threshold=0.0,
                                         min_size=64, max_size=96, device="cpu")[0]
    browser = DevToolsPipe(chromium, tmp_path / "chromium-profile")
    try:
        page = Page(browser)
        page.navigate(page_path.as_uri())
        page.wait_until("document.body.dataset.ready === 'true'")
        assert page.evaluate(NO_OBJECT_COLUMN) == [""] * 5  # no query is called "no object"
        assert page.evaluate(NO_OBJECT_BARS) == 0  # the top-class bars draw no class as "no object"
        # a single-scale model has no levels: the row's flex display must not show an empty "Level" label
        assert page.evaluate("getComputedStyle(document.getElementById('level-row')).display") == "none"
        assert page.errors() == []
    finally:
        browser.close()
