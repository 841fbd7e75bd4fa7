"""Fine-tuning a grounding model on COCO-format data whose category names are the prompt: a few steps on the tiny
shapes set lower the loss on a fixed batch, and the written transformers directory loads and predicts with the
prompt (and transformers reads it too); a category name that is no phrase refused."""

from __future__ import annotations

import pytest
import torch

from detr.checkpoints import load_checkpoint as load_grounding
from detr.inference.predictor import Predictor
from detr.lightning.datamodule import DetrDataModule
from detr.lightning.grounding_system import GroundingSystem, fine_tune_grounding
from detr.models.recipe import OptimizerRecipe
from tests.helpers import write_tiny_shapes

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tests.helpers_grounding import vocabulary, write_directory  # noqa: E402

SHAPES = ("circle", "square", "triangle", "ellipse", "star")
DATA = {"square_size": 96, "augmentation": "default"}


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return write_tiny_shapes(tmp_path_factory, num_train=4, num_val=2)


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    """A tiny random Grounding DINO whose tokenizer knows the shapes' names (one token each)."""
    directory = tmp_path_factory.mktemp("grounding") / "model"
    write_directory(directory, "gdino", seed=5, num_queries=8)
    words = vocabulary()
    for index, name in enumerate(SHAPES, start=200):
        words[name] = words.pop(f"[unused{index}]")
    transformers.BertTokenizerFast(vocab=words, do_lower_case=True).save_pretrained(directory)
    return directory


def _fixed_batch(shapes):
    data = DetrDataModule(val_images=str(shapes / "train2017"),
                          val_annotations=str(shapes / "annotations" / "instances_train2017.json"),
                          category_ids="contiguous", batch_size=4, num_workers=0, **DATA)
    return next(iter(data.val_dataloader()))


def _loss(directory, shapes) -> float:
    system = GroundingSystem(load_grounding(directory), SHAPES)
    images, padding_mask, targets = _fixed_batch(shapes)
    with torch.no_grad():
        return float(system.compute_losses(system(images, padding_mask), targets)["loss"])


def test_fine_tuning_lowers_the_loss_and_writes_a_model_that_predicts_with_the_prompt(directory, shapes, tmp_path):
    torch.manual_seed(0)
    written, system = fine_tune_grounding(
        directory, tmp_path / "tuned", train_images=shapes / "train2017",
        train_annotations=shapes / "annotations" / "instances_train2017.json", max_steps=20, batch_size=2,
        optimizer=OptimizerRecipe(lr=1e-3, lr_backbone=1e-4), data=DATA)
    assert system.prompt == "circle. square. triangle. ellipse. star."
    before, after = _loss(directory, shapes), _loss(written, shapes)
    assert after < 0.7 * before

    config = transformers.GroundingDinoConfig.from_pretrained(written)
    assert config.id2label == dict(enumerate(SHAPES))
    transformers.GroundingDinoForObjectDetection.from_pretrained(written)  # transformers reads it as well
    image = next((shapes / "val2017").iterdir())
    prediction = Predictor.from_checkpoint(written, device="cpu").predict(image, prompt=list(SHAPES),
                                                                          threshold=0.0)[0]
    assert len(prediction) > 0 and set(prediction.labels.tolist()) <= set(range(len(SHAPES)))


def test_a_category_name_that_is_no_phrase_is_refused(directory):
    model = load_grounding(directory)
    with pytest.raises(ValueError, match="must not hold"):
        GroundingSystem(model, ["circle", "square. star"])
    with pytest.raises(ValueError, match="twice"):
        GroundingSystem(model, ["circle", "circle"])
