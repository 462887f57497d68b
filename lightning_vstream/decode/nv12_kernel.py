"""One fused NV12 / P016 -> RGB kernel in Triton: read the decoder's surface once, write the batch row once.

The torch conversion (:func:`~lightning_vstream.decode.nv12.torch_nv12_to_rgb`) takes about 25 ATen
operations and a dozen kernel launches per frame, moving about 230 MB through GPU memory for a
1600x900 frame; this kernel is one launch that reads the 2.2 MB surface and writes the 4.3 MB RGB
row. Matrix and range arrive as coefficients and the sample width as a flag, so one compiled
kernel serves every stream of a bit depth; the output strides are arguments, so it writes
channels-first or channels-last rows of any batch in place.

Both conversions compute in float32 in the same order and round half up, so they agree exactly
up to float contraction on the GPU (at most one level on rare pixels).

Triton is imported on first use: CUDA builds of torch ship it, CPU builds may not. With
``TRITON_INTERPRET=1`` set before the first use, Triton's interpreter runs the kernel on CPU
tensors (how the test suite checks it on machines without a GPU).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["launch_nv12_to_rgb", "triton_available"]

_lock = threading.Lock()
_kernel: Any = None
_available: bool | None = None


def triton_available() -> bool:
    """True when Triton imports (it compiles for CUDA devices, or interprets with ``TRITON_INTERPRET=1``)."""
    global _available
    if _available is None:
        try:
            import triton
            import triton.language  # noqa: F401
        except Exception:
            _available = False
        else:
            _available = True
    return _available


def _build() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
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

    return nv12_to_rgb_kernel


def _get_kernel() -> Any:
    global _kernel
    if _kernel is None:
        with _lock:
            if _kernel is None:
                _kernel = _build()
    return _kernel


def _block(width: int) -> int:
    block = 64
    while block < width and block < 1024:
        block *= 2
    return block


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
    :func:`~lightning_vstream.decode.nv12.coefficients`); ``out`` is ``[3, H, W]`` (``chw``) or
    ``[H, W, 3]`` uint8 with any strides. The launch goes to the current stream; nothing is checked
    here (callers validate once per file, not per frame).
    """
    kernel = _get_kernel()
    if chw:
        dst_c, dst_h, dst_w = out.stride()
    else:
        dst_h, dst_w, dst_c = out.stride()
    sixteen = surface.element_size() == 2
    block = _block(width)
    kernel[(height, -(-width // block))](
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
        BLOCK=block,
    )
