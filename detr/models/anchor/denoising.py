"""Denoising queries for training (DN-DETR: Li et al., "DN-DETR: Accelerate DETR Training by Introducing
Query DeNoising", CVPR 2022).

During training only, ``num_groups`` noised copies of every ground-truth box and label are fed to the
anchor decoder as extra queries. Each reconstructs its own ground truth, so these queries get L1, GIoU and
class losses *without* Hungarian matching: a stable, dense training signal for the decoder from the first
step. The noise (DN-DETR §3.2):

- box: the centre moves by up to ``box_noise · (w/2, h/2)`` and the width and height scale by a factor in
  ``[1 - box_noise, 1 + box_noise]`` (uniform), then the box is clamped to [0, 1];
- label: with probability ``label_noise`` a label is replaced by a uniformly drawn class.

A denoising query's content is the label's embedding (``label_embed``, hidden_dim - 1 channels) plus an
indicator channel set to 1; its anchor is the noised box. The matching queries' content is the embedding
of the extra "unknown" class ``num_classes`` with indicator 0 (in training and inference alike).

Layout of the decoder's queries in training: ``num_groups`` groups of ``group_size`` denoising queries
(group_size = the most targets of any image in the batch; images with fewer leave padding queries that
nothing supervises), then the ``num_queries`` matching queries. The self-attention mask keeps the
matching queries from seeing any denoising query (they would read the answers) and each group from
seeing the others; denoising queries may see the matching queries.
"""

from __future__ import annotations

import torch
from torch import nn

from detr.box_ops import inverse_sigmoid
from detr.models.layers.denoising import DenoisingMeta, denoising_attention_mask


class DenoisingQueries(nn.Module):
    """Builds the denoising queries and the self-attention mask; owns the label embedding.

    Args:
        num_classes: real classes; index ``num_classes`` is the "unknown" label of the matching queries.
        hidden_dim: decoder width (the label embedding has hidden_dim - 1 channels + 1 indicator).
        num_groups: noised copies of each ground truth (DN-DETR: 5).
        label_noise: probability of replacing a label by a random class (0.2).
        box_noise: box noise scale λ (0.4).
    """

    def __init__(self, num_classes: int, hidden_dim: int, *, num_groups: int = 5, label_noise: float = 0.2,
                 box_noise: float = 0.4) -> None:
        super().__init__()
        if num_groups < 1:
            raise ValueError(f"denoising_groups must be at least 1, got {num_groups}")
        if not 0 <= label_noise <= 1:
            raise ValueError(f"denoising_label_noise is a probability in [0, 1], got {label_noise}")
        if box_noise < 0:
            raise ValueError(f"denoising_box_noise must be non-negative, got {box_noise}")
        self.num_classes, self.num_groups = num_classes, num_groups
        self.label_noise, self.box_noise = label_noise, box_noise
        self.label_embed = nn.Embedding(num_classes + 1, hidden_dim - 1)

    def _content(self, labels: torch.Tensor, indicator: float) -> torch.Tensor:
        """labels int64 [...] → content float [..., hidden]: label embedding + indicator channel."""
        embedding = self.label_embed(labels)
        return torch.cat([embedding, embedding.new_full((*embedding.shape[:-1], 1), indicator)], dim=-1)

    def matching_content(self, batch_size: int, num_queries: int) -> torch.Tensor:
        """Content of the matching queries: float [B, Q, hidden], the "unknown" label, indicator 0."""
        unknown = torch.full((batch_size, num_queries), self.num_classes, dtype=torch.int64,
                             device=self.label_embed.weight.device)
        return self._content(unknown, 0.0)

    def noise(self, labels: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """labels int64 [N], boxes float [N, 4] normalised cxcywh → noised copies (same shapes)."""
        if self.label_noise > 0:
            flip = torch.rand(labels.shape, device=labels.device) < self.label_noise
            random_labels = torch.randint_like(labels, 0, self.num_classes)
            labels = torch.where(flip, random_labels, labels)
        if self.box_noise > 0:
            half_size = boxes[:, 2:] / 2
            spread = torch.cat([half_size, boxes[:, 2:]], dim=1)  # centre by ±w/2, ±h/2; size by ±w, ±h
            boxes = boxes + (torch.rand_like(boxes) * 2 - 1) * spread * self.box_noise
            boxes = boxes.clamp(min=0.0, max=1.0)
        return labels, boxes

    def forward(self, tgt: torch.Tensor, anchors: torch.Tensor, targets: list[dict[str, torch.Tensor]]
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, DenoisingMeta | None]:
        """Prepend the denoising queries to the matching queries.

        Args:
            tgt: float [B, Q, hidden] matching content (:meth:`matching_content`).
            anchors: float [B, Q, 4] matching anchors (logits of normalised cxcywh).
            targets: per image labels int64 [T] and boxes float [T, 4] normalised cxcywh.

        Returns tgt [B, D + Q, hidden], anchors [B, D + Q, 4], the self-attention mask bool [D + Q, D + Q]
        (True = may attend) and the :class:`DenoisingMeta`; when no image has a target, the inputs
        unchanged, None and None.
        """
        if len(targets) != tgt.shape[0]:
            raise ValueError(f"targets has {len(targets)} entries for a batch of {tgt.shape[0]} images")
        counts = [len(t["labels"]) for t in targets]
        group_size = max(counts, default=0)
        if group_size == 0:
            return tgt, anchors, None, None
        batch, num_queries, hidden = tgt.shape
        meta = DenoisingMeta(self.num_groups, group_size)
        device = tgt.device
        # Padding queries: label 0 embedding would leak a class; they get the "unknown" label and a
        # centred box, and nothing supervises them.
        labels = torch.full((batch, self.num_groups, group_size), self.num_classes, dtype=torch.int64, device=device)
        boxes = torch.tensor([0.5, 0.5, 0.5, 0.5], device=device).repeat(batch, self.num_groups, group_size, 1)
        for index, (target, count) in enumerate(zip(targets, counts)):
            if count == 0:
                continue
            true_labels = target["labels"].to(device).repeat(self.num_groups)  # [G · T], group-major
            true_boxes = target["boxes"].to(device=device, dtype=torch.float32).repeat(self.num_groups, 1)
            noised_labels, noised_boxes = self.noise(true_labels, true_boxes)
            labels[index, :, :count] = noised_labels.view(self.num_groups, count)
            boxes[index, :, :count] = noised_boxes.view(self.num_groups, count, 4)
        dn_tgt = self._content(labels.flatten(1), 1.0).to(tgt.dtype)  # [B, D, hidden]
        dn_anchors = inverse_sigmoid(boxes.flatten(1, 2)).to(anchors.dtype)  # [B, D, 4]
        mask = denoising_attention_mask(self.num_groups, group_size, num_queries, device)
        return torch.cat([dn_tgt, tgt], dim=1), torch.cat([dn_anchors, anchors], dim=1), mask, meta
