"""Putting annotations and augmentation geometry into a batch (shared by both DataModules)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

from lightning_vstream.annotations.collate import collate_annotations

__all__ = ["INTRINSICS", "add_annotations", "apply_image_transform"]

#: The annotation field updated by the augmentation's image transform.
INTRINSICS = "intrinsics"


def apply_image_transform(intrinsics: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """``matrix @ intrinsics`` over matching leading dimensions, in the intrinsics' dtype.

    Example::

        >>> k = torch.tensor([[10.0, 0, 8], [0, 10, 6], [0, 0, 1]])
        >>> apply_image_transform(k, torch.diag(torch.tensor([0.5, 0.5, 1.0])))[0].tolist()
        [5.0, 0.0, 4.0]
    """
    return (matrix.to(torch.float64) @ intrinsics.to(torch.float64)).to(intrinsics.dtype)


def add_annotations(
    batch: dict[str, Any],
    items: Sequence[Mapping[str, Any] | None] | None,
    *,
    ragged: Collection[str] = (),
    pad: bool = False,
    matrices: Sequence[torch.Tensor | None] | None = None,
    cameras: int = 1,
) -> None:
    """Add ``annotations`` / ``has_annotations`` (when ``items`` is given) and ``img_aug_matrix``.

    Args:
        batch: The batch, changed in place.
        items: Per-slot annotations (None where a slot has none).
        ragged: Fields batched as lists (or padded).
        pad: Pad ragged fields, with ``<name>_mask``.
        matrices: Per ``slot * cameras + camera`` image transforms (None: identity).
        cameras: Cameras per slot.
    """
    if items is not None:
        batch["annotations"] = collate_annotations(items, ragged=ragged, pad=pad)
        batch["has_annotations"] = torch.tensor([item is not None for item in items], dtype=torch.bool)
    if matrices is not None:
        eye = torch.eye(3, dtype=torch.float32)
        stacked = torch.stack([m if m is not None else eye for m in matrices])
        batch["img_aug_matrix"] = stacked.view(len(matrices) // cameras, cameras, 3, 3)
        update_intrinsics(batch)


def update_intrinsics(batch: dict[str, Any]) -> None:
    """Multiply ``annotations["intrinsics"]`` by ``img_aug_matrix`` where both are present and shapes agree."""
    annotations = batch.get("annotations")
    matrix = batch.get("img_aug_matrix")
    if not isinstance(annotations, dict) or not isinstance(matrix, torch.Tensor):
        return
    k = annotations.get(INTRINSICS)
    if isinstance(k, torch.Tensor) and k.shape == matrix.shape:
        annotations[INTRINSICS] = apply_image_transform(k, matrix)


def sample_annotations(
    source: Any,
    clip_id: str,
    indices: Sequence[int],
    timestamps: Sequence[float],
    cameras: Sequence[str],
    *,
    on_error: str = "raise",
) -> tuple[dict[str, Any], torch.Tensor, int]:
    """Annotations of a clip sample: clip fields once, frame fields over its ``T`` frames.

    Returns:
        The fields (frame fields stacked ``[T, ...]``, ragged ones as lists of ``T`` tensors),
        ``has_annotations`` ``[T]`` and the number of frames without annotations.

    Raises:
        AnnotationError: A frame has no annotation and ``on_error`` is ``"raise"``.
    """
    from lightning_vstream.annotations.source import _convert
    from lightning_vstream.errors import AnnotationError

    clip = {name: _convert(value) for name, value in source.clip_annotations(clip_id, cameras).items()}
    items: list[Mapping[str, Any] | None] = []
    for index, timestamp in zip(indices, timestamps):
        try:
            frame = source.frame_annotations(clip_id, index, timestamp, cameras)
        except AnnotationError:
            if on_error == "raise":
                raise
            items.append(None)
            continue
        both = sorted(set(clip) & set(frame))
        if both:
            raise AnnotationError(
                f"clip {clip_id!r} frame {index}: fields {both} come both per clip and per frame; rename one of them."
            )
        items.append({name: _convert(value) for name, value in frame.items()})
    has = torch.tensor([item is not None for item in items], dtype=torch.bool)
    frames = collate_annotations(items, ragged=getattr(source, "ragged", ()))
    return {**clip, **frames}, has, int((~has).sum())
