"""Crafted index and frame-table files: each one loads, or ends in a named error, within the file's own size.

Every case is a mutation of a small, valid dataset's ``index.json`` or ``index.tables.bin``, drawn from
a generator with a fixed seed (the same files every run): lengths, counts, offsets, dtypes, shapes,
nesting, encodings, names that climb or are half a character, numbers of thousands of digits,
truncations and flipped bytes. The contract checked for each:

- loading it (``load_index``, ``FrameTables`` and every row's frame table) succeeds or raises a
  :class:`~lightning_vstream.VStreamError` subclass, nothing else;
- memory traced while it loads stays within a small multiple of the file's size (a crafted length or
  count never turns into an allocation of its own size);
- for a share of the table cases, reading a sample through the crafted tables (``file://``, GOP reads)
  gives the stamped frames asked for, or a named error.
"""

from __future__ import annotations

import json
import random
import struct
import tracemalloc
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lightning_vstream import StorageConfig, VideoClipDataset, VStreamError, at_indices, load_index
from lightning_vstream.demos.synth import clip_number, read_stamp, write_dataset
from lightning_vstream.index.table_file import FrameTables, tables_path

INDEX_CASES = 300
TABLE_CASES = 300
#: One table case in this many is also decoded through the crafted tables (and every other one that loads).
DECODE_EVERY = 6
#: Memory a load may trace beyond a small multiple of the file's size (Python's objects for a parsed
#: index, numpy's array headers): about 0.4 MB is seen. A crafted count or length would ask for gigabytes.
SLACK = 2 * 2**20
PER_BYTE = 32


