"""Expected errors as one line (detr.inference.command_line.one_line_errors): a command given a checkpoint that
does not exist prints one ``error:`` line naming the file and exits 2; DETR_DEBUG=1 shows the traceback."""

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


@pytest.mark.parametrize("argv, message", [
    (["--device", "gpu"], "'gpu' is not a device: use auto, cpu, cuda or cuda:N"),
    (["--device", "cuda"], "no CUDA GPU"),
])
def test_a_device_this_machine_lacks_is_a_usage_error_before_the_model_loads(argv, message, tmp_path, capsys,
                                                                           monkeypatch) -> None:
    """--device gpu and --device cuda on a machine without one were torch's tracebacks after the model loaded."""
    import torch

    from detr.commands import predict, serve

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for main in (predict.main, explore.main):
        with pytest.raises(SystemExit) as exit_:
            main(["data/photos/chelsea.png", "--checkpoint", str(tmp_path / "never-read.ckpt"), "--out",
                  str(tmp_path / "out"), *argv])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        serve.main(["--checkpoint", str(tmp_path / "never-read.ckpt"), *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_serve_checks_its_numbers_before_the_model_loads(tmp_path, capsys) -> None:
    """--port 99999 was a bare OverflowError once the model had loaded."""
    from detr.commands import serve

    for flag, value, message in (("--port", "99999", "an integer in [0, 65535]"),
                                 ("--max-batch-size", "0", "an integer >= 1"),
                                 ("--port", "http", "'http' is not an integer")):
        with pytest.raises(SystemExit) as exit_:
            serve.main(["--checkpoint", str(tmp_path / "never-read.ckpt"), flag, value])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
