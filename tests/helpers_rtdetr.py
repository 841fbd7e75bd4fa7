"""Shared by the RT-DETR tests: tiny transformers RT-DETR / RT-DETRv2 models with random weights, and real
photos at a small square size (hf_model imports transformers: call it from tests that skip without it)."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from tests.helpers import REPO, randomise

#: A small decoder and encoder (widths 64, 4 heads) on the real ResNet-vd depths, 3 decoder layers as R18's.
TINY = {"encoder_hidden_dim": 64, "d_model": 64, "encoder_ffn_dim": 96, "decoder_ffn_dim": 128,
        "decoder_in_channels": [64] * 3, "decoder_layers": 3, "num_queries": 30, "encoder_attention_heads": 4,
        "decoder_attention_heads": 4}
BACKBONES = {"resnet18": ("basic", [2, 2, 2, 2], [64, 128, 256, 512]),
             "resnet50": ("bottleneck", [3, 4, 6, 3], [256, 512, 1024, 2048])}


def square_photos(side: int = 128) -> torch.Tensor:
    """chelsea and astronaut, resized to side × side (PIL bilinear) and scaled to [0, 1]: [2, 3, side, side]."""
    images = [np.asarray(Image.open(REPO / "data" / "photos" / name).convert("RGB").resize((side, side),
                                                                                            Image.BILINEAR))
              for name in ("chelsea.png", "astronaut.png")]
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255


def hf_model(backbone: str = "resnet18", num_labels: int = 80, *, version: int = 1, seed: int = 0, **options):
    """A transformers RT-DETR (version 1) or RT-DETRv2 (2) with random weights everywhere (transformers' init
    starts every query at the same box), RT-DETRv2's 1 / points buffer kept as it is."""
    import transformers

    layer_type, depths, widths = BACKBONES[backbone]
    resnet = transformers.RTDetrResNetConfig(layer_type=layer_type, depths=depths, hidden_sizes=widths,
                                             out_indices=[2, 3, 4])
    config_class, model_class = ((transformers.RTDetrConfig, transformers.RTDetrForObjectDetection) if version == 1
                                 else (transformers.RTDetrV2Config, transformers.RTDetrV2ForObjectDetection))
    config = config_class(backbone_config=resnet, encoder_in_channels=widths[1:], num_labels=num_labels,
                          id2label={i: f"thing {i}" for i in range(num_labels)}, **{**TINY, **options})
    torch.manual_seed(seed)
    model = model_class(config).eval()
    randomise(model, seed)
    if version == 2:
        with torch.no_grad():
            for layer in model.model.decoder.layers:
                layer.encoder_attn.n_points_scale.fill_(1.0 / config.decoder_n_points)
    return model
