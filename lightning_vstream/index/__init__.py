"""Index files -> frozen, validated records of clips, cameras and frame counts (no torch, no decoder here).

- :mod:`~lightning_vstream.index.local_index`: parsing and validating a local index file.
- :mod:`~lightning_vstream.index.remote_index`: the same for an index at a URL, and its frame tables.
- :mod:`~lightning_vstream.index.listing`: what both collect per clip before it becomes arrays.
- :mod:`~lightning_vstream.index.records`: the records (:class:`VideoIndex`, :class:`Clip`, :class:`CameraStream`).
- :mod:`~lightning_vstream.index.arrays`: a loaded index's clips as arrays, each record built when used.
- :mod:`~lightning_vstream.index.tables`: frame tables (:class:`VideoInfo`, with every frame's reference code) and the JSON sidecar.
- :mod:`~lightning_vstream.index.table_file`: the binary, memory-mapped frame-table file (:class:`FrameTables`).
- :mod:`~lightning_vstream.index.table_write`: writing that file.
- :mod:`~lightning_vstream.index.identity`: file identity (size, mtime, fingerprint) and re-verification.
- :mod:`~lightning_vstream.index.files`: how clips and cameras lay out on disk.

Building, loading and checking an index probe its files with the decoders, so that code lives in
:mod:`lightning_vstream.indexing`, above :mod:`lightning_vstream.decode`. Its public names
(:func:`load_index`, :func:`build_index`, :func:`write_index_tables`, :func:`verify_index`,
:class:`VerifyReport`, :func:`probe`) are also importable from here, as documented: each loads
:mod:`lightning_vstream.indexing` on first access, so importing this package imports no decoder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_vstream._exports import lazy_exports
from lightning_vstream.errors import FileChangedError, IndexValidationError
from lightning_vstream.index.files import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS
from lightning_vstream.index.identity import FileIdentity
from lightning_vstream.index.records import CameraStream, Clip, ClipSequence, VideoIndex
from lightning_vstream.index.table_file import FrameTables, tables_path
from lightning_vstream.index.tables import (
    REFERENCE_UNKNOWN,
    VideoInfo,
    is_reference,
    metadata_path,
    reference_code,
    temporal_id,
)

if TYPE_CHECKING:
    from lightning_vstream.indexing import (
        VerifyReport,
        build_index,
        load_index,
        probe,
        verify_index,
        write_index_tables,
    )

#: Documented names that probe files, defined in :mod:`lightning_vstream.indexing` (loaded on first access).
_FROM_INDEXING = ("VerifyReport", "build_index", "load_index", "probe", "verify_index", "write_index_tables")

__all__ = [
    "IMAGE_EXTENSIONS",
    "REFERENCE_UNKNOWN",
    "VIDEO_EXTENSIONS",
    "CameraStream",
    "Clip",
    "ClipSequence",
    "FileChangedError",
    "FileIdentity",
    "FrameTables",
    "IndexValidationError",
    "VerifyReport",
    "VideoIndex",
    "VideoInfo",
    "build_index",
    "is_reference",
    "load_index",
    "metadata_path",
    "probe",
    "reference_code",
    "tables_path",
    "temporal_id",
    "verify_index",
    "write_index_tables",
]


__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(_FROM_INDEXING, "lightning_vstream.indexing"))
