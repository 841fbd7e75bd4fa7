"""A prompted model (an open-vocabulary detector: Grounding DINO) with one prompt fixed, for what takes images
only: an exported file (``detr-export --prompt``), a closed-set deployment. The prompt is read as the commands read
it (:func:`detr.inference.grounding.prompt_text`), tokenised by the model's tokenizer, and its phrases become the
classes (:meth:`detr.models.grounding.model.GroundingDINO.with_prompt`)."""

from __future__ import annotations

from collections.abc import Sequence

from detr.inference.grounding import prompt_phrases, prompt_text
from detr.models.detector import Detector


def fix_prompt(model: Detector, prompt: str | Sequence[str]) -> Detector:
    """``model`` (``prompted``) with ``prompt`` ("a cat. a remote control." or ["a cat", "a remote control"])
    fixed: a detector of one class per phrase, named by the phrases (``meta.category_map``), that takes images only.

    Raises ValueError for a model that reads no prompt, one without a tokenizer, or an empty or repeated phrase."""
    if not model.prompted:
        raise ValueError(f"{type(model).__name__} reads no prompt (its classes are fixed): leave the prompt out")
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise ValueError("the model has no tokenizer to read the prompt with: load it from a directory with its "
                         "tokenizer files (tokenizer.json or vocab.txt)")
    text = prompt_text(prompt)
    tokens = tokenizer(text, return_tensors="pt")
    return model.with_prompt(tokens["input_ids"], tokens["attention_mask"], prompt_phrases(text))
