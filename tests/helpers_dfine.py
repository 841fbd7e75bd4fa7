"""Shared by the D-FINE tests: tiny transformers D-FINE models (real HGNetV2 sizes, a small encoder and decoder)
with random weights (hf_model imports transformers: call it from tests that skip without it)."""

from __future__ import annotations

import torch

from tests.helpers import randomise

#: transformers' HGNetV2Config fields of the authors' B0 (D-FINE N and S) and B4 (D-FINE L) backbones.
HGNETV2 = {
    "hgnetv2_b0": {"stem_channels": [3, 16, 16], "stage_in_channels": [16, 64, 256, 512],
                   "stage_mid_channels": [16, 32, 64, 128], "stage_out_channels": [64, 256, 512, 1024],
                   "stage_num_blocks": [1, 1, 2, 1], "stage_numb_of_layers": [3, 3, 3, 3]},
    "hgnetv2_b4": {"stem_channels": [3, 32, 48], "stage_in_channels": [48, 128, 512, 1024],
                   "stage_mid_channels": [48, 96, 192, 384], "stage_out_channels": [128, 512, 1024, 2048],
                   "stage_num_blocks": [1, 1, 3, 1], "stage_numb_of_layers": [6, 6, 6, 6]},
}
#: A small encoder and decoder (widths 64, 4 heads, 3 decoder layers as D-FINE N and S have).
TINY = {"encoder_hidden_dim": 64, "d_model": 64, "encoder_ffn_dim": 96, "decoder_ffn_dim": 128,
        "decoder_layers": 3, "num_queries": 30, "encoder_attention_heads": 4, "decoder_attention_heads": 4}


def hf_model(backbone: str = "hgnetv2_b0", num_labels: int = 80, *, levels: int = 3, learnable_affine: bool = True,
             seed: int = 0, **options):
    """A transformers D-FINE with random weights everywhere (transformers' init starts every query at the same
    box), the weighting function's constants and the points scale kept as transformers sets them."""
    import transformers

    return hf_hgnetv2_model(transformers.DFineConfig, transformers.DFineForObjectDetection, backbone, num_labels,
                            levels=levels, learnable_affine=learnable_affine, seed=seed, **options)


def hf_hgnetv2_model(config_class, model_class, backbone: str, num_labels: int, *, levels: int,
                     learnable_affine: bool, seed: int, **options):
    """A transformers model of D-FINE's layout (``DFine*`` or ``Deimv2*``: ``config_class``, ``model_class``) on
    HGNetV2 ``backbone`` with the :data:`TINY` encoder and decoder, random weights everywhere (the decoder's
    constants as transformers sets them: :func:`keep_decoder_constants`) and its affine blocks near the identity."""
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
    config = config_class(backbone_config=hgnet, num_labels=num_labels,
                          id2label={i: f"thing {i}" for i in range(num_labels)}, **settings)
    torch.manual_seed(seed)
    model = model_class(config).eval()
    randomise(model, seed)
    keep_decoder_constants(model)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("lab.scale"):  # keep the affine blocks near the identity, so signals survive
                parameter.add_(1.0)
    return model


def keep_decoder_constants(model) -> None:
    """Put back what :func:`tests.helpers.randomise` overwrote of a transformers D-FINE-layout decoder's constants:
    the weighting function's ``up`` and ``reg_scale`` and each layer's points scale."""
    config, decoder = model.config, model.model.decoder
    with torch.no_grad():
        decoder.up.fill_(config.up)
        decoder.reg_scale.fill_(config.reg_scale)
        for layer in decoder.layers:
            counts = layer.encoder_attn.num_points_list
            layer.encoder_attn.num_points_scale.copy_(torch.tensor([1 / n for n in counts for _ in range(n)]))
