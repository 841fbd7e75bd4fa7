"""A toy model family declared from tests/, with no change under detr/: the proof that a family is a folder.

What a new family adds (docs/layout.md's checklist, which tests/test_toy_family.py runs through):
1. a config class: a frozen subclass of :class:`detr.models.config.ModelConfig` with its own options only, naming
   its family (``family = "toy"``);
2. a builder: config → a :class:`detr.models.detector.Detector` (here the paper's DETR parts at a toy size);
3. presets: names → functions returning configs;
4. one record, ``FAMILY = register_family(Family(...))``, registered when its module is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from detr.models.backbone import Backbone, Joiner
from detr.models.config import ClassHead, ModelConfig
from detr.models.detr import DETR
from detr.models.family import Family, register_family
from detr.models.recipe import DETR_RECIPE
from detr.models.layers.position_encoding import PositionEmbeddingSine
from detr.models.transformer import Transformer


@dataclass(frozen=True)
class ToyConfig(ModelConfig):
    """A one-layer DETR on a ResNet-18 cut at layer3.

    Attributes:
        encoder_layers: transformer encoder layers (1).
    """

    family: ClassVar[str] = "toy"
    backbones: ClassVar[tuple[str, ...]] = ("resnet18",)

    num_classes: int = 5
    hidden_dim: int = 32
    num_heads: int = 2
    num_queries: int = 10
    num_decoder_layers: int = 1
    dim_feedforward: int = 64
    dropout: float = 0.0
    class_head: ClassHead = "sigmoid"
    backbone: str = "resnet18"
    encoder_layers: int = 1


def build_toy(config: ToyConfig) -> DETR:
    """DETR's parts at the config's size."""
    backbone = Joiner(Backbone(config.backbone, norm="batch_norm", trainable_layers=5, last_stage="layer3"),
                      PositionEmbeddingSine(config.hidden_dim // 2))
    transformer = Transformer(config.hidden_dim, config.num_heads, config.encoder_layers, config.num_decoder_layers,
                              config.dim_feedforward, config.dropout, False)
    return DETR(backbone, transformer, num_classes=config.num_classes, num_queries=config.num_queries,
                aux_loss=config.aux_loss, class_head=config.class_head)


def toy_tiny() -> ToyConfig:
    """The toy family's one size."""
    return ToyConfig()


FAMILY = register_family(Family(name="toy", title="Toy DETR", config_class=ToyConfig, builder=build_toy,
                                presets={"toy_tiny": toy_tiny}, recipe=DETR_RECIPE))
