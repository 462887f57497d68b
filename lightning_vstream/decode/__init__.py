"""Decoding backends behind one protocol: PyAV on the CPU, PyNvVideoCodec on NVIDIA GPUs, image folders."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_vstream.decode.base import FrameDecoder, Layout, VideoDecodeError, VideoInfo
from lightning_vstream.errors import ConfigurationError
from lightning_vstream.storage.urls import is_url

if TYPE_CHECKING:
    from lightning_vstream.decode.cpu import PyAVDecoder
    from lightning_vstream.decode.images import with_image_fps
    from lightning_vstream.decode.probe import probe_video
    from lightning_vstream.storage.options import StorageConfig

__all__ = [
    "FrameDecoder",
    "PyAVDecoder",
    "VideoDecodeError",
    "VideoInfo",
    "make_decoder",
    "probe_video",
    "with_image_fps",
]

#: Loaded on first access: the CPU backend's decoder and prober, and the image-folder frame rate.
_LAZY = {
    "PyAVDecoder": "lightning_vstream.decode.cpu",
    "probe_video": "lightning_vstream.decode.probe",
    "with_image_fps": "lightning_vstream.decode.images",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_vstream.decode' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
            GOP (:class:`~lightning_vstream.decode.remote.GopDecoder`); any other through its
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
        from lightning_vstream.decode.gpu import NvDecoder

        return NvDecoder(path, info=info, device=device, layout=layout, label=label)
    from lightning_vstream.decode.cpu import PyAVDecoder

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
    from lightning_vstream.decode.cpu import PyAVDecoder
    from lightning_vstream.decode.range_file import RangeFile, expect_of
    from lightning_vstream.decode.remote import GopDecoder
    from lightning_vstream.storage.client import Expect, storage_for
    from lightning_vstream.storage.fetcher import fetcher_for
    from lightning_vstream.storage.options import StorageConfig

    if device != "cpu":
        raise ConfigurationError(
            f"{url!r}{f' ({label})' if label else ''}: decoding remote files on {device!r} is not supported yet; "
            "use decode_device='cpu' (remote files are read GOP by GOP and decoded with PyAV)."
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
