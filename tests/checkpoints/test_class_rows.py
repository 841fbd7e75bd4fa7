"""A fine-tune's start (detr.checkpoints.finetune): every family's class-indexed tensors found without naming them,
the class rows carried by name (a known class under another label keeps its row, a new class starts fresh, "no
object" and padding rows carry over), by label, or fresh; and DetrSystem loading a checkpoint that way."""

from __future__ import annotations

import pytest
import torch

from detr.categories import CategoryMap
from detr.checkpoints import save_checkpoint
from detr.checkpoints.finetune import ClassMatchError, class_report, class_rows, initial_state
from detr.inference.command_line import expected_errors
from detr.lightning import DetrSystem
from detr.lightning.system import SettingError
from detr.models.build import build_detr
from tests.helpers import tiny_config_with
from tests.helpers_realtime import CONFIGS, tiny_model

SOURCE = CategoryMap((1, 2, 3), ("circle", "square", "star"))
#: the data of a fine-tune: a new class first, then two of the checkpoint's under other labels ("Star": names
#: match whatever their case)
TARGET = CategoryMap((5, 6, 7), ("cross", "Star", "circle"))


@pytest.mark.parametrize("family", ["paper", "anchor", "rtdetr", "dfine", "deimv2", "rfdetr"])
def test_class_rows_of_every_family(family: str) -> None:
    config = {"paper": tiny_config_with(num_classes=3),
              "anchor": tiny_config_with(num_classes=3, query_type="anchor", denoising=True, class_head="sigmoid",
                                         dense_aux_head=True)}.get(family) or CONFIGS[family].replace(
        num_classes=3, **({} if family == "rfdetr" else {"denoising": True}))
    rows = class_rows(config)
    state = build_detr(config).state_dict()
    assert rows and all(state[key].shape[0] == 3 + extra for key, extra in rows.items())
    others = {key for key, tensor in state.items() if key not in rows and tensor.dim() and tensor.shape[0] in (3, 4)}
    assert not {key for key in others if "class" in key or "score" in key}  # no head missed
    if family == "paper":
        assert rows == {"class_embed.weight": 1, "class_embed.bias": 1}  # softmax: "no object" last
    if family == "anchor":
        assert rows["denoising.label_embed.weight"] == 1 and rows["dense_head.class_embed.weight"] == 0
    if family in ("rtdetr", "dfine"):
        assert rows["decoder.denoising_class_embed.weight"] == 1 and rows["decoder.enc_score_head.bias"] == 0
        assert sum(key.startswith("decoder.dec_score_head.") for key in rows) == 2 * config.num_decoder_layers


def _source_state(config) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    return {key: torch.randn_like(tensor) if tensor.is_floating_point() else tensor
            for key, tensor in build_detr(config).state_dict().items()}


def test_rows_by_name_by_label_and_fresh() -> None:
    config = tiny_config_with(num_classes=3)  # softmax: 3 classes + "no object"
    source = _source_state(config)
    own = build_detr(config).state_dict()
    initial = initial_state(source, SOURCE, config, own, TARGET, "by_name")
    weight, theirs, fresh = initial.state["class_embed.weight"], source["class_embed.weight"], own["class_embed.weight"]
    assert torch.equal(weight[0], fresh[0])  # cross: new
    assert torch.equal(weight[1], theirs[2]) and torch.equal(weight[2], theirs[0])  # Star, circle: their rows
    assert torch.equal(weight[3], theirs[3])  # "no object"
    assert (initial.carried_classes, initial.fresh_classes) == (["Star", "circle"], ["cross"])
    assert initial.fresh_tensors == []
    assert all(torch.equal(initial.state[key], source[key]) for key in source if not key.startswith("class_embed."))

    by_label = initial_state(source, SOURCE, config, own, TARGET, "by_label")
    assert torch.equal(by_label.state["class_embed.weight"], theirs) and by_label.fresh_classes == []
    fresh_rows = initial_state(source, SOURCE, config, own, TARGET, "fresh")
    assert torch.equal(fresh_rows.state["class_embed.weight"][:3], fresh[:3])
    assert torch.equal(fresh_rows.state["class_embed.weight"][3], theirs[3])
    assert fresh_rows.fresh_classes == ["cross", "Star", "circle"]
    # a checkpoint that names no classes: by label, as before names were read
    unnamed = initial_state(source, None, config, own, TARGET, "by_name")
    assert torch.equal(unnamed.state["class_embed.weight"], theirs)


