"""A json's ``file_name`` → the file inside its folder, the same way wherever a json names a file.

COCO jsons name each image (and each panoptic PNG) by a path relative to a folder the user gives. Two kinds of
names need a rule, and every reader of such names (the detection and panoptic data sets, ``detr-check-data``,
the panoptic evaluator, the export gate, the analysis report) follows this one:

- backslashes are path separators: a json written on Windows says ``sub\\000001.jpg`` for ``sub/000001.jpg``;
- a name that leaves its folder (absolute: ``/data/x.jpg``, ``C:\\x.jpg``, ``\\\\server\\x.jpg``; or with a
  ``..`` part: ``../../x.jpg``) is refused, naming the json, the image id and the fix: a data set reads only
  the folder it was given (a json from elsewhere must not pick the files it reads, and a copied data set
  must not quietly read the original's files).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


class FileNameError(ValueError):
    """A json's ``file_name`` points outside the folder its files must be in."""


def normalise_file_name(file_name: str) -> str:
    """``file_name`` with backslashes read as separators (``sub\\a.jpg`` → ``sub/a.jpg``)."""
    return file_name.replace("\\", "/") if "\\" in file_name else file_name


def file_name_problem(file_name: str) -> str | None:
    """Why ``file_name`` does not name a file inside its folder, as the end of a sentence ("is ..."), or None."""
    name = normalise_file_name(file_name)
    if name.startswith("/") or (len(name) > 1 and name[1] == ":" and name[0].isalpha()):
        return "an absolute path"
    if ".." in name and ".." in name.split("/"):
        return "a path with '..' that leaves the folder"
    return None


def unsafe_file_name_message(file_name: str, problem: str, *, annotations_file: str | Path | None,
                             image_id: Any = None, folder: str | Path | None = None, what: str = "image") -> str:
    """One sentence naming the json, the image id and the fix for a ``file_name`` with ``problem`` (``what``: the
    kind of file it names, e.g. "image" or "panoptic PNG")."""
    where = f"'{annotations_file}'" if annotations_file is not None else "the json"
    image = f" (image id {image_id})" if image_id is not None else ""
    inside = f" '{folder}'" if folder is not None else ""
    return (f"{where}: {what} file_name '{file_name}'{image} is {problem}; file names must be relative to the "
            f"{what}s folder{inside} and stay inside it: copy the file into that folder and give its path relative "
            "to it")


def resolve_file_name(folder: str | Path, file_name: str, *, annotations_file: str | Path | None = None,
                      image_id: Any = None, what: str = "image") -> Path:
    """The file ``folder / file_name`` (backslashes read as separators).

    Raises:
        FileNameError: ``file_name`` is absolute or leaves ``folder`` with ``..`` (one sentence naming
            ``annotations_file``, ``image_id`` and the fix).
    """
    problem = file_name_problem(file_name)
    if problem is not None:
        raise FileNameError(unsafe_file_name_message(file_name, problem, annotations_file=annotations_file,
                                                     image_id=image_id, folder=folder, what=what))
    return Path(folder) / normalise_file_name(file_name)


def join_file_name(folder: str, file_name: str) -> str:
    """``os.path.join(folder, file_name)`` with backslashes read as separators, on strings (fast over many
    files); for names already checked with :func:`file_name_problem`."""
    return os.path.join(folder, normalise_file_name(file_name))
