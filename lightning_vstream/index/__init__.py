"""Index files -> frozen, validated records of clips, cameras and frame counts (no torch here).

- :mod:`~lightning_vstream.index.load`: parsing and validating an index file.
- :mod:`~lightning_vstream.index.records`: the records (:class:`VideoIndex`, :class:`Clip`, :class:`CameraStream`).
- :mod:`~lightning_vstream.index.tables`: frame tables (:class:`VideoInfo`) and their sidecar file.
- :mod:`~lightning_vstream.index.files`: how clips and cameras lay out on disk.
- :mod:`~lightning_vstream.index.build`: building an index by probing files.
"""

from lightning_vstream.errors import IndexValidationError
from lightning_vstream.index.build import build_index, probe
from lightning_vstream.index.files import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS
from lightning_vstream.index.load import load_index
from lightning_vstream.index.records import CameraStream, Clip, VideoIndex
from lightning_vstream.index.tables import VideoInfo, metadata_path

__all__ = [
    "IMAGE_EXTENSIONS",
    "VIDEO_EXTENSIONS",
    "CameraStream",
    "Clip",
    "IndexValidationError",
    "VideoIndex",
    "VideoInfo",
    "build_index",
    "load_index",
    "metadata_path",
    "probe",
]
