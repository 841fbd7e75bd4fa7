"""LightningDataModule over COCO-format data: train/val/test/predict loaders with the authors' transforms.

Data comes either from ``root`` in COCO's layout::

    ROOT/train2017/  ROOT/val2017/  ROOT/annotations/instances_{train,val}2017.json

or from explicit image folders and json files (which override ``root``'s). The category map is read
from the annotation json in ``__init__``, so ``num_classes``, ``category_map`` and ``category_names``
exist before any setup and LightningCLI can link them into the model. Data sets are built on first use
(``setup`` or the ``*_dataset`` properties); ``val_dataset.coco`` is the evaluator's ground truth.

Transform sizes are constructor arguments, so a YAML config can train the 128 px shapes set at small
scales. Lightning adds the distributed sampler itself. :class:`CocoFormatDataModule` holds what this module
and the panoptic one (:mod:`detr.lightning.panoptic_datamodule`) share: sizes, batch sizes, loaders, and the
real-time DETRs' training augmentations, multi-scale batches and the epoch they stop at (the training loader
tells its workers the trainer's epoch: :class:`EpochLoader`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import lightning
import torch
from torch.utils.data import DataLoader

from detr.categories import CategoryMap
from detr.checkpoints import read_checkpoint
from detr.data.coco import CocoDetection, category_map_from_categories, load_coco_json
from detr.data.collate import MultiScaleCollate, collate_detection
from detr.data.augmentations import Augmentation, AugmentationName, TrainingInput, augmentation_named
from detr.data.dense_o2o import MixUpCollate
from detr.data.formats import dataset_splits, detect_format, load_split, read_split
from detr.data.images import ImageFilesDataset
from detr.data.keypoints import CategoryKeypoints, keypoint_categories
from detr.data.training_epoch import SharedEpoch
from detr.data.transforms import (
    CROP_MAX_SIZE,
    CROP_MIN_SIZE,
    CROP_RESIZE_SCALES,
    EVAL_MAX_SIZE,
    EVAL_MIN_SIZE,
    TRAIN_MAX_SIZE,
    TRAIN_SCALES,
    make_eval_transform,
    make_square_transform,
    reseed_transform,
)
from detr.models.inputs import InputSpec

logger = logging.getLogger(__name__)

Split = Literal["train", "val", "test"]


def seed_worker_transform(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: new augmentation generators per worker, epoch and process.

    Workers start as copies of one transform; without this they would all draw the same flips and crops.
    ``get_worker_info().seed`` differs per worker and per epoch and follows ``seed_everything``; the
    process rank is mixed in as the authors seed per rank.
    """
    info = torch.utils.data.get_worker_info()
    if info is None:
        return
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    rank = torch.distributed.get_rank() if distributed else 0
    reseed_transform(getattr(info.dataset, "transform", None), info.seed + 1_000_003 * rank)


class EpochLoader(DataLoader):
    """A DataLoader that, as each pass over it starts, writes ``current_epoch()`` into ``epoch``: before its workers
    start (or, persistent, resume) and fetch, so every sample and batch of the pass sees that epoch.

    Lightning creates a training epoch's iterator after the epoch's counter moves on (and, for the first or a
    resumed epoch, right after asking for the loader), so ``current_epoch`` may simply read the trainer's. It
    rebuilds the loader with the same arguments when it adds a distributed sampler.

    Args:
        epoch: the epoch shared with the loader's transform and collate.
        current_epoch: the epoch now (None: no trainer, ``epoch`` is left as it is).
        args, kwargs: those of :class:`torch.utils.data.DataLoader`.
    """

    def __init__(self, *args: Any, epoch: SharedEpoch, current_epoch: Callable[[], int | None], **kwargs: Any
                 ) -> None:
        super().__init__(*args, **kwargs)
        self.epoch, self.current_epoch = epoch, current_epoch

    def __iter__(self) -> Iterator[Any]:
        current = self.current_epoch()
        if current is not None:
            self.epoch.set(current)
        return super().__iter__()


#: The authors' sizes, which ``image_size`` scales (see :class:`CocoFormatDataModule`).
AUTHORS_SIZES: dict[str, Any] = {
    "train_scales": tuple(TRAIN_SCALES), "train_max_size": TRAIN_MAX_SIZE,
    "crop_resize_scales": tuple(CROP_RESIZE_SCALES), "crop_min_size": CROP_MIN_SIZE, "crop_max_size": CROP_MAX_SIZE,
    "eval_min_size": EVAL_MIN_SIZE, "eval_max_size": EVAL_MAX_SIZE,
}


