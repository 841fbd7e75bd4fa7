"""The small multi-layer perceptron DETR's heads use (box head: hidden → hidden → hidden → 4)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    """``num_layers`` linear layers with ``activation`` (ReLU; DEIM's heads, DEIMv2's query positions: SiLU)
    between them; parameters ``layers.{i}.*`` (the authors' layout)."""

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, num_layers: int, *,
                 activation: Callable[[torch.Tensor], torch.Tensor] = F.relu) -> None:
        super().__init__()
        self.activation = activation
        dims = [input_dim] + [hidden_dim] * (num_layers - 1)
        self.layers = nn.ModuleList(nn.Linear(i, o) for i, o in zip(dims, dims[1:] + [output_dim]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index, layer in enumerate(self.layers):
            x = layer(x) if index == len(self.layers) - 1 else self.activation(layer(x))
        return x
