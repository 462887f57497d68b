"""Where the stream engine keeps its batches and how it orders work: CUDA streams and events, or the host.

The engine (:mod:`lightning_vstream.stream.engine`) talks to a small :class:`EngineDevice`
interface, so the same threading, ring and ordering code runs on a GPU with CUDA streams and
events and on the CPU (tests, CPU decoding) where every operation completes before it returns.

On CUDA nothing here blocks the host: :meth:`EngineDevice.record` enqueues an event on a stream
and :meth:`EngineDevice.wait` makes a stream wait for one (``cudaStreamWaitEvent``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

import torch

__all__ = ["CudaDevice", "EngineDevice", "HostDevice", "nvdec_engine_device"]


class EngineDevice(Protocol):
    """Buffers, streams and events for the stream engine."""

    @property
    def torch_device(self) -> torch.device:
        """The device batches live on."""
        ...

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor for a ring batch."""
        ...

    def new_stream(self) -> Any:
        """A stream of work, owned by one decode thread."""
        ...

    def use(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        """Make ``stream`` current in this thread for the duration of the block."""
        ...

    def new_event(self) -> Any:
        """An event that can be recorded and waited for."""
        ...

    def record(self, event: Any, stream: Any | None = None) -> None:
        """Record ``event`` on ``stream`` (the current stream when None)."""
        ...

    def wait(self, event: Any, stream: Any | None = None) -> None:
        """Make ``stream`` (the current stream when None) wait for ``event`` without blocking the host."""
        ...

    def default_threads(self) -> int:
        """Decode threads to use when the user does not say."""
        ...


class HostDevice:
    """CPU tensors; work finishes before the call returns, so streams and events have nothing to order.

    Example::

        >>> HostDevice().empty((2, 3), torch.uint8).device
        device(type='cpu')
    """

    def __init__(self, *, threads: int = 4) -> None:
        self._threads = threads

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cpu")

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype)

    def new_stream(self) -> None:
        return None

    @contextlib.contextmanager
    def use(self, stream: Any) -> Iterator[None]:
        yield

    def new_event(self) -> None:
        return None

    def record(self, event: Any, stream: Any | None = None) -> None:
        return None

    def wait(self, event: Any, stream: Any | None = None) -> None:
        return None

    def default_threads(self) -> int:
        return self._threads


class CudaDevice:
    """One GPU: ring batches in its memory, a CUDA stream per decode thread, CUDA events between them.

    Args:
        index: GPU ordinal (this rank's GPU).
        engines: NVDEC engines on the GPU; the default thread count is twice this.

    Example::

        >>> dev = CudaDevice(0, engines=7)  # doctest: +SKIP
        >>> dev.default_threads()  # doctest: +SKIP
        14
    """

    def __init__(self, index: int, *, engines: int = 1) -> None:
        self.index = index
        self.engines = engines

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda", self.index)

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=self.torch_device)

    def new_stream(self) -> torch.cuda.Stream:
        return torch.cuda.Stream(device=self.index)

    def use(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        torch.cuda.set_device(self.index)  # per thread: the decoder threads start on device 0 otherwise
        return torch.cuda.stream(stream)

    def new_event(self) -> torch.cuda.Event:
        return torch.cuda.Event()

    def record(self, event: Any, stream: Any | None = None) -> None:
        event.record(stream if stream is not None else torch.cuda.current_stream(self.index))

    def wait(self, event: Any, stream: Any | None = None) -> None:
        (stream if stream is not None else torch.cuda.current_stream(self.index)).wait_event(event)

    def default_threads(self) -> int:
        return 2 * max(1, self.engines)


def nvdec_engine_device(gpu: int, *, engines: int = 1) -> EngineDevice:
    """The engine device for NVDEC decoding on GPU ``gpu``: :class:`CudaDevice`, or :class:`HostDevice`
    when NVDEC's frames live in host memory (a test driver, see
    :class:`~lightning_vstream.decode.device.HostMemory`), with as many threads as on the GPU.

    Example::

        >>> nvdec_engine_device(0, engines=7).default_threads()  # doctest: +SKIP
        14
    """
    from lightning_vstream.decode.device import frame_memory

    if frame_memory().host:
        return HostDevice(threads=2 * max(1, engines))
    return CudaDevice(gpu, engines=engines)
