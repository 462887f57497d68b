"""Which device decodes, and how NVDEC's frames reach torch.

- :func:`import_pynvvideocodec` / :func:`nvdec_available`: PyNvVideoCodec is imported only when
  asked for (on machines without an NVIDIA driver its import fails, and the CPU path never touches
  it), and only a version that exports every frame layout correctly is accepted.
- :func:`resolve_decode_device`: the per-rank choice of GPU.
- :func:`gpu_failure`: whether an error is the GPU's own (a CUDA error, GPU memory exhausted, a
  Triton failure), which stops a run whatever its error policy says, rather than a file's.
- :class:`FrameMemory`: where decoded surfaces live and how they become tensors, and the device
  operations GPU threads need (setting their device, free memory, events). On a GPU
  (:class:`CudaMemory`) a ``DecodedFrame``'s DLPack capsule is imported on a CUDA stream. Under a
  driver whose device memory *is* host memory (the fake NVIDIA driver the test suite runs the real
  PyNvVideoCodec over, see ``docs/gpu.md``), :class:`HostMemory` views the same CUDA-labelled
  capsules as CPU tensors, so everything from packet to batch runs without a GPU; only the colour
  kernels then run on CPU tensors, and streams and events are the driver's own (so its call log
  shows every wait). :func:`frame_memory` picks one (``VSTREAM_NVDEC_HOST_MEMORY=1`` selects host
  memory, for tests).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import threading
import warnings
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from lightning_vstream.errors import (
    ConfigurationError,
    DecoderCapabilityError,
    GpuError,
    GpuMemoryError,
    MissingDependencyError,
    VStreamWarning,
)

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
    "gpu_failure",
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


# -- errors of the GPU itself -----------------------------------------------------------------
#: CUresult codes after which a context cannot be trusted (or memory ran out), as NVIDIA's decoder reports
#: them ("cuvidDecodePicture(...) returned error 700"): out of memory, no or a lost device, a destroyed or
#: invalid context, uncorrectable ECC, and the launch faults 700-719; 999 is CUDA_ERROR_UNKNOWN. Other codes
#: (an invalid value, an invalid bitstream) belong to the data.
_FATAL_CUDA_CODES = frozenset({2, 3, 4, 46, 100, 101, 201, 202, 214, 215, 999, *range(700, 720)})
_MEMORY_CUDA_CODES = frozenset({2})
_GPU_MESSAGE = re.compile(
    r"CUDA_ERROR_(?P<name>\w+)|CUDA driver API error|CUDA error|cudaError\w*|illegal memory access|"
    r"Triton Error|out of memory|returned error (?P<code>\d+)",
    re.IGNORECASE,
)


def gpu_failure(err: BaseException, where: str = "") -> GpuError | None:
    """The :class:`~lightning_vstream.errors.GpuError` that ``err`` stands for, or None when it is not the GPU's.

    The GPU's own errors: torch's CUDA errors (``torch.cuda.OutOfMemoryError``,
    ``torch.AcceleratorError``), Triton's, and messages of PyNvVideoCodec, torch or Triton that name
    a CUDA error (``CUDA_ERROR_...``, ``CUDA error: ...``, a CUresult such as 700 that leaves the
    context unusable, ``out of memory``). They stop a run whatever ``on_error`` says: skipping would
    skip every clip after them. Out of memory gives a
    :class:`~lightning_vstream.errors.GpuMemoryError`. ``where`` (file and frame) starts the message.

    Example::

        >>> type(gpu_failure(RuntimeError("CUDA driver API error CUDA_ERROR_ILLEGAL_ADDRESS"))).__name__
        'GpuError'
        >>> gpu_failure(ValueError("moov atom not found")) is None
        True
    """
    if isinstance(err, GpuError):
        return err
    kind = type(err)
    names = {cls.__name__ for cls in kind.__mro__}
    module = kind.__module__ or ""
    text = str(err)
    found = _GPU_MESSAGE.search(text)
    memory = "OutOfMemoryError" in names
    if found is not None and found["code"] is not None:
        code = int(found["code"])
        if code not in _FATAL_CUDA_CODES:
            found = None
        memory = memory or code in _MEMORY_CUDA_CODES
    gpu = memory or "AcceleratorError" in names or module.startswith("triton") or found is not None
    if not gpu:
        return None
    memory = memory or re.search(r"out[ _]of[ _]memory", text, re.IGNORECASE) is not None
    place = f"{where}: " if where else ""
    first = (text.strip().splitlines() or [""])[0][:500]
    if memory:
        return GpuMemoryError(
            f"{place}the GPU ran out of memory ({kind.__name__}: {first}). This is not a problem of the file: lower "
            "the batch size, cameras per step, engine_threads / gop_threads or prefetch_factor, or free GPU memory "
            "before fitting; the run stops (a skip would skip every later clip)."
        )
    return GpuError(
        f"{place}the GPU failed ({kind.__name__}: {first}). This is not a problem of the file and the CUDA context may "
        "be unusable, so the run stops (a skip would skip every later clip). Check the GPU (`nvidia-smi`, "
        "`vstream doctor`); set CUDA_LAUNCH_BLOCKING=1 to find the call that failed."
    )


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

    def set_device(self, gpu: int) -> None:
        """Make GPU ``gpu`` the calling thread's device (every thread that touches a GPU calls this first)."""
        ...

    def mem_get_info(self, gpu: int) -> tuple[int, int]:
        """``(free, total)`` bytes of GPU ``gpu``'s memory, as the driver reports them."""
        ...

    def new_event(self) -> Any:
        """A new event (recorded on a stream, waited for by a stream or the host)."""
        ...

    def record(self, event: Any, stream: Any) -> None:
        """Record ``event`` on ``stream``: it completes when the work queued there so far has."""
        ...

    def wait(self, stream: Any, event: Any) -> None:
        """Make ``stream`` wait for ``event`` (no host wait)."""
        ...

    def synchronize(self, event: Any) -> None:
        """Wait on the host until ``event`` has completed (releases the GIL)."""
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
        return _torch_from_dlpack()(frame.__dlpack__(stream=stream.cuda_stream))

    def set_device(self, gpu: int) -> None:
        import torch

        torch.cuda.set_device(gpu)

    def mem_get_info(self, gpu: int) -> tuple[int, int]:
        import torch

        free, total = torch.cuda.mem_get_info(gpu)
        return int(free), int(total)

    def new_event(self) -> torch.cuda.Event:
        import torch

        # Blocking: a host wait sleeps instead of spinning a core.
        return torch.cuda.Event(blocking=True)

    def record(self, event: Any, stream: Any) -> None:
        event.record(stream)

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def synchronize(self, event: Any) -> None:
        if not event.query():  # most often done already: no call that sleeps
            event.synchronize()


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
#: DLPack's ``DLDevice`` of the CPU (device type 1, id 0), written over a capsule's device at byte 8 of its
#: ``DLManagedTensor`` (after the data pointer).
_CPU_DEVICE = (ctypes.c_int32 * 2)(1, 0)
_DEVICE_OFFSET = 8


