"""Index files -> frozen, validated records of clips, cameras and frame counts (no torch here).

- :mod:`~lightning_vstream.index.load`: parsing and validating an index file.
- :mod:`~lightning_vstream.index.records`: the records (:class:`VideoIndex`, :class:`Clip`, :class:`CameraStream`).
- :mod:`~lightning_vstream.index.arrays`: a loaded index's clips as arrays, each record built when used.
- :mod:`~lightning_vstream.index.tables`: frame tables (:class:`VideoInfo`) and the JSON sidecar.
- :mod:`~lightning_vstream.index.table_file`: the binary, memory-mapped frame-table file (:class:`FrameTables`).
- :mod:`~lightning_vstream.index.identity`: file identity (size, mtime, fingerprint) and re-verification.
- :mod:`~lightning_vstream.index.verify`: full verification of every packet (``vstream index --check``).
- :mod:`~lightning_vstream.index.files`: how clips and cameras lay out on disk.
- :mod:`~lightning_vstream.index.build`: building an index by probing files.
"""

from lightning_vstream.errors import FileChangedError, IndexValidationError
from lightning_vstream.index.build import build_index, probe, write_index_tables
from lightning_vstream.index.files import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS
from lightning_vstream.index.identity import FileIdentity
from lightning_vstream.index.load import load_index
from lightning_vstream.index.records import CameraStream, Clip, ClipSequence, VideoIndex
from lightning_vstream.index.table_file import FrameTables, tables_path
from lightning_vstream.index.tables import VideoInfo, metadata_path
from lightning_vstream.index.verify import VerifyReport, verify_index

__all__ = [
    "IMAGE_EXTENSIONS",
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
    "load_index",
    "metadata_path",
    "probe",
    "tables_path",
    "verify_index",
    "write_index_tables",
]
