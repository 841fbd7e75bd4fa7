"""What the tracking tests and benchmarks/tracking.py share: a stand-in detector that replays a synthetic clip's
ground truth, degraded as a detector would degrade it, through the real :class:`detr.Predictor` path.

A trained shapes model takes minutes to get; the tracker, the decoding, the batching, the post-processing and
the writers do not need one to be checked. :class:`ReplayDetector` is a :class:`detr.models.detector.Detector`:
the Predictor resizes and normalises the frames, runs it on padded batches and post-processes its logits and
normalised ``cxcywh`` boxes as any model's. It does not look at the pixels: it answers the frames of one clip in
order (each batch's images are the next frames), which is what tracking a video does. What it returns per frame:

- each object at least half visible: its box, each side moved by Gaussian noise (``noise`` px), score in
  [0.7, 0.99];
- each object 15 % to 50 % visible (behind the occluder, under another shape): its box with a low score in
  [0.15, 0.45], as a detector unsure of a half-hidden object (what ByteTrack's second association is for);
- any of these dropped with probability ``drop`` (a missed detection), and with probability ``false_positive``
  a frame gets one box where there is nothing, score in [0.5, 0.8];
- in a new random order of queries every frame: a query's index says nothing of the object (as with DETR).
"""

from __future__ import annotations

import numpy as np
import torch

from detr.categories import CategoryMap
from detr.data.shape_clips import ClipObject
from detr.data.shapes import SHAPE_NAMES
from detr.models.config import ModelMeta
from detr.models.detector import Detector
from detr.models.outputs import DetectorOutput
from tests.helpers import TINY

#: The stand-in's score threshold (its "validation's best"), which the trackers' thresholds default from.
REPLAY_THRESHOLD = 0.5


class ReplayDetector(Detector):
    """Replays ``truth`` (:func:`detr.data.shape_clips.render_clip`'s) frame after frame, degraded (module
    docstring); frames are ``height`` × ``width`` px and enter the model unresized."""

    attention_kind = None
    exportable = False

    def __init__(self, truth: list[list[ClipObject]], *, height: int, width: int, noise: float = 1.5,
                 drop: float = 0.05, false_positive: float = 0.05, seed: int = 0) -> None:
        super().__init__()
        self.truth, self.height, self.width = truth, height, width
        self.noise, self.drop, self.false_positive = noise, drop, false_positive
        self.rng = np.random.default_rng(seed)
        self.frame = 0
        self.config = TINY.replace(num_classes=len(SHAPE_NAMES), num_queries=12)
        self.num_classes, self.num_queries = self.config.num_classes, self.config.num_queries
        self.meta = ModelMeta(category_map=CategoryMap(tuple(range(1, len(SHAPE_NAMES) + 1)), SHAPE_NAMES),
                              eval_size=(min(height, width), max(height, width)), score_threshold=REPLAY_THRESHOLD)
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # a parameter, so that .to(device) has something to move

    @property
    def stride(self) -> int:
        return 32

    def detections(self, objects: list[ClipObject]) -> list[tuple[tuple[float, float, float, float], int, float]]:
        """One frame's degraded detections: (box xyxy px, label, score)."""
        found = []
        for o in objects:
            if o.visibility >= 0.5:
                score = self.rng.uniform(0.7, 0.99)
            elif o.visibility >= 0.15:
                score = self.rng.uniform(0.15, 0.45)
            else:
                continue
            if self.rng.random() < self.drop:
                continue
            box = np.asarray(o.box_xyxy) + self.rng.normal(0.0, self.noise, 4)
            found.append((tuple(box.tolist()), o.category_id - 1, float(score)))
        if self.rng.random() < self.false_positive:
            side = self.rng.uniform(12, 30)
            x, y = self.rng.uniform(0, self.width - side), self.rng.uniform(0, self.height - side)
            found.append(((x, y, x + side, y + side), int(self.rng.integers(self.num_classes)),
                          float(self.rng.uniform(0.5, 0.8))))
        return found[: self.num_queries]

    def forward(self, images: torch.Tensor, padding_mask: torch.Tensor, *, return_attention: bool = False,
                **_: object) -> DetectorOutput:
        batch = images.shape[0]
        logits = torch.full((batch, self.num_queries, self.num_classes + 1), -10.0)
        logits[..., -1] = 10.0  # every query "no object" unless it replays a detection
        boxes = torch.tensor([0.5, 0.5, 0.1, 0.1]).repeat(batch, self.num_queries, 1)
        for index in range(batch):
            objects = self.truth[self.frame] if self.frame < len(self.truth) else []
            self.frame += 1
            found = self.detections(objects)
            for query, ((x0, y0, x1, y1), label, score) in zip(self.rng.permutation(self.num_queries), found):
                x0, x1 = np.clip([x0, x1], 0, self.width)
                y0, y1 = np.clip([y0, y1], 0, self.height)
                boxes[index, query] = torch.tensor([(x0 + x1) / 2 / self.width, (y0 + y1) / 2 / self.height,
                                                    (x1 - x0) / self.width, (y1 - y0) / self.height])
                # softmax over the class and no-object logits gives the class this probability
                logits[index, query, -1] = 0.0
                logits[index, query, label] = float(np.log(score / (1 - score)))
        return DetectorOutput(logits, boxes)
