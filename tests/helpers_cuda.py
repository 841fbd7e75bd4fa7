"""Shared by the CUDA tests (tests/test_cuda.py, tests/test_cuda_families.py): their skip marker, the device, plain
fp32 matrix products on it and the relative error they compare with."""

from __future__ import annotations

import pytest
import torch

#: Skips a module where no GPU is at hand (CI has none).
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def no_tf32():
    """Plain fp32 matrix products on the GPU, so that CPU and GPU differ by rounding only."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    value, reference = value.double().cpu(), reference.double().cpu()
    return float((value - reference).norm() / reference.norm())
