"""One fused NV12 / P016 -> RGB kernel in Triton: read the decoder's surface once, write the batch row once.

The torch conversion (:func:`~lightning_vstream.decode.nvdec.nv12.torch_nv12_to_rgb`) takes about 25 ATen
operations and a dozen kernel launches per frame, moving about 230 MB through GPU memory for a
1600x900 frame; this kernel is one launch that reads the 2.2 MB surface and writes the 4.3 MB RGB
row. Matrix and range arrive as coefficients and the sample width as a flag, so one compiled
kernel serves every stream of a bit depth; the output strides are arguments, so it writes
channels-first or channels-last rows of any batch in place.

Both conversions compute in float32 in the same order and round half up, so they agree exactly
up to float contraction on the GPU (at most one level on rare pixels).

This module imports Triton, so only code that converts on a GPU imports it (through
:func:`~lightning_vstream.decode.nvdec.nv12.prepare_conversion` or a converter with
``backend="triton"``); CPU builds of torch may not ship Triton. The kernel is defined at module
level and reaches ``tl`` as a global, which every Triton from 3.2 on resolves (closure variables
only resolve in later versions). Every argument is left unspecialised (no specialisation on
values divisible by 16 or on pointer alignment) and the block width is fixed, so the kernel
compiles exactly once per sample width (NV12, P016): both compilations happen in the check at
setup, never in a decode thread. With ``TRITON_INTERPRET=1`` set before this module is imported,
Triton's interpreter runs the kernel on CPU tensors (how the test suite checks it without a GPU).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

if TYPE_CHECKING:
    import torch

__all__ = ["BLOCK", "PARAMETERS", "launch_nv12_to_rgb", "nv12_to_rgb_kernel"]

#: Pixels one program converts along a row (a power of two; rows wider than this take several programs).
BLOCK = 256
#: The kernel's run-time arguments: none is specialised on its value (see the module docs).
PARAMETERS = (
    "src",
    "dst",
    "height",
    "width",
    "src_row",
    "dst_c",
    "dst_h",
    "dst_w",
    "in_scale",
    "y_offset",
    "y_scale",
    "r_v",
    "g_u",
    "g_v",
    "b_u",
)


@triton.jit(do_not_specialize=PARAMETERS)
def nv12_to_rgb_kernel(
    src,
    dst,
    height,
    width,
    src_row,
    dst_c,
    dst_h,
    dst_w,
    in_scale,
    y_offset,
    y_scale,
    r_v,
    g_u,
    g_v,
    b_u,
    SIXTEEN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = col < width
    chroma = (height + row // 2) * src_row + (col // 2) * 2
    y_raw = tl.load(src + row * src_row + col, mask=inside, other=0)
    u_raw = tl.load(src + chroma, mask=inside, other=0)
    v_raw = tl.load(src + chroma + 1, mask=inside, other=0)
    if SIXTEEN:  # P016: 16-bit words read as int16, samples in the high bits
        y = (y_raw.to(tl.int32) & 0xFFFF).to(tl.float32) * in_scale
        u = (u_raw.to(tl.int32) & 0xFFFF).to(tl.float32) * in_scale
        v = (v_raw.to(tl.int32) & 0xFFFF).to(tl.float32) * in_scale
    else:
        y = y_raw.to(tl.float32)
        u = u_raw.to(tl.float32)
        v = v_raw.to(tl.float32)
    luma = (y - y_offset) * y_scale
    u = u - 128.0
    v = v - 128.0
    r = luma + v * r_v
    g = luma + u * g_u + v * g_v
    b = luma + u * b_u
    r = tl.minimum(tl.maximum(tl.floor(r + 0.5), 0.0), 255.0)
    g = tl.minimum(tl.maximum(tl.floor(g + 0.5), 0.0), 255.0)
    b = tl.minimum(tl.maximum(tl.floor(b + 0.5), 0.0), 255.0)
    out = dst + row * dst_h + col * dst_w
    tl.store(out, r.to(tl.uint8), mask=inside)
    tl.store(out + dst_c, g.to(tl.uint8), mask=inside)
    tl.store(out + 2 * dst_c, b.to(tl.uint8), mask=inside)


def launch_nv12_to_rgb(
    surface: torch.Tensor,
    out: torch.Tensor,
    coefficients: tuple[float, float, float, float, float, float],
    *,
    height: int,
    width: int,
    chw: bool,
) -> None:
    """Convert ``surface`` (``[1.5 H, W]`` uint8, or int16 holding P016) into ``out`` in one launch.

    ``coefficients`` are ``(y_offset, y_scale, r_v, g_u, g_v, b_u)`` on the 8-bit scale (see
    :func:`~lightning_vstream.decode.nvdec.nv12.coefficients`); ``out`` is ``[3, H, W]`` (``chw``) or
    ``[H, W, 3]`` uint8 with any strides. The launch goes to the current stream; nothing is checked
    here (callers validate once per file, not per frame).
    """
    if chw:
        dst_c, dst_h, dst_w = out.stride()
    else:
        dst_h, dst_w, dst_c = out.stride()
    sixteen = surface.element_size() == 2
    nv12_to_rgb_kernel[(height, -(-width // BLOCK))](
        surface,
        out,
        height,
        width,
        surface.stride(0),
        dst_c,
        dst_h,
        dst_w,
        1.0 / 256.0 if sixteen else 1.0,
        *coefficients,
        SIXTEEN=sixteen,
        BLOCK=BLOCK,
    )
