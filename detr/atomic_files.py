"""Write a file so that a crash at any moment leaves either the old file or the new one, never a part.

The new content goes to a temporary file beside the target (same folder, so the same filesystem), is
flushed to disk with ``fsync``, then replaces the target with ``os.replace``, which is atomic within one
filesystem. A temporary file in the system's temp folder would not do: when that is another filesystem,
the final move is a copy, and a kill during the copy leaves a truncated target.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomically(path: str | Path, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(file)`` on a temporary binary file beside ``path``, then move it over ``path``.

    Parents are created. If ``write`` (or anything before the move) fails, ``path`` keeps its previous
    content and the temporary file is removed; an ``OSError`` without a file name (a full disk) gets ``path``
    as its ``filename``. Returns ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with temporary.open("wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            temporary.unlink()
        if isinstance(error, OSError) and error.filename is None:
            error.filename = str(path)  # a failed write (a full disk) names no file of its own
        raise
    _fsync_directory(path.parent)  # the rename itself reaches the disk
    return path


def write_text_atomically(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """:func:`write_atomically` for a text file."""
    data = text.encode(encoding)
    return write_atomically(path, lambda file: file.write(data))


def _fsync_directory(directory: Path) -> None:
    if os.name != "posix":
        return
    with contextlib.suppress(OSError):
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
