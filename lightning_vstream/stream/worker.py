"""Worker side of streaming: decode the camera streams one part of a batch asks for.

A *stream* is one (slot, camera) pair of the batch; the loader splits each step's streams
into ``num_parts`` parts and always sends part ``p`` to worker ``p``, so every worker keeps
decoding the same streams sequentially, without seeking (see :mod:`lightning_vstream.stream.worker_loader`).
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import Dataset

from lightning_vstream.annotations.source import resolve_annotations
from lightning_vstream.decode.base import FrameDecoder
from lightning_vstream.decode.counters import DecodeStats
from lightning_vstream.decode.decoder_table import DecoderTable
from lightning_vstream.decode.factory import announce_stride, make_decoder
from lightning_vstream.index import VideoIndex
from lightning_vstream.options import DecodeOptions, ErrorOptions, OutputOptions
from lightning_vstream.profiling import RANGE_DECODE, nvtx_range
from lightning_vstream.stream.failures import FILE_ERRORS, failed_read, frame_size_error
from lightning_vstream.stream.frame_steps import FrameSteps
from lightning_vstream.stream.parts import PartFrames, ReadFailure, StreamPart, StreamRead, StreamTask

__all__ = ["StreamDataset", "trim_heap"]

TRIM_EVERY_CLOSES = 8
RECENT_BUFFERS = 8


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc: nothing to do


def trim_heap() -> None:
    """Give memory freed by closed decoders back to the OS (glibc; a no-op elsewhere).

    FFmpeg's decoding threads allocate from many glibc arenas; after decoders close, glibc keeps
    the freed pages, and a process that opens thousands of files grows by about a megabyte per
    thousand steps although nothing leaks. Trimming now and then keeps resident memory flat.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class StreamDataset(Dataset):
    """Decodes the parts of streaming batches; decoders are created lazily where it runs.

    Constructing it opens nothing, so it can be built in the main process and pickled into
    spawn workers. Each camera stream keeps its decoder while its slot stays on the same clip,
    so consecutive steps decode consecutive frames with no seek.

    Args:
        index: The clips to read.
        decode: Where frames are decoded (``device``: ``"cpu"`` for PyAV, a CUDA device for
            NVDEC), with how many FFmpeg threads, how many decoders each process keeps open (least
            recently used are closed; None keeps one per stream), and ``camera_frames``:
            ``"stacked"`` returns one frame tensor per part, ``"per_camera"`` every frame on its own
            (``StreamPart.images``), so cameras may differ in size.
        output: ``transform`` is applied to every camera frame (as ``[1, 3, H, W]`` uint8) in the
            worker, on the device it was decoded on, before the frame is written into the batch; a
            :class:`~lightning_vstream.FrameTransform`'s resize happens inside CPU video decoders (see
            :meth:`FrameTransform.decoder_size`). ``outputs`` are named outputs made from each decoded
            (and augmented) frame (see :mod:`lightning_vstream.outputs`); on the CPU an output whose
            transform starts with a resize takes its frame from the decoder's conversion at that size
            (:func:`~lightning_vstream.stream.frame_steps.decoder_sizes`). ``annotations`` are looked up for
            every slot's frame by the part that reads the slot's first camera (see
            :mod:`lightning_vstream.annotations`); ``augment`` is applied to every frame before
            ``transform``, drawn once per segment from ``(seed, epoch, clip, segment start)``;
            ``pad_annotations`` batches ragged annotation fields padded with a mask.
        errors: ``on_error="raise"`` stops at the first unreadable frame (or frame of the wrong size)
            with an error naming file, clip, camera and frame; ``"skip"`` reports the failed reads in
            the part, and the loader moves the slot on to its next clip.
        seed: Seed of the augmentation draws.

    Example::

        >>> ds = StreamDataset(index=load_index("data/index.json"))  # doctest: +SKIP
        >>> part = ds[StreamTask(0, 0, 0, (StreamRead(0, 0, 0, 0),))]  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        index: VideoIndex,
        decode: DecodeOptions | None = None,
        output: OutputOptions | None = None,
        errors: ErrorOptions | None = None,
        seed: int = 0,
    ) -> None:
        decode = decode or DecodeOptions()
        output = output or OutputOptions()
        errors = errors or ErrorOptions()
        self.index = index
        #: The option groups, as given (``annotations`` resolved below).
        self.decode = decode
        self.output = output
        self.errors = errors
        annotations = resolve_annotations(output.annotations)
        #: The annotation source of ``output.annotations``, resolved once.
        self.annotations = annotations
        self.seed = seed
        # Video decoded on the CPU is resized by swscale while it converts to RGB (steps.decode_size).
        self.steps = FrameSteps(
            index=index,
            transform=output.transform,
            augment=output.augment,
            seed=seed,
            annotations=annotations,
            on_error=errors.on_error,
            decode_device=decode.device,
            outputs=output.outputs,
        )
        self._given_up: set[tuple[int, int, int]] = set()  # (position, clip, segment) that failed this epoch
        self._epoch = -1
        self._trimmed = 0  # decoders closed when the heap was last trimmed
        # The loader recycles a handful of shared batch buffers. torch maps a received buffer
        # again unless this process still holds it, so holding the last few keeps them mapped
        # and paged in (a few MB of page faults per step otherwise).
        self._recent_buffers: deque[torch.Tensor] = deque(maxlen=RECENT_BUFFERS * (1 + len(self.output.outputs)))
        self._read_errors = 0
        #: This process's decoders, by stream position (each reopened when its slot moves to another clip).
        self.decoders = DecoderTable(limit=self.decode.max_open_decoders)
        #: The rank's stream plan (set by the loader): with a remote index, GOPs are fetched ahead by it.
        self.plan: Any = None
        #: The plan's ``frame_stride`` (set by the loader): each new decoder is told its reads go at that stride.
        self.frame_stride = 1
        self._prefetcher: Any = None

    def __len__(self) -> int:
        return self.index.total_frames * len(self.index.camera_names)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["decoders"] = DecoderTable(limit=self.decode.max_open_decoders)  # decoders never travel between processes
        state["_prefetcher"] = None  # nor I/O threads
        state["_recent_buffers"] = deque(maxlen=RECENT_BUFFERS * (1 + len(self.output.outputs)))
        return state

    @property
    def stats(self) -> DecodeStats:
        """Counters of this process, open decoders included (``frames_delivered`` is the loader's)."""
        stats = self.decoders.counts(self._read_errors)
        if self.index.storage is not None:  # this process's remote reading (every dataset of the process)
            from lightning_vstream.storage.fetcher import fetcher_for

            stats.remote = fetcher_for(self.index.storage).stats
        return stats

    def _trim_now_and_then(self) -> None:
        """Give freed decoder memory back to the OS every :data:`TRIM_EVERY_CLOSES` decoders closed."""
        if self.decoders.closed - self._trimmed >= TRIM_EVERY_CLOSES:
            self._trimmed = self.decoders.closed
            trim_heap()

    def close(self) -> None:
        """Close every decoder of this process."""
        self.decoders.close_all()
        self._trim_now_and_then()

    def _decoder(self, read: StreamRead) -> FrameDecoder:
        """The decoder of ``read``'s stream for its clip, opened (and older ones closed) as needed."""
        decoder: FrameDecoder = self.decoders.get(read.position, functools.partial(self._open, read), version=read.clip)
        self._trim_now_and_then()
        return decoder

    def _open(self, read: StreamRead) -> FrameDecoder:
        clip = self.index.clips[read.clip]
        camera = clip.cameras[read.camera]
        decoder = make_decoder(
            camera.path,
            info=camera.info,
            threads=self.decode.decoder_threads,
            label=f"clip {clip.clip_id!r}, camera {camera.name!r}",
            device=self.decode.device,
            size=self.steps.decode_size,
            storage=self.index.storage,  # a remote index: GOP reads (None for local files)
        )
        return announce_stride(decoder, read.frame, self.frame_stride)

    def _read(
        self, read: StreamRead, out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[tuple[int, int], torch.Tensor]]:
        """Decode one camera frame (into ``out`` when the backend can), with the decoder's conversions of it to
        :attr:`FrameSteps.extra_sizes` (CPU video only); failures become named errors (see
        :func:`~lightning_vstream.stream.failures.failed_read`)."""
        converted: dict[tuple[int, int], torch.Tensor] = {}
        try:
            dec = self._decoder(read)
            # CPU video decoders (PyAVDecoder, GopDecoder) decode into ``out`` and convert to more sizes.
            sized: Any = dec if hasattr(dec, "get_sizes") else None
            with nvtx_range(RANGE_DECODE):
                sizes = self.steps.extra_sizes if sized is not None else ()
                if out is not None and sized is not None:
                    if tuple(out.shape) != (3, *sized.output_size):
                        raise self._size_error(read, (3, *sized.output_size), tuple(out.shape))
                    image, converted = sized.get_sizes(read.frame, sizes, out=out)
                elif sizes:
                    image, converted = sized.get_sizes(read.frame, sizes)
                else:
                    image = dec.get(read.frame)
        except Exception as err:
            failure = failed_read(err, self.index, read.clip, read.camera, read.frame)
            if failure is None or failure is err:
                raise
            raise failure from err
        if image.device.type != torch.device(self.decode.device).type:
            image = image.to(self.decode.device)  # image folders decode on the CPU
        return image, converted

    def _size_error(
        self,
        read: StreamRead,
        got: tuple[int, ...],
        expected: tuple[int, ...],
        *,
        got_dtype: torch.dtype | None = None,
        expected_dtype: torch.dtype | None = None,
    ) -> Exception:
        return frame_size_error(
            self.index,
            read.clip,
            read.camera,
            read.frame,
            got,
            expected,
            got_dtype=got_dtype,
            expected_dtype=expected_dtype,
        )

    def _deliver(
        self, read: StreamRead, out: torch.Tensor | None, epoch: int, frames: dict[str, PartFrames]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Decode one camera frame (into ``out`` when given), augment it, and make every output of it.

        ``out`` is given only when nothing follows the decoder (see ``direct`` in
        :meth:`__getitem__`), so a frame decoded into it is delivered as it is. The frame's geometry
        goes into ``frames`` (per output). Returns the default output and the named ones.
        """
        image, converted = self._read(read, out)
        if self.has_geometry:
            info = self.decoders.peek(read.position).info
            size = (info.height, info.width, epoch, read.clip, read.segment_start)
            frames[""].geometry[read.position] = self.steps.geometry(*size)
            for name, matrix in self.steps.output_geometry(*size).items():
                frames[name].geometry[read.position] = matrix
        if out is not None and image.data_ptr() == out.data_ptr():
            return image, self.steps.extra_outputs(image, converted)
        augmented = self.steps.augmented(image, epoch, read.clip, read.segment_start)
        return self.steps.transformed(augmented, converted), self.steps.extra_outputs(augmented, converted)

    def __getitem__(self, task: StreamTask) -> StreamPart:
        worker = torch.utils.data.get_worker_info()
        in_worker = worker is not None
        if task.epoch != self._epoch:
            self._epoch = task.epoch
            self._given_up.clear()  # segment numbers belong to one epoch's plan
            self.steps.forget_draws()
        if self.plan is not None and self.index.storage is not None:
            self._prefetch(task)
        part = _PartBuilder(task, ["", *self.output.outputs], per_camera=self.decode.camera_frames == "per_camera")
        if in_worker:
            self._recent_buffers.extend(part.buffers.values())
        # Decode straight into the batch when nothing is left to do after the decoder.
        direct = task.buffer is not None and self.steps.direct
        for i, read in enumerate(task.reads):
            self._read_one(part, i, read, task.epoch, direct, in_worker)
        return part.finish(worker=(os.getpid(), worker.id if worker is not None else -1), stats=self.stats)

    def _read_one(
        self, part: _PartBuilder, i: int, read: StreamRead, epoch: int, direct: bool, in_worker: bool
    ) -> None:
        """Decode the ``i``-th read of a part into it: every output of the frame, its timestamp, geometry and
        annotations; or, under ``on_error="skip"``, record the failure (the loader decides what it means)."""
        path = str(self.index.clips[read.clip].cameras[read.camera].path)
        if read.segment >= 0 and (read.position, read.clip, read.segment) in self._given_up:
            # Issued before the loader learnt of the failure (the worker cannot see the loader's skips): fail
            # at once, without decoding; the loader marks the slot invalid.
            part.failed.append(ReadFailure(read.position, path, "clip given up after an earlier error"))
            return
        try:
            row = part.row("", read.position)
            image, extras = self._deliver(read, row if direct else None, epoch, part.frames)
            outputs = {"": image, **extras}
            for key, frame in outputs.items():
                self._place(read, frame, part.row(key, read.position), part.expected[key])
        except FILE_ERRORS as err:
            if self.errors.on_error == "raise":
                raise
            # The loader decides what the failure means for the slot; here the decoder goes
            # and the rest of this stream's segment fails without decoding.
            self._read_errors += 1
            self._given_up.add((read.position, read.clip, read.segment))
            self.decoders.drop(read.position)
            self._trim_now_and_then()
            part.forget_geometry(read.position)
            part.failed.append(ReadFailure(read.position, path, str(err)))
            return
        part.add(i, read.position, outputs, in_worker)
        part.timestamps[i] = self.decoders.peek(read.position).info.timestamp(read.frame)
        if self.annotations is not None and read.camera == 0:
            self._annotate(read, part.timestamps[i], part.annotations, part.missing)

    def _prefetch(self, task: StreamTask) -> None:
        """Announce the GOPs this part's streams read after this step (remote indexes; see stream/prefetch.py)."""
        from lightning_vstream.stream.prefetch import StreamPrefetcher

        if self._prefetcher is None or self._prefetcher.fetcher.pid != os.getpid():
            self._prefetcher = StreamPrefetcher(self.index, self.plan)
        reads = [(r.position, r.clip, r.camera, r.frame, r.segment) for r in task.reads]
        self._prefetcher.observe(task.epoch, task.step, reads)

    def _place(
        self, read: StreamRead, image: torch.Tensor, row: torch.Tensor | None, expected: tuple[int, ...] | None
    ) -> None:
        """Check one output frame against the batch's frame shape and write it into its row (when given)."""
        if expected is not None and tuple(image.shape) != expected:
            raise self._size_error(read, tuple(image.shape), expected)
        if row is not None and image.data_ptr() != row.data_ptr():
            # Augmented, transformed, or from a decoder that does not write into ``out``.
            if image.dtype != row.dtype:
                raise self._size_error(
                    read, tuple(image.shape), tuple(row.shape), got_dtype=image.dtype, expected_dtype=row.dtype
                )
            row.copy_(image)

    @property
    def has_geometry(self) -> bool:
        """True when frames change geometry here (augmentation, or a transform that crops or resizes)."""
        return self.steps.has_geometry

    def _annotate(
        self, read: StreamRead, timestamp: float, out: dict[int, dict[str, Any]], missing: list[tuple[int, str]]
    ) -> None:
        slot = read.position // len(self.index.camera_names)
        found, why = self.steps.annotate(read.clip, read.frame, timestamp)
        if found is not None:
            out[slot] = found
        else:
            missing.append((slot, str(why)))


class _PartBuilder:
    """What a worker gathers while it reads the frames of one part, then returns as a :class:`StreamPart`.

    Per output (``""``: the default one), frames go to one of three places (see
    :mod:`lightning_vstream.stream.parts`): the row of the step's shared buffer (``buffers``), a list
    stacked into one tensor at the end, or one by one (``camera_frames="per_camera"``). ``expected``
    is the shape every frame of an output must have, where the batch's size is known already.
    """

    def __init__(self, task: StreamTask, keys: list[str], *, per_camera: bool) -> None:
        self.task = task
        self.per_camera = per_camera
        self.buffers: dict[str, torch.Tensor] = {
            key: buffer
            for key, buffer in [("", task.buffer), *(task.output_buffers or {}).items()]
            if buffer is not None
        }
        shapes = {"": task.frame_shape, **(task.output_shapes or {})}
        self.expected: dict[str, tuple[int, ...] | None] = {
            key: None if per_camera else tuple(self.buffers[key].shape[1:]) if key in self.buffers else shapes.get(key)
            for key in keys
        }
        count = len(task.reads)
        self.stacked: dict[str, list[torch.Tensor | None]] = {key: [None] * count for key in keys}
        self.frames = {key: PartFrames() for key in keys}
        self.timestamps = [math.nan] * count
        self.failed: list[ReadFailure] = []
        self.annotations: dict[int, dict[str, Any]] = {}
        self.missing: list[tuple[int, str]] = []

    def row(self, key: str, position: int) -> torch.Tensor | None:
        """The row of stream ``position`` in output ``key``'s shared buffer (None: no buffer)."""
        buffer = self.buffers.get(key)
        return buffer[position] if buffer is not None else None

    def add(self, i: int, position: int, outputs: dict[str, torch.Tensor], in_worker: bool) -> None:
        """The frames of the ``i``-th read, every output, where the part returns them (unless written already)."""
        for key, frame in outputs.items():
            if self.per_camera:
                self.frames[key].images[position] = _own(frame, in_worker)
            elif key not in self.buffers:
                self.stacked[key][i] = frame

    def forget_geometry(self, position: int) -> None:
        for frames in self.frames.values():
            frames.geometry.pop(position, None)

    def finish(self, *, worker: tuple[int, int], stats: DecodeStats) -> StreamPart:
        """The part, its stacked frames in shared memory when it leaves a worker process (``worker[1] >= 0``)."""
        for key, frames in self.frames.items():
            if not self.per_camera and key not in self.buffers:
                frames.stacked = _stack(self.stacked[key])
                if worker[1] >= 0:
                    _share(frames.stacked)
        return StreamPart(
            epoch=self.task.epoch,
            step=self.task.step,
            part=self.task.part,
            worker=worker,
            positions=[read.position for read in self.task.reads],
            timestamps=self.timestamps,
            stats=stats,
            failed=self.failed,
            annotations=self.annotations,
            missing=self.missing,
            frames=self.frames,
        )


def _share(stacked: torch.Tensor | list[torch.Tensor | None] | None) -> None:
    """Move a part's CPU frames into shared memory once, so the loader receives them without a copy."""
    for tensor in [stacked] if isinstance(stacked, torch.Tensor) else stacked or []:
        if tensor is not None and tensor.device.type == "cpu":
            tensor.share_memory_()


def _own(image: torch.Tensor, in_worker: bool) -> torch.Tensor:
    """A frame to return on its own from a worker: a copy in shared memory (a decoder may reuse its output memory)."""
    if in_worker and image.device.type == "cpu":
        return image.clone().share_memory_()
    return image


def _stack(images: list[torch.Tensor | None]) -> torch.Tensor | list[torch.Tensor | None] | None:
    """One tensor for a part's frames (rows of failed reads uninitialised); a list when sizes differ."""
    delivered = [image for image in images if image is not None]
    if not delivered:
        return None
    first = delivered[0]
    if any(image.shape != first.shape or image.dtype != first.dtype for image in delivered):
        return images  # the loader knows the batch's size and names the frames that differ
    frames = torch.empty((len(images), *first.shape), dtype=first.dtype, device=first.device)
    for row, image in enumerate(images):
        if image is not None:
            frames[row].copy_(image)
    return frames
