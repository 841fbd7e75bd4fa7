"""Instance masks and panoptic post-processing: hand-built cases, the authors' rules step by step (a literal
reference with PIL's resize), the PNG encoding of COCO's panoptic format."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from detr.inference.postprocess_masks import (
    PostProcessMasks,
    PostProcessPanoptic,
    id_map_to_rgb,
    panoptic_png,
    rgb_to_id_map,
)
from tests.helpers import model_output
from tests.reference_segmentation import reference_panoptic

IS_THING = [True, True, False]  # labels 0, 1: things; 2: stuff; logit 3: no object


def confident(label: int, num_logits: int = 4, high: float = 10.0) -> torch.Tensor:
    logits = torch.zeros(num_logits)
    logits[label] = high
    return logits


def test_hand_built_panoptic_case():
    """8 × 8 masks (= the processed size, so no interpolation), shown at 16 × 16.

    q0 thing 0 owns the top-left quarter; q1 is no-object; q2 and q3 are the same stuff class, q3 owning the
    top-right quarter; q4 is below the threshold; q5 owns one pixel (4 at 16 × 16: too small).
    """
    logits = torch.stack([confident(0), confident(3), confident(2), confident(2),
                          torch.tensor([1.0, 0.5, 0.0, 0.0]), confident(1)])
    masks = torch.zeros(6, 8, 8)
    masks[0, :4, :4] = 5
    masks[1] = 20  # no object: must not take pixels
    masks[2] = 1
    masks[3, :4, 4:] = 5
    masks[4] = 30  # below the threshold: must not take pixels
    masks[5, 7, 7] = 10
    post = PostProcessPanoptic(IS_THING)
    result = post(model_output(logits=logits[None], masks=masks[None]), torch.tensor([[8, 8]]),
                  torch.tensor([[16, 16]]))[0]
    expected = torch.full((16, 16), 2)
    expected[:8, :8] = 1
    torch.testing.assert_close(result["id_map"], expected)
    segments = result["segments_info"]
    assert [(s["id"], s["category_id"], s["isthing"], s["area"], s["bbox"]) for s in segments] == [
        (1, 0, True, 64, [0, 0, 8, 8]), (2, 2, False, 192, [0, 0, 16, 16])]
    assert segments[0]["iscrowd"] == 0 and segments[0]["score"] > 0.99


def test_nothing_confident_gives_void():
    post = PostProcessPanoptic(IS_THING)
    result = post(model_output(logits=torch.zeros(1, 3, 4), masks=torch.randn(1, 3, 4, 4)),
                  torch.tensor([[16, 16]]), torch.tensor([[20, 30]]))[0]
    assert result["segments_info"] == [] and result["id_map"].shape == (20, 30) and not result["id_map"].any()


def test_category_ids_map_labels():
    post = PostProcessPanoptic(IS_THING, category_ids=[7, 9, 40])
    masks = torch.zeros(1, 1, 4, 4)
    result = post(model_output(logits=confident(1)[None, None], masks=masks), torch.tensor([[4, 4]]))[0]
    assert result["segments_info"][0]["category_id"] == 9 and result["segments_info"][0]["label"] == 1


@pytest.mark.parametrize("seed", range(6))
def test_matches_the_authors_rules_literally(seed):
    """Random predictions: same id map and segments as the authors' steps with PIL's nearest resize."""
    generator = torch.Generator().manual_seed(seed)
    num_queries, is_thing = 12, [True, True, True, False, False, False]
    logits = torch.randn(num_queries, 7, generator=generator) * 6
    masks = torch.randn(num_queries, 10, 13, generator=generator) * 3
    if seed == 0:
        logits[:, :3] = -20  # only stuff, several queries per class
    processed, target = (37, 50), (75, 101)
    ref_ids, ref_segments = reference_panoptic(logits, masks, processed, target, is_thing)
    result = PostProcessPanoptic(is_thing)(model_output(logits=logits[None], masks=masks[None]),
                                           torch.tensor([processed]), torch.tensor([target]))[0]
    assert [(s["id"] - 1, s["label"], s["area"]) for s in result["segments_info"]] == ref_segments
    if ref_segments:
        torch.testing.assert_close(result["id_map"] - 1, ref_ids, rtol=0, atol=0)
    else:
        assert not result["id_map"].any()


def test_padded_batch_crops_each_image_or_resizes_like_the_authors():
    """crop_padding=False is the authors' evaluation (the whole padded map resized to each image); with
    True, the largest image of a batch (no padding) gets the same result as the authors'."""
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 8, 4, generator=generator) * 6
    masks = torch.randn(2, 8, 12, 16, generator=generator) * 3
    processed, targets = torch.tensor([[48, 64], [30, 40]]), torch.tensor([[96, 128], [60, 80]])
    outputs = model_output(logits=logits, masks=masks)
    cropped = PostProcessPanoptic(IS_THING)(outputs, processed, targets)
    stretched = PostProcessPanoptic(IS_THING, crop_padding=False)(outputs, processed, targets)
    for image in range(2):
        ref_ids, ref_segments = reference_panoptic(logits[image], masks[image], tuple(processed[image].tolist()),
                                                   tuple(targets[image].tolist()), IS_THING)
        assert [(s["id"] - 1, s["label"], s["area"]) for s in stretched[image]["segments_info"]] == ref_segments
        torch.testing.assert_close(stretched[image]["id_map"] - 1, ref_ids, rtol=0, atol=0)
    torch.testing.assert_close(cropped[0]["id_map"], stretched[0]["id_map"], rtol=0, atol=0)
    assert cropped[1]["id_map"].shape == stretched[1]["id_map"].shape == (60, 80)


