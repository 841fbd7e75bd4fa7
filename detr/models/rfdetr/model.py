"""RF-DETR (Robinson et al., "RF-DETR: Neural Architecture Search for Real-Time Detection Transformers", 2025), on
LW-DETR's design (Chen et al., "LW-DETR: A Transformer Replacement to YOLO for Real-Time Detection", 2024).

Windowed DINOv2 ViT (:mod:`detr.models.rfdetr.vit`; LW-DETR's: :mod:`detr.models.rfdetr.lw_vit`) → C2f projectors, one
map per scale (:mod:`detr.models.rfdetr.projector`) → two-stage query selection and a deformable decoder (:mod:`detr.models.rfdetr.decoder`) → sigmoid class logits and
boxes per layer; with ``instance_masks``, per-query mask logits (:mod:`detr.models.rfdetr.segmentation`). The input
contract is the family's: a fixed square resize (sides multiples of patch × windows, e.g. 560), ImageNet mean and
std, no padding; post-processing keeps the top ``num_queries`` (query, class) pairs, as RT-DETR's.

Training (docs/models/rfdetr.md, "Train"): Group DETR's query groups in the decoder (:mod:`detr.models.rfdetr.decoder`),
the encoder proposals in the output for their loss, and the authors' optimizer groups through the detector contract:
the ViT's layer-wise learning-rate decay (:meth:`RFDETR.backbone_layer_depths`), its parameters without weight decay
and the decoder layers' rate (:meth:`RFDETR.decoder_parameters`).

Parameters: ``backbone.*`` (the ViT), ``projector.*``, ``decoder.*`` and ``mask_head.*`` (names close to
transformers', mapped by :mod:`detr.checkpoints.rfdetr`).
"""

from __future__ import annotations

import torch
from torch import nn

from detr.models.backbone import own_autocast
from detr.models.config import ClassHead
from detr.models.detector import Detector
from detr.models.inputs import InputSpec
from detr.models.outputs import DetectorOutput, LayerOutput, SamplingOutput, stack_layers
from detr.models.rfdetr.decoder import RFDETRDecoder
from detr.models.rfdetr.lw_vit import LwDetrViT
from detr.models.rfdetr.segmentation import MaskHead
from detr.models.rfdetr.vit import WindowedViT

#: The evaluation size when a model records none: RF-DETR base's 560 × 560 (a multiple of 14 × 4).
EVAL_SIZE = 560


