"""DetrDataModule: categories before setup, all four loaders, explicit paths, YAML-typed init arguments."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from detr.categories import CategoryMap
from detr.data.augmentations import AUGMENTATIONS
from detr.data.coco import CocoDetection
from detr.data.shapes import SHAPE_NAMES, ShapesConfig, write_shapes_dataset
from detr.lightning.datamodule import AUTHORS_SIZES, DetrDataModule, sizes_for

REPO = Path(__file__).resolve().parents[2]
COCO_MINI = REPO / "data" / "coco-mini"
SMALL = dict(train_scales=[48, 64], train_max_size=96, crop_resize_scales=[48], crop_min_size=32, crop_max_size=48,
             eval_min_size=64, eval_max_size=96)


@pytest.fixture(scope="module")
def shapes_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shapes")
    write_shapes_dataset(root, ShapesConfig(num_train=6, num_val=3, image_size=64, min_object_size=8,
                                            max_object_size=24))
    return root


def check_batch(batch: tuple, batch_size: int) -> None:
    images, mask, targets = batch
    assert images.dim() == 4 and images.shape[:2] == (batch_size, 3) and images.dtype == torch.float32
    assert mask.shape == (batch_size, *images.shape[2:]) and mask.dtype == torch.bool
    for index, target in enumerate(targets):
        h, w = target["size"].tolist()
        assert not mask[index, :h, :w].any() and mask[index].sum() == mask.shape[1] * mask.shape[2] - h * w
        if "boxes" in target:
            boxes = target["boxes"]
            assert boxes.shape == (len(target["labels"]), 4) and boxes.dtype == torch.float32
            assert ((boxes >= 0) & (boxes <= 1)).all()


def test_shapes_root_all_loaders(shapes_root: Path) -> None:
    data = DetrDataModule(root=str(shapes_root), batch_size=2, num_workers=0,
                          predict_images=str(shapes_root / "val2017"), **SMALL)
    # decided by the data, before any setup (LightningCLI links these into the model)
    assert data.num_classes == len(SHAPE_NAMES) and data.category_names == list(SHAPE_NAMES)
    assert data.category_map == CategoryMap(category_ids=(1, 2, 3, 4, 5), names=SHAPE_NAMES)
    data.setup("fit")
    train = list(data.train_dataloader())
    assert len(train) == 3
    for batch in train:
        check_batch(batch, 2)
        assert max(batch[0].shape[2:]) <= 96 + 1
    val = next(iter(data.val_dataloader()))
    check_batch(val, 2)
    assert {tuple(t["size"].tolist()) for t in val[2]} == {(64, 64)} and val[2][0]["orig_size"].tolist() == [64, 64]
    assert data.val_dataset.coco.getImgIds() == [1, 2, 3]  # the evaluator's ground truth
    assert data.test_dataset is data.val_dataset
    assert len(next(iter(data.test_dataloader()))[2]) == 2
    predict = next(iter(data.predict_dataloader()))
    check_batch(predict, 2)
    assert predict[2][0]["file_name"].endswith("000000000001.jpg") and "boxes" not in predict[2][0]


def test_coco_mini_raw_category_ids() -> None:
    data = DetrDataModule(root=str(COCO_MINI), num_workers=0, val_batch_size=3, **SMALL)
    assert data.num_classes == 91 and data.category_map == CategoryMap.coco()
    assert data.category_names[1] == "person" and data.category_names[0] == "N/A"
    images, mask, targets = next(iter(data.val_dataloader()))
    labels = [int(label) for target in targets for label in target["labels"]]
    assert len(targets) == 3 and labels and all(label in CategoryMap.coco().category_ids for label in labels)
    contiguous = DetrDataModule(root=str(COCO_MINI), num_workers=0, category_ids="contiguous")
    assert contiguous.num_classes == 80


def test_explicit_paths_and_val_only(shapes_root: Path) -> None:
    data = DetrDataModule(val_images=str(shapes_root / "val2017"),
                          val_annotations=str(shapes_root / "annotations" / "instances_val2017.json"),
                          num_workers=0, **SMALL)
    assert data.num_classes == 5 and data.train_dataset is None
    assert len(data.val_dataset) == 3
    with pytest.raises(ValueError, match="no train data"):
        data.train_dataloader()
    with pytest.raises(ValueError, match="no predict data"):
        data.predict_dataloader()


def test_configuration_errors(tmp_path: Path, shapes_root: Path) -> None:
    with pytest.raises(ValueError, match="needs data"):
        DetrDataModule()
    with pytest.raises(ValueError, match="does not exist"):
        DetrDataModule(root=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="not only one"):
        DetrDataModule(train_images=str(shapes_root / "train2017"))
    with pytest.raises(ValueError, match="--data.batch_size must be >= 1, got 0"):  # the flag, as the user set it
        DetrDataModule(root=str(shapes_root), batch_size=0)
    with pytest.raises(ValueError, match="--data.num_workers must be >= 0, got -1"):
        DetrDataModule(root=str(shapes_root), num_workers=-1)
    with pytest.raises(ValueError, match="fewer than batch_size=8"):
        DetrDataModule(root=str(shapes_root), batch_size=8, num_workers=0).train_dataloader()
    (tmp_path / "empty_root").mkdir()
    with pytest.raises(ValueError, match="instances_train2017.json"):
        DetrDataModule(root=str(tmp_path / "empty_root"))
    predict_only = DetrDataModule(predict_images=[str(shapes_root / "val2017" / "000000000002.jpg")], num_workers=0)
    assert predict_only.num_classes is None and predict_only.category_map is None
    assert len(predict_only.predict_dataset) == 1


def test_yaml_typed_arguments(shapes_root: Path) -> None:
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(DetrDataModule, "data")
    config = parser.parse_args(["--data.root", str(shapes_root), "--data.train_scales", "[48, 64]",
                                "--data.train_max_size", "96", "--data.eval_min_size", "64", "--data.num_workers", "0"])
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes  # renamed in jsonargparse 4.49
    data = instantiate(config).data
    assert isinstance(data, DetrDataModule) and list(data.hparams.train_scales) == [48, 64]
    assert data.num_classes == 5


def test_train_loader_with_one_worker(shapes_root: Path) -> None:
    data = DetrDataModule(root=str(shapes_root), batch_size=3, num_workers=1, persistent_workers=True, **SMALL)
    loader = data.train_dataloader()
    assert loader.persistent_workers and loader.worker_init_fn is not None
    batches = list(loader)
    assert len(batches) == 2
    check_batch(batches[0], 3)


def test_masks_reach_every_split_only_when_asked(shapes_root: Path) -> None:
    """--data.masks true: the targets carry each box's mask at the transformed size, in training and validation
    batches (multi-scale batches resize them too); by default they carry none."""
    masked = DetrDataModule(root=str(shapes_root), batch_size=2, num_workers=0, masks=True, square_size=64,
                            multi_scale=[96], normalize=False)
    plain = DetrDataModule(root=str(shapes_root), batch_size=2, num_workers=0, **SMALL)
    for module in (masked, plain):
        module.setup("fit")
    for images, _, targets in [next(iter(masked.train_dataloader())), next(iter(masked.val_dataloader()))]:
        for target in targets:
            assert target["masks"].dtype == torch.bool
            assert target["masks"].shape == (len(target["labels"]), *target["size"].tolist())
            assert tuple(target["size"].tolist()) == tuple(images.shape[2:])
    assert next(iter(masked.train_dataloader()))[0].shape[2:] == (96, 96)
    assert not any("masks" in t for loader in (plain.train_dataloader(), plain.val_dataloader())
                   for t in next(iter(loader))[2])


def test_both_data_modules_keep_their_yaml_keys() -> None:
    """The shared base (CocoFormatDataModule) reaches LightningCLI through **kwargs: every data.* key stays."""
    from jsonargparse import ArgumentParser

    from detr.lightning.datamodule import CocoFormatDataModule
    from detr.lightning.panoptic_datamodule import PanopticDataModule

    shared = {"batch_size", "val_batch_size", "num_workers", "pin_memory", "persistent_workers", "drop_last",
              "train_scales", "train_max_size", "crop_resize_scales", "crop_min_size", "crop_max_size",
              "eval_min_size", "eval_max_size", "image_size", "square_size", "normalize", "augmentation", "multi_scale",
              "augmentation_stop_epoch", "mosaic_epochs", "mosaic_prob", "mixup_prob", "mixup_epochs"}
    own = {DetrDataModule: {"root", "train_images", "train_annotations", "val_images", "val_annotations",
                            "test_images", "test_annotations", "predict_images", "category_ids", "skip_bad_images",
                            "categories_from", "masks", "format", "keypoints"},
           PanopticDataModule: {"root", "train_images", "train_annotations", "val_images", "val_annotations",
                                "category_ids", "check_train", "check_val", "predict_images", "categories_from"}}
    for module, keys in own.items():
        assert issubclass(module, CocoFormatDataModule)
        parser = ArgumentParser()
        parser.add_class_arguments(module, "data")
        defaults = parser.get_defaults().data
        assert set(vars(defaults)) == shared | keys
        assert defaults.batch_size == 2 and defaults.val_batch_size is None and defaults.num_workers == 2


def test_predict_images_do_not_need_the_data_root(shapes_root: Path, tmp_path: Path) -> None:
    """detr predict with a config whose data.root does not exist here (the demo's data/shapes) failed with "data
    root does not exist", though predict reads only predict_images; the other stages still name that root."""
    missing = tmp_path / "data" / "shapes"
    data = DetrDataModule(root=str(missing), predict_images=str(shapes_root / "val2017"), num_workers=0, **SMALL)
    data.setup("predict")
    images, _, targets = next(iter(data.predict_dataloader()))
    assert len(targets) == min(3, data.val_batch_size) and images.dim() == 4
    with pytest.raises(ValueError, match=f"no train data: data root '{missing}' does not exist; pass --data.root"):
        data.train_dataloader()


def test_the_json_read_at_start_up_is_offered_to_the_checks_and_dropped_before_loaders_fork(shapes_root: Path) -> None:
    data = DetrDataModule(root=str(shapes_root), batch_size=2, num_workers=0, **SMALL)
    train_json = shapes_root / "annotations" / "instances_train2017.json"
    data.setup("fit")
    assert data.annotations_json(train_json)["images"]  # read once, in __init__, for the category map
    assert data.train_dataset._coco is None  # the data set holds arrays, not the json's objects
    data.train_dataloader()
    assert data.annotations_json(train_json) is None


def test_image_size_scales_the_authors_sizes_and_keeps_the_ones_set_on_purpose() -> None:
    """One knob for the seven sizes a CPU run had to set by hand (docs/models/deformable.md's command)."""
    sizes = sizes_for(384, {**AUTHORS_SIZES, "eval_max_size": 512})
    assert sizes["eval_min_size"] == 384 and sizes["eval_max_size"] == 512  # set on purpose: kept
    assert sizes["train_max_size"] == 640 and max(sizes["train_scales"]) == 384 and min(sizes["train_scales"]) == 230
    assert sizes["crop_resize_scales"] == [192, 240, 288]
    assert (sizes["crop_min_size"], sizes["crop_max_size"]) == (184, 288)
    with pytest.raises(ValueError, match="--data.image_size must be an integer >= 32"):
        sizes_for(0, AUTHORS_SIZES)


def test_square_size_resizes_every_split_to_the_square_of_pixels_over_255(shapes_root) -> None:
    data = DetrDataModule(root=str(shapes_root), batch_size=2, num_workers=0, square_size=96, normalize=False)
    for loader in (data.train_dataloader(), data.val_dataloader()):
        batch = next(iter(loader))
        check_batch(batch, 2)
        images, mask, _ = batch
        assert tuple(images.shape[-2:]) == (96, 96) and not mask.any()
        assert images.min() >= 0 and images.max() <= 1  # no mean and std
    spec = data.input_spec
    assert (spec.resize, spec.size, spec.mean) == ("square", 96, None)
    assert (data.hparams["eval_min_size"], data.hparams["eval_max_size"]) == (96, 96)  # what checkpoints record
    with pytest.raises(ValueError, match="square_size must be an integer >= 32"):
        DetrDataModule(root=str(shapes_root), square_size=16)


def test_the_real_time_detrs_augmentation_options_are_checked(shapes_root: Path) -> None:
    root = str(shapes_root)
    refused = [({"augmentation": "rtdetr"}, "--data.augmentation rtdetr .* --data.square_size"),
               ({"multi_scale": [64, 96]}, "--data.multi_scale .* --data.square_size"),
               ({"square_size": 64, "multi_scale": [64, 16]}, "--data.multi_scale must be a list of square sides"),
               ({"square_size": 64, "multi_scale": []}, "--data.multi_scale must be"),
               ({"square_size": 64, "augmentation_stop_epoch": -1}, "--data.augmentation_stop_epoch must be")]
    for settings, message in refused:
        with pytest.raises(ValueError, match=message) as error:
            DetrDataModule(root=root, **settings)
        assert "\n" not in str(error.value)
    data = DetrDataModule(root=root, square_size=64, normalize=False, augmentation="rtdetr", multi_scale=[64, 96],
                          augmentation_stop_epoch=5)
    assert data.input_spec.size == 64 and data.hparams["eval_min_size"] == 64  # evaluation stays at the square
    assert next(iter(data.val_dataloader()))[0].shape[-2:] == (64, 64)


def test_the_stop_epoch_reaches_persistent_workers() -> None:
    """A training loader with a persistent worker: at epoch 0 the batches take the multi-scale sides and the images
    the authors' random operations; once the trainer's epoch reaches the stop epoch, every batch is at the square
    and every image is the flip and resize of its file (the evaluation resize, or its mirror)."""
    torch.manual_seed(0)  # the workers' seeds
    data = DetrDataModule(root=str(COCO_MINI), category_ids="contiguous", batch_size=4, num_workers=1,
                          persistent_workers=True, square_size=96, normalize=False, augmentation="rtdetr",
                          multi_scale=[64, 128], augmentation_stop_epoch=1)
    trainer = SimpleNamespace(current_epoch=0)
    data.trainer = trainer  # what Lightning attaches; the loader reads its current_epoch as each epoch starts
    data.setup("fit")
    data.train_dataset.ids = data.train_dataset.ids[:16]  # four batches an epoch
    plain = CocoDetection(*data.paths["train"], transform=data.eval_transform, category_map=data.category_map)
    index_of = {image_id: index for index, image_id in enumerate(plain.ids)}
    loader = data.train_dataloader()

    def epoch(number: int) -> tuple[set, int]:
        """The batches' sides, and how many images are neither the plain image nor its mirror (at their side)."""
        trainer.current_epoch = number
        sides, augmented = set(), 0
        for images, _, targets in loader:
            sides.add(images.shape[-1])
            for image, target in zip(images, targets, strict=True):
                reference = plain[index_of[int(target["image_id"])]][0]
                unchanged = [F.interpolate(version[None], size=image.shape[-2:])[0]  # the collate's nearest
                             for version in (reference, reference.flip(-1))]
                augmented += not any(torch.allclose(image, version, atol=2 / 255) for version in unchanged)
        return sides, augmented

    sides, augmented = epoch(0)
    assert sides <= {64, 128} and augmented > 8 and data.epoch.get() == 0  # of 16 images
    sides, augmented = epoch(1)
    assert sides == {96} and augmented == 0 and data.epoch.get() == 1
    assert loader._iterator is not None and loader._iterator._persistent_workers  # the same worker both epochs


@pytest.mark.parametrize("source", ["yolo-yaml", "yolo-folder", "voc"])
def test_a_yolo_or_voc_root_is_read_as_coco(tmp_path: Path, source: str) -> None:
    """--data.root took COCO's layout only; a YOLO data.yaml (or its folder) or a VOC folder gives the same data set
    (pixel xyxy boxes, names from the data), its format told from the path, its val ground truth for the evaluator."""
    from tests.helpers import write_voc_set, write_yolo_set

    root = write_voc_set(tmp_path) if source == "voc" else write_yolo_set(tmp_path)
    root = root.parent if source == "yolo-folder" else root
    data = DetrDataModule(root=str(root), num_workers=0, batch_size=2, square_size=64)
    data.setup("fit")
    if source == "voc":
        assert data.category_names == ["cat", "dog", "person"]
        _, target = data.val_dataset[0]
        # 1-based inclusive corners (5, 6, 64, 48): pixels 4..64 and 5..48, scaled from 64 x 48 to 64 x 64
        assert target["boxes_xyxy"].tolist() == [pytest.approx([4.0, 5.0 * 64 / 48, 64.0, 64.0])]
        assert data.train_dataset.coco.loadAnns(2)[0]["iscrowd"] == 1  # difficult: ignored
    else:
        assert data.category_names == ["cat", "dog", "bird"] and len(data.train_dataset) == 4
        _, target = data.val_dataset[1]  # f.png: "2 0.5 0.25 0.25 0.25" on 64 x 48 → 64 x 64
        assert target["labels"].tolist() == [2] and target["boxes_xyxy"].tolist() == [[24.0, 8.0, 40.0, 24.0]]
    assert len(data.val_dataset.coco.getImgIds()) == len(data.val_dataset)
    assert data.annotations_json(data.paths["train"][1]) is not None  # the start-up checks read it


def test_a_bad_label_line_stops_the_data_module_naming_it(tmp_path: Path) -> None:
    from detr.data.converted import LabelFileError
    from tests.helpers import write_yolo_set

    data_yaml = write_yolo_set(tmp_path)
    (tmp_path / "labels" / "train" / "a.txt").write_text("0 0.5 0.5 0.25 0.5\n0 40 30 10 10\n")
    with pytest.raises(LabelFileError, match=r"a\.txt:2: coordinates .* not all within \[0, 1\]"):
        DetrDataModule(root=str(data_yaml), num_workers=0)
    with pytest.raises(ValueError, match="has no Annotations"):
        DetrDataModule(root=str(tmp_path), format="voc", num_workers=0)
    with pytest.raises(ValueError, match="--data.format must be 'coco', 'yolo' or 'voc'"):
        DetrDataModule(root=str(tmp_path), format="pascal", num_workers=0)
    data_yaml.write_text("names: [cat]\n")
    with pytest.raises(ValueError, match=r"\(yolo\) has no train or val split: add `train: images/train`"):
        DetrDataModule(root=str(data_yaml), num_workers=0)


def test_yolo_segmentation_polygons_give_instance_masks(tmp_path: Path) -> None:
    """A YOLO segmentation set (every line a polygon) trains masks: each polygon's pixels in its target."""
    from tests.helpers import write_yolo_set

    data_yaml = write_yolo_set(tmp_path)
    for split in ("train", "val"):
        for label_file in (tmp_path / "labels" / split).rglob("*.txt"):
            label_file.write_text("".join(f"{line.split()[0]} 0.25 0.25 0.75 0.25 0.75 0.75 0.25 0.75\n"
                                          for line in label_file.read_text().splitlines() if line.strip()))
    data = DetrDataModule(root=str(data_yaml), num_workers=0, square_size=64, masks=True)
    _, target = data.val_dataset[0]  # e.png: one square over the middle half, 64 x 48 → 64 x 64
    assert target["masks"].shape == (1, 64, 64)
    assert target["boxes_xyxy"].tolist() == [[16.0, 16.0, 48.0, 48.0]]
    assert 0.2 < target["masks"].float().mean() < 0.3  # a quarter of the image


def test_keypoints_option_gives_normalised_keypoints_in_every_training_pipeline(tmp_path: Path) -> None:
    write_shapes_dataset(tmp_path, ShapesConfig(num_train=4, num_val=2, image_size=64, min_object_size=12,
                                                max_object_size=24, keypoints=True))
    for options in ({}, {"augmentation": "rtdetr", "square_size": 64}):
        data = DetrDataModule(root=str(tmp_path), batch_size=2, num_workers=0, keypoints=True, **SMALL, **options)
        assert data.num_keypoints_per_class == [1, 4, 3, 2, 5]  # circle, square, triangle, ellipse, star
        data.setup("fit")
        for _, _, targets in [next(iter(data.train_dataloader())), next(iter(data.val_dataloader()))]:
            for target in targets:
                keypoints = target["keypoints"]
                assert keypoints.shape == (len(target["labels"]), 5, 3)  # the star's five points the most
                labelled = keypoints[..., 2] > 0
                assert ((keypoints[..., :2][labelled] >= 0) & (keypoints[..., :2][labelled] <= 1)).all()
    assert DetrDataModule(root=str(tmp_path), **SMALL).num_keypoints_per_class == []  # without the option
    with pytest.raises(ValueError, match="--data.keypoints true with --data.augmentation deim"):
        DetrDataModule(root=str(tmp_path), keypoints=True, augmentation="deim", square_size=64)


def test_the_data_module_compares_no_augmentation_name() -> None:
    """The data module asks the record (no family's name is compared outside that family's own code)."""
    names = set(AUGMENTATIONS) - {"default"}
    tree = ast.parse((REPO / "detr" / "lightning" / "datamodule.py").read_text())
    compared = [f"line {node.lineno}" for node in ast.walk(tree)
                if isinstance(node, ast.Compare)
                and any(isinstance(side, ast.Constant) and side.value in names
                        or isinstance(side, (ast.Tuple, ast.List, ast.Set))
                        and any(isinstance(item, ast.Constant) and item.value in names for item in side.elts)
                        for side in (node.left, *node.comparators))]
    assert not compared, f"detr/lightning/datamodule.py compares against an augmentation's name: {compared}"


def test_an_augmentation_that_draws_mosaics_refuses_masks_in_one_line(shapes_root: Path) -> None:
    with pytest.raises(ValueError, match="--data.masks true with --data.augmentation deim: its mosaic moves boxes "
                                         "only; train masks with --data.augmentation rtdetr") as error:
        DetrDataModule(root=str(shapes_root), square_size=64, augmentation="deim", masks=True)
    assert "\n" not in str(error.value)
