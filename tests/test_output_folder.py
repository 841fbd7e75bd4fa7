"""detr.output_folder: one run per output folder (a live lock refuses, a stale one is taken over, a used folder
is refused unless overwritten, and overwriting deletes exactly the previous run's recorded files)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from detr.output_folder import LOCK_NAME, MANIFEST_NAME, OutputFolderError, claim_output_folder, hold_folders

OPTIONS = dict(overwrite_flag="--overwrite", elsewhere="--out")


def test_a_folder_held_by_a_live_run_is_refused_and_released_at_the_end(tmp_path) -> None:
    with hold_folders([tmp_path], elsewhere="--out", command="the first run") as locks:
        assert json.loads(locks[0].read_text())["command"] == "the first run"
        with pytest.raises(OutputFolderError, match=f"{tmp_path} is in use by a live run .*the first run.*--out"):
            with claim_output_folder(tmp_path, overwrite=True, **OPTIONS):
                pass
    assert not (tmp_path / LOCK_NAME).exists()
    assert not list(tmp_path.glob(".*"))  # no draft or set-aside lock left behind


def test_a_stale_lock_is_taken_over(tmp_path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname()}))
    with claim_output_folder(tmp_path, overwrite=False, **OPTIONS):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] != int(dead.stdout)
    assert not (tmp_path / LOCK_NAME).exists()


def test_overwrite_deletes_exactly_the_previous_runs_files(tmp_path) -> None:
    with claim_output_folder(tmp_path, overwrite=False, **OPTIONS) as folder:
        for name in ("predictions.json", "a.jpg", "panoptic/a.png"):
            path = folder.record(tmp_path / name)
            path.parent.mkdir(exist_ok=True)
            path.write_text("first run")
    (tmp_path / "photo.jpg").write_text("the user's own file")
    with pytest.raises(OutputFolderError, match="holds a previous run's outputs .*pass --overwrite to replace them"):
        with claim_output_folder(tmp_path, overwrite=False, **OPTIONS):
            pass
    assert (tmp_path / "a.jpg").is_file()  # a refusal deletes nothing

    with claim_output_folder(tmp_path, overwrite=True, **OPTIONS):
        assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["photo.jpg", LOCK_NAME]
    assert not (tmp_path / MANIFEST_NAME).exists()


def test_a_run_that_wrote_only_a_marker_file_counts_as_a_previous_run(tmp_path) -> None:
    (tmp_path / "predictions.json").write_text("[]")
    with pytest.raises(OutputFolderError, match="predictions.json"):
        with claim_output_folder(tmp_path, overwrite=False, markers=("predictions.json",), **OPTIONS):
            pass
