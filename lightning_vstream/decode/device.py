"""Which device decodes, and how NVDEC's frames reach torch.

- :func:`import_pynvvideocodec` / :func:`nvdec_available`: PyNvVideoCodec is imported only when
  asked for (on machines without an NVIDIA driver its import fails, and the CPU path never touches
  it), and only a version that exports every frame layout correctly is accepted.
- :func:`resolve_decode_device`: the per-rank choice of GPU.
- :class:`FrameMemory`: where decoded surfaces live and how they become tensors. On a GPU
  (:class:`CudaMemory`) a ``DecodedFrame``'s DLPack capsule is imported on a CUDA stream. Under a
  driver whose device memory *is* host memory (the fake NVIDIA driver the test suite runs the real
  PyNvVideoCodec over, see ``docs/gpu.md``), :class:`HostMemory` views the same CUDA-labelled
  capsules as CPU tensors, so everything from packet to batch runs without a GPU; only the colour
  kernels then run on CPU tensors. :func:`frame_memory` picks one (``VSTREAM_NVDEC_HOST_MEMORY=1``
  selects host memory, for tests).
"""

from __future__ import annotations

import collections
import ctypes
import os
import re
import struct
import threading
import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from lightning_vstream.errors import ConfigurationError, DecoderCapabilityError, MissingDependencyError, VStreamWarning

if TYPE_CHECKING:
    import torch

__all__ = [
    "GPU_INSTALL_HINT",
    "HOST_MEMORY_ENV",
    "MIN_PYNVVIDEOCODEC",
    "CudaMemory",
    "DecodeDevice",
    "FrameMemory",
    "HostMemory",
    "frame_memory",
    "host_view",
    "import_pynvvideocodec",
    "nvdec_available",
    "pynvvideocodec_version",
    "resolve_decode_device",
]

DecodeDevice = Literal["cpu", "cuda", "auto"]

GPU_INSTALL_HINT = (
    "GPU decoding needs PyNvVideoCodec and an NVIDIA driver with NVDEC: run "
    "`pip install lightning_vstream[gpu]` on a machine with an NVIDIA GPU and driver, or use "
    "decode_device='cpu'."
)
#: Oldest PyNvVideoCodec accepted: 2.0.0 to 2.2.3 export 10-bit (P016) frames with the strides of
#: an 8-bit surface, a wrong view of the buffer that decodes silently into wrong pixels.
MIN_PYNVVIDEOCODEC = (2, 2, 4)
#: Set to 1 to view NVDEC frames as host memory (:class:`HostMemory`); only for a test driver.
HOST_MEMORY_ENV = "VSTREAM_NVDEC_HOST_MEMORY"


# -- availability and device choice ------------------------------------------------------------
def import_pynvvideocodec() -> ModuleType:
    """Import and return the ``PyNvVideoCodec`` module.

    Raises:
        ImportError: It is not installed, or its import failed (it fails on machines without an
            NVIDIA driver); the message says how to fix it.
    """
    try:
        import PyNvVideoCodec
    except Exception as err:
        raise MissingDependencyError(
            f"PyNvVideoCodec could not be imported ({type(err).__name__}: {err}). {GPU_INSTALL_HINT}"
        ) from err
    version = getattr(PyNvVideoCodec, "__version__", "unknown")
    if pynvvideocodec_version(version) < MIN_PYNVVIDEOCODEC:
        raise MissingDependencyError(
            f"PyNvVideoCodec {version} is too old: versions before 2.2.4 export 10-bit frames with wrong "
            "strides (wrong pixels, no error). Run `pip install -U 'pynvvideocodec>=2.2.4'`."
        )
    return PyNvVideoCodec


