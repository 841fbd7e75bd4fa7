"""Start a model from another model's weights (``--model.init_checkpoint``): every tensor that fits, and the class
heads' rows by class name.

A fine-tune's data rarely has the checkpoint's classes in the checkpoint's order: some are new, some are the
checkpoint's under other ids, a few are dropped. The rows of every class-indexed tensor (the class heads of
each decoder layer and of the encoder's proposals, a denoising label embedding; :func:`class_rows` finds them
for any family) are therefore carried by name: a class the checkpoint knows starts from its trained row, a new
class from the model's fresh initialisation, and the rows after the classes ("no object", a padding row) carry
over as they are. This is what D-FINE's authors advise their users to do by hand ("modify class mappings" to
keep the pre-trained classes), here done from the names both sides record. ``init_classes``:

- ``"by_name"`` (default): as above, when both the checkpoint and the data name their classes; otherwise as
  ``"by_label"``.
- ``"by_label"``: rows by position where the shapes agree (label i of the data takes the checkpoint's row i),
  the whole tensor fresh where they do not (the authors' DETR FAQ recipe).
- ``"fresh"``: every class row starts from the model's initialisation; the rows after the classes carry over.

Where the names make ``by_name`` ambiguous (a name twice on one side), :func:`check_class_match` refuses the
fine-tune with :class:`ClassMatchError`, naming the fix; :func:`class_report` is the line a run logs of what was kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from detr.categories import UNUSED_NAME, CategoryMap, ambiguous_class_names, class_name_key
from detr.checkpoints.formats import CheckpointContents, CheckpointError, is_deformable_state_dict
from detr.models.build import build_detr
from detr.models.config import ModelConfig
from detr.models.family import family_named

InitClasses = Literal["by_name", "by_label", "fresh"]

#: The repository's configs/ (present in a source checkout), where each family's YAML files are.
_CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def checkpoint_family(contents: CheckpointContents) -> str | None:
    """The family name (``config.family``) of a checkpoint, from its own config (this project's checkpoints, every
    transformers directory, the real-time families' and the rfdetr package's files) or its layout (the authors'
    DETR and Deformable DETR files); None for a layout none of these has."""
    if contents.config is not None:
        return contents.config.family
    state_dict = contents.state_dict
    if is_deformable_state_dict(state_dict):
        return "deformable"
    if "class_embed.weight" in state_dict or any(key.startswith("detr.") for key in state_dict):
        return "detr"
    return None


def _family_configs(family: str) -> list[str]:
    """configs/*.yaml that build ``family`` (their ``family:`` line, or the old ``architecture:``; DETR's may have
    none)."""
    if not _CONFIGS.is_dir():
        return []
    found = []
    for path in sorted(_CONFIGS.glob("*.yaml")):
        stated = re.search(r"^\s*(?:model\.detr\.)?(?:architecture|family):\s*(\w+)", path.read_text(),
                           re.MULTILINE)
        if (stated.group(1) if stated else "detr") == family:
            found.append(f"configs/{path.name}")
    return found


def check_same_family(contents: CheckpointContents, config: ModelConfig, source: str) -> None:
    """Raise ``ValueError`` when the checkpoint ``source`` is of another family than the model ``config``
    builds, naming both and the configs that build the checkpoint's (a key-by-key mismatch names neither)."""
    theirs, ours = checkpoint_family(contents), config.family
    if theirs is None or theirs == ours:
        return
    their_title, our_title = family_named(theirs).title, family_named(ours).title
    configs = _family_configs(theirs)
    where = f"one of its configs ({', '.join(configs)})" if configs else f"a {their_title} config"
    raise ValueError(f"init_checkpoint {source} is a checkpoint of {their_title}, but the config builds "
                     f"{our_title} (family {ours!r}): start from {where}, or set --model.detr to a {their_title} "
                     f"config (family {theirs!r}); or pass a checkpoint of {our_title}")


def class_rows(config: ModelConfig) -> dict[str, int]:
    """The state-dict tensors of ``build_detr(config)`` whose first dimension is indexed by class: key → the rows
    after the classes' (1: a softmax head's "no object" or a denoising embedding's padding row; 0: none).

    Read off a twin with one class more, both built on the meta device (no memory, no initialisation), so that
    every family's heads are found without naming them."""
    config = config.replace(pretrained_backbone=False)  # nothing to download for a twin
    with torch.device("meta"):
        own = build_detr(config).state_dict()
        more = build_detr(config.replace(num_classes=config.num_classes + 1)).state_dict()
    return {key: tensor.shape[0] - config.num_classes for key, tensor in own.items()
            if more[key].shape != tensor.shape}


class ClassMatchError(CheckpointError):
    """init_checkpoint's classes cannot be matched to the data's the way ``init_classes`` asks (the message names the
    classes and the fix)."""


def check_class_match(own_map: CategoryMap | None, source_map: CategoryMap | None, init_classes: InitClasses
                      ) -> None:
    """Raise :class:`ClassMatchError` when ``init_classes`` is ``by_name`` and the data's classes (``own_map``) cannot
    be matched to the checkpoint's (``source_map``) by name (:func:`detr.categories.ambiguous_class_names`); a side
    that names no classes (None) is matched by label, where names do not matter."""
    if init_classes != "by_name" or own_map is None or source_map is None:
        return
    problem = ambiguous_class_names(list(own_map.names), list(source_map.names))
    if problem is not None:
        raise ClassMatchError(f"--model.init_checkpoint: {problem}")


@dataclass
class InitialWeights:
    """What :func:`initial_state` made of a checkpoint for a model.

    state: the tensors to load (a subset of the model's keys: a tensor left out keeps its initialisation).
    fresh_tensors: keys left out because their shape does not fit (and no class rows could be carried).
    carried_classes: the model's class names whose rows come from the checkpoint's (by name or label).
    fresh_classes: the model's class names whose rows start from the initialisation.
    rows_by: how the class rows were matched: "name", "label" (asked for, or because a side names no classes),
        "fresh".
    """

    state: dict[str, torch.Tensor]
    fresh_tensors: list[str] = field(default_factory=list)
    carried_classes: list[str] = field(default_factory=list)
    fresh_classes: list[str] = field(default_factory=list)
    rows_by: Literal["name", "label", "fresh"] = "name"


def class_report(initial: InitialWeights, source: str, init_classes: InitClasses) -> str:
    """The line a fine-tune logs of its classes: how many (and which) start from ``source``'s rows and how they were
    matched, how many (and which) start fresh."""
    def listed(names: list[str]) -> str:
        return ", ".join(names[:8] + (["..."] if len(names) > 8 else []))

    how = {"name": "by name", "fresh": "init_classes=fresh",
           "label": "by label" if init_classes == "by_label" else "by label: a side names no classes"}[initial.rows_by]
    kept = f"{how}: {listed(initial.carried_classes)}" if initial.carried_classes else how
    fresh = f": {listed(initial.fresh_classes)}" if initial.fresh_classes else ""
    return (f"init_checkpoint: {len(initial.carried_classes)} classes start from {source}'s rows ({kept}), "
            f"{len(initial.fresh_classes)} fresh{fresh}")


def _names(category_map: CategoryMap | None, num_classes: int) -> list[str | None] | None:
    """Each label's :func:`class_name_key`, or None when the map does not describe these ``num_classes``."""
    if category_map is None or category_map.num_classes != num_classes:
        return None
    return [class_name_key(name) for name in category_map.names]


def class_sources(own_names: list[str | None] | None, their_names: list[str | None] | None, own_count: int,
                  their_count: int, init_classes: InitClasses) -> list[int | None] | None:
    """For each of the model's labels, the checkpoint's label whose row it starts from (None: fresh); None when
    no row is carried by class (``by_label`` with another class count: the tensors then start fresh whole)."""
    if init_classes == "fresh":
        return [None] * own_count
    if init_classes == "by_name" and own_names is not None and their_names is not None:
        theirs = {name: label for label, name in enumerate(their_names) if name is not None}
        return [theirs.get(name) if name is not None else None for name in own_names]
    if own_count == their_count:
        return list(range(own_count))
    return None


def initial_state(source: dict[str, torch.Tensor], source_map: CategoryMap | None, config: ModelConfig,
                  own: dict[str, torch.Tensor], own_map: CategoryMap | None,
                  init_classes: InitClasses = "by_name") -> InitialWeights:
    """The tensors of ``source`` (a checkpoint whose classes ``source_map`` names) to load into the model that
    ``config`` builds (its current state ``own``, its classes ``own_map``), the class rows as ``init_classes``
    says (module docstring). The keys must already agree (the caller checks the layout)."""
    rows = class_rows(config)
    own_count = config.num_classes
    their_count = next((source[key].shape[0] - extra for key, extra in rows.items() if key in source), own_count)
    own_names, their_names = _names(own_map, own_count), _names(source_map, their_count)
    check_class_match(own_map if own_names else None, source_map if their_names else None, init_classes)
    sources = class_sources(own_names, their_names, own_count, their_count, init_classes)
    rows_by = "fresh" if init_classes == "fresh" else \
        "name" if init_classes == "by_name" and own_names is not None and their_names is not None else "label"
    state, fresh = {}, []
    for key, tensor in source.items():
        extra = rows.get(key)
        if extra is None or sources is None:
            if tensor.shape == own[key].shape:
                state[key] = tensor
            else:
                fresh.append(key)
            continue
        if tensor.shape[1:] != own[key].shape[1:] or tensor.shape[0] != their_count + extra:
            fresh.append(key)
            continue
        merged = own[key].detach().clone()
        for label, their_label in enumerate(sources):
            if their_label is not None:
                merged[label] = tensor[their_label]
        merged[own_count:] = tensor[their_count:]  # "no object", padding: not a class
        state[key] = merged
    names = list(own_map.names) if own_map is not None and own_map.num_classes == own_count else \
        [str(label) for label in range(own_count)]
    if sources is None:  # by label with another class count: the class tensors start fresh whole
        sources = [None] * own_count
    carried = [n for n, s in zip(names, sources) if s is not None and n != UNUSED_NAME]
    started = [n for n, s in zip(names, sources) if s is None and n != UNUSED_NAME]
    return InitialWeights(state, sorted(fresh), carried, started, rows_by)
