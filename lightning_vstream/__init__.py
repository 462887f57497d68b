"""lightning_vstream: frame-exact, stream-affine video loading for PyTorch Lightning.

Importing the package does no I/O, touches no GPU and imports neither torch nor lightning: every
name below loads its module on first access, so ``vstream --help`` answers at once and DataLoader
workers (which import this package to unpickle their dataset) import only what they use.

The public API is the names here, plus the ``__all__`` of these namespaces:
``lightning_vstream.callbacks`` (Lightning callbacks), ``.errors`` (every exception),
``.index``, ``.decode``, ``.annotations``, ``.encode``, ``.importers`` (index files, decoders,
training targets, dataset tools), ``.demos`` (stamped synthetic data and the demo model) and
``.cli`` (``main``, the ``vstream`` command). Modules below those (``lightning_vstream.stream.worker_loader``,
``lightning_vstream.clips.selection``, ...) are internal and may change between releases.

Layout, data flowing down the list (a package imports only from those above it; ``stream`` and
``clips`` are siblings that never import each other):

- :mod:`~lightning_vstream.errors`, :mod:`~lightning_vstream.profiling`: every exception; NVTX ranges.
- :mod:`~lightning_vstream.storage`: bytes from object stores, HTTP and shared file systems, the node cache.
- :mod:`~lightning_vstream.index`: index files -> validated records and frame tables (no decoder);
  :mod:`~lightning_vstream.indexing`: building, loading and checking them with the decoders.
- :mod:`~lightning_vstream.decode`: the decoding backends, the GOP scheduler and the one runner of decoding
  threads.
- :mod:`~lightning_vstream.outputs`, :mod:`~lightning_vstream.options`, :mod:`~lightning_vstream.transforms`,
  :mod:`~lightning_vstream.annotations`: outputs of a frame, the option groups and their checks, frame
  transforms, what a model trains on beside the frames.
- :mod:`~lightning_vstream.stream`: the streaming way to read (:class:`StreamVideoDataModule`);
  :mod:`~lightning_vstream.clips`: the random-access way (:class:`VideoClipDataset`,
  :class:`ClipVideoDataModule`); ``_datamodule``: what both DataModules share.
- :mod:`~lightning_vstream.callbacks`, :mod:`~lightning_vstream.preview`: Lightning callbacks; batches drawn.
- :mod:`~lightning_vstream.encode`, :mod:`~lightning_vstream.importers`, :mod:`~lightning_vstream.demos`:
  dataset tools and the demo; :mod:`~lightning_vstream.cli` with :mod:`~lightning_vstream.commands`,
  :mod:`~lightning_vstream.doctor` and :mod:`~lightning_vstream.lightning_cli`: the ``vstream`` command and
  ``VStreamCLI``.

Example::

    >>> from lightning_vstream import StreamVideoDataModule
    >>> dm = StreamVideoDataModule(index_file="data/index.json", batch_size=2)  # doctest: +SKIP
    >>> dm.setup("fit")  # doctest: +SKIP
    >>> batch = next(iter(dm.train_dataloader()))  # doctest: +SKIP
    >>> batch["frames"].shape  # [batch_size, cameras, 3, H, W], uint8  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_vstream._exports import lazy_exports

if TYPE_CHECKING:
    from lightning_vstream.annotations import AnnotationFiles, AnnotationSource, GeometryAugment
    from lightning_vstream.clips.batch import ClipBatch, ClipSample, collate_clips
    from lightning_vstream.clips.datamodule import ClipVideoDataModule
    from lightning_vstream.clips.dataset import VideoClipDataset
    from lightning_vstream.clips.from_files import index_from_files
    from lightning_vstream.clips.selection import ClipRequest, at_indices, at_times, multi_rate, segment_times
    from lightning_vstream.clips.windows import FrameWindow, TimeWindow, random_clips, regular_clips
    from lightning_vstream.errors import IndexValidationError, VideoDecodeError, VStreamError, VStreamWarning
    from lightning_vstream.index import VideoIndex
    from lightning_vstream.indexing import build_index, load_index
    from lightning_vstream.lightning_cli import VStreamCLI
    from lightning_vstream.options import (
        DecodeOptions,
        EngineOptions,
        ErrorOptions,
        GpuOptions,
        IndexOptions,
        OutputOptions,
        PlanOptions,
        SamplingOptions,
    )
    from lightning_vstream.preview import Preview, draw_batches, preview_batches
    from lightning_vstream.storage.config import StorageConfig
    from lightning_vstream.stream.batch import StreamBatch
    from lightning_vstream.stream.schedule import StreamSchedule
    from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule
    from lightning_vstream.transforms import FrameTransform

    __version__: str

#: Public name -> the module that defines it (imported on first access).
_EXPORTS = {
    "AnnotationFiles": "lightning_vstream.annotations",
    "AnnotationSource": "lightning_vstream.annotations",
    "ClipBatch": "lightning_vstream.clips.batch",
    "ClipRequest": "lightning_vstream.clips.selection",
    "ClipSample": "lightning_vstream.clips.batch",
    "ClipVideoDataModule": "lightning_vstream.clips.datamodule",
    "FrameTransform": "lightning_vstream.transforms",
    "FrameWindow": "lightning_vstream.clips.windows",
    "GeometryAugment": "lightning_vstream.annotations",
    "GpuOptions": "lightning_vstream.options",
    "SamplingOptions": "lightning_vstream.options",
    "PlanOptions": "lightning_vstream.options",
    "OutputOptions": "lightning_vstream.options",
    "IndexOptions": "lightning_vstream.options",
    "ErrorOptions": "lightning_vstream.options",
    "EngineOptions": "lightning_vstream.options",
    "DecodeOptions": "lightning_vstream.options",
    "IndexValidationError": "lightning_vstream.errors",
    "Preview": "lightning_vstream.preview",
    "StorageConfig": "lightning_vstream.storage.config",
    "StreamBatch": "lightning_vstream.stream.batch",
    "StreamSchedule": "lightning_vstream.stream.schedule",
    "StreamVideoDataModule": "lightning_vstream.stream.stream_datamodule",
    "TimeWindow": "lightning_vstream.clips.windows",
    "VStreamCLI": "lightning_vstream.lightning_cli",
    "VStreamError": "lightning_vstream.errors",
    "VStreamWarning": "lightning_vstream.errors",
    "VideoClipDataset": "lightning_vstream.clips.dataset",
    "VideoDecodeError": "lightning_vstream.errors",
    "VideoIndex": "lightning_vstream.index",
    "at_indices": "lightning_vstream.clips.selection",
    "at_times": "lightning_vstream.clips.selection",
    "build_index": "lightning_vstream.indexing",
    "collate_clips": "lightning_vstream.clips.batch",
    "draw_batches": "lightning_vstream.preview",
    "index_from_files": "lightning_vstream.clips.from_files",
    "load_index": "lightning_vstream.indexing",
    "multi_rate": "lightning_vstream.clips.selection",
    "preview_batches": "lightning_vstream.preview",
    "random_clips": "lightning_vstream.clips.windows",
    "regular_clips": "lightning_vstream.clips.windows",
    "segment_times": "lightning_vstream.clips.selection",
}


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("lightning_vstream")
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, computed={"__version__": _version})


__all__ = [
    "AnnotationFiles",
    "AnnotationSource",
    "ClipBatch",
    "ClipRequest",
    "ClipSample",
    "ClipVideoDataModule",
    "DecodeOptions",
    "EngineOptions",
    "ErrorOptions",
    "FrameTransform",
    "FrameWindow",
    "GeometryAugment",
    "GpuOptions",
    "IndexOptions",
    "IndexValidationError",
    "OutputOptions",
    "PlanOptions",
    "Preview",
    "SamplingOptions",
    "StorageConfig",
    "StreamBatch",
    "StreamSchedule",
    "StreamVideoDataModule",
    "TimeWindow",
    "VStreamCLI",
    "VStreamError",
    "VStreamWarning",
    "VideoClipDataset",
    "VideoDecodeError",
    "VideoIndex",
    "__version__",
    "at_indices",
    "at_times",
    "build_index",
    "collate_clips",
    "draw_batches",
    "index_from_files",
    "load_index",
    "multi_rate",
    "preview_batches",
    "random_clips",
    "regular_clips",
    "segment_times",
]
