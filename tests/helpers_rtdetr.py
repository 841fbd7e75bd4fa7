"""Shared by the RT-DETR tests: tiny transformers RT-DETR / RT-DETRv2 models with random weights, and real
photos at a small square size (hf_model imports transformers: call it from tests that skip without it)."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from detr.models.outputs import LayerOutput
from tests.helpers import REPO, randomise

#: A small decoder and encoder (widths 64, 4 heads) on the real ResNet-vd depths, 3 decoder layers as R18's.
TINY = {"encoder_hidden_dim": 64, "d_model": 64, "encoder_ffn_dim": 96, "decoder_ffn_dim": 128,
        "decoder_in_channels": [64] * 3, "decoder_layers": 3, "num_queries": 30, "encoder_attention_heads": 4,
        "decoder_attention_heads": 4}
BACKBONES = {"resnet18": ("basic", [2, 2, 2, 2], [64, 128, 256, 512]),
             "resnet50": ("bottleneck", [3, 4, 6, 3], [256, 512, 1024, 2048])}


def square_photos(side: int = 128) -> torch.Tensor:
    """chelsea and astronaut, resized to side × side (PIL bilinear) and scaled to [0, 1]: [2, 3, side, side]."""
    images = [np.asarray(Image.open(REPO / "data" / "photos" / name).convert("RGB").resize((side, side),
                                                                                            Image.BILINEAR))
              for name in ("chelsea.png", "astronaut.png")]
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255


def hf_model(backbone: str = "resnet18", num_labels: int = 80, *, version: int = 1, seed: int = 0,
             backbone_options: dict | None = None, **options):
    """A transformers RT-DETR (version 1) or RT-DETRv2 (2) with random weights everywhere (transformers' init
    starts every query at the same box), RT-DETRv2's 1 / points buffer kept as it is; ``backbone_options`` go to
    its RTDetrResNetConfig."""
    import transformers

    layer_type, depths, widths = BACKBONES[backbone]
    resnet = transformers.RTDetrResNetConfig(layer_type=layer_type, depths=depths, hidden_sizes=widths,
                                             out_indices=[2, 3, 4], **(backbone_options or {}))
    config_class, model_class = ((transformers.RTDetrConfig, transformers.RTDetrForObjectDetection) if version == 1
                                 else (transformers.RTDetrV2Config, transformers.RTDetrV2ForObjectDetection))
    config = config_class(backbone_config=resnet, encoder_in_channels=widths[1:], num_labels=num_labels,
                          id2label={i: f"thing {i}" for i in range(num_labels)}, **{**TINY, **options})
    torch.manual_seed(seed)
    model = model_class(config).eval()
    randomise(model, seed)
    if version == 2:
        with torch.no_grad():
            for layer in model.model.decoder.layers:
                layer.encoder_attn.n_points_scale.fill_(1.0 / config.decoder_n_points)
    return model


#: RT-DETR's (and D-FINE's) matching costs; the loss weights (VFL 1, L1 5, GIoU 2) are build_criterion's defaults
RECIPE = {"cost_class": 2.0, "cost_bbox": 5.0, "cost_giou": 2.0}


def loss_targets(num_classes: int) -> list[dict[str, torch.Tensor]]:
    """Targets of three images for the loss tests (3, 0 and 2 objects: an image without targets too)."""
    generator = torch.Generator().manual_seed(3)
    targets = []
    for count in (3, 0, 2):  # an image without targets too
        centres = torch.rand(count, 2, generator=generator) * 0.5 + 0.25
        sizes = torch.rand(count, 2, generator=generator) * 0.3 + 0.1
        targets.append({"labels": torch.randint(0, num_classes, (count,), generator=generator),
                        "boxes": torch.cat([centres, sizes], 1)})
    return targets


def random_layer(num_classes: int, batch: int, queries: int, generator: torch.Generator) -> LayerOutput:
    """Logits around the focal prior and boxes near the targets' region (so that the IoUs are not all 0)."""
    logits = torch.randn(batch, queries, num_classes, generator=generator) - 2
    centres = torch.rand(batch, queries, 2, generator=generator) * 0.6 + 0.2
    sizes = torch.rand(batch, queries, 2, generator=generator) * 0.4 + 0.05
    return LayerOutput(logits, torch.cat([centres, sizes], -1))


def transformers_loss_arguments(outputs, targets: list[dict[str, torch.Tensor]]) -> dict:
    """The keyword arguments of transformers' RT-DETR, D-FINE and DEIMv2 losses for our ``outputs`` (a
    :class:`~detr.models.outputs.DetectorOutput` with denoising queries and proposals, and for D-FINE's family its
    distributions), laid out as transformers' models hand them over: every layer's denoising queries ahead of the
    selected ones, b⁰ per layer; ``config`` and ``device`` are the caller's."""
    from detr.loss.parts import denoising_indices

    denoising, meta = outputs.denoising, outputs.denoising.meta
    dn_layers, layers = [*denoising.aux, denoising], [*outputs.aux, outputs]
    classes = torch.stack([torch.cat([d.logits, m.logits], 1) for d, m in zip(dn_layers, layers)], 1)  # [B, L, D+Q, K]
    coords = torch.stack([torch.cat([d.boxes, m.boxes], 1) for d, m in zip(dn_layers, layers)], 1)
    arguments = {
        "logits": classes[:, -1], "pred_boxes": coords[:, -1], "outputs_class": classes, "outputs_coord": coords,
        "labels": [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets],
        "enc_topk_logits": outputs.proposals.logits, "enc_topk_bboxes": outputs.proposals.boxes,
        "denoising_meta_values": {"dn_positive_idx": [queries for queries, _ in denoising_indices(meta, targets)],
                                  "dn_num_group": meta.num_groups,
                                  "dn_num_split": [meta.num_queries, outputs.logits.shape[1]]}}
    if outputs.distributions is not None:
        corners = torch.cat([denoising.distributions.corners, outputs.distributions.corners], 2).transpose(0, 1)
        initial = torch.cat([denoising.distributions.initial, outputs.distributions.initial], 1)
        arguments.update(predicted_corners=corners,
                         initial_reference_points=initial[:, None].expand(-1, len(layers), -1, -1))
    return arguments


def our_term_name(name: str, layers: int, class_term: str = "loss_vfl") -> str:
    """transformers' term name → ours (its ``class_term`` is our loss_ce; its aux layer ``layers`` - 1 is our
    encoder proposals; its denoising layers count every layer, ours name the last one plain)."""
    name = name.replace(class_term, "loss_ce")
    if name.endswith(f"_aux_{layers - 1}"):
        return name.replace(f"_aux_{layers - 1}", "_enc")
    if name.endswith(f"_dn_{layers - 1}"):
        return name.replace(f"_dn_{layers - 1}", "_dn")
    return name.replace("_aux_", "_")
