"""Build a detector from its :class:`detr.models.config.DetrConfig`: the paper's :class:`DETR` for learned
queries, :class:`AnchorDETR` for anchor queries, :class:`DeformableDETR` for ``architecture="deformable"``, :class:`RTDETR` for
``architecture="rtdetr"``, :class:`DFINE` for ``architecture="dfine"`` and ``"deimv2"``, :class:`RFDETR` for
``architecture="rfdetr"``.

:data:`ARCHITECTURES` maps each ``architecture`` to its family's builder (config → detector): the one line a
new family adds here (its builder lives in its folder, as :func:`detr.models.deformable.build.build_deformable_detr`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from detr.models.anchor.decoder import AnchorDecoder, AnchorTransformer
from detr.models.anchor.denoising import DenoisingQueries
from detr.models.anchor.model import AnchorDETR
from detr.models.backbone import Joiner, backbone_from_config
from detr.models.config import ARCHITECTURE_DEFAULTS, DetrConfig
from detr.models.deformable.build import build_deformable_detr
from detr.models.deformable.recipe import RECIPE as DEFORMABLE_RECIPE
from detr.models.dense_head import DenseAuxiliaryHead
from detr.models.detector import Detector
from detr.models.detr import DETR
from detr.models.dfine.build import build_dfine
from detr.models.dfine.recipe import DEIMV2_RECIPE, RECIPE as DFINE_RECIPE
from detr.models.position_encoding import PositionEmbeddingLearned, PositionEmbeddingSine
from detr.models.recipe import DETR_RECIPE, Recipe
from detr.models.rfdetr.build import build_rfdetr
from detr.models.rfdetr.recipe import RECIPE as RFDETR_RECIPE, SEGMENTATION_RECIPE as RFDETR_SEGMENTATION_RECIPE
from detr.models.rtdetr.build import build_rtdetr
from detr.models.rtdetr.recipe import RECIPE as RTDETR_RECIPE
from detr.models.transformer import Transformer, TransformerEncoder, TransformerEncoderLayer


def build_detr(config: DetrConfig | None = None, /, **options: Any) -> Detector:
    """Build the detector ``config`` describes (default: the paper's COCO model, R50, 6 + 6 layers, 100
    queries, 91 classes); ``options`` are :class:`DetrConfig` fields that replace the config's
    (``build_detr(num_classes=3)``, ``build_detr(config, dropout=0.0)``). Without a config, the fields the options
    leave unset are the family's (:data:`detr.models.config.ARCHITECTURE_DEFAULTS`): ``build_detr(
    architecture="rtdetr")`` is RT-DETR R50vd. The model's ``config`` is the config it was built from. Invalid
    options raise ValueError (:class:`DetrConfig` checks them)."""
    if config is None:
        family = ARCHITECTURE_DEFAULTS.get(options.get("architecture", "detr"), {})
        config = DetrConfig.from_dict({**family, **options}, where="build_detr")
    elif options:
        config = config.replace(**options)
    model = ARCHITECTURES[config.architecture](config)
    model.config = config
    return model


def build_single_scale_detr(config: DetrConfig) -> DETR | AnchorDETR:
    """The paper's family on one feature map: :class:`DETR` (learned queries) or :class:`AnchorDETR` (anchor
    queries), with the sine or learned position encoding."""
    body = backbone_from_config(config)
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


#: ``DetrConfig.architecture`` → the family's builder.
ARCHITECTURES: dict[str, Callable[[DetrConfig], Detector]] = {
    "detr": build_single_scale_detr,
    "deformable": build_deformable_detr,
    "rtdetr": build_rtdetr,
    "dfine": build_dfine,
    "deimv2": build_dfine,
    "rfdetr": build_rfdetr,
}

#: Each ``architecture``'s training recipe (its authors'), beside its builder.
RECIPES: dict[str, Recipe] = {
    "detr": DETR_RECIPE,
    "deformable": DEFORMABLE_RECIPE,
    "rtdetr": RTDETR_RECIPE,
    "dfine": DFINE_RECIPE,
    "deimv2": DEIMV2_RECIPE,
    "rfdetr": RFDETR_RECIPE,
}


def recipe_for(config: DetrConfig) -> Recipe:
    """The authors' training recipe (:class:`detr.models.recipe.Recipe`) of the family that ``config`` describes;
    RF-DETR with instance masks: its segmentation recipe."""
    if config.architecture == "rfdetr" and config.instance_masks:
        return RFDETR_SEGMENTATION_RECIPE
    return RECIPES[config.architecture]
