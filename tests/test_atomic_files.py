"""detr.atomic_files: outputs written by path, of several files or whole folders are moved into place only when
complete; a failure at any point leaves the earlier output as it was and no staging folder behind."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from detr.atomic_files import folder_written_atomically, move_into_place, staging_folder, write_path_atomically

REPO = Path(__file__).resolve().parents[1]


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.fixture
def old_model(tmp_path) -> tuple[Path, Path]:
    """An OpenVINO-like pair of files an earlier export wrote: model.xml and its model.bin."""
    xml, weights = tmp_path / "model.xml", tmp_path / "model.bin"
    xml.write_text("old xml")
    weights.write_text("old bin")
    return xml, weights


def test_a_file_and_its_companion_replace_the_earlier_ones_together(tmp_path, old_model):
    xml, weights = old_model

    def write(staged: Path) -> None:
        staged.write_text("new xml")
        staged.with_suffix(".bin").write_text("new bin")

    assert write_path_atomically(xml, write, companions=[weights]) == xml
    assert (xml.read_text(), weights.read_text()) == ("new xml", "new bin") and hidden(tmp_path) == []


def test_a_writer_that_fails_midway_leaves_both_files(tmp_path, old_model):
    xml, weights = old_model

    def full_disk(staged: Path) -> None:
        staged.write_text("new xml")
        staged.with_suffix(".bin").write_text("part of the")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError) as error:
        write_path_atomically(xml, full_disk, companions=[weights])
    assert error.value.filename == str(xml)  # named, as write_atomically names it
    assert (xml.read_text(), weights.read_text()) == ("old xml", "old bin") and hidden(tmp_path) == []


def test_a_folder_replaces_the_earlier_one_whole(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("old")
    (folder / "pytorch_model.bin").write_text("another model's")
    with folder_written_atomically(folder) as staged:
        assert staged != folder and not any(staged.iterdir())
        (staged / "config.json").write_text("new")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"] and (folder / "config.json").read_text() == "new"
    assert oct(folder.stat().st_mode & 0o777) == oct(0o777 & ~_umask())  # not the staging folder's 0700
    assert hidden(tmp_path) == []


def test_a_folder_whose_writing_fails_is_left_as_it_was(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("old")
    with pytest.raises(KeyboardInterrupt), folder_written_atomically(folder) as staged:
        (staged / "config.json").write_text("new")
        raise KeyboardInterrupt
    assert [p.name for p in folder.iterdir()] == ["config.json"] and (folder / "config.json").read_text() == "old"
    assert hidden(tmp_path) == []


def test_a_file_size_limit_is_an_error_that_keeps_the_earlier_file(tmp_path):
    """``ulimit -f``: Python ignores SIGXFSZ, so a write past the limit is an OSError (EFBIG), as a full disk is."""
    path = tmp_path / "model.onnx"
    path.write_bytes(b"earlier")
    script = ("import resource, sys\n"
              "from pathlib import Path\n"
              "from detr.atomic_files import write_path_atomically\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
              "try:\n"
              "    write_path_atomically(Path(sys.argv[1]), lambda staged: staged.write_bytes(bytes(10000)))\n"
              "except OSError as error:\n"
              "    print(error.errno, error.filename)\n")
    run = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert run.stdout.split() == [str(errno.EFBIG), str(path)], run.stderr
    assert path.read_bytes() == b"earlier" and hidden(tmp_path) == []


def test_move_into_place_and_the_staging_folder(tmp_path):
    with staging_folder(tmp_path / "new") as staging:
        assert staging.parent == tmp_path / "new" and staging.name.startswith(".staging-")
        (staging / "a.txt").write_text("a")
        move_into_place(staging / "a.txt", tmp_path / "new" / "a.txt")
    assert (tmp_path / "new" / "a.txt").read_text() == "a" and hidden(tmp_path / "new") == []


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