def test_segment_bboxes_and_areas_agree_with_the_id_map():
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(1, 10, 4, generator=generator) * 6
    masks = torch.randn(1, 10, 9, 11, generator=generator) * 3
    result = PostProcessPanoptic(IS_THING)(model_output(logits=logits, masks=masks), torch.tensor([[36, 44]]),
                                           torch.tensor([[50, 61]]))[0]
    id_map = result["id_map"]
    assert result["segments_info"] and set(id_map.unique().tolist()) == {s["id"] for s in result["segments_info"]}
    for segment in result["segments_info"]:
        ys, xs = (id_map == segment["id"]).nonzero().unbind(1)
        assert segment["area"] == len(ys) > 4
        assert segment["bbox"] == [xs.min().item(), ys.min().item(), xs.max().item() - xs.min().item() + 1,
                                   ys.max().item() - ys.min().item() + 1]


def test_instance_masks_threshold_crop_and_resize():
    masks = torch.full((2, 3, 6, 8), -5.0)  # padded batch 24 × 32 at stride 4
    masks[0, 0, :3, :4] = 5  # image 0, query 0: top-left quarter
    masks[1, 2, :, :] = 5  # image 1 (processed 12 × 16, the top-left of the padded batch): everything
    out = PostProcessMasks()(model_output(masks=masks), torch.tensor([[24, 32], [12, 16]]),
                             torch.tensor([[48, 64], [30, 40]]))
    assert out[0].shape == (3, 48, 64) and out[1].shape == (3, 30, 40) and out[0].dtype == torch.bool
    assert out[0][0, :22, :30].all() and not out[0][0, 26:].any() and not out[0][0, :, 34:].any()
    assert not out[0][1:].any() and out[1][2].all() and not out[1][:2].any()


def test_sizes_are_checked():
    with pytest.raises(ValueError, match="processed_sizes"):
        PostProcessPanoptic(IS_THING)(model_output(logits=torch.zeros(2, 3, 4), masks=torch.zeros(2, 3, 4, 4)),
                                      torch.tensor([[4, 4]]))
    with pytest.raises(ValueError, match="num_classes \\+ 1"):
        PostProcessPanoptic(IS_THING)(model_output(logits=torch.zeros(1, 3, 6), masks=torch.zeros(1, 3, 4, 4)),
                                      torch.tensor([[4, 4]]))


