"""On-device frame transforms: crop, resize, normalize, output dtype and layout.

:class:`FrameTransform` takes the uint8 RGB frames a decoder produces, ``[..., 3, H, W]``, on
whatever device they are (CPU after PyAV, CUDA after NVDEC), and returns the transformed tensor on
the same device. The steps always run in this order:

1. **crop** ``(top, left, height, width)`` in input pixels;
2. **resize** to ``(height, width)`` with bilinear interpolation (``align_corners=False``);
3. **scale**: float outputs are divided by 255, so they hold values in ``0..1``;
4. **normalize** ``(x - mean) / std`` per channel, with ``mean`` and ``std`` in ``0..1`` units
   (the usual ImageNet values ``mean=(0.485, 0.456, 0.406)``, ``std=(0.229, 0.224, 0.225)``);
5. **dtype** cast and **layout** (``"chw"`` keeps ``[..., 3, H, W]``, ``"hwc"`` returns a contiguous
   ``[..., H, W, 3]``).

Resizing computes in float32 on every device (CUDA has no uint8 bilinear kernel), so CPU and GPU
give the same numbers up to float rounding; a uint8 output is rounded to nearest and clamped to
``0..255``. Normalization uses per-channel scalar operations, so no constant tensor is copied to
the device and no stream synchronisation happens.

When frames are decoded on the CPU, the loaders move the resize into the decoder: FFmpeg's
swscale resizes in uint8 while it converts YUV to RGB (:meth:`FrameTransform.decoder_size`), which
costs a fraction of a float32 resize. Its bilinear filter is not torch's, so such frames differ
from a GPU-resized frame by a few levels on edges. The remaining steps then run on frames
already at the output size (the resize step finds nothing to do). To run the float conversion
and normalization on the GPU instead, decode with ``FrameTransform(resize=...)`` (uint8) and apply
``FrameTransform(dtype="float32", mean=..., std=...)`` to the batch after it reaches the GPU (for
example in ``LightningModule.on_after_batch_transfer``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, get_args

from lightning_vstream.decode.base import Layout
from lightning_vstream.errors import ConfigurationError, ConfigurationTypeError
from lightning_vstream.profiling import RANGE_TRANSFORM, nvtx_range

if TYPE_CHECKING:
    import torch

__all__ = ["FrameTransform", "OutputDType"]

OutputDType = Literal["uint8", "float16", "bfloat16", "float32"]
_DTYPES = get_args(OutputDType)
_LAYOUTS = ("chw", "hwc")


def _int_tuple(name: str, value: Any, length: int, fields: str) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != length:
        raise ConfigurationError(f"{name}={value!r} must be {length} integers ({fields}).")
    items = tuple(value)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        raise ConfigurationTypeError(
            f"{name}={value!r} must hold integers ({fields}), not {[type(v).__name__ for v in items]}."
        )
    return items


def _float_triple(name: str, value: Any) -> tuple[float, float, float]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 3:
        raise ConfigurationError(f"{name}={value!r} must be 3 numbers, one per RGB channel, in 0..1 units.")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        raise ConfigurationTypeError(f"{name}={value!r} must hold numbers, one per RGB channel.")
    a, b, c = (float(v) for v in value)
    return a, b, c


def _check_crop(crop: tuple[int, ...], height: int, width: int) -> None:
    top, left, crop_h, crop_w = crop
    if top + crop_h > height or left + crop_w > width:
        raise ConfigurationError(
            f"crop (top={top}, left={left}, height={crop_h}, width={crop_w}) reaches row {top + crop_h} "
            f"and column {left + crop_w}, but the frames are {height} x {width} (height x width); "
            "shrink the crop or move it inside the frame."
        )


@dataclass(frozen=True, kw_only=True)
class FrameTransform:
    """Crop, resize, normalize and convert decoded frames on the device they are on.

    Frozen and picklable, so it can be configured in a DataModule (LightningCLI reads the typed
    fields as nested options) and sent to DataLoader workers. The default instance changes nothing.

    Args:
        crop: ``(top, left, height, width)`` region to keep, in input pixels; applied before resize.
        resize: Output ``(height, width)``; bilinear, ``align_corners=False``.
        antialias: Low-pass filter when resize shrinks the frame (``torch.nn.functional.interpolate``
            ``antialias=True``); without it, downscaling aliases fine texture. No effect when
            enlarging.
        mean: Per-channel mean to subtract, in ``0..1`` units (needs ``std`` and a float ``dtype``).
        std: Per-channel standard deviation to divide by, in ``0..1`` units, all positive.
        dtype: Output dtype: ``"uint8"`` keeps ``0..255``; float dtypes hold ``0..1`` (or
            normalized values when ``mean``/``std`` are set).
        layout: ``"chw"`` for ``[..., 3, H, W]`` or ``"hwc"`` for ``[..., H, W, 3]``.

    Raises:
        ValueError: A size is not positive, ``mean`` comes without ``std`` (or the reverse), a
            ``std`` is not positive, normalization is asked for with ``dtype="uint8"``, or
            ``dtype``/``layout`` is not one of the accepted values.
        TypeError: A size holds non-integers.

    Example::

        >>> import torch
        >>> t = FrameTransform(crop=(0, 0, 32, 48), resize=(16, 24), dtype="float32",
        ...                    mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
        >>> frames = torch.full((6, 3, 48, 64), 128, dtype=torch.uint8)
        >>> out = t(frames)
        >>> out.shape, out.dtype, t.output_shape(48, 64)
        (torch.Size([6, 3, 16, 24]), torch.float32, (3, 16, 24))
    """

    crop: tuple[int, int, int, int] | None = None
    resize: tuple[int, int] | None = None
    antialias: bool = True
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    dtype: OutputDType = "uint8"
    layout: Layout = "chw"

    def __post_init__(self) -> None:
        # Lists (from YAML or JSON) are accepted and stored as tuples so instances stay hashable.
        if self.crop is not None:
            crop = _int_tuple("crop", self.crop, 4, "top, left, height, width")
            top, left, height, width = crop
            if top < 0 or left < 0:
                raise ConfigurationError(f"crop={crop!r}: top and left must be >= 0.")
            if height <= 0 or width <= 0:
                raise ConfigurationError(f"crop={crop!r}: height and width must be positive.")
            object.__setattr__(self, "crop", crop)
        if self.resize is not None:
            resize = _int_tuple("resize", self.resize, 2, "height, width")
            if resize[0] <= 0 or resize[1] <= 0:
                raise ConfigurationError(f"resize={resize!r}: height and width must be positive.")
            object.__setattr__(self, "resize", resize)
        if not isinstance(self.antialias, bool):
            raise ConfigurationTypeError(f"antialias={self.antialias!r} must be True or False.")
        if (self.mean is None) != (self.std is None):
            raise ConfigurationError(f"mean={self.mean!r} and std={self.std!r}: give both to normalize, or neither.")
        if self.mean is not None and self.std is not None:
            object.__setattr__(self, "mean", _float_triple("mean", self.mean))
            std = _float_triple("std", self.std)
            if any(s <= 0 for s in std):
                raise ConfigurationError(f"std={std!r} must be positive for every channel.")
            object.__setattr__(self, "std", std)
        if self.dtype not in _DTYPES:
            raise ConfigurationError(f"dtype={self.dtype!r} is not supported; use one of {list(_DTYPES)}.")
        if self.layout not in _LAYOUTS:
            raise ConfigurationError(f"layout={self.layout!r} is not supported; use 'chw' or 'hwc'.")
        if self.mean is not None and self.dtype == "uint8":
            raise ConfigurationError(
                "mean/std normalization produces negative and fractional values, which dtype='uint8' "
                "cannot hold; pick dtype='float32', 'float16' or 'bfloat16', or drop mean and std."
            )

    # -- introspection ----------------------------------------------------------------------
    def decoder_size(self) -> tuple[int, int] | None:
        """The ``(height, width)`` a CPU video decoder can resize to while converting, or None.

        The resize moves into the decoder when it is the first step (no crop comes before it)
        and ``antialias`` is on (swscale's filters always low-pass when shrinking). The transform
        is still applied afterwards; its resize step then finds the frames at the output size.

        Example::

            >>> FrameTransform(resize=(450, 800)).decoder_size()
            (450, 800)
            >>> FrameTransform(crop=(0, 0, 800, 1600), resize=(450, 800)).decoder_size() is None
            True
        """
        if self.resize is None or self.crop is not None or not self.antialias:
            return None
        return self.resize

    @property
    def is_resize_only(self) -> bool:
        """True when resizing is the transform's only step (uint8 ``"chw"`` output)."""
        return self.resize is not None and replace(self, resize=None).is_identity

    @property
    def is_identity(self) -> bool:
        """True when calling the transform returns its input unchanged."""
        return (
            self.crop is None
            and self.resize is None
            and self.mean is None
            and self.dtype == "uint8"
            and self.layout == "chw"
        )

    @property
    def torch_dtype(self) -> torch.dtype:
        """The ``torch.dtype`` of the output."""
        import torch

        return getattr(torch, self.dtype)

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """Output ``(height, width)`` for input frames of ``height`` x ``width``.

        Raises:
            ValueError: The crop does not fit in such frames.
        """
        if self.crop is not None:
            _check_crop(self.crop, height, width)
            height, width = self.crop[2], self.crop[3]
        if self.resize is not None:
            height, width = self.resize
        return height, width

    def output_shape(self, height: int, width: int) -> tuple[int, int, int]:
        """Shape of one output frame, ``(3, H, W)`` or ``(H, W, 3)``, for ``height`` x ``width`` input.

        Raises:
            ValueError: The crop does not fit in such frames.
        """
        out_h, out_w = self.output_size(height, width)
        return (3, out_h, out_w) if self.layout == "chw" else (out_h, out_w, 3)

    # -- the transform ----------------------------------------------------------------------
    def __call__(self, frames: torch.Tensor) -> torch.Tensor:
        """Transform uint8 RGB frames ``[..., 3, H, W]``; the result stays on their device.

        Raises:
            TypeError: ``frames`` is not a uint8 tensor.
            ValueError: ``frames`` is not ``[..., 3, H, W]``, or the crop does not fit.
        """
        import torch

        if not isinstance(frames, torch.Tensor):
            raise ConfigurationTypeError(
                f"FrameTransform expects a torch.Tensor of frames, got {type(frames).__name__}."
            )
        if frames.dtype != torch.uint8:
            raise ConfigurationTypeError(
                f"FrameTransform expects uint8 frames as decoders produce them, got {frames.dtype}; "
                "apply it before any other conversion."
            )
        if frames.dim() < 3 or frames.shape[-3] != 3:
            raise ConfigurationError(
                f"FrameTransform expects frames shaped [..., 3, H, W] (RGB, channels first), got "
                f"{tuple(frames.shape)}; decode with layout='chw'."
            )
        if self.is_identity:
            return frames
        with nvtx_range(RANGE_TRANSFORM):
            return self._apply(frames)

    def _apply(self, frames: torch.Tensor) -> torch.Tensor:
        import torch
        import torch.nn.functional as F

        x = frames
        if self.crop is not None:
            _check_crop(self.crop, x.shape[-2], x.shape[-1])
            top, left, crop_h, crop_w = self.crop
            x = x[..., top : top + crop_h, left : left + crop_w]
        is_float = False
        if self.resize is not None and tuple(x.shape[-2:]) != self.resize:
            lead = x.shape[:-3]
            flat = x.reshape(-1, 3, x.shape[-2], x.shape[-1]).to(torch.float32)
            if flat.shape[0] == 0:
                flat = flat.new_empty((0, 3, *self.resize))
            else:
                flat = F.interpolate(
                    flat, size=self.resize, mode="bilinear", align_corners=False, antialias=self.antialias
                )
            x = flat.reshape(*lead, 3, *self.resize)
            is_float = True
        if self.dtype == "uint8":
            if is_float:
                x = x.round_().clamp_(0, 255).to(torch.uint8)
        else:
            # uint8 -> float32 always copies, so the in-place ops below never touch the input.
            x = x if is_float else x.to(torch.float32)
            x = x.div_(255.0)
            if self.mean is not None and self.std is not None:
                for c in range(3):
                    x.select(-3, c).sub_(self.mean[c]).div_(self.std[c])
            if self.dtype != "float32":
                x = x.to(self.torch_dtype)
        if self.layout == "hwc":
            x = x.movedim(-3, -1).contiguous()
        elif not x.is_contiguous():
            x = x.contiguous()
        return x
