"""The paper's DETR family: :class:`DetrConfig`, its builder (the paper's :class:`DETR` for learned queries,
:class:`AnchorDETR` for anchor queries) and its presets.

The options after ``backbone_last_stage`` train from scratch on a short budget (docs/measurements/convergence.md):
they select :class:`detr.models.anchor.model.AnchorDETR` (``query_type="anchor"``) and the training-only heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from detr.models.anchor.decoder import AnchorDecoder, AnchorTransformer
from detr.models.anchor.denoising import DenoisingQueries
from detr.models.anchor.model import AnchorDETR
from detr.models.backbone import Joiner, backbone_from_config
from detr.models.config import BackboneNorm, LastStage, ModelConfig, QueryType, check_choice
from detr.models.dense_head import DenseAuxiliaryHead
from detr.models.detr import DETR
from detr.models.family import Family, register_family
from detr.models.recipe import DETR_RECIPE
from detr.models.layers.position_encoding import PositionEmbeddingLearned, PositionEmbeddingSine
from detr.models.transformer import Transformer, TransformerEncoder, TransformerEncoderLayer

PositionEncoding = Literal["sine", "learned"]
ResNetName = Literal["resnet18", "resnet34", "resnet50", "resnet101"]
RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101")


@dataclass(frozen=True)
class DetrConfig(ModelConfig):
    """The paper's DETR (Carion et al., 2020) and its anchor-query variant; defaults are the paper's COCO model
    (R50, 6 + 6 layers, 100 queries, 91 classes, learned queries, a softmax class head). Besides
    :class:`ModelConfig`'s fields:

    Attributes:
        backbone: ResNet depth of the backbone: resnet18, resnet34, resnet50 (paper) or resnet101.
        dilation: DC5: layer4 dilated instead of strided (stride 16 instead of 32; ResNet-50/101 only).
        position_encoding: "sine" (paper) or "learned" (a 50 × 50 table) spatial position encoding.
        num_encoder_layers: transformer encoder layers (paper: 6).
        pre_norm: LayerNorm before each sub-layer instead of after it (paper: False, post-norm).
        backbone_norm: "frozen_batch_norm" (paper, with pretrained weights), "batch_norm" or "group_norm"
            (training from scratch).
        backbone_trainable_layers: ResNet stages that train, counted from the top (3 = layer2–4, paper;
            5 = all, from scratch; 0 = none).
        backbone_last_stage: "layer4" (stride 32), "layer3" (stride 16) or "layer2" (stride 8): cut the ResNet
            early, for small images.
        query_type: "learned" (paper: a learned embedding per query, :class:`detr.models.detr.DETR`) or
            "anchor" (DAB-DETR: a learned anchor box per query, conditional spatial cross-attention, box
            refinement in every layer, :class:`detr.models.anchor.model.AnchorDETR`); docs/measurements/convergence.md.
        denoising: DN-DETR's denoising queries in training (needs query_type="anchor"; the forward then
            needs ``targets``).
        denoising_groups: noised copies of every ground-truth box and label fed to the decoder (DN-DETR: 5).
        denoising_label_noise: probability that a denoising query's label is replaced by a random class
            (DN-DETR: 0.2).
        denoising_box_noise: box noise scale λ: centres move by up to λ · half the width and height, sides
            scale by a factor in [1 - λ, 1 + λ] (DN-DETR: 0.4).
        anchor_local_attention: > 0 starts every cross-attention head as a kernel centred on its query's
            anchor, with this scale (an initialisation only; query_type="anchor"); 0 keeps DAB-DETR's Xavier init.
        query_groups: Group DETR's one-to-many assignment in training: this many groups of queries, each
            matched on its own; inference decodes group 1 only. 1 = the paper's assignment (query_type="anchor").
        dense_aux_head: a training-only FCOS-like head on the encoder output, every cell inside a box
            positive for it (Co-DETR's collaborative auxiliary head); inference does not run it.
    """

    family: ClassVar[str] = "detr"
    backbones: ClassVar[tuple[str, ...]] = RESNETS

    backbone: ResNetName = "resnet50"
    dilation: bool = False
    position_encoding: PositionEncoding = "sine"
    num_encoder_layers: int = 6
    pre_norm: bool = False
    backbone_norm: BackboneNorm = "frozen_batch_norm"
    backbone_trainable_layers: int = 3
    backbone_last_stage: LastStage = "layer4"
    query_type: QueryType = "learned"
    denoising: bool = False
    denoising_groups: int = 5
    denoising_label_noise: float = 0.2
    denoising_box_noise: float = 0.4
    anchor_local_attention: float = 0.0
    query_groups: int = 1
    dense_aux_head: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("position_encoding", self.position_encoding, ("sine", "learned"))
        check_choice("query_type", self.query_type, ("learned", "anchor"))
        if self.query_groups < 1:
            raise ValueError(f"query_groups must be at least 1, got {self.query_groups}")
        if self.query_type != "anchor":
            anchor_only = {"denoising": (self.denoising, "denoising=True feeds noised boxes as anchors"),
                           "anchor_local_attention": (self.anchor_local_attention > 0,
                                                      "anchor_local_attention initialises the anchor decoder"),
                           "query_groups": (self.query_groups > 1,
                                            "query_groups > 1 (Group DETR) is built on the anchor decoder")}
            for used, why in anchor_only.values():
                if used:
                    raise ValueError(f"{why}: it needs query_type='anchor'")
        if self.pre_norm and self.query_type == "anchor":
            raise ValueError("query_type='anchor' has DAB-DETR's post-norm decoder: set pre_norm=False")
        if self.dilation and self.backbone in ("resnet18", "resnet34"):
            raise ValueError(f"dilation (DC5) needs bottleneck blocks: use resnet50 or resnet101, not {self.backbone}")


def build_single_scale_detr(config: DetrConfig) -> DETR | AnchorDETR:
    """The paper's family on one feature map: :class:`DETR` (learned queries) or :class:`AnchorDETR` (anchor
    queries), with the sine or learned position encoding."""
    body = backbone_from_config(config, config.backbone_last_stage)
    encoding = (PositionEmbeddingSine(config.hidden_dim // 2) if config.position_encoding == "sine"
                else PositionEmbeddingLearned(config.hidden_dim // 2))
    backbone = Joiner(body, encoding)
    return _build_detr(backbone, config) if config.query_type == "learned" else _build_anchor_detr(backbone, config)


def _build_detr(backbone: Joiner, config: DetrConfig) -> DETR:
    transformer = Transformer(config.hidden_dim, config.num_heads, config.num_encoder_layers, config.num_decoder_layers,
                              config.dim_feedforward, config.dropout, config.pre_norm)
    return DETR(backbone, transformer, num_classes=config.num_classes, num_queries=config.num_queries,
                aux_loss=config.aux_loss, class_head=config.class_head, dense_head=_dense_head(config))


def _build_anchor_detr(backbone: Joiner, config: DetrConfig) -> AnchorDETR:
    encoder_layer = TransformerEncoderLayer(config.hidden_dim, config.num_heads, config.dim_feedforward, config.dropout)
    encoder = TransformerEncoder(encoder_layer, config.num_encoder_layers, None)
    decoder = AnchorDecoder(config.hidden_dim, config.num_heads, config.num_decoder_layers, config.dim_feedforward,
                            config.dropout)
    transformer = AnchorTransformer(encoder, decoder)
    if config.anchor_local_attention > 0:
        transformer.decoder.init_local_spatial_attention(config.anchor_local_attention)
    denoising = (DenoisingQueries(config.num_classes, config.hidden_dim, num_groups=config.denoising_groups,
                                  label_noise=config.denoising_label_noise, box_noise=config.denoising_box_noise)
                 if config.denoising else None)
    return AnchorDETR(backbone, transformer, num_classes=config.num_classes, num_queries=config.num_queries,
                      aux_loss=config.aux_loss, class_head=config.class_head, denoising=denoising,
                      query_groups=config.query_groups, dense_head=_dense_head(config))


def _dense_head(config: DetrConfig) -> DenseAuxiliaryHead | None:
    return DenseAuxiliaryHead(config.hidden_dim, config.num_classes) if config.dense_aux_head else None


def detr_r50() -> DetrConfig:
    """The paper's R50 model (configs/detr_r50_coco.yaml)."""
    return DetrConfig(backbone="resnet50")


def detr_r50_dc5() -> DetrConfig:
    """R50 with a dilated layer4 (configs/detr_r50_dc5_coco.yaml)."""
    return DetrConfig(backbone="resnet50", dilation=True)


def detr_r101() -> DetrConfig:
    """R101 (configs/detr_r101_coco.yaml)."""
    return DetrConfig(backbone="resnet101")


def detr_r101_dc5() -> DetrConfig:
    """R101 with a dilated layer4 (configs/detr_r101_dc5_coco.yaml)."""
    return DetrConfig(backbone="resnet101", dilation=True)


FAMILY = register_family(Family(
    name="detr", title="DETR", config_class=DetrConfig, builder=build_single_scale_detr,
    presets={"detr_r50": detr_r50, "detr_r50_dc5": detr_r50_dc5, "detr_r101": detr_r101,
             "detr_r101_dc5": detr_r101_dc5},
    augmentation="default", recipe=DETR_RECIPE,
))
