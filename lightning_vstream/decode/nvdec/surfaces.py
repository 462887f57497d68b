"""How NVDEC's decoded surfaces reach torch, and the device operations GPU threads need.

:class:`FrameMemory` is the seam between the GPU readers and the device: where decoded surfaces
live and how they become tensors (a ``DecodedFrame``'s DLPack capsule imported on a CUDA stream),
streams and events, a thread's device, and free memory. On a GPU (:class:`CudaMemory`) these are
torch's CUDA calls. Under a driver whose device memory *is* host memory (the fake NVIDIA driver the
test suite runs the real PyNvVideoCodec over, see ``docs/gpu.md``), :class:`HostMemory` views the
same CUDA-labelled capsules as CPU tensors, so everything from packet to batch runs without a GPU;
only the colour kernels then run on CPU tensors, and streams and events are the driver's own (so
its call log shows every wait). :func:`frame_memory` picks one (``VSTREAM_NVDEC_HOST_MEMORY=1``
selects host memory, for tests).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from lightning_vstream.errors import ConfigurationError, DecoderCapabilityError

if TYPE_CHECKING:
    import torch

__all__ = ["HOST_MEMORY_ENV", "CudaMemory", "FrameMemory", "HostMemory", "frame_memory", "host_view"]

#: Set to 1 to view NVDEC frames as host memory (:class:`HostMemory`); only for a test driver.
HOST_MEMORY_ENV = "VSTREAM_NVDEC_HOST_MEMORY"


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
            # Called holding the GIL, as torch's own stream and event calls are on a GPU (the test driver returns
            # at once from each; a GPU's event synchronisation, which can block, is only called when the event
            # is not done yet).
            self._driver = ctypes.PyDLL("libcuda.so.1")
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