@functools.cache
def _frame_dtypes() -> frozenset[Any]:
    """Sample types a decoded frame can have (NV12: 8-bit; P016: 16-bit words)."""
    import torch

    return frozenset((torch.uint8, torch.int8, torch.uint16, torch.int16, torch.float32))


@functools.cache
def _torch_from_dlpack() -> Callable[[Any], torch.Tensor]:
    """torch's import of a DLPack capsule, looked up once rather than per frame.

    For a capsule, ``torch.utils.dlpack.from_dlpack`` checks its keyword arguments and calls
    ``torch._C._from_dlpack``; this takes that call directly where it exists, once per frame.
    """
    import torch
    from torch.utils.dlpack import from_dlpack

    return getattr(torch._C, "_from_dlpack", None) or from_dlpack


def host_view(capsule: Any) -> torch.Tensor:
    """A CPU tensor viewing the memory of a DLPack capsule whatever device the capsule names.

    Only correct where that memory is host memory, as under the fake NVIDIA driver (its "device"
    allocations are host allocations). The capsule's device is relabelled as the CPU and the
    capsule is imported by torch's own ``from_dlpack``, the call that imports it on a GPU: shape,
    strides and dtype are the capsule's own, so a wrong layout exported by the library shows here
    exactly as it would on a GPU, and the import costs the host what it costs there (plus the
    relabelling, one ``memmove``). The tensor owns the capsule's memory as torch's import does: the
    exporter's deleter runs when the tensor is freed.

    Raises:
        DecoderCapabilityError: The capsule's dtype is not one a decoded frame can have.

    Example::

        >>> host_view(torch.zeros(2, 3, dtype=torch.uint8).__dlpack__()).shape
        torch.Size([2, 3])
    """
    ctypes.memmove(_capsule_pointer(capsule, b"dltensor") + _DEVICE_OFFSET, _CPU_DEVICE, 8)
    view = _torch_from_dlpack()(capsule)
    if view.dtype not in _frame_dtypes():
        raise DecoderCapabilityError(f"a decoded frame exported DLPack dtype {view.dtype} (shape {tuple(view.shape)})")
    return view