def sizes_for(image_size: int, given: dict[str, Any]) -> dict[str, Any]:
    """The transform sizes for evaluation images whose shortest side is ``image_size``: each of ``given`` that
    is still the authors' value scaled by ``image_size`` / their 800 (rounded; training scales without
    repeats), the others as given."""
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 32:
        raise ValueError(f"--data.image_size must be an integer >= 32 (pixels of the shortest side), got "
                         f"{image_size!r}")
    factor = image_size / EVAL_MIN_SIZE
    sizes = dict(given)
    for name, authors in AUTHORS_SIZES.items():
        if (tuple(given[name]) if isinstance(authors, tuple) else given[name]) != authors:
            continue  # set on purpose: kept
        sizes[name] = (sorted({round(s * factor) for s in authors}) if isinstance(authors, tuple)
                       else round(authors * factor))
    return sizes


def _check_augmentation(augmentation: Augmentation, multi_scale: Sequence[int] | None, stop_epoch: int | None,
                        square_size: int | None) -> tuple[list[int] | None, int | None]:
    """The data module's augmentation settings checked (a one-line error naming the flag): multi_scale as a list
    of ints, and the stop epoch."""
    if augmentation.needs_square_size and square_size is None:
        raise ValueError(f"--data.augmentation {augmentation.name} resizes to a square: set --data.square_size too "
                         f"(e.g. {augmentation.authors_square_size})")
    sizes = None
    if multi_scale is not None:
        if square_size is None:
            raise ValueError("--data.multi_scale resizes batches of squares: set --data.square_size too (e.g. 640)")
        if (isinstance(multi_scale, (str, bytes)) or not multi_scale
                or any(isinstance(size, bool) or not isinstance(size, int) or size < 32 for size in multi_scale)):
            raise ValueError(f"--data.multi_scale must be a list of square sides, each an integer >= 32 (a multiple "
                             f"of what the model needs: e.g. [480, 512, ..., 800] for RT-DETR), got {multi_scale!r}")
        sizes = list(multi_scale)
    if stop_epoch is not None and (isinstance(stop_epoch, bool) or not isinstance(stop_epoch, int) or stop_epoch < 0):
        raise ValueError(f"--data.augmentation_stop_epoch must be an epoch >= 0 (0-based) or null, got {stop_epoch!r}")
    return sizes, stop_epoch


