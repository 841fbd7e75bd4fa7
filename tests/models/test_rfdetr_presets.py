"""RF-DETR's and LW-DETR's presets: one per released size, from the one table (detr/models/rfdetr/presets.py) that
the checkpoint readers read too. Models are built on the meta device (shapes only, no memory, no time): their
parameter counts are the published ones, and a released file's layout (the weights' shapes, and for LW-DETR the
config.json transformers' conversion writes) reads back as the preset's config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import detr
from detr.checkpoints import rfdetr as rfdetr_checkpoints
from detr.checkpoints.key_map import KeyMap
from detr.checkpoints.rfdetr import LWDETR_KEYS, RFDETR_KEYS, read_huggingface_rfdetr
from detr.checkpoints.rfdetr_package import read_rfdetr_package_file
from detr.models.family import family_named, preset_config
from detr.models.rfdetr.presets import RELEASES, release_of_package_name

#: The released package files whose weights are the authors' detection or segmentation keys (the keypoint model's
#: file, with its head's keys and schema buffer: tests/checkpoints/test_rfdetr_package_keypoints.py).
PACKAGE_RELEASES = [name for name, release in RELEASES.items()
                    if release.package_file and not release.config.num_keypoints_per_class]


def _meta_model(name: str):
    with torch.device("meta"):
        return detr.build(name)


def _their_meta_weights(keys: KeyMap, model) -> dict[str, torch.Tensor]:
    """The model's weights in ``keys``' on-disk names, still on the meta device (KeyMap.to_theirs copies data)."""
    theirs = {}
    for key, value in model.state_dict().items():
        split = keys._split_keys(key)  # a q, k, v in_proj: three on disk
        parts = zip(split, value.chunk(3)) if split else [(keys.their_key(key), value)]
        theirs.update(parts)
    return theirs


def test_every_release_is_a_preset_of_the_family():
    assert list(family_named("rfdetr").presets) == list(RELEASES)
    assert preset_config("rfdetr_base") == RELEASES["rfdetr_base"].config == type(RELEASES["rfdetr_base"].config)()
    assert release_of_package_name("RFDETRSeg2XLarge") is RELEASES["rfdetr_seg_2xlarge"]
    assert release_of_package_name("RF-DETR-Nano") is RELEASES["rfdetr_nano"]
    assert release_of_package_name("rf-detr-large") is None  # the deprecated two-level Large: not a release here


@pytest.mark.parametrize(("name", "millions"), [
    # the rfdetr package's README (1.8.0's METADATA: "Params (M)"), every Group DETR group counted
    ("rfdetr_nano", 30.5), ("rfdetr_small", 32.1), ("rfdetr_medium", 33.7), ("rfdetr_large", 33.9),
    ("rfdetr_seg_nano", 33.6), ("rfdetr_seg_small", 33.7), ("rfdetr_seg_medium", 35.7), ("rfdetr_seg_xlarge", 38.1),
    ("rfdetr_seg_2xlarge", 38.6),
    # Atten4Vis/LW-DETR's README, "Main Results"
    ("lwdetr_tiny", 12.1), ("lwdetr_small", 14.6), ("lwdetr_medium", 28.2), ("lwdetr_large", 46.8),
    ("lwdetr_xlarge", 118.0),
])
def test_the_presets_have_the_published_parameter_counts(name, millions):
    """Seg Large is left out: the README says 36.2 M, the package's own RFDETRSegLargeConfig (5 layers, 200
    queries, a 42 × 42 position table at 504 px) builds 35.9 M here (Seg Medium, but a 36 × 36 table: 35.7)."""
    count = sum(parameter.numel() for parameter in _meta_model(name).parameters())
    assert round(count / 1e6, 1) == millions


@pytest.mark.parametrize("name", PACKAGE_RELEASES)
def test_a_released_package_file_reads_as_its_preset(name):
    """A file named as the release (``rf-detr-nano.pth``) with the release's weights and no settings: the reader
    infers the preset's config (weights + the same table's settings) and the release's eval square."""
    release = RELEASES[name]
    weights = _their_meta_weights(RFDETR_KEYS, _meta_model(name))
    contents = read_rfdetr_package_file({"model": weights}, Path(f"{release.package_file}.pth"))
    assert contents.config == release.config
    assert contents.meta.eval_size == (release.resolution, release.resolution)


#: config.json of AnnaZhang/lwdetr_*_60e_coco as transformers' conversion script (convert_lw_detr_to_hf.py:
#: BACKBONE_CONFIGS and MODEL_CONFIGS) writes it: the ViT's sizes, windows and stages, the decoder.
_LW_VIT = {"image_size": 1024, "num_attention_heads": 12, "model_type": "lw_detr_vit"}
_LW_SMALL_DECODER = {"projector_scale_factors": [1.0], "num_queries": 300, "decoder_layers": 3,
                     "decoder_self_attention_heads": 8, "decoder_cross_attention_heads": 16, "decoder_n_points": 2,
                     "d_model": 256, "dropout": 0.0}
_LW_LARGE_DECODER = {**_LW_SMALL_DECODER, "projector_scale_factors": [2.0, 0.5], "decoder_self_attention_heads": 12,
                     "decoder_cross_attention_heads": 24, "decoder_n_points": 4, "d_model": 384}
_LW_BLOCKS = {"num_hidden_layers": 10, "window_block_indices": [0, 1, 3, 6, 7, 9], "out_indices": [3, 5, 6, 10]}
LW_HUB_CONFIGS = {
    "lwdetr_tiny": ({**_LW_VIT, "hidden_size": 192, "num_hidden_layers": 6, "window_block_indices": [0, 2, 4],
                     "out_indices": [2, 4, 6]}, {**_LW_SMALL_DECODER, "num_queries": 100}),
    "lwdetr_small": ({**_LW_VIT, **_LW_BLOCKS, "hidden_size": 192}, _LW_SMALL_DECODER),
    "lwdetr_medium": ({**_LW_VIT, **_LW_BLOCKS, "hidden_size": 384}, _LW_SMALL_DECODER),
    "lwdetr_large": ({**_LW_VIT, **_LW_BLOCKS, "hidden_size": 384}, _LW_LARGE_DECODER),
    "lwdetr_xlarge": ({**_LW_VIT, **_LW_BLOCKS, "hidden_size": 768}, _LW_LARGE_DECODER),
}


@pytest.mark.parametrize("name", list(LW_HUB_CONFIGS))
def test_a_released_lwdetr_directory_reads_as_its_preset(name, tmp_path, monkeypatch):
    """transformers' lw_detr directory of the release (its config.json, the preset's weights' shapes) reads as the
    preset's config."""
    assert name in RELEASES
    vit, decoder = LW_HUB_CONFIGS[name]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "lw_detr", "backbone_config": vit, **decoder,
                                                      "id2label": {str(i): f"c{i}" for i in range(91)}}))
    weights = _their_meta_weights(LWDETR_KEYS, _meta_model(name))
    monkeypatch.setattr(rfdetr_checkpoints, "read_weights", lambda directory: weights)
    assert read_huggingface_rfdetr(tmp_path).config == RELEASES[name].config
