"""The stream engine as a loader: what StreamVideoDataModule returns with decode threads, and how it is built.

:class:`EngineLoader` is a plain iterable (no DataLoader workers) with the same batches and the same
resumable state as :class:`~lightning_vstream.stream.worker_loader.StreamDataLoader`; Lightning calls
``set_epoch`` on its ``sampler``. :func:`build_engine_loader` assembles one for a decode device: the
device backend (:mod:`lightning_vstream.stream.engine_device`), the decoder factory
(:mod:`lightning_vstream.decode.factory`) and the engine.
"""

from __future__ import annotations

import os

import torch

from lightning_vstream.decode.counters import DecodeStats
from lightning_vstream.decode.factory import DecoderFactory, nvdec_factory, pyav_factory
from lightning_vstream.errors import ConfigurationError
from lightning_vstream.index import VideoIndex
from lightning_vstream.options import (
    DEFAULT_GPU_OPTIONS,
    DecodeOptions,
    EngineOptions,
    ErrorOptions,
    GpuOptions,
    OutputOptions,
)
from lightning_vstream.stream.engine import StreamEngine
from lightning_vstream.stream.engine_device import EngineDevice, HostDevice, nvdec_engine_device, one_file_per_format
from lightning_vstream.stream.frame_steps import decoder_sizes
from lightning_vstream.stream.loader_shell import StreamLoaderShell
from lightning_vstream.stream.sampler import StreamSampler
from lightning_vstream.stream.schedule import PlanSpec
from lightning_vstream.stream.thread_executor import ThreadExecutor

__all__ = ["CPU_DECODER_THREADS", "EngineLoader", "build_engine_loader", "cpu_threads"]


class EngineLoader(StreamLoaderShell):
    """Streaming batches from a :class:`~lightning_vstream.stream.engine.StreamEngine` decoding with threads
    (:class:`~lightning_vstream.stream.thread_executor.ThreadExecutor`), resumable mid-epoch.

    Batches are the dicts :class:`~lightning_vstream.stream.worker_loader.StreamDataLoader` yields, with
    ``frames`` on the executor's device (with the executor's ``buffers="ring"``, views of its ring:
    see its docs). Its state has the format of the worker loader's, skips included, so a run
    resumed from any step delivers the batches the interrupted run would have delivered.

    Args:
        executor: The decode threads the loader's engine runs.

    Example::

        >>> loader = EngineLoader(ThreadExecutor(index=index, sampler=sampler, device=HostDevice()))  # doctest: +SKIP
        >>> for batch in loader: ...  # doctest: +SKIP
    """

    def __init__(self, executor: ThreadExecutor) -> None:
        #: The decode threads (their device, ring and thread count).
        self.executor = executor
        #: The one stream engine, decoding with ``executor``.
        self.engine = StreamEngine(executor)
        self.sampler = executor.sampler
        #: Lightning inspects loaders' ``batch_sampler``; the sampler plans whole batches itself.
        self.batch_sampler = None

    def close(self) -> None:
        """Stop the decode threads of a run in progress."""
        self.engine.close()

    @property
    def stats(self) -> DecodeStats:
        """Decoding counters of this loader's engine (and, for a remote index, what reading it cost)."""
        stats = self.engine.stats
        prefetcher = self.executor.prefetcher
        if prefetcher is not None:
            stats.remote = prefetcher.fetcher.stats
        return stats

    def _follow_plan(self) -> None:
        prefetcher = self.executor.prefetcher
        if prefetcher is not None:  # a resume on another world size continues on another plan
            prefetcher.follow(PlanSpec.of(self.sampler, prefetcher.index))


#: FFmpeg threads per decoder of the engine on the CPU when ``decoder_threads=0``.
CPU_DECODER_THREADS = 1


