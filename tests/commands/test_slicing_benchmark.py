"""benchmarks/slicing.py on two small canvases with a tiny checkpoint: one row per setting, the sliced rows run
more model inputs than the whole image, and every score is a COCO figure in [0, 100]."""

from __future__ import annotations


import pytest

from detr.checkpoints import save_checkpoint
from tests.helpers import REPO, load_script
from tests.serving.helpers import spread_out_model

pytestmark = pytest.mark.usefixtures("one_thread")


def test_whole_image_and_sliced_rows(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # its `from machine import ...`
    benchmark = load_script("benchmarks/slicing.py")
    model = spread_out_model()
    checkpoint = save_checkpoint(model, tmp_path / "tiny.ckpt")
    rows = benchmark.main(["--checkpoint", str(checkpoint), "--data", str(tmp_path / "canvases"), "--images", "2",
                           "--canvas", "192", "--objects", "6", "--sizes", "16", "24", "--slice", "96",
                           "--merges", "nms", "nmm", "--batch-size", "4"])
    assert [row["setting"] for row in rows] == ["whole image", "slice 96, overlap 0.2, nms",
                                                "slice 96, overlap 0.2, nmm"]
    assert rows[0]["inputs"] == 1 and rows[1]["inputs"] == rows[2]["inputs"] == 3 * 3 + 1
    assert all(0 <= row[key] <= 100 for row in rows for key in ("AP", "AP50", "AP_small"))
    assert "| whole image | 1 |" in capsys.readouterr().out
