"""The packet checksum: the fastest CRC-32 installed, zlib's values, and pieces that keep the GIL."""

from __future__ import annotations

import importlib
import sys
import zlib

import pytest

from lightning_vstream.index import checksum


@pytest.fixture
def payloads() -> list[bytes]:
    import random

    rng = random.Random(7)
    sizes = [0, 1, 4095, 5120, 5121, 10240, 100_003, 250_000]
    return [rng.randbytes(size) for size in sizes]


def test_the_checksum_gives_zlibs_values_whole_in_pieces_and_chained(payloads: list[bytes]) -> None:
    for data in payloads:
        view = memoryview(bytearray(data))
        assert checksum.crc32(data) == zlib.crc32(data)
        assert checksum.crc32(view) == zlib.crc32(data)
        assert checksum.crc32_holding_gil(view, len(data)) == zlib.crc32(data)
        half = len(data) // 2
        assert checksum.crc32(view[half:], checksum.crc32(view[:half])) == zlib.crc32(data)


def test_pieces_never_exceed_the_size_the_gil_is_released_above(
    payloads: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: list[int] = []

    def recording(data: memoryview, value: int = 0) -> int:
        sizes.append(len(data))
        return zlib.crc32(data, value)

    monkeypatch.setattr(checksum, "crc32", recording)
    for data in payloads:
        sizes.clear()
        assert checksum.crc32_holding_gil(memoryview(data), len(data)) == zlib.crc32(data)
        assert sum(sizes) == len(data) and max(sizes) <= checksum.GIL_FREE_SIZE


def test_isal_is_used_where_it_imports_and_zlib_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("isal")
    assert checksum.IMPLEMENTATION == "isal"
    try:
        monkeypatch.setitem(sys.modules, "isal.isal_zlib", None)  # as if isal were not installed
        fallback = importlib.reload(checksum)
        assert fallback.IMPLEMENTATION == "zlib" and fallback.crc32 is zlib.crc32
        data = bytes(range(256)) * 64
        assert fallback.crc32_holding_gil(memoryview(data), len(data)) == zlib.crc32(data)
    finally:
        monkeypatch.undo()
        importlib.reload(checksum)
    assert checksum.IMPLEMENTATION == "isal"
