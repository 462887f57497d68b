"""YUV -> RGB conversion of NVDEC's frames, honouring the stream's colour matrix and range, on any device.

NVDEC hands out frames in their native layout: NV12 (8-bit 4:2:0: a ``H x W`` luma plane followed
by ``H/2`` rows of interleaved U,V samples) or P016 (the same with 16-bit samples, 10-bit data in
the high bits). PyNvVideoCodec's own RGB output assumes BT.709 whenever a stream leaves its matrix
unspecified, and always limited range, while FFmpeg (the CPU path) assumes BT.601 for untagged
streams. Converting here, with the rules FFmpeg applies, makes GPU and CPU frames agree.

Chroma is upsampled by repeating each sample (nearest neighbour), as NVIDIA's conversion kernels
do; FFmpeg's swscale interpolates, so GPU and CPU frames differ by a few levels at colour edges
(see ``docs/gpu.md`` for the measured tolerance).

Two implementations compute the same thing: one fused Triton kernel
(:mod:`lightning_vstream.decode.nvdec.nv12_kernel`: one launch per frame, written straight into the
batch row), used on a GPU once it has passed :func:`prepare_conversion`, and a torch one
(:func:`torch_nv12_to_rgb`), the fallback and the reference. :func:`prepare_conversion` compiles the
kernel once per GPU and process, at setup on the main thread, and compares it there with the torch
conversion (NV12 and P016, rows wider than one block and not a multiple of it, channels first and
last, rows of a batch, a surface with padded rows); where Triton is missing, the kernel does not
compile, or its frames differ, every later conversion on that GPU uses torch, after one
:class:`~lightning_vstream.errors.VStreamWarning` that says why. Decoders build a
:class:`Nv12Converter` once per file, so a frame costs one call.

Example::

    >>> import torch
    >>> nv12 = torch.full((6, 4), 128, dtype=torch.uint8)  # a 4x4 mid-grey frame
    >>> nv12[:4] = 126
    >>> nv12_to_rgb(nv12, ColorSpec("bt601", full_range=False))[:, 0, 0].tolist()
    [128, 128, 128]
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from lightning_vstream.errors import ConfigurationError, DecoderCapabilityError, VStreamWarning

if TYPE_CHECKING:
    import torch

__all__ = [
    "Backend",
    "ColorSpec",
    "Matrix",
    "Nv12Converter",
    "coefficients",
    "color_spec_from_stream",
    "nv12_to_rgb",
    "prepare_conversion",
    "torch_nv12_to_rgb",
    "triton_available",
]

Matrix = Literal["bt601", "bt709", "bt2020"]
#: ``"auto"``: the Triton kernel on a GPU where it passed :func:`prepare_conversion`, torch otherwise.
Backend = Literal["auto", "triton", "torch"]

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


@functools.lru_cache(maxsize=64)
def coefficients(spec: ColorSpec) -> tuple[float, float, float, float, float, float]:
    """``(y_offset, y_scale, r_v, g_u, g_v, b_u)`` turning 8-bit-scale codes into RGB on 0..255.

    ``R = (Y - y_offset) * y_scale + (V - 128) * r_v``, ``G = ... + (U - 128) * g_u + (V - 128) * g_v``,
    ``B = ... + (U - 128) * b_u``.

    Example::

        >>> [round(c, 4) for c in coefficients(ColorSpec("bt601", full_range=True))]
        [0.0, 1.0, 1.402, -0.3441, -0.7141, 1.772]
    """
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
    return y_offset, y_scale, r_v, g_u, g_v, b_u


def _frame_size(nv12: torch.Tensor) -> tuple[int, int]:
    """``(height, width)`` of an NV12 / P016 tensor; raises if it is not one."""
    import torch

    if nv12.dim() != 2 or nv12.shape[0] % 3 or nv12.shape[1] % 2:
        raise DecoderCapabilityError(
            f"expected an NV12 frame of shape [1.5 * H, W] with even H and W, got {tuple(nv12.shape)}; "
            "only 4:2:0 streams convert on the GPU (decode 4:2:2 / 4:4:4 files with decode.device='cpu')."
        )
    height = nv12.shape[0] * 2 // 3
    if height % 2:
        raise DecoderCapabilityError(f"NV12 frame of shape {tuple(nv12.shape)} has an odd height {height}.")
    if nv12.dtype not in (torch.uint8, torch.uint16, torch.int16):
        raise DecoderCapabilityError(f"NV12/P016 frames are 8- or 16-bit, got dtype {nv12.dtype}.")
    return height, int(nv12.shape[1])


def torch_nv12_to_rgb(
    nv12: torch.Tensor, coeffs: tuple[float, float, float, float, float, float], out: torch.Tensor, *, chw: bool
) -> None:
    """The torch conversion (fallback and reference): ``nv12`` into ``out``, same arithmetic as the kernel."""
    import torch

    height = nv12.shape[0] * 2 // 3
    width = nv12.shape[1]
    if nv12.dtype == torch.uint8:
        planes = nv12.float()
    else:  # P016 stores 10/12-bit samples in the high bits: x / 256 gives the 8-bit scale, fractions kept.
        planes = nv12.view(torch.int16).to(torch.int32).bitwise_and_(0xFFFF).float().mul_(1.0 / 256.0)
    y_offset, y_scale, r_v, g_u, g_v, b_u = coeffs
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
    rgb = rgb.add_(0.5).floor_().clamp_(0.0, 255.0)
    out.copy_(rgb if chw else rgb.permute(1, 2, 0))


_available: bool | None = None


def triton_available() -> bool:
    """True when Triton imports (it compiles for CUDA devices, or interprets with ``TRITON_INTERPRET=1``).

    Example::

        >>> isinstance(triton_available(), bool)
        True
    """
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


#: Spec, bit depth, width, height and padding of each frame the check converts with both conversions.
_CHECK_CASES = (
    (ColorSpec("bt709"), 8, 262, 6, 0),
    (ColorSpec("bt601", full_range=True), 8, 518, 4, 64),
    (ColorSpec("bt2020", full_range=True), 10, 262, 6, 0),
    (ColorSpec("bt709"), 10, 390, 4, 32),
)
#: Largest difference (levels) the check accepts between the kernel and torch: float contraction on a GPU.
CHECK_TOLERANCE = 1
_checked: dict[str, Literal["triton", "torch"]] = {}
_check_lock = threading.Lock()


def prepare_conversion(device: Any) -> Literal["triton", "torch"]:
    """Compile the Triton kernel for ``device`` and check it against the torch conversion there; the backend
    ``"auto"`` then uses on it (``"triton"`` or ``"torch"``).

    Runs once per device and process, under a lock (later calls return the first answer): call it
    at setup, on the main thread, so the kernel never compiles in a decode thread. The kernel
    converts random NV12 and P016 surfaces (rows wider than one block and not a multiple of it, one
    with padded rows) into rows of channels-first and channels-last batches; each must agree with
    the torch conversion within :data:`CHECK_TOLERANCE` levels. When Triton is missing, the kernel
    does not compile or launch, or a frame differs, the answer is ``"torch"`` and one
    :class:`~lightning_vstream.errors.VStreamWarning` says why. A device that is not a GPU answers
    ``"torch"`` without a check.

    Example::

        >>> prepare_conversion("cpu")
        'torch'
    """
    import torch

    target = torch.device(device)
    if target.type == "cuda" and target.index is None:
        target = torch.device("cuda", torch.cuda.current_device())
    if target.type != "cuda":
        return "torch"
    key = str(target)
    with _check_lock:
        backend = _checked.get(key)
        if backend is None:
            backend = _checked[key] = _check_kernel(target)
    return backend


def _check_kernel(device: Any) -> Literal["triton", "torch"]:
    """``"triton"`` when the kernel compiles on ``device`` and agrees with torch there; else ``"torch"``, warned."""
    why = _kernel_mismatch(device) if triton_available() else "Triton is not installed (`pip install triton`)"
    if why is None:
        return "triton"
    warnings.warn(
        f"the fused NV12 -> RGB kernel is not used on {device}: {why}. Frames are converted with torch instead "
        "(same result, several kernel launches per frame).",
        VStreamWarning,
        stacklevel=3,
    )
    return "torch"


def _kernel_mismatch(device: Any) -> str | None:
    """Why the kernel cannot be used on ``device`` (None: it agrees with torch on every case)."""
    import torch

    try:
        from lightning_vstream.decode.nvdec.nv12_kernel import launch_nv12_to_rgb

        generator = torch.Generator().manual_seed(0)
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            for spec, depth, width, height, padding in _CHECK_CASES:
                if depth > 8:  # P016: 16-bit words, samples in the high bits, stored as int16
                    words = torch.randint(0, 1 << depth, (height * 3 // 2, width + padding), generator=generator) << (
                        16 - depth
                    )
                    padded = torch.where(words >= 32768, words - 65536, words).to(torch.int16)
                else:
                    padded = torch.randint(0, 256, (height * 3 // 2, width + padding), generator=generator).to(
                        torch.uint8
                    )
                surface = padded.to(device)[:, :width]
                coeffs = coefficients(spec)
                reference = torch.empty((3, height, width), dtype=torch.uint8, device=device)
                torch_nv12_to_rgb(surface, coeffs, reference, chw=True)
                for chw in (True, False):
                    shape = (3, height, width) if chw else (height, width, 3)
                    batch = torch.zeros((3, *shape), dtype=torch.uint8, device=device)
                    launch_nv12_to_rgb(surface, batch[1], coeffs, height=height, width=width, chw=chw)
                    got = batch[1] if chw else batch[1].permute(2, 0, 1)
                    worst = int((got.int() - reference.int()).abs().max())
                    if worst > CHECK_TOLERANCE or batch[0].any() or batch[2].any():
                        layout = "channels-first" if chw else "channels-last"
                        return (
                            f"on a {depth}-bit {width}x{height} frame ({spec.matrix}, {layout} batch row) it differs "
                            f"from the torch conversion by up to {worst} levels"
                            + (" and writes outside its row" if batch[0].any() or batch[2].any() else "")
                        )
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    except Exception as err:  # any failure to compile or launch means: not this kernel
        first = (str(err).strip().splitlines() or [""])[0]
        return f"it failed to compile or run ({type(err).__name__}: {first[:300]})"
    return None


class Nv12Converter:
    """Converts every frame of one stream (one size, bit depth, matrix and range) with one call per frame.

    Everything that does not change from frame to frame (coefficients, the backend, the expected
    shapes) is settled here, once per file; a call then launches the conversion, nothing else.

    Args:
        spec: Matrix and range of the stream.
        height: Frame height.
        width: Frame width.
        layout: ``"chw"`` or ``"hwc"`` for the RGB frames.
        device: Where the frames are (a CUDA device selects the Triton kernel under ``"auto"``).
        backend: ``"auto"`` (the Triton kernel on a GPU where :func:`prepare_conversion` passed it,
            torch otherwise), ``"triton"`` or ``"torch"``. ``"triton"`` on CPU tensors needs
            ``TRITON_INTERPRET=1`` (Triton's interpreter).

    Raises:
        MissingDependencyError: ``backend="triton"`` but Triton does not import.

    Example::

        >>> import torch
        >>> convert = Nv12Converter(ColorSpec(), 4, 4, device=torch.device("cpu"))
        >>> convert(torch.full((6, 4), 128, dtype=torch.uint8)).shape, convert.backend
        (torch.Size([3, 4, 4]), 'torch')
    """

    def __init__(
        self,
        spec: ColorSpec,
        height: int,
        width: int,
        *,
        layout: Literal["chw", "hwc"] = "chw",
        device: Any = None,
        backend: Backend = "auto",
    ) -> None:
        import torch

        if backend not in ("auto", "triton", "torch"):
            raise ConfigurationError(f"backend={backend!r} is not supported; use 'auto', 'triton' or 'torch'.")
        if layout not in ("chw", "hwc"):
            raise ConfigurationError(f"layout={layout!r} is not supported; use 'chw' or 'hwc'.")
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        if backend == "auto":
            backend = prepare_conversion(self.device)
        elif backend == "triton" and not triton_available():
            from lightning_vstream.errors import MissingDependencyError

            raise MissingDependencyError(
                "backend='triton' needs Triton (CUDA builds of torch ship it): `pip install triton`, or use "
                "backend='torch'."
            )
        self.backend: str = backend
        self.spec = spec
        self.height = height
        self.width = width
        self.chw = layout == "chw"
        self.shape = (3, height, width) if self.chw else (height, width, 3)
        self._coeffs = coefficients(spec)
        if backend == "triton":
            from lightning_vstream.decode.nvdec.nv12_kernel import launch_nv12_to_rgb

            self._launch: Any = launch_nv12_to_rgb
        else:
            self._launch = None

    def __call__(self, nv12: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Convert ``nv12`` (``[1.5 H, W]``, uint8 or 16-bit) into ``out`` (a new tensor when None)."""
        if out is None:
            import torch

            out = torch.empty(self.shape, dtype=torch.uint8, device=nv12.device)
        if self._launch is not None:
            surface = nv12 if nv12.element_size() == 1 else nv12.view(_int16())
            self._launch(surface, out, self._coeffs, height=self.height, width=self.width, chw=self.chw)
        else:
            torch_nv12_to_rgb(nv12, self._coeffs, out, chw=self.chw)
        return out


@functools.lru_cache(maxsize=1)
def _int16() -> Any:
    import torch

    return torch.int16


def nv12_to_rgb(
    nv12: torch.Tensor,
    spec: ColorSpec = ColorSpec(),
    *,
    out: torch.Tensor | None = None,
    layout: Literal["chw", "hwc"] = "chw",
    backend: Backend = "auto",
) -> torch.Tensor:
    """Convert one NV12 (uint8) or P016 (uint16 / int16) frame to uint8 RGB, on the frame's device.

    Args:
        nv12: ``[1.5 * H, W]`` tensor: the luma plane, then ``H / 2`` rows of interleaved U, V.
            16-bit samples (P016, 10- or 12-bit data in the high bits) are scaled to 8 bits.
        spec: Matrix and range of the stream (:func:`color_spec_from_stream`).
        out: Where to write the result (``[3, H, W]`` or ``[H, W, 3]`` uint8, any strides), so
            a frame can land straight in its row of a batch; a new tensor when None.
        layout: ``"chw"`` or ``"hwc"`` for the result.
        backend: ``"auto"`` (the Triton kernel on a GPU where :func:`prepare_conversion` passed it,
            else torch), ``"triton"`` or ``"torch"``.

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
    height, width = _frame_size(nv12)
    convert = Nv12Converter(spec, height, width, layout=layout, device=nv12.device, backend=backend)
    if out is not None and tuple(out.shape) != convert.shape:
        raise ConfigurationError(
            f"out has shape {tuple(out.shape)} but the converted frame is {convert.shape} ({layout})."
        )
    return convert(nv12, out)
