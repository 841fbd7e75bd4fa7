"""The Grounding DINO family's own config: a frozen record of every size and option the model reads.

Defaults are Grounding DINO-T's (Liu et al., "Grounding DINO", ECCV 2024; transformers' ``GroundingDinoConfig``):
256 channels, 900 queries, 4 levels, 6 + 6 layers, a BERT text encoder of at most 256 tokens.
MM-Grounding-DINO (Zhao et al. 2024; LLMDet loads as it) differs in its contrastive class head only:
``contrastive_head="scaled_bias"``.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from detr.models.config import ClassHead, ModelConfig

#: How a query's logit for a text token is made from their features (q · t):
#: "dot" (Grounding DINO's) or "scaled_bias" (MM-Grounding-DINO's: q · t / √C + a learned bias per head).
ContrastiveHead = Literal["dot", "scaled_bias"]
#: The image backbones: torchvision's ResNets (this project's :class:`detr.models.backbone.Backbone`), or "swin":
#: transformers' Swin Transformer (the released models'; :mod:`detr.models.grounding.swin`).
GroundingBackbone = Literal["resnet18", "resnet34", "resnet50", "resnet101", "swin"]


@dataclass(frozen=True)
class GroundingConfig(ModelConfig):
    """Every option of a Grounding DINO model. Besides :class:`detr.models.config.ModelConfig`'s fields (of the
    decoder: ``num_heads``, ``num_decoder_layers``, ``dim_feedforward``):

    Attributes:
        num_classes: the logits' columns, one per prompt token: the longest prompt in tokens (transformers'
            ``max_text_len``, 256; longer prompts are cut to it).
        num_queries: the decoder's queries Q (900).
        class_head: "sigmoid": a score per prompt token.
        backbone: resnet18–resnet101 (torchvision's) or "swin" (transformers' Swin Transformer, the released
            models'; its config in ``backbone_config``).
        text_config: the BERT text encoder's ``transformers.BertConfig`` as a dict (``to_dict()``; empty:
            bert-base-uncased's); its features are projected from its ``hidden_size`` to ``hidden_dim``.
        backbone_config: with ``backbone="swin"``, the ``transformers.SwinConfig`` as a dict (its ``out_features``
            stage2–stage4 feed the levels).
        num_feature_levels: the image levels L (4: three backbone stages and one stride-2 level more).
        encoder_layers: feature-enhancer layers (6).
        encoder_ffn_dim: the enhancer's deformable layers' feed-forward width; half of it is the text layers' and
            the image-text fusion's.
        encoder_heads: the enhancer's deformable self-attention heads; half as many for its text self-attention
            and fusion (as transformers' ``GroundingDinoConfig`` sets them).
        encoder_points: the enhancer's sampling points per head and level (4).
        decoder_points: the decoder's sampling points per head and level (4).
        position_temperature: the sine position encodings' temperature (20).
        layer_norm_eps: every LayerNorm's epsilon.
        fusion_drop_path: drop-path rate of the image-text fusion's outputs in training.
        contrastive_head: "dot" (Grounding DINO's query · token logits) or "scaled_bias" (MM-Grounding-DINO's:
            q · t / √C + a learned bias).
        share_box_heads: one box MLP for every decoder layer (both released families).
        share_class_heads: one contrastive head (its bias) for every decoder layer.
    """

    family: ClassVar[str] = "grounding"
    backbones: ClassVar[tuple[str, ...]] = typing.get_args(GroundingBackbone)

    num_classes: int = 256
    num_queries: int = 900
    class_head: ClassHead = "sigmoid"
    backbone: GroundingBackbone = "resnet50"
    text_config: Mapping[str, Any] = field(default_factory=dict)
    backbone_config: Mapping[str, Any] = field(default_factory=dict)
    num_feature_levels: int = 4
    encoder_layers: int = 6
    encoder_ffn_dim: int = 2048
    encoder_heads: int = 8
    encoder_points: int = 4
    decoder_points: int = 4
    position_temperature: float = 20.0
    layer_norm_eps: float = 1e-5
    fusion_drop_path: float = 0.1
    contrastive_head: ContrastiveHead = "dot"
    share_box_heads: bool = True
    share_class_heads: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.class_head != "sigmoid":
            raise ValueError(f"Grounding DINO scores each prompt token with a sigmoid: set class_head='sigmoid', got "
                             f"{self.class_head!r}")
        if self.contrastive_head not in ("dot", "scaled_bias"):
            raise ValueError(f"contrastive_head must be 'dot' or 'scaled_bias', got {self.contrastive_head!r}")
        if self.hidden_dim % 32:
            raise ValueError(f"hidden_dim {self.hidden_dim} must divide by 32 (the input projections' GroupNorm)")
        if self.hidden_dim % self.encoder_heads:
            raise ValueError(f"hidden_dim {self.hidden_dim} must divide by encoder_heads {self.encoder_heads}")
        if self.encoder_heads % 2 or (self.encoder_ffn_dim // 2) % (self.encoder_heads // 2):
            raise ValueError(f"encoder_heads {self.encoder_heads} must be even and encoder_ffn_dim / 2 "
                             f"({self.encoder_ffn_dim // 2}) must divide by half of it (the fusion's heads)")
