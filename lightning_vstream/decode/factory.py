"""How a decoder for a camera stream is chosen and made: a video file or folder of images, local or remote, CPU or GPU.

:func:`make_decoder` picks the backend for one file (PyAV on the CPU, NVDEC on a GPU, images, GOP
reads for a remote file whose frame tables record packet places). The stream engine's threads take
their decoders from a :data:`DecoderFactory` instead, ``(path, info, label) -> decoder``:
:func:`pyav_factory` on the CPU and :func:`nvdec_factory` on a GPU (optionally falling back to PyAV
for files NVDEC cannot decode). A reader keeps the decoders it opened in a
:class:`~lightning_vstream.decode.decoder_table.DecoderTable`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lightning_vstream.decode.base import FrameDecoder, Layout, VideoInfo
from lightning_vstream.errors import ConfigurationError, DecoderCapabilityError
from lightning_vstream.storage.urls import is_url

if TYPE_CHECKING:
    import torch

    from lightning_vstream.decode.nvdec.decoder import LatencyChoice
    from lightning_vstream.storage.config import StorageConfig

__all__ = [
    "DecoderFactory",
    "GpuFallback",
    "announce_stride",
    "make_decoder",
    "nvdec_factory",
    "pyav_factory",
]

log = logging.getLogger("lightning_vstream")
#: ``(path, frame table or None, label) -> decoder`` of one camera stream.
DecoderFactory = Callable[["Path | str", "VideoInfo | None", str], FrameDecoder]
GpuFallback = Literal["none", "cpu"]


def make_decoder(
    path: Path | str,
    *,
    info: VideoInfo | None = None,
    layout: Layout = "chw",
    threads: int = 0,
    label: str = "",
    device: str = "cpu",
    stream: int | None = None,
    size: tuple[int, int] | None = None,
    storage: StorageConfig | None = None,
) -> FrameDecoder:
    """Create the decoder for a camera stream: a video file or a folder of images.

    Videos decode with PyAV when ``device`` is ``"cpu"`` and with NVDEC (PyNvVideoCodec) when it
    is a CUDA device such as ``"cuda:0"``; image folders always decode on the CPU. Nothing is
    opened until the first frame is requested.

    Args:
        path: Video file or image folder.
        info: Frame table if already known (from index metadata).
        layout: ``"chw"`` or ``"hwc"``.
        threads: FFmpeg threads for video files (0 lets FFmpeg choose).
        label: Clip and camera, for error messages.
        device: ``"cpu"`` or a CUDA device for video files.
        stream: Video stream to decode on the CPU: its position among the file's video streams,
            or None for FFmpeg's best one.
        size: Output ``(height, width)`` for video files decoded on the CPU, resized while the
            frame is converted to RGB. Other backends return frames at their own size (check
            the frames' shape, or resize them afterwards).
        storage: How to reach a URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``file://``...):
            options, node cache. A URL whose frame table records packet byte ranges is read GOP by
            GOP (:class:`~lightning_vstream.decode.ranged.gop_reads.GopDecoder`); any other through its
            container. Plain paths are opened with PyAV as they are (faster on a local disk).

    Example::

        >>> dec = make_decoder("clip/CAM_FRONT.mp4")  # doctest: +SKIP
        >>> dec.get(5).shape  # doctest: +SKIP
        torch.Size([3, 48, 64])
    """
    if is_url(path):
        return _url_decoder(str(path), info, layout, threads, label, device, stream, size, storage)
    path = Path(path)
    if path.is_dir():
        from lightning_vstream.decode.images import ImageFolderDecoder

        return ImageFolderDecoder(path, info=info, layout=layout, label=label)
    if device != "cpu":
        from lightning_vstream.decode.nvdec.decoder import NvDecoder

        return NvDecoder(path, info=info, device=device, layout=layout, label=label)
    from lightning_vstream.decode.cpu.pyav import PyAVDecoder

    return PyAVDecoder(path, info=info, layout=layout, threads=threads, label=label, stream=stream, size=size)


def _url_decoder(
    url: str,
    info: VideoInfo | None,
    layout: Layout,
    threads: int,
    label: str,
    device: str,
    stream: int | None,
    size: tuple[int, int] | None,
    storage: StorageConfig | None,
) -> FrameDecoder:
    from lightning_vstream.decode.cpu.pyav import PyAVDecoder
    from lightning_vstream.decode.ranged.gop_reads import GopDecoder
    from lightning_vstream.decode.ranged.range_file import RangeFile, expect_of
    from lightning_vstream.storage.client import Expect, storage_for
    from lightning_vstream.storage.config import StorageConfig
    from lightning_vstream.storage.fetcher import fetcher_for

    if device != "cpu":
        raise ConfigurationError(
            f"{url!r}{f' ({label})' if label else ''}: decoding remote files on {device!r} is not supported yet; "
            "use decode.device='cpu' (remote files are read GOP by GOP and decoded with PyAV)."
        )
    config = storage if storage is not None else StorageConfig()
    if info is not None and info.layout is not None and stream is None:
        return GopDecoder(
            url, info=info, fetcher=fetcher_for(config), layout=layout, threads=threads, label=label, size=size
        )
    expect = expect_of(info) if info is not None else Expect()
    client = storage_for(config)
    return PyAVDecoder(
        url,
        info=info,
        layout=layout,
        threads=threads,
        label=label,
        stream=stream,
        size=size,
        source=lambda: RangeFile(client, url, expect),
    )


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
    import torch

    from lightning_vstream.decode.cpu.pyav import PyAVDecoder

    target = torch.device(device)

    def make(path: Path | str, info: VideoInfo | None, label: str) -> FrameDecoder:
        dec: FrameDecoder
        if isinstance(path, str) and is_url(path):  # a remote file: GOP reads (storage: the index's)
            dec = make_decoder(path, info=info, threads=threads, label=label, size=size, storage=storage)
        elif Path(path).is_dir():  # an image-folder camera: decoded on the CPU as make_decoder does
            from lightning_vstream.decode.images import ImageFolderDecoder

            dec = ImageFolderDecoder(Path(path), info=info, label=label)
        else:
            dec = PyAVDecoder(path, info=info, threads=threads, label=label, size=size)
        return dec if target.type == "cpu" else _CopyingDecoder(dec, target)

    return make


def nvdec_factory(
    gpu: int, *, fallback: GpuFallback = "none", cpu_threads: int = 0, latency: LatencyChoice = "native"
) -> DecoderFactory:
    """Decoders on NVDEC of GPU ``gpu``; with ``fallback="cpu"`` files NVDEC cannot decode use PyAV.

    ``fallback`` is :attr:`GpuOptions.fallback <lightning_vstream.GpuOptions>`, checked there.

    Streaming reads every frame in order, so decoders keep NVDEC's ``NATIVE`` latency mode, which
    pipelines pictures (``LOW`` returns each frame sooner but stalls the engine between packets).
    Each decoder runs on the stream of the engine thread that opens it (``stream="current"``), so
    frames need no stream ordering of their own: the engine orders whole steps with one event per
    thread.

    Example::

        >>> make = nvdec_factory(0, fallback="cpu")  # doctest: +SKIP
    """
    from lightning_vstream.decode.cpu.pyav import PyAVDecoder
    from lightning_vstream.decode.device import frame_memory
    from lightning_vstream.decode.nvdec.decoder import NvDecoder

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


def announce_stride(decoder: Any, first: int, stride: int) -> Any:
    """Tell a stream's new ``decoder`` that its reads go every ``stride``-th frame from ``first``; returns it.

    Its non-reference pictures off the stride are then left out from the first read on
    (:meth:`~lightning_vstream.decode.base.DecoderBase.expect`), rather than from the third, when the
    decoder would have learnt the stride from its reads. Decoders without ``expect`` are returned as
    they are.

    Example::

        >>> dec = announce_stride(make_decoder("clip/CAM_FRONT.mp4"), first=0, stride=6)  # doctest: +SKIP
    """
    expect = getattr(decoder, "expect", None)
    if stride > 1 and expect is not None:
        expect(range(first, 1 << 62, stride))
    return decoder
