"""A 3 × 3 convolution (stride 1, padding 1) by Winograd's minimal filtering, F(4 × 4, 3 × 3) (Lavin & Gray,
"Fast Algorithms for Convolutional Neural Networks", 2016), for a training step on the CPU.

oneDNN runs the direct convolution there near the cores' peak, so what is left is arithmetic: F(4 × 4, 3 × 3)
computes each 4 × 4 output tile from a 6 × 6 input tile with 36 products per channel pair instead of 144. The
image is cut into 6 × 6 tiles (stride 4), each tile and each 3 × 3 filter is carried into the 36-point transform
domain by one matrix product (``Bᵀ d B`` and ``G g Gᵀ`` as Kronecker products), the channels meet there in 36
batched matrix products, and ``Aᵀ m A`` brings each tile back. The backward is the same algorithm: the input's
gradient is this convolution of the output's gradient with the flipped, transposed filters; the filters' gradient
is the batched product of the output's gradient (carried by ``Aᵀ``'s transpose) with the input's tiles. The tiles
go through in bands of a few rows, so that the temporaries stay small and the step saves only the padded input.

The numbers are the direct convolution's up to float rounding (about 1e-5 of the largest value from the float64
convolution, against 1-5e-6 for oneDNN's direct kernel: benchmarks/convolutions.py, tests/models/test_winograd.py),
so a caller uses it where a plain float32 convolution would run and the gradients are wanted; :func:`winograd_pays`
says where it is the faster of the two (docs/measurements/speed.md). On a GPU cuDNN chooses its own algorithms, and
this module is not used.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from detr.models.layers.cpu_kernels import cpu_float32_training

# F(4 × 4, 3 × 3): input transform Bᵀ (6 × 6), filter transform G (6 × 3), output transform Aᵀ (4 × 6)
_B_T = ((4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0),
        (0, -2, -1, 2, 1, 0), (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1))
_G = ((1 / 4, 0, 0), (-1 / 6, -1 / 6, -1 / 6), (-1 / 6, 1 / 6, -1 / 6),
      (1 / 24, 1 / 12, 1 / 6), (1 / 24, -1 / 12, 1 / 6), (0, 0, 1))
_A_T = ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0), (0, 1, -1, 8, -8, 1))
_TILE, _OUT = 6, 4  # an input tile and the output tile it gives
#: How many transformed numbers (36 · channels · tiles) one band of tiles holds: 16 MB in float32.
_CHUNK = 1 << 22

#: Where F(4 × 4, 3 × 3) beats oneDNN's direct kernel on 2 cores, forward and backward together
#: (benchmarks/convolutions.py; docs/measurements/speed.md, "Winograd"): at least :data:`MIN_CHANNELS` channels in
#: and out, and either the smaller channel count × one image's pixels at least :data:`MIN_WORK` (256 channels on
#: 40 × 40, 128 on 80 × 80), or at least :data:`WIDE_CHANNELS` channels and the batch's pixels at least
#: :data:`WIDE_MIN_PIXELS` (512 channels on 20 × 20 pay from 4 images on: 0.82, 8 images 0.66, 2 images 1.01).
#: Below them the transforms' passes over memory cost more than the products saved.
MIN_CHANNELS = 128
MIN_WORK = 256 * 40 * 40
WIDE_CHANNELS = 512
WIDE_MIN_PIXELS = 4 * 20 * 20

_matrices: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _transforms(like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``Bᵀ ⊗ Bᵀ`` (36 × 36), ``G ⊗ G`` (36 × 9) and ``Aᵀ ⊗ Aᵀ`` (16 × 36) in ``like``'s dtype and device:
    a flattened tile d (row-major) maps to ``(Bᵀ ⊗ Bᵀ) d`` = ``Bᵀ d B`` flattened, and so on."""
    key = (like.device, like.dtype)
    if key not in _matrices:
        def kron(rows: tuple) -> torch.Tensor:
            matrix = torch.tensor(rows, dtype=torch.float64)
            return torch.kron(matrix, matrix).to(like.device, like.dtype)
        _matrices[key] = kron(_B_T), kron(_G), kron(_A_T)
    return _matrices[key]


