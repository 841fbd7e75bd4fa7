"""detr fit's report: a line every log_every_n_steps steps when the output is a file, a line per validation, the
AP curve redrawn in the run folder at every validation, and the best checkpoint with its AP and threshold at the
end (N6 of the sweep: a fit logged to a file said nothing for a whole run)."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from detr.lightning.callbacks import FitReport
from detr.lightning.callbacks.fit_report import AP_CURVE_NAME, write_ap_curve
from detr.lightning.cli import main
from tests.helpers import tiny_fit_args

pytestmark = pytest.mark.usefixtures("one_thread", "bare_argv")


def test_a_fit_logged_to_a_file_says_what_it_does(tiny_shapes_root, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    main(tiny_fit_args(tiny_shapes_root, out, "--trainer.max_steps=4", "--trainer.log_every_n_steps=1"))
    printed = capsys.readouterr().out  # pytest's capture is no terminal: the file case
    lines = printed.splitlines()
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split(";")[0] for line in steps] == ["step 1/4", "step 2/4", "step 3/4", "step 4/4"]
    assert all("loss " in line for line in steps) and "s/step" in steps[-1] and "left" in steps[1]
    validations = [line for line in lines if line.startswith("validation at step")]
    assert len(validations) == 2 and "AP " in validations[0] and "best so far" in validations[0]
    summary = [line for line in lines if line.startswith("trained to step 4")]
    assert summary and "best checkpoint: " in summary[0] and "val/AP" in summary[0]
    assert "score threshold" in summary[0] and str(out / AP_CURVE_NAME) in summary[0]
    with Image.open(out / AP_CURVE_NAME) as figure:
        assert figure.size[0] > 100 and figure.size[1] > 100


def test_step_lines_are_for_files_and_quiet_says_nothing(tmp_path) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    report = FitReport()
    report.stream = Terminal()
    assert not report._wants_step_lines()
    report.stream = io.StringIO()
    assert report._wants_step_lines()
    assert not FitReport(step_lines=False)._wants_step_lines()
    quiet = FitReport(quiet=True)
    quiet.stream = io.StringIO()
    quiet._write("anything")
    assert quiet.stream.getvalue() == ""


def test_the_ap_curve_is_written_whole(tmp_path) -> None:
    path = write_ap_curve([(10, 0.1, 0.2), (20, 0.3, 0.5)], tmp_path / "curve.png")
    with Image.open(path) as figure:
        assert figure.format == "PNG"
    assert [p.name for p in tmp_path.iterdir()] == ["curve.png"]  # no temporary file left beside it


def test_a_resumed_run_continues_the_curve_and_an_overwritten_one_starts_it_again(tiny_shapes_root, tmp_path,
                                                                                 capsys) -> None:
    out = tmp_path / "run"
    main(tiny_fit_args(tiny_shapes_root, out, "--trainer.max_steps=2"))
    main(tiny_fit_args(tiny_shapes_root, out, "--trainer.max_steps=4", f"--ckpt_path={out / 'checkpoints' / 'last.ckpt'}"))
    validations = [line for line in capsys.readouterr().out.splitlines() if line.startswith("validation at step")]
    assert [line.split(":")[0] for line in validations] == ["validation at step 2", "validation at step 4"]
    report = FitReport()
    import torch

    report.load_state_dict(next(state for key, state in torch.load(
        out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["callbacks"].items()
        if key.startswith("FitReport")))
    assert [step for step, _, _ in report.history] == [2, 4]  # the first run's point kept
    (out / AP_CURVE_NAME).write_bytes(b"stale")
    with pytest.raises(SystemExit):  # a run that stops at once on a bad option leaves the folder alone
        main(tiny_fit_args(tiny_shapes_root, out, "--trainer.max_steps=x", "--overwrite_run=true"))
    main(tiny_fit_args(tiny_shapes_root, out, "--trainer.max_steps=1", "--trainer.limit_val_batches=0",
                       "--overwrite_run=true"))
    assert not (out / AP_CURVE_NAME).exists()  # deleted with the run's files; no validation drew it again
