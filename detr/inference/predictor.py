"""Run a trained DETR on users' images: :class:`Predictor`, which returns one
:class:`~detr.inference.prediction.Prediction` per image.

The predictor does what the authors' evaluation does (models/detr.py PostProcess) on images that
come without annotations: the authors' eval resize (shortest side 800, longest at most 1333), ImageNet
normalisation, zero padding at the bottom and right with a padding mask (the batch contract), the model,
then :class:`detr.PostProcess` with the ORIGINAL image size, so boxes are pixel ``xyxy`` on the image
as the user sees it (EXIF orientation applied). Only then does it keep the queries above a score
threshold, unless all queries are asked for.

It stays on the fast path unless attention is asked for: ``torch.inference_mode``, no attention
weights, optional bf16 or fp16 autocast. With ``return_attention=True`` every :class:`Prediction` also carries
an :class:`~detr.inference.prediction.AttentionMaps` cropped to the image's unpadded feature region, which the figures of
:mod:`detr.visualize.figures` draw (paper Fig. 3 and Fig. 6).

With a panoptic model (:class:`detr.DETRPanoptic`, e.g. ``Predictor.from_checkpoint("detr-r50-panoptic")``)
every :class:`Prediction` also carries the instance masks of its detections
(:class:`detr.inference.postprocess_masks.PostProcessMasks`), and with ``task="panoptic"`` (or
:meth:`Predictor.predict_panoptic`) a :class:`PanopticSegmentation` of the whole image
(:class:`detr.inference.postprocess_masks.PostProcessPanoptic`, paper §4.4).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from detr.categories import CategoryMap
from detr.checkpoints import CheckpointError, load_checkpoint
from detr.checkpoints.deployed import is_deployed, open_deployed
from detr.checkpoints.released import download_url, is_url
from detr.data.video import FrameSource, open_frames
from detr.inference.grounding import grounded_predictions, prompt_text
from detr.inference.images import ImageInput, is_single_image, to_rgb_array
from detr.inference.postprocess_keypoints import PostProcessKeypoints
from detr.inference.postprocess_masks import PostProcessMasks, PostProcessPanoptic
from detr.inference.predict import predictions_from_outputs
from detr.inference.prediction import Prediction
from detr.inference.slicing import SliceSettings, predict_sliced
from detr.inference.tracking import DEFAULT_TRACKER, TrackerName, track_frames
from detr.models.detector import Detector
from detr.models.outputs import DetectorOutput

logger = logging.getLogger(__name__)

Precision = Literal["fp32", "bf16", "fp16"]

#: each precision's autocast dtype; None: no autocast (float32). The outputs come back in float32 either way.
AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}

#: "detection": boxes (plus instance masks with a model that predicts masks: a panoptic model, RF-DETR's instance
#: segmentation); "instances": the same, but a model without masks is refused; "panoptic": also the image's
#: :class:`PanopticSegmentation`, for a model that predicts masks and knows its things and stuff (a panoptic model,
#: :class:`detr.DETRPanoptic`).
Task = Literal["detection", "instances", "panoptic"]


class NonFiniteOutputError(ValueError):
    """The model's outputs (logits or boxes) hold NaN or inf for some images of a batch (NaN weights, an
    overflow in fp16 or bf16, ...): raised by :meth:`Predictor.predict_arrays` with ``check_finite=True``.

    Attributes:
        indices: the positions, in the batch, of the images whose outputs are not finite.
    """

    def __init__(self, indices: Sequence[int], batch_size: int) -> None:
        super().__init__(f"the model's outputs are not finite (NaN or inf) for {len(indices)} of {batch_size} "
                         "images; check the checkpoint's weights (NaN after a diverged run?) and the precision")
        self.indices = list(indices)


class Predictor:
    """DETR inference on images of any size and mode.

    Build it from a checkpoint with :meth:`from_checkpoint` (released ``{"model": ...}`` files, plain state
    dicts in that layout, and this project's Lightning checkpoints) or from a model and its
    :class:`~detr.categories.CategoryMap`.

    Args:
        model: a :class:`detr.models.DETR` (any module with its forward contract).
        category_map: names and data set ids of the labels; default: ``model.meta.category_map`` if set.
        device: where the model runs; default CUDA when available, else CPU.
        precision: "fp32", "bf16" for bfloat16 autocast or "fp16" for float16 autocast (on CPU and CUDA;
            see :data:`AUTOCAST_DTYPES`).
        threshold: default score threshold of :meth:`predict`; None: the one the model's last validation
            found best (``model.meta.score_threshold``, this project's checkpoints), else the authors' 0.7
            (their released models; 0.25 for a prompted model, transformers' box threshold of Grounding DINO).
            :attr:`threshold_source` says which.
        batch_size: images per forward pass. Padding depends on the batch, so outputs can differ slightly
            with the batch size, as in the authors' evaluation.
        min_size, max_size: the eval resize (shortest side ``min_size``, longest at most ``max_size``);
            None: the model's ``meta.eval_size`` (what it was validated at in training, set by
            :func:`detr.load_checkpoint` for this project's checkpoints), else the authors' 800 and 1333.
        optimize: call ``model.optimize_for_inference()`` (frozen BatchNorms folded into the convolutions,
            backbone in channels-last), in place: same outputs up to float rounding, faster (docs/measurements/speed.md),
            but the model's state dict loses the authors' layout. Default off
            for a model you pass; :meth:`from_checkpoint` turns it on.
        is_thing: panoptic models: per label, thing (True) or stuff; default ``model.meta.is_thing`` (set by
            :func:`detr.load_checkpoint` for COCO panoptic files and this project's panoptic checkpoints).
        panoptic_threshold: class probability a query needs to get a panoptic segment; default: the one the
            model's training run validated with (``model.meta.panoptic_threshold``, this project's panoptic
            checkpoints), else the authors' 0.85.
        panoptic_overlap_threshold: Mask2Former's overlap filter of
            :class:`detr.inference.postprocess_masks.PostProcessPanoptic` (e.g. 0.8); default: the model's
            training run's, else none (the authors' rules).

    The model is put in eval mode and moved to ``device`` in place.
    """

    def __init__(
        self,
        model: Detector,
        *,
        category_map: CategoryMap | None = None,
        device: str | torch.device | None = None,
        precision: Precision = "fp32",
        threshold: float | None = None,
        batch_size: int = 1,
        min_size: int | None = None,
        max_size: int | None = None,
        optimize: bool = False,
        is_thing: Sequence[bool] | None = None,
        panoptic_threshold: float | None = None,
        panoptic_overlap_threshold: float | None = None,
    ) -> None:
        if precision not in AUTOCAST_DTYPES:
            raise ValueError(f"precision must be one of {', '.join(map(repr, AUTOCAST_DTYPES))}, got {precision!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        for name, value in (("threshold", threshold), ("panoptic_threshold", panoptic_threshold),
                            ("panoptic_overlap_threshold", panoptic_overlap_threshold)):
            if value is not None and not 0.0 <= value <= 1.0:  # NaN fails this too
                raise ValueError(f"{name} is a probability in [0, 1], got {value}")
        for name, value in (("min_size", min_size), ("max_size", max_size)):
            if value is not None and not value >= 1:
                raise ValueError(f"{name} is in pixels and must be >= 1, got {value}")
        self.device = torch.device(device) if device is not None else default_device()
        if optimize:
            model.optimize_for_inference()
        self.model = model.eval().to(self.device)
        self.category_map = category_map if category_map is not None else model.meta.category_map
        num_classes = model.config.num_classes
        if self.category_map is not None and self.category_map.num_classes != num_classes:
            raise ValueError(
                f"category_map has {self.category_map.num_classes} classes but the model predicts "
                f"{num_classes}; pass the category map the model was trained with"
            )
        self.precision: Precision = precision
        validated = getattr(model.meta, "score_threshold", None)
        #: the default score threshold, and where it came from (shown by the commands)
        default = 0.25 if model.prompted else 0.7
        self.threshold = float(threshold if threshold is not None else validated if validated is not None else default)
        self.threshold_source = ("given" if threshold is not None else
                                 "the checkpoint's validation: best F1" if validated is not None else
                                 "the authors' default")
        self.batch_size = int(batch_size)
        spec = model.input_spec  # the model's input contract, its resize sizes overridden where given
        #: resize, normalisation and padding of every image (:class:`detr.models.inputs.InputSpec`)
        self.input_spec = spec.replace(size=int(min_size if min_size is not None else spec.size),
                                       max_size=max_size if max_size is not None else spec.max_size)
        self.min_size, self.max_size = self.input_spec.size, self.input_spec.max_size
        self.class_head = model.config.class_head
        #: whether the model predicts masks (a panoptic model, :class:`detr.DETRPanoptic`)
        self.predicts_masks = model.predicts_masks
        self.postprocess_masks = PostProcessMasks()
        #: a keypoint model's keypoint post-processing (None without keypoints)
        self.postprocess_keypoints = PostProcessKeypoints.for_model(model)
        meta = model.meta
        if is_thing is None and meta.is_thing is not None:
            is_thing = meta.is_thing
        self.is_thing = list(is_thing) if is_thing is not None else None
        if panoptic_threshold is None:  # what the training run validated with, else the authors' 0.85
            panoptic_threshold = meta.panoptic_threshold if meta.panoptic_threshold is not None else 0.85
        self.panoptic_threshold = float(panoptic_threshold)
        self.panoptic_overlap_threshold = (panoptic_overlap_threshold if panoptic_overlap_threshold is not None
                                           else meta.panoptic_overlap_threshold)
        #: what runs the model, e.g. "pytorch (cpu, fp32)" or "onnxruntime (CPUExecutionProvider)"
        self.backend: str = (f"{model.backend} ({self.device}, {precision})" if model.backend == "pytorch"
                             else model.backend)
        logger.info("predicting with %s", self.backend)

    @classmethod
    def from_checkpoint(cls, path: str | Path, *, optimize: bool = True, **options: Any) -> Predictor:
        """Load ``path`` with :func:`detr.load_checkpoint` and wrap it.

        ``options`` are the keyword arguments of :class:`Predictor` (``device``, ``threshold``, ...); any other
        keyword is a model option for :func:`detr.load_checkpoint` (e.g. ``num_heads``, which a state dict
        cannot tell). The label names come from the checkpoint: COCO's (with the gaps of its 91-id space)
        for the authors' files, the training data set's for this project's; ``category_map`` overrides them.
        The model is private to the predictor, so ``optimize`` defaults to on (see :class:`Predictor`).

        A file ``detr-export`` wrote runs in its runtime instead of PyTorch: ``.onnx`` with ONNX Runtime on
        ``device`` (CUDA when onnxruntime-gpu has it), ``.xml`` with OpenVINO on the CPU (``precision`` "bf16"
        where the CPU has bfloat16 instructions); its metadata holds the label names and input size.
        """
        if is_url(path):  # a checkpoint or an exported file: downloaded once into torch's hub cache
            path = download_url(str(path))
        own = inspect.signature(cls.__init__).parameters.keys() - {"self", "model"}
        predictor_options = {key: value for key, value in options.items() if key in own}
        model_overrides = {key: value for key, value in options.items() if key not in own}
        device = predictor_options.get("device")
        if is_deployed(path):
            if model_overrides:
                raise ValueError(f"{path} is an exported file: its architecture is fixed; drop "
                                 f"{sorted(model_overrides)} or use the PyTorch checkpoint")
            model = open_deployed(path, device=device if device is not None else default_device(),
                                  precision=predictor_options.get("precision", "fp32"))
            if model.postprocessed:  # refused here once, not by every image's forward
                raise CheckpointError(
                    f"{path} was exported with --postprocess (scores, labels and pixel boxes in the graph, for a "
                    "deployment without Python): the Predictor, detr-predict and detr-serve post-process "
                    "themselves and need the raw outputs. Export the checkpoint again without --postprocess")
        else:
            model = load_checkpoint(path, **model_overrides)
        return cls(model, optimize=optimize, **predictor_options)

    def preprocess(self, image: np.ndarray) -> Tensor:
        """``uint8`` RGB ``[H, W, 3]`` → the model's float32 ``[3, h, w]``: resized and normalised as its
        :attr:`input_spec` says."""
        return self.input_spec.prepare(image)

    def predict(
        self,
        images: ImageInput | Sequence[ImageInput],
        *,
        threshold: float | None = None,
        all_queries: bool = False,
        return_attention: bool = False,
        task: Task = "detection",
        slice: SliceSettings | int | None = None,
        prompt: str | Sequence[str] | None = None,
        text_threshold: float = 0.25,
    ) -> list[Prediction]:
        """Detect objects in one image or a sequence of images; one :class:`Prediction` per image.

        Args:
            images: one :data:`ImageInput` or a sequence of them (mixed kinds and sizes are fine).
            threshold: score threshold for this call (default: the predictor's).
            all_queries: keep every query (no threshold), as COCO evaluation does.
            return_attention: also compute the attention maps (slower; see :class:`AttentionMaps`).
            task: "panoptic" also segments each image (:attr:`Prediction.panoptic`; a panoptic model only);
                see :data:`Task`.
            slice: predict overlapping tiles of each image and the whole image, and merge them
                (:mod:`detr.inference.slicing`): for small objects on images much larger than the model's input.
                A :class:`SliceSettings`, or an ``int``: the tile side in pixels with the default overlap and
                merge. None (default): the whole image only.
            prompt: what to detect, for a prompted model (Grounding DINO): "a cat. a remote control." or a list of
                phrases; each detection's ``label_names`` entry is the prompt's words it was found for and its label
                the phrase that holds its best word (:mod:`detr.inference.grounding`).
            text_threshold: a prompted model's score a word needs to be part of a detection's phrase (transformers'
                ``text_threshold``).

        Raises:
            ValueError: ``task`` "instances" or "panoptic" with a model that predicts no masks, naming the fix;
                ``slice`` with ``return_attention`` or ``task="panoptic"``.
        """
        self.check_task(task)
        if is_single_image(images):
            images = [images]  # type: ignore[list-item]
        keep_threshold = None if all_queries else (self.threshold if threshold is None else float(threshold))
        predictions: list[Prediction] = []
        for chunk in _chunks(list(images), self.batch_size):  # type: ignore[arg-type]
            arrays = [to_rgb_array(image) for image in chunk]
            names = [Path(image).name if isinstance(image, (str, Path)) else None for image in chunk]
            predictions.extend(
                self.predict_arrays(
                    arrays, file_names=names, threshold=keep_threshold, return_attention=return_attention, task=task,
                    slice=slice, prompt=prompt, text_threshold=text_threshold,
                )
            )
        return predictions

    __call__ = predict

    def predict_panoptic(
        self, images: ImageInput | Sequence[ImageInput], *, threshold: float | None = None
    ) -> list[Prediction]:
        """:meth:`predict` with ``task="panoptic"``: detections, their masks and :attr:`Prediction.panoptic`."""
        return self.predict(images, threshold=threshold, task="panoptic")

    def track(self, source: str | int | Path | FrameSource, *, tracker: TrackerName = DEFAULT_TRACKER,
              threshold: float | None = None) -> Iterator[Prediction]:
        """Detect and track objects through a video: one :class:`Prediction` per decoded frame, in order, with
        :attr:`Prediction.track_ids` (-1: not in a track yet) and ``image_id`` the frame's number (1-based).

        Args:
            source: a video file, a folder of frames, a webcam index or a stream URL
                (:func:`detr.data.video.open_frames`), or a source it opened (its :attr:`FrameSource.skipped`
                then counts the frames that could not be decoded).
            tracker: "botsort" (the default), "bytetrack", "sort" or "ocsort" (Roboflow's ``trackers``:
                :mod:`detr.inference.tracking`).
            threshold: the score a detection needs to start a track (default: the predictor's).
        """
        frames = source if isinstance(source, FrameSource) else open_frames(source)
        with frames:
            for _, prediction in track_frames(self, frames, tracker=tracker, threshold=threshold,
                                              frame_rate=frames.frame_rate):
                yield prediction

    def check_task(self, task: str) -> None:
        """Raise ``ValueError`` when this predictor cannot do ``task``, naming the fix."""
        if task not in ("detection", "instances", "panoptic"):
            raise ValueError(f"task must be 'detection', 'instances' or 'panoptic', got {task!r}")
        if task == "panoptic" and self.predicts_masks and self.is_thing is None:
            raise ValueError("task 'panoptic' needs to know which labels are things and which stuff, and this "
                             "checkpoint does not say (an instance segmentation model such as RF-DETR never does): "
                             "use task 'instances', or pass Predictor(..., is_thing=[one bool per label])")
        if task == "detection" or self.predicts_masks:
            return
        if self.model.backend != "pytorch":
            raise ValueError(f"task {task!r} needs the mask head, which {self.model.kind} exports ({self.backend}) "
                             "do not run; "
                             "use the PyTorch panoptic checkpoint (e.g. detr-r50-panoptic)")
        raise ValueError(f"{type(self.model).__name__} is a detection model without a mask head, so it cannot do "
                         f"task {task!r}; load a checkpoint with masks (a panoptic DETR such as detr-r50-panoptic, "
                         "a .pth/.ckpt with mask_head.* weights, or an RF-DETR instance segmentation model)")

    def check_prompt(self, prompt: str | Sequence[str] | None, *, task: str = "detection",
                     slice: SliceSettings | int | None = None, return_attention: bool = False) -> None:
        """Raise ``ValueError`` unless a prompt is given exactly when the model reads one (and nothing it cannot
        go with: masks, slicing, attention), naming the fix."""
        if prompt is None and self.model.prompted:
            raise ValueError(f"{type(self.model).__name__} detects what a text prompt names: pass prompt='a cat. a "
                             "remote control.' (Python) or --prompt (the commands)")
        if prompt is None:
            return
        if not self.model.prompted:
            raise ValueError(f"{type(self.model).__name__} detects its trained classes and reads no prompt: drop the "
                             "prompt, or load an open-vocabulary checkpoint (a transformers Grounding DINO directory)")
        if task != "detection" or slice is not None or return_attention:
            raise ValueError("a prompt goes with plain detection only: drop task, slice and return_attention")
        if self.model.tokenizer is None:
            raise ValueError("the model has no tokenizer to read the prompt: load it from a directory with the "
                             "tokenizer files (tokenizer.json or vocab.txt), or set model.tokenizer")

    def _predict_prompted(self, arrays: Sequence[np.ndarray], names: Sequence[str | None],
                          prompt: str | Sequence[str], threshold: float | None, text_threshold: float
                          ) -> list[Prediction]:
        """One forward pass of a prompted model on ``arrays`` and its phrase post-processing."""
        images, padding_mask, _ = self.input_spec.batch(arrays)
        tokenizer = self.model.tokenizer
        text = tokenizer([prompt_text(prompt)] * len(arrays), return_tensors="pt")
        with torch.inference_mode(), self.autocast():
            outputs = self.model(images.to(self.device), padding_mask.to(self.device),
                                 text["input_ids"].to(self.device), text["attention_mask"].to(self.device),
                                 text["token_type_ids"].to(self.device))
        return grounded_predictions(outputs.logits.float().cpu(), outputs.boxes.float().cpu(), text["input_ids"],
                                    tokenizer.decode, image_sizes=[(int(a.shape[0]), int(a.shape[1])) for a in arrays],
                                    threshold=threshold, text_threshold=text_threshold, file_names=names)

    def autocast(self) -> torch.autocast:
        """The autocast context of :attr:`precision` on :attr:`device` (disabled for "fp32")."""
        dtype = AUTOCAST_DTYPES[self.precision]
        return torch.autocast(device_type=self.device.type, dtype=dtype, enabled=dtype is not None)

    def _panoptic_postprocess(self) -> PostProcessPanoptic:
        num_classes = self.model.config.num_classes
        if self.is_thing is None:
            raise ValueError("panoptic segmentation needs to know which labels are things and which stuff; this "
                             "checkpoint does not say: pass Predictor(..., is_thing=[one bool per label])")
        if len(self.is_thing) != num_classes:
            raise ValueError(f"is_thing has {len(self.is_thing)} entries but the model predicts {num_classes} "
                             "classes; pass one bool per label")
        category_ids = self.category_map.category_ids if self.category_map is not None else None
        return PostProcessPanoptic(self.is_thing, threshold=self.panoptic_threshold, category_ids=category_ids,
                                   class_head=self.class_head, overlap_threshold=self.panoptic_overlap_threshold)

    def predict_arrays(
        self,
        arrays: Sequence[np.ndarray],
        *,
        file_names: Sequence[str | None] | None = None,
        threshold: float | None,
        return_attention: bool = False,
        task: Task = "detection",
        masks: bool = True,
        check_finite: bool = False,
        slice: SliceSettings | int | None = None,
        prompt: str | Sequence[str] | None = None,
        text_threshold: float = 0.25,
    ) -> list[Prediction]:
        """One forward pass on already loaded ``uint8`` RGB arrays ``[H, W, 3]`` (one batch, any count).

        ``threshold=None`` keeps all queries. Most callers want :meth:`predict`; this is the step it
        batches, for callers that load images themselves (e.g. to skip unreadable files). ``masks=False``
        leaves out a panoptic model's instance masks (e.g. when every query is kept only to check the scores:
        a full-size mask per query costs memory). An image whose logits or boxes are not finite gets a
        prediction without detections whose ``error`` says so (:func:`detr.inference.predict.predictions_from_outputs`);
        ``check_finite=True`` raises :class:`NonFiniteOutputError` instead. ``slice``: see :meth:`predict`; the
        tiles of all ``arrays`` are batched :attr:`batch_size` at a time. ``prompt``, ``text_threshold``: a prompted
        model's (see :meth:`predict`).
        """
        self.check_task(task)
        self.check_prompt(prompt, task=task, slice=slice, return_attention=return_attention)
        settings = self.check_slice(slice, return_attention=return_attention, task=task)
        if not arrays:
            return []
        if prompt is not None:
            return self._predict_prompted(arrays, file_names or [None] * len(arrays), prompt, threshold,
                                          text_threshold)
        if settings is not None:
            predictions = predict_sliced(
                arrays, settings,
                lambda tiles: self.predict_arrays(tiles, threshold=threshold, task=task, masks=masks),
                batch_size=self.batch_size, file_names=file_names, threshold=threshold)
        else:
            predictions = self._predict_batch(arrays, file_names=file_names, threshold=threshold,
                                              return_attention=return_attention, task=task, masks=masks)
        failed = [index for index, prediction in enumerate(predictions) if prediction.error is not None]
        if check_finite and failed:
            raise NonFiniteOutputError(failed, len(arrays))
        return predictions

    def check_slice(self, slice: SliceSettings | int | None, *, return_attention: bool = False,
                    task: str = "detection") -> SliceSettings | None:
        """``slice`` as :class:`SliceSettings` (None: no slicing); raise ``ValueError`` naming the fix when it
        is not valid or cannot go with ``return_attention`` or ``task``."""
        if slice is None:
            return None
        settings = SliceSettings.of(slice)
        if return_attention:
            raise ValueError("attention maps are not supported with slicing (they belong to one model input, and "
                             "a sliced image is many): predict without slice to see the attention")
        if task == "panoptic":
            raise ValueError("task 'panoptic' is not supported with slicing (one segmentation of the whole image "
                             "per input): use task 'instances' for the masks, or predict without slice")
        return settings

    def _predict_batch(self, arrays: Sequence[np.ndarray], *, file_names: Sequence[str | None] | None,
                       threshold: float | None, return_attention: bool, task: Task, masks: bool) -> list[Prediction]:
        """One forward pass of ``arrays`` and its post-processing (:meth:`predict_arrays` without slicing)."""
        # the batch contract: resized, normalised, zeros bottom/right, True = padding
        images, padding_mask, input_sizes = self.input_spec.batch(arrays)
        outputs = self.forward(images, padding_mask, return_attention=return_attention)
        predictions = predictions_from_outputs(
            outputs, image_sizes=[(int(a.shape[0]), int(a.shape[1])) for a in arrays],
            input_sizes=input_sizes, class_head=self.class_head,
            category_map=self.category_map, threshold=threshold, file_names=file_names,
            masks=self.postprocess_masks if masks and self.predicts_masks else None,
            panoptic=self._panoptic_postprocess() if task == "panoptic" else None,
            stride=self.model.stride if return_attention else None, top_k=self.model.detections_per_image,
            keypoints=self.postprocess_keypoints,
        )
        return predictions

    def forward(
        self, images: Tensor, padding_mask: Tensor, *, return_attention: bool = False, aux_outputs: bool = False,
        text: Mapping[str, Tensor] | None = None,
    ) -> DetectorOutput:
        """The model on a padded batch, under ``torch.inference_mode`` and the chosen precision.

        Returns the model's :class:`DetectorOutput` on the CPU in float32 (integer tensors keep their type).
        ``aux_outputs=True`` keeps ``aux`` (the heads' predictions after decoder layers 1 .. L-1, as the
        attention explorer shows them); by default they are dropped. ``text``: a prompted model's prompt as its
        tokenizer returns it (``input_ids``, ``attention_mask``, ``token_type_ids``: int64 [B, N]).
        """
        prompt = () if text is None else tuple(text[key].to(self.device) for key in
                                               ("input_ids", "attention_mask", "token_type_ids"))
        with torch.inference_mode(), self.autocast():
            outputs = self.model(
                images.to(self.device, non_blocking=True),
                padding_mask.to(self.device, non_blocking=True),
                *prompt,
                return_attention=return_attention,
            )
        if not aux_outputs:
            outputs.aux = []
        return outputs.apply(lambda value: (value.float() if value.is_floating_point() else value).cpu())


def default_device() -> torch.device:
    """CUDA when available, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
