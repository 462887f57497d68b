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
from lightning_vstream.decode.gpu import LatencyChoice
from lightning_vstream.errors import ConfigurationError, DecoderCapabilityError
from lightning_vstream.storage.urls import is_url
from lightning_vstream.stream.engine import DecoderFactory, StreamEngine
from lightning_vstream.stream.loader import STATE_VERSION, checked_resume_state, resume_config
from lightning_vstream.stream.worker import DecodeStats

if TYPE_CHECKING:
    from lightning_vstream.storage.options import StorageConfig

__all__ = ["EngineLoader", "GpuFallback", "nvdec_factory", "pyav_factory"]

log = logging.getLogger("lightning_vstream")
GpuFallback = Literal["none", "cpu"]


def pyav_factory(
    *, threads: int = 0, device: torch.device | str = "cpu", storage: StorageConfig | None = None
) -> DecoderFactory:
    """Decoders for the CPU (PyAV); frames are copied to ``device`` when it is not the CPU.

    Example::

        >>> make = pyav_factory(threads=1)
        >>> make  # doctest: +ELLIPSIS
        <function pyav_factory.<locals>.make at ...>
    """
    from lightning_vstream.decode.cpu import PyAVDecoder

    target = torch.device(device)

    def make(path: Path | str, info: VideoInfo | None, label: str) -> FrameDecoder:
        if isinstance(path, str) and is_url(path):  # a remote file: GOP reads (storage: the index's)
            return make_decoder(path, info=info, threads=threads, label=label, storage=storage)
        dec = PyAVDecoder(path, info=info, threads=threads, label=label)
        return dec if target.type == "cpu" else _CopyingDecoder(dec, target)

    return make


def nvdec_factory(
    gpu: int, *, fallback: GpuFallback = "none", cpu_threads: int = 0, latency: LatencyChoice = "native"
) -> DecoderFactory:
    """Decoders on NVDEC of GPU ``gpu``; with ``fallback="cpu"`` files NVDEC cannot decode use PyAV.

    Streaming reads every frame in order, so decoders keep NVDEC's ``NATIVE`` latency mode, which
    pipelines pictures (``LOW`` returns each frame sooner but stalls the engine between packets).

    Example::

        >>> make = nvdec_factory(0, fallback="cpu")  # doctest: +SKIP
    """
    if fallback not in ("none", "cpu"):
        raise ConfigurationError(f"gpu_fallback={fallback!r} is not supported; use 'none' or 'cpu'.")
    from lightning_vstream.decode.cpu import PyAVDecoder
    from lightning_vstream.decode.gpu import NvDecoder

    target = torch.device("cuda", gpu)

    def make(path: Path | str, info: VideoInfo | None, label: str) -> FrameDecoder:
        dec = NvDecoder(path, info=info, device=gpu, label=label, latency=latency)
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
    ``frames`` on the engine's device; they are views of the engine's ring (see its docs).

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
        self._resume_shifts: list[int] = []

    def __len__(self) -> int:
        return len(self.sampler.schedule())

    def __iter__(self) -> Iterator[dict[str, Any]]:
        sampler = self.sampler
        start = 0
        if self._resume is not None and self._resume[0] == sampler.epoch:
            start = self._resume[1]
            sampler.shifts = list(self._resume_shifts)
        elif start == 0:
            sampler.shifts = [0] * sampler.batch_size
        self._resume = None
        for batch in self.engine.run(start):
            self._yielded = (sampler.epoch, int(batch["step"]) + 1)
            yield batch

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
        """Record that the training loop used ``batch`` (the DataModule calls this)."""
        self._consumed = (int(batch["epoch"]), int(batch["step"]) + 1)

    def state_dict(self) -> dict[str, Any]:
        """Plain-dict position: the epoch and the first step not yet consumed."""
        sampler = self.sampler
        position = self._consumed or self._yielded or (sampler.epoch, self._resume[1] if self._resume else 0)
        epoch, step = position
        log_ = self.engine.shift_log
        shifts = log_.get(step, sampler.shifts) if epoch == sampler.epoch else [0] * sampler.batch_size
        if step >= len(sampler.schedule(epoch)):
            epoch, step, shifts = epoch + 1, 0, [0] * sampler.batch_size
        return {
            "version": STATE_VERSION,
            "epoch": epoch,
            "step": step,
            "shifts": list(shifts),
            **resume_config(sampler),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the position of :meth:`state_dict`; the configuration must match."""
        sampler = self.sampler
        epoch, step, shifts = checked_resume_state(state, sampler)
        self._resume = (epoch, step)
        self._resume_shifts = shifts
        self._consumed = self._yielded = None
        sampler.set_epoch(self._resume[0])
