"""Annotations and augmentation geometry in a batch: how they are batched, and how they join the frames.

The rule, for every field, over the items of a batch (slots of a streaming batch; frames of a
clip sample, then samples of a clip batch):

- tensors of one shape are **stacked** (``[B, ...]``; ``[B, T, ...]`` for clip samples);
- fields the source declares ragged are **lists** of tensors (``[B]`` lists; ``[B][T]`` for
  clip samples), or with ``pad=True`` one tensor padded with zeros to the longest, plus a bool
  ``<name>_mask`` marking real rows;
- str values become lists of str; anything else becomes a list;
- an item with no annotations (padding, a skipped frame) gets zeros (an empty tensor for ragged
  fields, ``""`` for str) and ``False`` in the batch's ``has_annotations``.

A non-ragged tensor field whose shape differs between items raises an
:class:`~lightning_vstream.errors.AnnotationError` naming it: declare it ragged.

Both ways of reading put them into their batches here: :func:`add_annotations` (a streaming batch:
per-slot items, ``img_aug_matrix`` per camera and output), :func:`sample_annotations` (a clip
sample's frames), :func:`add_output_geometry` and :func:`update_intrinsics` (each named output's
geometry, and the intrinsics the augmentation and the transforms change).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

from lightning_vstream.errors import AnnotationError

__all__ = [
    "INTRINSICS",
    "add_annotations",
    "add_output_geometry",
    "apply_image_transform",
    "collate_annotations",
    "pad_ragged",
    "sample_annotations",
    "update_intrinsics",
]

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


def _blank(example: Any, ragged: bool) -> Any:
    if isinstance(example, torch.Tensor):
        if ragged and example.dim() > 0:
            return example.new_zeros((0, *example.shape[1:]))
        return torch.zeros_like(example)
    if isinstance(example, str):
        return ""
    if isinstance(example, list):
        return [_blank(v, ragged) for v in example]
    return None


def collate_annotations(
    items: Sequence[Mapping[str, Any] | None],
    *,
    ragged: Collection[str] = (),
    pad: bool = False,
    partial: Sequence[bool] | None = None,
) -> dict[str, Any]:
    """Batch per-item annotation dicts (None for an item without annotations).

    Args:
        items: One dict per item, or None where the item has none.
        ragged: Fields collated as lists (or padded).
        pad: Pad ragged fields to a tensor with a ``<name>_mask`` instead of listing them.
        partial: Per item, True where it may lack fields the others have (a clip sample none of
            whose frames has annotations); its missing fields are filled like a missing item's.

    Returns:
        One dict of batched fields; empty when no item has annotations.

    Raises:
        AnnotationError: Items disagree on their field names, or a non-ragged field changes shape.

    Example::

        >>> import torch
        >>> out = collate_annotations([{"pose": torch.eye(4), "boxes": torch.zeros(2, 9)},
        ...                            {"pose": torch.eye(4), "boxes": torch.zeros(0, 9)}], ragged={"boxes"})
        >>> out["pose"].shape, [b.shape[0] for b in out["boxes"]]
        (torch.Size([2, 4, 4]), [2, 0])
    """
    present = [i for i, item in enumerate(items) if item is not None]
    if not present:
        return {}
    first = items[present[0]]
    assert first is not None
    names = list(first)
    for i in present:
        for name in items[i] or {}:
            if name not in names:
                names.append(name)
    for i in present:
        item = items[i]
        assert item is not None
        if set(item) != set(names) and not (partial is not None and partial[i]):
            raise AnnotationError(
                f"annotations of one batch disagree on their fields: item {present[0]} has {sorted(names)}, item {i} "
                f"has {sorted(item)}; every frame must carry the same fields (use empty arrays for no objects)."
            )
    out: dict[str, Any] = {}
    for name in names:
        example = next(items[i][name] for i in present if name in items[i])  # type: ignore[operator,index]
        is_ragged = name in ragged
        values = [
            items[i][name] if items[i] is not None and name in items[i] else _blank(example, is_ragged)  # type: ignore[operator,index]
            for i in range(len(items))
        ]
        if is_ragged:
            if pad:
                out[name], out[f"{name}_mask"] = pad_ragged(values)
            else:
                out[name] = values
        elif isinstance(example, torch.Tensor):
            shapes = {tuple(v.shape) for v in values if isinstance(v, torch.Tensor)}
            if len(shapes) > 1 or not all(isinstance(v, torch.Tensor) for v in values):
                raise AnnotationError(
                    f"annotation field {name!r} has shapes {sorted(shapes)[:4]} within one batch; a field whose "
                    "first dimension varies must be declared ragged (the source's `ragged`, or "
                    "write_clip_annotations(..., ragged=[...]))."
                )
            out[name] = torch.stack(values)
        else:
            out[name] = values
    return out


def pad_ragged(values: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad nested lists of ``[N_i, ...]`` tensors into ``[..., N_max, ...]`` and a bool mask ``[..., N_max]``.

    Example::

        >>> data, mask = pad_ragged([torch.ones(2, 3), torch.ones(0, 3)])
        >>> data.shape, mask.tolist()
        (torch.Size([2, 2, 3]), [[True, True], [False, False]])
    """
    leaves: list[torch.Tensor] = []

    def walk(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            leaves.append(v)
        else:
            for x in v:
                walk(x)

    walk(values)
    longest = max((t.shape[0] for t in leaves), default=0)
    tail = leaves[0].shape[1:] if leaves else ()

    def build(v: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(v, torch.Tensor):
            data = v.new_zeros((longest, *tail))
            data[: v.shape[0]] = v
            mask = torch.zeros(longest, dtype=torch.bool)
            mask[: v.shape[0]] = True
            return data, mask
        built = [build(x) for x in v]
        return torch.stack([b[0] for b in built]), torch.stack([b[1] for b in built])

    return build(values)
