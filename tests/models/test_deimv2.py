"""DEIMv2's parts on D-FINE's: the decoder layers' RMSNorm and SwiGLU (and no gate), the summed RepNCSPELAN5
fusion, the lite encoder (two maps at the backbone's strides, its unused coarse branch skipped), batched =
per-image, optimize_for_inference (HGNetV2 and DINOv3 backbones), the DINOv3 backbone's rotary positions and
strides, and the config's checks."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from detr import build_detr
from detr.models.deimv2.config import DEIMv2Config
from detr.models.dfine.config import DFINEConfig, DistributionDecoder
from detr.models.rtdetr.config import RTDETRConfig
from detr.models.dfine.decoder import RMSNorm, SwiGLU
from detr.models.dfine.encoder import LiteEncoder, RepNCSPELAN5
from tests.helpers import randomise

TINY_DEIMV2 = DEIMv2Config(class_head="sigmoid", backbone="hgnetv2_b0", hidden_dim=32, num_heads=4,
                           dim_feedforward=48, num_decoder_layers=3, num_queries=20, num_classes=5, dropout=0.0,
                           num_feature_levels=2, num_points=3, csp_expansion=0.5, csp_depth_multiplier=0.34,
                           backbone_learnable_affine=True, num_encoder_layers=6, backbone_norm='frozen_batch_norm',
                           denoising=False, decoder=DistributionDecoder(max_num_bins=8, num_points_per_level=None))
LITE = {"lite_encoder": True, "num_encoder_layers": 0, "decoder_gateway": False, "decoder": {"activation": "silu"}}
DINOV3 = {"backbone": "dinov3_vit", "num_feature_levels": 3, "num_points": 2,
          "vit": {"width": 32, "depth": 3, "heads": 2, "mlp_dim": 48, "register_tokens": 2, "out_layers": (1, 2, 3)},
          "adapter_channels": 4, "csp_trailing_conv": False, "backbone_learnable_affine": False}


def _model(**changes) -> nn.Module:
    """Random weights everywhere (the authors' init starts every query at the same box), W's constants kept."""
    torch.manual_seed(0)
    model = build_detr(TINY_DEIMV2.replace(**changes)).eval()
    constants = {name: buffer.clone() for name, buffer in model.named_buffers() if name.startswith("decoder.decoder.")}
    randomise(model, 0)
    model.load_state_dict(constants, strict=False)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("lab.scale"):  # keep the affine blocks near the identity, so signals survive
                parameter.add_(1.0)
    return model


def _images(batch: int = 2, side: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.rand(batch, 3, side, side), torch.zeros(batch, side, side, dtype=torch.bool)


@pytest.mark.parametrize("changes", [{}, LITE], ids=["hybrid", "lite"])
def test_the_decoder_layers_are_deimv2s(changes):
    model = _model(**changes)
    for layer in model.decoder.decoder.layers:
        norms = [module for module in layer.modules() if isinstance(module, (nn.LayerNorm, nn.RMSNorm))]
        assert norms and all(isinstance(norm, nn.RMSNorm) for norm in norms)
        assert isinstance(layer.ffn, SwiGLU) and not hasattr(layer, "linear1")
        assert (layer.gateway is not None) == (not changes) and hasattr(layer, "norm2") == bool(changes)
    assert len(model.decoder.query_pos_head.layers) == 3
    fusions = [module for module in model.encoder.modules() if isinstance(module, RepNCSPELAN5)]
    assert len(fusions) == 2 and isinstance(model.encoder, LiteEncoder) == bool(changes)


def test_the_rms_norm_runs_fused_in_float32_under_bf16_autocast():
    """bf16-mixed hands the RMSNorm bfloat16 inputs beside its float32 scale; torch's fused kernel refused the mix
    (a warning and a slower path). It computes in the scale's dtype: float32 under autocast."""
    torch.manual_seed(0)
    norm = RMSNorm(16, eps=1e-6)
    nn.init.normal_(norm.weight)
    x = torch.randn(3, 5, 16)
    assert torch.equal(norm(x), nn.functional.rms_norm(x, (16,), norm.weight, 1e-6))  # float32: nn.RMSNorm's
    half = x.bfloat16()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = norm(half)
    expected = half.float() * torch.rsqrt(half.float().pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    assert out.dtype == torch.float32 and torch.allclose(out, expected, atol=1e-5)


@pytest.mark.parametrize("changes", [{}, LITE], ids=["hybrid", "lite"])
def test_batched_equals_per_image_and_the_contract_holds(changes):
    model = _model(**changes)
    images, mask = _images()
    with torch.no_grad():
        batched = model(images, mask, return_attention=True)
        single = [model(images[i:i + 1], mask[i:i + 1]) for i in range(2)]
    assert batched.logits.shape == (2, 20, 5) and len(batched.aux) == 2
    for index, output in enumerate(single):
        assert torch.allclose(batched.logits[index], output.logits[0], atol=1e-5)
        assert torch.allclose(batched.boxes[index], output.boxes[0], atol=1e-5)
    assert batched.boxes[0].std(dim=0).max() > 1e-3
    assert model.stride == 16 and batched.sampling.spatial_shapes.tolist() == [[4, 4], [2, 2]]
    assert model.input_spec.resize == "square" and "DEIMv2" in model.describe()


def test_the_lite_encoders_coarse_branch_changes_nothing():
    """transformers computes a stride-64 map (``down_conv1``, ``bi_fusion_conv``) that no output reads: its weights
    are kept for loading and saving, and changing them changes no prediction."""
    model = _model(**LITE)
    images, mask = _images(1)
    with torch.no_grad():
        before = model(images, mask)
        for parameter in [*model.encoder.down_conv1.parameters(), *model.encoder.bi_fusion_conv.parameters()]:
            parameter.normal_()
        after = model(images, mask)
        model.encoder.down_conv2.conv.weight.add_(0.5)
        changed = model(images, mask)
    assert before.boxes[0].std(dim=0).max() > 1e-3 and torch.equal(before.logits, after.logits) and torch.equal(before.boxes, after.boxes)
    assert not torch.allclose(before.logits, changed.logits)


@pytest.mark.parametrize("changes", [{}, LITE, DINOV3], ids=["hybrid", "lite", "dinov3"])
def test_optimize_for_inference_keeps_the_outputs(changes):
    model = _model(**changes)
    images, mask = _images(1)
    with torch.no_grad():
        before = model(images, mask)
        model.optimize_for_inference()
        after = model(images, mask)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in [*model.encoder.modules(), *model.backbone.modules()])
    assert torch.allclose(before.logits, after.logits, atol=1e-4) and torch.allclose(before.boxes, after.boxes, atol=1e-4)


@pytest.mark.parametrize("changes, message", [
    ({"lite_encoder": True}, "num_encoder_layers=0"),
    ({**LITE, "num_feature_levels": 3}, "num_feature_levels=2"),
    ({"decoder": {"activation": "gelu"}}, "activation"),
    ({"decoder": {"mlp_activation": "silu"}}, "D-FINE's \\(DEIM's\\) option"),
    ({"backbone": "resnet50"}, "not one of deimv2's: hgnetv2_b0"),
    ({"vit": {"width": 64, "heads": 8}}, "backbone='dinov3_vit'"),
    ({**DINOV3, "num_feature_levels": 2}, "num_feature_levels=3"),
    ({**DINOV3, "vit": {**DINOV3["vit"], "out_layers": (1, 2)}}, "three out_layers"),
])
def test_the_config_refuses_what_deimv2_cannot_build(changes, message):
    with pytest.raises(ValueError, match=message):
        TINY_DEIMV2.replace(**changes)


def test_deimv2_options_are_deimv2_s_config_s_only():
    with pytest.raises(ValueError, match="unknown model option.*decoder_gateway"):
        DFINEConfig.from_dict({"decoder_gateway": False})
    with pytest.raises(ValueError, match="unknown model option.*lite_encoder"):
        RTDETRConfig.from_dict({"lite_encoder": True})


def test_the_dinov3_backbone_gives_strides_8_16_32_and_rotary_positions():
    """Three maps of ViT + adapter channels at strides 8, 16, 32; the rotary angles are 0 for no patch (the
    centres are symmetric about 0: opposite patches get opposite angles) and a patch's query is a rotation (its
    norm kept)."""
    from detr.models.dfine.dinov3 import rope_angles

    model = _model(**DINOV3)
    with torch.no_grad():
        maps = model.backbone(torch.rand(1, 3, 64, 96))
    assert [tuple(m.shape[1:]) for m in maps] == [(40, 8, 12), (48, 4, 6), (48, 2, 3)]
    assert model.backbone.out_channels == [40, 48, 48] and model.stride == 8
    angles = rope_angles(4, 6, 16, 100.0)  # [24, 16]
    assert angles.shape == (24, 16) and torch.allclose(angles, -angles.flip(0), atol=1e-6)
    query = torch.randn(24, 16)
    first, second = query.chunk(2, dim=-1)
    rotated = query * angles.cos() + torch.cat([-second, first], -1) * angles.sin()
    pairs = rotated.unflatten(-1, (2, 8)).pow(2).sum(1)  # each (i, i + 8) pair rotates as one 2-D vector
    assert torch.allclose(pairs, query.unflatten(-1, (2, 8)).pow(2).sum(1), atol=1e-5)
