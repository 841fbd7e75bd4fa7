"""transformers' Swin Transformer as Grounding DINO's image backbone (the released models' Swin-T and Swin-B), in
the interface of :class:`detr.models.backbone.Backbone` that the family reads: ``forward_with_stages`` with
stages named as the ResNet's (layer2, layer3, layer4 = Swin's stage2, stage3, stage4), ``stride``, ``channels``.

transformers is this family's optional dependency, imported here only when such a backbone is built.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import torch
from torch import nn

from detr.models.backbone import downsample_mask

#: transformers' Swin stages → the ResNet stage names the family reads (strides 8, 16, 32).
_STAGES = {"stage2": "layer2", "stage3": "layer3", "stage4": "layer4"}


def _backbone_config(backbone_config: Mapping[str, Any]) -> Any:
    try:
        from transformers import AutoConfig
    except ImportError as error:
        raise ImportError("a Swin backbone is transformers' Swin Transformer: pip install transformers") from error
    fields = {key: value for key, value in backbone_config.items() if key not in ("architectures",
                                                                                  "transformers_version")}
    return AutoConfig.for_model(**fields)


def transformers_backbone_class(backbone_config: Mapping[str, Any]) -> type[nn.Module]:
    """The transformers backbone class of a backbone config dict (``model_type`` "swin": ``SwinBackbone``)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_BACKBONE_MAPPING

    return MODEL_FOR_BACKBONE_MAPPING[type(_backbone_config(backbone_config))]


def build_transformers_backbone(backbone_config: Mapping[str, Any]) -> nn.Module:
    """The transformers backbone a config dict describes (``model_type`` "swin"), random weights."""
    config = _backbone_config(backbone_config)
    return transformers_backbone_class(backbone_config)(config)


class SwinStages(nn.Module):
    """A transformers backbone whose ``out_features`` are stage2–stage4, as ``body`` (its own parameter names)."""

    stride = 32

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        stages = list(body.out_features)
        if stages != list(_STAGES):
            raise ValueError(f"the Swin backbone must put out stage2, stage3 and stage4 (out_features), got {stages}")
        self.body = body
        self.channels: list[int] = list(body.channels)
        self.num_channels = self.channels[-1]

    def forward_with_stages(self, images: torch.Tensor, padding_mask: torch.Tensor, keep_stages: Collection[str] = ()
                            ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """images [B, 3, H, W], padding_mask bool [B, H, W] → the last stage's features [B, C, h, w], its mask
        (nearest-resized) and the stages named in ``keep_stages`` ("layer2", "layer3")."""
        maps = self.body(images).feature_maps
        named = dict(zip(_STAGES.values(), maps))
        last = named["layer4"]
        return last, downsample_mask(padding_mask, last.shape[-2:]), {k: named[k] for k in keep_stages}

    def optimize_for_inference(self, **_: Any) -> None:
        """Nothing to fold (layer norms, no batch norms)."""
