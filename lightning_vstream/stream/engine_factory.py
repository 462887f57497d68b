"""Assemble a stream engine for a decode device: the device backend, decoder factory and loader."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

from lightning_vstream.errors import ConfigurationError
from lightning_vstream.index import VideoIndex
from lightning_vstream.stream.devices import CudaDevice, EngineDevice, HostDevice
from lightning_vstream.stream.engine import DecoderFactory, StreamEngine
from lightning_vstream.stream.engine_loader import (
    EngineLoader,
    nvdec_factory,
    pyav_factory,
)
from lightning_vstream.stream.loader import StreamSampler

__all__ = ["build_engine_loader"]


def build_engine_loader(
    index: VideoIndex,
    sampler: StreamSampler,
    device: str,
    *,
    threads: int | None = None,
    prefetch: int = 2,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    on_error: Literal["raise", "skip"] = "raise",
    timeout: float = 300.0,
    decoder_threads: int = 0,
    gpu_fallback: Literal["none", "cpu"] = "none",
    probe: bool = True,
) -> EngineLoader:
    """An :class:`EngineLoader` decoding ``index`` on ``device`` (``"cpu"`` or ``"cuda:N"``).

    On a GPU this runs the one-time NVDEC probe (unless ``probe=False``) and sizes the thread pool
    from the GPU's NVDEC engine count (``GetDecoderCaps``).

    Example::

        >>> loader = build_engine_loader(index, sampler, "cuda:0")  # doctest: +SKIP
    """
    target = torch.device(device)
    backend: EngineDevice
    factory: DecoderFactory
    if target.type == "cuda" and index.storage is not None:
        raise ConfigurationError(
            f"index {index.source!r} is remote: decoding remote files on the GPU is not supported yet; use "
            "decode_device='cpu'."
        )
    if target.type == "cuda":
        from lightning_vstream.decode.gpu import import_pynvvideocodec
        from lightning_vstream.decode.nvdec import num_decoder_engines, probe_nvdec

        gpu = target.index if target.index is not None else 0
        if probe:
            probe_nvdec(gpu)
        first = index.clips[0].cameras[0].info
        codec = first.codec if first is not None else "hevc"
        engines = num_decoder_engines(import_pynvvideocodec(), gpu, codec)
        backend = CudaDevice(gpu, engines=engines)
        factory = nvdec_factory(gpu, fallback=gpu_fallback, cpu_threads=decoder_threads)
    else:
        backend = HostDevice()
        factory = pyav_factory(threads=decoder_threads, storage=index.storage)
    engine = StreamEngine(
        index=index,
        sampler=sampler,
        device=backend,
        decoder_factory=factory,
        num_threads=threads,
        prefetch=prefetch,
        transform=transform,
        on_error=on_error,
        timeout=timeout,
    )
    if index.storage is not None:  # a remote index: the plan fetches ahead of the decode threads
        from lightning_vstream.stream.prefetch import PlanSpec, StreamPrefetcher

        engine.prefetcher = StreamPrefetcher(index, PlanSpec.of(sampler))
    return EngineLoader(engine)
