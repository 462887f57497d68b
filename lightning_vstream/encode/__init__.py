"""Transcoding datasets into the accvlab layout: one H.265 or H.264 video per camera and clip.

Any index can be encoded (image-folder cameras, other videos, or a mix) with :func:`encode_index`
(``vstream encode``); :func:`encode_sources` encodes explicit :class:`CameraSource` streams (an
importer's lists of image files with their times). Every frame keeps its source presentation time
exactly: irregular intervals and dropped frames stay gaps in the timestamps, never renumbered to a
constant rate. Each camera file is one task, run in this process, local processes (``jobs=N``) or
Ray tasks (``executor="ray"``), with the same index at the end (see ``docs/prepare_at_scale.md``).

- :mod:`~lightning_vstream.encode.settings`: what to encode and how (:class:`EncodeSettings`,
  :class:`CameraSource`) and the summary of a run.
- :mod:`~lightning_vstream.encode.run`: encoding a dataset: camera streams in, videos and their index out.
- :mod:`~lightning_vstream.encode.writer`: one camera stream into one MP4 file, every frame time kept.

Example::

    >>> from lightning_vstream.encode import encode_index
    >>> summary = encode_index("images/index.json", "encoded", codec="hevc", jobs=2)  # doctest: +SKIP
    >>> summary.frames_per_second, summary.size_ratio  # doctest: +SKIP
    (61.2, 0.08)
"""

from lightning_vstream.encode.run import encode_index, encode_sources
from lightning_vstream.encode.settings import CameraSource, EncodeSettings, EncodeSummary

__all__ = ["CameraSource", "EncodeSettings", "EncodeSummary", "encode_index", "encode_sources"]
