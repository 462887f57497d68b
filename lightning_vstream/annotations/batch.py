"""Putting annotations and augmentation geometry into a batch (shared by both DataModules)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

from lightning_vstream.annotations.collate import collate_annotations

__all__ = ["INTRINSICS", "add_annotations", "add_output_geometry", "apply_image_transform"]

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
    output_matrices: Mapping[str, Sequence[torch.Tensor | None]] | None = None,
) -> None:
    """Add ``annotations`` / ``has_annotations`` (when ``items`` is given) and ``img_aug_matrix``.

    Args:
        batch: The batch, changed in place.
        items: Per-slot annotations (None where a slot has none).
        ragged: Fields batched as lists (or padded).
        pad: Pad ragged fields, with ``<name>_mask``.
        matrices: Per ``slot * cameras + camera`` image transforms (None: identity).
        cameras: Cameras per slot.
        output_matrices: The same per named output of ``batch["outputs"]`` (see
            :func:`add_output_geometry`).
    """
    if items is not None:
        batch["annotations"] = collate_annotations(items, ragged=ragged, pad=pad)
        batch["has_annotations"] = torch.tensor([item is not None for item in items], dtype=torch.bool)

    def stack(per_position: Sequence[torch.Tensor | None]) -> torch.Tensor:
        eye = torch.eye(3, dtype=torch.float32)
        stacked = torch.stack([m if m is not None else eye for m in per_position])
        return stacked.view(len(per_position) // cameras, cameras, 3, 3)

    outputs = None if output_matrices is None else {name: stack(m) for name, m in output_matrices.items()}
    add_output_geometry(batch, outputs)
    if matrices is not None:
        batch["img_aug_matrix"] = stack(matrices)
        update_intrinsics(batch)


def add_output_geometry(batch: dict[str, Any], matrices: Mapping[str, torch.Tensor] | None) -> None:
    """Give every named output of ``batch["outputs"]`` its ``img_aug_matrix`` and ``intrinsics``.

    Call before :func:`update_intrinsics`: each output's ``intrinsics`` is its own matrix times
    the intrinsics of the video frames (those of the default output without geometry).

    Args:
        batch: The batch, changed in place; nothing happens without ``batch["outputs"]``.
        matrices: Per output name, its image transforms ``[..., cameras, 3, 3]``; None when no
            output changes geometry.
    """
    outputs = batch.get("outputs")
    if not isinstance(outputs, dict):
        return
    annotations = batch.get("annotations")
    k = annotations.get(INTRINSICS) if isinstance(annotations, dict) else None
    for name, output in outputs.items():
        matrix = None if matrices is None else matrices.get(name)
        if matrix is not None:
            output["img_aug_matrix"] = matrix
        if isinstance(k, torch.Tensor):
            if matrix is not None and k.shape == matrix.shape:
                output[INTRINSICS] = apply_image_transform(k, matrix)
            elif matrix is None:
                output[INTRINSICS] = k.clone()


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
