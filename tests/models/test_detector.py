"""The paper's DETR and the anchor-query AnchorDETR: one builder, one config, one decode contract."""

from __future__ import annotations

import pytest
import torch

from detr import DetrConfig, build_detr
from detr.models import DETR, AnchorDETR
from tests.helpers import tiny_config_with
from tests.helpers_families import FAMILIES, batch, forward, tiny

TINY = tiny_config_with(num_queries=6, num_classes=4, dropout=0.0)
TARGETS = [{"labels": torch.tensor([1, 3]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.3], [0.3, 0.6, 0.1, 0.1]])},
           {"labels": torch.tensor([2]), "boxes": torch.tensor([[0.4, 0.4, 0.5, 0.5]])}]


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(2, 64, 96, dtype=torch.bool)
    mask[1, 48:] = True
    return images, mask


def test_the_paper_model_has_no_anchor_parts():
    model = build_detr(TINY)
    assert type(model) is DETR and model.query_type == "learned"
    for name in ("refpoint_embed", "denoising", "query_groups"):
        assert not hasattr(model, name)
    assert not any(key.startswith(("refpoint_embed.", "denoising.")) for key in model.state_dict())
    for attribute in ("num_classes", "num_queries", "aux_loss", "class_head", "config", "meta", "stride"):
        assert hasattr(model, attribute)


def test_anchor_queries_build_the_anchor_model():
    model = build_detr(TINY, query_type="anchor", denoising=True, query_groups=2)
    assert type(model) is AnchorDETR and model.query_type == "anchor" and model.stride == 32
    assert model.refpoint_embed.weight.shape == (12, 4) and model.denoising is not None
    assert "query_embed.weight" not in model.state_dict()
    assert {"transformer.encoder.layers.0.linear1.weight", "transformer.decoder.norm.weight"} <= set(model.state_dict())


@pytest.mark.parametrize("options", [{}, {"query_type": "anchor", "denoising": True, "class_head": "sigmoid"}])
def test_config_round_trip_rebuilds_the_same_model(options):
    torch.manual_seed(0)
    model = build_detr(TINY, **options)
    assert isinstance(model.config, DetrConfig)
    config = DetrConfig.from_dict(model.config.to_dict())
    assert config == model.config
    torch.manual_seed(0)
    rebuilt = build_detr(config)
    assert type(rebuilt) is type(model)
    state, rebuilt_state = model.state_dict(), rebuilt.state_dict()
    assert list(state) == list(rebuilt_state)
    assert all(torch.equal(state[key], rebuilt_state[key]) for key in state)  # same seed, same weights


def test_builder_options_replace_the_configs():
    config = TINY
    model = build_detr(config, num_queries=3)
    assert model.config == config.replace(num_queries=3) and model.num_queries == 3
    with pytest.raises(ValueError, match="num_querys"):
        build_detr(num_querys=3)
    with pytest.raises(ValueError, match="query_type='anchor'"):
        build_detr(config, denoising=True)


@pytest.mark.parametrize("options", [{}, {"query_type": "anchor", "denoising": True, "query_groups": 2,
                                          "dense_aux_head": True}])
@pytest.mark.parametrize("training", [False, True])
def test_decode_is_forward_plus_hidden_and_memory(options, training):
    torch.manual_seed(0)
    model = build_detr(TINY, **options).train(training)
    images, mask = _batch()
    torch.manual_seed(1)
    out = model(images, mask, return_attention=True, targets=TARGETS)
    features, feature_mask, pos = model.backbone(images, mask)
    torch.manual_seed(1)
    decoded = model.decode(model.input_proj(features), feature_mask, pos, TARGETS, return_attention=True)
    torch.testing.assert_close(decoded.output.boxes, out.boxes)
    torch.testing.assert_close(decoded.output.attention.decoder, out.attention.decoder)
    assert (decoded.output.denoising is None) == (out.denoising is None)
    batch, hidden_dim, (height, width) = 2, TINY.hidden_dim, feature_mask.shape[-2:]
    assert decoded.hidden.shape == (batch, TINY.num_queries, hidden_dim)
    assert decoded.memory.shape == (batch, height * width, hidden_dim)
    # hidden is what the heads read: group 1's matching queries (no denoising queries, no other groups)
    logits = model.class_embed(decoded.hidden)
    torch.testing.assert_close(logits, decoded.output.logits[:, :TINY.num_queries])