def pynvvideocodec_version(version: str) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of a PyNvVideoCodec version string; ``(0, 0, 0)`` when unreadable.

    Example::

        >>> pynvvideocodec_version("2.2.4"), pynvvideocodec_version("2.1")
        ((2, 2, 4), (2, 1, 0))
    """
    match = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(version))
    if match is None:
        return (0, 0, 0)
    major, minor, patch = (int(g) if g else 0 for g in match.groups())
    return (major, minor, patch)


def nvdec_available() -> bool:
    """True when PyNvVideoCodec imports (which needs an NVIDIA driver); never raises."""
    try:
        import_pynvvideocodec()
    except ImportError:
        return False
    return True


def resolve_decode_device(
    decode_device: DecodeDevice,
    local_rank: int = 0,
    *,
    root_device: torch.device | str | None = None,
    cuda_available: bool | None = None,
    device_count: int | None = None,
    nvdec: bool | None = None,
) -> torch.device:
    """Choose the device frames are decoded on.

    ``"cpu"`` always decodes with PyAV. ``"cuda"`` decodes with NVDEC on this process's GPU and
    fails loudly when that is impossible. ``"auto"`` picks ``"cuda"`` when torch sees a GPU and
    PyNvVideoCodec imports, and ``"cpu"`` otherwise (with a warning when only PyNvVideoCodec is
    missing).

    The GPU is ``root_device`` when it is a CUDA device: pass ``trainer.strategy.root_device``,
    which Lightning sets per rank (with ``devices=[2, 3]``, local rank 0 trains on ``cuda:2``).
    Without it, local rank ``r`` decodes on ``cuda:r``.

    Args:
        decode_device: ``"cpu"``, ``"cuda"`` or ``"auto"``.
        local_rank: This process's rank on its node.
        root_device: The device this rank trains on, when known.
        cuda_available: Whether CUDA is usable; probed with ``torch.cuda.is_available()`` if None.
        device_count: Number of visible GPUs; probed with ``torch.cuda.device_count()`` if None.
        nvdec: Whether PyNvVideoCodec imports; probed if None.

    Returns:
        ``torch.device("cpu")`` or ``torch.device("cuda", index)``.

    Raises:
        ValueError: ``decode_device`` is not one of the three choices, ``local_rank`` is negative,
            or the local rank has no GPU of its own.
        RuntimeError: ``decode_device="cuda"`` but CUDA is not available.
        ImportError: ``decode_device="cuda"`` but PyNvVideoCodec cannot be imported.

    Example::

        >>> resolve_decode_device("auto", 0, cuda_available=False)
        device(type='cpu')
        >>> resolve_decode_device("cuda", 1, cuda_available=True, device_count=2, nvdec=True)
        device(type='cuda', index=1)
    """
    import torch

    if decode_device not in ("cpu", "cuda", "auto"):
        raise ConfigurationError(f"decode_device={decode_device!r} is not supported; use 'cpu', 'cuda' or 'auto'.")
    if not isinstance(local_rank, int) or local_rank < 0:
        raise ConfigurationError(f"local_rank={local_rank!r} must be a non-negative integer.")
    if decode_device == "cpu":
        return torch.device("cpu")
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if not cuda_available:
        if decode_device == "cuda":
            raise DecoderCapabilityError(
                "decode_device='cuda' needs a CUDA GPU, but torch.cuda.is_available() is False (no "
                "NVIDIA driver, a CPU-only torch build, or CUDA_VISIBLE_DEVICES hides every GPU). Use "
                "decode_device='cpu', or 'auto' to fall back to the CPU automatically."
            )
        return torch.device("cpu")
    if nvdec is None:
        nvdec = nvdec_available()
    if not nvdec:
        if decode_device == "cuda":
            import_pynvvideocodec()  # raises the ImportError that explains the fix
            raise MissingDependencyError(f"PyNvVideoCodec is not usable. {GPU_INSTALL_HINT}")
        warnings.warn(
            "decode_device='auto' decodes on the CPU: CUDA is available but PyNvVideoCodec is not. "
            "Run `pip install lightning_vstream[gpu]` to decode on the GPU.",
            VStreamWarning,
            stacklevel=2,
        )
        return torch.device("cpu")
    if root_device is not None:
        root = torch.device(root_device)
        if root.type == "cuda" and root.index is not None:
            return root
    if device_count is None:
        device_count = torch.cuda.device_count()
    if local_rank >= device_count:
        raise ConfigurationError(
            f"local_rank={local_rank} has no GPU of its own: this process sees {device_count} CUDA "
            f"device(s). Pass root_device=trainer.strategy.root_device, or check CUDA_VISIBLE_DEVICES."
        )
    return torch.device("cuda", local_rank)


# -- how decoded frames reach torch ------------------------------------------------------------
class FrameMemory(Protocol):
    """Where NVDEC's decoded surfaces live, the streams decoders run on, and how a frame becomes a tensor."""

    #: True when "device" memory is host memory (tensors are on the CPU; nothing needs ordering).
    host: bool

    def device(self, gpu: int) -> torch.device:
        """The torch device frames of GPU ``gpu`` are on."""
        ...

    def new_stream(self, gpu: int) -> Any:
        """A new stream of GPU ``gpu`` (an object with a ``cuda_stream`` handle)."""
        ...

    def current_stream(self, gpu: int) -> Any:
        """The calling thread's current stream of GPU ``gpu``."""
        ...

    def import_surface(self, frame: Any, stream: Any) -> torch.Tensor:
        """The surface of a ``DecodedFrame`` as a tensor (no copy), ready for work queued on ``stream``."""
        ...


