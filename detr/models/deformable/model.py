"""Deformable DETR (Zhu et al., "Deformable DETR: Deformable Transformers for End-to-End Object Detection",
ICLR 2021): multi-scale features, deformable attention, 300 queries, a sigmoid focal class head; iterative
box refinement and two-stage as options.

Multi-scale input (§4.1, Fig. 4 of the paper): the ResNet's layer2, layer3 and layer4 outputs (strides 8,
16, 32), each through a 1×1 conv + GroupNorm(32) to the hidden size, plus extra levels from layer4 by
3×3 stride-2 convs + GroupNorm (stride 64 for the default 4 levels); ``num_feature_levels=1`` is the
paper's single-scale model (layer4 only), 2 and 3 take the last two and three stages. Each level gets the sine position encoding (with the authors'
half-cell offset) plus a learned level embedding, and its own padding mask.

State-dict keys are the authors' (fundamentalvision/Deformable-DETR): ``backbone.0.body.*``,
``input_proj.{l}.{0,1}.*``, ``transformer.*``, ``query_embed.weight`` (one stage), ``class_embed.{i}.*`` and
``bbox_embed.{i}.layers.{j}.*`` per decoder layer (+1 for two-stage's encoder head), shared modules without
box refinement and separate ones with it.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from detr.box_ops import inverse_sigmoid
from detr.models.backbone import Joiner, describe_resnet_detector, downsample_mask
from detr.models.config import PRIOR_BIAS, ClassHead
from detr.models.deformable.transformer import REFERENCE_EPS, DeformableTransformer
from detr.models.detector import Detector, check_inputs
from detr.models.layers.deformable_attention import MultiScaleDeformableAttention
from detr.models.layers.mlp import MLP
from detr.models.outputs import DetectorOutput, LayerOutput, SamplingOutput, stack_layers

#: The backbone stages that feed the levels, finest first (strides 8, 16, 32).
_STAGES = ("layer2", "layer3", "layer4")


def _projection(in_channels: int, hidden_dim: int, *, extra: bool) -> nn.Sequential:
    conv = (nn.Conv2d(in_channels, hidden_dim, kernel_size=3, stride=2, padding=1) if extra
            else nn.Conv2d(in_channels, hidden_dim, kernel_size=1))
    nn.init.xavier_uniform_(conv.weight, gain=1)
    nn.init.constant_(conv.bias, 0)
    return nn.Sequential(conv, nn.GroupNorm(32, hidden_dim))


class DeformableDETR(Detector):
    """Deformable DETR: multi-scale features → deformable encoder → deformable decoder → per-layer heads.

    Args:
        backbone: a ResNet cut after layer4 and its sine position encoding (``offset=-0.5``).
        transformer: the :class:`DeformableTransformer` (its ``num_levels`` sets the input levels).
        num_classes: sigmoid class logits (no "no object"). num_queries: object queries (paper: 300).
        aux_loss: also return every earlier decoder layer's predictions.
        box_refine: iterative bounding-box refinement (separate heads per layer, each refining the last box).
        two_stage: queries from the encoder's best proposals (needs ``box_refine``, as the authors' code).

    Attributes: those of the :class:`~detr.models.detector.Detector` contract; ``class_head`` is "sigmoid",
    ``stride`` the finest level's (8, or 32 single-scale), and ``return_attention`` gives sampling points.
    """

    class_head: ClassHead = "sigmoid"
    attention_kind = "points"

    def __init__(self, backbone: Joiner, transformer: DeformableTransformer, *, num_classes: int, num_queries: int = 300,
                 aux_loss: bool = True, box_refine: bool = False, two_stage: bool = False) -> None:
        super().__init__()
        if two_stage and not box_refine:
            raise ValueError("two_stage=True needs box_refine=True (its reference boxes are refined layer by layer)")
        hidden_dim, levels = transformer.d_model, transformer.num_levels
        self.num_classes, self.num_queries, self.aux_loss = num_classes, num_queries, aux_loss
        self.box_refine, self.two_stage = box_refine, two_stage
        self.transformer = transformer
        class_embed = nn.Linear(hidden_dim, num_classes)
        nn.init.constant_(class_embed.bias, PRIOR_BIAS)
        bbox_embed = MLP(hidden_dim, hidden_dim, 4, 3)
        nn.init.constant_(bbox_embed.layers[-1].weight, 0)
        nn.init.constant_(bbox_embed.layers[-1].bias, 0)
        nn.init.constant_(bbox_embed.layers[-1].bias[2:], 0.0 if two_stage else -2.0)
        num_heads = len(transformer.decoder.layers) + (1 if two_stage else 0)
        if box_refine:  # one head per layer (clones); the authors start only the first at -2 for w, h
            self.class_embed = nn.ModuleList(copy.deepcopy(class_embed) for _ in range(num_heads))
            self.bbox_embed = nn.ModuleList(copy.deepcopy(bbox_embed) for _ in range(num_heads))
            if not two_stage:
                for head in self.bbox_embed[1:]:
                    nn.init.constant_(head.layers[-1].bias[2:], 0.0)
        else:  # one head shared by every layer
            self.class_embed = nn.ModuleList([class_embed] * num_heads)
            self.bbox_embed = nn.ModuleList([bbox_embed] * num_heads)
        if not two_stage:
            self.query_embed = nn.Embedding(num_queries, hidden_dim * 2)
        self.stages = _STAGES[-min(levels, len(_STAGES)):]  # the backbone stages read, finest first
        channels = [stage_channels(backbone[0], stage) for stage in self.stages]
        projections = [_projection(c, hidden_dim, extra=False) for c in channels]
        for level in range(len(channels), levels):
            projections.append(_projection(channels[-1] if level == len(channels) else hidden_dim, hidden_dim,
                                           extra=True))
        self.input_proj = nn.ModuleList(projections)
        self.backbone = backbone

    @property
    def num_levels(self) -> int:
        return self.transformer.num_levels

    @property
    def stride(self) -> int:
        """Input pixels per cell of the finest level: 8 (3 levels or more), 16 (2) or the backbone's (1)."""
        return {"layer2": 8, "layer3": 16, "layer4": self.backbone[0].stride}[self.stages[0]]

    @property
    def min_image_size(self) -> int:
        """One stride of the coarsest level more than a single cell: the extra levels halve the backbone's map
        once each."""
        return self.backbone[0].stride * 2 ** max(self.num_levels - 3, 0) + 1

    def slow_modules(self) -> list[nn.Module]:
        """Every attention's sampling-offset linear and the one-stage reference-point linear: the authors train
        them at a tenth of the learning rate (their main.py, ``lr_linear_proj_mult``)."""
        modules = [module.sampling_offsets for module in self.modules()
                   if isinstance(module, MultiScaleDeformableAttention)]
        reference_points = getattr(self.transformer, "reference_points", None)
        return modules + ([reference_points] if reference_points is not None else [])

    def describe(self) -> str:
        """The variant, its levels and points, then the backbone and widths (:meth:`Detector.describe`)."""
        variant = " + ".join(name for name, on in (("box refinement", self.box_refine), ("two-stage", self.two_stage))
                             if on)
        config = self.config
        if config is None:
            return ""
        return (f"Deformable DETR{f' ({variant})' if variant else ''}, {config.num_feature_levels} levels × "
                f"{config.num_points} points, {describe_resnet_detector(config)}")

    def multi_scale_features(self, images: torch.Tensor, padding_mask: torch.Tensor
                             ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """images [B, 3, H, W], padding_mask bool [B, H, W] → per level: projected features [B, C, h_l, w_l],
        masks bool [B, h_l, w_l] (True = padding, nearest-resized from the image's), positions [B, C, h_l, w_l]."""
        check_inputs(images, padding_mask)
        padding_mask = padding_mask.bool()
        keep = self.stages[:-1]
        last, _, stages = self.backbone[0].forward_with_stages(images, padding_mask, keep)
        features = [stages[name] for name in keep] + [last]
        sources = [projection(feature) for projection, feature in zip(self.input_proj, features)]
        for level in range(len(features), self.num_levels):
            sources.append(self.input_proj[level](last if level == len(features) else sources[-1]))
        masks = [downsample_mask(padding_mask, src.shape[-2:]) for src in sources]
        positions = [self.backbone[1](mask).to(src.dtype) for src, mask in zip(sources, masks)]
        return sources, masks, positions

    def forward(self, images: torch.Tensor, padding_mask: torch.Tensor, return_attention: bool = False,
                targets: list[dict[str, torch.Tensor]] | None = None) -> DetectorOutput:
        """Raw predictions for a padded batch (``targets`` are not read: every detector takes them).

        Returns a :class:`DetectorOutput`: logits [B, Q, num_classes] (sigmoid scores), boxes [B, Q, 4]
        normalised cxcywh of the unpadded image; aux (if aux_loss): layers 1 … L-1; two-stage: proposals
        (logits [B, S, num_classes], boxes [B, S, 4]: the encoder proposals, trained class-agnostically).
        With return_attention, sampling: where each query's cross-attention looked
        (:class:`detr.models.outputs.SamplingOutput`).
        """
        sources, masks, positions = self.multi_scale_features(images, padding_mask)
        query_embed = None if self.two_stage else self.query_embed.weight
        out = self.transformer(sources, masks, positions, query_embed, self.class_embed, self.bbox_embed,
                               self.box_refine, return_sampling=return_attention)
        decoded = out.decoder
        logits, boxes = [], []
        for layer in range(decoded.hidden.shape[0]):
            hidden = decoded.hidden[layer]
            reference = inverse_sigmoid(decoded.references[layer], eps=REFERENCE_EPS)
            delta = self.bbox_embed[layer](hidden)
            if reference.shape[-1] == 4:
                box_logits = delta + reference
            else:
                box_logits = torch.cat([delta[..., :2] + reference, delta[..., 2:]], -1)
            logits.append(self.class_embed[layer](hidden))
            boxes.append(box_logits.sigmoid())
        output = stack_layers(torch.stack(logits), torch.stack(boxes), self.aux_loss, self.class_head)
        if out.encoder_logits is not None:
            output.proposals = LayerOutput(out.encoder_logits, out.encoder_boxes)
        if return_attention:
            locations = torch.stack([locations for locations, _ in decoded.sampling])
            output.sampling = SamplingOutput(
                locations=locations, points=locations / out.valid_ratios[None, :, None, None, :, None, :],
                weights=torch.stack([weights for _, weights in decoded.sampling]),
                spatial_shapes=torch.tensor(out.spatial_shapes, dtype=torch.int64),
                strides=tuple(self.stride * 2**level for level in range(len(out.spatial_shapes))))
        return output


def stage_channels(body: nn.Module, stage: str) -> int:
    """Output channels of a ResNet stage of :class:`detr.models.backbone.Backbone` (its last block's last conv)."""
    last_block = getattr(body.body, stage)[-1]
    return (last_block.conv3 if hasattr(last_block, "conv3") else last_block.conv2).out_channels
