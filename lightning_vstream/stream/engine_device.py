"""Where the stream engine keeps its batches and how it orders work: CUDA streams and events, or the host.

The engine (:mod:`lightning_vstream.stream.engine`) talks to a small :class:`EngineDevice`
interface, so the same threading, ring and ordering code runs on a GPU with CUDA streams and
events and on the CPU (tests, CPU decoding) where every operation completes before it returns.

On CUDA :meth:`EngineDevice.record` enqueues an event on a stream and :meth:`EngineDevice.wait`
makes a stream wait for one (``cudaStreamWaitEvent``): the consumer's stream waits for the decode
threads' events. The decode threads' own streams, on which NVDEC copies its frames out, never wait
for an event of the consumer's: a thread that reuses a batch waits for its release on the host
(:meth:`EngineDevice.synchronize`, which releases the GIL), so a slow training step can delay
decoding but never leave NVDEC's copies queued behind it.

A device can carry a ``prepare`` hook that each decode thread runs once, on its own stream, when it
starts (:meth:`EngineDevice.use`): NVDEC decoders are created there, before the first step (see
:func:`nvdec_engine_device`). Every decode thread sets its device before anything else.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from lightning_vstream.decode.nvdec.memory import one_file_per_format

__all__ = ["CudaDevice", "EngineDevice", "HostDevice", "HostNvdecDevice", "nvdec_engine_device", "one_file_per_format"]


class _Prepared:
    """Runs a ``prepare`` hook once per stream of work, in the first thread that asks for that stream.

    Decoders are kept (by the stream they run on) between epochs, and the engine's decode threads
    of every epoch use the same streams: preparing once per stream, not once per thread, spares
    later epochs from opening every file again.
    """

    def __init__(self, prepare: Callable[[], None] | None) -> None:
        self.prepare = prepare
        self._done: dict[int, Any] = {}  # id(stream) -> stream (kept, so the id stays its own)
        self._lock = threading.Lock()

    def __call__(self, stream: Any = None) -> None:
        if self.prepare is None:
            return
        with self._lock:
            if id(stream) in self._done:
                return
            self._done[id(stream)] = stream
        self.prepare()


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

    def synchronize(self, event: Any) -> None:
        """Wait on the host until ``event`` has completed (the GIL released meanwhile)."""
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

    def __init__(self, *, threads: int = 4, prepare: Callable[[], None] | None = None) -> None:
        self._threads = threads
        self._prepare = _Prepared(prepare)

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cpu")

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype)

    def new_stream(self) -> None:
        return None

    @contextlib.contextmanager
    def use(self, stream: Any) -> Iterator[None]:
        self._prepare(stream)
        yield

    def new_event(self) -> None:
        return None

    def record(self, event: Any, stream: Any | None = None) -> None:
        return None

    def wait(self, event: Any, stream: Any | None = None) -> None:
        return None

    def synchronize(self, event: Any) -> None:
        return None

    def default_threads(self) -> int:
        return self._threads


class CudaDevice:
    """One GPU: ring batches in its memory, a CUDA stream per decode thread, CUDA events between them.

    Args:
        index: GPU ordinal (this rank's GPU).
        engines: NVDEC engines on the GPU; the default thread count is twice this.
        prepare: Run once by each decode thread, on its stream, when it starts.

    Example::

        >>> dev = CudaDevice(0, engines=7)  # doctest: +SKIP
        >>> dev.default_threads()  # doctest: +SKIP
        14
    """

    def __init__(self, index: int, *, engines: int = 1, prepare: Callable[[], None] | None = None) -> None:
        self.index = index
        self.engines = engines
        self._prepare = _Prepared(prepare)

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda", self.index)

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=self.torch_device)

    def new_stream(self) -> torch.cuda.Stream:
        return torch.cuda.Stream(device=self.index)

    @contextlib.contextmanager
    def use(self, stream: Any) -> Iterator[None]:
        torch.cuda.set_device(self.index)  # per thread: the decoder threads start on device 0 otherwise
        with torch.cuda.stream(stream):
            self._prepare(stream)
            yield

    def new_event(self) -> torch.cuda.Event:
        return torch.cuda.Event(blocking=True)  # a host wait sleeps instead of spinning a core

    def record(self, event: Any, stream: Any | None = None) -> None:
        event.record(stream if stream is not None else torch.cuda.current_stream(self.index))

    def wait(self, event: Any, stream: Any | None = None) -> None:
        (stream if stream is not None else torch.cuda.current_stream(self.index)).wait_event(event)

    def synchronize(self, event: Any) -> None:
        if not event.query():  # most often done already: no call that sleeps
            event.synchronize()

    def default_threads(self) -> int:
        return 2 * max(1, self.engines)


class HostNvdecDevice(HostDevice):
    """:class:`HostDevice` for NVDEC under a driver whose device memory is host memory (a test driver).

    As on a GPU, each decode thread gets a stream of the driver of its own, kept for the engine's
    life and made the thread's current stream while it decodes, so its decoders are created on it
    and reused from one epoch to the next, and sets its device; events are the driver's, recorded,
    waited for and synchronised through it, so the driver's call log shows every wait the engine
    asks for (see :class:`~lightning_vstream.decode.device.HostMemory`). Batches are host memory.

    Example::

        >>> device = HostNvdecDevice(HostMemory(), 0)  # doctest: +SKIP
        >>> device.new_stream().cuda_stream != 0  # doctest: +SKIP
        True
    """

    def __init__(self, memory: Any, gpu: int, *, threads: int = 4, prepare: Callable[[], None] | None = None) -> None:
        super().__init__(threads=threads, prepare=prepare)
        self.memory = memory
        self.gpu = gpu

    def new_stream(self) -> Any:
        return self.memory.new_stream(self.gpu)

    @contextlib.contextmanager
    def use(self, stream: Any) -> Iterator[None]:
        self.memory.set_device(self.gpu)
        with self.memory.using(self.gpu, stream):
            self._prepare(stream)
            yield

    def new_event(self) -> Any:
        return self.memory.new_event()

    def record(self, event: Any, stream: Any | None = None) -> None:
        self.memory.record(event, stream if stream is not None else self.memory.current_stream(self.gpu))

    def wait(self, event: Any, stream: Any | None = None) -> None:
        self.memory.wait(stream if stream is not None else self.memory.current_stream(self.gpu), event)

    def synchronize(self, event: Any) -> None:
        self.memory.synchronize(event)


def nvdec_engine_device(
    gpu: int,
    *,
    engines: int = 1,
    prepare: list[tuple[Any, Any]] | None = None,
    streams_per_thread: int = 1,
) -> EngineDevice:
    """The engine device for NVDEC decoding on GPU ``gpu``, with its decoders created before the first step.

    :class:`CudaDevice`, or :class:`HostNvdecDevice` when NVDEC's frames live in host memory (a test
    driver, see :class:`~lightning_vstream.decode.device.HostMemory`), with as many threads as on
    the GPU. With ``prepare`` (one ``(path, frame table)`` per format the rank reads), each decode
    thread creates ``streams_per_thread`` decoders per format on its own stream when it starts
    (:func:`~lightning_vstream.decode.nvdec.memory.prepare_decoders`), so NVDEC allocates its surfaces before
    training does, not at a clip switch hours later (whether they fit is checked before, see
    :func:`~lightning_vstream.decode.nvdec.memory.check_nvdec_memory`).

    Example::

        >>> nvdec_engine_device(0, engines=7).default_threads()  # doctest: +SKIP
        14
    """
    from lightning_vstream.decode.device import frame_memory

    memory = frame_memory()
    host = memory.host
    hook = None
    if prepare:
        files = list(prepare)

        def hook() -> None:
            from lightning_vstream.decode.nvdec.memory import prepare_decoders

            prepare_decoders(files, streams_per_thread, gpu=gpu)

    if host:
        return HostNvdecDevice(memory, gpu, threads=2 * max(1, engines), prepare=hook)
    return CudaDevice(gpu, engines=engines, prepare=hook)
