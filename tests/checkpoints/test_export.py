"""detr.checkpoints.export, detr.checkpoints.onnx and tools/export.py: exported files reproduce the PyTorch model at any
batch and image size, with post-processing in the graph, through detr.Predictor, and fail loudly when not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from detr import CategoryMap, PostProcess, build_detr, build_detr_panoptic, load_checkpoint
from detr.checkpoints.export import DeployModel, export, export_onnx, load_program, pair_rows, prepare_for_export
from detr.checkpoints.formats import CheckpointError, ExportError
from tests.helpers import TINY, load_script, padded, save_project_checkpoint

pytest.importorskip("onnx")
pytest.importorskip("onnxscript")
ort = pytest.importorskip("onnxruntime")

from detr.checkpoints.onnx import OnnxDetector, read_onnx_metadata

ROOT = Path(__file__).resolve().parents[2]
PHOTOS = ROOT / "data" / "photos"
CATEGORIES = CategoryMap((1, 3, 5, 7, 9), ("circle", "square", "triangle", "star", "cross"))
EVAL_SIZE = (160, 240)  # small eval resize, recorded in the checkpoint and carried into the ONNX metadata


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory):
    """The tiny model as a project checkpoint, exported to ONNX once by tools/export.py (verified there)."""
    folder = tmp_path_factory.mktemp("export")
    torch.manual_seed(0)
    checkpoint = save_project_checkpoint(build_detr(TINY, dropout=0.0), folder / "tiny.ckpt", EVAL_SIZE, CATEGORIES)
    onnx_path = folder / "tiny.onnx"
    assert load_script("tools/export.py").main([str(checkpoint), "--out", str(onnx_path)]) == 0
    return checkpoint, onnx_path


@pytest.fixture(scope="module")
def tiny_model_loaded(tiny_export):
    return load_checkpoint(tiny_export[0])


def test_export_tool_writes_a_verified_file_with_metadata(tiny_export, tiny_model_loaded, capsys):
    _, onnx_path = tiny_export
    meta = read_onnx_metadata(onnx_path)
    assert meta["outputs"] == "raw" and meta["class_head"] == "softmax" and meta["num_classes"] == 5
    assert CategoryMap.from_dict(meta["category_map"]) == CATEGORIES
    assert tuple(meta["eval_size"]) == EVAL_SIZE
    assert meta["model_config"]["hidden_dim"] == TINY.hidden_dim
    detector = OnnxDetector(onnx_path)
    assert detector.meta.category_map == CATEGORIES and detector.meta.eval_size == EVAL_SIZE
    assert detector.backend == "onnxruntime (CPUExecutionProvider)"
    assert [i.name for i in detector.session.get_inputs()] == ["images", "padding_mask"]
    assert [o.name for o in detector.session.get_outputs()] == ["pred_logits", "pred_boxes"]


# (100, 150) + (140, 90): a 140 × 150 batch whose 5 × 5 feature map ONNX Resize would mask one column wider than
# F.interpolate does (the backbones now pick the mask's columns by index)
@pytest.mark.parametrize("sizes", [[(70, 100)], [(96, 128), (64, 200), (130, 66)], [(257, 33)],
                                   [(100, 150), (140, 90)]])
def test_one_file_serves_every_batch_and_image_size(tiny_export, tiny_model_loaded, sizes):
    torch.manual_seed(len(sizes))
    images, mask = padded([torch.randn(3, h, w) for h, w in sizes])
    with torch.no_grad():
        expected = tiny_model_loaded(images, mask)
    got = OnnxDetector(tiny_export[1])(images, mask)
    torch.testing.assert_close(got.logits, expected.logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(got.boxes, expected.boxes, atol=1e-5, rtol=0)


def test_each_image_of_a_padded_batch_gets_its_own_result(tiny_export, tiny_model_loaded):
    # DETR's outputs depend on the padded size (the backbone's receptive fields reach into the padding, so
    # evaluation AP depends on the batch); what the graph must keep is that an image's result depends only
    # on that image and the padded size, never on the other images, and that it equals PyTorch's.
    detector = OnnxDetector(tiny_export[1])
    torch.manual_seed(3)
    first, second, third = torch.randn(3, 96, 128), torch.randn(3, 64, 192), torch.randn(3, 50, 192)
    with_second = detector(*padded([first, second]))
    with_third = detector(*padded([first, third]))
    images, mask = padded([first, second])
    alone = detector(images[:1], mask[:1])  # the first image alone, padded to the same 96 × 192
    for key in ("logits", "boxes"):
        torch.testing.assert_close(getattr(with_second, key)[0], getattr(with_third, key)[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(getattr(with_second, key)[0], getattr(alone, key)[0], atol=1e-5, rtol=0)
    with torch.no_grad():
        expected = tiny_model_loaded(images, mask)
    torch.testing.assert_close(with_second.logits, expected.logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(with_second.boxes, expected.boxes, atol=1e-5, rtol=0)


def test_predictor_on_onnx_writes_the_predictions_of_the_pytorch_model(tiny_export, tmp_path, capsys):
    checkpoint, onnx_path = tiny_export
    predict = load_script("tools/predict.py").main
    for name, source in (("torch", checkpoint), ("onnx", onnx_path)):
        status = predict([str(PHOTOS), "--checkpoint", str(source), "--out", str(tmp_path / name), "--all-queries",
                          "--device", "cpu", "--batch-size", "2", "--no-draw"])
        assert status == 0
    out = capsys.readouterr().out
    assert "backend: pytorch (cpu, fp32)" in out and "backend: onnxruntime (CPUExecutionProvider)" in out
    # the summary says what the json holds: every query, not just the detections above the threshold
    assert out.count(f"every query written ({5 * TINY.num_queries}, --all-queries)") == 2
    torch_results = json.loads((tmp_path / "torch" / "predictions.json").read_text())
    onnx_results = json.loads((tmp_path / "onnx" / "predictions.json").read_text())
    assert len(onnx_results) == len(torch_results) == 5 * TINY.num_queries
    for a, b in zip(torch_results, onnx_results):
        assert (a["file_name"], a["image_id"], a["category_id"]) == (b["file_name"], b["image_id"], b["category_id"])
        assert max(abs(x - y) for x, y in zip(a["bbox"], b["bbox"])) <= 0.1  # pixels (the json rounds to 0.01)
        assert abs(a["score"] - b["score"]) <= 1e-4
    assert {r["category_id"] for r in onnx_results} <= set(CATEGORIES.category_ids)  # ids from the metadata


def test_predictor_uses_the_metadata_and_refuses_attention(tiny_export):
    from detr import Predictor

    predictor = Predictor.from_checkpoint(tiny_export[1], device="cpu")
    assert (predictor.min_size, predictor.max_size) == EVAL_SIZE
    assert predictor.category_map == CATEGORIES
    with pytest.raises(ValueError, match="attention maps are not available"):
        predictor.predict(PHOTOS / "chelsea.png", return_attention=True)
    with pytest.raises(ValueError, match="precision"):
        Predictor.from_checkpoint(tiny_export[1], precision="bf16")


@pytest.mark.parametrize("damage", ["truncated", "text", "empty"])
def test_a_corrupt_onnx_file_is_named_with_the_fix(tiny_export, tmp_path, capsys, damage):
    data = tiny_export[1].read_bytes()
    broken = tmp_path / "broken.onnx"
    broken.write_bytes({"truncated": data[: len(data) // 3], "text": b"this is not a model\n", "empty": b""}[damage])
    for open_file in (OnnxDetector, read_onnx_metadata):
        with pytest.raises(CheckpointError, match=r"broken\.onnx.*detr-export"):
            open_file(broken)
    status = load_script("tools/predict.py").main([str(PHOTOS / "chelsea.png"), "--checkpoint", str(broken),
                                                   "--out", str(tmp_path / "out"), "--device", "cpu"])
    err = capsys.readouterr().err
    assert status == 1 and "broken.onnx" in err and "detr-export" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "predictions.json").exists()


def test_verification_rejects_a_file_that_does_not_match(tiny_export, tmp_path, monkeypatch, capsys):
    torch.manual_seed(5)  # same architecture, other weights: the tiny file is wrong for it
    other = save_project_checkpoint(build_detr(TINY, dropout=0.0), tmp_path / "other.ckpt", EVAL_SIZE, CATEGORIES)
    monkeypatch.setattr("detr.checkpoints.export.export_onnx",
                        lambda model, path, **kwargs: Path(path).write_bytes(tiny_export[1].read_bytes()))
    out = tmp_path / "other.onnx"
    assert load_script("tools/export.py").main([str(other), "--out", str(out)]) == 1
    assert "does not reproduce the PyTorch model" in capsys.readouterr().err
    assert not out.exists() and (tmp_path / "other.onnx.failed").exists()


def demo_model_config() -> dict:
    """The detector of configs/demo_shapes_cpu.yaml: its model.detr section (DetrConfig fields)."""
    return dict(yaml.safe_load((ROOT / "configs" / "demo_shapes_cpu.yaml").read_text())["model"]["detr"])


@pytest.fixture(scope="module")
def demo_postprocess_export(tmp_path_factory):
    """The demo config's model (anchor queries, sigmoid head, denoising, dense head, BatchNorm, stride 16),
    exported with the post-processing in the graph."""
    torch.manual_seed(0)
    model = build_detr(**demo_model_config(), num_classes=5).eval()
    assert model.query_type == "anchor" and model.class_head == "sigmoid" and model.denoising is not None
    path = tmp_path_factory.mktemp("demo") / "demo.onnx"
    verification = export(model, path, postprocess=True)
    assert verification.passed
    return model, path


def test_postprocess_graph_matches_postprocess(demo_postprocess_export):
    model, path = demo_postprocess_export
    torch.manual_seed(4)
    images, mask = padded([torch.randn(3, 128, 128), torch.randn(3, 96, 112), torch.randn(3, 80, 128)])
    orig_sizes = torch.tensor([[480, 640], [300, 350], [1000, 1600]])
    got = OnnxDetector(path).detect(images, mask, orig_sizes)
    with torch.no_grad():
        expected = PostProcess(class_head="sigmoid")(model(images, mask), orig_sizes)
    for index, result in enumerate(expected):
        torch.testing.assert_close(got["scores"][index], result["scores"], atol=1e-5, rtol=0)
        assert torch.equal(got["labels"][index], result["labels"])
        torch.testing.assert_close(got["boxes"][index], result["boxes"], atol=0.01, rtol=0)  # pixels
    meta = read_onnx_metadata(path)
    # the demo's backbone stops at layer2: stride 8, so one stride more than a single cell is 9 pixels
    assert meta["outputs"] == "postprocessed" and meta["class_head"] == "sigmoid" and meta["min_image_size"] == 9


def test_postprocessed_file_is_refused_where_raw_outputs_are_needed(demo_postprocess_export):
    detector = OnnxDetector(demo_postprocess_export[1])
    images, mask = padded([torch.randn(3, 64, 64)])
    with pytest.raises(ValueError, match="with post-processing"):
        detector(images, mask)
    with pytest.raises(ValueError, match="at least 9"):
        detector.detect(*padded([torch.randn(3, 8, 64)]), torch.tensor([[8, 64]]))


def test_a_postprocessed_onnx_file_is_refused_once_at_load(demo_postprocess_export, tmp_path, capsys):
    """detr-predict on a file exported with --postprocess failed once per image, then left an empty
    predictions.json that blocked its --out."""
    from detr import Predictor

    with pytest.raises(CheckpointError, match=r"demo\.onnx was exported with --postprocess.*without --postprocess"):
        Predictor.from_checkpoint(demo_postprocess_export[1])
    out = tmp_path / "out"
    status = load_script("tools/predict.py").main([str(PHOTOS / "chelsea.png"), str(PHOTOS / "astronaut.png"),
                                                   "--checkpoint", str(demo_postprocess_export[1]),
                                                   "--out", str(out), "--device", "cpu"])
    err = capsys.readouterr().err
    # one error line, not one per image (an earlier test in the process may have turned on the package's INFO
    # lines, such as "opened ... with onnxruntime": they are not errors)
    errors = [line for line in err.splitlines() if "--postprocess" in line]
    assert status != 0 and len(errors) == 1 and errors[0].count("--postprocess") == 2, err
    assert not (out / "predictions.json").exists()


def test_softmax_postprocess_graph_and_pt2_program_match(tmp_path):
    torch.manual_seed(0)
    model = build_detr(TINY, dropout=0.0).eval()
    verification = export(model, tmp_path / "tiny.pt2", format="pt2", postprocess=True)
    assert verification.passed
    program, meta = load_program(tmp_path / "tiny.pt2")
    assert meta["outputs"] == "postprocessed" and meta["class_head"] == "softmax"
    torch.manual_seed(6)
    images, mask = padded([torch.randn(3, 100, 150), torch.randn(3, 140, 90), torch.randn(3, 64, 64)])
    orig_sizes = torch.tensor([[200, 300], [700, 450], [64, 64]])
    scores, labels, boxes = program(images, mask, orig_sizes)
    with torch.no_grad():
        expected = PostProcess()(model(images, mask), orig_sizes)
    for index, result in enumerate(expected):
        torch.testing.assert_close(scores[index], result["scores"], atol=1e-5, rtol=0)
        assert torch.equal(labels[index], result["labels"])
        torch.testing.assert_close(boxes[index], result["boxes"], atol=0.01, rtol=0)


def test_a_pt2_program_given_as_a_checkpoint_is_named_with_the_fix(tmp_path, capsys):
    """detr-predict on the .pt2 that detr-export wrote said the file was "probably corrupted" (torch.load's
    words for an archive without data.pkl)."""
    from detr.checkpoints.export import export_program

    program = export_program(build_detr(TINY, dropout=0.0).eval(), tmp_path / "tiny.pt2")
    with pytest.raises(CheckpointError, match=r"tiny\.pt2 is a torch\.export program") as refusal:
        load_checkpoint(program)
    assert "--format onnx" in str(refusal.value) and "corrupted" not in str(refusal.value)
    status = load_script("tools/predict.py").main([str(PHOTOS / "chelsea.png"), "--checkpoint", str(program),
                                                   "--out", str(tmp_path / "out"), "--device", "cpu"])
    err = capsys.readouterr().err
    assert status != 0 and "torch.export program" in err and "Traceback" not in err


def test_what_cannot_export_is_a_clear_error(tmp_path):
    with pytest.raises(ExportError, match="only a detr Detector exports"):
        export_onnx(torch.nn.Linear(2, 2), tmp_path / "linear.onnx")
    assert not (tmp_path / "linear.onnx").exists()
    panoptic = build_detr_panoptic(TINY.replace(hidden_dim=128, num_heads=8))
    with pytest.raises(ExportError, match=r"mask head is not part of the export \(export its detector"):
        export_onnx(panoptic, tmp_path / "panoptic.onnx")
    assert not (tmp_path / "panoptic.onnx").exists()


def test_export_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    model = build_detr(TINY, dropout=0.0)  # training mode, unfolded BatchNorms
    prepared = prepare_for_export(model)
    assert model.training and not prepared.training
    assert "backbone.0.body.bn1.running_mean" in model.state_dict()
    assert "backbone.0.body.bn1.running_mean" not in prepared.state_dict()  # folded in the copy only
    assert DeployModel(prepared).output_names == ["pred_logits", "pred_boxes"]


def test_import_detr_needs_no_onnx():
    code = ("import sys, detr, detr.checkpoints.export, detr.checkpoints.onnx, detr.inference.predictor; "
            "assert not {'onnx', 'onnxruntime', 'onnxscript'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.slow
def test_r50_exports_and_matches_pytorch_on_a_photo(tmp_path):
    """The paper's model (R50 layout, random weights) through the whole path: export, verify, Predictor."""
    from detr import Predictor

    torch.manual_seed(0)
    model = build_detr().eval()
    path = tmp_path / "r50.onnx"
    assert export(model, path).passed
    photo = PHOTOS / "000000039769.png"
    onnx_prediction = Predictor.from_checkpoint(path, device="cpu", min_size=320, max_size=480).predict(
        photo, all_queries=True)[0]
    torch_prediction = Predictor(model, device="cpu", min_size=320, max_size=480, optimize=True).predict(
        photo, all_queries=True)[0]
    assert torch.equal(onnx_prediction.labels, torch_prediction.labels)
    torch.testing.assert_close(onnx_prediction.scores, torch_prediction.scores, atol=1e-4, rtol=0)
    assert (onnx_prediction.boxes - torch_prediction.boxes).abs().max() <= 0.1  # pixels


def test_verification_pairs_rows_that_another_runtime_ranked_in_another_order():
    # Two near-tied queries swapped by a runtime's top-k are the same detections: paired back, no difference;
    # a query that really differs still differs after pairing.
    generator = torch.Generator().manual_seed(0)
    logits, boxes = torch.randn(2, 6, 3, generator=generator), torch.rand(2, 6, 4, generator=generator)
    swapped = torch.tensor([0, 2, 1, 3, 5, 4])
    paired = pair_rows((logits, boxes), (logits[:, swapped] + 1e-7, boxes[:, swapped]))
    assert (paired[0] - logits).abs().max() <= 1e-6 and torch.equal(paired[1], boxes)
    changed = boxes[:, swapped].clone()
    changed[1, 4, 0] += 0.25
    paired = pair_rows((logits, boxes), (logits[:, swapped], changed))
    assert torch.equal(paired[0], logits) and (paired[1] - boxes).abs().max() == pytest.approx(0.25)
    unpaired = (logits[:, swapped], boxes[:, :5])  # outputs of different row counts are left as they are
    assert pair_rows((logits, boxes[:, :5]), unpaired) is unpaired
