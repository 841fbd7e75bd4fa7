"""How much arithmetic a forward or a training step does, and the least time it could take on this machine.

Benchmarks run as scripts, so this module is imported as ``arithmetic`` (benchmarks/realtime_speed.py and
benchmarks/realtime_training.py, ``--flops``).

:func:`counted_flops` counts the floating-point operations of the dense kernels a call runs (matrix products,
convolutions and their backward, scaled dot-product attention, as torch's ``FlopCounterMode`` counts them: a multiply
and an add are two), on the kernels actually run: a Winograd convolution counts as its batched products, a query
selection over the selected rows as those rows. :func:`product_rate` measures the fastest float32 rate of this
machine's matrix products (large square ones, where MKL and oneDNN come nearest the cores' peak). Their quotient is
a floor: the time the dense arithmetic alone would take at that rate, before any normalisation, activation, copy,
gather or Python. A floor above a goal's time means the goal needs less arithmetic (another algorithm, or lower
precision), not faster kernels.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count, shape_wrapper


def _cpu_attention(query, key, value, *_, **__) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_attention_backward(grad_out, query, key, value, *_, **__) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


#: torch's formulas, and the CPU's flash attention, which torch's table leaves out (it has the CUDA kernels')
_FORMULAS = {**flop_registry,
             torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: shape_wrapper(_cpu_attention),
             torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward:
                 shape_wrapper(_cpu_attention_backward)}


class _Counter(TorchDispatchMode):
    """Adds up the formulas of the operators run under it, as ``FlopCounterMode`` does (a composite operator
    without a formula, such as ``aten.linear`` under ``inference_mode``, counted as the operators it decomposes
    into), without its module tracker, whose hooks fail on inputs that are parameters under ``torch.no_grad`` or
    ``inference_mode``."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        formula = _FORMULAS.get(func._overloadpacket)
        if formula is None:
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = func(*args, **kwargs)
        if formula is not None:
            self.flops += formula(*args, **kwargs, out_val=out)
        return out


def counted_flops(call: Callable[[], object]) -> int:
    """The floating-point operations of ``call()``'s dense kernels (one run)."""
    with _Counter() as counter:
        call()
    return counter.flops


def product_rate(repeats: int = 5, sides: tuple[int, ...] = (1024, 2048)) -> float:
    """The fastest float32 matrix-product rate of this machine at torch's thread count, FLOP/s: the best of
    ``repeats`` square products of each side."""
    best = 0.0
    for side in sides:
        left, right = torch.randn(side, side), torch.randn(side, side)
        out = torch.empty(side, side)
        torch.mm(left, right, out=out)  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(left, right, out=out)
            best = max(best, 2 * side ** 3 / (time.perf_counter() - start))
    return best


def floor_table(rows: dict[str, dict[str, Callable[[], object]]], their_seconds: dict[str, float], rate: float
                ) -> str:
    """A markdown table: per model (``rows``: name → side → one call), each side's GFLOP and its floor at ``rate``
    (ms), and ours' floor over transformers' measured median (``their_seconds``): the least ratio this arithmetic
    allows on this machine."""
    lines = [f"dense arithmetic at this machine's best float32 product rate, {rate / 1e9:.0f} GFLOP/s "
             f"(benchmarks/arithmetic.py)", "",
             "| model | transformers GFLOP | ours GFLOP | ours / transformers | ours' floor (ms) | "
             "transformers measured (ms) | least ours / transformers |", "|---|---|---|---|---|---|---|"]
    for name, sides in rows.items():
        theirs, ours = (counted_flops(sides[side]) for side in ("theirs", "ours"))
        floor, measured = ours / rate, their_seconds[name]
        lines.append(f"| {name} | {theirs / 1e9:.1f} | {ours / 1e9:.1f} | {ours / theirs:.2f} | {floor * 1e3:.0f} | "
                     f"{measured * 1e3:.0f} | {floor / measured:.2f} |")
    return "\n".join(lines)
