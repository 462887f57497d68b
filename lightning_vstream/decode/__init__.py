"""Decoding backends behind one protocol: PyAV on the CPU, PyNvVideoCodec on NVIDIA GPUs, image folders."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_vstream.decode.base import FrameDecoder, Layout, VideoDecodeError, VideoInfo

if TYPE_CHECKING:
    from lightning_vstream.decode.cpu import PyAVDecoder, probe_video
    from lightning_vstream.decode.images import with_image_fps

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
    "probe_video": "lightning_vstream.decode.cpu",
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

    Example::

        >>> dec = make_decoder("clip/CAM_FRONT.mp4")  # doctest: +SKIP
        >>> dec.get(5).shape  # doctest: +SKIP
        torch.Size([3, 48, 64])
    """
    path = Path(path)
    if path.is_dir():
        from lightning_vstream.decode.images import ImageFolderDecoder

        return ImageFolderDecoder(path, info=info, layout=layout, label=label)
    if device != "cpu":
        from lightning_vstream.decode.gpu import NvDecoder

        return NvDecoder(path, info=info, device=device, layout=layout, label=label)
    from lightning_vstream.decode.cpu import PyAVDecoder

    return PyAVDecoder(path, info=info, layout=layout, threads=threads, label=label, stream=stream, size=size)
