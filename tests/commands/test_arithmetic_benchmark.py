"""benchmarks/arithmetic.py: the dense arithmetic a call runs, counted on the kernels it runs (products,
convolutions forward and backward, the CPU's flash attention, which torch's own table leaves out), under
``inference_mode`` as well; and this machine's product rate, positive."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import load_script

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def arithmetic():
    return load_script("benchmarks/arithmetic.py")


def test_a_linear_layer_and_a_convolution_count_two_operations_per_multiply_add(arithmetic) -> None:
    linear = torch.nn.Linear(8, 16)
    x = torch.randn(5, 8)
    assert arithmetic.counted_flops(lambda: linear(x)) == 2 * 5 * 8 * 16
    with torch.inference_mode():  # where aten.linear reaches the counter whole: counted as what it runs
        assert arithmetic.counted_flops(lambda: linear(x)) == 2 * 5 * 8 * 16
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)
    image = torch.randn(1, 3, 6, 6)
    forward = 2 * 4 * 3 * 9 * 36
    assert arithmetic.counted_flops(lambda: conv(image)) == forward
    # backward: the weights' gradient only (the image needs none), as many operations as the forward
    assert arithmetic.counted_flops(lambda: conv(image).sum().backward()) == 2 * forward


def test_the_cpus_flash_attention_is_counted_forward_and_backward(arithmetic) -> None:
    q, k, v = (torch.randn(1, 2, 10, 4, requires_grad=True) for _ in range(3))
    product = 2 * 2 * 10 * 10 * 4  # one [10 × 4] × [4 × 10] product per head, two operations per multiply-add
    assert arithmetic.counted_flops(lambda: F.scaled_dot_product_attention(q, k, v)) == 2 * product  # q kᵀ, · v
    # the backward: torch's formula, five products (q kᵀ again, and the gradients of v, the weights, q and k)
    assert (arithmetic.counted_flops(lambda: F.scaled_dot_product_attention(q, k, v).sum().backward())
            == 2 * product + 5 * product)


def test_the_product_rate_is_measured(arithmetic) -> None:
    assert arithmetic.product_rate(repeats=1, sides=(64,)) > 0
