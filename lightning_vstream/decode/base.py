"""The decoder protocol every backend implements, and the bookkeeping backends share.

This module imports neither torch nor any decoder library.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from lightning_vstream.decode.gops import FeedFilter
from lightning_vstream.errors import VideoDecodeError
from lightning_vstream.index.tables import VideoInfo

if TYPE_CHECKING:
    import torch

__all__ = ["DecoderBase", "FileBase", "FrameDecoder", "KeyframeSeeking", "Layout", "VideoDecodeError", "VideoInfo"]

Layout = Literal["chw", "hwc"]


class FileBase(abc.ABC):
    """What every reader of one video file shares, sequential or GOP by GOP: where a frame comes from
    for error messages, and which packets the decoder is fed
    (:class:`~lightning_vstream.decode.gops.FeedFilter`: non-reference pictures no frame read needs
    are left out). Subclasses set ``path`` and ``label``, and have an ``info``."""

    path: Path | str  # a URL (a remote file read through its container) stays a string
    label: str
    _feed_filter: FeedFilter | None = None

    @property
    @abc.abstractmethod
    def info(self) -> VideoInfo:
        """The file's frame table."""

    @property
    def feed(self) -> FeedFilter:
        """Which packets the decoder is fed (built from the frame table's reference codes on first use)."""
        if self._feed_filter is None:
            self._feed_filter = FeedFilter(self.info.references)
        return self._feed_filter

    @property
    def packets_skipped(self) -> int:
        """Packets left out because no frame read needs their picture."""
        return 0 if self._feed_filter is None else self._feed_filter.skipped

    def _where(self, index: int | None = None) -> str:
        where = f"{str(self.path)!r}"
        if self.label:
            where += f" ({self.label})"
        if index is not None:
            where += f" frame {index}"
        return where


class DecoderBase(FileBase):
    """Bookkeeping every sequential decoder shares besides :class:`FileBase`'s: the read cursor and the
    decoded-frame counter. Subclasses also set ``_target`` and ``_frames_decoded``."""

    _target: int
    _frames_decoded: int

    def expect(self, frames: Sequence[int] | range | None) -> None:
        """Announce the frames the next reads ask for, ascending (a ``range`` for a stride; None: unknown).

        Non-reference pictures that are neither announced nor needed by an announced one are then
        not decoded. Reading a frame that was not announced stays exact (decoding restarts at its
        keyframe when its picture was left out) but may cost a restart.

        Example::

            >>> dec.expect(range(0, dec.info.frame_count, 6))  # doctest: +SKIP
            >>> frames = [dec.get(i) for i in range(0, dec.info.frame_count, 6)]  # doctest: +SKIP
        """
        self.feed.expect(frames)

    @property
    def position(self) -> int:
        """Index of the frame the next ``read()`` returns."""
        return self._target

    @property
    def frames_decoded(self) -> int:
        """Frames decoded so far, including those decoded only to reach a seek target."""
        return self._frames_decoded


class KeyframeSeeking(abc.ABC):
    """The one step-back rule of the decoders that jump to keyframes: a demuxer may land past the keyframe it
    was sent to (MPEG-TS, some B-frame files), and the frame asked for then never comes out. The retry is
    one GOP earlier, and from the first GOP there is nothing earlier to jump to (the caller then reads
    from the file's start, or gives up)."""

    @abc.abstractmethod
    def _jump(self, key_ordinal: int) -> None:
        """Position the demuxer on keyframe ``key_ordinal`` (in ``info.key_indices``), flushing the decoder."""

    def _step_back(self, key_ordinal: int) -> int | None:
        """After a jump to GOP ``key_ordinal`` that landed past its keyframe: jump one GOP earlier.

        Returns:
            The GOP jumped to, or None when ``key_ordinal`` is the first (nothing was done).
        """
        if key_ordinal <= 0:
            return None
        self._jump(key_ordinal - 1)
        return key_ordinal - 1


@runtime_checkable
class FrameDecoder(Protocol):
    """What every decoding backend provides for one camera stream.

    Decoders open their file lazily, on first use, so they can be created in the main
    process and used in a worker. Frame indices are presentation-order positions.
    """

    @property
    def path(self) -> Path | str:
        """The file (a URL stays a string)."""
        ...

    @property
    def info(self) -> VideoInfo:
        """Frame table and stream properties (probes the file on first access)."""
        ...

    @property
    def position(self) -> int:
        """Index of the frame the next :meth:`read` returns."""
        ...

    @property
    def frames_decoded(self) -> int:
        """Frames decoded so far, including those decoded only to reach a seek target."""
        ...

    def read(self) -> torch.Tensor:
        """Decode and return the frame at :attr:`position`, then advance by one."""
        ...

    def seek(self, index: int) -> None:
        """Make the next :meth:`read` return frame ``index`` (no decoding happens yet)."""
        ...

    def get(self, index: int) -> torch.Tensor:
        """Return frame ``index``, decoding forward when that is cheaper than seeking."""
        ...

    def close(self) -> None:
        """Release the file and decoder; the decoder reopens lazily if used again."""
        ...
