"""The decoders one reader keeps open: a bounded table, least recently used closed first, counters kept.

It knows no backend (the readers hand it the function that makes a decoder), so the thread runner
and the stream workers use it without importing the factory that knows every backend.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from lightning_vstream.decode.counters import DecodeStats

__all__ = ["DecoderTable"]

log = logging.getLogger("lightning_vstream")


class DecoderTable:
    """The decoders one reader keeps open, by key (a stream position, a file), least recently used closed first.

    Each reading thread, and each stream worker, owns one: a decoder is only ever used by one
    thread. A key may carry a ``version`` (the clip a stream position reads): a decoder opened for
    another version is closed and a new one made. Counters survive the decoders they count.

    Args:
        limit: Decoders kept open; None: no bound.

    Example::

        >>> table = DecoderTable(limit=1)
        >>> first = table.get("a.mp4", lambda: PyAVDecoder("a.mp4"))  # doctest: +SKIP
        >>> table.get("b.mp4", lambda: PyAVDecoder("b.mp4"))  # closes the decoder of a.mp4  # doctest: +SKIP
    """

    def __init__(self, *, limit: int | None = None) -> None:
        self.limit = limit
        self._open: OrderedDict[Hashable, tuple[Hashable, Any]] = OrderedDict()
        #: Decoders opened and closed so far.
        self.opened = 0
        self.closed = 0
        self._decoded = 0  # frames decoded by the decoders closed so far
        self._seeks = 0
        self._skipped = 0  # packets the decoders closed so far were not fed

    def get(self, key: Hashable, make: Callable[[], Any], *, version: Hashable = None) -> Any:
        """The decoder of ``key`` (for ``version``), made with ``make()`` when none is open for it."""
        entry = self._open.get(key)
        if entry is not None and entry[0] == version:
            if self.limit is not None:
                self._open.move_to_end(key)  # most recently used last
            return entry[1]
        if entry is not None:
            self.drop(key)
        while self.limit is not None and len(self._open) >= self.limit:
            self.drop(next(iter(self._open)))
        decoder = make()
        self._open[key] = (version, decoder)
        self.opened += 1
        return decoder

    def peek(self, key: Hashable) -> Any:
        """The decoder open for ``key``, or None (opens nothing, changes no order)."""
        entry = self._open.get(key)
        return None if entry is None else entry[1]

    def drop(self, key: Hashable) -> None:
        """Close the decoder of ``key`` (after a failure: the next read reopens the file), keeping its counters."""
        entry = self._open.pop(key, None)
        if entry is None:
            return
        decoder = entry[1]
        self._decoded += int(getattr(decoder, "frames_decoded", 0))
        self._seeks += int(getattr(decoder, "seeks", 0))
        self._skipped += int(getattr(decoder, "packets_skipped", 0))
        self.closed += 1
        try:
            decoder.close()
        except Exception:  # closing must not hide the error that led here
            log.debug("closing a decoder failed", exc_info=True)

    def close_all(self) -> None:
        """Close every open decoder."""
        while self._open:
            self.drop(next(iter(self._open)))

    @property
    def frames_decoded(self) -> int:
        """Frames decoded by every decoder of this table, open or closed."""
        return self._decoded + sum(int(getattr(d, "frames_decoded", 0)) for _, d in self._open.values())

    def counts(self, read_errors: int = 0) -> DecodeStats:
        """Frames decoded, seeks, decoders opened and packets left out (not fed to a decoder) so far, with the
        reader's own ``read_errors``.

        One pass over the open decoders: the stream engine takes a thread's counters at every step.
        """
        decoded, seeks, skipped = self._decoded, self._seeks, self._skipped
        for _, decoder in self._open.values():
            decoded += int(getattr(decoder, "frames_decoded", 0))
            seeks += int(getattr(decoder, "seeks", 0))
            skipped += int(getattr(decoder, "packets_skipped", 0))
        return DecodeStats(
            frames_decoded=decoded,
            seeks=seeks,
            files_opened=self.opened,
            packets_skipped=skipped,
            read_errors=read_errors,
        )

    def keys(self) -> list[Hashable]:
        """The keys with an open decoder, least recently used first."""
        return list(self._open)

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, key: object) -> bool:
        return key in self._open
