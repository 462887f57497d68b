"""Decoding backends behind one protocol: PyAV on the CPU, PyNvVideoCodec on NVIDIA GPUs, image folders."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_vstream.decode.base import FrameDecoder, VideoDecodeError, VideoInfo

if TYPE_CHECKING:
    from lightning_vstream.decode.cpu import PyAVDecoder
    from lightning_vstream.decode.factory import make_decoder
    from lightning_vstream.decode.images import with_image_fps
    from lightning_vstream.decode.probe import probe_video

__all__ = [
    "FrameDecoder",
    "PyAVDecoder",
    "VideoDecodeError",
    "VideoInfo",
    "make_decoder",
    "probe_video",
    "with_image_fps",
]

#: Loaded on first access: the decoder factory, the CPU backend's decoder and prober, and the image-folder frame rate.
_LAZY = {
    "PyAVDecoder": "lightning_vstream.decode.cpu",
    "make_decoder": "lightning_vstream.decode.factory",
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