class CudaMemory:
    """Frames in GPU memory: DLPack import on a CUDA stream.

    ``DecodedFrame.__dlpack__(stream=s)`` makes ``s`` wait for the decoder's work on the frame.
    The capsule is imported directly: ``torch.from_dlpack(frame)`` would first try a newer
    protocol version that PyNvVideoCodec refuses, paying an exception per frame.

    Example::

        >>> CudaMemory().device(1)
        device(type='cuda', index=1)
    """

    host = False

    def device(self, gpu: int) -> torch.device:
        import torch

        return torch.device("cuda", gpu)

    def new_stream(self, gpu: int) -> torch.cuda.Stream:
        import torch

        return torch.cuda.Stream(device=gpu)

    def current_stream(self, gpu: int) -> torch.cuda.Stream:
        import torch

        return torch.cuda.current_stream(gpu)

    def import_surface(self, frame: Any, stream: Any) -> torch.Tensor:
        from torch.utils.dlpack import from_dlpack

        return from_dlpack(frame.__dlpack__(stream=stream.cuda_stream))


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
#: A DLPack ``DLTensor``: data, device (type, id), ndim, dtype (code, bits, lanes), shape, strides, byte offset.
_DL_TENSOR = struct.Struct("=QiiiBBHQQQ")
#: DLPack (type code, bits) -> numpy type string.
_DL_TYPES = {(1, 8): "|u1", (1, 16): "<u2", (0, 8): "|i1", (0, 16): "<i2", (2, 32): "<f4"}
#: Views already built, by memory and layout: a decoder hands out the same buffer frame after frame.
_views: collections.OrderedDict[tuple[Any, ...], Any] = collections.OrderedDict()
_views_lock = threading.Lock()
_VIEWS_KEPT = 256


class _HostArray:
    """A numpy ``__array_interface__`` over a capsule's memory; holds the capsule while it is viewed."""

    __slots__ = ("__array_interface__", "capsule")

    def __init__(self, interface: dict[str, Any], capsule: Any) -> None:
        self.__array_interface__ = interface
        self.capsule = capsule


