"""The loader face of the stream engine: what StreamVideoDataModule returns with decode threads.

:class:`EngineLoader` is a plain iterable (no DataLoader workers) with the same batches and the same
resumable state as :class:`~lightning_vstream.stream.loader.StreamDataLoader`; Lightning calls
``set_epoch`` on its ``sampler``. The decoder factories here choose the backend per camera stream:
NVDEC on the rank's GPU (:func:`nvdec_factory`), optionally falling back to the CPU for files NVDEC
cannot decode, or PyAV (:func:`pyav_factory`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from lightning_vstream.decode import make_decoder
from lightning_vstream.decode.base import FrameDecoder, VideoInfo
from lightning_vstream.decode.nvdec_file import LatencyChoice
from lightning_vstream.errors import ConfigurationError, DecoderCapabilityError
from lightning_vstream.storage.urls import is_url
from lightning_vstream.stream.engine import DecoderFactory, StreamEngine
from lightning_vstream.stream.failures import DecodeStats
from lightning_vstream.stream.resume import Skips, checked_resume_state, no_skips

if TYPE_CHECKING:
    from lightning_vstream.storage.options import StorageConfig

__all__ = ["EngineLoader", "GpuFallback", "nvdec_factory", "pyav_factory"]

log = logging.getLogger("lightning_vstream")
GpuFallback = Literal["none", "cpu"]


def pyav_factory(
    *,
    threads: int = 0,
    device: torch.device | str = "cpu",
    size: tuple[int, int] | None = None,
    storage: StorageConfig | None = None,
) -> DecoderFactory:
    """Decoders for the CPU (PyAV); frames are copied to ``device`` when it is not the CPU.

    ``size`` makes the decoders resize to ``(height, width)`` while they convert to RGB (see
    :meth:`FrameTransform.decoder_size <lightning_vstream.FrameTransform.decoder_size>`).

    Example::

        >>> make = pyav_factory(threads=1)
        >>> make  # doctest: +ELLIPSIS
        <function pyav_factory.<locals>.make at ...>
    """
    from lightning_vstream.decode.cpu import PyAVDecoder

    target = torch.device(device)

    def make(path: Path | str, info: VideoInfo | None, label: str) -> FrameDecoder:
        dec: FrameDecoder
        if isinstance(path, str) and is_url(path):  # a remote file: GOP reads (storage: the index's)
            dec = make_decoder(path, info=info, threads=threads, label=label, size=size, storage=storage)
        else:
            dec = PyAVDecoder(path, info=info, threads=threads, label=label, size=size)
        return dec if target.type == "cpu" else _CopyingDecoder(dec, target)

    return make


def nvdec_factory(
    gpu: int, *, fallback: GpuFallback = "none", cpu_threads: int = 0, latency: LatencyChoice = "native"
) -> DecoderFactory:
    """Decoders on NVDEC of GPU ``gpu``; with ``fallback="cpu"`` files NVDEC cannot decode use PyAV.

    Streaming reads every frame in order, so decoders keep NVDEC's ``NATIVE`` latency mode, which
    pipelines pictures (``LOW`` returns each frame sooner but stalls the engine between packets).
    Each decoder runs on the stream of the engine thread that opens it (``stream="current"``), so
    frames need no stream ordering of their own: the engine orders whole steps with one event per
    thread.

    Example::

        >>> make = nvdec_factory(0, fallback="cpu")  # doctest: +SKIP
    """
    if fallback not in ("none", "cpu"):
        raise ConfigurationError(f"gpu_fallback={fallback!r} is not supported; use 'none' or 'cpu'.")
    from lightning_vstream.decode.cpu import PyAVDecoder
    from lightning_vstream.decode.device import frame_memory
    from lightning_vstream.decode.gpu import NvDecoder

    target = frame_memory().device(gpu)  # the GPU (the CPU under a test driver's host memory)

    def make(path: Path | str, info: VideoInfo | None, label: str) -> FrameDecoder:
        dec = NvDecoder(path, info=info, device=gpu, label=label, latency=latency, stream="current")
        if fallback == "none":
            return dec
        return _FallbackDecoder(
            dec, lambda: _CopyingDecoder(PyAVDecoder(path, info=info, threads=cpu_threads, label=label), target)
        )

    return make


class _CopyingDecoder:
    """A CPU decoder whose frames are copied to ``device``."""

    def __init__(self, inner: Any, device: torch.device) -> None:
        self.inner = inner
        self.device = device
        self.path = inner.path

    @property
    def info(self) -> VideoInfo:
        return self.inner.info

    @property
    def position(self) -> int:
        return self.inner.position

    @property
    def frames_decoded(self) -> int:
        return self.inner.frames_decoded

    @property
    def seeks(self) -> int:
        return getattr(self.inner, "seeks", 0)

    def get(self, index: int, out: torch.Tensor | None = None) -> torch.Tensor:
        image = self.inner.get(index)
        if out is not None:
            out.copy_(image)
            return out
        return image.to(self.device)

    def read(self) -> torch.Tensor:
        return self.get(self.position)

    def seek(self, index: int) -> None:
        self.inner.seek(index)

    def close(self) -> None:
        self.inner.close()


class _FallbackDecoder(_CopyingDecoder):
    """NVDEC first; PyAV (frames copied to the GPU) once NVDEC refuses the file's format."""

    def __init__(self, gpu: Any, make_cpu: Any) -> None:
        super().__init__(gpu, gpu.device if hasattr(gpu, "gpu") else torch.device("cpu"))
        self._make_cpu = make_cpu
        self._on_gpu = True

    def get(self, index: int, out: torch.Tensor | None = None) -> torch.Tensor:
        if self._on_gpu:
            try:
                return self.inner.get(index, out=out)
            except DecoderCapabilityError as err:
                log.warning("decoding %s on the CPU (gpu_fallback='cpu'): %s", self.path, err)
                self.inner.close()
                self.inner = self._make_cpu()
                self._on_gpu = False
        return self.inner.get(index, out=out)


