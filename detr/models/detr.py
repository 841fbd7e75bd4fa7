"""DETR: backbone → transformer → class and box heads (paper §3.2; the authors' models/detr.py).

The paper's query source: ``num_queries`` learned embeddings (``query_embed``), added as positions to the
decoder's queries, whose content starts at zero. The backbone, the heads, the auxiliary outputs and the
input checks are the shared :class:`detr.models.single_scale.SingleScaleDetector`'s;
:func:`detr.models.build.build_detr` builds this model from a :class:`detr.models.config.DetrConfig`.
"""

from __future__ import annotations

import torch
from torch import nn

from detr.models.config import QueryType
from detr.models.detector import Targets
from detr.models.single_scale import DecodedQueries, SingleScaleDetector

__all__ = ["DETR"]


class DETR(SingleScaleDetector):
    """The paper's detector: learned object queries decoded by the transformer. Build it with
    :func:`detr.models.build.build_detr`.

    Args: :class:`SingleScaleDetector`'s; ``transformer`` is :class:`detr.models.transformer.Transformer`
    (encoder and decoder).

    Returns from ``forward`` the :class:`~detr.models.outputs.DetectorOutput` that
    :meth:`SingleScaleDetector.forward` describes.
    """

    query_type: QueryType = "learned"

    def init_queries(self, hidden_dim: int) -> None:
        self.query_embed = nn.Embedding(self.num_queries, hidden_dim)

    def decode_queries(self, src: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, targets: Targets | None,
                       return_attention: bool) -> DecodedQueries:
        """The transformer on the learned queries (``targets`` unused: these queries learn from the loss only)."""
        out = self.transformer(src, mask, self.query_embed.weight, pos, return_attention)
        decoder_attention = torch.stack(out["decoder_attention"]) if return_attention else None
        # boxes None: the detector's box head reads them from every layer's output [L, B, Q, C]
        return DecodedQueries(out["hs"], None, out["memory"], out["encoder_attention"], decoder_attention)
