"""One output folder, one run: what every command that writes a folder of results uses to claim it.

Two runs writing one folder mix or replace each other's files without a word (two ``detr-predict --out
OUT`` started together: ``predictions.json`` holds only the second run's detections, the drawings of both
lie side by side). So a run claims its folder first:

- :func:`hold_folders` writes ``run.lock`` (JSON: pid, host, start time, command) into each folder and
  removes it when the run ends. While the process that wrote a lock lives, another run is refused, naming
  that process; a lock whose process is gone (killed) is stale and taken over. The lock file appears
  whole (written beside it, then hard-linked into place: of two runs starting together exactly one wins).
- :func:`claim_output_folder` holds one folder and keeps its manifest, ``outputs.txt``: every file the
  run writes is recorded there (:meth:`OutputFolder.record`) before it is written, so a later run knows
  the previous run's files, drawings included, even when that run was killed. A folder with such files
  is refused unless the caller overwrites, which deletes exactly those files first: nothing else in the
  folder (say, the user's images) is touched.

``detr fit``'s run folders (:mod:`detr.lightning.run_folder`) share the lock; the prediction writers
(:func:`detr.inference.outputs.predict_files`, ``detr predict``'s writer) claim their folder here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

LOCK_NAME = "run.lock"
MANIFEST_NAME = "outputs.txt"


class OutputFolderError(RuntimeError):
    """The output folder belongs to another run (live, or finished and not to be overwritten)."""


def read_lock(path: Path) -> dict[str, Any] | None:
    """The lock's JSON (None if there is no lock); an unreadable lock reads as ``{}``."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}


def lock_is_live(lock: dict[str, Any]) -> bool:
    """Whether the process that wrote ``lock`` still runs (a lock from another host counts as live)."""
    if lock.get("host") != socket.gethostname():
        return bool(lock)
    try:
        pid = int(lock["pid"])
    except (KeyError, ValueError, TypeError):
        return False
    return process_is_alive(pid)


def process_is_alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine exists (another user's process counts)."""
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except (ProcessLookupError, OverflowError):  # gone; a pid no process can have
        return False
    except PermissionError:  # another user's process
        return True
    return True


def describe_lock(lock: dict[str, Any]) -> str:
    """``process PID on HOST, started TIME, command: ...``: who holds a folder, for error messages."""
    return (f"process {lock.get('pid', '?')} on {lock.get('host', '?')}, started {lock.get('started', '?')}, "
            f"command: {lock.get('command', '?')}")


def _in_use(folder: Path, lock: dict[str, Any], elsewhere: str, error: type[OutputFolderError]) -> OutputFolderError:
    return error(
        f"output folder {folder} is in use by a live run ({describe_lock(lock)}); give this run another folder "
        f"({elsewhere}), or wait for that run to end. A stale lock can be removed by hand: {folder / LOCK_NAME}"
    )


def _acquire(folder: Path, record: dict[str, Any], elsewhere: str, error: type[OutputFolderError]) -> Path:
    path = folder / LOCK_NAME
    draft = folder / f".{LOCK_NAME}.{os.getpid()}.tmp"
    draft.write_text(json.dumps(record))
    try:
        for _ in range(10):  # each pass either takes the lock, refuses, or removes a stale lock and tries again
            try:
                os.link(draft, path)  # atomic and exclusive, with the content already in: never seen half-written
                return path
            except FileExistsError:
                pass
            seen = read_lock(path)
            if seen is None:
                continue  # released meanwhile
            if lock_is_live(seen):
                raise _in_use(folder, seen, elsewhere, error)
            # Stale: move it aside and check that what moved is the stale lock we read, not a fresh one that a
            # run starting at the same moment put there after taking the stale one over itself.
            aside = folder / f".{LOCK_NAME}.{os.getpid()}.stale"
            try:
                os.rename(path, aside)
            except FileNotFoundError:
                continue
            taken = read_lock(aside)
            if taken != seen:
                with contextlib.suppress(FileExistsError):
                    os.link(aside, path)  # give the other run its lock back
                aside.unlink()
                raise _in_use(folder, taken or {}, elsewhere, error)
            aside.unlink()
            logger.info("taking over %s: its process is gone (%s)", path, describe_lock(seen))
        raise _in_use(folder, read_lock(path) or {}, elsewhere, error)
    finally:
        draft.unlink()


@contextlib.contextmanager
def hold_folders(folders: Sequence[Path], *, elsewhere: str, command: str | None = None,
                 error: type[OutputFolderError] = OutputFolderError) -> Iterator[list[Path]]:
    """Lock ``folders`` (created) for one run; yields the lock files, removed when the run ends.

    ``elsewhere`` says how to give the run another folder (``--out``), for the error; ``error`` is the class
    raised (a caller's subclass).

    Raises:
        OutputFolderError: another live process holds one of them.
    """
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "command": command if command is not None else " ".join(sys.argv)}
    locks: list[Path] = []
    try:
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            locks.append(_acquire(folder, record, elsewhere, error))
        yield locks
    finally:
        for path in locks:
            with contextlib.suppress(OSError):
                path.unlink()


