"""A grounding model with its prompt fixed: a closed-set detector with one class per phrase of the prompt.

The prompt's text is encoded once (BERT and the text projection, :meth:`GroundingDINO.encode_text`) and kept as
buffers, so the detector takes images only and its graph (ONNX, OpenVINO, ``.pt2``) holds the text features as
constants and no text encoder. Its class logit for a phrase is the best of the phrase's token logits, so that its
sigmoid is the phrase's best token's score, as the grounded post-processing scores a box
(:mod:`detr.inference.grounding`), and every runtime post-processes it as a sigmoid detector of
``len(phrases)`` classes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from detr.categories import CategoryMap
from detr.models.config import ModelMeta
from detr.models.detector import Detector
from detr.models.grounding.text import phrase_token_mask
from detr.models.inputs import InputSpec
from detr.models.outputs import DetectorOutput, LayerOutput


class FixedPromptDetector(Detector):
    """A grounding model and one prompt → logits [B, Q, K] (one per phrase) and boxes [B, Q, 4].

    Args:
        model: the grounding model, a :class:`~detr.models.grounding.model.GroundingDINO` (which makes this
            detector: :meth:`~detr.models.grounding.model.GroundingDINO.with_prompt`; its modules are shared, not
            copied; its BERT is not called).
        input_ids, attention_mask: the prompt's tokens int64 [1, N] (N ≤ ``max_text_len``).
        phrases: the prompt's K phrases in order (the class names; ``meta.category_map``).

    Raises ValueError when the tokens hold another number of phrases than ``phrases`` or more than the model reads.
    """

    class_head = "sigmoid"
    attention_kind = None

    def __init__(self, model: Detector, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 phrases: Sequence[str]) -> None:
        super().__init__()
        if input_ids.dim() != 2 or input_ids.shape[0] != 1 or attention_mask.shape != input_ids.shape:
            raise ValueError(f"a fixed prompt is one prompt's input_ids and attention_mask [1, N], got "
                             f"{list(input_ids.shape)} and {list(attention_mask.shape)}")
        if input_ids.shape[1] > model.max_text_len:
            raise ValueError(f"the prompt has {input_ids.shape[1]} tokens but the model reads at most "
                             f"{model.max_text_len} (max_text_len): shorten it")
        phrase_mask = phrase_token_mask(input_ids[0], model.max_text_len)
        if len(phrase_mask) != len(phrases):
            raise ValueError(f"the prompt's tokens hold {len(phrase_mask)} phrases, but {len(phrases)} phrase names "
                             f"were given ({list(phrases)})")
        self.model = model
        self.num_classes, self.num_queries = len(phrases), model.num_queries
        self.phrases = tuple(phrases)
        with torch.no_grad():
            text, position, mask, allowed = model.encode_text(input_ids, attention_mask)
        self.register_buffer("text", text)
        self.register_buffer("text_position", position)
        self.register_buffer("text_mask", mask)
        self.register_buffer("allowed", allowed)
        self.register_buffer("phrase_mask", phrase_mask)
        self.meta = ModelMeta(category_map=CategoryMap(tuple(range(1, len(phrases) + 1)), self.phrases),
                              eval_size=model.meta.eval_size)

    @property
    def backbone(self) -> torch.nn.Module:
        """The grounding model's image backbone (the :class:`Detector` hooks read it)."""
        return self.model.backbone

    @property
    def stride(self) -> int:
        return self.model.stride

    @property
    def min_image_size(self) -> int:
        return self.model.min_image_size

    @property
    def input_spec(self) -> InputSpec:
        return self.model.input_spec

    def describe(self) -> str:
        return f"{self.model.describe()}, the prompt fixed: {'. '.join(self.phrases)}."

    def phrase_logits(self, token_logits: torch.Tensor) -> torch.Tensor:
        """token_logits [B, Q, max_text_len] → [B, Q, K]: each phrase's best token logit."""
        masked = token_logits[..., None, :].masked_fill(~self.phrase_mask, float("-inf"))  # [B, Q, K, T]
        return masked.amax(-1)

    def forward(self, images: torch.Tensor, padding_mask: torch.Tensor, return_attention: bool = False,
                targets: object = None) -> DetectorOutput:
        """images float [B, 3, H, W] (ImageNet-normalised, zero-padded), padding_mask bool [B, H, W] → logits
        [B, Q, K] (a sigmoid score per phrase) and boxes [B, Q, 4] normalised cxcywh; aux: the earlier layers."""
        if return_attention:
            raise ValueError("a grounding model returns no attention maps")
        batch = images.shape[0]
        out = self.model.detect(images, padding_mask, self.text.expand(batch, -1, -1),
                                self.text_position.expand(batch, -1, -1), self.text_mask.expand(batch, -1),
                                self.allowed.expand(batch, -1, -1))
        aux = [LayerOutput(self.phrase_logits(layer.logits), layer.boxes) for layer in out.aux]
        return DetectorOutput(self.phrase_logits(out.logits), out.boxes, aux=aux, class_head=self.class_head)