class RFDETR(Detector):
    """RF-DETR: images [B, 3, H, W] (ImageNet-normalised; H and W multiples of patch × windows) →
    :class:`DetectorOutput` (masks too with a ``mask_head``).

    Args:
        backbone: the :class:`WindowedViT` (RF-DETR) or :class:`LwDetrViT` (LW-DETR). projector: a :class:`Projector`
            per feature level. decoder: the :class:`RFDETRDecoder`.
        mask_head: the :class:`MaskHead`, or None for boxes only.
        keypoint_projector: a keypoint model's second :class:`Projector` per feature level, whose maps only the
            keypoint head's cross-attention reads (the package's ``dual_projector``), or None.
        num_classes: sigmoid class logits (no "no object"). aux_loss: also return the earlier decoder layers.
    """

    class_head: ClassHead = "sigmoid"
    attention_kind = "points"
    exportable = True  # at its fixed square (docs/models/rfdetr.md, "Export")

    def __init__(self, backbone: WindowedViT | LwDetrViT, projector: nn.ModuleList, decoder: RFDETRDecoder,
                 mask_head: MaskHead | None = None, *, keypoint_projector: nn.ModuleList | None = None,
                 num_classes: int, aux_loss: bool = True) -> None:
        super().__init__()
        self.num_classes, self.num_queries, self.aux_loss = num_classes, decoder.num_queries, aux_loss
        self.backbone, self.projector, self.decoder, self.mask_head = backbone, projector, decoder, mask_head
        self.keypoint_projector = keypoint_projector
        self.predicts_masks = mask_head is not None
        if decoder.keypoint_head is not None:
            self.keypoint_schema = decoder.keypoint_head.schema
        self._autocast_dtype: torch.dtype | None = None

    @property
    def num_decoder_layers(self) -> int:
        return len(self.decoder.layers)

    @property
    def stride(self) -> int:
        """The finest level's stride: the patch size over its projector's scale."""
        return round(self.backbone.patch_size / max(projector.scale for projector in self.projector))

    @property
    def min_image_size(self) -> int:
        return self.backbone.multiple

    @property
    def size_multiple(self) -> int:
        """The ViT's patch size × windows per side."""
        return self.backbone.multiple

    @property
    def input_spec(self) -> InputSpec:
        """A ``meta.eval_size[0]``-pixel square (560 when unknown), ImageNet mean and std, pixels / 255 resized
        bilinearly as floats: the contract of transformers' ``RfDetrImageProcessor`` at a square size (LW-DETR's
        ``DeformableDetrImageProcessor`` resizes the uint8 image, antialiased, before rescaling)."""
        size = self.meta.eval_size[0] if self.meta.eval_size is not None else EVAL_SIZE
        lw = self.config is not None and self.config.backbone == "lwdetr_vit"
        return InputSpec(resize="square", size=size, max_size=None,
                         interpolation="antialiased" if lw else "float_bilinear")

    @property
    def detections_per_image(self) -> int:
        """The top ``num_queries`` (query, class) pairs, as transformers' post-processing."""
        return self.num_queries

    def describe(self) -> str:
        config = self.config
        if config is None:
            return ""
        masks = ", instance masks" if self.mask_head is not None else ""
        if self.decoder.keypoint_head is not None:
            masks += f", keypoints {list(self.decoder.keypoint_head.schema.counts)} per class"
        name = "LW-DETR" if config.backbone == "lwdetr_vit" else "RF-DETR"
        return (f"{name}, windowed ViT {config.vit.width} × {config.vit.depth} (patch "
                f"{config.vit.patch_size}, {config.vit.num_windows}² windows), {self.num_decoder_layers} decoder "
                f"layers, {config.hidden_dim} hidden, {config.num_classes} classes{masks}")

    def slow_modules(self) -> list[nn.Module]:
        return []

    def no_weight_decay_parameters(self) -> list[nn.Parameter]:
        """The ViT's biases, norms and embeddings (DINOv2's patch embedding, [CLS] and mask tokens and position
        table: the authors' ``get_dinov2_weight_decay_rate``; LW-DETR's position table and layer scale, its patch
        embedding's weight decaying: ``get_vit_weight_decay_rate``). Everything else decays, norms included."""
        lw = isinstance(self.backbone, LwDetrViT)
        embeddings = ("position_embeddings", "layer_scale") if lw else (
            "patch_embed.", "cls_token", "mask_token", "position_embeddings")
        return [parameter for name, parameter in self.backbone.named_parameters()
                if name.endswith("bias") or name.startswith("norm") or ".norm" in name
                or any(part in name for part in embeddings)]

    def backbone_layer_depths(self) -> dict[int, int]:
        """The ViT's layer-wise learning-rate decay, as the authors number it (RF-DETR's ``get_dinov2_lr_decay_rate``,
        LW-DETR's ``get_vit_lr_decay_rate``), with L the last stage read plus 1 (LW-DETR: the ViT's blocks): block i
        at depth L − i, the embeddings (patch, tokens, position table) at L + 1, the final norm at 0."""
        lw = isinstance(self.backbone, LwDetrViT)
        top = len(self.backbone.blocks) if lw else self.backbone.out_indices[-1] + 1
        depths = {}
        for name, parameter in self.backbone.named_parameters():
            if name.startswith("blocks."):
                depth = max(top - int(name.split(".")[1]), 0)  # blocks past the last stage read get no gradient
            elif name.startswith("norm"):
                depth = 0
            else:
                depth = top + 1
            depths[id(parameter)] = depth
        return depths

    def decoder_parameters(self) -> list[nn.Parameter]:
        """The decoder's layers, final norm and query-position MLP: the authors' ``transformer.decoder``, trained at
        ``lr`` × ``lr_component_decay`` (the heads, queries and encoder heads outside it at ``lr``)."""
        decoder, head = self.decoder, self.decoder.keypoint_head
        keypoint_parts = [*head.layers.parameters(), head.keypoint_pos_embed] if head is not None else []
        return [*decoder.layers.parameters(), *decoder.norm.parameters(), *decoder.ref_point_head.parameters(),
                *keypoint_parts]

    @property
    def coarsest_stride(self) -> int:
        """The coarsest projector level's stride: the patch size over the smallest projector scale."""
        return round(self.backbone.patch_size / min(projector.scale for projector in self.projector))

    def use_channels_last(self) -> None:
        """Nothing to change: the ViT's tokens have no NCHW layout (its one convolution, the patch embedding, reads
        the input as it comes)."""

    def use_folded_batch_norm(self, enabled: bool = True) -> None:
        """Nothing to fold in training: the ViT and the projector have no frozen BatchNorm."""

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return self._autocast_dtype

    def use_autocast(self, dtype: torch.dtype | None = torch.bfloat16) -> None:
        """Run the ViT under ``torch.autocast`` in ``dtype``, the projector and decoder getting float32 stages (None:
        no autocast of its own, so that an enclosing one, e.g. bf16-mixed, applies to the whole model)."""
        self._autocast_dtype = dtype

    def optimize_for_inference(self, *, fold_batch_norm: bool = True, channels_last: bool = True) -> RFDETR:
        """Eval mode; nothing to fold (the projector's norms are LayerNorms)."""
        return self.eval()

    def forward(self, images: torch.Tensor, padding_mask: torch.Tensor, return_attention: bool = False,
                targets: list[dict[str, torch.Tensor]] | None = None) -> DetectorOutput:
        """Raw predictions for a batch of same-size images (``padding_mask`` and ``targets`` are not read: the
        family resizes every image to one square, and its training needs no targets in the forward).

        Returns a :class:`DetectorOutput`: logits [B, Q, num_classes] (sigmoid scores), boxes [B, Q, 4] normalised
        cxcywh of the last decoder layer; aux (if aux_loss): the earlier layers; proposals: the selected encoder
        proposals; masks (with a mask head, in evaluation): logits [B, Q, H / 4, W / 4]; keypoints (a keypoint model):
        [B, Q, C_k · K_max, 8] for every layer and the proposals (:mod:`detr.models.layers.keypoint_head`); with
        return_attention, sampling. In training Q is ``query_groups`` × num_queries, group by group (Group DETR), and with a mask
        head every layer (the proposals too) carries its masks as ``mask_features`` instead of ``masks``.
        """
        if images.dim() != 4:
            raise ValueError(f"RF-DETR takes images [B, 3, H, W], got {tuple(images.shape)}")
        dtype = self._autocast_dtype
        with own_autocast(images.device.type, dtype):
            stages = self.backbone(images)
        if dtype is not None:
            stages = [stage.float() for stage in stages]
        features = [projector(stages) for projector in self.projector]
        keypoint_features = ([projector(stages) for projector in self.keypoint_projector]
                             if self.keypoint_projector is not None else None)
        decoded = self.decoder(features, return_sampling=return_attention, keypoint_features=keypoint_features)
        output = stack_layers(decoded.logits, decoded.boxes, self.aux_loss, self.class_head)
        output.proposals = LayerOutput(decoded.proposal_logits, decoded.proposal_boxes,
                                       keypoints=decoded.proposal_keypoints)
        if decoded.keypoints is not None:
            output.keypoints = decoded.keypoints[-1]
            for layer, keypoints in zip(output.aux, decoded.keypoints[:-1]):
                layer.keypoints = keypoints
        size = images.shape[-2:]
        if self.mask_head is not None and self.training:  # every layer's masks, as factors, for the mask loss
            layers = [*output.aux, output]
            per_layer = self.mask_head.layer_features(features[0], decoded.hidden, size)
            for layer, mask_features in zip(layers, per_layer[-len(layers):]):
                layer.mask_features = mask_features
            output.proposals.mask_features = self.mask_head.proposal_features(features[0], decoded.proposal_hidden, size)
        elif self.mask_head is not None:
            output.masks = self.mask_head(features[0], decoded.hidden, size)
        if decoded.sampling is not None:
            locations = torch.stack([locations for locations, _ in decoded.sampling])
            output.sampling = SamplingOutput(
                locations=locations, points=locations, weights=torch.stack([w for _, w in decoded.sampling]),
                spatial_shapes=torch.tensor([f.shape[-2:] for f in features], dtype=torch.int64),
                strides=tuple(round(self.backbone.patch_size / projector.scale) for projector in self.projector))
        return output
