"""lightning_vstream: frame-exact, stream-affine video loading for PyTorch Lightning.

Importing the package does no I/O, touches no GPU and does not import lightning (the DataModules
load on first use); decoders open files lazily where they run.

The names here are the public API. Everything else stays importable from the module named after
its concept (``lightning_vstream.index``, ``.decode``, ``.stream``, ``.clips``, ``.demos``) and may
change between releases.
"""

from importlib import metadata as _metadata
from typing import TYPE_CHECKING, Any

from lightning_vstream.annotations import AnnotationFiles, AnnotationSource, GeometryAugment
from lightning_vstream.clips.dataset import VideoClipDataset, collate_clips
from lightning_vstream.clips.selection import (
    ClipRequest,
    FrameWindow,
    TimeWindow,
    at_indices,
    at_times,
    multi_rate,
    random_clips,
    regular_clips,
)
from lightning_vstream.errors import IndexValidationError, VideoDecodeError, VStreamError
from lightning_vstream.index import VideoIndex, build_index, load_index
from lightning_vstream.transforms import FrameTransform

if TYPE_CHECKING:
    from lightning_vstream.clips.datamodule import ClipVideoDataModule
    from lightning_vstream.stream.datamodule import StreamVideoDataModule

try:
    __version__ = _metadata.version("lightning_vstream")
except _metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

#: Names whose modules import lightning: loaded on first access, so that DataLoader workers (which
#: import this package to unpickle their dataset) start without importing lightning.
_LAZY = {
    "ClipVideoDataModule": "lightning_vstream.clips.datamodule",
    "StreamVideoDataModule": "lightning_vstream.stream.datamodule",
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
    "AnnotationFiles",
    "AnnotationSource",
    "ClipRequest",
    "ClipVideoDataModule",
    "FrameTransform",
    "FrameWindow",
    "GeometryAugment",
    "IndexValidationError",
    "StreamVideoDataModule",
    "TimeWindow",
    "VStreamError",
    "VideoClipDataset",
    "VideoDecodeError",
    "VideoIndex",
    "__version__",
    "at_indices",
    "at_times",
    "build_index",
    "collate_clips",
    "load_index",
    "multi_rate",
    "random_clips",
    "regular_clips",
]