class OutputFolder:
    """A claimed output folder: :meth:`record` each file before writing it (see the module docstring)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.manifest = folder / MANIFEST_NAME
        self._recorded = set(_read_manifest(self.manifest))

    def record(self, path: str | Path) -> Path:
        """Note ``path`` (inside the folder) as this run's output in the manifest; returns it."""
        path = Path(path)
        name = path.resolve().relative_to(self.folder.resolve()).as_posix()
        if name not in self._recorded:
            self._recorded.add(name)
            with self.manifest.open("a") as file:  # before the file itself: a kill mid-write still leaves a trace
                file.write(name + "\n")
        return path


def _read_manifest(manifest: Path) -> list[str]:
    try:
        return [line for line in manifest.read_text().splitlines() if line]
    except FileNotFoundError:
        return []


def recorded_outputs(folder: Path) -> set[str]:
    """The files (relative POSIX paths) that the manifest of ``folder`` says its runs wrote."""
    return set(_read_manifest(folder / MANIFEST_NAME))


def previous_outputs(folder: Path, markers: Iterable[str] = ()) -> list[Path]:
    """The files of an earlier run in ``folder``: those its manifest names that exist, the manifest itself,
    and any of ``markers`` (file names a run always writes) that exist."""
    found = [folder / name for name in _read_manifest(folder / MANIFEST_NAME)]
    found += [folder / MANIFEST_NAME, *(folder / name for name in markers)]
    return [path for path in dict.fromkeys(found) if path.is_file()]


@contextlib.contextmanager
def claim_output_folder(
    folder: str | Path, *, overwrite: bool, overwrite_flag: str, elsewhere: str, markers: Iterable[str] = (),
    command: str | None = None,
) -> Iterator[OutputFolder]:
    """Hold ``folder`` (created) for one run and yield it for :meth:`OutputFolder.record`.

    A folder holding a previous run's outputs (:func:`previous_outputs`) is refused, or with ``overwrite``
    those files are deleted first. ``overwrite_flag`` (``--overwrite``) and ``elsewhere`` (``--out``) name the
    caller's options in the error.

    Raises:
        OutputFolderError: a live run holds the folder, or it holds a previous run's outputs and ``overwrite``
            is off.
    """
    folder = Path(folder)
    with hold_folders([folder], elsewhere=elsewhere, command=command):
        previous = previous_outputs(folder, markers)
        if previous:
            more = f" and {len(previous) - 6} more" if len(previous) > 6 else ""
            shown = ", ".join(str(p) for p in previous[:6]) + more
            if not overwrite:
                raise OutputFolderError(
                    f"output folder {folder} holds a previous run's outputs ({shown}); pass {overwrite_flag} to "
                    f"replace them (deletes those files), or give this run another folder ({elsewhere})"
                )
            logger.warning("%s: deleting the previous run's outputs in %s: %s", overwrite_flag, folder, shown)
            for path in previous:
                path.unlink()
            for parent in sorted({p.parent for p in previous}, key=lambda p: len(p.parts), reverse=True):
                if parent != folder:
                    with contextlib.suppress(OSError):
                        parent.rmdir()  # a subfolder the run made (panoptic/), when nothing else is in it
        yield OutputFolder(folder)
