"""The set loss of a grounding model (Grounding DINO): targets named by the prompt's phrases instead of classes.

A prompt "circle. square." names one phrase per category (the data set's category names, in label order). A
target's class target is then its phrase's tokens: ``token_map`` [T, N], 1 at the tokens of each target's phrase
(:func:`phrase_token_maps`), which the matcher (:func:`detr.loss.focal.focal_token_cost`) and the criterion's class
term (:meth:`detr.loss.criterion.SetCriterion.token_loss_labels`) read in place of the one-hot class. Everything
else is the set loss of the other families: the box terms, every decoder layer's, and the selected encoder
proposals' (:class:`detr.loss.parts.ProposalLoss`), with the weights of :mod:`detr.models.grounding.recipe`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from detr.loss.criterion import SetCriterion
from detr.loss.matcher import HungarianMatcher
from detr.loss.parts import ProposalLoss
from detr.loss.terms import Targets
from detr.models.grounding.config import GroundingConfig
from detr.models.grounding.recipe import RECIPE
from detr.models.grounding.text import phrase_token_mask
from detr.models.recipe import LossRecipe


def phrase_token_maps(input_ids: torch.Tensor, columns: int) -> torch.Tensor:
    """One prompt's input_ids int64 [N] → float [K, columns]: row k is 1 at the tokens of the prompt's k-th phrase
    (a run of tokens between separators: [CLS], [SEP], ".", "?", [PAD]), 0 elsewhere and beyond N. ``columns``: the
    model's logits per query (``max_text_len``); a prompt longer than that raises ValueError."""
    if input_ids.dim() != 1:
        raise ValueError(f"phrase_token_maps reads one prompt's input_ids [N], got shape {list(input_ids.shape)}")
    if len(input_ids) > columns:
        raise ValueError(f"the prompt has {len(input_ids)} tokens but the model reads at most {columns} "
                         "(max_text_len): shorten the category names or train on fewer categories at a time")
    return phrase_token_mask(input_ids, columns).float()


def check_phrase_labels(targets: Targets, phrases: int) -> None:
    """Raise ValueError if a target's label has no phrase among the prompt's ``phrases``."""
    for target in targets:
        labels = target["labels"]
        if len(labels) and int(labels.max()) >= phrases:
            raise ValueError(f"a target has label {int(labels.max())} but the prompt has {phrases} phrases: the "
                             "prompt must name every category of the data, one phrase each, in label order")


def with_token_maps(targets: Targets, token_maps: torch.Tensor) -> Targets:
    """``targets`` (per image labels int64 [T]: the phrase of each box, boxes) with ``token_map`` [T, columns]:
    each target's row of ``token_maps`` [K, columns] (:func:`phrase_token_maps`). A label without a phrase raises
    ValueError where the labels are on the CPU (:func:`check_phrase_labels`; on a GPU the caller checks them before
    the batch moves there, so that a training step does not wait to read them back)."""
    if all(target["labels"].device.type == "cpu" for target in targets):
        check_phrase_labels(targets, len(token_maps))
    return [{**target, "token_map": token_maps.to(target["labels"].device)[target["labels"]]} for target in targets]


def build_grounding_criterion(config: GroundingConfig, recipe: LossRecipe | None = None, *, aux_loss: bool = True,
                              **changes: Any) -> SetCriterion:
    """The criterion of a Grounding DINO model built from ``config``: the sigmoid focal set loss over prompt
    tokens, on every decoder layer (``aux_loss``) and the selected encoder proposals, with ``recipe`` (None, or a
    field left None: :data:`detr.models.grounding.recipe.RECIPE`'s) and ``changes`` (its fields) applied.

    The targets it is called with carry ``token_map`` (:func:`with_token_maps`). Its terms: loss_ce, loss_bbox,
    loss_giou (and ``_i`` per earlier layer, ``_enc`` for the proposals), cardinality_error, class_error (a matched
    query whose best token is not its target's)."""
    try:
        recipe = dataclasses.replace(recipe or LossRecipe(), **changes).over(RECIPE.loss)
    except TypeError as error:
        raise ValueError(f"build_grounding_criterion: {error}; the changes are fields of "
                         "detr.models.recipe.LossRecipe") from None
    if recipe.class_loss != "focal" or recipe.matchability:
        raise ValueError(f"class_loss {recipe.class_loss!r}: a grounding model trains the sigmoid focal loss over its "
                         "prompt's tokens; set class_loss 'focal' and matchability false")
    focal = {"focal_alpha": recipe.focal_alpha, "focal_gamma": recipe.focal_gamma}
    weights = {"loss_ce": recipe.loss_ce, "loss_bbox": recipe.loss_bbox, "loss_giou": recipe.loss_giou}
    matcher = HungarianMatcher(cost_class=recipe.cost_class, cost_bbox=recipe.cost_bbox, cost_giou=recipe.cost_giou,
                               class_head="sigmoid", **focal)
    parts = [ProposalLoss(**weights, class_agnostic=recipe.proposals != "selected")]
    return SetCriterion(config.num_classes, matcher, **weights, num_decoder_layers=config.num_decoder_layers if aux_loss
                        else 1, class_head="sigmoid", **focal, parts=parts)
