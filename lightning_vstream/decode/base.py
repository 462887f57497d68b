"""The decoder protocol every backend implements, and the bookkeeping backends share.

This module imports neither torch nor any decoder library.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from lightning_vstream.errors import VideoDecodeError
from lightning_vstream.index.tables import VideoInfo

if TYPE_CHECKING:
    import torch

__all__ = ["DecoderBase", "FrameDecoder", "Layout", "VideoDecodeError", "VideoInfo"]

Layout = Literal["chw", "hwc"]


class DecoderBase:
    """Bookkeeping every backend shares: the read cursor, the decoded-frame counter, and where
    a frame comes from for error messages. Subclasses set ``path``, ``label``, ``_target`` and
    ``_frames_decoded``."""

    path: Path
    label: str
    _target: int
    _frames_decoded: int

    @property
    def position(self) -> int:
        """Index of the frame the next ``read()`` returns."""
        return self._target

    @property
    def frames_decoded(self) -> int:
        """Frames decoded so far, including those decoded only to reach a seek target."""
        return self._frames_decoded

    def _where(self, index: int | None = None) -> str:
        where = f"{str(self.path)!r}"
        if self.label:
            where += f" ({self.label})"
        if index is not None:
            where += f" frame {index}"
        return where


@runtime_checkable
class FrameDecoder(Protocol):
    """What every decoding backend provides for one camera stream.

    Decoders open their file lazily, on first use, so they can be created in the main
    process and used in a worker. Frame indices are presentation-order positions.
    """

    path: Path

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
