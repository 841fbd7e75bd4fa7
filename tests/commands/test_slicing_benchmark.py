"""benchmarks/slicing.py on two small canvases with a tiny checkpoint: one row per setting (whole image; NMS
with and without the whole-image pass and drop_cut; sahi's slicing of the same model), the sliced rows run more
model inputs than the whole image, and every score is a COCO figure in [0, 100]."""

from __future__ import annotations

import pytest

from detr.checkpoints import save_checkpoint
from tests.helpers import REPO, load_script
from tests.serving.helpers import spread_out_model

pytestmark = pytest.mark.usefixtures("one_thread")


def test_whole_image_sliced_and_sahi_rows(tmp_path, monkeypatch, capsys):
    pytest.importorskip("sahi")
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # its `from machine import ...`
    benchmark = load_script("benchmarks/slicing.py")
    model = spread_out_model()
    checkpoint = save_checkpoint(model, tmp_path / "tiny.ckpt")
    rows = benchmark.main(["--checkpoint", str(checkpoint), "--data", str(tmp_path / "canvases"), "--images", "2",
                           "--canvas", "192", "--objects", "6", "--sizes", "16", "24", "--slice", "96",
                           "--merges", "nms", "--thresholds", "0.3", "--batch-size", "4"])
    sliced = [f"slice 96, overlap 0.2, {merge}{whole}{cut}" for merge in ("nms",)
              for whole in (", whole image", "") for cut in ("", ", drop_cut")]
    sahi = [f"sahi, slice 96, overlap 0.2, {merge}, whole image" for merge in ("GREEDYNMM", "NMS")]
    settings = ["whole image", *sliced, *sahi]
    assert [row["setting"] for row in rows] == settings
    assert {row["threshold"] for row in rows} == {"0.3"}
    inputs = {row["setting"]: row["inputs"] for row in rows}
    assert inputs["whole image"] == 1 and inputs["slice 96, overlap 0.2, nms, whole image"] == 3 * 3 + 1
    assert inputs["slice 96, overlap 0.2, nms"] == 3 * 3 and inputs[sahi[0]] > 1
    assert all(0 <= row[key] <= 100 for row in rows for key in ("AP", "AP50", "AP_small"))
    assert "| 0.3 | whole image | 1 |" in capsys.readouterr().out
