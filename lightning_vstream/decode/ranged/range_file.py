"""A remote object read as a file: block reads through the storage client, checked against the index.

Files without a packet layout (MPEG-TS, tables written without byte ranges) are read through their
container: PyAV demuxes a :class:`RangeFile` over the object
(:class:`~lightning_vstream.decode.cpu.pyav.PyAVDecoder` with ``source``). Every read must find the size
and ETag the index recorded (:func:`expect_of`).
"""

from __future__ import annotations

import io
from collections import OrderedDict
from typing import Any

from lightning_vstream.decode.base import VideoInfo
from lightning_vstream.storage.client import Expect, Storage

__all__ = ["RangeFile", "expect_of"]


def expect_of(info: VideoInfo) -> Expect:
    """What a read of the file must find: the size (and ETag) the index recorded."""
    identity = info.identity
    if identity is None:
        return Expect()
    return Expect(identity.size, identity.etag)


class RangeFile(io.RawIOBase):
    """A read-only, seekable file over one object, read in blocks through :class:`~lightning_vstream.storage.client.Storage`.

    For files without a packet layout, which are read through their container (PyAV demuxes this
    file object). Blocks of ``block`` bytes are kept in a small LRU; the object's size comes from the
    index (no HEAD) or, without one, from the first response.

    Args:
        storage: How requests are made.
        url: The object.
        expect: Its recorded size and ETag.
        block: Bytes per request.
    """

    BLOCKS_KEPT = 8

    def __init__(self, storage: Storage, url: str, expect: Expect, *, block: int = 1 << 20) -> None:
        super().__init__()
        self.storage = storage
        self.url = url
        self.expect = expect
        self.block = block
        self._size = expect.size
        self._pos = 0
        self._blocks: OrderedDict[int, bytes] = OrderedDict()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _block(self, number: int) -> bytes:
        data = self._blocks.get(number)
        if data is None:
            start = number * self.block
            end = start + self.block if self._size is None else min(start + self.block, self._size)
            raw, info = self.storage.read(self.url, start, end, expect=self.expect)
            if self._size is None and info.size >= 0:
                self._size = info.size
            data = bytes(raw)
            self._blocks[number] = data
            while len(self._blocks) > self.BLOCKS_KEPT:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(number)
        return data

    def size(self) -> int:
        if self._size is None:
            self._block(0)
        return self._size if self._size is not None else 0

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        total = self.size()
        if self._pos >= total or not len(view):
            return 0
        number, offset = divmod(self._pos, self.block)
        chunk = self._block(number)[offset : offset + len(view)]
        view[: len(chunk)] = chunk
        self._pos += len(chunk)
        return len(chunk)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            self._pos = offset
        elif whence == io.SEEK_CUR:
            self._pos += offset
        else:
            self._pos = self.size() + offset
        return self._pos

    def tell(self) -> int:
        return self._pos
