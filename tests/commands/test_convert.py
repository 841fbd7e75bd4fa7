"""detr-convert (detr.commands.convert): every family's transformers directory keeps the model's record (category
ids, names, validated threshold), and the directory is written whole or not at all, replacing an earlier model's
only once the new one is complete."""

from __future__ import annotations

import dataclasses

import errno
from pathlib import Path

import pytest
import torch

from detr import Predictor, build_detr, load_checkpoint
from detr.models.deformable.config import DeformableConfig
from detr.categories import CategoryMap
from detr.checkpoints import save_checkpoint
from detr.commands.convert import main as convert
from detr.models.config import ModelMeta
from tests.helpers import TINY
from tests.helpers_realtime import CATEGORIES, CONFIGS, EVAL_SIZES, tiny_model

pytest.importorskip("safetensors")

PHOTO = Path(__file__).resolve().parents[2] / "data" / "photos" / "chelsea.png"
THRESHOLD = 0.95
#: The two families that tests/helpers_realtime.py does not build: DETR and Deformable DETR (the paper's sizes of
#: neither), LW-DETR (RF-DETR's tiny model with LW-DETR's ViT and batch-norm projectors at two levels).
CONFIGS = {
    "detr": TINY.replace(dropout=0.0),
    "deformable": DeformableConfig(class_head="sigmoid", backbone="resnet18", hidden_dim=32, num_heads=2,
                                   num_encoder_layers=1, num_decoder_layers=2, dim_feedforward=32, num_queries=10,
                                   num_points=2, num_classes=5, dropout=0.0),
    **CONFIGS,
    "lwdetr": CONFIGS["rfdetr"].replace(backbone="lwdetr_vit", projector_norm="batch_norm", instance_masks=False,
                                        num_feature_levels=2, projector_scales=(2.0, 0.5),
                                        vit=dataclasses.replace(CONFIGS["rfdetr"].vit, window_blocks=(0, 2),
                                                                out_indices=(2, 3))),
}


def family_checkpoint(family: str, folder: Path, category_map: CategoryMap = CATEGORIES) -> Path:
    """The family's tiny model with random weights, saved as this project's checkpoint with category ids that are
    not 0..K-1 and a validated threshold."""
    if family in ("rtdetr", "dfine", "deimv2", "rfdetr"):
        model = tiny_model(family, category_map=category_map)
    else:
        torch.manual_seed(0)
        model = build_detr(CONFIGS[family].replace(num_classes=category_map.num_classes)).eval()
    size = EVAL_SIZES.get(family, 112)
    model.meta = ModelMeta(category_map=category_map, eval_size=(size, size) if family not in ("detr", "deformable")
                           else (96, 160), score_threshold=THRESHOLD)
    return save_checkpoint(model, folder / f"{family}.ckpt")


@pytest.mark.parametrize("family", list(CONFIGS))
def test_every_family_keeps_its_category_ids_names_and_threshold(family, tmp_path):
    """T10: RF-DETR's and LW-DETR's writer wrote neither the data set's category ids nor the threshold: predictions
    through the directory gave ids 0..4 where the checkpoint gave 3, 7, 9, 11, 12, at 0.7 instead of 0.95."""
    checkpoint = family_checkpoint(family, tmp_path)
    out = tmp_path / "hf"
    assert convert([str(checkpoint), "--to-huggingface", str(out)]) == 0
    meta = load_checkpoint(out).meta
    assert meta.category_map == CATEGORIES and meta.score_threshold == THRESHOLD
    predictor = Predictor.from_checkpoint(out, device="cpu")
    assert predictor.threshold == THRESHOLD and predictor.category_map == CATEGORIES
    (prediction,) = predictor.predict(PHOTO, all_queries=True)
    assert set(prediction.label_names) <= set(CATEGORIES.names)


@pytest.fixture(scope="module")
def tiny_detr(tmp_path_factory) -> Path:
    return family_checkpoint("detr", tmp_path_factory.mktemp("convert"))


def test_an_earlier_model_is_replaced_whole_and_said_so(tiny_detr, tmp_path, capsys):
    """CV1: converting into a folder of another model kept its pytorch_model.bin beside the new files, silently."""
    out = tmp_path / "hf"
    out.mkdir()
    (out / "config.json").write_text('{"model_type": "detr"}')
    (out / "pytorch_model.bin").write_bytes(b"another model's weights")
    assert convert([str(tiny_detr), "--to-huggingface", str(out)]) == 0
    assert f"replaced the earlier model in {out}" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "preprocessor_config.json"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left
    load_checkpoint(out)


@pytest.mark.parametrize("case", ["other files", "a file", "the checkpoint itself"])
def test_an_output_that_is_not_a_model_directory_is_refused_before_loading(tiny_detr, tmp_path, capsys, case):
    """CV1: onto the checkpoint itself was a traceback; a folder of other files would be replaced as a whole."""
    if case == "other files":
        out = tmp_path / "photos"
        out.mkdir()
        (out / "holiday.jpg").write_bytes(b"keep me")
        source = tiny_detr
    elif case == "a file":
        out = tmp_path / "model.txt"
        out.write_text("keep me")
        source = tiny_detr
    else:
        source = out = tmp_path / "hf"
        assert convert([str(tiny_detr), "--to-huggingface", str(out)]) == 0
    before = {p: p.read_bytes() for p in ([out] if out.is_file() else out.iterdir())}
    with pytest.raises(SystemExit) as stop:
        convert([str(source), "--to-huggingface", str(out)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--to-huggingface" in err and "Traceback" not in err
    assert {p: p.read_bytes() for p in ([out] if out.is_file() else out.iterdir())} == before


def test_a_full_disk_leaves_the_earlier_directory_as_it_was(tiny_detr, tmp_path, monkeypatch, capsys):
    """CV2: a full disk during the weights replaced config.json but not the weights: a directory that loads
    nothing, the earlier model lost."""
    out = tmp_path / "hf"
    earlier = family_checkpoint("detr", tmp_path, CategoryMap((1, 2, 3, 4, 5), ("a", "b", "c", "d", "e")))
    assert convert([str(earlier), "--to-huggingface", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    import detr.checkpoints.huggingface as huggingface

    write = huggingface.write_atomically

    def full_disk(path, writer):
        write(path, lambda file: file.write(b"\0" * 1000))  # part of the weights reached the disk
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(huggingface, "write_atomically", full_disk)
    assert convert([str(tiny_detr), "--to-huggingface", str(out)]) == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and f"{out} is as it was" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert load_checkpoint(out).meta.category_map.names == ("a", "b", "c", "d", "e")