def _check_dense_o2o(augmentation: Augmentation, mosaic_prob: float, mosaic_epochs: Sequence[int], mixup_prob: float,
                     mixup_epochs: Sequence[int], stop_epoch: int | None) -> tuple[tuple[int, int], tuple[int, int]]:
    """DEIM's settings checked (a one-line error naming the flag): the probabilities and the two epoch ranges, the
    mosaic's within the augmentations' (with an augmentation that draws mosaics, the only kind that reads them)."""
    for flag, value in (("mosaic_prob", mosaic_prob), ("mixup_prob", mixup_prob)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ValueError(f"--data.{flag} must be a probability in [0, 1], got {value!r}")
    ranges = []
    for flag, epochs in (("mosaic_epochs", mosaic_epochs), ("mixup_epochs", mixup_epochs)):
        if (isinstance(epochs, (str, bytes)) or len(epochs) != 2
                or any(isinstance(e, bool) or not isinstance(e, int) for e in epochs) or not 0 <= epochs[0] <= epochs[1]):
            raise ValueError(f"--data.{flag} must be [start, end]: epochs (0-based) with 0 <= start <= end, e.g. "
                             f"[4, 29], got {epochs!r}")
        ranges.append((int(epochs[0]), int(epochs[1])))
    if augmentation.mosaic and stop_epoch is not None and ranges[0][1] > stop_epoch:
        raise ValueError(f"--data.mosaic_epochs {list(ranges[0])} ends after --data.augmentation_stop_epoch "
                         f"{stop_epoch}: end the mosaic at or before the stop (DEIM: [4, 29] and 50)")
    return ranges[0], ranges[1]


def split_paths(root: str | None, explicit: dict[str, tuple[str | None, str | None]], json_name: str,
                layout: str) -> dict[str, tuple[Path, Path]]:
    """Split → (image folder, annotation json) of a data module.

    explicit: split → (images, json) as given, both or neither; a given pair always counts (a wrong path fails
    loudly when it is read). Otherwise the train and val splits come from ``root`` in COCO's layout,
    ``ROOT/{split}2017`` and ``ROOT/annotations/`` + ``json_name`` with ``{split}`` filled in, when that json
    exists (e.g. a root with just val2017 for evaluation). layout: what ``root`` should hold, for the error
    when it is not a folder.
    """
    base = Path(root) if root is not None else None
    if base is not None and not base.is_dir():
        raise ValueError(f"data root '{base}' does not exist; pass a folder with {layout}")
    paths: dict[str, tuple[Path, Path]] = {}
    for split, (images, json_file) in explicit.items():
        if (images is None) != (json_file is None):
            raise ValueError(f"{split}: give both {split}_images and {split}_annotations, not only one of them")
        if images is not None and json_file is not None:
            paths[split] = (Path(images), Path(json_file))
        elif base is not None and split in ("train", "val"):
            from_root = (base / f"{split}2017", base / "annotations" / json_name.format(split=split))
            if from_root[1].is_file():
                paths[split] = from_root
            else:
                logger.info("no %s split under '%s' (%s does not exist)", split, base, from_root[1])
    return paths


class CocoFormatDataModule(lightning.LightningDataModule):
    """What the detection and the panoptic data modules share: batch sizes, loader settings, the transforms'
    sizes, the data set of each split (built once, on first use) and the loaders (:func:`collate_detection`,
    per-worker augmentation seeds; plain image files for ``predict``). Subclasses set ``paths``
    (:func:`split_paths`), ``category_map`` and ``predict_images``, and build a split's data set in
    ``_build_dataset``; their YAML keys are theirs plus these.

    Args:
        batch_size: training images per process (authors: 2 for R50, 4 per GPU in the 64-batch recipe), or
            "auto": the largest that fits in the memory available, chosen when the run starts
            (:mod:`detr.lightning.batch_size`: the rule, and the line it logs).
        val_batch_size: images per evaluation batch (None: ``batch_size``). AP depends on it through
            padding: evaluate at the training images per GPU to reproduce the authors' numbers.
        num_workers: DataLoader worker processes (0: load in the training process).
        pin_memory: pin batches (only when CUDA is available).
        persistent_workers: keep workers between epochs (only with num_workers > 0).
        drop_last: drop the last incomplete training batch (as the authors do).
        train_scales: shortest-side sizes the training resize picks from at random (authors: 480, 512, ...,
            800; :func:`detr.data.transforms.make_train_transform`; masks move with the image).
        train_max_size: cap on the long side after the training resize (authors: 1333).
        crop_resize_scales: shortest-side sizes before the training random crop, half of the images
            (authors: 400, 500, 600).
        crop_min_size: smallest width and height of the training random crop (authors: 384).
        crop_max_size: largest width and height of the training random crop (authors: 600).
        eval_min_size: shortest side of the evaluation resize (authors: 800;
            :func:`detr.data.transforms.make_eval_transform`); checkpoints record it for the Predictor.
        eval_max_size: cap on the long side of the evaluation resize (authors: 1333).
        image_size: one knob for every size above: the shortest side of evaluation images, with the authors'
            proportions for the rest (e.g. 384: evaluation at 384 with the long side at most 640, training
            scales 230-384, crops of 184-288 px). It replaces the sizes left at the authors' values; a size
            set to another value is kept. None: the sizes as given. Smaller images make a step on the CPU
            several times faster, at the cost of small objects.
        square_size: resize every image, in training and evaluation, to this square (a multiple of the model's
            ``size_multiple``: 32 for RT-DETR, patch × windows for RF-DETR, which the training system checks; the
            real-time DETRs' input contract: :func:`detr.data.transforms.make_square_transform`, horizontal flips
            only) instead of the shortest-side resizes above; checkpoints record it as the evaluation size. None:
            those resizes.
        normalize: ImageNet's mean and std (the paper's DETR, Deformable DETR, RF-DETR); False: pixels / 255
            (RT-DETR). The training system refuses data that does not follow its model's input contract.
        augmentation: the training augmentation, a name of :data:`detr.data.augmentations.AUGMENTATIONS`.
            "default": the paper's DETR (flip, random resizes and crop; the sizes above), or with ``square_size``
            the horizontal flip alone. "rtdetr": RT-DETR's and D-FINE's (needs ``square_size``): photometric
            distortion, zoom-out, IoU crop, flip, the square resize
            (:func:`detr.data.transforms.make_rtdetr_train_transform`; docs/models/rtdetr.md). "rfdetr": RF-DETR's
            and LW-DETR's (needs ``square_size``): flip, then the square resize or DETR's crop and the square
            resize (:func:`detr.data.transforms.make_rfdetr_train_transform`; the crop's sizes above); with
            ``multi_scale``, the training square is its largest side and batches are resized bilinearly, as the
            authors (docs/models/rfdetr.md). "deim": DEIM's dense one-to-one over RT-DETR's (needs ``square_size``;
            boxes only): the mosaic of four images and the batches' MixUp, by epoch
            (:mod:`detr.data.dense_o2o`; docs/models/dfine.md).
        multi_scale: square sides (each a multiple of the model's ``size_multiple``; needs ``square_size``) that
            each training batch is resized to, one drawn at random per batch (repeats weight a side; the
            authors' list for 640: 480 to 800 in steps of 32 with 640 three times). Evaluation and the
            checkpoint's input size stay at ``square_size``. None: every batch at ``square_size``.
        augmentation_stop_epoch: from this epoch on (0-based, as ``trainer.current_epoch``) train with the flip
            and the ``square_size`` resize only: no photometric distortion, zoom-out or IoU crop
            (``augmentation: rtdetr``) and no multi-scale batches (the authors' policy for their last epochs:
            71 of 72 for RT-DETRv2). None: never stop.
        mosaic_epochs: ``augmentation: deim``: ``[start, end]``: the strong augmentations start at ``start``
            (before it the flip and the square resize only), and a mosaic is drawn in epochs ``start <= epoch <
            end`` (the authors' policy ``[4, 29, 50]`` is ``[4, 29]`` and ``augmentation_stop_epoch`` 50).
        mosaic_prob: ``augmentation: deim``: the chance of a mosaic in those epochs (authors: 0.5).
        mixup_prob: ``augmentation: deim``: the chance that a training batch is mixed (authors: 0.5).
        mixup_epochs: ``augmentation: deim``: ``[start, end]``: batches are mixed in epochs ``start <= epoch <
            end`` (authors: [4, 29]).

    Attributes:
        category_map: label ↔ category id/name (None when the subclass has no annotations to read).
        num_classes: ``category_map.num_classes`` (None without annotations).
        category_names: label → name.
    """

    def __init__(
        self,
        *,
        batch_size: int | Literal["auto"] = 2,
        val_batch_size: int | None = None,
        num_workers: int = 2,
        pin_memory: bool = True,
        persistent_workers: bool = False,
        drop_last: bool = True,
        train_scales: Sequence[int] = TRAIN_SCALES,
        train_max_size: int = TRAIN_MAX_SIZE,
        crop_resize_scales: Sequence[int] = CROP_RESIZE_SCALES,
        crop_min_size: int = CROP_MIN_SIZE,
        crop_max_size: int = CROP_MAX_SIZE,
        eval_min_size: int = EVAL_MIN_SIZE,
        eval_max_size: int = EVAL_MAX_SIZE,
        image_size: int | None = None,
        square_size: int | None = None,
        normalize: bool = True,
        augmentation: AugmentationName = "default",
        multi_scale: Sequence[int] | None = None,
        augmentation_stop_epoch: int | None = None,
        mosaic_epochs: Sequence[int] = (4, 29),
        mosaic_prob: float = 0.5,
        mixup_prob: float = 0.5,
        mixup_epochs: Sequence[int] = (4, 29),
    ) -> None:
        super().__init__()
        given = {"train_scales": list(train_scales), "train_max_size": train_max_size,
                 "crop_resize_scales": list(crop_resize_scales), "crop_min_size": crop_min_size,
                 "crop_max_size": crop_max_size, "eval_min_size": eval_min_size, "eval_max_size": eval_max_size}
        #: the transforms' sizes after ``image_size``; subclasses record them as hyperparameters, which is where
        #: a checkpoint's reader finds the evaluation size (the Predictor's default resize)
        self.sizes = given if image_size is None else sizes_for(image_size, given)
        if square_size is not None:
            if isinstance(square_size, bool) or not isinstance(square_size, int) or square_size < 32:
                raise ValueError(f"--data.square_size must be an integer >= 32 (a multiple of what the model needs: "
                                 f"32 for RT-DETR, patch × windows for RF-DETR), got {square_size!r}")
            # the evaluation size a checkpoint records (its reader's resize)
            self.sizes = {**self.sizes, "eval_min_size": square_size, "eval_max_size": square_size}
        self.square_size, self.normalize = square_size, normalize
        if isinstance(batch_size, str) and batch_size != "auto":
            raise ValueError(f"--data.batch_size must be an integer >= 1 or auto, got {batch_size!r}")
        for flag, value, least in (("batch_size", batch_size, 1), ("val_batch_size", val_batch_size, 1),
                                   ("num_workers", num_workers, 0)):
            if isinstance(value, int) and value < least:  # named as the user set it: the flag, not the class
                raise ValueError(f"--data.{flag} must be >= {least}, got {value}")
        self.batch_size: int | Literal["auto"] = batch_size
        self._val_batch_size = val_batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.drop_last = drop_last
        #: the training augmentation's record (:mod:`detr.data.augmentations`)
        self.augmentation = augmentation_named(augmentation)
        self.multi_scale, self.augmentation_stop_epoch = _check_augmentation(
            self.augmentation, multi_scale, augmentation_stop_epoch, square_size)
        self.mosaic_epochs, self.mixup_epochs = _check_dense_o2o(self.augmentation, mosaic_prob, mosaic_epochs,
                                                                 mixup_prob, mixup_epochs, augmentation_stop_epoch)
        self.mosaic_prob, self.mixup_prob = float(mosaic_prob), float(mixup_prob)
        #: the trainer's epoch as the training loader's workers see it (written by :class:`EpochLoader`)
        self.epoch = SharedEpoch()
        self.train_transform = self.augmentation.train_transform(TrainingInput(
            square_size=square_size, normalize=normalize, sizes=self.sizes, multi_scale=self.multi_scale,
            stop_epoch=self.augmentation_stop_epoch, epoch=self.epoch, mosaic_epochs=self.mosaic_epochs,
            mosaic_prob=self.mosaic_prob))
        if square_size is not None:
            self.eval_transform = make_square_transform(square_size, train=False, normalize=normalize)
        else:
            self.eval_transform = make_eval_transform(min_size=self.sizes["eval_min_size"],
                                                      max_size=self.sizes["eval_max_size"], normalize=normalize)
        self.paths: dict[str, tuple[Path, Path]] = {}
        self.category_map: CategoryMap | None = None
        self.predict_images: str | list[str] | None = None  # a subclass's predict_images argument
        self.missing_root: Path | None = None  # a data root that does not exist, set aside for predict (see _require)
        self._datasets: dict[str, Any] = {}
        # Annotation jsons already read (path → dict), for the start-up checks; dropped before a loader forks
        # its workers, which would otherwise inherit (and, page by page, copy) the json's Python objects.
        self._json_cache: dict[Path, dict[str, Any]] = {}

    @property
    def input_spec(self) -> InputSpec:
        """The input contract these transforms follow (resize and normalisation; the training system checks it
        against its model's)."""
        mean_std = {} if self.normalize else {"mean": None, "std": None}
        if self.square_size is not None:
            return InputSpec(resize="square", size=self.square_size, max_size=None, **mean_std)
        return InputSpec(size=self.sizes["eval_min_size"], max_size=self.sizes["eval_max_size"], **mean_std)

    # ------------------------------------------------------------------ what the data decides
    @property
    def num_classes(self) -> int | None:
        """Number of model classes (``category_map.num_classes``)."""
        return None if self.category_map is None else self.category_map.num_classes

    @property
    def category_names(self) -> list[str]:
        """Name of each label (raw-id maps name unused ids "N/A")."""
        return [] if self.category_map is None else list(self.category_map.names)

    # ------------------------------------------------------------------ data sets
    def _build_dataset(self, split: Split, images: Path, annotations: Path) -> Any:
        """The data set of ``split`` (train transform for "train", eval transform otherwise)."""
        raise NotImplementedError

    def _dataset(self, split: Split) -> Any:
        if split in self._datasets:
            return self._datasets[split]
        if split == "test" and "test" not in self.paths:
            return self._dataset("val")
        if split not in self.paths:
            return None
        dataset = self._datasets[split] = self._build_dataset(split, *self.paths[split])
        if split == "train" and self.augmentation.mosaic:
            if not isinstance(dataset, CocoDetection):
                raise ValueError(f"--data.augmentation {self.augmentation.name} draws mosaics from a detection set "
                                 "(boxes): use --data.augmentation rtdetr for this data")
            self.train_transform.draw_from(dataset)
        return dataset

    @property
    def train_dataset(self) -> Any:
        """Training set (train transform), None if not configured."""
        return self._dataset("train")

    @property
    def val_dataset(self) -> Any:
        """Validation set (eval transform); ``.coco`` is the evaluator's box ground truth, crowd included."""
        return self._dataset("val")

    @property
    def test_dataset(self) -> Any:
        """Test set (eval transform); the validation set unless test paths were given."""
        return self._dataset("test")

    @property
    def predict_dataset(self) -> ImageFilesDataset | None:
        """Plain image files (eval transform), None without ``predict_images``."""
        if self.predict_images is None:
            return None
        if "predict" not in self._datasets:
            self._datasets["predict"] = ImageFilesDataset(self.predict_images, transform=self.eval_transform)
        return self._datasets["predict"]

    def annotations_json(self, path: str | Path) -> dict[str, Any] | None:
        """The json of annotation file ``path`` as this module read it at start-up, or None once the loaders
        have started (or if it was not read here): the start-up checks read it instead of the file."""
        return self._json_cache.get(Path(path))

    # ------------------------------------------------------------------ loaders
    def _loader(self, dataset: Any, *, batch_size: int, shuffle: bool, drop_last: bool, train: bool = False
                ) -> DataLoader:
        workers = self.num_workers
        self._json_cache.clear()  # the checks are done; workers fork from here (see __init__)
        settings: dict[str, Any] = {
            "batch_size": batch_size, "shuffle": shuffle, "drop_last": drop_last, "num_workers": workers,
            "collate_fn": collate_detection, "pin_memory": self.pin_memory and torch.cuda.is_available(),
            "persistent_workers": self.persistent_workers and workers > 0,
            "worker_init_fn": seed_worker_transform if workers > 0 else None,
        }
        if not train:
            return DataLoader(dataset, **settings)
        if self.multi_scale is not None:
            settings["collate_fn"] = MultiScaleCollate(self.multi_scale, stop_epoch=self.augmentation_stop_epoch,
                                                       epoch=self.epoch, mode=self.augmentation.multi_scale_mode)
        if self.augmentation.mixup:
            settings["collate_fn"] = MixUpCollate(settings["collate_fn"], prob=self.mixup_prob,
                                                  epochs=self.mixup_epochs, epoch=self.epoch)
        return EpochLoader(dataset, epoch=self.epoch, current_epoch=self.training_epoch, **settings)

    @property
    def val_batch_size(self) -> int | Literal["auto"]:
        """Images per evaluation batch: ``val_batch_size`` as given, else ``batch_size``."""
        return self._val_batch_size if self._val_batch_size is not None else self.batch_size

    def set_batch_size(self, batch_size: int) -> None:
        """Set the training batch (and the evaluation batch where it follows it): ``batch_size="auto"``'s choice
        (:func:`detr.lightning.batch_size.resolve_auto_batch_size`)."""
        self.batch_size = batch_size

    def _chosen(self, batch_size: int | Literal["auto"]) -> int:
        if batch_size == "auto":
            raise ValueError("--data.batch_size auto is chosen by the training system when a run starts "
                             "(detr fit / validate / test / predict); this data module was used without one: give a "
                             "number (batch_size=4)")
        return batch_size

    def training_epoch(self) -> int | None:
        """The attached trainer's current epoch (0-based), None without a trainer."""
        return None if self.trainer is None else self.trainer.current_epoch

    def set_aside_missing_root(self, root: str | None, predict_images: str | list[str] | None) -> str | None:
        """``root``, or None when it does not exist and there are ``predict_images``: predict reads only those,
        so a config's root (the demo's data/shapes) need not exist for it. The other stages still name the
        missing root when they ask for its data (:meth:`_require`)."""
        if predict_images is None or root is None or Path(root).exists():  # a folder, or a YOLO data.yaml
            return root
        logger.info("data root '%s' does not exist: only predict_images can be used", root)
        self.missing_root = Path(root)
        return None

    def _require(self, dataset: Any, split: str) -> Any:
        if dataset is None and self.missing_root is not None:
            raise ValueError(f"no {split} data: data root '{self.missing_root}' does not exist; pass --data.root with "
                             f"a COCO-layout folder, or {split}_images + {split}_annotations")
        if dataset is None:
            raise ValueError(f"no {split} data configured: pass root=DIR or {split}_images + {split}_annotations")
        return dataset

    def train_dataloader(self) -> DataLoader:
        dataset = self._require(self.train_dataset, "train")
        if self.num_workers == 0:  # in-process augmentation: seed it from the (seed_everything) torch generator
            reseed_transform(dataset.transform, int(torch.randint(0, 2**31 - 1, ()).item()))
        batch_size = self._chosen(self.batch_size)
        if self.drop_last and len(dataset) < batch_size:
            raise ValueError(
                f"the training set has {len(dataset)} images, fewer than batch_size={self.batch_size}, so drop_last "
                "leaves no batch; lower batch_size or set drop_last=False"
            )
        return self._loader(dataset, batch_size=batch_size, shuffle=True, drop_last=self.drop_last, train=True)

    def val_dataloader(self) -> DataLoader:
        dataset = self._require(self.val_dataset, "val")
        return self._loader(dataset, batch_size=self._chosen(self.val_batch_size), shuffle=False, drop_last=False)

    def test_dataloader(self) -> DataLoader:
        dataset = self._require(self.test_dataset, "test")
        return self._loader(dataset, batch_size=self._chosen(self.val_batch_size), shuffle=False, drop_last=False)

    def predict_dataloader(self) -> DataLoader:
        if self.predict_dataset is None:
            raise ValueError("no predict data configured: pass predict_images (a folder or a list of image files)")
        return self._loader(self.predict_dataset, batch_size=self._chosen(self.val_batch_size), shuffle=False,
                            drop_last=False)


class DetrDataModule(CocoFormatDataModule):
    """COCO-format data for DETR, and YOLO and Pascal VOC data read as COCO.

    Args:
        root: a folder in COCO's layout: ROOT/train2017/, ROOT/val2017/ and ROOT/annotations/
            instances_{train,val}2017.json; or a YOLO data set (a data.yaml, or the folder holding it: its train and
            val splits) or a Pascal VOC folder (Annotations/, JPEGImages/, ImageSets/Main/train.txt and val.txt), read
            into COCO's form in memory (:mod:`detr.data.formats`); optional when the explicit paths are given.
        format: the format of ``root``: "coco", "yolo" or "voc"; None: told from the path (a .yaml or a folder
            with data.yaml: YOLO; a folder with Annotations/: VOC; otherwise COCO). The explicit paths below are
            always COCO json.
        train_images: folder of the training images (default: ROOT/train2017).
        train_annotations: COCO instances json of the training images (default:
            ROOT/annotations/instances_train2017.json).
        val_images: folder of the validation images (default: ROOT/val2017).
        val_annotations: COCO instances json of the validation images (default:
            ROOT/annotations/instances_val2017.json).
        test_images: folder of the test split's images, for ``detr test`` (default: the validation split's).
        test_annotations: COCO instances json of the test split (default: the validation split's).
        predict_images: a folder (its image files) or a list of image files for ``detr predict``.
        category_ids: "auto" (raw ids for COCO's own categories, contiguous otherwise), "raw" or
            "contiguous"; see :func:`detr.data.coco.category_map_from_categories`.
        skip_bad_images: leave the images the start-up check finds missing, undecodable or mis-sized out with a
            warning instead of refusing to start. Either way a training image that fails to load mid-run is
            replaced by another with a warning naming it, and counted at the end of the epoch.
        categories_from: a checkpoint whose category map names the classes when no annotation json is
            given (``detr predict`` on plain images; the CLI sets it to ``--ckpt_path``).
        masks: give every split's targets each object's mask (``masks`` bool [T, h, w] at the transformed
            size, from the json's polygons or RLE; :class:`detr.data.coco.CocoDetection`), for a model that
            trains instance masks. False: boxes only, read and transformed as before. Mask AP does not need
            it: the evaluator reads the json's segmentations itself.
        keypoints: give every split's targets each object's keypoints (``keypoints`` float [T, K, 3] after
            collation: x, y normalised as the boxes, visibility 0/1/2; :class:`detr.data.coco.CocoDetection`), for a
            model that trains keypoints (RF-DETR with ``num_keypoints_per_class``: the GroupPose head). False: not
            read.
        kwargs: the batch sizes, loader settings and transform sizes of :class:`CocoFormatDataModule`
            (``batch_size``, ``val_batch_size``, ``num_workers``, ``pin_memory``, ``persistent_workers``,
            ``drop_last``, ``train_scales``, ``train_max_size``, ``crop_resize_scales``, ``crop_min_size``,
            ``crop_max_size``, ``eval_min_size``, ``eval_max_size``, ``image_size``, ``square_size``,
            ``normalize``, ``augmentation``, ``multi_scale``, ``augmentation_stop_epoch``, ``mosaic_epochs``,
            ``mosaic_prob``, ``mixup_prob``, ``mixup_epochs``); LightningCLI lists
            them as ``data.*``.

    Attributes: those of :class:`CocoFormatDataModule`; ``category_map`` is None when only
    ``predict_images`` is given.
    """

    def __init__(
        self,
        root: str | None = None,
        train_images: str | None = None,
        train_annotations: str | None = None,
        val_images: str | None = None,
        val_annotations: str | None = None,
        test_images: str | None = None,
        test_annotations: str | None = None,
        predict_images: str | list[str] | None = None,
        category_ids: Literal["auto", "raw", "contiguous"] = "auto",
        skip_bad_images: bool = False,
        categories_from: str | None = None,
        masks: bool = False,
        format: Literal["coco", "yolo", "voc"] | None = None,
        keypoints: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        for option, value in (("masks", masks), ("keypoints", keypoints)):
            if value and self.augmentation.mosaic:
                raise ValueError(f"--data.{option} true with --data.augmentation {self.augmentation.name}: its mosaic "
                                 f"moves boxes only; train {option} with --data.augmentation rtdetr")
        self.save_hyperparameters()
        self.hparams.update(self.sizes)  # the sizes in use (image_size scales them): a checkpoint's eval size
        root = self.set_aside_missing_root(root, predict_images)
        explicit = {"train": (train_images, train_annotations), "val": (val_images, val_annotations),
                    "test": (test_images, test_annotations)}
        #: split → the reader of a YOLO or VOC root's split (the data set's ``read_annotations``)
        self.readers: dict[str, Callable[[], dict[str, Any]]] = {}
        if format not in (None, "coco", "yolo", "voc"):
            raise ValueError(f"--data.format must be 'coco', 'yolo' or 'voc' (or null: told from --data.root), got "
                             f"{format!r}")
        data_format = format if root is None or format is not None else _root_format(root)
        if root is not None and data_format in ("yolo", "voc"):
            self.paths = self._converted_paths(root, data_format, explicit)
        else:
            self.paths = split_paths(root, explicit, "instances_{split}2017.json",
                                     layout="train2017/, val2017/ and annotations/")
        self.predict_images = predict_images
        self.skip_bad_images = skip_bad_images
        self.masks = masks
        self.keypoints = keypoints
        #: category id → its keypoint names, skeleton and mirror (from the json that names the classes; empty
        #: without ``keypoints``)
        self.keypoint_categories: dict[int, CategoryKeypoints] = {}

        # The json is read once: kept here for its data set and the start-up checks (see annotations_json).
        for split in ("train", "val", "test"):
            if split in self.paths:
                json_file = self.paths[split][1]
                data = self._json_cache.get(json_file) or load_coco_json(json_file)
                self._json_cache[json_file] = data
                if not isinstance(data.get("categories"), list):
                    raise ValueError(f"annotation file '{json_file}' has no 'categories' list")
                self.category_map = category_map_from_categories(data["categories"], category_ids)
                if keypoints:
                    self.keypoint_categories = keypoint_categories(data["categories"])
                    self.category_map = self.category_map.with_skeletons(
                        {category_id: spec.edges for category_id, spec in self.keypoint_categories.items()})
                logger.info("%d classes from '%s' (category_ids=%s)", self.category_map.num_classes, json_file,
                            category_ids)
                break
        if self.category_map is None and categories_from is not None:
            self.category_map = _checkpoint_category_map(categories_from)
        if self.category_map is None and predict_images is None and root is not None:
            raise ValueError(
                f"data root '{Path(root)}' has neither annotations/instances_train2017.json nor "
                "annotations/instances_val2017.json; pass a COCO-layout folder or explicit *_images/*_annotations"
            )
        if self.category_map is None and predict_images is None:
            raise ValueError(
                "DetrDataModule needs data: root=DIR (COCO layout), or train_images + train_annotations / "
                "val_images + val_annotations, or predict_images"
            )

    @property
    def num_keypoints_per_class(self) -> list[int]:
        """Each model label's number of keypoints (0: a class without; empty without ``keypoints``): a value the
        data decides, for a keypoint model's head (RF-DETR's ``num_keypoints_per_class``), as ``num_classes`` is."""
        if not self.keypoint_categories or self.category_map is None:
            return []
        counts = [0] * self.category_map.num_classes
        for category_id, spec in self.keypoint_categories.items():
            counts[self.category_map.category_id_to_label(category_id)] = spec.num_keypoints
        return counts

    def _converted_paths(self, root: str, data_format: Literal["yolo", "voc"],
                         explicit: dict[str, tuple[str | None, str | None]]) -> dict[str, tuple[Path, Path]]:
        """Split → (image folder, the file or folder that lists the split) of a YOLO or VOC ``root``, each split
        read now (its COCO dict kept for the data set and the start-up checks) unless explicit paths replace it."""
        paths = split_paths(None, explicit, "", layout="")
        for split in dataset_splits(root, data_format):
            if split in paths or split not in ("train", "val", "test"):
                continue
            # image sizes remembered where the start-up checks keep their reads (CheckData's cache): read once
            converted = read_split(root, split, data_format, cache=True).require_clean()
            paths[split] = (converted.images_dir, converted.source)
            self._json_cache[converted.source] = converted.data
            self.readers[split] = functools.partial(load_split, root, split, data_format, cache=True)
            logger.info("%s %s split: %d images from '%s'", data_format, split, len(converted.data["images"]),
                        converted.source)
        if not paths:
            fix = ("add `train: images/train` and `val: images/val` to its data.yaml" if data_format == "yolo"
                   else "list the splits' image ids in ImageSets/Main/train.txt and val.txt")
            raise ValueError(f"data root '{root}' ({data_format}) has no train or val split: {fix}")
        return paths

    # ------------------------------------------------------------------ data sets
    def _build_dataset(self, split: Split, images: Path, annotations: Path) -> CocoDetection:
        return CocoDetection(
            images,
            annotations,
            transform=self.train_transform if split == "train" else self.eval_transform,
            category_map=self.category_map,
            skip_bad_images=self.skip_bad_images,
            # A training file that fails mid-run (truncated: the start-up check reads only headers) is replaced,
            # not fatal: hours of training are worth more than one image. Evaluation keeps every image or stops.
            skip_unreadable=split == "train",
            coco_data=self._json_cache.get(annotations),
            masks=self.masks,
            keypoints=self.keypoints,
            read_annotations=self.readers.get(split),
        )

    def setup(self, stage: str) -> None:
        """Build the data sets the stage needs ("fit", "validate", "test", "predict")."""
        wanted = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ()}.get(stage, ())
        for split in wanted:
            self._dataset(split)  # type: ignore[arg-type]


def _root_format(root: str) -> Literal["coco", "yolo", "voc"]:
    """The format of a data root (:func:`detr.data.formats.detect_format`); COCO where it cannot tell, so that a
    root that is not a data set gets COCO's message about what it lacks."""
    try:
        return detect_format(root)
    except ValueError:
        return "coco"


def _checkpoint_category_map(path: str) -> CategoryMap | None:
    """The category map a checkpoint stores (COCO's for a 91-class file without one), None if unknown."""
    contents = read_checkpoint(path)
    if contents.meta.category_map is not None:
        return contents.meta.category_map
    head = contents.state_dict.get("class_embed.weight")
    if head is not None and int(head.shape[0]) == 92:  # the authors' COCO files: 91 ids + "no object"
        return CategoryMap.coco()
    logger.warning("checkpoint %s names no categories: predictions use its labels as category ids", path)
    return None
