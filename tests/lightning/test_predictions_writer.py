"""``detr predict``'s writer (detr.lightning.callbacks.PredictionsWriter) from a real checkpoint: the data root
it does not read need not exist, image ids start at 1 as detr-predict's, and its folder holds one run's
predictions (a second run is refused unless --overwrite_run); a fresh fit prints no "previous log files" notice."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from detr.lightning.cli import main
from detr.output_folder import MANIFEST_NAME, OutputFolderError
from tests.helpers import REPO, TINY_CLI_MODEL, tiny_fit_args

pytestmark = pytest.mark.usefixtures("one_thread", "bare_argv")

LOG_NOTICE = "Previous log files in this directory will be deleted"


@pytest.fixture(scope="module")
def fitted(tiny_shapes_root, tmp_path_factory) -> tuple[Path, list[str]]:
    """(last.ckpt of a one-step fit, the warnings that fit emitted)."""
    out = tmp_path_factory.mktemp("fit") / "run"
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        patch.setattr("sys.argv", ["detr"])
        warnings.simplefilter("always")
        main(tiny_fit_args(tiny_shapes_root, out, "--trainer.max_steps=1"))
    return out / "checkpoints" / "last.ckpt", [str(w.message) for w in caught]


def predict_args(tiny_shapes_root: Path, checkpoint: Path, out: Path, *extra: str) -> list[str]:
    """``detr predict`` of the val images with the demo config, whose data.root (data/shapes) is replaced by one
    that does not exist: predict reads only predict_images."""
    return ["predict", "--config", str(REPO / "configs" / "demo_shapes_cpu.yaml"),
            f"--data.root={out.parent / 'no-such-data-root'}", f"--data.predict_images={tiny_shapes_root / 'val2017'}",
            "--data.val_batch_size=4", "--data.num_workers=0", *TINY_CLI_MODEL, f"--trainer.default_root_dir={out}",
            "--trainer.enable_progress_bar=false", f"--ckpt_path={checkpoint}", *extra]


def test_a_fresh_fit_prints_no_previous_log_files_notice(fitted) -> None:
    """Lightning's CSV logger warned "Previous log files in this directory will be deleted" in every new run
    folder: the run's own run.lock (and config.yaml) were already there."""
    _, caught = fitted
    assert not [message for message in caught if LOG_NOTICE in message]


def test_predict_without_the_configs_data_root_numbers_images_from_1(tiny_shapes_root, fitted, tmp_path) -> None:
    """The demo config's data.root (data/shapes) had to exist for detr predict, which does not read it; its
    images were numbered from 0 while detr-predict numbers from 1 (COCO ids)."""
    checkpoint, _ = fitted
    out = tmp_path / "out"
    assert main(predict_args(tiny_shapes_root, checkpoint, out)) == 0
    predictions = json.loads((out / "predict" / "predictions.json").read_text())
    ids = {Path(p["file_name"]).name: p["image_id"] for p in predictions}
    names = sorted(p.name for p in (tiny_shapes_root / "val2017").glob("*.jpg"))
    assert sorted(ids) == names
    if not all(Path(name).stem.isdigit() for name in names):
        assert [ids[name] for name in names] == list(range(1, len(names) + 1))
    else:  # numbered files keep their numbers, as in detr-predict
        assert [ids[name] for name in names] == [int(Path(name).stem) for name in names]
    assert min(ids.values()) >= 1


def test_predict_says_it_wrote_every_query_and_what_detr_predict_keeps(tiny_shapes_root, fitted, tmp_path,
                                                                      caplog) -> None:
    """detr predict wrote every query where detr-predict kept those above the threshold, without a word (N10):
    the two rules are said where the file is written."""
    checkpoint, _ = fitted
    with caplog.at_level("INFO", logger="detr.lightning.callbacks.predictions_writer"):
        assert main(predict_args(tiny_shapes_root, checkpoint, tmp_path / "out")) == 0
    said = [record.getMessage() for record in caplog.records if "predictions.json holds" in record.getMessage()]
    assert said and "every query" in said[0] and "detr-predict keeps those above" in said[0]


def test_a_second_predict_into_the_folder_is_refused_until_it_overwrites(tiny_shapes_root, fitted, tmp_path) -> None:
    """A second detr predict silently replaced the first one's predictions.json."""
    checkpoint, _ = fitted
    out = tmp_path / "out"
    main(predict_args(tiny_shapes_root, checkpoint, out))
    written = out / "predict" / "predictions.json"
    first = written.read_text()
    with pytest.raises(OutputFolderError, match="holds a previous run's outputs") as refusal:
        main(predict_args(tiny_shapes_root, checkpoint, out))
    assert str(out / "predict") in str(refusal.value) and "--overwrite_run true" in str(refusal.value)
    assert written.read_text() == first  # untouched

    assert main(predict_args(tiny_shapes_root, checkpoint, out, "--overwrite_run=true")) == 0
    assert written.is_file()
    assert (out / "predict" / MANIFEST_NAME).read_text().splitlines() == ["predictions.json"]


def test_a_live_predict_holds_its_folder(tiny_shapes_root, fitted, tmp_path) -> None:
    """Two detr predict runs started together both wrote predictions.json: the second is refused while the
    first holds the folder."""
    from detr.output_folder import claim_output_folder

    checkpoint, _ = fitted
    out = tmp_path / "out"
    with claim_output_folder(out / "predict", overwrite=False, overwrite_flag="x", elsewhere="y"):  # the first run
        with pytest.raises(OutputFolderError, match="in use by a live run") as refusal:
            main(predict_args(tiny_shapes_root, checkpoint, out))
    assert str(out / "predict") in str(refusal.value) and "--trainer.default_root_dir" in str(refusal.value)
    assert not (out / "predict" / "predictions.json").exists()