class _HostStream:
    """A stream handle of the loaded driver, for decoders whose frames live in host memory."""

    __slots__ = ("cuda_stream",)

    def __init__(self, handle: int) -> None:
        self.cuda_stream = handle

    def __repr__(self) -> str:
        return f"_HostStream({self.cuda_stream:#x})"


class _HostEvent:
    """An event of the loaded driver (``cuEventCreate``)."""

    __slots__ = ("handle",)

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __repr__(self) -> str:
        return f"_HostEvent({self.handle:#x})"


class HostMemory:
    """Frames whose "device" memory is host memory: the CUDA-labelled capsules are viewed as CPU tensors.

    For the test driver (``shared/tools/fake-nvdriver`` builds it) under which the real
    PyNvVideoCodec runs on a machine without a GPU. Streams and events are real streams and events
    of that driver (``cuStreamCreate``, ``cuEventRecord``, ``cuStreamWaitEvent``,
    ``cuEventSynchronize``), so decoders get the same ``cudastream`` handling as on a GPU and the
    driver's call log shows every stream wait the project asks for; frames need no ordering since
    the driver finishes every copy before returning. Free memory is the host's (the driver's
    device memory is host memory), and each thread's device is remembered (:meth:`thread_device`).

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
        pointer = ctypes.c_void_p
        for name, argtypes in (
            ("cuEventCreate", [ctypes.POINTER(pointer), ctypes.c_uint]),
            ("cuEventRecord", [pointer, pointer]),
            ("cuStreamWaitEvent", [pointer, pointer, ctypes.c_uint]),
            ("cuEventSynchronize", [pointer]),
        ):
            getattr(self._driver, name).argtypes = argtypes

    def device(self, gpu: int) -> torch.device:
        import torch

        return torch.device("cpu")

    def set_device(self, gpu: int) -> None:
        self._local.device = gpu

    def thread_device(self) -> int | None:
        """The device the calling thread set with :meth:`set_device` (None: it set none)."""
        return getattr(self._local, "device", None)

    def mem_get_info(self, gpu: int) -> tuple[int, int]:
        """The host's available and total memory: the test driver's device memory is host memory."""
        found: dict[str, int] = {}
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    name, _, value = line.partition(":")
                    found[name] = int(value.split()[0]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        total = found.get("MemTotal") or os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return found.get("MemAvailable", total), total

    def new_event(self) -> _HostEvent:
        handle = ctypes.c_void_p()
        self._driver.cuEventCreate(ctypes.byref(handle), 0)
        return _HostEvent(int(handle.value or 0))

    def record(self, event: Any, stream: Any) -> None:
        self._driver.cuEventRecord(event.handle, stream.cuda_stream)

    def wait(self, stream: Any, event: Any) -> None:
        self._driver.cuStreamWaitEvent(stream.cuda_stream, event.handle, 0)

    def synchronize(self, event: Any) -> None:
        self._driver.cuEventSynchronize(event.handle)

    def new_stream(self, gpu: int) -> _HostStream:
        handle = ctypes.c_void_p()
        self._driver.cuStreamCreate(ctypes.byref(handle), 0)
        return _HostStream(int(handle.value or 0))

    def current_stream(self, gpu: int) -> _HostStream:
        """The calling thread's stream of GPU ``gpu``: the one :meth:`using` set, or one of the thread's own."""
        streams = self._streams()
        stream = streams.get(gpu)
        if stream is None:
            stream = streams[gpu] = self.new_stream(gpu)
        return stream

    @contextlib.contextmanager
    def using(self, gpu: int, stream: Any) -> Iterator[None]:
        """Make ``stream`` the calling thread's current stream of GPU ``gpu`` in the block (``torch.cuda.stream``'s part)."""
        streams = self._streams()
        previous = streams.get(gpu)
        streams[gpu] = stream
        try:
            yield
        finally:
            if previous is None:
                streams.pop(gpu, None)
            else:
                streams[gpu] = previous

    def _streams(self) -> dict[int, Any]:
        streams: dict[int, Any] | None = getattr(self._local, "streams", None)
        if streams is None:
            streams = self._local.streams = {}
        return streams

    def import_surface(self, frame: Any, stream: Any) -> torch.Tensor:
        # host_view without its dtype check (the decoder checks every frame's layout): once per frame.
        capsule = frame.__dlpack__(stream=stream.cuda_stream)
        ctypes.memmove(_capsule_pointer(capsule, b"dltensor") + _DEVICE_OFFSET, _CPU_DEVICE, 8)
        return _torch_from_dlpack()(capsule)


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
