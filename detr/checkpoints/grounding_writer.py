"""This project's :class:`~detr.models.grounding.model.GroundingDINO` → a transformers (MM-)Grounding DINO directory,
the inverse of :func:`detr.checkpoints.grounding.read_grounding`: a fine-tuned model written where every reader of
the released models (this project's loader and commands, transformers' ``from_pretrained``) takes it.

The weights go through the same key table (:data:`detr.checkpoints.grounding.GROUNDING_KEYS`) the other way; a
shared head (``decoder_bbox_embed_share``, ``decoder_cls_embed_share``) is written once, as ``*.0``, as transformers
writes it. config.json and the tokenizer and processor files are copied from the directory the model was read from
(the sizes are the same); ``id2label`` names the prompt's phrases when a fine-tune gives them.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from detr.checkpoints.formats import ExportError
from detr.checkpoints.grounding import _keys
from detr.checkpoints.huggingface import import_safetensors, read_json
from detr.models.grounding.model import GroundingDINO

#: The engine's spelling of an attention's separate projections (``q_proj`` ...) → transformers' Grounding DINO's
#: (``query``, ``key``, ``value``), the inverse of the table's ``read_spelling``.
_WRITE_SPELLING = tuple((rf"(text_enhancer_layer\.self_attn|decoder\.layers\.\d+\.(?:self_attn|encoder_attn_text))"
                         rf"\.{short}_proj\.", rf"\1.{name}.") for short, name in (("q", "query"), ("k", "key"),
                                                                                      ("v", "value")))
#: The files of a transformers directory besides its weights that a copy keeps.
_COPIED = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
           "processor_config.json", "preprocessor_config.json")


def write_grounding_directory(model: GroundingDINO, directory: str | Path, *, like: str | Path,
                              phrases: Sequence[str] | None = None) -> Path:
    """Write ``model`` as a transformers directory at ``directory`` (created; files there are replaced): its weights
    as ``model.safetensors`` in transformers' names, config.json and the tokenizer and processor files of ``like``
    (the directory it was read from), with ``id2label`` / ``label2id`` the prompt's ``phrases`` when given.

    Raises :class:`ExportError` when ``like`` has no config.json or a weight has no counterpart in transformers'."""
    like, directory = Path(like), Path(directory)
    if not (like / "config.json").is_file():
        raise ExportError(f"{like} has no config.json: write_grounding_directory copies the config and tokenizer of "
                          "the transformers directory the model was read from")
    config = model.config
    table = dataclasses.replace(_keys(config.backbone != "swin"), write_spelling=_WRITE_SPELLING)
    shared = {"bbox_embed": config.share_box_heads, "class_embed": config.share_class_heads}
    state = {key: value for key, value in model.state_dict().items()
             if not ((match := re.match(r"(bbox_embed|class_embed)\.(\d+)\.", key)) and shared[match[1]]
                     and match[2] != "0")}
    weights = table.to_theirs(state)
    directory.mkdir(parents=True, exist_ok=True)
    for name in _COPIED:
        if (like / name).is_file() and (like / name).resolve() != (directory / name).resolve():
            shutil.copyfile(like / name, directory / name)
    if phrases is not None:
        values = read_json(directory / "config.json")
        values["id2label"] = {str(index): phrase for index, phrase in enumerate(phrases)}
        values["label2id"] = {phrase: index for index, phrase in enumerate(phrases)}
        (directory / "config.json").write_text(json.dumps(values, indent=2) + "\n")
    import_safetensors().save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory
