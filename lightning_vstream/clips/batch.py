"""Clip samples and batches: a sample's outputs and their geometry, and how samples are batched.

Used by :class:`~lightning_vstream.clips.dataset.VideoClipDataset` (a sample's outputs and their
``img_aug_matrix``; see :mod:`lightning_vstream.outputs`) and by :func:`collate_clips`, which stacks
samples into a batch (``DataLoader(..., collate_fn=collate_clips)``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lightning_vstream.errors import ConfigurationError
from lightning_vstream.outputs import OutputTransform, apply_output

if TYPE_CHECKING:
    import torch

__all__ = [
    "collate_clips",
    "frame_shapes",
    "make_output",
    "output_matrices",
    "resize_matrix",
    "sized_like",
    "stack_frames",
    "stack_geometry",
    "unreadable_sample",
]


def make_output(transform: OutputTransform | None, base: torch.Tensor | list[torch.Tensor], valid: bool) -> Any:
    """One output of a sample's decoded (and augmented) frames: ``[T, cameras, ...]``, or one ``[T, ...]`` per camera.

    An invalid sample's output holds zeros whatever the transform makes of its zero frames.
    """
    if isinstance(base, list):
        return [make_output(transform, frames[:, None], valid)[:, 0] for frames in base]
    steps, cameras = base.shape[:2]
    out = apply_output(transform, base.reshape(-1, *base.shape[2:]))
    out = out.reshape(steps, cameras, *out.shape[1:])
    if not valid and out.data_ptr() != base.data_ptr():
        out = out.zero_()
    return out


def resize_matrix(height: int, width: int, new_height: int, new_width: int) -> torch.Tensor:
    """The float64 ``[3, 3]`` matrix of resizing ``height x width`` pixels to ``new_height x new_width``."""
    import torch

    return torch.diag(torch.tensor([new_width / width, new_height / height, 1.0], dtype=torch.float64))


def output_matrices(
    transform: object, sizes: Sequence[tuple[int, int]], before: Sequence[torch.Tensor]
) -> torch.Tensor:
    """``img_aug_matrix`` ``[cameras, 3, 3]`` of one output: ``before`` (file to decoded and augmented pixels),
    then the transform's crop and resize for each camera's ``(height, width)`` in ``sizes``."""
    import torch

    from lightning_vstream.annotations.augment import transform_matrix

    out = []
    for (height, width), matrix in zip(sizes, before):
        after = transform_matrix(transform, height, width)
        out.append((matrix if after is None else after.double() @ matrix).to(torch.float32))
    return torch.stack(out) if out else torch.zeros((0, 3, 3))


def stack_frames(frames: Sequence[Any]) -> Any:
    """Stack the samples' frames of one output: one tensor, or one per camera (``camera_frames="per_camera"``)."""
    import torch

    if isinstance(frames[0], torch.Tensor):
        return torch.stack(list(frames))
    return [torch.stack([f[c] for f in frames]) for c in range(len(frames[0]))]


def stack_geometry(values: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """Stack per-sample ``[cameras, 3, 3]`` matrices; a sample that could not be decoded has none (identity)."""
    import torch

    like = next(v for v in values if v is not None)
    eye = torch.eye(3, dtype=like.dtype).expand_as(like)
    return torch.stack([v if v is not None else eye for v in values])


def sized_like(sample: Mapping[str, Any], like: Mapping[str, Any]) -> dict[str, Any]:
    """An invalid sample with zero frames of the size (after transform) of a decoded sample ``like``, every output."""
    import torch

    def zeros(frames: Any, reference: Any) -> Any:
        if frame_shapes(frames) == frame_shapes(reference):
            return frames
        if isinstance(reference, torch.Tensor):
            return torch.zeros_like(reference)
        return [torch.zeros_like(f) for f in reference]

    out = {**sample, "frames": zeros(sample["frames"], like["frames"])}
    if "outputs" in sample and "outputs" in like:
        out["outputs"] = {
            name: {**output, "frames": zeros(output["frames"], like["outputs"][name]["frames"])}
            for name, output in sample["outputs"].items()
        }
    return out


def frame_shapes(frames: Any) -> Any:
    """Shape of a sample's frames: one tuple, or one per camera (``camera_frames="per_camera"``)."""
    return tuple(frames.shape) if hasattr(frames, "shape") else [tuple(f.shape) for f in frames]


def unreadable_sample(clip_id: str, camera_names: list[str], count: int, outputs: Mapping[str, Any]) -> dict[str, Any]:
    """A ``valid=False`` sample of ``count`` frames whose frame size is unknown (``collate_clips`` sizes it
    like the others)."""
    import torch

    frames = torch.zeros((count, len(camera_names), 3, 0, 0), dtype=torch.uint8)
    sample: dict[str, Any] = {
        "frames": frames,
        "clip_id": clip_id,
        "frame_index": torch.full((count,), -1, dtype=torch.int64),
        "timestamp": torch.full((count,), float("nan"), dtype=torch.float64),
        "camera_names": camera_names,
        "valid": False,
    }
    if outputs:
        sample["outputs"] = {name: {"frames": frames} for name in outputs}
    return sample


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
