"""RT-DETR and RT-DETRv2 (Zhao et al., "DETRs Beat YOLOs on Real-time Object Detection", CVPR 2024; Lv et al.,
"RT-DETRv2: Improved Baseline with Bag-of-Freebies for Real-Time Detection Transformer", 2024).

ResNet-vd → hybrid encoder (AIFI + CCFM) → query selection → deformable decoder with box refinement → per-layer
sigmoid class heads. The input contract is the family's own: a fixed square resize (640 by default), pixels / 255
without mean and std, no padding (see :attr:`RTDETR.input_spec`). RT-DETRv2 is the same network with two
options of the decoder's attention (offset scale, discrete sampling), so one class serves both.

State-dict keys are the authors' (lyuwenyu/RT-DETR): ``backbone.*`` (``PResNet``), ``encoder.*``
(``HybridEncoder``), ``decoder.*`` (``RTDETRTransformer``), so their release files load after unwrapping.
"""

from __future__ import annotations

import torch
from torch import nn

from detr.models.config import ClassHead
from detr.models.detector import Detector
from detr.models.inputs import InputSpec
from detr.models.layers.conv_norm import fold_batch_norms
from detr.models.outputs import DenoisingOutput, DetectorOutput, LayerOutput, SamplingOutput, stack_layers
from detr.models.rtdetr.decoder import RTDETRDecoder
from detr.models.rtdetr.hybrid_encoder import HybridEncoder
from detr.models.rtdetr.resnet_vd import ResNetVd

#: The authors' evaluation size: images resized to a 640 × 640 square.
EVAL_SIZE = 640
#: The norm layers the authors' optimizer groups pick out by name ("norm", "bn")
_NORMS = (nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)
#: The coarsest backbone map's stride: the encoder's upsampling pairs each map with one of exactly twice its size.
_COARSEST_STRIDE = 32