def cpu_threads() -> int:
    """Decode threads for the engine on the CPU: one per core this process may run on (``os.sched_getaffinity``).

    Example::

        >>> cpu_threads() >= 1
        True
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def build_engine_loader(
    index: VideoIndex,
    sampler: StreamSampler,
    device: str,
    *,
    decode: DecodeOptions | None = None,
    output: OutputOptions | None = None,
    errors: ErrorOptions | None = None,
    engine: EngineOptions | None = None,
    gpu: GpuOptions = DEFAULT_GPU_OPTIONS,
    seed: int = 0,
) -> EngineLoader:
    """An :class:`EngineLoader` decoding ``index`` on ``device`` (``"cpu"`` or ``"cuda:N"``).

    On a GPU this runs the one-time NVDEC probe (unless ``gpu.probe`` is False), sizes the thread pool
    from the GPU's NVDEC engine count (``GetDecoderCaps``), checks that the decoders fit in the GPU's
    free memory (:func:`~lightning_vstream.decode.nvdec.memory.check_nvdec_memory`: a
    :class:`~lightning_vstream.errors.GpuMemoryError` names what to lower), compiles and checks the
    colour kernel (:func:`~lightning_vstream.decode.nvdec.nv12.prepare_conversion`), all on the calling
    thread, and has each decode thread create its decoders for every format of the index before the
    first step; batches are views of a ring in GPU memory (one ring per output). On the CPU the thread pool has one thread per core available
    (:func:`cpu_threads`), each PyAV decoder uses ``decode.decoder_threads`` FFmpeg threads
    (:data:`CPU_DECODER_THREADS` for 0), decoders resize while converting for every output whose
    transform is a resizing :class:`~lightning_vstream.FrameTransform` (see
    :func:`~lightning_vstream.stream.frame_steps.decoder_sizes`), and every batch is memory of its own
    until the caller drops it. ``engine`` gives the decode threads (``threads``), the steps decoded ahead
    (``prefetch_factor``) and pinned pool batches (``pin_memory``); the rest of it chooses between engines.

    Example::

        >>> loader = build_engine_loader(index, sampler, "cuda:0")  # doctest: +SKIP
    """
    decode = decode or DecodeOptions()
    output = output or OutputOptions()
    engine = engine or EngineOptions()
    threads = engine.threads
    target = torch.device(device)
    backend: EngineDevice
    factory: DecoderFactory
    resize = None
    if target.type == "cuda" and index.storage is not None:
        raise ConfigurationError(
            f"index {index.source!r} is remote: decoding remote files on the GPU is not supported yet; use "
            "decode.device='cpu'."
        )
    if target.type == "cuda":
        from lightning_vstream.decode.device import frame_memory
        from lightning_vstream.decode.nvdec.memory import DEFAULT_HEADROOM, check_nvdec_memory
        from lightning_vstream.decode.nvdec.nv12 import prepare_conversion
        from lightning_vstream.decode.nvdec.session import num_decoder_engines, probe_nvdec

        ordinal = target.index if target.index is not None else 0
        if gpu.probe:
            probe_nvdec(ordinal)
        first = index.clips[0].cameras[0].info
        codec = first.codec if first is not None else "hevc"
        engines = num_decoder_engines(ordinal, codec)
        rows = sampler.batch_size * sampler.num_cameras
        workers = max(1, min(threads or 2 * engines, rows))
        per_thread = -(-rows // workers)
        formats = one_file_per_format(index)
        memory = frame_memory()
        check_nvdec_memory(
            ordinal,
            [(info, workers * per_thread) for _, info in formats],
            memory=memory,
            lower="engine.threads, batch_size or the cameras per step",
            headroom=0 if memory.host else DEFAULT_HEADROOM,
        )
        prepare_conversion(memory.device(ordinal))
        backend = nvdec_engine_device(ordinal, engines=engines, prepare=formats, streams_per_thread=per_thread)
        factory = nvdec_factory(ordinal, fallback=gpu.fallback, cpu_threads=decode.decoder_threads)
    else:
        backend = HostDevice(threads=cpu_threads())
        resize, _ = decoder_sizes(
            output.transform, output.outputs, output.augment
        )  # swscale resizes while it converts to RGB
        # The engine's threads are the parallelism: FFmpeg's own threads per decoder (0: about one
        # per core each) oversubscribe the cores and delay frames (measured slower, and more memory).
        factory = pyav_factory(
            threads=decode.decoder_threads or CPU_DECODER_THREADS, size=resize, storage=index.storage
        )
    threads_executor = ThreadExecutor(
        index=index,
        sampler=sampler,
        device=backend,
        decoder_factory=factory,
        decode=decode,
        output=output,
        errors=errors,
        seed=seed,
        num_threads=threads,
        prefetch=engine.prefetch_factor,
        decoder_resizes=target.type == "cpu",
        buffers="ring" if target.type == "cuda" else "pool",
        pin_memory=engine.pin_memory,
    )
    if index.storage is not None:  # a remote index: the plan fetches ahead of the decode threads
        from lightning_vstream.stream.prefetch import StreamPrefetcher

        threads_executor.prefetcher = StreamPrefetcher(index, PlanSpec.of(sampler, index))
    return EngineLoader(threads_executor)
