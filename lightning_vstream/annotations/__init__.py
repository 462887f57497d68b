"""What a model trains on beside the frames: calibration, poses, boxes, and geometry-consistent augmentation.

- :mod:`~lightning_vstream.annotations.source`: the :class:`AnnotationSource` protocol.
- :mod:`~lightning_vstream.annotations.files`: the file format (``<clip_id>.npz`` per clip), its writer and reader.
- :mod:`~lightning_vstream.annotations.batch`: annotations and augmentation geometry in a batch: how they are
  batched, and how they join the frames.
- :mod:`~lightning_vstream.annotations.augment`: :class:`GeometryAugment`, one resize / crop / flip /
  rotation per clip, and its ``img_aug_matrix``.
"""

from lightning_vstream.annotations.augment import AugmentParams, GeometryAugment
from lightning_vstream.annotations.batch import collate_annotations, pad_ragged
from lightning_vstream.annotations.files import (
    AnnotationFiles,
    ClipAnnotations,
    write_clip_annotations,
)
from lightning_vstream.annotations.source import (
    AnnotationSource,
    annotate,
    resolve_annotations,
)

__all__ = [
    "AnnotationFiles",
    "AnnotationSource",
    "AugmentParams",
    "ClipAnnotations",
    "GeometryAugment",
    "annotate",
    "collate_annotations",
    "pad_ragged",
    "resolve_annotations",
    "write_clip_annotations",
]
