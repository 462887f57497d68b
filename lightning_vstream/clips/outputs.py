"""A clip sample's outputs and their geometry, and how samples of several outputs are batched.

Used by :class:`~lightning_vstream.clips.dataset.VideoClipDataset` and
:func:`~lightning_vstream.clips.collate.collate_clips` (see :mod:`lightning_vstream.outputs`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lightning_vstream.outputs import OutputTransform, apply_output

if TYPE_CHECKING:
    import torch

__all__ = [
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