def host_view(capsule: Any) -> torch.Tensor:
    """A CPU tensor viewing the memory of a DLPack capsule whatever device the capsule names.

    Only correct where that memory is host memory, as under the fake NVIDIA driver (its "device"
    allocations are host allocations). Shape, strides and dtype are the capsule's own, so a wrong
    layout exported by the library shows here exactly as it would on a GPU. Views are kept by
    memory address and layout, since a decoder exports the same buffer again and again.

    Raises:
        DecoderCapabilityError: The capsule's dtype is not one a decoded frame can have.
    """
    data, _, _, ndim, code, bits, lanes, shape_at, strides_at, offset = _DL_TENSOR.unpack(
        ctypes.string_at(_capsule_pointer(capsule, b"dltensor"), _DL_TENSOR.size)
    )
    shape = struct.unpack(f"={ndim}q", ctypes.string_at(shape_at, 8 * ndim))
    strides = struct.unpack(f"={ndim}q", ctypes.string_at(strides_at, 8 * ndim)) if strides_at else None
    key = (data + offset, shape, strides, code, bits, lanes)
    view = _views.get(key)
    if view is not None:
        return view
    import numpy as np
    import torch

    typestr = _DL_TYPES.get((code, bits))
    if typestr is None or lanes != 1:
        raise DecoderCapabilityError(f"a decoded frame exported DLPack dtype (code {code}, {bits} bits, {lanes} lanes)")
    itemsize = bits // 8
    interface = {
        "version": 3,
        "shape": shape,
        "typestr": typestr,
        "data": (data + offset, False),
        "strides": tuple(s * itemsize for s in strides) if strides is not None else None,
    }
    view = torch.from_numpy(np.asarray(_HostArray(interface, capsule)))
    with _views_lock:
        _views[key] = view
        if len(_views) > _VIEWS_KEPT:
            _views.popitem(last=False)
    return view


class _HostStream:
    """A stream handle of the loaded driver, for decoders whose frames live in host memory."""

    __slots__ = ("cuda_stream",)

    def __init__(self, handle: int) -> None:
        self.cuda_stream = handle

    def __repr__(self) -> str:
        return f"_HostStream({self.cuda_stream:#x})"


class HostMemory:
    """Frames whose "device" memory is host memory: the CUDA-labelled capsules are viewed as CPU tensors.

    For the test driver (``shared/tools/fake-nvdriver`` builds it) under which the real
    PyNvVideoCodec runs on a machine without a GPU. Streams are real streams of that driver
    (``cuStreamCreate``), so decoders get the same ``cudastream`` handling as on a GPU; frames
    need no ordering since the driver finishes every copy before returning.

    Raises:
        ConfigurationError: The loaded ``libcuda.so.1`` is a real NVIDIA driver, whose device
            memory must never be read as host memory.

    Example::

        >>> HostMemory().device(0)  # doctest: +SKIP
        device(type='cpu')
    """

    host = True

    def __init__(self) -> None:
        try:
            self._driver = ctypes.CDLL("libcuda.so.1")
        except OSError as err:
            raise ConfigurationError(f"{HOST_MEMORY_ENV}=1 needs a libcuda.so.1 to load: {err}") from err
        if hasattr(self._driver, "cuLaunchKernel"):
            raise ConfigurationError(
                f"{HOST_MEMORY_ENV}=1 views NVDEC frames as host memory, which is only right under a test driver; "
                "the libcuda.so.1 loaded here launches kernels, so it is a real NVIDIA driver. Unset "
                f"{HOST_MEMORY_ENV}."
            )
        self._local = threading.local()

    def device(self, gpu: int) -> torch.device:
        import torch

        return torch.device("cpu")

    def new_stream(self, gpu: int) -> _HostStream:
        handle = ctypes.c_void_p()
        self._driver.cuStreamCreate(ctypes.byref(handle), 0)
        return _HostStream(int(handle.value or 0))

    def current_stream(self, gpu: int) -> _HostStream:
        streams: dict[int, _HostStream] | None = getattr(self._local, "streams", None)
        if streams is None:
            streams = self._local.streams = {}
        stream = streams.get(gpu)
        if stream is None:
            stream = streams[gpu] = self.new_stream(gpu)
        return stream

    def import_surface(self, frame: Any, stream: Any) -> torch.Tensor:
        return host_view(frame.__dlpack__(stream=stream.cuda_stream))


_host_memory: HostMemory | None = None
_host_memory_lock = threading.Lock()


def frame_memory() -> FrameMemory:
    """The :class:`FrameMemory` of this process: :class:`CudaMemory` unless ``VSTREAM_NVDEC_HOST_MEMORY=1``.

    Example::

        >>> frame_memory().host  # doctest: +SKIP
        False
    """
    global _host_memory
    if os.environ.get(HOST_MEMORY_ENV, "") in ("", "0"):
        return CudaMemory()
    with _host_memory_lock:
        if _host_memory is None:
            _host_memory = HostMemory()
        return _host_memory
