"""lightning_vstream: frame-exact, stream-affine video loading for PyTorch Lightning.

Importing the package does no I/O and touches no GPU; decoders open files lazily where they run.
"""

from lightning_vstream.datamodule import StreamVideoDataModule
from lightning_vstream.dataset import DecodeStats, StreamDataset
from lightning_vstream.decode import make_decoder
from lightning_vstream.decode.base import FrameDecoder, VideoDecodeError, VideoInfo
from lightning_vstream.decode.cpu import PyAVDecoder, probe_video
from lightning_vstream.decode.gpu import DecoderPool, NvDecoder, resolve_decode_device
from lightning_vstream.index import CameraStream, Clip, IndexValidationError, VideoIndex, build_index, load_index
from lightning_vstream.loader import StreamDataLoader, StreamSampler
from lightning_vstream.schedule import StreamSchedule
from lightning_vstream.transforms import FrameTransform

__version__ = "0.1.0"

__all__ = [
    "CameraStream",
    "Clip",
    "DecodeStats",
    "DecoderPool",
    "FrameDecoder",
    "FrameTransform",
    "IndexValidationError",
    "NvDecoder",
    "PyAVDecoder",
    "StreamDataLoader",
    "StreamDataset",
    "StreamSampler",
    "StreamSchedule",
    "StreamVideoDataModule",
    "VideoDecodeError",
    "VideoIndex",
    "VideoInfo",
    "__version__",
    "build_index",
    "load_index",
    "make_decoder",
    "probe_video",
    "resolve_decode_device",
]
