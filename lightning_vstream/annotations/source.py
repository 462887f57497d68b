"""The annotation source protocol: what a loader asks for, next to every frame it decodes."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from lightning_vstream.errors import AnnotationError

__all__ = ["AnnotationSource", "annotate", "resolve_annotations"]


@runtime_checkable
class AnnotationSource(Protocol):
    """Per-clip and per-frame training targets, looked up where frames are decoded.

    Implement the two methods (and ``ragged``) on a picklable object; the loaders call them in
    their decoding workers, once per delivered frame (``clip_annotations`` may be cached per clip).
    Returned values are tensors, numpy arrays, numbers, bools or str; names must not repeat
    between the two methods. Raise :class:`~lightning_vstream.errors.AnnotationError` for a frame
    that has no annotation: with ``on_error="raise"`` the loader stops with that error, with
    ``"skip"`` the frame is delivered with ``has_annotations=False`` and counted.

    Attributes:
        ragged: Per-frame fields whose first dimension varies between frames (boxes, labels):
            batches list them (or pad them with a mask) instead of stacking.

    Example::

        >>> import torch
        >>> class Poses:
        ...     ragged = ("boxes",)
        ...     def clip_annotations(self, clip_id, cameras):
        ...         return {"intrinsics": torch.eye(3).expand(len(cameras), 3, 3)}
        ...     def frame_annotations(self, clip_id, frame_index, timestamp, cameras):
        ...         return {"ego_pose": torch.eye(4), "boxes": torch.zeros(frame_index % 3, 9)}
        >>> isinstance(Poses(), AnnotationSource)
        True
    """

    @property
    def ragged(self) -> Collection[str]:
        """Per-frame fields batched as lists (or padded) rather than stacked."""
        ...

    def clip_annotations(self, clip_id: str, cameras: Sequence[str]) -> Mapping[str, Any]:
        """Fields of the whole clip; per-camera values follow the order of ``cameras``."""
        ...

    def frame_annotations(
        self, clip_id: str, frame_index: int, timestamp: float, cameras: Sequence[str]
    ) -> Mapping[str, Any]:
        """Fields of frame ``frame_index`` (presentation time ``timestamp`` seconds on the first camera)."""
        ...


def resolve_annotations(annotations: AnnotationSource | Path | str | None) -> AnnotationSource | None:
    """A source object as given, or :class:`~lightning_vstream.annotations.AnnotationFiles` for a folder path.

    Raises:
        AnnotationError: The folder does not exist, or the object lacks the protocol's methods.
    """
    if annotations is None:
        return None
    if isinstance(annotations, (str, Path)):
        from lightning_vstream.annotations.files import AnnotationFiles

        return AnnotationFiles(annotations)
    missing = [m for m in ("clip_annotations", "frame_annotations") if not callable(getattr(annotations, m, None))]
    if missing:
        raise AnnotationError(
            f"annotations={annotations!r} lacks {missing}; pass a folder of <clip_id>.npz files or an object with "
            "clip_annotations(clip_id, cameras) and frame_annotations(clip_id, frame_index, timestamp, cameras)."
        )
    return annotations


def annotate(
    source: AnnotationSource, clip_id: str, frame_index: int, timestamp: float, cameras: Sequence[str]
) -> dict[str, Any]:
    """The clip and frame fields of one frame, merged into one dict (values as the batch holds them).

    Raises:
        AnnotationError: The source raised it, or a name appears in both the clip and the frame fields.
    """
    clip = source.clip_annotations(clip_id, cameras)
    frame = source.frame_annotations(clip_id, frame_index, timestamp, cameras)
    both = sorted(set(clip) & set(frame))
    if both:
        raise AnnotationError(
            f"clip {clip_id!r} frame {frame_index}: fields {both} come both per clip and per frame; rename one of them."
        )
    return {name: _convert(value) for name, value in {**clip, **frame}.items()}


def _convert(value: Any) -> Any:
    import numpy as np
    import torch

    if isinstance(value, (torch.Tensor, str)):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "U":
            return str(value) if value.ndim == 0 else [str(v) for v in value.reshape(-1)]
        return torch.from_numpy(np.array(value))
    if isinstance(value, (bool, np.bool_)):
        return torch.tensor(bool(value))
    if isinstance(value, (int, float, np.integer, np.floating)):
        return torch.tensor(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    return value