class EngineLoader:
    """Streaming batches from a :class:`~lightning_vstream.stream.engine.StreamEngine`, resumable mid-epoch.

    Batches are the dicts :class:`~lightning_vstream.stream.loader.StreamDataLoader` yields, with
    ``frames`` on the engine's device (with the engine's ``buffers="ring"``, views of its ring:
    see its docs). Its state has the format of the worker loader's, skips included, so a run
    resumed from any step delivers the batches the interrupted run would have delivered.

    Args:
        engine: The engine to run.

    Example::

        >>> loader = EngineLoader(engine)  # doctest: +SKIP
        >>> for batch in loader: ...  # doctest: +SKIP
    """

    def __init__(self, engine: StreamEngine) -> None:
        self.engine = engine
        self.sampler = engine.sampler
        #: Lightning inspects loaders' ``batch_sampler``; the sampler plans whole batches itself.
        self.batch_sampler = None
        self._yielded: tuple[int, int] | None = None
        self._consumed: tuple[int, int] | None = None
        self._resume: tuple[int, int] | None = None
        self._resume_skips: Skips = no_skips(engine.sampler.batch_size)

    def __len__(self) -> int:
        return len(self.sampler.schedule())

    def __iter__(self) -> Iterator[dict[str, Any]]:
        sampler = self.sampler
        start, skips = 0, no_skips(sampler.batch_size)
        if self._resume is not None and self._resume[0] == sampler.epoch:
            start, skips = self._resume[1], self._resume_skips
        for batch in self.engine.run(start, skips):
            self._yielded = (sampler.epoch, int(batch["step"]) + 1)
            yield batch
        self._resume = None

    def close(self) -> None:
        """Stop the decode threads of a run in progress."""
        self.engine.close()

    @property
    def stats(self) -> DecodeStats:
        """Decoding counters of this loader's engine (and, for a remote index, what reading it cost)."""
        stats = self.engine.stats
        if self.engine.prefetcher is not None:
            stats.remote = self.engine.prefetcher.fetcher.stats
        return stats

    # -- resumable state (the format of StreamDataLoader's) --------------------------------
    def mark_consumed(self, batch: dict[str, Any]) -> None:
        """Record that a loop which fetches batches ahead used ``batch`` (Lightning's loops need not)."""
        self._consumed = (int(batch["epoch"]), int(batch["step"]) + 1)

    def state_dict(self) -> dict[str, Any]:
        """Plain-dict position: the epoch, the first step not yet consumed, and the skips in force there.

        The format of :meth:`StreamDataLoader.state_dict <lightning_vstream.stream.loader.StreamDataLoader.state_dict>`.
        """
        sampler = self.sampler
        position = self._consumed or self._yielded or (sampler.epoch, self._resume[1] if self._resume else 0)
        return self.engine.history.state_dict(sampler, position)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the position of :meth:`state_dict`; the configuration must match."""
        epoch, step, skips = checked_resume_state(state, self.sampler)
        self._resume = (epoch, step)
        self._resume_skips = skips
        self.engine.history.begin(epoch, skips)
        self._consumed = self._yielded = None
        self.sampler.set_epoch(epoch)