@dataclass(frozen=True)
class Pristine:
    root: Path
    index: bytes
    tables: bytes
    header: dict[str, Any]
    header_end: int  # where the arrays' region starts


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Pristine:
    root = tmp_path_factory.mktemp("fuzz-files")
    index = write_dataset(root, clips=2, cameras=2, frames=8, size=(64, 48), gop=4, bframes=1)
    tables = tables_path(index).read_bytes()
    length = struct.unpack("<I", tables[12:16])[0]
    header = json.loads(tables[16 : 16 + length])
    return Pristine(root, index.read_bytes(), tables, header, -(-(16 + length) // 64) * 64)


@pytest.fixture(autouse=True)
def _no_table_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a crafted index may name files without tables: warned, not failed
        yield


def _traced(action: Callable[[], Any], size: int, what: str) -> Any:
    """Run ``action`` under tracemalloc; fail unless it returns or raises a VStreamError within its memory."""
    tracemalloc.start()
    try:
        result = action()
    except VStreamError as err:
        result = err
    except Exception as err:  # anything else is the bug this file looks for
        pytest.fail(f"{what}: {type(err).__name__}: {err}")
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak <= SLACK + PER_BYTE * size, f"{what}: traced {peak} bytes for a file of {size}"
    return result


# -- index.json ---------------------------------------------------------------------------------------------
_NAMES = [
    "",
    ".",
    "..",
    "../videos",
    "%2e%2e",
    "videos/../..",
    "scene-0000/CAM_BACK.mp4",
    "scene-\ud800",
    "\udfff",
    "nul\0name",
    "x" * 300,
    "scene-0000\n",
    "\\\\server\\share",
    "/etc",
    "file:///etc",
    "ü" * 200,
]
_COUNTS: list[Any] = [0, -1, 1, 7, 8, 9, 2**31, 2**63, 10**30, 1.5, float("inf"), "8", True, None, [], {}, [8]]


def _mutate_index(rng: random.Random, valid: bytes) -> tuple[str, bytes]:
    data = json.loads(valid)
    kind = rng.choice(["count", "name", "nesting", "encoding", "length", "bytes", "shape", "digits"])
    folder = next(iter(data))
    clips = data[folder]
    clip = rng.choice(sorted(clips))
    if kind == "count":
        clips[clip] = rng.choice(_COUNTS)
    elif kind == "name":
        name = rng.choice(_NAMES)
        if rng.random() < 0.5:
            clips[name] = clips.pop(clip)
        else:
            data[name] = data.pop(folder)
    elif kind == "nesting":
        depth = rng.choice([2, 50, 1_000, 100_000])
        opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
        text = json.dumps(data).replace(f'"{clip}": {clips[clip]}', f'"{clip}": {opener * depth}1{closer * depth}')
        return kind, text.encode()
    elif kind == "encoding":
        text = json.dumps(data, ensure_ascii=False).replace(clip, clip + "ü")
        encoding = rng.choice(["utf-16", "utf-32", "latin-1", "utf-8-sig", "cp1252"])
        raw = text.encode(encoding, errors="replace")
        if rng.random() < 0.3:
            at = rng.randrange(len(raw))
            raw = raw[:at] + rng.choice([b"\xff\xfe", b"\xc0\xaf", b"\xed\xa0\x80", b"\x80"]) + raw[at:]
        return kind, raw
    elif kind == "length":
        raw = json.dumps(data).encode()
        how = rng.choice(["cut", "empty", "twice", "garbage"])
        if how == "cut":
            return kind, raw[: rng.randrange(len(raw))]
        if how == "empty":
            return kind, b""
        if how == "twice":
            return kind, raw + raw
        return kind, raw + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    elif kind == "bytes":
        raw = bytearray(json.dumps(data).encode())
        for _ in range(rng.randrange(1, 6)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        return kind, bytes(raw)
    elif kind == "shape":
        data = rng.choice([[data], 8, "index", None, {folder: [clip]}, {folder: 8}, {}, {folder: {}}])
    else:  # digits
        text = json.dumps(data).replace(f'"{clip}": {clips[clip]}', f'"{clip}": {"9" * rng.choice([20, 4300, 5000])}')
        return kind, text.encode()
    return kind, json.dumps(data).encode()


def test_crafted_index_files_load_or_raise_a_named_error(pristine: Pristine) -> None:
    path = pristine.root / "fuzz.json"
    tables_path(path).write_bytes(pristine.tables)
    path.write_bytes(pristine.index)
    load_index(path)  # warm up: imports and caches are not the crafted file's cost
    rng = random.Random(20240611)
    kinds: dict[str, int] = {}
    outcomes: dict[str, int] = {}
    for case in range(INDEX_CASES):
        kind, raw = _mutate_index(rng, pristine.index)
        kinds[kind] = kinds.get(kind, 0) + 1
        path.write_bytes(raw)
        location: Path | str = path if case % 2 else path.resolve().as_uri()
        result = _traced(partial(load_index, location), len(raw), f"index case {case} ({kind}): {raw[:120]!r}")
        outcomes[type(result).__name__] = outcomes.get(type(result).__name__, 0) + 1
    assert sum(kinds.values()) == INDEX_CASES and len(kinds) == 8
    assert outcomes.get("VideoIndex", 0) > 0 and len(outcomes) >= 3  # some load, most are refused, by name


# -- index.tables.bin ---------------------------------------------------------------------------------------
def _rewritten(pristine: Pristine, header: Any, *, encoding: str = "utf-8") -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode(encoding)
    end = -(-(16 + len(text)) // 64) * 64
    body = pristine.tables[pristine.header_end :]
    head = pristine.tables[:12] + struct.pack("<I", len(text)) + text
    return head + b"\0" * (end - len(head)) + body


_DTYPES: list[Any] = ["<i8", "<i4", "u1", "<f8", "O", "S0", "S99999999999", "V8", "<U4", "x", 5, None, "<i8,<i8"]
_SHAPES: list[Any] = [[-1], [2**40], [], [1, 2], ["3"], [1.5], [True], None, 7, [2**63]]
_OFFSETS: list[Any] = [-64, 2**62, "0", 1.5, None, True, 2**64]


def _mutate_header(rng: random.Random, pristine: Pristine) -> bytes:
    header = json.loads(json.dumps(pristine.header))
    arrays = header["arrays"]
    name = rng.choice(sorted(arrays))
    what = rng.choice(["arrays", "dtype", "shape", "offset", "files", "codecs", "nesting", "encoding", "digits"])
    if what == "arrays":
        header["arrays"] = rng.choice([[], {}, None, "pts", [[name, "<i8", [1], 0]]])
    elif what == "dtype":
        arrays[name][0] = rng.choice(_DTYPES)
    elif what == "shape":
        arrays[name][1] = rng.choice(_SHAPES)
    elif what == "offset":
        arrays[name][2] = rng.choice(_OFFSETS) if rng.random() < 0.5 else arrays[name][2] + rng.randrange(-9, 9)
    elif what == "files":
        header["files"] = rng.choice([-1, 0, 1, 3, 2**40, "2", 1.5, True, None])
    elif what == "codecs":
        header["codecs"] = rng.choice([[], [1], "h264", None, ["h264"] * 300, [{"a": 1}]])
    elif what == "nesting":
        depth = rng.choice([100, 10_000, 100_000])
        return _rewritten(pristine, b'{"arrays": ' + b"[" * depth + b"]" * depth + b"}")
    elif what == "encoding":
        return _rewritten(pristine, header, encoding=rng.choice(["utf-16", "utf-32"]))
    else:
        text = json.dumps(header).replace('"files": ', '"files": ' + "1" * 5000 + ', "x": ')
        return _rewritten(pristine, text.encode())
    return _rewritten(pristine, header)


_CRAFTED = {
    "<i8": [-1, -(2**63), 2**62, 2**63 - 1, 0],
    "<u4": [2**32 - 1, 0],
    "<i4": [-1, 2**31 - 1],
    "<f8": [float("nan"), float("inf"), -1.0],
    "|u1": [0, 7, 255],
    "<i2": [-1, 2**15 - 1],
}


def _mutate_arrays(rng: random.Random, pristine: Pristine) -> bytes:
    raw = bytearray(pristine.tables)
    name = rng.choice(sorted(pristine.header["arrays"]))
    dtype, shape, offset = pristine.header["arrays"][name]
    itemsize = np.dtype(dtype).itemsize
    count = shape[0]
    if not count:
        return bytes(raw)
    at = pristine.header_end + offset + rng.randrange(count) * itemsize
    how = rng.random()
    if dtype.startswith("|S"):  # keys: unsorted, repeated, not UTF-8
        raw[at : at + itemsize] = rng.choice(
            [b"\xff" * itemsize, b"\0" * itemsize, bytes(raw[at : at + itemsize])[::-1]]
        )
    elif how < 0.7 and dtype in _CRAFTED:
        raw[at : at + itemsize] = np.array([rng.choice(_CRAFTED[dtype])], dtype=dtype).tobytes()
    else:
        raw[at : at + itemsize] = bytes(rng.randrange(256) for _ in range(itemsize))
    return bytes(raw)


def _mutate_tables(rng: random.Random, pristine: Pristine) -> tuple[str, bytes]:
    kind = rng.choice(["header", "header", "arrays", "arrays", "arrays", "prefix", "cut", "flip"])
    if kind == "header":
        return kind, _mutate_header(rng, pristine)
    if kind == "arrays":
        return kind, _mutate_arrays(rng, pristine)
    raw = bytearray(pristine.tables)
    if kind == "prefix":
        field = rng.choice(["magic", "version", "length"])
        if field == "magic":
            raw[0:8] = rng.choice([b"VSTABLEZ", b"\0" * 8, b"PK\x03\x04abcd"])
        elif field == "version":
            raw[8:12] = struct.pack("<I", rng.choice([0, 1, 3, 2**32 - 1]))
        else:
            length = struct.unpack("<I", raw[12:16])[0]
            raw[12:16] = struct.pack("<I", rng.choice([0, 1, length - 1, length + 1, len(raw), 2**32 - 1]))
        return kind, bytes(raw)
    if kind == "cut":
        return kind, bytes(raw[: rng.randrange(len(raw))])
    for _ in range(rng.randrange(1, 9)):
        raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
    return kind, bytes(raw)


def _every_row(tables: FrameTables) -> FrameTables:
    for row in range(len(tables)):
        tables.info(row)
    list(tables.keys())
    return tables


def _read_sample(url: str, cache: Path) -> list[tuple[int, int, int]]:
    dataset = VideoClipDataset(
        index=url, requests=[at_indices("scene-0001", [1, 6])], storage=StorageConfig(cache_dir=str(cache))
    )
    frames = dataset[0]["frames"]
    stamps = [read_stamp(frames[t, c]) for t in range(2) for c in range(2)]
    return [(stamp.clip, stamp.camera, stamp.frame) for stamp in stamps]


def test_crafted_table_files_load_or_raise_a_named_error(pristine: Pristine, tmp_path: Path) -> None:
    index = pristine.root / "index.json"
    path = tables_path(index)
    url = index.resolve().as_uri()
    expected = [(clip_number("scene-0001"), c, f) for f in (1, 6) for c in range(2)]
    assert _read_sample(url, tmp_path) == expected  # warm up, and the pristine files read right
    rng = random.Random(4242)
    kinds: dict[str, int] = {}
    decoded = refused = 0
    try:
        for case in range(TABLE_CASES):
            kind, raw = _mutate_tables(rng, pristine)
            kinds[kind] = kinds.get(kind, 0) + 1
            path.write_bytes(raw)
            what = f"tables case {case} ({kind})"
            result = _traced(lambda: _every_row(FrameTables(path)), len(raw), what)
            _traced(lambda: load_index(index), len(raw) + len(pristine.index), what + ", load_index")
            if case % DECODE_EVERY == 0 or (case % 2 == 0 and not isinstance(result, VStreamError)):
                stamps = _traced(lambda: _read_sample(url, tmp_path), len(raw), what + ", decoding")
                if isinstance(stamps, VStreamError):
                    refused += 1
                else:
                    assert stamps == expected, what
                    decoded += 1
            refused += isinstance(result, VStreamError)
    finally:
        path.write_bytes(pristine.tables)
    assert sum(kinds.values()) == TABLE_CASES and len(kinds) == 5
    assert decoded > 0 and refused > TABLE_CASES // 3
