"""YUV -> RGB conversion of decoded frames on the CPU: one swscale conversion for every layout.

Every frame goes through one FFmpeg swscale conversion to planar 8-bit RGB (``gbrp``), which
also resizes when an output size is set; ``"chw"`` copies the three planes, ``"hwc"``
interleaves them. So both layouts hold the same pixels at every bit depth and size. The one
shortcut, ``rgb24`` straight from swscale for ``"hwc"``, is taken only where it is bit-identical
(8-bit 4:2:0 input at its own size; ``tests/test_colour.py`` checks it).

Colour handling (see docs/colour.md):

- **matrix**: the one the stream is tagged with (BT.709, BT.601/SMPTE 170M, BT.2020, ...);
  untagged streams use BT.601, FFmpeg's default.
- **range**: limited (16..235 for 8-bit luma) unless the stream is tagged full range (or uses
  a ``yuvj`` pixel format); the output RGB is always full range 0..255.
- **chroma**: 4:2:0 chroma is upsampled by swscale (sample repetition on the 8-bit fast path,
  interpolation otherwise), so sharp colour edges can differ by a few levels between paths,
  never between layouts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, get_args

from lightning_vstream.decode.base import Layout
from lightning_vstream.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

__all__ = ["Interpolation", "RGBConverter"]

Interpolation = Literal["bilinear", "bicubic", "area", "nearest"]
_SWS_NAMES = {"bilinear": "BILINEAR", "bicubic": "BICUBIC", "area": "AREA", "nearest": "POINT"}
# Pixel formats whose unscaled swscale conversion to rgb24 equals the gbrp one bit for bit.
_RGB24_EXACT = frozenset({"yuv420p", "yuvj420p"})


def check_size(size: Any, where: str = "size") -> tuple[int, int] | None:
    """Validate an output ``(height, width)``; None keeps the stream's size."""
    if size is None:
        return None
    if isinstance(size, (str, bytes)) or not hasattr(size, "__len__") or len(size) != 2:
        raise ConfigurationError(f"{where}={size!r} must be (height, width) in pixels, or None.")
    height, width = size
    for value in (height, width):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(f"{where}={size!r} must hold two positive integers (height, width).")
    return height, width


class RGBConverter:
    """Converts decoded frames to uint8 RGB tensors of one layout and (optionally) one size.

    Keeps its swscale context between frames (building one costs about a millisecond when
    resizing). Not thread-safe: give each decoder its own.

    Args:
        layout: ``"chw"`` (``[3, H, W]``) or ``"hwc"`` (``[H, W, 3]``).
        size: Output ``(height, width)``; swscale resizes while it converts. None keeps the
            frame's size.
        interpolation: Resampling filter when resizing: ``"bilinear"`` (default; swscale widens
            the filter when shrinking, so downscaling does not alias), ``"area"``, ``"bicubic"``
            or ``"nearest"``.

    Example::

        >>> conv = RGBConverter(layout="chw", size=(450, 800))
        >>> conv.shape(900, 1600)
        (3, 450, 800)
    """

    def __init__(
        self, *, layout: Layout = "chw", size: tuple[int, int] | None = None, interpolation: Interpolation = "bilinear"
    ) -> None:
        if layout not in ("chw", "hwc"):
            raise ConfigurationError(f"layout={layout!r} is not supported; use 'chw' or 'hwc'.")
        if interpolation not in get_args(Interpolation):
            raise ConfigurationError(
                f"interpolation={interpolation!r} is not supported; use one of {list(get_args(Interpolation))}."
            )
        self.layout = layout
        self.size = check_size(size)
        self.interpolation = interpolation
        self._reformatter: Any = None

    def shape(self, height: int, width: int) -> tuple[int, int, int]:
        """Output tensor shape for a frame of ``height`` x ``width``."""
        if self.size is not None:
            height, width = self.size
        return (3, height, width) if self.layout == "chw" else (height, width, 3)

    def release(self) -> Any:
        """Hand over the swscale context (for a forked child to keep, never free) and forget it."""
        reformatter, self._reformatter = self._reformatter, None
        return reformatter

    def __call__(self, frame: Any, out: torch.Tensor | None = None, where: str = "") -> torch.Tensor:
        """Convert a PyAV ``VideoFrame``; write into ``out`` (contiguous uint8 of :meth:`shape`) when given.

        Raises:
            ValueError: ``out`` has the wrong shape, dtype or memory layout.
        """
        import numpy as np
        import torch

        shape = self.shape(frame.height, frame.width)
        height, width = (shape[1], shape[2]) if self.layout == "chw" else (shape[0], shape[1])
        resize = (height, width) != (frame.height, frame.width)
        if out is not None and (tuple(out.shape) != shape or out.dtype != torch.uint8 or not out.is_contiguous()):
            raise ConfigurationError(
                f"{where}: out must be a contiguous uint8 tensor of shape {shape}, got {tuple(out.shape)} {out.dtype}."
            )
        if self.layout == "hwc" and not resize and frame.format.name in _RGB24_EXACT:
            rgb = frame.to_ndarray(format="rgb24")
            if out is None:
                return torch.from_numpy(rgb)  # already the right layout: no copy
            out.numpy()[:] = rgb
            return out
        if self._reformatter is None:
            from av.video.reformatter import VideoReformatter

            self._reformatter = VideoReformatter()
        planar = self._reformatter.reformat(
            frame, width=width, height=height, format="gbrp", interpolation=_SWS_NAMES[self.interpolation]
        )
        if out is None:
            out = torch.empty(shape, dtype=torch.uint8)
        # numpy copies: single-threaded memcpy, no intra-op thread pool to contend with FFmpeg.
        target = out.numpy()
        for channel, plane in zip((1, 2, 0), planar.planes):  # planes are G, B, R
            rows = np.frombuffer(plane, dtype=np.uint8).reshape(plane.height, plane.line_size)[:, : plane.width]
            if self.layout == "chw":
                target[channel] = rows
            else:
                target[:, :, channel] = rows
        return out
