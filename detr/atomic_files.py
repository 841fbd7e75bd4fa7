"""Write a file so that a crash at any moment leaves either the old file or the new one, never a part.

The new content goes to a temporary file beside the target (same folder, so the same filesystem), is
flushed to disk with ``fsync``, then replaces the target with ``os.replace``, which is atomic within one
filesystem. A temporary file in the system's temp folder would not do: when that is another filesystem,
the final move is a copy, and a kill during the copy leaves a truncated target.

Outputs that a library writes by path (``onnx.save``, ``openvino.save_model``, ``torch.export.save``), outputs
of several files (an OpenVINO IR's ``.xml`` and ``.bin``) and whole folders (a transformers directory) are
written the same way one level up: into a :func:`staging_folder` beside the target, under their final names,
then :func:`move_into_place` once complete (and, where the caller checks them, checked): the old output
survives any failure before that, a full disk included.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
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


@contextlib.contextmanager
def staging_folder(beside: str | Path) -> Iterator[Path]:
    """A new hidden folder (``.staging-*``) in the folder ``beside`` (created if missing), where outputs are written
    under their final names before :func:`move_into_place` moves them out; it is removed at exit with whatever
    is still in it (a failed or interrupted write's partial files). Beside the target, not in the system's temp
    folder, so that the move is a rename within one filesystem."""
    beside = Path(beside)
    beside.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=".staging-", dir=beside))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def move_into_place(staged: str | Path, path: str | Path) -> Path:
    """Move the complete file or folder ``staged`` (in a :func:`staging_folder` beside ``path``) to ``path``,
    replacing what is there, after syncing it to disk. A file replaces a file atomically (``os.replace``); a
    folder replaces a folder by two renames (the old one aside, the new one in, then the old one deleted; if the
    second rename fails, the old one is put back). Returns ``path``."""
    staged, path = Path(staged), Path(path)
    if staged.is_dir():
        for file in sorted(p for p in staged.rglob("*") if p.is_file()):
            _fsync_file(file)
        _fsync_directory(staged)
        if path.is_dir():
            aside = path.with_name(f".{path.name}.{os.getpid()}.old")
            os.replace(path, aside)
            try:
                os.replace(staged, path)
            except BaseException:
                os.replace(aside, path)
                raise
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(staged, path)
    else:
        _fsync_file(staged)
        os.replace(staged, path)
    _fsync_directory(path.parent)
    return path


def write_path_atomically(path: str | Path, write: Callable[[Path], object],
                          companions: Sequence[str | Path] = ()) -> Path:
    """``write(staged)`` for a writer that takes a path (``onnx.save``, ``openvino.save_model``): it writes
    ``path``'s content to ``staged``, the same name in a :func:`staging_folder` beside ``path``; then the file and
    its ``companions`` (files the writer puts beside it under their own names, e.g. an OpenVINO ``.xml``'s
    ``.bin``) are moved into place, the companions first. If ``write`` fails, ``path`` and the companions keep
    their previous content; an ``OSError`` without a file name (a full disk) gets ``path`` as its ``filename``.
    Returns ``path``."""
    path = Path(path)
    try:
        with staging_folder(path.parent) as staging:
            write(staging / path.name)
            for companion in companions:
                move_into_place(staging / Path(companion).name, path.with_name(Path(companion).name))
            move_into_place(staging / path.name, path)
    except OSError as error:
        if error.filename is None:
            error.filename = str(path)
        raise
    return path


@contextlib.contextmanager
def folder_written_atomically(folder: str | Path) -> Iterator[Path]:
    """``with folder_written_atomically(folder) as staged:`` write the folder's files into ``staged`` (an empty
    folder of the same name in a :func:`staging_folder`); when the block ends without an error the whole folder
    replaces ``folder`` (:func:`move_into_place`: files of an earlier content that the new one lacks are gone, not
    left beside it); when it raises, ``folder`` is as it was."""
    folder = Path(folder)
    with staging_folder(folder.parent) as staging:
        staged = staging / folder.name
        staged.mkdir()
        yield staged
        move_into_place(staged, folder)


def _fsync_file(path: Path) -> None:
    with contextlib.suppress(OSError), path.open("rb") as file:
        os.fsync(file.fileno())


def _fsync_directory(directory: Path) -> None:
    if os.name != "posix":
        return
    with contextlib.suppress(OSError):
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