def _padded(x: torch.Tensor) -> torch.Tensor:
    """x [N, C, H, W] with the convolution's zero border of 1 and zeros below and right up to whole tiles:
    [N, C, 4 · ⌈H/4⌉ + 2, 4 · ⌈W/4⌉ + 2]."""
    height, width = x.shape[-2:]
    return F.pad(x, (1, 1 + -width % _OUT, 1, 1 + -height % _OUT))


def _bands(padded: torch.Tensor, channels: int) -> list[tuple[slice, int, int]]:
    """The tiles that go through the transforms together, as (images, first row of tiles, last row + 1): as many
    as keep a band's transformed tiles (36 · channels · tiles) within :data:`_CHUNK` numbers, so that the
    temporaries are reused from band to band instead of a map-sized allocation each: whole images together where
    they fit (small maps), else a few rows of one image."""
    count = padded.shape[0]
    rows, columns = (padded.shape[-2] - 2) // _OUT, (padded.shape[-1] - 2) // _OUT
    per_band = _CHUNK // (_TILE * _TILE * channels * columns)  # rows of tiles
    if per_band >= rows:
        images = max(1, per_band // rows)
        return [(slice(first, min(first + images, count)), 0, rows) for first in range(0, count, images)]
    per_band = max(1, per_band)
    return [(slice(image, image + 1), first, min(first + per_band, rows))
            for image in range(count) for first in range(0, rows, per_band)]


def _band_tiles(padded: torch.Tensor, images: slice, first: int, last: int) -> torch.Tensor:
    """The transformed input tiles ``Bᵀ d B`` of one band: [36, C, tiles of the band (image, row, column)]."""
    channels = padded.shape[1]
    tiles = padded[images, :, _OUT * first:_OUT * last + 2].unfold(2, _TILE, _OUT).unfold(3, _TILE, _OUT)
    tiles = tiles.permute(4, 5, 1, 0, 2, 3).reshape(_TILE * _TILE, -1)  # [36, C · images · rows · columns], a copy
    return (_transforms(padded)[0] @ tiles).view(_TILE * _TILE, channels, -1)


def _filter_transform(weight: torch.Tensor) -> torch.Tensor:
    """weight [O, C, 3, 3] → ``G g Gᵀ`` of every filter, [36, O, C]."""
    out_channels, in_channels = weight.shape[:2]
    flat = weight.permute(2, 3, 0, 1).reshape(9, out_channels * in_channels)
    return (_transforms(weight)[1] @ flat).view(_TILE * _TILE, out_channels, in_channels)


def _convolve(padded: torch.Tensor, filters: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``conv2d(x, w, padding=1)`` of the padded input (:func:`_padded`) with the transformed filters [36, O, C]:
    [N, O, H, W]."""
    count, in_channels = padded.shape[:2]
    out_channels = filters.shape[1]
    rows, columns = (padded.shape[-2] - 2) // _OUT, (padded.shape[-1] - 2) // _OUT
    output_transform = _transforms(padded)[2]
    output = padded.new_empty(count, out_channels, rows * _OUT, columns * _OUT)
    for images, first, last in _bands(padded, max(in_channels, out_channels)):
        products = torch.bmm(filters, _band_tiles(padded, images, first, last))  # [36, O, tiles]
        tiles = (output_transform @ products.view(_TILE * _TILE, -1)).view(_OUT, _OUT, out_channels, -1,
                                                                           last - first, columns)
        band = output[images, :, _OUT * first:_OUT * last]
        band.view(-1, out_channels, last - first, _OUT, columns, _OUT).copy_(tiles.permute(3, 2, 4, 0, 5, 1))
    if output.shape[-2:] != (height, width):
        output = output[..., :height, :width].contiguous()
    return output


def _filter_gradient(padded: torch.Tensor, grad_output: torch.Tensor, weight_shape: torch.Size) -> torch.Tensor:
    """The filters' gradient from the output's gradient zero-padded to whole tiles: per band, that gradient
    carried back through ``Aᵀ`` into the transform domain [36, O, tiles] times the band's input tiles [36, C, tiles]
    (transformed again rather than kept from the forward: the step then saves the padded input only, as the direct
    kernel saves its input), summed, then back through ``G``."""
    out_channels, in_channels = grad_output.shape[1], padded.shape[1]
    columns = (padded.shape[-1] - 2) // _OUT
    filter_transform, output_transform = _transforms(grad_output)[1:]
    grad_filters = grad_output.new_zeros(_TILE * _TILE, out_channels, in_channels)
    for images, first, last in _bands(padded, max(in_channels, out_channels)):
        band = grad_output[images, :, _OUT * first:_OUT * last]
        band = band.view(-1, out_channels, last - first, _OUT, columns, _OUT).permute(3, 5, 1, 0, 2, 4)
        grad_products = (output_transform.t() @ band.reshape(_OUT * _OUT, -1)).view(_TILE * _TILE, out_channels, -1)
        grad_filters.baddbmm_(grad_products, _band_tiles(padded, images, first, last).transpose(1, 2))
    grad_weight = filter_transform.t() @ grad_filters.view(_TILE * _TILE, -1)  # [9, O · C]
    return grad_weight.view(3, 3, *weight_shape[:2]).permute(2, 3, 0, 1).contiguous()


class _Winograd3x3(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
        padded = _padded(x)
        ctx.save_for_backward(padded if ctx.needs_input_grad[1] else None, weight)
        ctx.has_bias = bias is not None
        output = _convolve(padded, _filter_transform(weight), *x.shape[-2:])
        return output if bias is None else output + bias.view(1, -1, 1, 1)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad_output: torch.Tensor
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        padded, weight = ctx.saved_tensors
        grad_x = grad_weight = grad_bias = None
        # one padded copy of the gradient: with its border of 1 for the input's gradient, without it (a view) for
        # the filters'
        padded_grad = _padded(grad_output)
        if ctx.needs_input_grad[0]:  # a 3 × 3 convolution of the gradient with the flipped, transposed filters
            flipped = _filter_transform(weight.transpose(0, 1).flip(2, 3))
            grad_x = _convolve(padded_grad, flipped, *grad_output.shape[-2:])
        if ctx.needs_input_grad[1]:
            grad_weight = _filter_gradient(padded, padded_grad[..., 1:-1, 1:-1], weight.shape)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_output.sum((0, 2, 3))
        return grad_x, grad_weight, grad_bias


def winograd_conv3x3(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.conv2d(x, weight, bias, stride=1, padding=1)`` for a 3 × 3 ``weight`` [O, C, 3, 3] by F(4 × 4, 3 × 3),
    forward and backward: x [N, C, H, W] → [N, O, H, W], any H and W."""
    if weight.shape[-2:] != (3, 3) or x.dim() != 4:
        raise ValueError(f"winograd_conv3x3 takes a 3 × 3 filter and a 4-d input, not {tuple(weight.shape)} "
                         f"and {tuple(x.shape)}")
    return _Winograd3x3.apply(x.contiguous(), weight, bias)


def winograd_pays(conv: nn.Conv2d, x: torch.Tensor) -> bool:
    """Whether ``conv`` on ``x`` is a training convolution that :func:`winograd_conv3x3` runs faster than the
    direct kernel: on the CPU, float32 (no autocast), NCHW, with gradients, a plain 3 × 3 filter (stride,
    dilation and groups 1, padding 1) of at least :data:`MIN_CHANNELS` channels in and out on maps large enough
    for them (:data:`MIN_WORK`, :data:`WIDE_MIN_PIXELS`)."""
    return (cpu_float32_training(x) and x.is_contiguous()
            and conv.kernel_size == (3, 3) and conv.stride == (1, 1) and conv.padding == (1, 1)
            and conv.dilation == (1, 1) and conv.groups == 1 and conv.padding_mode == "zeros"
            and _enough_work(min(conv.in_channels, conv.out_channels), x.shape[0], x.shape[-2] * x.shape[-1]))


def _enough_work(channels: int, images: int, pixels: int) -> bool:
    """Whether a convolution of ``channels`` (the smaller count) over ``images`` maps of ``pixels`` is large enough
    for Winograd to pay (:data:`MIN_CHANNELS`, :data:`MIN_WORK`, :data:`WIDE_CHANNELS`)."""
    if channels < MIN_CHANNELS:
        return False
    return channels * pixels >= MIN_WORK or (channels >= WIDE_CHANNELS and images * pixels >= WIDE_MIN_PIXELS)