def test_png_round_trip_uses_cocos_rgb_encoding():
    id_map = torch.tensor([[0, 1, 255], [256, 65536 + 2, 2 ** 24 - 1]])
    rgb = id_map_to_rgb(id_map)
    assert rgb[1, 1].tolist() == [2, 0, 1] and rgb[1, 0].tolist() == [0, 1, 0]
    decoded = np.asarray(Image.open(io.BytesIO(panoptic_png(id_map))))
    assert decoded.shape == (2, 3, 3)
    torch.testing.assert_close(rgb_to_id_map(torch.from_numpy(decoded.copy())), id_map)


@pytest.mark.parametrize("in_size, out_size", [((37, 50), (75, 101)), ((10, 13), (800, 1066)), ((200, 300), (37, 41)),
                                               ((5, 7), (5, 7)), ((333, 500), (480, 640))])
def test_nearest_resize_is_pils(in_size, out_size):
    from detr.inference.postprocess_masks import resize_nearest

    image = torch.randint(0, 256, in_size, generator=torch.Generator().manual_seed(0))
    pil = Image.fromarray(image.numpy().astype(np.uint8)).resize(out_size[::-1], resample=Image.NEAREST)
    torch.testing.assert_close(resize_nearest(image, out_size), torch.from_numpy(np.asarray(pil).astype(np.int64)))


def test_masks_to_rle_round_trips_through_pycocotools():
    from pycocotools import mask as mask_utils

    from detr.evaluation.coco_evaluator import masks_to_rle

    masks = torch.zeros(2, 5, 7, dtype=torch.bool)
    masks[0, 1:3, 2:6] = True
    masks[1, 4, :] = True
    rles = masks_to_rle(masks)
    assert [r["size"] for r in rles] == [[5, 7], [5, 7]] and isinstance(rles[0]["counts"], str)
    decoded = mask_utils.decode([{"size": r["size"], "counts": r["counts"].encode()} for r in rles])
    torch.testing.assert_close(torch.from_numpy(decoded).permute(2, 0, 1).bool(), masks)
    assert masks_to_rle(torch.zeros(0, 5, 7, dtype=torch.bool)) == []


def test_overlap_filter_keeps_one_of_two_queries_on_one_object():
    """Two thing queries with (nearly) the same mask over one object: the authors' per-pixel argmax splits
    the object between them; with Mask2Former's overlap filter the higher-scoring query keeps all of it.
    A query that owns less than overlap_threshold of its own mask is dropped; stuff is never dropped."""
    logits = torch.stack([confident(0, high=3.0), confident(0, high=5.0), confident(2)])
    masks = torch.full((3, 8, 8), -5.0)
    masks[2] = 0.5  # background stuff everywhere, weaker than the object's masks
    masks[0, 2:6, 2:6] = 5.0
    masks[0, 2:6, 2:4] += 0.5  # q0's logits are a little higher on the object's left half...
    masks[1, 2:6, 2:6] = 5.0  # ...q1's on its right half, and q1 has the higher class score
    masks[1, 2:6, 4:6] += 0.5
    outputs = model_output(logits=logits[None], masks=masks[None])
    sizes = torch.tensor([[8, 8]])
    split = PostProcessPanoptic(IS_THING)(outputs, sizes)[0]
    assert sorted(s["area"] for s in split["segments_info"] if s["isthing"]) == [8, 8]
    whole = PostProcessPanoptic(IS_THING, overlap_threshold=0.8)(outputs, sizes)[0]
    things = [s for s in whole["segments_info"] if s["isthing"]]
    assert len(things) == 1 and things[0]["area"] == 16
    assert things[0]["score"] == max(s["score"] for s in split["segments_info"] if s["isthing"])
    assert [s["isthing"] for s in whole["segments_info"]].count(False) == 1
    with pytest.raises(ValueError, match="overlap_threshold"):
        PostProcessPanoptic(IS_THING, overlap_threshold=1.5)
