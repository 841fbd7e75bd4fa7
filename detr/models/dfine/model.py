"""D-FINE (Peng et al., "D-FINE: Redefine Regression Task of DETRs as Fine-grained Distribution Refinement",
ICLR 2025). In training, the outputs also hold the edge distributions its losses read
(:attr:`DetectorOutput.distributions`, :mod:`detr.loss.distribution`) and its denoising queries' (RT-DETR's).

The detector is RT-DETR's (:class:`detr.models.rtdetr.model.RTDETR`: backbone → hybrid encoder → decoder, the
same input contract and top-k post-processing) with D-FINE's three parts: the HGNetV2 backbone
(:mod:`detr.models.dfine.hgnetv2`), the encoder's GELAN fusion blocks (:mod:`detr.models.dfine.encoder`) and the
distribution-refinement decoder (:mod:`detr.models.dfine.decoder`). DEIM (Huang et al. 2025) trains the same
network otherwise, so its released D-FINE models load here too. DEIMv2 (:mod:`detr.models.deimv2`) is this class
with DEIMv2's encoder and decoder layers (docs/models/dfine.md).

State-dict keys are the authors' (Peterande/D-FINE): ``backbone.*`` (``HGNetv2``), ``encoder.*``
(``HybridEncoder``), ``decoder.*`` (``DFINETransformer``).
"""

from __future__ import annotations

import torch

from detr.models.dfine.decoder import DFineDecoder
from detr.models.dfine.dinov3 import DINOv3Backbone
from detr.models.dfine.encoder import LiteEncoder
from detr.models.dfine.hgnetv2 import HGNetV2
from detr.models.family import family_of
from detr.models.rtdetr.hybrid_encoder import HybridEncoder
from detr.models.rtdetr.model import RTDETR

#: The coarsest backbone map's stride.
_COARSEST_STRIDE = 32


class DFINE(RTDETR):
    """D-FINE: images [B, 3, H, W] (pixels / 255; H and W multiples of 32) → :class:`DetectorOutput` (each
    layer's logits include its localisation-quality term; boxes are the refined distributions' boxes).

    Args:
        backbone: the :class:`HGNetV2` (DEIMv2 S-X: the :class:`DINOv3Backbone`). encoder: the hybrid encoder of
            :func:`detr.models.dfine.encoder.dfine_hybrid_encoder` (DEIMv2: ``deimv2_hybrid_encoder`` or the
            :class:`~detr.models.dfine.encoder.LiteEncoder`). decoder: the :class:`DFineDecoder`.
        num_classes, aux_loss: as :class:`RTDETR`.
    """


    def __init__(self, backbone: HGNetV2 | DINOv3Backbone, encoder: HybridEncoder | LiteEncoder, decoder: DFineDecoder, *, num_classes: int,
                 aux_loss: bool = True) -> None:
        super().__init__(backbone, encoder, decoder, num_classes=num_classes, aux_loss=aux_loss)  # type: ignore[arg-type]

    @property
    def stride(self) -> int:
        """The finest level's stride: 8 with three levels, 16 with two (D-FINE N)."""
        return _COARSEST_STRIDE // 2 ** (self.decoder.num_levels - 1)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """None: HGNetV2 runs in the model's dtype (it has no bfloat16 autocast path yet)."""
        return None

    def use_autocast(self, dtype: torch.dtype | None = torch.bfloat16) -> None:
        if dtype is not None:
            raise ValueError("backbone_bf16: D-FINE's HGNetV2 has no bfloat16 autocast path yet; set "
                             "--model.runtime.backbone_bf16 false (or train with --trainer.precision bf16-mixed)")

    def optimize_for_inference(self, *, fold_batch_norm: bool = True, channels_last: bool = True) -> DFINE:
        """:meth:`RTDETR.optimize_for_inference`, with HGNetV2's BatchNorms folded too."""
        super().optimize_for_inference(fold_batch_norm=fold_batch_norm, channels_last=channels_last)
        if fold_batch_norm:
            self.backbone.fold_batch_norms()
        return self

    def describe(self) -> str:
        config = self.config
        if config is None:
            return ""
        encoder = ", lite encoder" if isinstance(self.encoder, LiteEncoder) else ""
        return (f"{family_of(config).title}, {config.backbone}{encoder}, {self.num_decoder_layers} decoder layers, "
                f"{config.num_feature_levels} levels × {list(config.points_per_level)} points, "
                f"{config.decoder.max_num_bins} + 1 bins, "
                f"{config.hidden_dim} hidden, {config.num_classes} classes")