def test_both_detectors_share_one_skeleton():
    """The backbone, heads, checks and forward are the skeleton's; a detector adds only its query source."""
    from detr.models import SingleScaleDetector

    for cls in (DETR, AnchorDETR):
        assert issubclass(cls, SingleScaleDetector)
        for name in ("forward", "embed", "decode", "optimize_for_inference"):
            assert getattr(cls, name) is getattr(SingleScaleDetector, name)
    images, mask = _batch()
    for options in ({}, {"query_type": "anchor"}):
        with pytest.raises(ValueError, match="padding_mask"):
            build_detr(TINY, **options)(images, mask[0])


def test_backbone_stages_are_the_forward_pass_kept_along_the_way():
    model = build_detr(TINY).eval()
    images, mask = _batch()
    body = model.backbone[0]
    features, feature_mask = body(images, mask)
    with_stages, stage_mask, stages = body.forward_with_stages(images, mask, ("layer1", "layer3"))
    assert torch.equal(features, with_stages) and torch.equal(feature_mask, stage_mask)
    assert list(stages) == ["layer1", "layer3"] and stages["layer1"].shape[-2:] == (16, 24)


def test_every_model_and_backend_meets_one_contract(tmp_path):
    """The paper's DETR, the anchor detector, Deformable DETR and the panoptic model are Detectors, and say
    through the contract what callers used to learn from their class."""
    from detr.models import Detector, build_detr_panoptic

    deformable = build_detr(tiny_config_with(architecture="deformable", class_head="sigmoid", num_points=2))
    models = {"detr": build_detr(TINY), "anchor": build_detr(TINY, query_type="anchor"), "deformable": deformable,
              "panoptic": build_detr_panoptic(TINY.replace(hidden_dim=128, num_heads=8))}
    for name, model in models.items():
        assert isinstance(model, Detector), name
    assert models["detr"].min_image_size == models["detr"].stride + 1
    assert [models[name].attention_kind for name in models] == ["maps", "maps", "points", "maps"]
    assert [models[name].predicts_masks for name in models] == [False, False, False, True]
    assert [models[name].exportable for name in models] == [True, True, True, False]
    assert models["panoptic"].box_detector is models["panoptic"].detr and models["detr"].box_detector is models["detr"]
    assert deformable.min_image_size == deformable.backbone[0].stride * 2 + 1  # the fourth level halves layer4's map
    assert deformable.describe().startswith("Deformable DETR, 4 levels × 2 points, resnet18")
    assert models["panoptic"].describe() == models["panoptic"].detr.describe() + ", mask head"


@pytest.mark.parametrize("family", ("detr", *FAMILIES))
def test_an_enclosing_autocast_reaches_every_layer_of_every_family(family):
    """bf16-mixed training and the Predictor's bf16 run the model inside one ``torch.autocast``: no part of a model
    may turn it off for itself (RF-DETR's ViT did, with a disabled context of its own when it had no dtype, so its
    products ran in float32 under bf16-mixed while the rest ran in bfloat16)."""
    if family == "detr":
        model, (images, mask) = build_detr(TINY).eval(), _batch()
    else:
        model, (images, mask) = tiny(family), batch(family)
    dtypes = {}

    def record(name):
        def hook(module, inputs, output) -> None:
            dtypes.setdefault(name, output.dtype)
        return hook

    hooks = [module.register_forward_hook(record(name)) for name, module in model.named_modules()
             if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d))]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        forward(model, family, images, mask)
    for hook in hooks:
        hook.remove()
    assert dtypes and {name for name, dtype in dtypes.items() if dtype != torch.bfloat16} == set()
