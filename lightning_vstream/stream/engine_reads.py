"""One decode thread of the stream engine: its decoders, and the writing of one camera frame into its rows.

Each engine thread owns a :class:`ThreadDecoders`: the decoders of the camera streams it serves
(its slot's :class:`~lightning_vstream.decode.decoder_table.DecoderTable` of the runner,
:class:`~lightning_vstream.decode.threads.DecodeThreads`; kept while a slot stays on a clip), and
:meth:`ThreadDecoders.write`, which decodes one frame straight into its batch row, or decodes it,
augments and transforms it (:class:`~lightning_vstream.stream.frame_steps.FrameSteps`) and copies it
there; then makes every named output of that one decoded frame
(:mod:`lightning_vstream.outputs`) and copies each into its own batch's row, on the same thread
(and, on a GPU, the same stream). What a decoder raises becomes the same named error as in the
worker loader (:func:`~lightning_vstream.stream.failures.failed_read`); a frame of another size is
a :class:`~lightning_vstream.errors.FrameSizeError`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch

from lightning_vstream.decode.base import FrameDecoder, VideoInfo
from lightning_vstream.decode.counters import DecodeStats
from lightning_vstream.decode.decoder_table import DecoderTable
from lightning_vstream.decode.factory import DecoderFactory, announce_stride
from lightning_vstream.errors import ConfigurationError
from lightning_vstream.index import VideoIndex
from lightning_vstream.profiling import RANGE_TRANSFORM, nvtx_range
from lightning_vstream.stream.failures import failed_read, frame_size_error
from lightning_vstream.stream.frame_steps import FrameSteps

__all__ = ["ThreadDecoders"]


class ThreadDecoders:
    """The decoders of one engine thread, by stream position, and its decoding counters.

    Args:
        index: The clips read.
        factory: ``(path, info, label) -> decoder`` for one camera stream.
        steps: What follows decoding (augmentation, transform).
        table: The thread's decoders, by stream position (its ``limit``: open decoders this thread keeps,
            the least recently used closed; None: one per stream).
        stride: The plan's ``frame_stride``: each new decoder is told its reads go every ``stride``-th
            frame from its first (:func:`~lightning_vstream.decode.factory.announce_stride`).

    Example::

        >>> decoders = ThreadDecoders(index, pyav_factory(threads=1), FrameSteps(index=index), DecoderTable())  # doctest: +SKIP
        >>> info = decoders.write(position=0, clip=0, camera=0, frame=0, row=batch[0], epoch=0, segment_start=0)  # doctest: +SKIP
        >>> info = decoders.write(position=1, clip=0, camera=1, frame=0, row=batch[1], epoch=0, segment_start=0,
        ...                       outputs={"small": small_batch[1]})  # doctest: +SKIP
    """

    def __init__(
        self, index: VideoIndex, factory: DecoderFactory, steps: FrameSteps, table: DecoderTable, *, stride: int = 1
    ) -> None:
        self.index = index
        self.factory = factory
        self.steps = steps
        self.table = table
        self.stride = stride
        self.limit = table.limit
        # position -> (clip, decoder, timestamps of its frames) for read_into, whose row was checked once. Only
        # used without a limit (no decoder leaves the table but through close()).
        self._direct: dict[int, tuple[int, FrameDecoder, list[float]]] = {}
        self.read_errors = 0

    def counts(self) -> DecodeStats:
        """Frames decoded, seeks, files opened, packets left out and read errors of this thread so far."""
        return self.table.counts(self.read_errors)

    def write(
        self,
        *,
        position: int,
        clip: int,
        camera: int,
        frame: int,
        row: torch.Tensor,
        epoch: int,
        segment_start: int,
        outputs: Mapping[str, torch.Tensor] | None = None,
    ) -> VideoInfo:
        """Decode ``frame`` of stream ``position`` into ``row``, and each named output into its row of ``outputs``.

        The frame is decoded (and augmented) once; the named outputs (``steps.outputs``) are made
        from that frame, or from the decoder's conversion of it at their size
        (:attr:`FrameSteps.extra_sizes <lightning_vstream.stream.frame_steps.FrameSteps.extra_sizes>`).

        Args:
            position: The stream (``slot * cameras + camera``).
            clip: Ordinal of the clip in the index.
            camera: Ordinal of the camera.
            frame: Frame index in the camera's file.
            row: Where the default output of the frame goes.
            epoch: Keys the augmentation draw, with ``clip`` and ``segment_start``.
            segment_start: First step of the slot's clip segment.
            outputs: Per named output, where its frame goes (every name of ``steps.outputs``).

        Returns:
            The file's frame table.

        Raises:
            VideoDecodeError: (or another of :data:`~lightning_vstream.stream.failures.FILE_ERRORS`)
                The frame cannot be read, or an output has another size or dtype than its row.
        """
        decoded, converted = self._decode(position, clip, camera, frame, row)
        base = row  # what the named outputs are made from: the augmented frame, or the row decoded into
        if decoded is not None:  # decoded into a frame of its own: finish it, then copy it into its row
            with nvtx_range(RANGE_TRANSFORM):
                base = self.steps.augmented(decoded, epoch, clip, segment_start)
                image = self.steps.transformed(base, converted)
            self._place(image, row, clip, camera, frame)
        if self.steps.outputs:
            if outputs is None or set(outputs) != set(self.steps.outputs):
                raise ConfigurationError(
                    f"ThreadDecoders.write: outputs must give a row for each of {list(self.steps.outputs)}, "
                    f"got {None if outputs is None else list(outputs)}."
                )
            with nvtx_range(RANGE_TRANSFORM):
                for name, extra in self.steps.extra_outputs(base, converted).items():
                    self._place(extra, outputs[name], clip, camera, frame)
        return self.table.peek(position).info

    def read_into(self, position: int, clip: int, camera: int, frame: int, row: torch.Tensor) -> float:
        """Decode ``frame`` of stream ``position`` straight into ``row`` when nothing follows the decoder; its timestamp.

        What :meth:`write` does for a frame with no transform left to apply, no augmentation and no named
        output, in fewer steps: the row's shape and dtype are checked against the decoder's frames once per
        file (they do not change while the file is read), and the timestamps of the file's frames are
        computed once.

        Args:
            position: The stream (``slot * cameras + camera``).
            clip: Ordinal of the clip in the index.
            camera: Ordinal of the camera.
            frame: Frame index in the camera's file.
            row: Where the frame goes.

        Returns:
            The frame's presentation time in seconds.

        Raises:
            VideoDecodeError: (or another of :data:`~lightning_vstream.stream.failures.FILE_ERRORS`)
                The frame cannot be read, or the row has another shape or dtype than its frames.
        """
        entry = self._direct.get(position)
        try:
            if entry is None or entry[0] != clip:
                entry = self._direct_entry(position, clip, camera, frame, row)
            entry[1].get(frame, out=row)  # type: ignore[call-arg]
        except Exception as err:
            failure = failed_read(err, self.index, clip, camera, frame)
            if failure is None or failure is err:
                raise
            raise failure from err
        return entry[2][frame]

    def _direct_entry(
        self, position: int, clip: int, camera: int, frame: int, row: torch.Tensor
    ) -> tuple[int, FrameDecoder, list[float]]:
        """The decoder of stream ``position`` for ``clip`` once its frames are known to fit ``row``."""
        dec = self.decoder(position, clip, camera, frame)
        self._check_row(dec, row, clip, camera, frame)
        entry = (clip, dec, dec.info.timestamps)
        self._direct[position] = entry
        return entry

    def _check_row(self, dec: FrameDecoder, row: torch.Tensor, clip: int, camera: int, frame: int) -> None:
        """Raise a :class:`~lightning_vstream.errors.FrameSizeError` unless ``dec``'s frames fit ``row`` as they are."""
        size = getattr(dec, "output_size", None) or (dec.info.height, dec.info.width)
        if tuple(row.shape) != (3, *size) or row.dtype != torch.uint8:
            raise frame_size_error(
                self.index,
                clip,
                camera,
                frame,
                (3, *size),
                tuple(row.shape),
                got_dtype=torch.uint8,
                expected_dtype=row.dtype,
            )

    def _place(self, image: torch.Tensor, row: torch.Tensor, clip: int, camera: int, frame: int) -> None:
        """Copy one finished frame into its row; another shape or dtype is a :class:`~lightning_vstream.errors.FrameSizeError`."""
        if image.shape != row.shape or image.dtype != row.dtype:
            raise frame_size_error(
                self.index,
                clip,
                camera,
                frame,
                tuple(image.shape),
                tuple(row.shape),
                got_dtype=image.dtype,
                expected_dtype=row.dtype,
            )
        row.copy_(image)

    def _decode(
        self, position: int, clip: int, camera: int, frame: int, row: torch.Tensor
    ) -> tuple[torch.Tensor | None, dict[tuple[int, int], torch.Tensor]]:
        """Decode straight into ``row`` (None) when nothing follows the decoder, else return the frame; with the
        decoder's conversions of it to :attr:`FrameSteps.extra_sizes` (decoders that have ``get_sizes``).

        What the decoder raises becomes a named error (see :func:`~lightning_vstream.stream.failures.failed_read`).
        """
        try:
            dec = self.decoder(position, clip, camera, frame)
            # Empty unless CPU decoders convert to more sizes than their own (see decoder_sizes).
            sizes = self.steps.extra_sizes if hasattr(dec, "get_sizes") else ()
            if not self.steps.direct:
                if sizes:
                    return dec.get_sizes(frame, sizes)  # type: ignore[attr-defined]
                return dec.get(frame), {}
            self._check_row(dec, row, clip, camera, frame)
            if sizes:
                _, converted = dec.get_sizes(frame, sizes, out=row)  # type: ignore[attr-defined]
                return None, converted
            dec.get(frame, out=row)  # type: ignore[call-arg]
            return None, {}
        except Exception as err:
            failure = failed_read(err, self.index, clip, camera, frame)
            if failure is None or failure is err:
                raise
            raise failure from err

    def decoder(self, position: int, clip_ordinal: int, camera_ordinal: int, frame: int = 0) -> FrameDecoder:
        """The decoder of stream ``position`` for ``clip_ordinal``, opened (and older ones closed) as needed; a new
        one is told that its reads start at ``frame`` and go on at the plan's stride."""
        return self.table.get(
            position, functools.partial(self._open, clip_ordinal, camera_ordinal, frame), version=clip_ordinal
        )

    def _open(self, clip_ordinal: int, camera_ordinal: int, frame: int) -> FrameDecoder:
        clip = self.index.clips[clip_ordinal]
        camera = clip.cameras[camera_ordinal]
        decoder = self.factory(camera.path, camera.info, f"clip {clip.clip_id!r}, camera {camera.name!r}")
        return announce_stride(decoder, frame, self.stride)

    def close(self, position: int) -> None:
        """Close the decoder of stream ``position`` (after a failure), keeping its counters."""
        self._direct.pop(position, None)
        self.table.drop(position)

    def close_all(self) -> None:
        """Close every decoder of this thread."""
        self._direct.clear()
        self.table.close_all()
