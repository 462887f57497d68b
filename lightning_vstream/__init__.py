"""lightning_vstream: frame-exact, stream-affine video loading for PyTorch Lightning.

Importing the package does no I/O, touches no GPU and does not import lightning (the DataModules
load on first use); decoders open files lazily where they run.
"""

from lightning_vstream.clips.dataset import DecoderCache, VideoClipDataset, collate_clips, index_from_files
from lightning_vstream.stream.worker import DecodeStats, StreamDataset
from lightning_vstream.decode import make_decoder
from lightning_vstream.decode.base import FrameDecoder, VideoDecodeError, VideoInfo
from lightning_vstream.decode.cpu import PyAVDecoder, probe_video
from lightning_vstream.decode.gpu import DecoderPool, NvDecoder, resolve_decode_device
from lightning_vstream.decode.images import ImageFolderDecoder, probe_image_folder, with_image_fps
from lightning_vstream.index import CameraStream, Clip, IndexValidationError, VideoIndex, build_index, load_index
from lightning_vstream.stream.loader import BufferPool, StreamDataLoader, StreamSampler
from lightning_vstream.stream.schedule import StreamSchedule
from lightning_vstream.clips.selection import (
    ClipRequest,
    FrameWindow,
    TimeWindow,
    at_indices,
    at_times,
    multi_rate,
    random_clips,
    regular_clips,
    resolve_times,
    segment_times,
)
from lightning_vstream.transforms import FrameTransform

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_vstream.clips.datamodule import ClipVideoDataModule
    from lightning_vstream.demos.models import TinyStreamPETR
    from lightning_vstream.stream.datamodule import StreamVideoDataModule

__version__ = "0.1.0"

#: Names whose modules import lightning: loaded on first access, so that DataLoader workers (which
#: import this package to unpickle their dataset) start without importing lightning.
_LAZY = {
    "ClipVideoDataModule": "lightning_vstream.clips.datamodule",
    "StreamVideoDataModule": "lightning_vstream.stream.datamodule",
    "TinyStreamPETR": "lightning_vstream.demos.models",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_vstream' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

__all__ = [
    "BufferPool",
    "CameraStream",
    "Clip",
    "ClipRequest",
    "ClipVideoDataModule",
    "DecodeStats",
    "DecoderCache",
    "DecoderPool",
    "FrameDecoder",
    "FrameTransform",
    "FrameWindow",
    "ImageFolderDecoder",
    "IndexValidationError",
    "NvDecoder",
    "PyAVDecoder",
    "StreamDataLoader",
    "StreamDataset",
    "StreamSampler",
    "StreamSchedule",
    "StreamVideoDataModule",
    "TimeWindow",
    "TinyStreamPETR",
    "VideoClipDataset",
    "VideoDecodeError",
    "VideoIndex",
    "VideoInfo",
    "at_indices",
    "at_times",
    "build_index",
    "collate_clips",
    "index_from_files",
    "load_index",
    "make_decoder",
    "multi_rate",
    "probe_image_folder",
    "probe_video",
    "random_clips",
    "regular_clips",
    "resolve_decode_device",
    "resolve_times",
    "segment_times",
    "with_image_fps",
    "__version__",
]
