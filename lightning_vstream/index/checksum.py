"""The CRC-32 that frame tables record for every packet, computed with the fastest implementation installed.

Every packet a decoder is fed is checked against its frame table's CRC-32 (zlib's polynomial), so
the checksum's speed is a per-frame cost: at 1600x900 a packet is about 100 KB, which zlib checks in
about 20 us and ISA-L (``isal``, a dependency of the package) in about 2 us. File identities and
index files are checksummed with it too. :data:`crc32` is ``isal.isal_zlib.crc32`` where it imports
and ``zlib.crc32`` otherwise; both give the same values.

Example::

    >>> from lightning_vstream.index.checksum import crc32, crc32_holding_gil
    >>> crc32(b"frame") == crc32_holding_gil(memoryview(b"frame"), 5)
    True
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

__all__ = ["IMPLEMENTATION", "crc32", "crc32_holding_gil"]

crc32: Callable[..., int]
try:
    from isal.isal_zlib import crc32
except ImportError:  # a platform without its wheel, or a checkout run without installing: zlib's, slower
    crc32 = zlib.crc32
    IMPLEMENTATION = "zlib"
else:
    IMPLEMENTATION = "isal"

#: ``zlib.crc32`` (and ISA-L's, which follows it) releases the GIL for buffers larger than this; pieces of this
#: size keep it.
GIL_FREE_SIZE = 5 * 1024


def crc32_holding_gil(view: Any, size: int) -> int:
    """CRC-32 of a packet (``view``, ``size`` bytes), computed without letting go of the GIL.

    Both implementations release the GIL for more than 5 KiB; taking it back costs a thread up to
    the interpreter's switch interval (5 ms) when a Python-heavy training step holds it, which per
    frame would dwarf the microseconds the checksum takes. In pieces, it never lets go.
    """
    if size <= GIL_FREE_SIZE:
        return crc32(view)
    crc = 0
    for at in range(0, size, GIL_FREE_SIZE):
        crc = crc32(view[at : at + GIL_FREE_SIZE], crc)
    return crc
