"""The Grounding DINO family's own config: a frozen record of every size and option the model reads.

Defaults are Grounding DINO-T's (Liu et al., "Grounding DINO", ECCV 2024; transformers' ``GroundingDinoConfig``):
256 channels, 900 queries, 4 levels, 6 + 6 layers, a BERT text encoder of at most 256 tokens.
MM-Grounding-DINO (Zhao et al. 2024; LLMDet loads as it) differs in its contrastive class head only:
``contrastive_head="scaled_bias"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

#: How a query's logit for a text token is made from their features (q · t):
#: "dot" (Grounding DINO's) or "scaled_bias" (MM-Grounding-DINO's: q · t / √C + a learned bias per head).
ContrastiveHead = Literal["dot", "scaled_bias"]
#: The image backbones: torchvision's ResNets (this project's :class:`detr.models.backbone.Backbone`), or "swin":
#: transformers' Swin Transformer (the released models'; :mod:`detr.models.grounding.swin`).
GroundingBackbone = Literal["resnet18", "resnet34", "resnet50", "resnet101", "swin"]


@dataclass(frozen=True)
class GroundingConfig:
    """Every option of a Grounding DINO model.

    Sizes: ``hidden_dim`` C, ``num_queries`` Q, ``num_feature_levels`` L, ``max_text_len`` (the contrastive
    logits' last size; longer prompts are cut to it). The feature enhancer's layers have ``encoder_heads`` heads
    for the deformable self-attention and half as many for the text self-attention and the image-text fusion,
    whose width is ``encoder_ffn_dim / 2`` (as transformers' ``GroundingDinoConfig`` sets them).

    text_config: the BERT text encoder's ``transformers.BertConfig`` as a dict (``to_dict()``); the text features
    are projected from its ``hidden_size`` to C. backbone_config: with ``backbone="swin"``, the
    ``transformers.SwinConfig`` as a dict (its ``out_features`` stage2–stage4 feed the levels).
    share_box_heads: one box MLP for every decoder layer (both released families); share_class_heads: one
    contrastive head (its bias) for every layer (MM-Grounding-DINO).
    """

    backbone: GroundingBackbone = "resnet50"
    text_config: Mapping[str, Any] = field(default_factory=dict)
    backbone_config: Mapping[str, Any] = field(default_factory=dict)
    hidden_dim: int = 256
    num_queries: int = 900
    num_feature_levels: int = 4
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    encoder_heads: int = 8
    decoder_heads: int = 8
    encoder_points: int = 4
    decoder_points: int = 4
    max_text_len: int = 256
    position_temperature: float = 20.0
    layer_norm_eps: float = 1e-5
    dropout: float = 0.1
    fusion_drop_path: float = 0.1
    contrastive_head: ContrastiveHead = "dot"
    share_box_heads: bool = True
    share_class_heads: bool = True

    def __post_init__(self) -> None:
        if self.contrastive_head not in ("dot", "scaled_bias"):
            raise ValueError(f"contrastive_head must be 'dot' or 'scaled_bias', got {self.contrastive_head!r}")
        if self.hidden_dim % 32:
            raise ValueError(f"hidden_dim {self.hidden_dim} must divide by 32 (the input projections' GroupNorm)")
        for name, heads in (("encoder_heads", self.encoder_heads), ("decoder_heads", self.decoder_heads)):
            if self.hidden_dim % heads:
                raise ValueError(f"hidden_dim {self.hidden_dim} must divide by {name} {heads}")
        if self.encoder_heads % 2 or (self.encoder_ffn_dim // 2) % (self.encoder_heads // 2):
            raise ValueError(f"encoder_heads {self.encoder_heads} must be even and encoder_ffn_dim / 2 "
                             f"({self.encoder_ffn_dim // 2}) must divide by half of it (the fusion's heads)")

    @property
    def num_classes(self) -> int:
        """The logits' last size: one column per prompt token (``max_text_len``), what the detector contract
        calls its classes."""
        return self.max_text_len

    @property
    def class_head(self) -> str:
        """How the logits are read: "sigmoid" (a score per prompt token)."""
        return "sigmoid"
