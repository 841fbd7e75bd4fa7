"""Read every image file of a data set once, for the start-up checks: in parallel, and remembered.

What a read found (the displayed and stored size, the EXIF orientation) is kept in a cache file, keyed by
the file's path (relative to the cache file), byte size and modification time (ns), so a resumed run, a second run on the same node or
a rerun of ``detr-check-data`` reads only what changed: at COCO's size (118,287 files) a header read costs
~110 µs per file on one core, a ``stat`` ~12 µs (docs/measurements/scale.md). A full decode also satisfies a later
header check; a header read does not satisfy a later decode. Failures are never cached: a broken file is
read again each time, so the error message is always current. A cache that cannot be read or written
(read-only folder, a file from another version) is ignored with a log line, never an error.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from detr.atomic_files import write_atomically
from detr.data.images import ImageLoadError, decode_image, read_image_header

logger = logging.getLogger(__name__)

#: Bumped when the entries change meaning; a cache of another version is read as empty.
CACHE_VERSION = 1

#: From this many files to read, a progress bar is shown (when asked for): ~1 s of header reads.
PROGRESS_MIN_FILES = 10_000


@dataclass(frozen=True)
class ImageReading:
    """What reading one image file found.

    size: (height, width) as displayed (EXIF orientation applied), None when the read failed.
    error: why the read failed (the message names the file and the fix), None when it worked.
    stored_size: (height, width) as stored, before the orientation; None when the read failed.
    orientation: the EXIF orientation tag (1..8; 1 when absent or on failure).
    """

    size: tuple[int, int] | None
    error: str | None = None
    stored_size: tuple[int, int] | None = None
    orientation: int = 1


def read_image(path: str | Path, decode: bool, annotations_file: Path | None) -> ImageReading:
    """Read one file: its header, or (``decode``) all of it, which also finds truncated files."""
    try:
        if decode:
            decoded = decode_image(path, annotations_file=annotations_file)
            return ImageReading(decoded.pixels.shape[:2], None, decoded.stored_size, decoded.exif_orientation)
        header = read_image_header(path, annotations_file=annotations_file)
        return ImageReading(header.size, None, header.stored_size, header.exif_orientation)
    except ImageLoadError as error:  # the loader advises only on the file; a data set can also drop the image
        return ImageReading(None, f"{error}, or remove the image from the annotation json")


def _read_image_star(arguments: tuple[str | Path, bool, Path | None]) -> ImageReading:
    return read_image(*arguments)


def default_cache_file(annotations_file: str | Path) -> Path:
    """Where the checks of a data set remember their reads: beside its annotation json."""
    annotations_file = Path(annotations_file)
    return annotations_file.with_name(annotations_file.name + ".imagecache")


def _keys(paths: Sequence[str | Path], cache_file: Path) -> list[str]:
    """The files' names in the cache: relative to the cache's folder, so a copied data set keeps its cache."""
    folders: dict[str, str] = {}  # relpath once per folder: per file it would cost seconds at COCO's size
    keys = []
    for path in paths:
        parent, name = os.path.split(os.fspath(path))
        folder = folders.get(parent)
        if folder is None:
            folder = folders[parent] = os.path.relpath(parent or os.curdir, cache_file.parent)
        keys.append(name if folder == os.curdir else os.path.join(folder, name))
    return keys


def _load_cache(cache_file: Path) -> dict[str, list[int]]:
    try:
        with cache_file.open("rb") as file:
            content = json.load(file)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        logger.info("image check cache '%s' not used (%s): every file is read", cache_file, error)
        return {}
    if not isinstance(content, dict) or content.get("version") != CACHE_VERSION:
        return {}
    entries = content.get("entries")
    return entries if isinstance(entries, dict) else {}


def _save_cache(cache_file: Path, entries: dict[str, list[int]]) -> None:
    data = json.dumps({"version": CACHE_VERSION, "entries": entries}, separators=(",", ":")).encode()
    try:
        write_atomically(cache_file, lambda file: file.write(data))
    except OSError as error:  # a read-only data folder: the checks still ran, they are just not remembered
        logger.info("image check cache '%s' not written (%s)", cache_file, error)


def read_images(
    paths: Sequence[str | Path],
    *,
    decode: bool,
    annotations_file: Path | None = None,
    workers: int = 0,
    cache_file: Path | None = None,
    progress: bool = False,
) -> list[ImageReading]:
    """Read every file of ``paths`` (see :func:`read_image`), in order.

    Args:
        decode: decode each file completely instead of reading its header.
        annotations_file: the json listing the files; only named in messages.
        workers: processes that read (0: this process).
        cache_file: remember the reads there and reuse those of unchanged files (module docstring); None
            reads everything and remembers nothing.
        progress: show a progress bar (tqdm, on stderr) when there are many files to read.
    """
    entries = _load_cache(cache_file) if cache_file is not None else {}
    readings: list[ImageReading | None] = [None] * len(paths)
    stamps: list[tuple[int, int] | None] = [None] * len(paths)
    to_read: list[int] = []
    keys = _keys(paths, cache_file) if cache_file is not None else []
    for position, path in enumerate(paths):
        if cache_file is not None:
            try:
                stat = os.stat(path)
            except OSError:
                to_read.append(position)  # missing: read_image says so in its own words
                continue
            stamps[position] = (stat.st_size, stat.st_mtime_ns)
            entry = entries.get(keys[position])
            if entry is not None and entry[:2] == list(stamps[position]) and (entry[2] or not decode):
                readings[position] = ImageReading((entry[3], entry[4]), None, (entry[5], entry[6]), entry[7])
                continue
        to_read.append(position)
    arguments = [(paths[p], decode, annotations_file) for p in to_read]
    bar = None
    if progress and len(arguments) >= PROGRESS_MIN_FILES:
        try:
            from tqdm import tqdm
        except ImportError:  # tqdm comes with Lightning; without it the check is just silent
            tqdm = None
        if tqdm is not None:
            bar = tqdm(total=len(arguments), unit="image", desc="decoding images" if decode else "reading headers")
    if workers > 0 and len(arguments) > 1:
        with ProcessPoolExecutor(workers) as pool:
            fresh = []
            for reading in pool.map(_read_image_star, arguments, chunksize=64):
                fresh.append(reading)
                if bar is not None:
                    bar.update()
    else:
        fresh = []
        for argument in arguments:
            fresh.append(read_image(*argument))
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    for position, reading in zip(to_read, fresh, strict=True):
        readings[position] = reading
    fresh_positions = set(to_read)
    if cache_file is not None and to_read:
        kept = {}  # the files of this check only: entries of files no longer listed are dropped
        for position, (reading, stamp) in enumerate(zip(readings, stamps, strict=True)):
            if reading is None or reading.error is not None or stamp is None:
                continue
            key = keys[position]
            if position in fresh_positions:
                assert reading.size is not None and reading.stored_size is not None
                kept[key] = [*stamp, int(decode), *reading.size, *reading.stored_size, reading.orientation]
            elif key in entries:
                kept[key] = entries[key]
        _save_cache(cache_file, kept)
    return [reading for reading in readings if reading is not None]
