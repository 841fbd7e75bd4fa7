"""detr-export (detr.commands.export): every input is checked before the first export step, and each file is written
and checked beside --out, then moved to its name: a full disk, a failed check or SIGTERM leaves an earlier file at
--out as it was."""

from __future__ import annotations

import errno
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from detr import build_detr
from detr.categories import CategoryMap
from detr.commands.export import main as export
from detr.inference.gate import GateReport, GateRow
from tests.helpers import TINY, save_project_checkpoint

pytest.importorskip("onnxscript")
pytest.importorskip("onnxruntime")

REPO = Path(__file__).resolve().parents[2]
PHOTOS = REPO / "data" / "photos"
CATEGORIES = CategoryMap((1, 3, 5, 7, 9), ("circle", "square", "triangle", "star", "cross"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, Path]:
    """The tiny model's checkpoint and its ONNX file, exported once (the tests that need a fresh export copy it:
    the same model's file passes verification)."""
    folder = tmp_path_factory.mktemp("export")
    torch.manual_seed(0)
    model = build_detr(TINY.replace(backbone_last_stage="layer3"), dropout=0.0)
    checkpoint = save_project_checkpoint(model, folder / "tiny.ckpt", (96, 160), CATEGORIES)
    assert export([str(checkpoint), "--out", str(folder / "tiny.onnx")]) == 0
    return checkpoint, folder / "tiny.onnx"


@pytest.fixture
def copy_export(exported, monkeypatch):
    """export_onnx replaced by a copy of the module's file (the export itself is the slow part)."""
    monkeypatch.setattr("detr.checkpoints.export.export_onnx",
                        lambda model, path, **kwargs: shutil.copyfile(exported[1], path))


def earlier_file(tmp_path: Path) -> tuple[Path, bytes]:
    out = tmp_path / "model.onnx"
    out.write_bytes(b"an earlier export that works")
    return out, out.read_bytes()


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") or p.name.endswith(".failed"))


def test_an_existing_file_is_replaced_after_verification_and_said_so(exported, copy_export, tmp_path, capsys):
    """EX9: an existing --out was replaced silently."""
    out, _ = earlier_file(tmp_path)
    assert export([str(exported[0]), "--out", str(out)]) == 0
    assert f"replaced the earlier {out}" in capsys.readouterr().out
    assert out.read_bytes() == exported[1].read_bytes() and leftovers(tmp_path) == []


def test_a_full_disk_leaves_the_earlier_file(exported, tmp_path, monkeypatch, capsys):
    """EX10: the disk filling during the export destroyed the file at --out and left a truncated model there."""
    out, before = earlier_file(tmp_path)

    def full_disk(model, path, **kwargs):
        Path(path).write_bytes(exported[1].read_bytes()[:1000])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("detr.checkpoints.export.export_onnx", full_disk)
    assert export([str(exported[0]), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and "as it was" in err and "Traceback" not in err
    assert out.read_bytes() == before and leftovers(tmp_path) == []


@pytest.mark.slow
def test_a_file_size_limit_leaves_the_earlier_file(exported, tmp_path):
    """EX10 as a user meets it (`ulimit -f`, the same error as a full disk): the real export in a process whose files
    may not pass 1 MB."""
    out, before = earlier_file(tmp_path)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    run = subprocess.run([sys.executable, str(REPO / "tools" / "export.py"), str(exported[0]), "--out", str(out)],
                         capture_output=True, text=True, preexec_fn=limit, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Traceback" not in run.stderr and "as it was" in run.stderr, run.stderr
    assert out.read_bytes() == before and leftovers(tmp_path) == []


def test_sigterm_stops_the_export_and_keeps_the_earlier_file(exported, tmp_path, monkeypatch, capsys):
    """EX11: SIGTERM during the export exited -15 without a word and could leave an unverified file at --out."""
    out, before = earlier_file(tmp_path)

    def terminated(model, path, **kwargs):
        Path(path).write_bytes(exported[1].read_bytes()[:1000])
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr("detr.checkpoints.export.export_onnx", terminated)
    assert export([str(exported[0]), "--out", str(out)]) == 128 + signal.SIGTERM
    assert "SIGTERM: stopped; nothing was written to" in capsys.readouterr().err
    assert out.read_bytes() == before and leftovers(tmp_path) == []


def test_a_file_that_fails_the_gate_leaves_the_earlier_file(exported, copy_export, tmp_path, monkeypatch, capsys):
    """EX9: a re-export that failed the accuracy gate left no good file at --out."""
    out, before = earlier_file(tmp_path)
    annotations = tmp_path / "set.json"
    annotations.write_text('{"images": [], "annotations": [], "categories": [{"id": 1, "name": "circle"}]}')

    def gate(reference, artifacts, images, annotations, *, max_ap_drop, **options):
        rows = [GateRow(path.name, path, 0.0, 0.0, 0.01, 0.01) for path in artifacts]
        return GateReport(GateRow("pytorch", None, 50.0, 60.0, 0.01, 0.01), rows, max_ap_drop)

    monkeypatch.setattr("detr.inference.gate.accuracy_gate", gate)
    assert export([str(exported[0]), "--out", str(out), "--evaluate", str(PHOTOS), str(annotations)]) == 1
    err = capsys.readouterr().err
    assert "accuracy gate failed" in err and "the earlier file there is as it was" in err
    assert out.read_bytes() == before and leftovers(tmp_path) == ["model.onnx.failed"]


@pytest.mark.parametrize("case", ["folder", "missing calibration", "empty calibration", "missing evaluation json"])
def test_inputs_are_checked_before_the_model_loads(tmp_path, capsys, case):
    """EX5, EX9: a missing or empty --calibration was found after the fp32 export (then a traceback), a folder as
    --out after 31 s of exporting. The checkpoint here does not exist: each mistake must be named before it is read."""
    (tmp_path / "empty").mkdir()
    arguments = {
        "folder": ["--out", str(tmp_path)],
        "missing calibration": ["--out", str(tmp_path / "m.onnx"), "--int8", "--calibration", str(tmp_path / "no")],
        "empty calibration": ["--out", str(tmp_path / "m.onnx"), "--int8", "--calibration", str(tmp_path / "empty")],
        "missing evaluation json": ["--out", str(tmp_path / "m.onnx"), "--evaluate", str(PHOTOS),
                                    str(tmp_path / "no.json")],
    }[case]
    with pytest.raises(SystemExit) as stop:
        export([str(tmp_path / "not-read.ckpt"), *arguments])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "not-read.ckpt" not in err and "Traceback" not in err
    assert {"folder": "is a folder", "missing calibration": "--calibration", "empty calibration": "--calibration",
            "missing evaluation json": "--evaluate"}[case] in err


def test_an_unreadable_calibration_image_is_skipped_and_counted(exported, copy_export, tmp_path, capsys):
    """EX6: one corrupt calibration image aborted INT8 after the export; training skips such an image."""
    calibration = tmp_path / "calibration"
    calibration.mkdir()
    for name in sorted(p.name for p in PHOTOS.glob("*.png"))[:2]:
        shutil.copyfile(PHOTOS / name, calibration / name)
    (calibration / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a whole jpeg")
    out = tmp_path / "model.onnx"
    assert export([str(exported[0]), "--out", str(out), "--int8", "--calibration", str(calibration)]) == 0
    captured = capsys.readouterr()
    assert "skipped 1 image(s) that could not be read (first: " in captured.err and "broken.jpg" in captured.err
    assert "calibrated on 2 images" in captured.out and (tmp_path / "model-int8.onnx").is_file()

    for name in ("a.jpg", "b.jpg"):  # more unreadable than readable: the wrong folder, one line
        (calibration / name).write_bytes(b"not an image")
    with pytest.raises(SystemExit):
        export([str(exported[0]), "--out", str(out), "--int8", "--calibration", str(calibration)])
    err = capsys.readouterr().err
    assert "3 of the 5 calibration images could not be read" in err and "Traceback" not in err


def test_bf16_with_an_onnx_file_is_one_line(exported, tmp_path, capsys):
    """E5: detr-predict --precision bf16 with an .onnx file was a traceback."""
    from detr.commands.predict import main as predict

    status = predict([str(PHOTOS / "chelsea.png"), "--checkpoint", str(exported[1]), "--out", str(tmp_path / "out"),
                      "--precision", "bf16", "--device", "cpu"])
    err = capsys.readouterr().err
    assert status == 1 and "Traceback" not in err and "--precision fp32" in err
