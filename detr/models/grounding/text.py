"""The prompt's side of Grounding DINO: which tokens may attend to which (one phrase each), their positions, the
BERT text encoder, and the sine position encodings of tokens and of reference boxes.

A prompt is phrases separated by delimiters, "a cat. a remote control." → ``[CLS] a cat . a remote control .
[SEP]``. The text encoder reads each phrase on its own (§3.4 of the paper, "sub-sentence level text features"):
a token attends only to the tokens of its phrase (up to and including the delimiter that ends it) and counts its
position from the phrase's start; [CLS], [SEP] and tokens after the last delimiter attend only to themselves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from detr.models.layers.position_encoding import sine_embedding

#: The token ids that end a phrase in bert-base-uncased's vocabulary, as the released models were trained:
#: [CLS] 101, [SEP] 102, "." 1012, "?" 1029. A tokenizer whose vocabulary puts them elsewhere builds other phrases.
DELIMITER_TOKEN_IDS = (101, 102, 1012, 1029)


def phrase_attention(input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids int64 [B, N] → (allowed bool [B, N, N]: True where token i may attend to token j, position_ids
    int64 [B, N]: each token's index within its phrase, 0 outside phrases)."""
    batch, length = input_ids.shape
    delimiters = torch.tensor(DELIMITER_TOKEN_IDS, device=input_ids.device)
    is_delimiter = torch.isin(input_ids, delimiters)
    index = torch.arange(length, device=input_ids.device).expand(batch, length)
    # the delimiter that ends each token's phrase: the first at or after it (length: none)
    end = torch.where(is_delimiter, index, length).flip(1).cummin(1).values.flip(1)
    # the delimiter before it (-1: none)
    start = F.pad(torch.where(is_delimiter, index, -1).cummax(1).values[:, :-1], (1, 0), value=-1)
    # a phrase ends at a delimiter that is neither the first token ([CLS]) nor the last ([SEP])
    in_phrase = (end != 0) & (end != length - 1) & (end != length)
    same_phrase = (end[:, :, None] == end[:, None, :]) & in_phrase[:, None, :]
    allowed = same_phrase | torch.eye(length, dtype=torch.bool, device=input_ids.device)
    position_ids = torch.where(in_phrase, index - start - 1, 0).clamp(min=0)
    return allowed, position_ids


def text_position_embedding(position_ids: torch.Tensor, hidden_dim: int) -> torch.Tensor:
    """position_ids int [B, N] → [B, N, hidden_dim]: the sine encoding of 2π · position (temperature 10000), which
    the feature enhancer's text self-attention adds to its queries and keys."""
    return sine_embedding(position_ids.float() * (2 * math.pi), hidden_dim)


def box_position_embedding(boxes: torch.Tensor, hidden_dim: int) -> torch.Tensor:
    """boxes [B, Q, 4] (cx, cy, w, h) in [0, 1] → [B, Q, 2·hidden_dim]: hidden_dim / 2 sine features of 2π ·
    each coordinate (temperature 10000), in the order cy, cx, w, h (the authors' ``gen_sineembed_for_position``)."""
    embedded = sine_embedding(boxes * (2 * math.pi), hidden_dim // 2)  # [B, Q, 4, C/2]
    return embedded[..., [1, 0, 2, 3], :].flatten(-2)


def build_bert(text_config: Mapping[str, Any]) -> nn.Module:
    """transformers' ``BertModel`` (no pooler) from its config dict: the text encoder, not rewritten here.

    transformers is this family's optional dependency, imported here only (``import detr`` does not need it)."""
    try:
        from transformers import AutoModel, BertConfig
    except ImportError as error:
        raise ImportError("Grounding DINO's text encoder is transformers' BERT: pip install transformers") from error
    fields = {key: value for key, value in text_config.items() if key not in ("architectures", "transformers_version")}
    return AutoModel.from_config(BertConfig.from_dict(fields), add_pooling_layer=False)


def phrase_token_mask(input_ids: torch.Tensor, columns: int) -> torch.Tensor:
    """One prompt's input_ids int64 [N] → bool [K, columns]: True at the tokens of its k-th phrase (a run of tokens
    between delimiters, :data:`DELIMITER_TOKEN_IDS`, and [PAD] 0), False elsewhere and beyond N (< ``columns``).
    transformers' ``build_label_maps``; the grounding loss's targets and a fixed prompt's classes."""
    separator = torch.isin(input_ids, torch.tensor((*DELIMITER_TOKEN_IDS, 0), device=input_ids.device))
    starts = ~separator & torch.cat([separator.new_ones(1), separator[:-1]])
    phrase = torch.cumsum(starts.long(), 0) - 1
    mask = torch.zeros(int(starts.sum()), columns, dtype=torch.bool, device=input_ids.device)
    tokens = (~separator).nonzero().flatten()
    mask[phrase[tokens], tokens] = True
    return mask
