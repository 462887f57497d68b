"""Where the stream engine keeps its batches and how it orders work: CUDA streams and events, or the host.

The engine (:mod:`lightning_vstream.stream.engine`) talks to a small :class:`EngineDevice`
interface, so the same threading, ring and ordering code runs on a GPU with CUDA streams and
events and on the CPU (tests, CPU decoding) where every operation completes before it returns.

On CUDA nothing here blocks the host: :meth:`EngineDevice.record` enqueues an event on a stream
and :meth:`EngineDevice.wait` makes a stream wait for one (``cudaStreamWaitEvent``).

A device can carry a ``prepare`` hook that each decode thread runs once, on its own stream, when it
starts (:meth:`EngineDevice.use`): NVDEC decoders are created there, before the first step, and the
GPU's free memory is checked against a headroom (see :func:`nvdec_engine_device`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

__all__ = ["CudaDevice", "EngineDevice", "HostDevice", "nvdec_engine_device", "one_file_per_format"]

log = logging.getLogger("lightning_vstream")
#: GPU memory left free after the decoders are created, below which a warning says what to change.
DEFAULT_HEADROOM = 2 << 30


class _Prepared:
    """Runs a ``prepare`` hook once in each thread that asks."""

    def __init__(self, prepare: Callable[[], None] | None) -> None:
        self.prepare = prepare
        self._local = threading.local()

    def __call__(self) -> None:
        if self.prepare is not None and not getattr(self._local, "done", False):
            self._local.done = True
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
        self._prepare()
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
            self._prepare()
            yield

    def new_event(self) -> torch.cuda.Event:
        return torch.cuda.Event()

    def record(self, event: Any, stream: Any | None = None) -> None:
        event.record(stream if stream is not None else torch.cuda.current_stream(self.index))

    def wait(self, event: Any, stream: Any | None = None) -> None:
        (stream if stream is not None else torch.cuda.current_stream(self.index)).wait_event(event)

    def default_threads(self) -> int:
        return 2 * max(1, self.engines)


def nvdec_engine_device(
    gpu: int,
    *,
    engines: int = 1,
    prepare: list[tuple[Any, Any]] | None = None,
    streams_per_thread: int = 1,
    headroom: int = DEFAULT_HEADROOM,
) -> EngineDevice:
    """The engine device for NVDEC decoding on GPU ``gpu``, with its decoders created before the first step.

    :class:`CudaDevice`, or :class:`HostDevice` when NVDEC's frames live in host memory (a test
    driver, see :class:`~lightning_vstream.decode.device.HostMemory`), with as many threads as on
    the GPU. With ``prepare`` (one ``(path, frame table)`` per format the rank reads), each decode
    thread creates ``streams_per_thread`` decoders per format on its own stream when it starts
    (:func:`~lightning_vstream.decode.gpu.prepare_decoders`), so NVDEC allocates its surfaces before
    training does, not at a clip switch hours later; then, on a GPU, a warning names what to change
    when less than ``headroom`` bytes of GPU memory are left free.

    Example::

        >>> nvdec_engine_device(0, engines=7).default_threads()  # doctest: +SKIP
        14
    """
    from lightning_vstream.decode.device import frame_memory

    host = frame_memory().host
    hook = None
    if prepare:
        files = list(prepare)

        def hook() -> None:
            from lightning_vstream.decode.gpu import prepare_decoders

            created = prepare_decoders(files, streams_per_thread, gpu=gpu)
            if not host:
                _check_headroom(gpu, headroom, created)

    if host:
        return HostDevice(threads=2 * max(1, engines), prepare=hook)
    return CudaDevice(gpu, engines=engines, prepare=hook)


def _check_headroom(gpu: int, headroom: int, created: int) -> None:
    free, total = torch.cuda.mem_get_info(gpu)
    if free < headroom:
        log.warning(
            "GPU %d has %.1f GiB of %.1f GiB free after creating %d NVDEC decoders (wanted at least %.1f GiB): "
            "NVDEC allocates outside torch's allocator and running out there ends the process. Use fewer "
            "engine_threads or cameras per step, a smaller prefetch_factor, or free memory before fitting.",
            gpu,
            free / 2**30,
            total / 2**30,
            created,
            headroom / 2**30,
        )


def one_file_per_format(index: Any) -> list[tuple[Any, Any]]:
    """One camera file, with its frame table, per (codec, width, height) among an index's clips."""
    seen: dict[tuple[str, int, int], tuple[Any, Any]] = {}
    for clip in index.clips:
        for camera in clip.cameras:
            info = camera.info
            if info is None or getattr(camera.path, "is_dir", lambda: False)():
                continue
            seen.setdefault((info.codec, info.width, info.height), (camera.path, info))
    return list(seen.values())
