"""YUV -> RGB conversion in torch, honouring the stream's colour matrix and range, on any device.

NVDEC hands out frames in their native layout: NV12 (8-bit 4:2:0: a ``H x W`` luma plane followed
by ``H/2`` rows of interleaved U,V samples) or P016 (the same with 16-bit samples, 10-bit data in
the high bits). PyNvVideoCodec's own RGB output assumes BT.709 whenever a stream leaves its matrix
unspecified, and always limited range, while FFmpeg (the CPU path) assumes BT.601 for untagged
streams. Converting here, with the rules FFmpeg applies, makes GPU and CPU frames agree.

Chroma is upsampled by repeating each sample (nearest neighbour), as NVIDIA's conversion kernels
do; FFmpeg's swscale interpolates, so GPU and CPU frames differ by a few levels at colour edges
(see ``docs/gpu.md`` for the measured tolerance).

Example::

    >>> import torch
    >>> nv12 = torch.full((6, 4), 128, dtype=torch.uint8)  # a 4x4 mid-grey frame
    >>> nv12[:4] = 126
    >>> nv12_to_rgb(nv12, ColorSpec("bt601", full_range=False))[:, 0, 0].tolist()
    [128, 128, 128]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from lightning_vstream.errors import ConfigurationError, DecoderCapabilityError

if TYPE_CHECKING:
    import torch

__all__ = ["ColorSpec", "Matrix", "color_spec_from_stream", "nv12_to_rgb"]

Matrix = Literal["bt601", "bt709", "bt2020"]

#: (Kr, Kb) luma weights of each matrix.
_WEIGHTS: dict[str, tuple[float, float]] = {
    "bt601": (0.299, 0.114),
    "bt709": (0.2126, 0.0722),
    "bt2020": (0.2627, 0.0593),
}
#: FFmpeg's AVColorSpace codes -> matrix; everything else (2 = unspecified) falls back to BT.601.
_FFMPEG_MATRIX = {1: "bt709", 4: "bt601", 5: "bt601", 6: "bt601", 7: "bt601", 9: "bt2020", 10: "bt2020"}
_FULL_RANGE_FORMATS = ("yuvj420p", "yuvj422p", "yuvj444p")


@dataclass(frozen=True)
class ColorSpec:
    """How a stream's YUV samples map to RGB.

    Args:
        matrix: ``"bt601"``, ``"bt709"`` or ``"bt2020"`` (non-constant luminance).
        full_range: True for full ("JPEG") range, False for limited ("MPEG", 16-235) range.

    Example::

        >>> ColorSpec("bt709", full_range=False)
        ColorSpec(matrix='bt709', full_range=False)
    """

    matrix: Matrix = "bt601"
    full_range: bool = False

    def __post_init__(self) -> None:
        if self.matrix not in _WEIGHTS:
            raise ConfigurationError(f"matrix={self.matrix!r} is not supported; use one of {sorted(_WEIGHTS)}.")


def color_spec_from_stream(colorspace: int | None, color_range: int | None, pix_fmt: str | None = None) -> ColorSpec:
    """The :class:`ColorSpec` FFmpeg would use for a stream's tags.

    Args:
        colorspace: FFmpeg ``AVColorSpace`` code (PyAV ``codec_context.colorspace``); None or
            unspecified means BT.601, FFmpeg's default.
        color_range: FFmpeg ``AVColorRange`` code: 2 is full range, anything else limited.
        pix_fmt: Pixel format name; the ``yuvj*`` formats are full range whatever the tag says.

    Example::

        >>> color_spec_from_stream(2, 0)  # untagged
        ColorSpec(matrix='bt601', full_range=False)
        >>> color_spec_from_stream(1, 2)
        ColorSpec(matrix='bt709', full_range=True)
    """
    matrix = _FFMPEG_MATRIX.get(int(colorspace) if colorspace is not None else 2, "bt601")
    full = (color_range is not None and int(color_range) == 2) or (pix_fmt or "") in _FULL_RANGE_FORMATS
    return ColorSpec(matrix, full_range=full)  # type: ignore[arg-type]


def _coefficients(spec: ColorSpec) -> tuple[float, float, float, float, float, float, float]:
    """Scale and offsets turning 8-bit-scale codes into RGB on 0..255: (ys, yo, cs, r_v, g_u, g_v, b_u)."""
    kr, kb = _WEIGHTS[spec.matrix]
    kg = 1.0 - kr - kb
    if spec.full_range:
        y_scale, y_offset, c_scale = 1.0, 0.0, 1.0
    else:
        y_scale, y_offset, c_scale = 255.0 / 219.0, 16.0, 255.0 / 224.0
    r_v = 2.0 * (1.0 - kr) * c_scale
    b_u = 2.0 * (1.0 - kb) * c_scale
    g_u = -2.0 * kb * (1.0 - kb) / kg * c_scale
    g_v = -2.0 * kr * (1.0 - kr) / kg * c_scale
    return y_scale, y_offset, c_scale, r_v, g_u, g_v, b_u


def nv12_to_rgb(
    nv12: torch.Tensor,
    spec: ColorSpec = ColorSpec(),
    *,
    out: torch.Tensor | None = None,
    layout: Literal["chw", "hwc"] = "chw",
) -> torch.Tensor:
    """Convert one NV12 (uint8) or P016 (uint16 / int16) frame to uint8 RGB, on the frame's device.

    Args:
        nv12: ``[1.5 * H, W]`` tensor: the luma plane, then ``H / 2`` rows of interleaved U, V.
            16-bit samples (P016, 10- or 12-bit data in the high bits) are scaled to 8 bits.
        spec: Matrix and range of the stream (:func:`color_spec_from_stream`).
        out: Where to write the result (``[3, H, W]`` or ``[H, W, 3]`` uint8, any strides), so
            a frame can land straight in its row of a batch; a new tensor when None.
        layout: ``"chw"`` or ``"hwc"`` for the result.

    Returns:
        The RGB frame (``out`` when given).

    Raises:
        DecoderCapabilityError: ``nv12`` is not a 2-D tensor with ``1.5 * H`` rows and even sizes,
            or its dtype is neither 8- nor 16-bit.

    Example::

        >>> import torch
        >>> nv12_to_rgb(torch.zeros(12, 8, dtype=torch.uint8)).shape
        torch.Size([3, 8, 8])
    """
    import torch

    if nv12.dim() != 2 or nv12.shape[0] % 3 or nv12.shape[1] % 2:
        raise DecoderCapabilityError(
            f"expected an NV12 frame of shape [1.5 * H, W] with even H and W, got {tuple(nv12.shape)}; "
            "only 4:2:0 streams convert on the GPU (decode 4:2:2 / 4:4:4 files with decode_device='cpu')."
        )
    height = nv12.shape[0] * 2 // 3
    width = nv12.shape[1]
    if height % 2:
        raise DecoderCapabilityError(f"NV12 frame of shape {tuple(nv12.shape)} has an odd height {height}.")
    if nv12.dtype == torch.uint8:
        planes = nv12.float()
    elif nv12.dtype in (torch.uint16, torch.int16):
        # P016 stores 10/12-bit samples in the high bits: /256 gives the 8-bit scale, fractions kept.
        planes = nv12.view(torch.int16).to(torch.int32).bitwise_and(0xFFFF).float() / 256.0
    else:
        raise DecoderCapabilityError(f"NV12/P016 frames are 8- or 16-bit, got dtype {nv12.dtype}.")
    y_scale, y_offset, _, r_v, g_u, g_v, b_u = _coefficients(spec)
    # Few, simple kernels: this runs once per frame on the decode threads' streams.
    luma = planes[:height].sub_(y_offset).mul_(y_scale)  # planes is a fresh float copy: in place is safe
    half_h, half_w = height // 2, width // 2
    uv = planes[height:].view(half_h, half_w, 2).permute(2, 0, 1)  # (2, H/2, W/2)
    # Nearest-neighbour upsampling as one expand + copy (repeat_interleave costs more launches).
    uv = uv[:, :, None, :, None].expand(2, half_h, 2, half_w, 2).reshape(2, height, width).sub_(128.0)
    u, v = uv[0], uv[1]
    rgb = torch.empty((3, height, width), dtype=torch.float32, device=nv12.device)
    torch.add(luma, v, alpha=r_v, out=rgb[0])
    torch.add(luma, u, alpha=g_u, out=rgb[1]).add_(v, alpha=g_v)
    torch.add(luma, u, alpha=b_u, out=rgb[2])
    rgb = rgb.round_().clamp_(0.0, 255.0)
    if layout == "hwc":
        rgb = rgb.permute(1, 2, 0)
    if out is None:
        return rgb.to(torch.uint8, memory_format=torch.contiguous_format)
    expected = (3, height, width) if layout == "chw" else (height, width, 3)
    if tuple(out.shape) != expected:
        raise ConfigurationError(f"out has shape {tuple(out.shape)} but the converted frame is {expected} ({layout}).")
    out.copy_(rgb)
    return out
