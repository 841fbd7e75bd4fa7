"""benchmarks/panoptic_shapes.py on a tiny set and budget: both stages run (bounded by steps), the curve has
a box-AP row and a PQ row, and the threshold sweep scores the final model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from detr.data.shapes import ShapesConfig
from detr.data.shapes_panoptic import write_shapes_panoptic

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_thread", "bare_argv")

TINY_MODEL = ["--model.detr.num_encoder_layers=1", "--model.detr.num_decoder_layers=2",
              "--model.detr.dim_feedforward=64", "--model.detr.num_queries=8"]
TINY_RUN = ["--trainer.limit_val_batches=1", "--trainer.enable_model_summary=false", "--trainer.log_every_n_steps=1",
            "--data.batch_size=2", "--data.val_batch_size=2", "--data.train_scales=[64]", "--data.train_max_size=64",
            "--data.crop_resize_scales=[64]", "--data.crop_min_size=64", "--data.crop_max_size=64",
            "--data.eval_min_size=64", "--data.eval_max_size=64", "--data.check_train=files"]


def _benchmark():
    spec = importlib.util.spec_from_file_location("panoptic_shapes", REPO / "benchmarks" / "panoptic_shapes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_both_stages_and_the_curve(tmp_path, capsys):
    root = tmp_path / "shapes"
    write_shapes_panoptic(root, ShapesConfig(num_train=4, num_val=2, image_size=64, min_object_size=12,
                                             max_object_size=32, max_objects=3, seed=3))
    benchmark = _benchmark()
    out = tmp_path / "runs"
    assert benchmark.main(["--data-root", str(root), "--out", str(out), "--box-steps", "2", "--mask-steps", "2",
                           "--eval-size", "64", "--thresholds", "0.0", "0.5",
                           *[f"--set={arg}" for arg in TINY_MODEL + TINY_RUN]]) == 0
    printed = capsys.readouterr().out
    boxes, masks = benchmark.read_curve(out / "boxes"), benchmark.read_curve(out / "masks")
    assert boxes[-1]["steps"] == 2 and "val/AP" in boxes[-1] and "val/PQ" not in boxes[-1]
    assert masks[-1]["steps"] == 2 and 0.0 <= masks[-1]["val/PQ"] <= 1.0
    assert "boxes" in printed and "masks" in printed and "threshold" in printed
    sweep = benchmark.pq_by_threshold(out / "masks" / "checkpoints" / "last.ckpt", root, [0.0, 1.0], image_size=64,
                                      overlaps=[None, 0.8])
    assert sweep[1.0, None]["All"]["pq"] == sweep[1.0, 0.8]["All"]["pq"] == 0.0  # no sigmoid score exceeds 1
    assert 0.0 <= sweep[0.0, None]["All"]["pq"] <= 1.0 and 0.0 <= sweep[0.0, 0.8]["All"]["pq"] <= 1.0

    # the box model's count of the validation things; a figure of both curves; a new mask stage on the same boxes
    counts = benchmark.things_found(out / "boxes" / "checkpoints" / "last.ckpt", root, [0.0, 1.0], image_size=64)
    assert counts[1.0]["predictions"] == 0 and counts[1.0]["found"] == 0
    assert counts[0.0]["truths"] == counts[1.0]["truths"] > 0
    assert counts[0.0]["found"] + counts[0.0]["wrong_class"] <= counts[0.0]["truths"]
    boxes_before = (out / "boxes" / "checkpoints" / "last.ckpt").read_bytes()
    assert benchmark.main(["--data-root", str(root), "--out", str(out), "--masks-only", "--overwrite", "--mask-steps",
                           "1", "--eval-size", "64", "--plot", str(tmp_path / "curve.png"),
                           *[f"--set={arg}" for arg in TINY_MODEL + TINY_RUN]]) == 0
    assert (out / "boxes" / "checkpoints" / "last.ckpt").read_bytes() == boxes_before
    assert benchmark.read_curve(out / "masks")[-1]["steps"] == 1
    assert (tmp_path / "curve.png").stat().st_size > 0
