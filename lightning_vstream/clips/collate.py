"""Batching clip samples: :func:`collate_clips`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lightning_vstream.clips.outputs import frame_shapes, sized_like, stack_frames, stack_geometry
from lightning_vstream.errors import ConfigurationError

__all__ = ["collate_clips"]


def collate_clips(samples: Sequence[Mapping[str, Any]], *, pad_annotations: bool = False) -> dict[str, Any]:
    """Stack clip samples into a batch (use as ``DataLoader(..., collate_fn=collate_clips)``).

    Returns ``frames`` uint8 ``[B, T, cameras, 3, H, W]``, ``frame_index`` int64 ``[B, T]``,
    ``timestamp`` float64 ``[B, T]``, ``valid`` bool ``[B]`` (False for samples that could not be
    decoded under ``on_error="skip"``), ``clip_id`` list of str and ``camera_names`` list of str;
    with annotations, ``annotations`` (clip fields ``[B, ...]``, frame fields ``[B, T, ...]``,
    ragged fields as ``[B][T]`` lists, or padded ``[B, T, N_max, ...]`` with ``<name>_mask`` when
    ``pad_annotations``) and ``has_annotations`` ``[B, T]``; with augmentation ``img_aug_matrix``
    ``[B, cameras, 3, 3]`` (see :mod:`lightning_vstream.annotations.batch`).

    Raises:
        ValueError: Samples differ in cameras, frame count ``T`` or frame size.

    Example::

        >>> loader = DataLoader(dataset, batch_size=8, collate_fn=collate_clips)  # doctest: +SKIP
    """
    import torch

    if not samples:
        raise ConfigurationError("collate_clips got an empty list of samples.")
    valid = [s for s in samples if s.get("valid", True)]
    if valid and len(valid) < len(samples):
        # A sample that could not be decoded takes the size (after transform) of the decoded ones.
        samples = [s if s.get("valid", True) else sized_like(s, valid[0]) for s in samples]
    first = samples[0]
    for s in samples[1:]:
        if list(s["camera_names"]) != list(first["camera_names"]):
            raise ConfigurationError(
                f"cannot batch clip {first['clip_id']!r} (cameras {list(first['camera_names'])}) with clip "
                f"{s['clip_id']!r} (cameras {list(s['camera_names'])}); requests in one batch must name the same cameras."
            )
        if frame_shapes(s["frames"]) != frame_shapes(first["frames"]):
            raise ConfigurationError(
                f"cannot batch clip {first['clip_id']!r} (frames {frame_shapes(first['frames'])}) with clip "
                f"{s['clip_id']!r} (frames {frame_shapes(s['frames'])}); requests in one batch must have the same "
                "number of frames and the same frame size."
            )
    batch: dict[str, Any] = {
        "frames": stack_frames([s["frames"] for s in samples]),
        "clip_id": [s["clip_id"] for s in samples],
        "frame_index": torch.stack([s["frame_index"] for s in samples]),
        "timestamp": torch.stack([s["timestamp"] for s in samples]),
        "valid": torch.tensor([bool(s.get("valid", True)) for s in samples], dtype=torch.bool),
        "camera_names": list(first["camera_names"]),
    }
    if "annotations" in first:
        from lightning_vstream.annotations.batch import collate_annotations

        items = [s["annotations"] for s in samples]
        ragged = {
            n for item in items for n, v in item.items() if isinstance(v, list) and v and isinstance(v[0], torch.Tensor)
        }
        partial = [not bool(s["has_annotations"].any()) for s in samples]
        batch["annotations"] = collate_annotations(items, ragged=ragged, pad=pad_annotations, partial=partial)
        batch["has_annotations"] = torch.stack([s["has_annotations"] for s in samples])
    if any("img_aug_matrix" in s for s in samples):
        batch["img_aug_matrix"] = stack_geometry([s.get("img_aug_matrix") for s in samples])
    if "outputs" in first:
        batch["outputs"] = {}
        for name in first["outputs"]:
            outputs = [s["outputs"][name] for s in samples]
            output: dict[str, Any] = {"frames": stack_frames([o["frames"] for o in outputs])}
            for key in ("img_aug_matrix", "intrinsics"):
                if any(key in o for o in outputs):
                    output[key] = stack_geometry([o.get(key) for o in outputs])
            batch["outputs"][name] = output
    return batch
