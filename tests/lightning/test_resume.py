"""Resuming from last.ckpt continues exactly: same final weights as an uninterrupted run (deterministic
mode, shuffled data, dropout and a learning-rate drop, so optimizer, scheduler, epoch and RNG state all
have to come back)."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from detr.checkpoints import CheckpointError
from detr.lightning import DetrSystem
from detr.lightning.cli import main
from detr.lightning.options import EvaluationOptions
from detr.models.recipe import OptimizerRecipe
from tests.helpers import InMemoryData, tiny_config_with, tiny_fit_args

TINY = tiny_config_with(num_classes=3, backbone_last_stage="layer3", dropout=0.1)
RECIPE = OptimizerRecipe(lr=1e-3, lr_backbone=1e-4, lr_drop_epochs=[2])
SIZE = 48

pytestmark = pytest.mark.usefixtures("one_thread")


def _samples() -> list[tuple[torch.Tensor, dict]]:
    generator = torch.Generator().manual_seed(0)
    samples = []
    for index in range(6):
        count = index % 3
        boxes = torch.rand(count, 4, generator=generator) * 0.4 + torch.tensor([0.3, 0.3, 0.1, 0.1])
        target = {"boxes": boxes, "labels": torch.randint(0, 3, (count,), generator=generator),
                  "image_id": torch.tensor(index + 1), "orig_size": torch.tensor([SIZE, SIZE]),
                  "size": torch.tensor([SIZE, SIZE])}
        samples.append((torch.randn(3, SIZE, SIZE, generator=generator), target))
    return samples


def _shuffled_data() -> InMemoryData:
    samples = _samples()
    return InMemoryData(samples, shuffle=True, val_samples=samples[:2])  # batches of 2: 3 steps per epoch


def _fit(tmp_path, *, max_epochs: int, ckpt_path: str | None = None, init_seed: int = 0) -> DetrSystem:
    L.seed_everything(123)
    torch.manual_seed(init_seed)
    system = DetrSystem(detr=TINY, optimizer=RECIPE, evaluation=EvaluationOptions(evaluation_dir=""))
    L.seed_everything(123)  # the same seed at the entry point, as `detr fit` does it
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_epochs=max_epochs, deterministic=True, gradient_clip_val=0.1,
        num_sanity_val_steps=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[ModelCheckpoint(dirpath=tmp_path, save_last=True)], default_root_dir=tmp_path,
    )
    trainer.fit(system, datamodule=_shuffled_data(), ckpt_path=ckpt_path)
    assert trainer.current_epoch == max_epochs
    return system


def test_resumed_run_ends_with_the_same_weights(tmp_path) -> None:
    uninterrupted = _fit(tmp_path / "full", max_epochs=3)
    _fit(tmp_path / "part", max_epochs=1)  # stops after 3 of 9 steps
    # another initialisation: everything must come from the checkpoint
    resumed = _fit(tmp_path / "resumed", max_epochs=3, ckpt_path=str(tmp_path / "part" / "last.ckpt"), init_seed=1)

    expected, actual = uninterrupted.state_dict(), resumed.state_dict()
    assert expected.keys() == actual.keys()
    different = [k for k in expected if not torch.equal(expected[k], actual[k])]
    assert not different, different[:5]
    assert resumed.trainer.global_step == uninterrupted.trainer.global_step == 9
    assert resumed.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(1e-4)  # dropped at epoch 2


def test_without_rng_state_the_resumed_run_would_differ(tmp_path, monkeypatch) -> None:
    """Guards the test above: dropout and shuffling make RNG state matter here."""
    uninterrupted = _fit(tmp_path / "full", max_epochs=2)
    _fit(tmp_path / "part", max_epochs=1)
    monkeypatch.setattr("detr.lightning.checkpointing.set_rng_states", lambda states: None)
    resumed = _fit(tmp_path / "resumed", max_epochs=2, ckpt_path=str(tmp_path / "part" / "last.ckpt"))
    expected, actual = uninterrupted.state_dict(), resumed.state_dict()
    assert any(not torch.equal(expected[k], actual[k]) for k in expected)


# ------------------------------------------------------------------------- extending a finished run (CLI)
def _optimizer_lrs(path) -> list[float]:
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    return [group["lr"] for group in checkpoint["optimizer_states"][0]["param_groups"]]


def _weights(path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]


@pytest.mark.usefixtures("bare_argv")
def test_a_finished_run_resumed_with_more_steps_keeps_learning(tiny_shapes_root, tmp_path) -> None:
    """The decay to zero of the first run (the demo config's lr_decay_fraction 0.3) used to stay at its
    length: resumed with max_steps 8, the run trained 4 more steps at learning rate 0 with its weights
    unchanged; and --model.optimizer.lr given at resume was ignored."""
    out = tmp_path / "run"
    main(tiny_fit_args(tiny_shapes_root, out, "--trainer.max_steps=4", "--model.optimizer.warmup_steps=0"))
    last = out / "checkpoints" / "last.ckpt"
    assert _optimizer_lrs(last) == [0.0, 0.0]  # the first run decayed to zero at its end
    finished = _weights(last)

    main(tiny_fit_args(tiny_shapes_root, out, "--trainer.max_steps=8", "--model.optimizer.warmup_steps=0",
                       f"--ckpt_path={last}"))
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 8
    # the decay follows the new length: the last 30 % of 8 steps; the step-8 rate is 5e-4 × (8 - 8) / 2.4 = 0
    # after a step at 5e-4 × (8 - 7) / 2.4
    decay = next(s for s in checkpoint["lr_schedulers"] if "total_steps" in s)
    assert decay["total_steps"] == 8
    resumed = _weights(last)
    trained = [k for k in finished if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    assert any(not torch.equal(finished[k], resumed[k]) for k in trained)  # parameters, not batch-norm statistics

    # another learning rate at resume is used: the schedule's base rates are this run's --model.optimizer.lr (and the
    # config's lr_backbone), not the checkpoint's 5e-4; so is another lr_decay_fraction
    main(tiny_fit_args(tiny_shapes_root, out, "--trainer.max_steps=10", "--model.optimizer.warmup_steps=0",
                       "--model.optimizer.lr=1e-3", "--model.optimizer.lr_decay_fraction=0.5", f"--ckpt_path={last}"))
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 10
    assert [group["initial_lr"] for group in checkpoint["optimizer_states"][0]["param_groups"]] == [1e-3, 5e-4]
    assert all(scheduler["base_lrs"] == [1e-3, 5e-4] for scheduler in checkpoint["lr_schedulers"])
    assert next(s for s in checkpoint["lr_schedulers"] if "total_steps" in s)["decay_fraction"] == 0.5


@pytest.mark.usefixtures("bare_argv")
def test_resuming_with_another_model_shape_names_the_options_and_the_fix(tiny_shapes_root, tmp_path) -> None:
    """It used to fail with torch's bare `size mismatch for model.refpoint_embed.weight`."""
    out = tmp_path / "run"
    main(tiny_fit_args(tiny_shapes_root, out, "--trainer.max_steps=2"))
    last = out / "checkpoints" / "last.ckpt"
    with pytest.raises(CheckpointError) as refusal:
        main(tiny_fit_args(tiny_shapes_root, out, "--trainer.max_steps=4", "--model.detr.num_queries=7",
                           "--model.detr.hidden_dim=16", f"--ckpt_path={last}"))
    message = str(refusal.value)
    assert str(last) in message
    assert "hidden_dim 32 (checkpoint) vs 16 (this run)" in message and "num_queries 10 (checkpoint) vs 7" in message
    assert "keeps the checkpoint's model" in message and f"--model.init_checkpoint {last}" in message


def test_a_fine_tuned_run_resumes_and_validates_after_its_source_moved(tiny_shapes_root, tmp_path) -> None:
    """``--ckpt_path`` holds every weight: a run fine-tuned from init_checkpoint resumes and validates once that
    file is gone (it failed, naming the moved file, not the one passed)."""
    main(tiny_fit_args(tiny_shapes_root, tmp_path / "source", "--trainer.max_steps=2"))
    source = tmp_path / "source.ckpt"
    (tmp_path / "source" / "checkpoints" / "last.ckpt").rename(source)
    run = tmp_path / "fine-tuned"
    main(tiny_fit_args(tiny_shapes_root, run, "--trainer.max_steps=2", f"--model.init_checkpoint={source}"))
    source.unlink()
    last = run / "checkpoints" / "last.ckpt"
    main(tiny_fit_args(tiny_shapes_root, run, "--trainer.max_steps=4", f"--ckpt_path={last}"))
    assert torch.load(last, weights_only=True)["global_step"] == 4
    validate = ["validate", *tiny_fit_args(tiny_shapes_root, run)[1:], f"--ckpt_path={last}"]
    main(validate)


def test_data_with_other_category_ids_than_the_checkpoint_is_refused() -> None:
    """A resume, detr validate or detr test on data whose category ids differ from the checkpoint's ran
    silently at AP 0 and kept the old map."""
    from detr.categories import CategoryMap

    trained = CategoryMap((1, 2, 3), ("a", "b", "c"))
    checkpoint = {"detr": {"category_map": trained.to_dict()}}
    same = DetrSystem(detr=TINY, category_map=CategoryMap((1, 2, 3), ("a", "b", "c")))
    same.on_load_checkpoint(checkpoint)
    assert same.category_map == trained
    other = DetrSystem(detr=TINY, category_map=CategoryMap((3, 7, 9), ("a", "b", "c")))
    with pytest.raises(CheckpointError, match=r"category ids \[1, 2, 3\].*\[3, 7, 9\].*init_checkpoint"):
        other.on_load_checkpoint(checkpoint)
    unlinked = DetrSystem(detr=TINY)  # no data linked (e.g. load_from_checkpoint): the checkpoint's map is taken
    unlinked.on_load_checkpoint(checkpoint)
    assert unlinked.category_map == trained



def test_data_with_the_same_category_ids_under_other_names_is_named(caplog) -> None:
    """The same ids with swapped names: validate and resume went ahead without a word, and the resumed
    checkpoint kept the old names."""
    from detr.categories import CategoryMap

    checkpoint = {"detr": {"category_map": CategoryMap((1, 2, 3), ("cat", "dog", "cow")).to_dict()}}
    swapped = DetrSystem(detr=TINY, category_map=CategoryMap((1, 2, 3), ("dog", "cat", "cow")))
    with pytest.raises(CheckpointError, match=r"same category ids other names \(id 1 is 'cat' in the checkpoint, "
                       r"'dog' in the json; id 2 is 'dog' in the checkpoint, 'cat' in the json\).*init_checkpoint"):
        swapped.on_load_checkpoint(checkpoint)
    renamed_map = CategoryMap((1, 2, 3), ("cat", "dog", "bull"))
    renamed = DetrSystem(detr=TINY, category_map=renamed_map)
    with caplog.at_level("WARNING", logger="detr.lightning.system"):
        renamed.on_load_checkpoint(checkpoint)
    assert "id 3 is 'cow' in the checkpoint, 'bull' in the json" in caplog.text
    assert renamed.category_map == renamed_map  # the json's names, saved with the next checkpoint
    caplog.clear()
    same_but_case = DetrSystem(detr=TINY, category_map=CategoryMap((1, 2, 3), ("Cat", "dog ", "cow")))
    with caplog.at_level("WARNING", logger="detr.lightning.system"):
        same_but_case.on_load_checkpoint(checkpoint)
    assert "differently" not in caplog.text


def _rate_of_this_schedule(checkpoint: dict, base: float, *, drops: list[int], warmup_steps: int) -> float:
    """The recipe's rate in closed form at the steps and epochs a checkpoint's schedulers reached: warm-up from
    1/1000 over ``warmup_steps`` times 0.1 per passed drop epoch."""
    states = checkpoint["lr_schedulers"]
    epochs = next(s for s in states if "milestones" in s)["last_epoch"]
    step = checkpoint["global_step"]
    warmup = 1e-3 + (1 - 1e-3) * min(step, warmup_steps) / warmup_steps if warmup_steps else 1.0
    return base * 0.1 ** sum(epochs >= drop for drop in drops) * warmup


@pytest.mark.usefixtures("bare_argv")
def test_a_resume_trains_on_the_schedule_it_records(tiny_shapes_root, tmp_path) -> None:
    """A resume with other --model.optimizer.warmup_steps / --model.optimizer.lr_drop_epochs trained on the
    checkpoint's schedule (weights bit-identical to a resume without them) yet recorded the new values in its checkpoint."""
    out = tmp_path / "run"
    constant = ["--model.optimizer.warmup_steps=0", "--model.optimizer.lr_decay_fraction=0"]
    main(tiny_fit_args(tiny_shapes_root, out, "--trainer.max_steps=4", *constant))
    last = out / "checkpoints" / "last.ckpt"
    assert _optimizer_lrs(last) == [5e-4, 5e-4]  # the demo config's lr and lr_backbone, no schedule

    # warm-up added, and a drop at epoch 2: both at the step reached (4 steps of 2 an epoch: epoch 2 begins)
    main(tiny_fit_args(tiny_shapes_root, out, "--trainer.max_steps=6", "--model.optimizer.warmup_steps=100",
                       "--model.optimizer.lr_drop_epochs=[2]", "--model.optimizer.lr_decay_fraction=0",
                       f"--ckpt_path={last}"))
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 6
    assert checkpoint["hyper_parameters"]["optimizer"]["warmup_steps"] == 100  # recorded, and so it trained:
    step_decay, warmup = checkpoint["lr_schedulers"]
    assert sorted(step_decay["milestones"].elements()) == [2] and warmup["total_iters"] == 100
    expected = _rate_of_this_schedule(checkpoint, 5e-4, drops=[2], warmup_steps=100)
    assert expected < 5e-4 * 0.1
    assert _optimizer_lrs(last) == pytest.approx([expected, expected], rel=1e-6)

    # and taken away again: no warm-up, no drop, the plain rate from the step reached on
    main(tiny_fit_args(tiny_shapes_root, out, "--trainer.max_steps=8", "--model.optimizer.lr_drop_epochs=[]", *constant,
                       f"--ckpt_path={last}"))
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 8 and len(checkpoint["lr_schedulers"]) == 1
    assert _optimizer_lrs(last) == pytest.approx([5e-4, 5e-4], rel=1e-6)


def test_an_unchanged_schedule_keeps_the_checkpoints_states() -> None:
    """A plain resume restores the schedulers exactly as saved (bit-exact continuation)."""
    from detr.lightning.schedule import fit_saved_schedulers, learning_rate_schedulers

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    saved = [c["scheduler"].state_dict() for c in learning_rate_schedulers(
        optimizer, lr_drop_epochs=[3], lr_drop_gamma=0.1, warmup_steps=5, decay_fraction=0.3, total_steps=20)]
    states, changes = fit_saved_schedulers(saved, lr_drop_epochs=[3], lr_drop_gamma=0.1, warmup_steps=5,
                                           decay_fraction=0.3, global_step=0)
    assert states is saved and changes == []
    states, changes = fit_saved_schedulers(saved, lr_drop_epochs=[3], lr_drop_gamma=0.1, warmup_steps=0,
                                           decay_fraction=0.3, global_step=7)
    assert changes == ["warmup_steps 5 (checkpoint) -> 0"]
    assert states[0] is saved[0] and states[1] is saved[2]  # the warm-up's state is not loaded into the decay


@pytest.mark.usefixtures("bare_argv")
def test_a_resume_below_the_checkpoints_step_or_from_a_weights_file_names_the_fix(tiny_shapes_root, tmp_path) -> None:
    """A --trainer.max_steps below the checkpoint's step trained nothing without a word; --ckpt_path to a weights
    file ended in Lightning's KeyError: 'pytorch-lightning_version'. Neither touches the checkpoint."""
    out = tmp_path / "run"
    main(tiny_fit_args(tiny_shapes_root, out, "--trainer.max_steps=4"))
    last = out / "checkpoints" / "last.ckpt"
    saved = last.read_bytes()
    with pytest.raises(CheckpointError) as refusal:
        main(tiny_fit_args(tiny_shapes_root, out, "--trainer.max_steps=2", f"--ckpt_path={last}"))
    message = str(refusal.value)
    assert "at step 4 already and --trainer.max_steps is 2" in message and "train nothing" in message
    assert f"detr validate --ckpt_path {last}" in message
    assert last.read_bytes() == saved

    weights = tmp_path / "weights.pth"
    torch.save({"model": {k.removeprefix("model."): v for k, v in _weights(last).items()}}, weights)
    with pytest.raises(CheckpointError) as refusal:
        main(tiny_fit_args(tiny_shapes_root, tmp_path / "new", "--trainer.max_steps=2", f"--ckpt_path={weights}"))
    assert "holds weights only" in str(refusal.value)
    assert f"--model.init_checkpoint {weights}" in str(refusal.value)
    # the authors' layout: their training args (an argparse.Namespace) beside the weights
    import argparse

    authors = tmp_path / "authors.pth"
    torch.save({"model": torch.load(weights, weights_only=True)["model"], "args": argparse.Namespace(lr=1e-4)},
               authors)
    with pytest.raises(CheckpointError) as refusal:
        main(tiny_fit_args(tiny_shapes_root, tmp_path / "new", "--trainer.max_steps=2", f"--ckpt_path={authors}"))
    assert "not a checkpoint that detr fit wrote" in str(refusal.value)
    assert f"--model.init_checkpoint {authors}" in str(refusal.value) and "truncated" not in str(refusal.value)


@pytest.mark.usefixtures("bare_argv")
def test_a_config_whose_model_the_checkpoint_replaces_is_named(tiny_shapes_root, tmp_path, caplog) -> None:
    """--ckpt_path's hyperparameters are read over the config, so another config's model (another architecture,
    another dropout) gave way to the checkpoint's without a word."""
    out = tmp_path / "run"
    main(tiny_fit_args(tiny_shapes_root, out, "--trainer.max_steps=2"))  # the demo config's dropout: 0.0
    last = out / "checkpoints" / "last.ckpt"
    overlay = tmp_path / "other.yaml"
    overlay.write_text("model:\n  detr:\n    dropout: 0.3\n")
    with caplog.at_level("WARNING", logger="detr.lightning.checkpointing"):
        main(tiny_fit_args(tiny_shapes_root, out, "--trainer.max_steps=3", "--config", str(overlay),
                           f"--ckpt_path={last}"))
    warnings = [message for message in (record.getMessage() for record in caplog.records)
                if "keeps the checkpoint's model" in message]
    assert len(warnings) == 1, caplog.text
    assert "dropout 0.0 (the config: 0.3)" in warnings[0] and f"--model.init_checkpoint {last}" in warnings[0]
    assert "num_classes" not in warnings[0]  # the data decides it, whatever the config says
    assert torch.load(last, weights_only=True)["hyper_parameters"]["detr"]["dropout"] == 0.0  # what trained

    caplog.clear()
    with caplog.at_level("WARNING", logger="detr.lightning.checkpointing"):  # the same config: nothing to say
        main(tiny_fit_args(tiny_shapes_root, out, "--trainer.max_steps=4", f"--ckpt_path={last}"))
    assert "keeps the checkpoint's model" not in caplog.text