def test_another_class_count_by_name_and_by_label() -> None:
    """Two classes from a 3-class checkpoint: by name the known one keeps its row; by label the heads start fresh
    whole (their shapes differ), the authors' recipe."""
    config = CONFIGS["rtdetr"].replace(num_classes=2, denoising=True)
    source = _source_state(config.replace(num_classes=3))
    own = build_detr(config).state_dict()
    ours = CategoryMap((1, 2), ("square", "ring"))
    initial = initial_state(source, SOURCE, config, own, ours, "by_name")
    for key in ("decoder.enc_score_head.weight", "decoder.dec_score_head.1.bias",
                "decoder.denoising_class_embed.weight"):
        assert initial.state[key].shape == own[key].shape
        assert torch.equal(initial.state[key][0], source[key][1]) and torch.equal(initial.state[key][1], own[key][1])
    assert torch.equal(initial.state["decoder.denoising_class_embed.weight"][2],
                       source["decoder.denoising_class_embed.weight"][3])  # the padding row
    assert initial.fresh_tensors == [] and initial.fresh_classes == ["ring"]
    by_label = initial_state(source, SOURCE, config, own, ours, "by_label")
    key = "decoder.enc_score_head.weight"
    assert key in by_label.fresh_tensors and key not in by_label.state
    assert by_label.fresh_classes == ["square", "ring"]


def test_the_training_system_starts_from_the_rows_by_name(tmp_path) -> None:
    """DetrSystem(init_checkpoint=...) on data whose classes are the checkpoint's in another order plus a new one:
    the known rows follow their names, and validating it is refused because of the new class."""
    model = tiny_model("dfine", category_map=CategoryMap((1, 2, 3, 4, 5), ("circle", "square", "triangle", "star",
                                                                            "ring")))
    path = save_checkpoint(model, tmp_path / "dfine.ckpt")
    data = CategoryMap((1, 2, 3), ("ring", "cross", "circle"))
    system = DetrSystem(detr=CONFIGS["dfine"].replace(num_classes=3), category_map=data, init_checkpoint=str(path))
    theirs, loaded = model.state_dict(), system.model.state_dict()
    for key in ("decoder.enc_score_head.weight", "decoder.dec_score_head.0.weight"):
        assert torch.equal(loaded[key][0], theirs[key][4]) and torch.equal(loaded[key][2], theirs[key][0])
        assert not torch.equal(loaded[key][1], theirs[key][1])
    assert system._fresh_classes == ["cross"]

    class Trainer:  # what setup reads
        ckpt_path = None

        class strategy:
            root_device = torch.device("cpu")

    system.trainer = Trainer()  # type: ignore[assignment]
    with pytest.raises(SettingError, match="not trained on 1 of the data's classes \\('cross'\\)"):
        system.setup("validate")


def test_by_name_refuses_names_that_match_no_single_row(tmp_path) -> None:
    """A name the data has twice (whatever its case), or a name of the data the checkpoint has twice, cannot be
    matched by name: refused with the fix, before any weight is loaded (by label or fresh, the names do not
    matter); `detr fit` prints it as one error line (a CheckpointError)."""
    config = tiny_config_with(num_classes=3)
    source, own = _source_state(config), build_detr(config).state_dict()
    twice_here = CategoryMap((5, 6, 7), ("circle", "cross", "Circle "))
    with pytest.raises(ClassMatchError, match="the data names 2 classes 'circle' \\(labels 0, 2.*merge them"):
        initial_state(source, SOURCE, config, own, twice_here, "by_name")
    twice_there = CategoryMap((1, 2, 3), ("star", "circle", "star"))
    with pytest.raises(ClassMatchError, match="checkpoint names 2 classes 'star' \\(its labels 0, 2\\).*by_label"):
        initial_state(source, twice_there, config, own, TARGET, "by_name")
    unused = initial_state(source, twice_there, config, own, CategoryMap((1, 2, 3), ("circle", "cross", "ring")),
                           "by_name")  # the repeated name is not the data's: nothing to choose
    assert unused.carried_classes == ["circle"]
    for init_classes in ("by_label", "fresh"):
        initial_state(source, twice_there, config, own, twice_here, init_classes)
    assert issubclass(ClassMatchError, expected_errors())

    path = save_checkpoint(tiny_model("dfine", category_map=twice_there), tmp_path / "twice.ckpt")
    with pytest.raises(ClassMatchError, match="'star'"):
        DetrSystem(detr=CONFIGS["dfine"].replace(num_classes=3), category_map=TARGET, init_checkpoint=str(path))


def test_the_report_says_what_was_kept_and_how() -> None:
    config = tiny_config_with(num_classes=3)
    source, own = _source_state(config), build_detr(config).state_dict()
    by_name = initial_state(source, SOURCE, config, own, TARGET, "by_name")
    assert class_report(by_name, "a.ckpt", "by_name") == \
        "init_checkpoint: 2 classes start from a.ckpt's rows (by name: Star, circle), 1 fresh: cross"
    unnamed = initial_state(source, None, config, own, TARGET, "by_name")
    assert class_report(unnamed, "a.pth", "by_name") == (
        "init_checkpoint: 3 classes start from a.pth's rows (by label: a side names no classes: cross, Star, circle), "
        "0 fresh")
    fresh = initial_state(source, SOURCE, config, own, TARGET, "fresh")
    assert class_report(fresh, "a.ckpt", "fresh") == \
        "init_checkpoint: 0 classes start from a.ckpt's rows (init_classes=fresh), 3 fresh: cross, Star, circle"
