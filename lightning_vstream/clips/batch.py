"""Clip samples and batches: their keys (:class:`ClipSample`, :class:`ClipBatch`) and the one builder of each.

Every sample :class:`~lightning_vstream.clips.dataset.VideoClipDataset` delivers is built by
:func:`clip_sample`, whether it was read on the CPU, read with a batch on a GPU, or could not be
read at all (:func:`unreadable_sample`); :func:`collate_clips` stacks samples into a batch
(``DataLoader(..., collate_fn=collate_clips)``). A sample's named outputs and their geometry are
made here too (:func:`make_output`, :func:`output_matrices`; see :mod:`lightning_vstream.outputs`).
The keys are documented once, in ``docs/concepts.md`` ("The batch"); both are plain dicts at run
time (``TypedDict``), so DataLoaders, Lightning and models treat them as any dict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict, cast

import torch

from lightning_vstream.errors import ConfigurationError
from lightning_vstream.outputs import OutputFrames, OutputTransform, apply_output

__all__ = [
    "ClipBatch",
    "ClipSample",
    "clip_sample",
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


class _ClipSampleKeys(TypedDict):
    frames: torch.Tensor | list[torch.Tensor]
    clip_id: str
    frame_index: torch.Tensor
    timestamp: torch.Tensor
    camera_names: list[str]
    valid: bool


class ClipSample(_ClipSampleKeys, total=False):
    """One sample of :class:`~lightning_vstream.VideoClipDataset`: ``T`` frames of one clip, every camera asked for.

    Keys (see ``docs/concepts.md``):

    - ``frames``: uint8 ``[T, cameras, 3, H, W]`` (the ``transform`` may change dtype and size), or with
      ``camera_frames="per_camera"`` a list of ``[T, 3, H_c, W_c]``, one per camera;
    - ``clip_id``: the clip; ``frame_index``: int64 ``[T]``; ``timestamp``: float64 ``[T]`` seconds (the
      first camera's; NaN where the sample could not be read);
    - ``camera_names``: the order of the ``cameras`` dimension;
    - ``valid``: False for a sample that could not be read (``on_error="skip"``): its frames are zeros.

    With annotations, ``annotations`` and ``has_annotations`` bool ``[T]``; with named outputs,
    ``outputs``; where frames change geometry, ``img_aug_matrix`` float32 ``[cameras, 3, 3]``.
    """

    annotations: dict[str, Any]
    has_annotations: torch.Tensor
    outputs: dict[str, OutputFrames]
    img_aug_matrix: torch.Tensor


class _ClipBatchKeys(TypedDict):
    frames: torch.Tensor | list[torch.Tensor]
    clip_id: list[str]
    frame_index: torch.Tensor
    timestamp: torch.Tensor
    valid: torch.Tensor
    camera_names: list[str]


class ClipBatch(_ClipBatchKeys, total=False):
    """A batch of :class:`ClipSample` s (:func:`collate_clips`): each key of the samples stacked along a first
    dimension ``B`` (``frames`` ``[B, T, cameras, 3, H, W]``, ``frame_index`` and ``timestamp`` ``[B, T]``,
    ``valid`` bool ``[B]``, ``img_aug_matrix`` ``[B, cameras, 3, 3]``); ``clip_id`` is a list, and
    ``camera_names`` the samples' one list. See ``docs/concepts.md``.
    """

    annotations: dict[str, Any]
    has_annotations: torch.Tensor
    img_aug_matrix: torch.Tensor
    outputs: dict[str, OutputFrames]


def clip_sample(
    *,
    clip_id: str,
    camera_names: Sequence[str],
    frame_index: Sequence[int],
    timestamps: Sequence[float],
    valid: bool,
    frames: torch.Tensor | list[torch.Tensor],
    outputs: Mapping[str, torch.Tensor | list[torch.Tensor]] | None = None,
    annotations: tuple[dict[str, Any], torch.Tensor] | None = None,
    geometry: tuple[torch.Tensor, Mapping[str, torch.Tensor]] | None = None,
) -> ClipSample:
    """One sample, its keys in the documented order.

    Args:
        clip_id: The clip.
        camera_names: The order of the cameras dimension.
        frame_index: The frames returned (-1 where unknown).
        timestamps: Their presentation times in seconds.
        valid: False for a sample that could not be read.
        frames: The default output's frames.
        outputs: Each named output's frames.
        annotations: The sample's annotations and ``has_annotations`` (see
            :func:`~lightning_vstream.annotations.batch.sample_annotations`); None: none.
        geometry: ``img_aug_matrix`` of the default output and of each named output, where frames change
            geometry; None where nothing crops or resizes (each output's ``intrinsics`` are then the
            annotations').
    """
    from lightning_vstream.annotations.batch import add_output_geometry, update_intrinsics

    sample: dict[str, Any] = {
        "frames": frames,
        "clip_id": clip_id,
        "frame_index": torch.tensor(list(frame_index), dtype=torch.int64),
        "timestamp": torch.tensor(list(timestamps), dtype=torch.float64),
        "camera_names": list(camera_names),
        "valid": valid,
    }
    if annotations is not None:
        sample["annotations"], sample["has_annotations"] = annotations
    if outputs:
        sample["outputs"] = {name: {"frames": output} for name, output in outputs.items()}
    if geometry is None:
        add_output_geometry(sample, None)
    else:
        add_output_geometry(sample, geometry[1])
        sample["img_aug_matrix"] = geometry[0]
        update_intrinsics(sample)
    return cast(ClipSample, sample)


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
    return torch.diag(torch.tensor([new_width / width, new_height / height, 1.0], dtype=torch.float64))


def output_matrices(
    transform: object, sizes: Sequence[tuple[int, int]], before: Sequence[torch.Tensor]
) -> torch.Tensor:
    """``img_aug_matrix`` ``[cameras, 3, 3]`` of one output: ``before`` (file to decoded and augmented pixels),
    then the transform's crop and resize for each camera's ``(height, width)`` in ``sizes``."""
    from lightning_vstream.annotations.augment import transform_matrix

    out = []
    for (height, width), matrix in zip(sizes, before):
        after = transform_matrix(transform, height, width)
        out.append((matrix if after is None else after.double() @ matrix).to(torch.float32))
    return torch.stack(out) if out else torch.zeros((0, 3, 3))


def stack_frames(frames: Sequence[Any]) -> Any:
    """Stack the samples' frames of one output: one tensor, or one per camera (``camera_frames="per_camera"``)."""
    if isinstance(frames[0], torch.Tensor):
        return torch.stack(list(frames))
    return [torch.stack([f[c] for f in frames]) for c in range(len(frames[0]))]


def stack_geometry(values: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """Stack per-sample ``[cameras, 3, 3]`` matrices; a sample that could not be decoded has none (identity)."""
    like = next(v for v in values if v is not None)
    eye = torch.eye(3, dtype=like.dtype).expand_as(like)
    return torch.stack([v if v is not None else eye for v in values])


def sized_like(sample: Mapping[str, Any], like: Mapping[str, Any]) -> dict[str, Any]:
    """An invalid sample with zero frames of the size (after transform) of a decoded sample ``like``, every output."""

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


def unreadable_sample(clip_id: str, camera_names: list[str], count: int, outputs: Mapping[str, Any]) -> ClipSample:
    """A ``valid=False`` sample of ``count`` frames whose frame size is unknown (``collate_clips`` sizes it
    like the others)."""
    frames = torch.zeros((count, len(camera_names), 3, 0, 0), dtype=torch.uint8)
    return clip_sample(
        clip_id=clip_id,
        camera_names=camera_names,
        frame_index=[-1] * count,
        timestamps=[float("nan")] * count,
        valid=False,
        frames=frames,
        outputs={name: frames for name in outputs},
    )


def collate_clips(samples: Sequence[Mapping[str, Any]], *, pad_annotations: bool = False) -> ClipBatch:
    """Stack clip samples into a :class:`ClipBatch` (use as ``DataLoader(..., collate_fn=collate_clips)``).

    A sample that could not be read (``valid=False``) takes the frame size of the others. Annotations
    batch by the rule of :mod:`lightning_vstream.annotations.batch` (clip fields ``[B, ...]``, frame
    fields ``[B, T, ...]``, ragged fields as ``[B][T]`` lists, or padded ``[B, T, N_max, ...]`` with
    ``<name>_mask`` when ``pad_annotations``).

    Raises:
        ValueError: Samples differ in cameras, frame count ``T`` or frame size.

    Example::

        >>> loader = DataLoader(dataset, batch_size=8, collate_fn=collate_clips)  # doctest: +SKIP
    """
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
    return cast(ClipBatch, batch)
