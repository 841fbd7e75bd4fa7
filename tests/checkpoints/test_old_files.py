"""Files that users have, written by an earlier version of this code, still load and predict the same: a
redesign of configs, the training system or checkpoint conversion must not break a file a user already has.

tests/fixtures/<generation>/ holds, per family and format, a tiny model's file as that version wrote it (a
``detr fit`` / ``detr-panoptic fit`` checkpoint, a :func:`detr.checkpoints.save_checkpoint` file, a
``detr-convert`` transformers directory), what it predicted then, and copies of that version's YAML configs;
tests/fixtures/make_fixtures.py wrote them and its README says when. Nothing here rewrites them: when a test
fails, the code broke a user's file, and the fix is a migration where the file is read, not new fixtures.
"""

from __future__ import annotations

import contextlib
import io
import json
import lzma
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from detr import Predictor, load_checkpoint
from detr.checkpoints.formats import torch_load
from detr.lightning.cli import main, panoptic_main
from detr.lightning.panoptic_system import PanopticSystem
from detr.lightning.system import DetrSystem

GENERATIONS = sorted(path for path in (Path(__file__).resolve().parents[1] / "fixtures").glob("v*") if path.is_dir())
FIXTURES = [(folder, name, entry) for folder in GENERATIONS
            for name, entry in json.loads((folder / "fixtures.json").read_text()).items()]
CONFIGS = [path for folder in GENERATIONS for path in sorted((folder / "configs").glob("*.yaml"))]

pytestmark = pytest.mark.usefixtures("one_thread")


def _id(fixture: tuple[Path, str, dict]) -> str:
    return f"{fixture[0].name}-{fixture[1]}"


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory) -> Any:
    """``unpack(folder, entry)``: the fixture's file or directory, decompressed once into a temporary folder."""
    root = tmp_path_factory.mktemp("old_files")
    done: dict[tuple[str, str], Path] = {}

    def unpack(folder: Path, entry: dict[str, Any]) -> Path:
        key = (folder.name, entry["name"])
        if key not in done:
            target = root / folder.name
            target.mkdir(exist_ok=True)
            archive = folder / entry["archive"]
            if archive.name.endswith(".tar.xz"):
                with tarfile.open(archive, "r:xz") as tar:
                    tar.extractall(target, filter="data")
            else:
                (target / entry["path"]).write_bytes(lzma.decompress(archive.read_bytes()))
            done[key] = target / entry["path"]
        return done[key]

    return unpack


