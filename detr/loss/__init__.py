"""Training's loss: Hungarian matching of queries to targets and the set criterion with its parts."""

from detr.loss.criterion import SetCriterion
from detr.loss.matcher import HungarianMatcher

__all__ = ["HungarianMatcher", "SetCriterion"]
