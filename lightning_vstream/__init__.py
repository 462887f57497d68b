"""lightning_vstream: frame-exact, stream-affine video loading for PyTorch Lightning.

Importing the package does no I/O and touches no GPU; decoders open files lazily where they run.
"""

from importlib import metadata as _metadata

from lightning_vstream.clips.datamodule import ClipVideoDataModule
from lightning_vstream.clips.dataset import DecoderCache, VideoClipDataset, collate_clips, index_from_files
from lightning_vstream.stream.datamodule import StreamVideoDataModule
from lightning_vstream.stream.worker import DecodeStats, StreamDataset
from lightning_vstream.decode import make_decoder
from lightning_vstream.decode.base import FrameDecoder, VideoDecodeError, VideoInfo
from lightning_vstream.decode.cpu import PyAVDecoder, probe_video
from lightning_vstream.decode.gpu import DecoderPool, NvDecoder, resolve_decode_device
from lightning_vstream.decode.images import ImageFolderDecoder, probe_image_folder, with_image_fps
from lightning_vstream.index import CameraStream, Clip, IndexValidationError, VideoIndex, build_index, load_index
from lightning_vstream.stream.loader import BufferPool, StreamDataLoader, StreamSampler
from lightning_vstream.demos.models import TinyStreamPETR
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

try:
    __version__ = _metadata.version("lightning_vstream")
except _metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

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
