"""The authors' DETR training step (facebookresearch/detr), run beside ours on the same card and batches.

A checkout of https://github.com/facebookresearch/detr is given by path (it is not part of this
repository: bring it as files, e.g. ``git clone https://github.com/facebookresearch/detr .authors/detr``).
:class:`AuthorsTrainer` builds their model, criterion and optimizer as their ``main.py`` does with its
default arguments (R50, 100 queries, auxiliary losses, AdamW 1e-4 / backbone 1e-5, weight decay 1e-4)
and its :meth:`~AuthorsTrainer.step` is the body of their ``engine.train_one_epoch``: forward,
criterion, the weighted sum, ``reduce_dict`` and ``.item()`` for the log, backward, gradient clipping at
0.1 and the optimizer step. Nothing of theirs is changed; the one thing set from outside is their
backbone's ``pretrained`` flag (off: no ImageNet download, and ours is timed from random weights too).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import torch

from detr.models.detr_family import DetrConfig


def authors_args(config: DetrConfig, device: torch.device) -> argparse.Namespace:
    """Their ``main.py`` arguments for our ``config`` (their defaults where ours are the paper's)."""
    return argparse.Namespace(
        dataset_file="coco", device=str(device), frozen_weights=None, masks=False, aux_loss=True,
        backbone=config.backbone, dilation=False, position_embedding="sine", lr_backbone=1e-5,
        hidden_dim=config.hidden_dim, nheads=config.num_heads, enc_layers=config.num_encoder_layers,
        dec_layers=config.num_decoder_layers, dim_feedforward=config.dim_feedforward, dropout=0.1,
        num_queries=config.num_queries, pre_norm=False,
        set_cost_class=1.0, set_cost_bbox=5.0, set_cost_giou=2.0,
        bbox_loss_coef=5.0, giou_loss_coef=2.0, eos_coef=0.1, mask_loss_coef=1.0, dice_loss_coef=1.0)


def import_authors(checkout: str | Path):
    """Their top-level packages ``models`` and ``util`` from ``checkout``, with a clear error when absent."""
    checkout = Path(checkout)
    if not (checkout / "models" / "detr.py").is_file():
        raise SystemExit(f"{checkout}: not a checkout of facebookresearch/detr (no models/detr.py); "
                         "clone https://github.com/facebookresearch/detr there")
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    models = importlib.import_module("models")
    backbone = importlib.import_module("models.backbone")
    backbone.is_main_process = lambda: False  # their pretrained= flag: no ImageNet download here
    return models, importlib.import_module("util.misc")


class AuthorsTrainer:
    """Their model, criterion, optimizer and training step. Batches are ours: (images, mask, targets)."""

    def __init__(self, checkout: str | Path, config: DetrConfig, device: torch.device, seed: int = 0) -> None:
        models, self.misc = import_authors(checkout)
        torch.manual_seed(seed)
        args = authors_args(config, device)
        self.model, self.criterion, _ = models.build_model(args)
        self.model.to(device).train()
        self.criterion.to(device).train()
        named = list(self.model.named_parameters())
        param_dicts = [  # main.py's two groups
            {"params": [p for n, p in named if "backbone" not in n and p.requires_grad]},
            {"params": [p for n, p in named if "backbone" in n and p.requires_grad], "lr": args.lr_backbone},
        ]
        self.optimizer = torch.optim.AdamW(param_dicts, lr=1e-4, weight_decay=1e-4)
        self.device = device

    def step(self, batch: tuple) -> torch.Tensor:
        images, mask, targets = batch
        samples = self.misc.NestedTensor(images, mask)
        outputs = self.model(samples)
        loss_dict = self.criterion(outputs, targets)
        weight_dict = self.criterion.weight_dict
        losses = sum(loss_dict[k] * weight_dict[k] for k in loss_dict if k in weight_dict)
        reduced = self.misc.reduce_dict(loss_dict)
        loss_value = sum(v * weight_dict[k] for k, v in reduced.items() if k in weight_dict).item()
        self.optimizer.zero_grad()
        losses.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 0.1)
        self.optimizer.step()
        return torch.tensor(loss_value)