def _expected(folder: Path, name: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = torch.load(folder / f"{name}.expected.pt", weights_only=True)
    return tensors, json.loads((folder / f"{name}.predictions.json").read_text())


def _close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Equal to 5e-5 relative to the tensor's scale (float rounding of other kernels, not other numbers: the
    fixtures were computed on an Intel CPU, and an AMD EPYC's kernels put one panoptic mask logit of 1,408 at
    1.2e-5 of the scale)."""
    scale = float(expected.abs().max()) if expected.numel() else 1.0
    torch.testing.assert_close(actual.float(), expected.float(), rtol=1e-5, atol=5e-5 * max(scale, 1e-3),
                               msg=lambda message: f"{what}: {message}")


@pytest.mark.parametrize("fixture", FIXTURES, ids=_id)
def test_the_file_loads_and_the_model_computes_the_same(fixture, unpacked) -> None:
    folder, name, entry = fixture
    tensors, record = _expected(folder, name)
    model = load_checkpoint(unpacked(folder, entry))
    assert list(model.meta.category_map.category_ids) == record["category_ids"]
    assert list(model.meta.category_map.names) == record["names"]
    with torch.no_grad():
        outputs = model(tensors["images"], tensors["padding_mask"])
    _close(outputs.logits, tensors["logits"], f"{name} logits")
    _close(outputs.boxes, tensors["boxes"], f"{name} boxes")
    if "masks" in tensors:
        _close(outputs.masks, tensors["masks"], f"{name} masks")
    else:
        assert outputs.masks is None


@pytest.mark.parametrize("fixture", FIXTURES, ids=_id)
def test_the_predictor_finds_the_same_detections(fixture, unpacked) -> None:
    """Predictor.from_checkpoint: the same threshold (and where it came from), eval size and categories, and the
    same detections on the generation's photo.png (query, label, category id, name, score, pixel box), at the
    threshold and with every query kept; the same instance masks and panoptic segments."""
    folder, name, entry = fixture
    tensors, record = _expected(folder, name)
    predictor = Predictor.from_checkpoint(unpacked(folder, entry), device="cpu")
    photo = folder / "photo.png"
    assert predictor.threshold == pytest.approx(record["threshold"], abs=1e-9)
    assert predictor.threshold_source == record["threshold_source"]
    assert [predictor.min_size, predictor.max_size] == record["eval_size"]
    assert list(predictor.category_map.category_ids) == record["category_ids"]
    assert list(predictor.category_map.names) == record["names"]
    task = "instances" if entry["task"] == "masks" else "detection"
    _same_detections(predictor, predictor.predict(photo, task=task)[0], record["at_threshold"], name)
    every = predictor.predict(photo, all_queries=True, task=task)[0]
    _same_detections(predictor, every, record["all_queries"], name)
    if entry["task"] == "masks":
        masks = np.unpackbits(tensors["predictor_masks"].numpy(), count=every.masks.numel()).reshape(every.masks.shape)
        differing = (every.masks != torch.from_numpy(masks).bool()).float().mean()
        assert differing <= 1e-3, f"{name}: {differing:.2%} of the mask pixels differ"
    if entry["task"] == "panoptic":
        assert predictor.panoptic_threshold == pytest.approx(record["panoptic_threshold"])
        assert predictor.panoptic_overlap_threshold == record["panoptic_overlap_threshold"]
        assert predictor.is_thing == record["is_thing"]
        panoptic = predictor.predict(photo, task="panoptic")[0].panoptic
        assert json.loads(json.dumps(panoptic.segments_info)) == record["panoptic_segments"]
        differing = (panoptic.id_map != tensors["panoptic_id_map"].long()).float().mean()
        assert differing <= 1e-3, f"{name}: {differing:.2%} of the panoptic pixels differ"


def _same_detections(predictor: Predictor, prediction: Any, expected: list[dict[str, Any]], name: str) -> None:
    found = {(int(query), int(label)): (label_name, float(score), box.tolist())
             for query, label, label_name, score, box in zip(prediction.query_indices, prediction.labels,
                                                             prediction.label_names, prediction.scores,
                                                             prediction.boxes)}
    assert sorted(found) == sorted((d["query"], d["label"]) for d in expected), f"{name}: other detections"
    for detection in expected:
        label_name, score, box = found[detection["query"], detection["label"]]
        assert label_name == detection["name"]
        assert predictor.category_map.label_to_category_id(detection["label"]) == detection["category_id"]
        assert score == pytest.approx(detection["score"], rel=1e-5, abs=1e-6), name
        assert box == pytest.approx(detection["box"], rel=1e-5, abs=1e-3), name  # pixels


LIGHTNING = [fixture for fixture in FIXTURES if fixture[2]["kind"] == "lightning"]


@pytest.mark.parametrize("fixture", LIGHTNING, ids=_id)
def test_a_training_checkpoint_rebuilds_its_system_and_optimizer(fixture, unpacked) -> None:
    """What ``detr fit --ckpt_path`` needs of the file: the system rebuilt from its hyperparameters (as
    LightningCLI does) takes its weights, and its optimizer and schedulers take their saved states (every
    moment tensor the shape of its parameter)."""
    folder, name, entry = fixture
    path = unpacked(folder, entry)
    checkpoint = torch_load(path)
    system_class = PanopticSystem if entry["system"] == "panoptic" else DetrSystem
    # the mask stage's init_checkpoint (its box stage's file) is not where it was: a moved run, as the docs say
    moved = {"init_checkpoint": None} if checkpoint["hyper_parameters"].get("init_checkpoint") else {}
    system = system_class.load_from_checkpoint(path, map_location="cpu", **moved)
    assert system.category_map.names == tuple(_expected(folder, name)[1]["names"])
    [optimizer], schedulers = system.configure_optimizers()
    optimizer.load_state_dict(checkpoint["optimizer_states"][0])
    parameters = [parameter for group in optimizer.param_groups for parameter in group["params"]]
    assert optimizer.state, f"{name}: no optimizer state"
    for parameter, state in optimizer.state.items():
        assert any(parameter is p for p in parameters)
        assert state["exp_avg"].shape == parameter.shape and state["exp_avg_sq"].shape == parameter.shape
    assert len(schedulers) == len(checkpoint["lr_schedulers"])
    for scheduler, saved in zip(schedulers, checkpoint["lr_schedulers"]):
        scheduler["scheduler"].load_state_dict(saved)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda path: f"{path.parent.parent.name}-{path.name}")
def test_the_yaml_config_parses(config: Path, monkeypatch) -> None:
    """Each config copied from the version that wrote the fixtures parses with today's ``detr`` (``detr-panoptic``
    for the panoptic ones) and prints a model."""
    monkeypatch.setattr("sys.argv", ["detr"])
    command = panoptic_main if "panoptic" in config.name else main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        command(["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(out.getvalue())
    assert printed["model"]["detr"]["backbone"]


DEMO = [fixture for fixture in LIGHTNING if fixture[1] == "demo"]


@pytest.mark.parametrize("fixture", DEMO, ids=_id)
def test_detr_fit_resumes_the_demo_checkpoint(fixture, unpacked, tiny_shapes_root, tmp_path, monkeypatch) -> None:
    """``detr fit --ckpt_path`` with the generation's own demo config trains on from the saved step."""
    from tests.fixtures.make_fixtures import FIT_SETTINGS, FITS

    folder, name, entry = fixture
    monkeypatch.setattr("sys.argv", ["detr"])
    path = unpacked(folder, entry)
    step = torch_load(path)["global_step"]
    config, args, _, _ = FITS[name]
    main(["fit", "--config", str(folder / "configs" / config), *FIT_SETTINGS, *args,
          f"--data.root={tiny_shapes_root}", f"--trainer.default_root_dir={tmp_path / 'run'}",
          f"--trainer.max_steps={step + 1}", "--trainer.check_val_every_n_epoch=100", f"--ckpt_path={path}"])
    resumed = torch_load(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert resumed["global_step"] == step + 1
