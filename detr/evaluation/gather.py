"""Every process's results to one place: the one gather of the package.

Evaluation runs once, on rank 0, over what every process saw: :func:`on_rank_zero` gathers each process's
value there (``torch.distributed.gather_object``), computes once and gives every rank the same result (or
raises rank 0's error on every rank, so that none is left waiting). :func:`gather_to_rank_zero` is the
gather alone, for results that only rank 0 writes. Without a process group (or with one process) both run
on the local value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch.distributed as dist

T = TypeVar("T")


def distributed() -> bool:
    """Whether a process group of more than one process is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def gather_to_rank_zero(value: Any) -> list[Any] | None:
    """Every process's ``value`` on rank 0, in rank order; None on the other ranks; ``[value]`` alone."""
    if not distributed():
        return [value]
    gathered: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(value, gathered, dst=0)
    return gathered


def on_rank_zero(value: Any, compute: Callable[[list[Any]], T], *,
                 shared: Callable[[T], Any] = lambda result: result, what: str = "evaluation") -> T:
    """Gather every process's ``value`` to rank 0, run ``compute(values)`` there once and return its result on
    every rank: rank 0 gets the result itself, the others ``shared(result)`` (what is worth sending, e.g.
    without large per-image data). An error in ``compute`` is raised on every rank (``what`` names the job
    in the other ranks' message)."""
    values = gather_to_rank_zero(value)
    if not distributed():
        return compute(values)
    result, error, message = None, None, [None]
    if values is not None:  # rank 0
        try:
            result = compute(values)
            message = [shared(result)]
        except Exception as raised:  # the other ranks wait in the broadcast: tell them, then raise
            error = raised
            message = [_Failure(f"{type(raised).__name__}: {raised}")]
    dist.broadcast_object_list(message, src=0)
    if error is not None:
        raise error
    if isinstance(message[0], _Failure):
        raise RuntimeError(f"{what} failed on rank 0: {message[0].reason}")
    return result if values is not None else message[0]


class _Failure:
    def __init__(self, reason: str) -> None:
        self.reason = reason
