"""Expected errors as one line (issue 39, point 11; detr.inference.command_line.one_line_errors): a command given a checkpoint that does not exist prints
one ``error:`` line naming the file and exits 2; DETR_DEBUG=1 shows the traceback."""

from __future__ import annotations

import pytest

from detr.checkpoints import CheckpointError
from detr.commands import explore, export, visualize_attention


@pytest.mark.parametrize("command, argv", [
    (explore.main, ["data/photos/chelsea.png", "--out", "{out}"]),
    (visualize_attention.main, ["data/photos/chelsea.png", "--out", "{out}"]),
    (export.main, ["--out", "{out}/model.onnx"]),
])
def test_a_missing_checkpoint_is_one_line_and_status_2(command, argv, tmp_path, capsys, monkeypatch) -> None:
    missing = tmp_path / "no-such.ckpt"
    argv = [a.format(out=tmp_path / "out") for a in argv]
    argv = [str(missing), *argv] if command is export.main else [*argv, "--checkpoint", str(missing)]
    monkeypatch.delenv("DETR_DEBUG", raising=False)
    assert command(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and str(missing) in err[0], err
    monkeypatch.setenv("DETR_DEBUG", "1")
    with pytest.raises(CheckpointError):
        command(argv)
