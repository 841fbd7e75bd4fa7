"""One engine for renaming checkpoint keys between another implementation's layout ("theirs": transformers', the
authors') and this project's ("ours"), in both directions. Each reader and writer in ``detr/checkpoints/`` is a
table over it (a :class:`KeyMap`), as litgpt's ``weight_map``s over one ``qkv_reassemble``.

A table holds, in order of application:

- ``read_spelling`` / ``write_spelling``: regex substitutions that bring their keys to one spelling before they are
  looked up (transformers 5's in-memory names → the names on disk), and back to the file's own after writing;
- ``drop``: keys that have no counterpart on purpose (:class:`Drop`, each with its reason);
- ``buffers``: buffers their files hold and this project computes from the configuration (:class:`Buffer`): checked
  against the configuration when read, then dropped; computed when written;
- ``fuse``: attention modules whose q, k and v projections (theirs: ``{q,k,v}_proj.{weight,bias}``) are one
  ``in_proj_{weight,bias}`` here (:class:`Fuse`): concatenated when read, split when written;
- ``renames``: ordered (theirs, ours) key templates (:class:`Rename`), the first that matches a key's start wins; the
  rest of the key is carried over. A ``{}`` in a template is an index, the same on both sides (in order); a
  ``{name}`` is a :class:`Field` of the table's ``fields`` (an index counted from 1 on one side, a letter for a
  number, ``conv`` for ``convolution``), or an index where the table names no such field;
- ``tied``: modules of ours that their files may leave out, being tied to the first of their kind (:class:`Tied`).

Two keys of theirs that map to one of ours must hold the same tensor (a tied copy). Keys that map nowhere raise one
:class:`CheckpointError` naming the file and the keys; every written key must read back to the key it came from.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import torch

from detr.checkpoints.formats import CheckpointError, ExportError

Side = Literal["theirs", "ours"]


@dataclass(frozen=True)
class Field:
    """The values a named placeholder takes on each side (regexes) and the conversion between them."""

    theirs: str = r"\d+"
    ours: str = r"\d+"
    to_ours: Callable[[str], str] = str
    to_theirs: Callable[[str], str] = str

    @staticmethod
    def shifted(by: int) -> Field:
        """An index that is ``by`` more on our side (torchvision's ``layer1``, ``conv1`` for transformers' 0)."""
        return Field(to_ours=lambda value: str(int(value) + by), to_theirs=lambda value: str(int(value) - by))

    @staticmethod
    def named(pairs: Mapping[str, str]) -> Field:
        """A word for a word: ``pairs`` maps their value to ours (e.g. {"convolution": "conv"})."""
        back = {ours: theirs for theirs, ours in pairs.items()}

        def alternatives(values: Sequence[str]) -> str:
            return "|".join(re.escape(value) for value in sorted(values, key=len, reverse=True))

        return Field(alternatives(list(pairs)), alternatives(list(back)), pairs.__getitem__, back.__getitem__)

    @staticmethod
    def choice(*values: str) -> Field:
        """One of ``values``, spelled alike on both sides."""
        return Field.named({value: value for value in values})


#: A placeholder without a field of its own: a non-negative index, the same on both sides.
INDEX = Field()
_PLACEHOLDER = re.compile(r"\{(\w*)\}")


@dataclass(frozen=True)
class Rename:
    """Their key start ↔ ours (templates, see the module's docstring)."""

    theirs: str
    ours: str


@dataclass(frozen=True)
class Fuse:
    """An attention module: theirs ``<theirs>{q,k,v}_proj.{weight,bias}`` ↔ ours ``<ours>in_proj_{weight,bias}``
    (q, k, v stacked along the output rows, as ``nn.MultiheadAttention`` stores them). Templates as
    :class:`Rename`'s."""

    theirs: str
    ours: str


@dataclass(frozen=True)
class Drop:
    """Keys (a regex matched at the key's start) that are left out on ``side``: theirs when reading, ours when
    writing, or both; ``reason`` says why they have no counterpart."""

    pattern: str
    reason: str
    side: Literal["theirs", "ours", "both"] = "theirs"


@dataclass(frozen=True)
class Buffer:
    """A buffer their files hold that this project computes: ``theirs`` (a template) is checked equal to
    ``value(context)`` when read (``what`` names the value in the error, ``{context}`` the context) and dropped;
    when written, one is computed for each of our keys that matches ``ours_anchor`` (same placeholders)."""

    theirs: str
    ours_anchor: str
    value: Callable[[Any], torch.Tensor]
    what: str


@dataclass(frozen=True)
class Tied:
    """Modules ``ours`` (a prefix with one ``{}``: ``class_embed.{}.``) numbered 0 .. ``count(context)`` - 1, of which
    their files may hold only the first (transformers ties them unless they differ): a missing one, expected, is read
    as a copy of module 0; a missing module 0 is refused (``what`` says what the file then is)."""

    ours: str
    count: Callable[[Any], int]
    what: str


class _Template:
    """A key template compiled for one side: ``match`` a key's start, ``format`` values read on the other side."""

    def __init__(self, template: str, side: Side, fields: Mapping[str, Field]) -> None:
        self.template = template
        self.names: list[str] = []
        pattern, position, unnamed = "^", 0, 0
        for found in _PLACEHOLDER.finditer(template):
            name = found.group(1)
            if not name:
                name, unnamed = f"_{unnamed}", unnamed + 1
            self.names.append(name)
            value = getattr(fields.get(name, INDEX), side)
            pattern += re.escape(template[position:found.start()]) + f"(?P<{name}>{value})"
            position = found.end()
        self.pattern = re.compile(pattern + re.escape(template[position:]))
        self.side = side
        self.fields = fields

    def match(self, key: str) -> re.Match[str] | None:
        return self.pattern.match(key)

    def format(self, values: Mapping[str, str], from_side: Side | None = None) -> str:
        """The template with ``values`` (read on ``from_side``: converted through the fields; None: as they are)."""
        names = iter(self.names)

        def value(_: re.Match[str]) -> str:
            name = next(names)
            text = values[name]
            if from_side is not None and from_side != self.side:
                field_ = self.fields.get(name, INDEX)
                text = field_.to_ours(text) if self.side == "ours" else field_.to_theirs(text)
            return text

        return _PLACEHOLDER.sub(value, self.template)


def _compiled(rules: Sequence[Any], fields: Mapping[str, Field]) -> list[tuple[_Template, _Template]]:
    return [(_Template(rule.theirs, "theirs", fields), _Template(rule.ours, "ours", fields)) for rule in rules]


def _respell(key: str, spelling: Sequence[tuple[re.Pattern[str], str]]) -> str:
    for pattern, replacement in spelling:
        key = pattern.sub(replacement, key)
    return key


@dataclass(frozen=True)
class KeyMap:
    """The renames between one family's layout in another implementation's files and this project's (see the
    module's docstring). ``family`` ("D-FINE") and ``source`` (whose layout theirs is: "transformers'", "the
    authors'") name it in errors."""

    family: str
    renames: tuple[Rename, ...]
    source: str = "transformers'"
    fields: Mapping[str, Field] = field(default_factory=dict)
    fuse: tuple[Fuse, ...] = ()
    drop: tuple[Drop, ...] = ()
    buffers: tuple[Buffer, ...] = ()
    tied: tuple[Tied, ...] = ()
    read_spelling: tuple[tuple[str, str], ...] = ()
    write_spelling: tuple[tuple[str, str], ...] = ()

    @cached_property
    def _renames(self) -> list[tuple[_Template, _Template]]:
        return _compiled(self.renames, self.fields)

    @cached_property
    def _fuse(self) -> list[tuple[re.Pattern[str], re.Pattern[str], _Template, _Template]]:
        compiled = []
        for theirs, ours in _compiled(self.fuse, self.fields):
            compiled.append((re.compile(theirs.pattern.pattern + r"(?P<_part>[qkv])_proj\.(?P<_param>weight|bias)$"),
                             re.compile(ours.pattern.pattern + r"in_proj_(?P<_param>weight|bias)$"), theirs, ours))
        return compiled

    @cached_property
    def _buffers(self) -> list[tuple[_Template, _Template, Buffer]]:
        return [(_Template(buffer.theirs, "theirs", self.fields), _Template(buffer.ours_anchor, "ours", self.fields),
                 buffer) for buffer in self.buffers]

    @cached_property
    def _spellings(self) -> tuple[list[tuple[re.Pattern[str], str]], list[tuple[re.Pattern[str], str]]]:
        return ([(re.compile(pattern), replacement) for pattern, replacement in self.read_spelling],
                [(re.compile(pattern), replacement) for pattern, replacement in self.write_spelling])

    def _dropped(self, key: str, side: Side) -> bool:
        return any(rule.side in (side, "both") and re.match(rule.pattern, key) for rule in self.drop)

    # ---------------------------------------------------------------------------------------------- one key

    def our_key(self, key: str) -> str | None:
        """Their key (after ``read_spelling``) → ours by the first rename that matches; None where none does."""
        for theirs, ours in self._renames:
            if match := theirs.match(key):
                return ours.format(match.groupdict(), "theirs") + key[match.end():]
        return None

    def their_key(self, key: str) -> str | None:
        """Our key → theirs (before ``write_spelling``) by the first rename that matches; None where none does."""
        for theirs, ours in self._renames:
            if match := ours.match(key):
                return theirs.format(match.groupdict(), "ours") + key[match.end():]
        return None

    # ---------------------------------------------------------------------------------------------- state dicts

    def to_ours(self, state_dict: Mapping[str, torch.Tensor], where: str | Path, context: Any = None
                ) -> dict[str, torch.Tensor]:
        """Their state dict → this project's: floating-point tensors become float32; q, k, v are fused; buffers
        are checked against ``context`` (what their ``value`` reads: e.g. the points per level) and dropped.

        Raises:
            CheckpointError: naming ``where`` and the keys that map nowhere, a module with only some of q, k, v,
                a buffer that disagrees with the configuration, two copies of one tensor that differ.
        """
        read_spelling, _ = self._spellings
        ours: dict[str, torch.Tensor] = {}
        came_from: dict[str, str] = {}
        parts: dict[str, dict[str, torch.Tensor]] = {}
        unknown: list[str] = []

        def put(key: str, value: torch.Tensor, source: str) -> None:
            if key in ours:
                if ours[key].shape != value.shape or not torch.equal(ours[key], value):
                    raise CheckpointError(f"{where}: {came_from[key]} and {source} hold different values, but "
                                          f"this project keeps one tensor for both ({key}), as the authors' model "
                                          f"does; the file was edited or is not {self.source} {self.family}")
                return
            ours[key], came_from[key] = value, source

        for original, value in state_dict.items():
            key = _respell(original, read_spelling)
            if self._dropped(key, "theirs"):
                continue
            value = value.float() if value.is_floating_point() else value
            if self._checked_buffer(key, original, value, where, context):
                continue
            fused = self._fused_key(key)
            if fused is not None:
                our_key, part = fused
                parts.setdefault(our_key, {})[part] = value
                continue
            our_key = self.our_key(key)
            if our_key is None:
                unknown.append(original)
            else:
                put(our_key, value, original)
        if unknown:
            raise CheckpointError(f"{where}: {len(unknown)} keys have no counterpart in this project's "
                                  f"{self.family} (not {self.source} {self.family}?): {unknown[:10]}")
        for our_key, found in parts.items():
            if set(found) != {"q", "k", "v"}:
                raise CheckpointError(f"{where}: {our_key.rsplit('.', 1)[0]} has only the {sorted(found)} "
                                      f"projections of q, k and v")
            put(our_key, torch.cat([found["q"], found["k"], found["v"]]), our_key)
        for tied in self.tied:
            first = tied.ours.format(0)
            copied = {key[len(first):]: value for key, value in ours.items() if key.startswith(first)}
            if not copied:
                raise CheckpointError(f"{where} has no {first.rstrip('.')}: {tied.what}")
            for index in range(1, tied.count(context)):
                module = tied.ours.format(index)
                if not any(key.startswith(module) for key in ours):
                    ours.update({module + rest: value for rest, value in copied.items()})
        return ours

    def _checked_buffer(self, key: str, original: str, value: torch.Tensor, where: str | Path, context: Any) -> bool:
        for theirs, _, buffer in self._buffers:
            if theirs.pattern.fullmatch(key):
                expected = buffer.value(context)
                if value.shape != expected.shape or not torch.allclose(value, expected.to(value.dtype)):
                    raise CheckpointError(f"{where}: {original} is not {buffer.what.format(context=context)} "
                                          f"(config.json and the weights disagree)")
                return True
        return False

    def _fused_key(self, key: str) -> tuple[str, str] | None:
        """Their q, k or v projection → (our in_proj key, "q" / "k" / "v"); None for any other key."""
        for theirs_pattern, _, _, ours in self._fuse:
            if match := theirs_pattern.match(key):
                values = match.groupdict()
                return f"{ours.format(values, 'theirs')}in_proj_{values['_param']}", values["_part"]
        return None

    def to_theirs(self, state_dict: Mapping[str, torch.Tensor], context: Any = None) -> dict[str, torch.Tensor]:
        """This project's state dict → theirs (as on disk): every tensor a contiguous CPU copy (safetensors refuses
        tensors that share memory, as the q, k, v slices of one in_proj would); in_proj split in place; buffers
        computed from ``context`` at the end.

        Raises:
            ExportError: a key of ours that has no counterpart in theirs.
        """
        _, write_spelling = self._spellings
        theirs: dict[str, torch.Tensor] = {}
        for key, value in state_dict.items():
            if self._dropped(key, "ours"):
                continue
            value = value.detach().to("cpu", copy=True).contiguous()
            split = self._split_keys(key)
            if split is not None:
                for their_key, part in zip(split, value.chunk(3)):
                    theirs[_respell(their_key, write_spelling)] = part.clone()
                continue
            their_key = self.their_key(key)
            if their_key is None:
                raise ExportError(f"{key} has no counterpart in {self.source} {self.family}")
            their_key = _respell(their_key, write_spelling)
            self._check_reads_back(key, their_key)
            theirs[their_key] = value
        for theirs_template, anchor, buffer in self._buffers:
            for key in state_dict:
                if (match := anchor.pattern.fullmatch(key)) is not None:
                    theirs[theirs_template.format(match.groupdict(), "ours")] = buffer.value(context)
        return theirs

    def _split_keys(self, key: str) -> list[str] | None:
        """Our in_proj key → their q, k and v keys (before ``write_spelling``); None for any other key."""
        for _, ours_pattern, theirs, _ in self._fuse:
            if match := ours_pattern.match(key):
                values = match.groupdict()
                prefix = theirs.format(values, "ours")
                return [f"{prefix}{part}_proj.{values['_param']}" for part in "qkv"]
        return None

    def _check_reads_back(self, key: str, their_key: str) -> None:
        read_spelling, _ = self._spellings
        back = self.our_key(_respell(their_key, read_spelling))
        if back != key:  # the table's two directions must be inverses
            raise AssertionError(f"{key} → {their_key} reads back as {back}: reorder the renames of {self.family}")


def refuse_unless(config: Mapping[str, Any], expected: Mapping[str, Any], config_path: str | Path, model: str,
                  what: str = "") -> None:
    """Raise :class:`CheckpointError` naming ``config_path`` and every setting of ``config`` (a config.json or its
    ``backbone_config``) that differs from ``expected``; absent settings (and None) take the expected value, a
    list equals the tuple of its items. ``model`` ("RT-DETR") and ``what`` ("a backbone with") word the message."""
    def plain(value: Any) -> Any:
        return list(value) if isinstance(value, (list, tuple)) else value

    wrong = {key: config[key] for key, value in expected.items()
             if key in config and config[key] is not None and plain(config[key]) != plain(value)}
    if wrong:
        has = f"{what} {dict(expected)}" if what else f"{dict(expected)}"
        raise CheckpointError(f"{config_path}: this project's {model} has {has}; the file sets {wrong}, which it "
                              f"cannot reproduce")
