"""Check every training input before the first step: ``detr fit`` runs the data set checker on the train
and validation splits with the model's real ``num_queries``.

A long run should not find a corrupt validation image after its first epoch, train on a json without
boxes, or drop and clip boxes without saying so. :class:`CheckData` runs
:func:`detr.data.checker.check_dataset` at setup and then:

- raises :class:`DataCheckError` listing the errors (what the checker would exit 1 for): invalid
  files, string image ids, a split without boxes, boxes that look like xyxy corners, more objects in
  one image than the model has queries;
- with the data module's ``skip_bad_images``, turns missing, undecodable and mis-sized images into a
  warning with a count, and leaves them out of the split;
- logs a count of the boxes the pipeline drops (zero or negative size, entirely outside the image) or
  clips (reaching outside), and of every warning kind (images without boxes, crowd boxes ...), naming the
  files whose EXIF orientation turns their pixels (their boxes must be in the displayed frame).

During training it counts the training images that failed to load and were replaced (a truncated JPEG passes
the default header check; the data set names each file once) and logs the count at the end of each epoch,
with the option that finds them all before the first step.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import lightning as L

from detr.data.checker import Problem, check_dataset, format_problems
from detr.data.coco import CocoDetection
from detr.data.image_checks import default_cache_file

logger = logging.getLogger(__name__)

ImageCheck = Literal["headers", "decode", "off"]

#: Problems about one image file: with ``skip_bad_images`` the image is left out instead.
IMAGE_KINDS = frozenset({"missing_image", "unreadable_image", "image_size_mismatch"})
#: Boxes the pipeline drops or clips: counted and reported, not fatal.
BOX_KINDS = frozenset({"zero_size_box", "box_outside_image"})
#: Warnings a user must act on file by file (a count alone would not say which): logged with their files.
NAMED_WARNING_KINDS = frozenset({"exif_orientation"})


class DataCheckError(ValueError):
    """A training or validation split has problems that would break or silently corrupt training."""


class CheckData(L.Callback):
    """Check the data module's train and val splits when ``fit`` sets up (module docstring).

    Args:
        train_images: "headers" reads every training image's header (missing files, non-images, sizes
            against the json, EXIF orientation), "decode" decodes each one completely (also truncated files,
            which "headers" leaves to be replaced mid-run; in parallel over the CPU cores on large sets),
            "off" skips the whole training split check.
        val_images: the same for the validation split; "decode" by default, since validation runs only
            after the first training epoch.
        cache: remember what each image read found in ``JSON.imagecache`` beside each annotation json, keyed by
            file size and mtime, so a resumed run or the next run on the data reads only changed files
            (:mod:`detr.data.image_checks`).
        min_images_per_class: warn, naming them, about training categories with boxes on fewer images than this
            (a fine-tune learns next to nothing about them; 0: no check).

    The checks run in the global rank-0 process only (the other ranks wait for its findings, broadcast), so
    the validation images are decoded once per run, not once per rank.

    Needs a data module with ``train_dataset`` / ``val_dataset`` of :class:`detr.data.coco.CocoDetection`
    (others are left alone) and a training system whose ``detector`` has ``num_queries`` (DetrSystem, PanopticSystem).
    """

    def __init__(self, train_images: ImageCheck = "headers", val_images: ImageCheck = "decode",
                 cache: bool = True, min_images_per_class: int = 10) -> None:
        super().__init__()
        self.cache, self.min_images_per_class = cache, min_images_per_class
        for name, value in (("train_images", train_images), ("val_images", val_images)):
            if value not in ("headers", "decode", "off"):
                raise ValueError(f"CheckData: {name} must be 'headers', 'decode' or 'off', got {value!r}")
        self.modes = {"train": train_images, "val": val_images}
        self._skipped_files: set[str] = set()  # training images replaced in this epoch (this process's batches)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or trainer.datamodule is None:
            return
        num_queries = pl_module.detector.num_queries
        # The loader's workers, or (None) every core for a full decode of a large split: nothing else runs yet.
        workers = int(getattr(trainer.datamodule, "num_workers", 0) or 0) or None
        errors: list[str] = []
        for split, mode in self.modes.items():
            dataset = getattr(trainer.datamodule, f"{split}_dataset", None)
            if mode == "off" or not isinstance(dataset, CocoDetection):
                continue
            problems = None
            if trainer.is_global_zero:  # one process reads the images; every process gets the findings
                problems = check_dataset(
                    dataset.images_dir, dataset.annotations_file, num_queries=num_queries,
                    decode_images=mode == "decode", workers=workers,
                    data=_loaded_json(trainer.datamodule, dataset.annotations_file),
                    cache_file=default_cache_file(dataset.annotations_file) if self.cache else None,
                    progress=getattr(trainer, "progress_bar_callback", None) is not None,
                    min_images_per_class=self.min_images_per_class if split == "train" else 0,
                )
            problems = trainer.strategy.broadcast(problems)
            fatal = report_problems(split, dataset, problems)
            if fatal:
                errors.append(f"{split} split ('{dataset.annotations_file}', images in '{dataset.images_dir}'):\n"
                              + format_problems(fatal, max_per_kind=5))
        if errors:
            raise DataCheckError(
                "the data would break or silently corrupt training:\n" + "\n".join(errors) + "\nFix them (detr-check-data "
                "IMAGES_DIR JSON lists every one); missing or unreadable images can instead be "
                "left out with --data.skip_bad_images true"
            )


    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._skipped_files = set()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        # The data set marks the sample that replaced a bad image; its workers cannot report to this process.
        targets = batch[-1] if isinstance(batch, (list, tuple)) and batch else []
        for target in targets if isinstance(targets, list) else []:
            if isinstance(target, dict):
                self._skipped_files.update(target.get("skipped_files", ()))

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._skipped_files:
            return
        dataset = getattr(trainer.datamodule, "train_dataset", None)
        if hasattr(dataset, "warned_files"):  # named once: the next epoch's loader workers copy this set
            dataset.warned_files.update(Path(name) for name in self._skipped_files)
        count = len(self._skipped_files)
        shown = ", ".join(f"'{name}'" for name in sorted(self._skipped_files)[:5])
        more = f" and {count - 5} more" if count > 5 else ""
        json_file, images_dir = (getattr(dataset, "annotations_file", "JSON"), getattr(dataset, "images_dir", "IMAGES"))
        logger.warning(
            "epoch %d: %d training image%s could not be loaded, other images took %s place: %s%s. Restore or replace "
            "them, or remove them from '%s'; --data_check.train_images decode decodes every training image before "
            "the first step (`detr-check-data %s %s` lists them without training)",
            trainer.current_epoch, count, "" if count == 1 else "s", "its" if count == 1 else "their", shown, more,
            json_file, images_dir, json_file,
        )


def _loaded_json(datamodule: Any, annotations_file: Path) -> dict[str, Any] | None:
    """The json the data module already read (no second read of a large file), None to read the file."""
    annotations_json = getattr(datamodule, "annotations_json", None)
    return annotations_json(annotations_file) if annotations_json is not None else None


def report_problems(split: str, dataset: Any, problems: list[Problem]) -> list[Problem]:
    """Log the counts of ``problems`` of one split, leave bad images out of ``dataset`` when it skips
    them, and return the problems that must stop the run."""
    fatal = []
    skipped_files: set[str] = set()
    box_counts: Counter[str] = Counter()
    warning_counts: Counter[str] = Counter()
    named: dict[str, list[Problem]] = {}
    for problem in problems:
        if problem.severity == "info":
            logger.info("data check, %s: %s", split, problem.message)
        elif problem.kind in IMAGE_KINDS and dataset.skip_bad_images:
            skipped_files.add(str(problem.file_name))
        elif problem.kind in BOX_KINDS:
            box_counts["dropped" if "drops it" in problem.message else "clipped"] += 1
        elif problem.severity == "error":
            fatal.append(problem)
        elif problem.file_name is None:  # about the whole set (few images of a class, box units): said whole
            logger.warning("data check, %s: %s: %s", split, problem.kind, problem.message)
        else:
            warning_counts[problem.kind] += 1
            if problem.kind in NAMED_WARNING_KINDS:
                named.setdefault(problem.kind, []).append(problem)
    if box_counts:
        logger.warning("data check, %s: %d box(es) dropped (zero or negative size, or entirely outside the image) "
                       "and %d clipped to the image (reaching outside it); detr-check-data lists them",
                       split, box_counts["dropped"], box_counts["clipped"])
    if warning_counts:
        counts = ", ".join(f"{kind} {count}" for kind, count in warning_counts.items())
        logger.warning("data check, %s: %s", split, counts)
    for kind, listed in named.items():
        more = f" (and {len(listed) - 5} more: detr-check-data lists them)" if len(listed) > 5 else ""
        logger.warning("data check, %s: %s: %s%s", split, kind, "; ".join(f"'{p.file_name}': {p.message}"
                                                                        for p in listed[:5]), more)
    if skipped_files:
        before = len(dataset)
        dataset.leave_out(skipped_files)
        logger.warning("data check, %s: %d bad image file(s) left out (skip_bad_images), %d of %d images remain: %s",
                       split, len(skipped_files), len(dataset), before, ", ".join(sorted(skipped_files)[:5]))
        if not len(dataset):
            fatal.append(Problem("error", "no_images", "every image of the split is missing or unreadable"))
    return fatal
