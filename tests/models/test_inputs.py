"""The input contract: InputSpec gives exactly the tensor of the evaluation transform (albumentations) on real
photos, states the square resize of the real-time families, and every detector states its own."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detr.data.transforms import make_eval_transform
from detr.inference.images import to_rgb_array
from detr.models.inputs import InputSpec, pad_images
from tests.helpers import REPO

PHOTOS = sorted((REPO / "data" / "photos").glob("*.png"))[:2] + sorted((REPO / "data" / "coco-mini").rglob("*.jpg"))[:1]


def _eval_transform(image: np.ndarray, min_size: int, max_size: int) -> torch.Tensor:
    out = make_eval_transform(min_size=min_size, max_size=max_size)(
        image=image, bboxes=np.zeros((0, 4), dtype=np.float32), labels=np.zeros((0,), dtype=np.int64))
    return out["image"].float()


@pytest.mark.parametrize("sizes", [(800, 1333), (320, 512)])
def test_prepare_equals_the_evaluation_transform_on_real_photos(sizes) -> None:
    assert len(PHOTOS) == 3, "the repository's photos (data/) are missing"
    spec = InputSpec(size=sizes[0], max_size=sizes[1])
    for path in PHOTOS:
        image = to_rgb_array(path)
        prepared = spec.prepare(image)
        assert prepared.dtype == torch.float32
        assert torch.equal(prepared, _eval_transform(image, *sizes)), path.name
        assert tuple(prepared.shape[1:]) == spec.resized_shape(*image.shape[:2])


def test_square_resize_without_mean_and_std() -> None:
    image = np.random.default_rng(0).integers(0, 256, (30, 50, 3), dtype=np.uint8)
    spec = InputSpec(resize="square", size=64, max_size=None, mean=None, std=None)
    prepared = spec.prepare(image)
    assert prepared.shape == (3, 64, 64) and float(prepared.min()) >= 0 and float(prepared.max()) <= 1
    unresized = InputSpec(resize="square", size=30, max_size=None, mean=None, std=None)  # 30 × 50 → 30 × 30
    assert unresized.resized_shape(30, 50) == (30, 30)
    same = InputSpec(resize="square", size=50, max_size=None, mean=None, std=None)
    square = np.ascontiguousarray(image[:, :30].repeat(2, axis=0)[:50, :].repeat(2, axis=1)[:, :50])
    assert torch.equal(same.prepare(square), torch.from_numpy(square).permute(2, 0, 1).float() / 255)
    assert torch.equal(same.denormalize(same.prepare(square)), torch.from_numpy(square).permute(2, 0, 1))


def test_batch_pads_bottom_right_and_masks_the_padding() -> None:
    spec = InputSpec(size=20, max_size=40)
    images = [np.full((10, 20, 3), 128, dtype=np.uint8), np.full((20, 10, 3), 128, dtype=np.uint8)]
    batch, mask, sizes = spec.batch(images)
    assert sizes == [(20, 40), (40, 20)] and batch.shape == (2, 3, 40, 40)
    assert mask[0, :20, :40].logical_not().all() and mask[0, 20:].all()
    assert mask[1, :, 20:].all() and batch[1, :, :, 20:].eq(0).all()
    assert torch.equal(pad_images([spec.prepare(i) for i in images])[0], batch)


def test_bad_specs_and_images_are_refused() -> None:
    with pytest.raises(ValueError, match="resize"):
        InputSpec(resize="longest_side")
    with pytest.raises(ValueError, match="mean and std together"):
        InputSpec(mean=None)
    with pytest.raises(ValueError, match="size <= max_size"):
        InputSpec(size=900, max_size=800)
    with pytest.raises(ValueError, match="uint8 RGB"):
        InputSpec().normalize(np.zeros((4, 4), dtype=np.uint8))
    with pytest.raises(ValueError, match="too thin"):
        InputSpec(size=800, max_size=1333).prepare(np.zeros((1, 3000, 3), dtype=np.uint8))


def test_every_detector_states_its_input_contract(tiny_model) -> None:
    spec = tiny_model.input_spec
    assert spec == InputSpec()  # no eval size recorded: the authors' 800 / 1333 with ImageNet statistics
    tiny_model.meta = tiny_model.meta.replace(eval_size=(320, 512))
    assert tiny_model.input_spec == InputSpec(size=320, max_size=512)


def test_the_padding_mask_is_downsampled_as_f_interpolate_does_at_every_size():
    # The backbones pick the mask's rows and columns by index so that exported graphs reproduce them; the
    # picks must stay those of F.interpolate's nearest neighbour (the authors' code), including the sizes
    # where its float32 scale rounds down and a naive (i * in) // out picks the next row.
    from detr.models.backbone import downsample_mask

    generator = torch.Generator().manual_seed(0)
    for size in range(1, 700):
        for stride in (8, 16, 32, 64):
            out = -(-size // stride)
            mask = torch.rand(2, size, 3, generator=generator) > 0.5
            expected = torch.nn.functional.interpolate(mask[None].float(), size=(out, 3)).bool()[0]
            assert torch.equal(downsample_mask(mask, (out, 3)), expected), (size, out)
            assert torch.equal(downsample_mask(mask.transpose(1, 2), (3, out)), expected.transpose(1, 2))


def test_the_readmes_raw_model_snippet_runs_without_warnings(monkeypatch) -> None:
    """N13: the README's (now docs/models/detr.md's) snippet that calls the model directly warned "The given NumPy array is not writable"
    (np.asarray of a PIL image is read-only) where an image needed no resizing. The snippet runs as written,
    with a tiny model of the size of one photo's short side, warnings as errors."""
    import re
    import warnings

    import detr
    from detr.models.config import ModelMeta
    from tests.helpers import TINY

    # the snippet moved from the README to the DETR page (docs/models/detr.md, "Load") with the README's rewrite
    pages = "\n".join(path.read_text() for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))])
    [snippet] = [block for block in re.findall(r"```python\n(.*?)```", pages, re.S)
                 if "model.input_spec.batch" in block]
    model = detr.build_detr(TINY)
    model.meta = ModelMeta(eval_size=(300, 1333))  # data/photos/chelsea.png is 451 × 300: no resize
    monkeypatch.setattr(detr, "load_checkpoint", lambda *args, **kwargs: model)
    monkeypatch.chdir(REPO)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exec(compile(snippet, "README.md", "exec"), {})
