"""What both PyAV decoders share: a decoded FFmpeg frame converted to RGB at the decoder's size, and at more.

:class:`~lightning_vstream.decode.cpu.pyav.PyAVDecoder` (a file read through its container) and
:class:`~lightning_vstream.decode.ranged.gop_reads.GopDecoder` (GOP byte ranges) decode with the same FFmpeg
decoder and hand out frames the same way: one swscale conversion per frame to RGB (resized on the
way when ``size`` is given, :class:`~lightning_vstream.decode.cpu.colour.RGBConverter`), more sizes of
the same decoded frame for one more conversion each (:meth:`RGBOutputDecoder.get_sizes`), and
several frames in ascending order (:meth:`RGBOutputDecoder.get_many`), and feed the decoder only
the packets the frames asked for need (:class:`~lightning_vstream.decode.gops.FeedFilter`:
non-reference pictures nobody reads are left out and counted in :attr:`packets_skipped`). A subclass
decodes: ``_read_frame()`` returns the FFmpeg frame at the cursor and moves the cursor past it.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from lightning_vstream.decode.base import DecoderBase
from lightning_vstream.decode.cpu.colour import RGBConverter
from lightning_vstream.decode.cpu.ffmpeg_fork import keep_forever

if TYPE_CHECKING:
    import torch

__all__ = ["RGBOutputDecoder"]


_D = TypeVar("_D", bound="RGBOutputDecoder")


class RGBOutputDecoder(DecoderBase):
    """RGB output of a PyAV decoder (see the module docs); subclasses set ``_rgb``, ``_sized`` and ``size``."""

    _rgb: RGBConverter
    _sized: dict[tuple[int, int], RGBConverter]  # more output sizes (get_sizes)
    size: tuple[int, int] | None
    _seeks: int

    @property
    def output_size(self) -> tuple[int, int]:
        """``(height, width)`` of the frames this decoder returns."""
        return self.size if self.size is not None else (self.info.height, self.info.width)

    @abc.abstractmethod
    def _read_frame(self) -> Any:
        """Decode the frame at the cursor, as PyAV's ``VideoFrame``, and move the cursor past it."""

    def _frame_where(self, index: int) -> str:
        """Where frame ``index`` comes from, as conversion errors name it."""
        return self._where()

    def _fetch_ahead(self, frames: Sequence[int]) -> None:
        """Make the bytes of ``frames`` ready before :meth:`get_many` decodes them (nothing to do for a local file)."""

    def _release_converters(self) -> None:
        """After fork, in the child: keep the converters' swscale contexts forever (they may hold threads)."""
        for converter in (self._rgb, *self._sized.values()):
            reformatter = converter.release()
            if reformatter is not None:
                keep_forever(reformatter)

    def read(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """Decode the frame at :attr:`position` (into ``out`` when given) and advance by one."""
        return self._rgb(self._read_frame(), out, self._frame_where(self._target - 1))

    def get(self, index: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Return frame ``index`` (see :meth:`seek` for the cost)."""
        self.seek(index)
        return self.read(out)

    @abc.abstractmethod
    def seek(self, index: int) -> None:
        """Move the cursor to frame ``index`` (decoding happens at the next read)."""

    def get_sizes(
        self, index: int, sizes: Sequence[tuple[int, int]], out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[tuple[int, int], torch.Tensor]]:
        """Frame ``index`` as :meth:`get` returns it, and the same decoded frame at each of ``sizes``.

        The frame is decoded once; each size is one more swscale conversion of it (YUV to RGB and
        resize in one pass, uint8, this decoder's layout and interpolation), far cheaper than
        resizing the RGB frame afterwards.

        Args:
            index: Frame index.
            sizes: Further ``(height, width)`` outputs.
            out: Where the frame at this decoder's size goes (as for :meth:`get`).

        Returns:
            The frame at this decoder's size and ``{size: frame}``.

        Example::

            >>> frame, more = dec.get_sizes(12, [(450, 800), (225, 400)])  # doctest: +SKIP
            >>> more[(225, 400)].shape  # doctest: +SKIP
            torch.Size([3, 225, 400])
        """
        self.seek(index)
        frame = self._read_frame()
        where = self._frame_where(index)
        image = self._rgb(frame, out, where)
        converted = {}
        for size in sizes:
            converter = self._sized.get(size)
            if converter is None:
                converter = RGBConverter(layout=self._rgb.layout, size=size, interpolation=self._rgb.interpolation)
                self._sized[size] = converter
            converted[size] = converter(frame, None, where)
        return image, converted

    def get_many(self, indices: Sequence[int]) -> list[torch.Tensor]:
        """Return the frames at ``indices`` (any order, repeats allowed), in that order.

        Needed frames are decoded in ascending order: each GOP is decoded at most once, up to the
        last needed frame in it, and decoding restarts at a keyframe only when the next needed
        frame's GOP lies ahead of the cursor (or the cursor is past it).

        Raises:
            IndexError: An index is out of range (nothing is decoded then).
        """
        wanted = sorted(set(indices))
        if wanted and not (wanted[0] >= 0 and wanted[-1] < self.info.frame_count):
            self.seek(wanted[0] if wanted[0] < 0 else wanted[-1])  # raises the IndexError that names the file
        self._fetch_ahead(wanted)
        self.expect(wanted)
        decoded = {i: self.get(i) for i in wanted}
        return [decoded[i] for i in indices]

    @property
    def seeks(self) -> int:
        """Times decoding restarted at a keyframe (a demuxer seek, for a file read through its container)."""
        return self._seeks

    @abc.abstractmethod
    def close(self) -> None:
        """Release the file and the decoder (a later read reopens them)."""

    def __enter__(self: _D) -> _D:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
