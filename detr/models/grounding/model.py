"""Grounding DINO (Liu et al., "Grounding DINO: Marrying DINO with Grounded Pre-Training for Open-Set Object
Detection", ECCV 2024) and MM-Grounding-DINO (Zhao et al. 2024): a DINO-style Deformable DETR that detects what
a text prompt names.

Data flow (Fig. 3 of the paper): image → ResNet stages layer2–layer4 or Swin's stage2–stage4 (+ one 3×3
stride-2 level) → 1×1 / 3×3 projections + GroupNorm → levels with sine positions (temperature 20) and level
embeddings; prompt → BERT (each phrase read on its own, :mod:`detr.models.grounding.text`) → linear
``feat_map`` to C; both → the feature enhancer (:mod:`~detr.models.grounding.encoder`) → language-guided query
selection and the cross-modality decoder (:mod:`~detr.models.grounding.transformer`) → per layer a contrastive
class head (logits per prompt token, :mod:`~detr.models.grounding.contrastive`) and a box head refining the
layer's reference box.

State-dict keys are the authors' (IDEA-Research/GroundingDINO): ``backbone.0.body.*`` (torchvision's ResNet;
transformers' Swin in its own names), ``bert.*`` (transformers' ``BertModel``), ``feat_map``,
``input_proj.{l}.{0,1}``, ``transformer.*``, ``bbox_embed.{i}.layers.{j}``, ``class_embed.{i}`` (a bias for
MM-Grounding-DINO).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from detr.box_ops import inverse_sigmoid
from detr.models.backbone import Joiner, downsample_mask
from detr.models.deformable.transformer import REFERENCE_EPS
from detr.models.detector import Detector, check_inputs
from detr.models.grounding.config import GroundingConfig
from detr.models.grounding.contrastive import ContrastiveEmbed
from detr.models.grounding.text import phrase_attention, text_position_embedding
from detr.models.grounding.transformer import GroundingTransformer
from detr.models.inputs import InputSpec
from detr.models.layers.mlp import MLP
from detr.models.outputs import DetectorOutput, LayerOutput, SamplingOutput, stack_layers

#: The backbone stages that feed the levels, finest first (strides 8, 16, 32).
_STAGES = ("layer2", "layer3", "layer4")


def _projection(in_channels: int, hidden_dim: int, *, extra: bool) -> nn.Sequential:
    conv = (nn.Conv2d(in_channels, hidden_dim, kernel_size=3, stride=2, padding=1) if extra
            else nn.Conv2d(in_channels, hidden_dim, kernel_size=1))
    return nn.Sequential(conv, nn.GroupNorm(32, hidden_dim))


class GroundingDINO(Detector):
    """Image + prompt tokens → per-query logits over the prompt's tokens and boxes.

    Args:
        backbone: a ResNet (or :class:`~detr.models.grounding.swin.SwinStages`) and its sine position encoding
            (temperature 20, no half-cell offset).
        bert: transformers' ``BertModel`` without pooler (:func:`detr.models.grounding.text.build_bert`).
        transformer: the :class:`GroundingTransformer`.
        config: the :class:`GroundingConfig` the parts were built from (its heads, sizes).
        channels: the channels of the backbone stages that feed the levels (layer2–layer4 for 3 levels or more).
        aux_loss: also return every earlier decoder layer's predictions.

    Attributes: those of the :class:`~detr.models.detector.Detector` contract, with ``prompted`` True (its
    forward takes the prompt's tokens too), ``attention_kind`` "points" (the decoder's sampling points, and its
    attention over the prompt's tokens in ``text_attention``) and ``num_classes`` the logits' columns
    (``max_text_len``); ``tokenizer``: the prompt's tokenizer (transformers' BERT tokenizer, set by the loader; None when built).
    """

    class_head = "sigmoid"
    attention_kind = "points"
    exportable = False
    prompted = True

    def __init__(self, backbone: Joiner, bert: nn.Module, transformer: GroundingTransformer, config: GroundingConfig,
                 *, channels: Sequence[int], aux_loss: bool = True) -> None:
        super().__init__()
        hidden_dim, levels, layers = config.hidden_dim, config.num_feature_levels, config.num_decoder_layers
        self.config, self.aux_loss = config, aux_loss
        self.num_queries, self.max_text_len = config.num_queries, config.num_classes
        self.num_classes = config.num_classes
        self.tokenizer: Any = None
        self.backbone, self.bert, self.transformer = backbone, bert, transformer
        self.feat_map = nn.Linear(bert.config.hidden_size, hidden_dim)
        self.stages = _STAGES[-min(levels, len(_STAGES)):]
        if len(channels) != len(self.stages):
            raise ValueError(f"channels {list(channels)}: one count per stage of {self.stages}")
        projections = [_projection(c, hidden_dim, extra=False) for c in channels]
        for level in range(len(channels), levels):
            projections.append(_projection(channels[-1] if level == len(channels) else hidden_dim, hidden_dim,
                                           extra=True))
        self.input_proj = nn.ModuleList(projections)
        box_heads = [MLP(hidden_dim, hidden_dim, 4, 3) for _ in range(1 if config.share_box_heads else layers)]
        class_heads = [ContrastiveEmbed(config.num_classes, config.contrastive_head)
                       for _ in range(1 if config.share_class_heads else layers)]
        for head in box_heads:
            nn.init.zeros_(head.layers[-1].weight)
            nn.init.zeros_(head.layers[-1].bias)
        # a shared head is one module at every index (the decoder's refinement reads the same modules)
        self.bbox_embed = nn.ModuleList(box_heads * layers if config.share_box_heads else box_heads)
        self.class_embed = nn.ModuleList(class_heads * layers if config.share_class_heads else class_heads)

    @property
    def stride(self) -> int:
        """Input pixels per cell of the finest level: 8 (3 levels or more)."""
        return {"layer2": 8, "layer3": 16, "layer4": self.backbone[0].stride}[self.stages[0]]

    @property
    def min_image_size(self) -> int:
        """One stride of the coarsest level more than a single cell."""
        return self.backbone[0].stride * 2 ** max(len(self.input_proj) - 3, 0) + 1

    @property
    def input_spec(self) -> InputSpec:
        """transformers' ``GroundingDinoImageProcessor``: shortest side 800, longest at most 1333 (or the
        checkpoint's ``meta.eval_size``), antialiased bilinear resize, ImageNet normalisation, zero padding."""
        size, max_size = self.meta.eval_size or (800, 1333)
        return InputSpec(size=size, max_size=max_size, interpolation="antialiased")

    def with_prompt(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, phrases: Sequence[str]) -> Detector:
        """This model with one prompt fixed: input_ids and attention_mask int64 [1, N] (its tokens, as the tokenizer
        gives them), ``phrases`` its phrases in order. Returns a detector of one class per phrase that takes images
        only, and exports (:class:`~detr.models.grounding.fixed_prompt.FixedPromptDetector`);
        :func:`detr.inference.fixed_prompt.fix_prompt` makes the tokens from a prompt's text."""
        from detr.models.grounding.fixed_prompt import FixedPromptDetector

        return FixedPromptDetector(self, input_ids, attention_mask, phrases)

    def backbone_parameters(self) -> list[nn.Parameter]:
        """The pretrained encoders', trained at the backbone's learning rate: the image backbone and the BERT text
        encoder."""
        return [*self.backbone.parameters(), *self.bert.parameters()]

    def describe(self) -> str:
        """The family, its contrastive head and sizes."""
        c = self.config
        name = "MM-Grounding-DINO" if c.contrastive_head == "scaled_bias" else "Grounding DINO"
        return (f"{name}, {c.backbone}, {c.encoder_layers} + {c.num_decoder_layers} layers, {c.hidden_dim} hidden, "
                f"{c.num_queries} queries, prompts of at most {c.num_classes} tokens")

    def multi_scale_features(self, images: torch.Tensor, padding_mask: torch.Tensor
                             ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """images [B, 3, H, W], padding_mask bool [B, H, W] → per level: projected features [B, C, h_l, w_l],
        masks bool [B, h_l, w_l] (True = padding), positions [B, C, h_l, w_l]."""
        check_inputs(images, padding_mask)
        padding_mask = padding_mask.bool()
        keep = self.stages[:-1]
        last, _, stages = self.backbone[0].forward_with_stages(images, padding_mask, keep)
        features = [stages[name] for name in keep] + [last]
        sources = [projection(feature) for projection, feature in zip(self.input_proj, features)]
        for level in range(len(features), len(self.input_proj)):
            sources.append(self.input_proj[level](last if level == len(features) else sources[-1]))
        masks = [downsample_mask(padding_mask, source.shape[-2:]) for source in sources]
        positions = [self.backbone[1](mask).to(source.dtype) for source, mask in zip(sources, masks)]
        return sources, masks, positions

    def encode_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """input_ids int64 [B, N] and the tokenizer's attention_mask [B, N] (1 = a real token), cut to
        ``max_text_len`` → (text features [B, N, C], their positions [B, N, C], token mask bool [B, N],
        phrase attention bool [B, N, N])."""
        allowed, position_ids = phrase_attention(input_ids)
        length = min(input_ids.shape[1], self.max_text_len)
        input_ids, attention_mask = input_ids[:, :length], attention_mask[:, :length]
        allowed, position_ids = allowed[:, :length, :length], position_ids[:, :length]
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        text = self.bert(input_ids, attention_mask=allowed[:, None], token_type_ids=token_type_ids[:, :length],
                         position_ids=position_ids).last_hidden_state
        text = self.feat_map(text)
        return text, text_position_embedding(position_ids, text.shape[-1]), attention_mask.bool(), allowed

    def forward(self, images: torch.Tensor, padding_mask: torch.Tensor, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
                return_attention: bool = False) -> DetectorOutput:
        """images float [B, 3, H, W] (ImageNet-normalised, zero-padded), padding_mask bool [B, H, W] (True =
        padding); input_ids int64 [B, N] (a BERT tokenizer's, the prompt "a cat. a remote control."),
        attention_mask [B, N] (1 = a real token; default all).

        Returns a :class:`DetectorOutput`: logits [B, Q, max_text_len] (sigmoid scores per prompt token, −inf at
        padding and beyond the prompt), boxes [B, Q, 4] normalised cxcywh of the unpadded image; aux (with
        ``aux_loss``): layers 1 … L-1; proposals: the ``num_queries`` encoder proposals the decoder starts from
        (logits [B, Q, max_text_len], boxes [B, Q, 4]), scored by the encoder loss as the authors' (mmdetection's
        ``enc_outputs_class`` / ``enc_outputs_coord``). With ``return_attention``: sampling, where each decoder
        layer's queries looked in the image (as Deformable DETR's), and text_attention [L, B, heads, Q, N], their
        attention over the prompt's N tokens (softmax weights: 1 per layer, image, head and query; 0 at padding
        tokens).
        """
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        return self.detect(images, padding_mask, *self.encode_text(input_ids, attention_mask, token_type_ids),
                           return_attention=return_attention)

    def detect(self, images: torch.Tensor, padding_mask: torch.Tensor, text: torch.Tensor, text_position: torch.Tensor,
               text_mask: torch.Tensor, allowed: torch.Tensor, return_attention: bool = False) -> DetectorOutput:
        """:meth:`forward` from the prompt's encoded text (what :meth:`encode_text` returns), so that a fixed
        prompt is encoded once (:mod:`detr.models.grounding.fixed_prompt`)."""
        sources, masks, positions = self.multi_scale_features(images, padding_mask)
        out = self.transformer(sources, masks, positions, text, text_position, text_mask, allowed, self.bbox_embed,
                               return_attention)
        logits, boxes = [], []
        for layer in range(out.hidden.shape[0]):
            hidden = out.hidden[layer]
            logits.append(self.class_embed[layer](hidden, out.text, text_mask))
            reference = inverse_sigmoid(out.references[layer], eps=REFERENCE_EPS)
            boxes.append((self.bbox_embed[layer](hidden) + reference).sigmoid())
        output = stack_layers(torch.stack(logits), torch.stack(boxes), self.aux_loss, self.class_head)
        output.proposals = LayerOutput(out.encoder_logits, out.encoder_boxes)
        if return_attention:
            locations = torch.stack([layer.sampling_locations for layer in out.attention])
            output.sampling = SamplingOutput(
                locations=locations, points=locations / out.valid_ratios[None, :, None, None, :, None, :],
                weights=torch.stack([layer.sampling_weights for layer in out.attention]),
                spatial_shapes=torch.tensor(out.spatial_shapes, dtype=torch.int64),
                strides=tuple(self.stride * 2**level for level in range(len(out.spatial_shapes))))
            output.text_attention = torch.stack([layer.text_weights for layer in out.attention])
        return output

