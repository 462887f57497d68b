"""One decode thread of the stream engine: its decoders, and the writing of one camera frame into its row.

Each engine thread owns a :class:`ThreadDecoders`: the decoders of the camera streams it serves
(kept while a slot stays on a clip), the counters of the decoders it closed, and
:meth:`ThreadDecoders.write`, which decodes one frame straight into its batch row, or decodes it,
augments and transforms it (:class:`~lightning_vstream.stream.frames.FrameSteps`) and copies it
there. What a decoder raises becomes the same named error as in the worker loader
(:func:`~lightning_vstream.stream.failures.failed_read`); a frame of another size is a
:class:`~lightning_vstream.errors.FrameSizeError`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

from lightning_vstream.decode.base import FrameDecoder, VideoInfo
from lightning_vstream.index import VideoIndex
from lightning_vstream.profiling import RANGE_TRANSFORM, nvtx_range
from lightning_vstream.stream.failures import failed_read, frame_size_error
from lightning_vstream.stream.frames import FrameSteps

__all__ = ["DecoderFactory", "ThreadDecoders"]

log = logging.getLogger("lightning_vstream")
DecoderFactory = Callable[[Path, "VideoInfo | None", str], FrameDecoder]


class ThreadDecoders:
    """The decoders of one engine thread, by stream position, and its decoding counters.

    Args:
        index: The clips read.
        factory: ``(path, info, label) -> decoder`` for one camera stream.
        steps: What follows decoding (augmentation, transform).
        limit: Open decoders this thread keeps (the least recently used is closed); None: one per stream.

    Example::

        >>> decoders = ThreadDecoders(index, pyav_factory(threads=1), FrameSteps(index=index))  # doctest: +SKIP
        >>> info = decoders.write(position=0, clip=0, camera=0, frame=0, row=batch[0], epoch=0, segment_start=0)  # doctest: +SKIP
    """

    def __init__(self, index: VideoIndex, factory: DecoderFactory, steps: FrameSteps, limit: int | None = None) -> None:
        self.index = index
        self.factory = factory
        self.steps = steps
        self.limit = limit
        self.open: dict[int, tuple[int, FrameDecoder]] = {}  # position -> (clip, decoder)
        self.decoded = 0  # frames decoded by the decoders closed so far
        self.seeks = 0
        self.opened = 0
        self.read_errors = 0

    def counts(self) -> tuple[int, int, int, int]:
        """Frames decoded, seeks, files opened and read errors of this thread so far."""
        decoded, seeks = self.decoded, self.seeks
        for _, dec in self.open.values():
            decoded += dec.frames_decoded
            seeks += getattr(dec, "seeks", 0)
        return decoded, seeks, self.opened, self.read_errors

    def write(
        self, *, position: int, clip: int, camera: int, frame: int, row: torch.Tensor, epoch: int, segment_start: int
    ) -> VideoInfo:
        """Decode ``frame`` of stream ``position`` into ``row``; returns the file's frame table.

        Raises:
            VideoDecodeError: (or another of :data:`~lightning_vstream.stream.failures.FILE_ERRORS`)
                The frame cannot be read, or has another size than ``row``.
        """
        decoded = self._decode(position, clip, camera, frame, row)
        if decoded is not None:  # decoded into a frame of its own: finish it, then copy it into its row
            with nvtx_range(RANGE_TRANSFORM):
                image = self.steps.finish(decoded, epoch, clip, segment_start)
            if image.shape != row.shape or image.dtype != row.dtype:
                other_dtype = image.dtype != row.dtype
                raise frame_size_error(
                    self.index,
                    clip,
                    camera,
                    frame,
                    tuple(image.shape),
                    tuple(row.shape),
                    got_dtype=image.dtype if other_dtype else None,
                    expected_dtype=row.dtype if other_dtype else None,
                )
            row.copy_(image)
        return self.open[position][1].info

    def _decode(self, position: int, clip: int, camera: int, frame: int, row: torch.Tensor) -> torch.Tensor | None:
        """Decode straight into ``row`` (None) when nothing follows the decoder, else return the frame.

        What the decoder raises becomes a named error (see :func:`~lightning_vstream.stream.failures.failed_read`).
        """
        try:
            dec = self.decoder(position, clip, camera)
            if not self.steps.direct:
                return dec.get(frame)
            size = getattr(dec, "output_size", None) or (dec.info.height, dec.info.width)
            if tuple(row.shape) != (3, *size) or row.dtype != torch.uint8:
                other_dtype = row.dtype != torch.uint8
                raise frame_size_error(
                    self.index,
                    clip,
                    camera,
                    frame,
                    (3, *size),
                    tuple(row.shape),
                    got_dtype=torch.uint8 if other_dtype else None,
                    expected_dtype=row.dtype if other_dtype else None,
                )
            dec.get(frame, out=row)  # type: ignore[call-arg]
            return None
        except Exception as err:
            failure = failed_read(err, self.index, clip, camera, frame)
            if failure is None or failure is err:
                raise
            raise failure from err

    def decoder(self, position: int, clip_ordinal: int, camera_ordinal: int) -> FrameDecoder:
        """The decoder of stream ``position`` for ``clip_ordinal``, opened (and older ones closed) as needed."""
        entry = self.open.get(position)
        if entry is not None and entry[0] == clip_ordinal:
            if self.limit is not None:
                self.open[position] = self.open.pop(position)  # most recently used last
            return entry[1]
        if entry is not None:
            self.close(position)
        while self.limit is not None and len(self.open) >= self.limit:
            self.close(next(iter(self.open)))
        clip = self.index.clips[clip_ordinal]
        camera = clip.cameras[camera_ordinal]
        dec = self.factory(camera.path, camera.info, f"clip {clip.clip_id!r}, camera {camera.name!r}")
        self.open[position] = (clip_ordinal, dec)
        self.opened += 1
        return dec

    def close(self, position: int) -> None:
        """Close the decoder of stream ``position``, keeping its counters."""
        _, dec = self.open.pop(position)
        self.decoded += dec.frames_decoded
        self.seeks += getattr(dec, "seeks", 0)
        try:
            dec.close()
        except Exception:  # closing must not hide the error that ended the run
            log.debug("closing a decoder failed", exc_info=True)

    def close_all(self) -> None:
        """Close every decoder of this thread."""
        for position in list(self.open):
            self.close(position)