class RTDETR(Detector):
    """RT-DETR: images [B, 3, H, W] (pixels / 255; H and W multiples of 32) → :class:`DetectorOutput`.

    Args:
        backbone: the :class:`ResNetVd`. encoder: the :class:`HybridEncoder`. decoder: the :class:`RTDETRDecoder`.
        num_classes: sigmoid class logits (no "no object"). aux_loss: also return the earlier decoder layers.

    Attributes: those of the :class:`~detr.models.detector.Detector` contract; ``inference_layers``: how many
    decoder layers run (None: all), the paper's speed knob (every layer's heads are trained, so a
    shallower decoder needs no retraining).
    """

    class_head: ClassHead = "sigmoid"
    attention_kind = "points"

    def __init__(self, backbone: ResNetVd, encoder: HybridEncoder, decoder: RTDETRDecoder, *, num_classes: int,
                 aux_loss: bool = True) -> None:
        super().__init__()
        self.num_classes, self.num_queries, self.aux_loss = num_classes, decoder.num_queries, aux_loss
        self.backbone, self.encoder, self.decoder = backbone, encoder, decoder
        self.inference_layers: int | None = None

    @property
    def num_decoder_layers(self) -> int:
        return len(self.decoder.decoder.layers)

    def set_inference_layers(self, num_layers: int | None) -> RTDETR:
        """Run only the first ``num_layers`` decoder layers (None: all) and predict with the last one's heads."""
        if num_layers is not None and not 1 <= num_layers <= self.num_decoder_layers:
            raise ValueError(f"num_layers must be in 1..{self.num_decoder_layers} (the decoder's layers), "
                             f"got {num_layers}")
        self.inference_layers = num_layers
        return self

    @property
    def stride(self) -> int:
        """The finest level's stride (8)."""
        return 8

    @property
    def min_image_size(self) -> int:
        return _COARSEST_STRIDE

    @property
    def size_multiple(self) -> int:
        return _COARSEST_STRIDE

    @property
    def input_spec(self) -> InputSpec:
        """A ``meta.eval_size[0]``-pixel square (640 when unknown), pixels / 255 without mean and std, resized
        with the antialiased bilinear filter: the contract of transformers' ``RTDetrImageProcessor``."""
        size = self.meta.eval_size[0] if self.meta.eval_size is not None else EVAL_SIZE
        return InputSpec(resize="square", size=size, max_size=None, mean=None, std=None, interpolation="antialiased")

    @property
    def detections_per_image(self) -> int:
        """The authors' post-processing: the ``num_queries`` best (query, class) pairs."""
        return self.num_queries

    def describe(self) -> str:
        config = self.config
        if config is None:
            return ""
        version = ("RT-DETRv2" if config.sampling_method != "bilinear" or config.sampling_offset_scale != 0.5
                   else "RT-DETR")
        return (f"{version}, {config.backbone}-vd, {self.num_decoder_layers} decoder layers, "
                f"{config.num_feature_levels} levels × {config.num_points} points, {config.hidden_dim} hidden, {config.num_classes} classes")

    def slow_modules(self) -> list[nn.Module]:
        return []

    def backbone_parameters(self) -> list[nn.Parameter]:
        """The ResNet-vd's parameters but its norms' (the authors' backbone group, ``^(?=.*backbone)(?!.*norm)``,
        trained at ``lr_backbone``; trainable norms, as R18-vd's, train at the main rate)."""
        return [parameter for module in self.backbone.modules() if not isinstance(module, _NORMS)
                for parameter in module.parameters(recurse=False)]

    def no_weight_decay_parameters(self) -> list[nn.Parameter]:
        """The encoder's and decoder's norms (the authors' ``^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn))``
        group, weight decay 0)."""
        return [parameter for part in (self.encoder, self.decoder) for module in part.modules()
                if isinstance(module, _NORMS) for parameter in module.parameters(recurse=False)]

    @property
    def coarsest_stride(self) -> int:
        return _COARSEST_STRIDE

    def use_channels_last(self) -> None:
        """Run the ResNet-vd in NHWC memory layout (same numbers up to float rounding). In place."""
        self.backbone.to(memory_format=torch.channels_last)
        self.backbone.channels_last = True

    def use_folded_batch_norm(self, enabled: bool = True) -> None:
        """Nothing to fold in training: the ResNet-vd's and the encoder's BatchNorms train (``optimize_for_inference`` folds them)."""

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return self.backbone.autocast_dtype

    def use_autocast(self, dtype: torch.dtype | None = torch.bfloat16) -> None:
        """Run the ResNet-vd's convolutions under ``torch.autocast`` in ``dtype`` (None: off); the encoder and
        decoder get float32 maps."""
        self.backbone.autocast_dtype = dtype

    def optimize_for_inference(self, *, fold_batch_norm: bool = True, channels_last: bool = True) -> RTDETR:
        """Faster inference, in place, in eval mode: with ``fold_batch_norm``, the RepVGG blocks re-parameterised
        to one convolution each and every BatchNorm folded into its convolution (outputs equal to float
        rounding; the state dict no longer has the authors' layout); with ``channels_last``, the backbone in
        NHWC, which oneDNN and cuDNN prefer."""
        self.eval()
        if fold_batch_norm:
            self.encoder.reparameterize()
            fold_batch_norms(self)
        self.backbone.channels_last = channels_last
        return self

    def forward(self, images: torch.Tensor, padding_mask: torch.Tensor, return_attention: bool = False,
                targets: list[dict[str, torch.Tensor]] | None = None) -> DetectorOutput:
        """Raw predictions for a batch of same-size images (``padding_mask`` is not read: the family resizes
        every image to one square). In training, ``targets`` (per image labels int64 [T] and boxes [T, 4]
        normalised cxcywh) add the contrastive denoising queries of a model built with ``denoising``.

        Returns a :class:`DetectorOutput`: logits [B, Q, num_classes] (sigmoid scores), boxes [B, Q, 4]
        normalised cxcywh, of the last decoder layer run; aux (if aux_loss): the earlier layers; proposals: the
        selected encoder proposals; denoising (training with targets): the denoising queries' predictions, every
        layer's; distributions (training, a decoder that refines boxes as distributions: D-FINE): what its losses
        read; with return_attention, sampling: where each query's cross-attention looked.
        """
        if images.dim() != 4 or images.shape[-2] % _COARSEST_STRIDE or images.shape[-1] % _COARSEST_STRIDE:
            raise ValueError(f"RT-DETR takes images [B, 3, H, W] with H and W multiples of {_COARSEST_STRIDE} (its "
                             f"input contract resizes to a {EVAL_SIZE}-pixel square), got {tuple(images.shape)}")
        features = self.encoder(self.backbone(images))
        decoded = self.decoder(features, self.inference_layers, return_sampling=return_attention,
                               targets=targets if self.training else None)
        output = stack_layers(decoded.logits, decoded.boxes, self.aux_loss, self.class_head)
        output.proposals = LayerOutput(decoded.proposal_logits, decoded.proposal_boxes)
        output.distributions = decoded.distributions
        if decoded.denoising_meta is not None:
            layers = stack_layers(decoded.denoising_logits, decoded.denoising_boxes, self.aux_loss)
            output.denoising = DenoisingOutput(layers.logits, layers.boxes, aux=layers.aux,
                                               meta=decoded.denoising_meta,
                                               distributions=decoded.denoising_distributions)
        if decoded.sampling is not None:
            locations = torch.stack([locations for locations, _ in decoded.sampling])
            output.sampling = SamplingOutput(
                locations=locations, points=locations, weights=torch.stack([w for _, w in decoded.sampling]),
                spatial_shapes=torch.tensor(decoded.spatial_shapes, dtype=torch.int64),
                strides=tuple(self.stride * 2**level for level in range(len(decoded.spatial_shapes))))
        return output
