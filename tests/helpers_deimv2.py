"""Shared by the DEIMv2 tests: tiny transformers DEIMv2 models on HGNetV2 (real sizes, a small encoder and decoder)
with random weights (hf_model imports transformers: call it from tests that skip without it)."""

from __future__ import annotations

import torch

from tests.helpers import randomise
from tests.helpers_dfine import HGNETV2, TINY


def hf_model(backbone: str = "hgnetv2_b0", num_labels: int = 80, *, levels: int = 2, learnable_affine: bool = True,
             seed: int = 0, **options):
    """A transformers ``Deimv2ForObjectDetection`` with random weights everywhere (transformers' init starts every
    query at the same box), the weighting function's constants and the points scale kept as transformers sets
    them. ``options`` are Deimv2Config fields (``encoder_type="lite"``, ``use_gateway=False``, ...)."""
    import transformers

    stages = HGNETV2[backbone]
    hgnet = transformers.HGNetV2Config(**stages, stage_downsample=[False, True, True, True],
                                       stage_light_block=[False, False, True, True], stage_kernel_size=[3, 3, 5, 5],
                                       use_learnable_affine_block=learnable_affine,
                                       out_indices=list(range(5 - levels, 5)), depths=stages["stage_num_blocks"],
                                       hidden_sizes=stages["stage_out_channels"])
    settings = {**TINY, "decoder_in_channels": [64] * levels, "num_feature_levels": levels,
                "feat_strides": [8, 16, 32][-levels:], "encode_proj_layers": [levels - 1],
                "encoder_in_channels": stages["stage_out_channels"][-levels:], **options}
    config = transformers.Deimv2Config(backbone_config=hgnet, num_labels=num_labels,
                                       id2label={i: f"thing {i}" for i in range(num_labels)}, **settings)
    torch.manual_seed(seed)
    model = transformers.Deimv2ForObjectDetection(config).eval()
    randomise(model, seed)
    with torch.no_grad():
        model.model.decoder.up.fill_(config.up)
        model.model.decoder.reg_scale.fill_(config.reg_scale)
        for layer in model.model.decoder.layers:
            counts = layer.encoder_attn.num_points_list
            layer.encoder_attn.num_points_scale.copy_(torch.tensor([1 / n for n in counts for _ in range(n)]))
        for name, parameter in model.named_parameters():
            if name.endswith("lab.scale"):  # keep the affine blocks near the identity, so signals survive
                parameter.add_(1.0)
    return model


def hf_dinov3_model(num_labels: int = 80, *, seed: int = 0, gated_mlp: bool = False, **options):
    """A transformers DEIMv2 S-X-like model: a tiny DINOv3 ViT (32 wide, 4 layers, 2 heads, 4 register tokens,
    layers 1, 2 and 3 out) with the spatial tuning adapter (8), the fusion blocks without their trailing 3×3,
    random weights everywhere."""
    import transformers

    vit = transformers.DINOv3ViTConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                                       intermediate_size=64, num_register_tokens=4, out_indices=[1, 2, 3],
                                       use_gated_mlp=gated_mlp, hidden_act="silu" if gated_mlp else "gelu")
    settings = {**TINY, "decoder_in_channels": [64] * 3, "encoder_in_channels": [64] * 3,
                "encoder_has_trailing_conv": False, "spatial_tuning_adapter_inplanes": 8,
                "decoder_n_points": [3, 6, 3], **options}
    config = transformers.Deimv2Config(backbone_config=vit, num_labels=num_labels,
                                       id2label={i: f"thing {i}" for i in range(num_labels)}, **settings)
    torch.manual_seed(seed)
    model = transformers.Deimv2ForObjectDetection(config).eval()
    rope = model.model.conv_encoder.backbone.rope_embeddings.inv_freq.clone()  # a constant, not a weight
    randomise(model, seed)
    with torch.no_grad():
        model.model.conv_encoder.backbone.rope_embeddings.inv_freq.copy_(rope)
        model.model.decoder.up.fill_(config.up)
        model.model.decoder.reg_scale.fill_(config.reg_scale)
        for layer in model.model.decoder.layers:
            counts = layer.encoder_attn.num_points_list
            layer.encoder_attn.num_points_scale.copy_(torch.tensor([1 / n for n in counts for _ in range(n)]))
    return model
