"""The panoptic model: the authors' layout, parity with a literal per-query reference, the detector left as it
is, and loading the authors' panoptic files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from detr import load_checkpoint
from detr.categories import coco_panoptic_category_map
from detr.checkpoints import CheckpointError
from detr.models.segmentation import AttentionMap, DETRPanoptic, build_detr_panoptic
from tests.helpers import tiny_config_with
from tests.reference_detr import ReferenceDETR
from tests.reference_segmentation import ReferencePanoptic

LAYOUT = json.loads((Path(__file__).resolve().parents[1] / "data" / "official_detr_state_dict_layout.json").read_text())

# hidden_dim 128 is the smallest the mask head's GroupNorm(8) allows (hidden / 16 channels at stride 4).
TINY = tiny_config_with(hidden_dim=128, num_heads=8, num_queries=6, dropout=0.0)

# The heads of the authors' R50 panoptic model (hidden 256, 8 heads), written out from their definition.
R50_HEADS = {
    "bbox_attention.q_linear.weight": [256, 256], "bbox_attention.q_linear.bias": [256],
    "bbox_attention.k_linear.weight": [256, 256], "bbox_attention.k_linear.bias": [256],
    "mask_head.lay1.weight": [264, 264, 3, 3], "mask_head.lay1.bias": [264],
    "mask_head.gn1.weight": [264], "mask_head.gn1.bias": [264],
    "mask_head.lay2.weight": [128, 264, 3, 3], "mask_head.lay2.bias": [128],
    "mask_head.gn2.weight": [128], "mask_head.gn2.bias": [128],
    "mask_head.lay3.weight": [64, 128, 3, 3], "mask_head.lay3.bias": [64],
    "mask_head.gn3.weight": [64], "mask_head.gn3.bias": [64],
    "mask_head.lay4.weight": [32, 64, 3, 3], "mask_head.lay4.bias": [32],
    "mask_head.gn4.weight": [32], "mask_head.gn4.bias": [32],
    "mask_head.lay5.weight": [16, 32, 3, 3], "mask_head.lay5.bias": [16],
    "mask_head.gn5.weight": [16], "mask_head.gn5.bias": [16],
    "mask_head.out_lay.weight": [1, 16, 3, 3], "mask_head.out_lay.bias": [1],
    "mask_head.adapter1.weight": [128, 1024, 1, 1], "mask_head.adapter1.bias": [128],
    "mask_head.adapter2.weight": [64, 512, 1, 1], "mask_head.adapter2.bias": [64],
    "mask_head.adapter3.weight": [32, 256, 1, 1], "mask_head.adapter3.bias": [32],
}


def authors_panoptic_layout() -> dict[str, list[int]]:
    """Every key and shape of detr-r50-panoptic-00ce5173.pth: the R50 detector under ``detr.`` with 251
    class logits (250 classes + no object), and the two heads."""
    layout = {f"detr.{key}": list(shape) for key, shape in LAYOUT["resnet50"].items()}
    layout["detr.class_embed.weight"], layout["detr.class_embed.bias"] = [251, 256], [251]
    return {**layout, **R50_HEADS}


def random_state_dict(layout: dict[str, list[int]], seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    state = {key: torch.randn(shape, generator=generator) * 0.02 for key, shape in layout.items()}
    for key in state:
        if key.endswith("running_var"):
            state[key] = state[key].abs() + 1.0
    return state


@pytest.fixture
def tiny_panoptic():
    torch.manual_seed(0)
    model = build_detr_panoptic(TINY).eval()
    with torch.no_grad():  # non-trivial GroupNorm affine and frozen BN statistics
        for name, tensor in model.named_parameters():
            if ".gn" in name:
                tensor.uniform_(0.5, 1.5) if name.endswith("weight") else tensor.normal_(0, 0.1)
        for name, buffer in model.named_buffers():
            if name.endswith("running_var"):
                buffer.uniform_(0.5, 2.0)
    return model


def test_r50_layout_is_the_authors_panoptic_layout():
    model = build_detr_panoptic()
    assert {key: list(value.shape) for key, value in model.state_dict().items()} == authors_panoptic_layout()


def test_outputs_match_literal_reference(tiny_panoptic, padded_batch):
    """Same weights in a per-head, per-query literal implementation → same boxes, logits and masks."""
    reference = ReferencePanoptic(ReferenceDETR(tiny_panoptic.detr.backbone[0].body, 512, 128, 8, 1, 2, 64, 6, 5),
                                  [256, 128, 64], 128, 8).eval()
    reference.load_state_dict(tiny_panoptic.state_dict())
    images, mask = padded_batch
    with torch.no_grad():
        ours, ref = tiny_panoptic(images, mask), reference(images, mask)
    assert ours.masks.shape == (2, 6, 24, 32)  # stride 4 of the padded 96 × 128 batch
    # float32 rounding only: the reference runs the backbone in NCHW, ours its frozen stages in NHWC on the CPU
    for ours_value, key in ((ours.logits, "pred_logits"), (ours.boxes, "pred_boxes"), (ours.masks, "pred_masks")):
        torch.testing.assert_close(ours_value, ref[key], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("return_attention", [False, True])
def test_detector_outputs_are_the_detectors_own(tiny_panoptic, padded_batch, return_attention):
    with torch.no_grad():
        panoptic = tiny_panoptic(*padded_batch, return_attention=return_attention)
        detector = tiny_panoptic.detr(*padded_batch, return_attention=return_attention)
        fast = tiny_panoptic(*padded_batch)
    assert panoptic.masks is not None and detector.masks is None
    assert (panoptic.attention is None) == (detector.attention is None) == (not return_attention)
    torch.testing.assert_close(panoptic.logits, detector.logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(panoptic.boxes, detector.boxes, rtol=0, atol=1e-6)
    if return_attention:
        torch.testing.assert_close(panoptic.attention.decoder, detector.attention.decoder, rtol=0, atol=1e-6)
        torch.testing.assert_close(panoptic.attention.encoder, detector.attention.encoder, rtol=0, atol=1e-6)
    assert len(panoptic.aux) == len(detector.aux) == 1
    torch.testing.assert_close(panoptic.masks, fast.masks, rtol=0, atol=1e-5)


def test_attention_map_sums_to_one_over_heads_and_positions_and_skips_padding():
    torch.manual_seed(0)
    attention = AttentionMap(16, 16, 4)
    mask = torch.zeros(2, 3, 5, dtype=torch.bool)
    mask[1, 2:], mask[1, :, 4:] = True, True
    weights = attention(torch.randn(2, 7, 16), torch.randn(2, 16, 3, 5), mask)
    assert weights.shape == (2, 7, 4, 3, 5)
    torch.testing.assert_close(weights.sum(dim=(2, 3, 4)), torch.ones(2, 7))
    assert weights[1][..., mask[1]].abs().max() == 0


def test_masks_follow_a_query_permutation(tiny_panoptic, padded_batch):
    with torch.no_grad():
        out = tiny_panoptic(*padded_batch)
        permutation = torch.tensor([3, 0, 5, 1, 4, 2])
        tiny_panoptic.detr.query_embed.weight.copy_(tiny_panoptic.detr.query_embed.weight[permutation])
        permuted = tiny_panoptic(*padded_batch)
    torch.testing.assert_close(permuted.masks, out.masks[:, permutation], rtol=1e-5, atol=1e-5)


def test_frozen_detector_trains_only_the_mask_head(padded_batch):
    torch.manual_seed(0)
    model = build_detr_panoptic(TINY, freeze_detr=True)
    assert not any(p.requires_grad for p in model.detr.parameters())
    model(*padded_batch).masks.sum().backward()
    heads = [p for name, p in model.named_parameters() if not name.startswith("detr.")]
    assert heads and all(p.grad is not None and p.grad.abs().sum() > 0 for p in heads)


def test_unsupported_detectors_are_refused():
    with pytest.raises(ValueError, match="multiple of 128"):
        build_detr_panoptic(TINY.replace(hidden_dim=64))
    # the anchor-query detector is accepted (tests/models/test_panoptic_anchor.py)


@pytest.mark.parametrize("file_name, dilation", [("detr-r50-panoptic-00ce5173.pth", False),
                                                 ("detr-r50-dc5-panoptic-da08f1b1.pth", True)])
def test_authors_panoptic_release_file_loads(tmp_path, file_name, dilation):
    state = random_state_dict(authors_panoptic_layout())
    path = tmp_path / file_name
    torch.save({"model": state, "args": {"masks": True}, "epoch": 24}, path)
    model = load_checkpoint(path)
    assert isinstance(model, DETRPanoptic) and not model.training
    assert model.config.dilation is dilation and model.config.backbone == "resnet50"
    assert model.num_classes == 250 and model.num_queries == 100
    loaded = model.state_dict()
    assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], v) for k, v in state.items())
    assert model.meta.category_map == coco_panoptic_category_map()
    assert model.meta.category_map.names[1] == "person" and model.meta.category_map.names[200] == "rug-merged"
    is_thing = model.meta.is_thing
    assert is_thing[1] and is_thing[90] and not is_thing[92] and not is_thing[200]
    with torch.no_grad():
        out = model(torch.zeros(1, 3, 64, 64), torch.zeros(1, 64, 64, dtype=torch.bool))
    assert out.logits.shape == (1, 100, 251) and out.masks.shape == (1, 100, 16, 16)


def test_plain_panoptic_state_dict_loads_and_reproduces_outputs(tmp_path, tiny_panoptic, padded_batch):
    path = tmp_path / "my-panoptic.pth"
    torch.save(tiny_panoptic.state_dict(), path)
    model = load_checkpoint(path, num_heads=8)
    assert model.meta.category_map is None and model.meta.is_thing is None  # 5 classes: not COCO panoptic
    with torch.no_grad():
        expected, got = tiny_panoptic(*padded_batch), model(*padded_batch)
    for key in ("logits", "boxes", "masks"):
        torch.testing.assert_close(getattr(got, key), getattr(expected, key), rtol=0, atol=0)


def test_incomplete_panoptic_file_names_the_missing_keys(tmp_path, tiny_panoptic):
    state = tiny_panoptic.state_dict()
    del state["mask_head.adapter3.bias"]
    path = tmp_path / "broken.pth"
    torch.save({"model": state}, path)
    with pytest.raises(CheckpointError, match="mask_head.adapter3.bias"):
        load_checkpoint(path)


def test_coco_panoptic_things_are_the_ids_up_to_90():
    from detr.categories import COCO_PANOPTIC_CATEGORIES, coco_panoptic_is_thing

    is_thing = coco_panoptic_is_thing()
    assert len(COCO_PANOPTIC_CATEGORIES) == 133 and sum(t for _, _, t in COCO_PANOPTIC_CATEGORIES) == 80
    assert all(is_thing[cid] == thing for cid, _, thing in COCO_PANOPTIC_CATEGORIES)


def test_released_panoptic_name_loads_the_panoptic_model(tmp_path, monkeypatch):
    """load_checkpoint("detr-r50-dc5-panoptic") (the released file, here a random one in its layout)."""
    from detr.checkpoints import released as pretrained

    path = tmp_path / "detr-r50-dc5-panoptic-da08f1b1.pth"
    torch.save({"model": random_state_dict(authors_panoptic_layout())}, path)
    monkeypatch.setattr(pretrained, "download", lambda model, progress=True: path)
    model = load_checkpoint("detr-r50-dc5-panoptic")
    assert isinstance(model, DETRPanoptic) and model.config.dilation is True
    assert model.meta.category_map == coco_panoptic_category_map() and model.meta.is_thing[1]
