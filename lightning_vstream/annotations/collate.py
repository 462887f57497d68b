"""How annotations are batched: fixed shapes stacked, ragged fields listed (or padded with a mask).

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
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

from lightning_vstream.errors import AnnotationError

__all__ = ["collate_annotations", "pad_ragged"]


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
