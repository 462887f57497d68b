"""The decoders a clip dataset keeps open in each process: :class:`DecoderCache`, a bounded LRU per file."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

from lightning_vstream.decode.base import FrameDecoder, Layout, VideoInfo
from lightning_vstream.decode.colour import check_size
from lightning_vstream.errors import ConfigurationError
from lightning_vstream.storage.urls import is_url

if TYPE_CHECKING:
    from lightning_vstream.storage.config import StorageConfig

__all__ = ["DecoderCache"]


def _location(path: Path | str) -> Path | str:
    """A file's key: its ``Path``, or its URL, which stays a string."""
    return path if isinstance(path, str) and is_url(path) else Path(path)


class DecoderCache:
    """A bounded LRU of open decoders, one per file (each worker holds its own).

    Args:
        capacity: Most decoders kept open; the least recently used is closed beyond that.
        layout: Tensor layout of the decoders it creates.
        decoder_threads: FFmpeg threads per video decoder (0 lets FFmpeg choose; use 1 with many
            DataLoader workers).
        device: ``"cpu"`` (PyAV) or a CUDA device (NVDEC) to decode video files on.
        size: Output ``(height, width)`` of CPU video decoders, resized while converting to RGB;
            None keeps each file's size. Image folders keep their size.
        storage: How to reach files given as URLs (a remote index's :attr:`VideoIndex.storage`).

    Example::

        >>> cache = DecoderCache(capacity=4)
        >>> dec = cache.get("clip/CAM_FRONT.mp4")  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        capacity: int = 8,
        layout: Layout = "chw",
        decoder_threads: int = 0,
        device: str = "cpu",
        size: tuple[int, int] | None = None,
        storage: StorageConfig | None = None,
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ConfigurationError(f"capacity={capacity!r} must be a positive integer number of open decoders.")
        self.capacity = capacity
        self.layout = layout
        self.decoder_threads = decoder_threads
        self.device = device
        self.size = check_size(size)
        self.storage = storage
        self._open: OrderedDict[Path | str, FrameDecoder] = OrderedDict()
        self._extra: dict[Path | str, list[FrameDecoder]] = {}  # more decoders of a file, for parallel GOPs
        self._closed_decoded = 0
        self.opened = 0

    def get(self, path: Path | str, *, info: VideoInfo | None = None, label: str = "") -> FrameDecoder:
        """The decoder for ``path``, reused if open, else created (lazily opened) and cached."""
        from lightning_vstream.decode.factory import make_decoder

        path = _location(path)
        decoder = self._open.get(path)
        if decoder is not None:
            self._open.move_to_end(path)
            return decoder
        decoder = make_decoder(
            path,
            info=info,
            layout=self.layout,
            threads=self.decoder_threads,
            label=label,
            device=self.device,
            size=self.size,
            storage=self.storage,
        )
        self._open[path] = decoder
        self.opened += 1
        while len(self._open) > self.capacity:
            old_path, old = self._open.popitem(last=False)
            self._retire(old)
            for extra in self._extra.pop(old_path, []):
                self._retire(extra)
        return decoder

    def get_several(
        self, path: Path | str, count: int, *, info: VideoInfo | None = None, label: str = ""
    ) -> list[FrameDecoder]:
        """``count`` decoders of ``path`` (the first is :meth:`get`'s), to decode its GOPs in parallel.

        The extra decoders share the file's frame table and close with it when it leaves the LRU.
        """
        from lightning_vstream.decode.factory import make_decoder

        first = self.get(path, info=info, label=label)
        path = _location(path)
        extra = self._extra.setdefault(path, [])
        while len(extra) < count - 1:
            extra.append(
                make_decoder(
                    path,
                    info=first.info,
                    layout=self.layout,
                    threads=self.decoder_threads,
                    label=label,
                    size=self.size,
                    storage=self.storage,
                )
            )
            self.opened += 1
        return [first, *extra[: count - 1]]

    def _retire(self, decoder: FrameDecoder) -> None:
        self._closed_decoded += decoder.frames_decoded
        decoder.close()

    @property
    def frames_decoded(self) -> int:
        """Frames decoded by every decoder this cache created, open or closed."""
        live = [*self._open.values(), *(d for extra in self._extra.values() for d in extra)]
        return self._closed_decoded + sum(d.frames_decoded for d in live)

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, path: object) -> bool:
        return _location(path) in self._open if isinstance(path, (str, Path)) else False

    def drop(self, path: Path | str) -> None:
        """Close the decoder of ``path`` (after a failure: the next request reopens the file)."""
        decoder = self._open.pop(_location(path), None)
        if decoder is not None:
            self._retire(decoder)
        for extra in self._extra.pop(_location(path), []):
            self._retire(extra)

    def close(self) -> None:
        """Close every open decoder."""
        while self._open:
            _, decoder = self._open.popitem(last=False)
            self._retire(decoder)
        for extra in self._extra.values():
            for decoder in extra:
                self._retire(decoder)
        self._extra.clear()
