"""Shared by the DEIMv2 tests: tiny transformers DEIMv2 models on HGNetV2 (real sizes, a small encoder and decoder)
with random weights (hf_model imports transformers: call it from tests that skip without it)."""

from __future__ import annotations

import torch

from tests.helpers import randomise
from tests.helpers_dfine import TINY, hf_hgnetv2_model, keep_decoder_constants


def hf_model(backbone: str = "hgnetv2_b0", num_labels: int = 80, *, levels: int = 2, learnable_affine: bool = True,
             seed: int = 0, **options):
    """A transformers ``Deimv2ForObjectDetection`` with random weights everywhere (transformers' init starts every
    query at the same box), the weighting function's constants and the points scale kept as transformers sets
    them. ``options`` are Deimv2Config fields (``encoder_type="lite"``, ``use_gateway=False``, ...)."""
    import transformers

    return hf_hgnetv2_model(transformers.Deimv2Config, transformers.Deimv2ForObjectDetection, backbone, num_labels,
                            levels=levels, learnable_affine=learnable_affine, seed=seed, **options)


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
    keep_decoder_constants(model)
    return model
