"""Where the denoising queries sit among a decoder's queries, and the self-attention mask that keeps them apart
(DN-DETR: Li et al., CVPR 2022, §3.4; DINO's contrastive groups: Zhang et al., ICLR 2023, §3.3).

In training a denoising decoder gets ``num_groups`` groups of ``group_size`` noised ground-truth queries ahead of
its matching queries: DN-DETR's (:class:`detr.models.anchor.denoising.DenoisingQueries`) and RT-DETR's contrastive
groups (:func:`detr.models.rtdetr.denoising.contrastive_denoising_queries`) alike. :class:`DenoisingMeta` tells the
loss and the outputs where they are; :func:`denoising_attention_mask` keeps the matching queries from reading the
answers and each group from seeing the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DenoisingMeta:
    """Where the denoising queries are: ``num_groups`` groups of ``group_size`` queries, first in the
    decoder's query list. Query ``g · group_size + t`` of image b reconstructs target t of image b
    (t < that image's target count; :func:`detr.loss.parts.denoising_indices` pairs them for the loss)."""

    num_groups: int
    group_size: int

    @property
    def num_queries(self) -> int:
        return self.num_groups * self.group_size


def denoising_attention_mask(num_groups: int, group_size: int, num_queries: int,
                             device: torch.device | None = None) -> torch.Tensor:
    """bool [D + Q, D + Q] with D = num_groups · group_size, True = may attend (SDPA's convention).

    Rows and columns: D denoising queries (group by group), then Q matching queries. Matching queries
    see only matching queries; a denoising query sees its own group and the matching queries.
    """
    num_dn = num_groups * group_size
    total = num_dn + num_queries
    group = torch.arange(total, device=device) // max(group_size, 1)
    is_dn = torch.arange(total, device=device) < num_dn
    same_group = group[:, None] == group[None, :]
    allowed = ~is_dn[None, :] | (is_dn[:, None] & same_group)  # any row may see matching columns
    return allowed
