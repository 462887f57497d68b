"""The streaming batch: its keys (:class:`StreamBatch`) and the one stage that builds it (:class:`StepAssembler`).

Both stream loaders deliver the same batch, built here: the worker loader
(:class:`~lightning_vstream.stream.worker_loader.StreamDataLoader`) once it has put its parts' frames
into the batch's tensors, and the thread engine (:class:`~lightning_vstream.stream.engine.StreamEngine`)
from the batch its threads wrote into (a ring on a GPU, a pool of host batches on the CPU). What
differs between them is only where the frames come from; the labels, the padding of invalid slots,
the named outputs, the annotations and the geometry are made one way. The keys are documented once,
in ``docs/concepts.md`` ("The batch").

A :class:`StreamBatch` is a plain ``dict`` at run time (a ``TypedDict``), so Lightning moves it to the
device (``apply_to_collection``), callbacks and models index it by key, and ``torch.save`` stores it
as any dict.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict, cast

import numpy as np
import torch

from lightning_vstream.annotations.batch import add_annotations
from lightning_vstream.decode.counters import DecodeStats
from lightning_vstream.index import VideoIndex
from lightning_vstream.outputs import OutputFrames
from lightning_vstream.stream.failures import describe_streams

if TYPE_CHECKING:
    from lightning_vstream.stream.frame_steps import FrameSteps
    from lightning_vstream.stream.sampler import StreamSampler
    from lightning_vstream.stream.schedule import SlotRead

__all__ = ["StepAssembler", "StreamBatch", "attach_annotations"]

log = logging.getLogger("lightning_vstream")

#: A frame tensor of a batch, ``[slots, cameras, ...]``, or one ``[slots, ...]`` tensor per camera.
Frames = torch.Tensor | list[torch.Tensor]


class _StreamBatchKeys(TypedDict):
    frames: torch.Tensor | list[torch.Tensor]
    clip_id: list[str]
    frame_index: torch.Tensor
    is_first: torch.Tensor
    valid: torch.Tensor
    timestamp: torch.Tensor
    camera_timestamp: torch.Tensor
    camera_names: list[str]
    epoch: int
    step: int


class StreamBatch(_StreamBatchKeys, total=False):
    """One step of a streaming loader: slot ``s`` holds frame ``t`` of the clip it follows, every camera.

    Keys (shapes for ``slots`` slots and ``cameras`` cameras; see ``docs/concepts.md``):

    - ``frames``: uint8 ``[slots, cameras, 3, H, W]`` (the ``transform`` may change dtype and size), or
      with ``camera_frames="per_camera"`` a list of ``[slots, 3, H_c, W_c]``, one per camera;
    - ``clip_id``: the clip each slot reads (``""`` where it holds no frame);
    - ``frame_index``: int64 ``[slots]``, the frame in its clip (-1 where the slot holds no frame);
    - ``is_first``: bool ``[slots]``, True where the slot starts a clip or segment (reset its memory);
    - ``valid``: bool ``[slots]``, False for padding and for a clip skipped after a failed read
      (``on_error="skip"``); such slots hold zeros;
    - ``timestamp``: float64 ``[slots]``, seconds, the first camera's (NaN where not valid);
    - ``camera_timestamp``: float64 ``[slots, cameras]``;
    - ``camera_names``: the order of the ``cameras`` dimension;
    - ``epoch``, ``step``: the batch's place in the stream plan.

    With named outputs, ``outputs``: ``{name: {"frames", "img_aug_matrix", "intrinsics"}}`` laid out like
    ``frames``; with annotations, ``annotations`` and ``has_annotations`` bool ``[slots]``; where frames
    change geometry (augmentation, a cropping or resizing transform), ``img_aug_matrix`` float32
    ``[slots, cameras, 3, 3]``.

    Example::

        >>> from lightning_vstream import StreamBatch
        >>> sorted(StreamBatch.__required_keys__)[:3]
        ['camera_names', 'camera_timestamp', 'clip_id']
    """

    outputs: dict[str, OutputFrames]
    annotations: dict[str, Any]
    has_annotations: torch.Tensor
    img_aug_matrix: torch.Tensor


class StepAssembler:
    """The last stage of both stream loaders, written once: which slots of a step deliver a frame, the step's
    counters, its batch, and the camera streams a lane of decoders reads (for errors).

    Args:
        index: The clips read (clip ids and camera names).
        sampler: The stream sampler: the plan, its epoch and the ledger of skips and counters.
        steps: What followed decoding (which outputs, annotations and geometry there are).
        pad_annotations: Pad ragged annotation fields with a mask instead of delivering lists.

    Example::

        >>> assembler = StepAssembler(index, sampler, steps, pad_annotations=False)  # doctest: +SKIP
        >>> batch = assembler.batch(step, reads, assembler.valid(step, reads), frames, timestamps)  # doctest: +SKIP
    """

    def __init__(self, index: VideoIndex, sampler: StreamSampler, steps: FrameSteps, *, pad_annotations: bool) -> None:
        self.index = index
        self.sampler = sampler
        self.ledger = sampler.ledger
        self.steps = steps
        self.pad_annotations = pad_annotations
        self.clip_ids: dict[int, str] = {}  # clip ordinal -> its id, as batches label slots

    def valid(self, step: int, reads: Sequence[SlotRead | None]) -> list[bool]:
        """Per slot, whether it delivers a frame at ``step``: it reads one, of a clip not given up there."""
        ledger = self.ledger
        if not ledger.any_given_up:
            return [r is not None for r in reads]
        return [r is not None and not ledger.invalid(slot, r.segment, step) for slot, r in enumerate(reads)]

    def count(self, step: int, reads: Sequence[SlotRead | None], valid: list[bool], shifts: Sequence[int]) -> None:
        """Count the step's frames delivered and skipped in the ledger (once per step, as it is delivered)."""
        sampler = self.sampler
        self.ledger.count_step(
            reads=reads,
            valid=valid,
            shifts=shifts,
            step=step,
            num_steps=sampler.schedule().num_steps,
            cameras=sampler.num_cameras,
        )

    def give_up(self, step: int, position: int, read: SlotRead, shift: int, *, path: str, error: object) -> None:
        """Give up the segment slot ``position // cameras`` reads at ``step``: a read of it failed
        (``on_error="skip"``); the ledger moves the slot on to its next clip and counts the skip."""
        slot = position // self.sampler.num_cameras
        clip_id = self.index.clips[read.clip].clip_id
        self.sampler.give_up(slot, step, shift, read, clip_id=clip_id, path=path, error=error)

    def streams(self, step: int, reads: Sequence[SlotRead | None] | None, lane: int, lanes: int) -> str:
        """The camera streams lane ``lane`` of ``lanes`` (a decode thread, a worker's part) reads at ``step``:
        slot, camera, clip, frame and file, for errors. Position ``slot * cameras + camera`` belongs to lane
        ``position % lanes``, in both loaders."""
        if reads is None:
            return "camera streams not known yet (the step is not planned yet)"
        cams = self.sampler.num_cameras
        streams = [
            (position // cams, position % cams, reads[position // cams])
            for position in range(lane, len(reads) * cams, lanes)
            if reads[position // cams] is not None
        ]
        return describe_streams(self.index, streams) or "no camera stream at this step"

    def batch(
        self,
        step: int,
        reads: Sequence[SlotRead | None],
        valid: list[bool],
        frames: Mapping[str, Frames],
        camera_timestamps: np.ndarray,
        *,
        annotations: Iterable[tuple[int, Mapping[str, Any]]] = (),
        missing: Iterable[tuple[int, str]] = (),
        geometry: Iterable[tuple[int, Any]] = (),
        output_geometry: Mapping[str, Iterable[tuple[int, Any]]] | None = None,
    ) -> StreamBatch:
        """The batch of one step: the frames of every output, the slots' labels, and what the frames carry.

        Args:
            step: The step of the plan.
            reads: What each slot read at this step (None: padding).
            valid: Per slot, whether it delivers a frame; the rows of the others are zeroed in every output.
            frames: Per output (``""``: the default one, else a name of ``steps.outputs``), the step's frames
                laid out as delivered (``[slots, cameras, ...]``, or a list of ``[slots, ...]`` per camera).
            camera_timestamps: float64 ``[slots, cameras]`` presentation times of the frames decoded; set
                to NaN here for slots that are not valid.
            annotations: ``(slot, annotations of its frame)`` as looked up.
            missing: ``(slot, why)`` of the slots whose annotation is missing (``on_error="skip"``); counted
                in the ledger's counters.
            geometry: ``(slot * cameras + camera, img_aug_matrix)`` of the frames decoded.
            output_geometry: Per named output, ``(slot * cameras + camera, img_aug_matrix)``.

        Returns:
            The batch, with its keys in the documented order.
        """
        index, steps, clip_ids = self.index, self.steps, self.clip_ids
        cameras = len(index.camera_names)
        for output in frames.values():
            _zero_invalid(output, valid)
        camera_timestamps[[slot for slot, ok in enumerate(valid) if not ok]] = math.nan
        ids, frame_index, is_first = [], [], []
        for read, ok in zip(reads, valid):
            if ok and read is not None:
                clip_id = clip_ids.get(read.clip)
                if clip_id is None:
                    clip_id = clip_ids[read.clip] = index.clips[read.clip].clip_id
                ids.append(clip_id)
                frame_index.append(read.frame)
                is_first.append(read.is_first)
            else:
                ids.append("")
                frame_index.append(-1)
                is_first.append(False)
        batch: dict[str, Any] = {
            "frames": frames[""],
            "clip_id": ids,
            # Small label tensors through numpy: a third of what torch.tensor(list) costs the host.
            "frame_index": torch.from_numpy(np.array(frame_index, dtype=np.int64)),
            "is_first": torch.from_numpy(np.array(is_first, dtype=np.bool_)),
            "valid": torch.from_numpy(np.array(valid, dtype=np.bool_)),
            "timestamp": torch.from_numpy(camera_timestamps[:, 0].copy()),
            "camera_timestamp": torch.from_numpy(camera_timestamps),
            "camera_names": list(index.camera_names),
            "epoch": self.sampler.epoch,
            "step": step,
        }
        if steps.outputs:
            batch["outputs"] = {name: {"frames": frames[name]} for name in steps.outputs}
        if steps.annotations is not None or steps.has_geometry:
            attach_annotations(
                batch,
                steps,
                valid=valid,
                cameras=cameras,
                found=annotations,
                missing=missing,
                geometry=geometry,
                pad=self.pad_annotations,
                stats=self.ledger.stats,
                output_geometry=output_geometry,
            )
        return cast(StreamBatch, batch)


def _zero_invalid(frames: Frames, valid: Sequence[bool]) -> None:
    """Padding and failed slots hold zeros, never stale frames or uninitialised memory."""
    if all(valid):
        return
    for tensor in frames if isinstance(frames, list) else [frames]:
        for slot, ok in enumerate(valid):
            if not ok:
                tensor[slot].zero_()


def attach_annotations(
    batch: dict[str, Any],
    steps: FrameSteps,
    *,
    valid: list[bool],
    cameras: int,
    found: Iterable[tuple[int, Mapping[str, Any]]],
    missing: Iterable[tuple[int, str]],
    geometry: Iterable[tuple[int, Any]],
    pad: bool,
    stats: DecodeStats,
    output_geometry: Mapping[str, Iterable[tuple[int, Any]]] | None = None,
) -> None:
    """Add ``annotations`` / ``has_annotations`` and ``img_aug_matrix`` (and each output's geometry) to a batch.

    Values the decoding side returned as numpy arrays (pickled by value from workers) become tensors
    here; slots that are not valid get none.

    Args:
        batch: The batch, changed in place.
        steps: What followed decoding (whether there are annotations, and geometry).
        valid: Per slot, whether it delivers a frame.
        cameras: Cameras per slot.
        found: ``(slot, annotations of its frame)``.
        missing: ``(slot, why)`` of the slots whose annotation is missing (``on_error="skip"``).
        geometry: ``(slot * cameras + camera, img_aug_matrix)`` of the frames delivered.
        pad: Pad ragged fields with a mask instead of delivering lists.
        stats: Counts the valid slots delivered without their annotation (``missing_annotations``).
        output_geometry: Per named output, ``(slot * cameras + camera, img_aug_matrix)`` of its frames.
    """
    slots = len(valid)
    items: list[dict[str, Any] | None] = [None] * slots

    def by_position(pairs: Iterable[tuple[int, Any]]) -> list[torch.Tensor | None]:
        matrices: list[torch.Tensor | None] = [None] * (slots * cameras)
        for position, matrix in pairs:
            if valid[position // cameras]:
                matrices[position] = torch.from_numpy(matrix) if isinstance(matrix, np.ndarray) else matrix
        return matrices

    for slot, values in found:
        if valid[slot]:
            items[slot] = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in values.items()}
    for slot, why in missing:
        if valid[slot]:
            stats.missing_annotations += 1
            if stats.missing_annotations <= 3:
                log.warning("delivering a frame without annotations (has_annotations=False): %s", why)
    add_annotations(
        batch,
        items if steps.annotations is not None else None,
        ragged=getattr(steps.annotations, "ragged", ()),
        pad=pad,
        matrices=by_position(geometry) if steps.has_geometry else None,
        cameras=cameras,
        output_matrices={name: by_position(pairs) for name, pairs in (output_geometry or {}).items()}
        if steps.has_geometry
        else None,
    )
