"""benchmarks/finetune.py: a shapes model fine-tuned onto the second set (new classes, few images), one run per
variant, AP against steps in one table; the defaults start circle and triangle from the source's rows."""

from __future__ import annotations

import logging
import re

import pytest

from detr.categories import CategoryMap
from detr.checkpoints import save_checkpoint
from detr.data.shapes import SHAPE_NAMES
from detr.models.build import build_detr
from detr.models.config import ModelMeta
from tests.helpers import load_script

pytestmark = pytest.mark.usefixtures("one_thread", "bare_argv")

TINY = ["detr.hidden_dim=32", "detr.num_heads=2", "detr.num_decoder_layers=2", "detr.dim_feedforward=48",
        "detr.num_queries=6", "batch_size=2"]


def tiny_source(benchmark, path):
    """A source model of the tiny recipe with the shapes set's classes, saved at ``path``."""
    config = benchmark.build_run_config(str(benchmark.PRESET), TINY).detr.replace(num_classes=len(SHAPE_NAMES))
    source = build_detr(config)
    source.meta = ModelMeta(category_map=CategoryMap(tuple(range(1, 6)), SHAPE_NAMES), eval_size=(128, 128))
    return save_checkpoint(source, path)


def test_variants_print_ap_against_steps(tmp_path, capsys, caplog) -> None:
    benchmark = load_script("benchmarks/finetune.py")
    path = tiny_source(benchmark, tmp_path / "source.ckpt")
    argv = ["--source", str(path), *(f"--set={item}" for item in TINY), "--variants", "defaults", "scratch",
            "rows_by_label", "lr_drop", "--images", "4", "6", "--steps", "2", "--eval-every-steps", "2", "--num-val",
            "2", "--threads", "1", "--cache-dir", str(tmp_path)]
    with caplog.at_level(logging.INFO, logger="detr.lightning.system"):
        assert benchmark.main(argv) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (\w+) \| (\d+) \| [0-9.]+ \([0-9.]+\) \|$", out, re.MULTILINE)
    assert rows == [("defaults", "4"), ("scratch", "4"), ("rows_by_label", "4"), ("lr_drop", "4"), ("defaults", "6"),
                    ("scratch", "6")]
    assert "init_checkpoint: 2 classes start from" in caplog.text and "3 fresh: cross, arrow, semicircle" in caplog.text
    assert (tmp_path / "finetune_6_2" / "annotations" / "instances_train2017.json").is_file()
    # the step drop lands two thirds into the run: 3 steps of 2-image batches over 4 images, at epoch 1
    assert benchmark.variant_settings("lr_drop", str(benchmark.PRESET), None, images=4, steps=3, common=TINY)[-1] == \
        "lr_drop_epochs=[1]"
    # twice the preset's rates (5e-4 in the D-FINE shapes recipe) with an EMA of the weights
    assert benchmark.variant_settings("lr_double_ema", str(benchmark.PRESET), None, images=4, steps=3)[-3:] == \
        ["lr=0.001", "lr_backbone=0.001", "ema_decay=0.99"]


def test_a_changed_recipe_trains_its_own_source_and_tune_keeps_the_cached_one(tmp_path, capsys) -> None:
    benchmark = load_script("benchmarks/finetune.py")
    preset = str(benchmark.PRESET)
    plain = benchmark.source_stem(preset, 5, [])
    assert plain == "source-dfine_shapes_cpu-5"
    changed = benchmark.source_stem(preset, 5, ["lr=1e-3"])
    assert changed.startswith(plain + "-") and changed != benchmark.source_stem(preset, 5, ["lr=2e-3"])
    assert benchmark.source_stem(preset, 5, ["a=1", "b=2"]) == benchmark.source_stem(preset, 5, ["b=2", "a=1"])
    # a key given twice sets its last value: the order of those two matters
    assert benchmark.source_stem(preset, 5, ["lr=1", "lr=2"]) == benchmark.source_stem(preset, 5, ["lr=2"]) != \
        benchmark.source_stem(preset, 5, ["lr=2", "lr=1"])
    # the cached source of the tiny recipe: --tune changes the fine-tune only, so no source is trained
    tiny_source(benchmark, tmp_path / f"{benchmark.source_stem(preset, 5, TINY)}.ckpt")
    argv = ["--source-steps", "5", *(f"--set={item}" for item in TINY), "--tune=seed=3", "--variants", "recipe",
            "--images", "4", "--steps", "1", "--eval-every-steps", "1", "--num-val", "2", "--threads", "1",
            "--cache-dir", str(tmp_path)]
    assert benchmark.main(argv) == 0
    assert re.search(r"^\| recipe \| 4 \| ", capsys.readouterr().out, re.MULTILINE)
    assert sorted(path.name for path in tmp_path.glob("source-*")) == [f"{benchmark.source_stem(preset, 5, TINY)}.ckpt"]
