"""The binary frame-table file, ``<index stem>.tables.bin``: every file's frame table in flat arrays.

Built for indexes of a million files: the file is memory-mapped, never parsed, so loading it
costs the same for ten files as for a million, and every rank and DataLoader worker on a
machine shares its pages through the page cache. Pickling a :class:`FrameTables` (into spawn
workers) sends only its path; the worker maps the same file again. A :class:`VideoInfo` is
built only for a file that is opened, from slices of the arrays.

Layout (little-endian): the 8-byte magic ``VSTABLES``, a uint32 format version, a uint32 header
length, a UTF-8 JSON header, then the arrays the header lists (``name -> [dtype, shape,
offset]``), each aligned to 64 bytes. Rows are sorted by ``keys`` (file path relative to the
index folder, ``/``-separated), so a lookup is a binary search. Per-frame arrays (``pts``,
``crc32``) and per-keyframe arrays (``key_indices``, ``key_seek``) are concatenated over files,
with ``frame_offsets`` / ``key_offsets`` (length files + 1) marking where each file's rows start.
Optional values (``config_crc32``, identity fields, ``reorder_depth``) hold -1 when unknown.

Version 2 added ``reorder_depth`` (how far decode order runs ahead of presentation, for NVDEC's
latency mode) and what GOP reads need (:class:`~lightning_vstream.index.tables.PacketLayout`): per
frame the packet's byte offset and size (``pkt_pos``, ``pkt_size``, aligned with ``pts``), per file
whether they are known (``has_layout``), the container's colour tags (``col_*``), and two byte blobs
concatenated over files with their own offsets: the codec configuration (``extradata`` /
``extra_offsets``) and the ETag of remote objects (``etag`` / ``etag_offsets``, empty when unknown).
Version-1 files, and version-2 files written before the byte ranges were added, still load for
reading local files: ``reorder_depth`` is unknown and no file has a packet layout (it is read
through its container). Only reading a remote index needs the byte ranges; it refuses such tables,
naming the command that rebuilds them. Writing the file is :mod:`lightning_vstream.index.table_write`'s.

Version-2 files may also hold ``pkt_ref`` (``u1``, aligned with ``pts``): every frame's reference
code (:func:`~lightning_vstream.index.tables.reference_code`: whether its picture is a reference,
and its temporal sub-layer; 255 where unknown), so readers can leave out pictures nobody needs.
It is optional: files written before it was added load with the codes unknown, and nothing is
left out when reading them.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lightning_vstream.errors import IndexValidationError
from lightning_vstream.index.identity import FileIdentity
from lightning_vstream.index.tables import MAX_REFERENCE_CODE, REFERENCE_UNKNOWN, PacketLayout, VideoInfo

__all__ = ["TABLES_FORMAT", "TABLES_VERSION", "FrameTables", "tables_path"]

TABLES_FORMAT = "lightning_vstream.tables"
TABLES_VERSION = 2
#: Older versions still read, and the per-file arrays they lack (read as unknown, -1).
_OLDER_VERSIONS = {1: ("reorder_depth",)}
_MAGIC = b"VSTABLES"
_PREFIX = struct.Struct("<8sII")
_ALIGN = 64
_FIX = "delete it or re-run `vstream index` to rebuild it"
# name -> dtype; the per-file arrays have one row per file, the others are concatenated.
_PER_FILE = {
    "codec": "<i4",
    "width": "<i8",
    "height": "<i8",
    "tb_num": "<i8",
    "tb_den": "<i8",
    "fps": "<f8",
    "has_crc": "u1",
    "config_crc32": "<i8",
    "size": "<i8",
    "mtime_ns": "<i8",
    "head_crc32": "<i8",
    "tail_crc32": "<i8",
    "reorder_depth": "<i4",
}
_CONCAT = {
    "pts": "<i8",
    "crc32": "<u4",
    "key_indices": "<i8",
    "key_seek": "<i8",
    "frame_offsets": "<i8",
    "key_offsets": "<i8",
}
# -- packet byte ranges (version 2): GOP reads from remote storage ------------------------------
_BYTES_PER_FILE = {
    "has_layout": "u1",
    "col_range": "<i2",
    "col_space": "<i2",
    "col_primaries": "<i2",
    "col_trc": "<i2",
}
_BYTES_PER_FRAME = {"pkt_pos": "<i8", "pkt_size": "<u4"}
_BLOBS = {"extradata": "extra_offsets", "etag": "etag_offsets"}  # u1 blob -> its <i8 offsets (files + 1)
#: Optional per-frame arrays of version 2 (absent: unknown for every frame).
_OPTIONAL_PER_FRAME = {"pkt_ref": "u1"}
# ------------------------------------------------------------------------------------------------
_I64 = (-(2**63), 2**63 - 1)
_MAX_INT32 = 2**31 - 1
#: Largest frame width or height a table may record (FFmpeg's codecs stop well below it).
MAX_SIDE = 65536
#: Frame tables a :class:`FrameTables` keeps built (per process), most recently used first out last.
CACHED_INFOS = 256


def tables_path(index_path: Path | str) -> Path:
    """Where the binary frame tables of ``index_path`` live (``index.json`` -> ``index.tables.bin``)."""
    index_path = Path(index_path)
    return index_path.with_name(index_path.stem + ".tables.bin")


def _blob_dtypes() -> dict[str, str]:
    return {**{blob: "u1" for blob in _BLOBS}, **{offsets: "<i8" for offsets in _BLOBS.values()}}


def _map(path: Path) -> tuple[np.ndarray, Any]:
    """The file's bytes, memory-mapped read-only, advised for random access; and the mapping.

    A lookup reads a few bytes of each of a dozen arrays at a random row: ``MADV_RANDOM`` keeps the
    kernel from reading ahead around each of them when the file is not in the page cache yet.
    """
    with open(path, "rb") as f:
        if not os.fstat(f.fileno()).st_size:
            return np.zeros(0, np.uint8), b""
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_RANDOM"):
        mapped.madvise(mmap.MADV_RANDOM)
    return np.frombuffer(mapped, dtype=np.uint8), mapped


def _known_dtypes() -> dict[str, np.dtype[Any]]:
    """The dtype each array this version needs must have (``keys``: bytes of any width; optional ones: later)."""
    names = {**_PER_FILE, **_CONCAT, **_BYTES_PER_FILE, **_BYTES_PER_FRAME, **_blob_dtypes()}
    return {"keys": np.dtype("S1"), **{name: np.dtype(dtype) for name, dtype in names.items()}}


class DigestMismatchError(IndexValidationError):
    """A copy of frame tables does not hold the bytes it was made from (its SHA-256 differs from the one recorded)."""


class FrameTables:
    """Memory-mapped frame tables of one index (see the module docs for the layout).

    Pickles as its path: a spawn worker maps the same file and shares its pages with every other
    process on the machine. Every number the header gives (lengths, shapes, offsets, dtypes) is checked
    against the file's size before an array is made, so a damaged or crafted file is a named error,
    never a read or an allocation beyond the file.

    Args:
        path: The ``.tables.bin`` file.
        source: Where the file came from, for messages (the URL of a remote index's tables, of which
            ``path`` is this machine's copy); ``path`` when None.
        sha256: The SHA-256 (hex) the file's bytes must have, checked each time it is mapped (in every
            process): a local copy of remote tables is identified by its content.

    Raises:
        IndexValidationError: The file is unreadable, not a table file, of another version, its
            arrays are inconsistent, or its bytes do not have ``sha256`` (the message names the file).

    Example::

        >>> tables = FrameTables(tables_path("data/index.json"))  # doctest: +SKIP
        >>> tables.get("videos/scene-0000/CAM_FRONT.mp4").frame_count  # doctest: +SKIP
        40
    """

    def __init__(self, path: Path | str, *, source: str | None = None, sha256: str | None = None) -> None:
        self.path = Path(path)
        self.source = source
        self.sha256 = sha256
        self._data: bytes | None = None
        where = repr(source or str(self.path))
        try:
            buf, mapped = _map(self.path)
        except OSError as err:
            raise IndexValidationError(
                where,
                [
                    (
                        f"frame-table file {where} cannot be read ({err.strerror or err}); "
                        f"check its permissions, or {_FIX}."
                    )
                ],
            ) from None
        if sha256 is not None and hashlib.sha256(mapped).hexdigest() != sha256:
            raise DigestMismatchError(
                where,
                [
                    f"frame-table file {str(self.path)!r} (a copy of {where}) does not hold the bytes it was copied "
                    f"from (its SHA-256 differs); {_FIX}."
                ],
            )
        self._parse(buf)

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str) -> FrameTables:
        """Frame tables held in memory (when no folder can keep a copy), pickled with their bytes; checked as a file."""
        tables = cls.__new__(cls)
        tables.path = Path(source.rsplit("/", 1)[-1])
        tables.source = source
        tables.sha256 = None
        tables._data = bytes(data)
        tables._parse(np.frombuffer(tables._data, dtype=np.uint8))
        return tables

    def _parse(self, buf: np.ndarray) -> None:
        self._buf = buf
        size = len(buf)
        magic, version, header_len = _PREFIX.unpack(bytes(buf[: _PREFIX.size])) if size >= _PREFIX.size else (b"", 0, 0)
        if magic != _MAGIC or (version != TABLES_VERSION and version not in _OLDER_VERSIONS):
            raise self._bad(f"is not a version-{TABLES_VERSION} lightning_vstream frame-table file")
        if _PREFIX.size + header_len > size:
            raise self._bad("is truncated or damaged (its header runs past the end of the file)")
        try:
            header = json.loads(bytes(buf[_PREFIX.size : _PREFIX.size + header_len]).decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):  # JSONDecodeError and 5,000-digit numbers too
            raise self._bad("has a damaged header") from None
        fields: dict[str, Any] = header if isinstance(header, dict) else {}
        codecs, files, layout = fields.get("codecs"), fields.get("files"), fields.get("arrays")
        if not (isinstance(codecs, list) and all(isinstance(c, str) for c in codecs) and isinstance(layout, dict)):
            raise self._bad("has a damaged header")
        if not isinstance(files, int) or not _count(files):
            raise self._bad("has a damaged header")
        self._codecs, self._n = list(codecs), files
        not_indexed = fields.get("not_indexed", [])
        if not (isinstance(not_indexed, list) and all(isinstance(k, str) for k in not_indexed)):
            raise self._bad("has a damaged header (not_indexed)")
        #: Keys of camera files in clip folders that the index build left out on purpose (a camera the
        #: other clips lack); a check of the folders passes over these, and only these.
        self.not_indexed: frozenset[str] = frozenset(not_indexed)
        start = -(-(_PREFIX.size + header_len) // _ALIGN) * _ALIGN
        known = _known_dtypes()
        arrays: dict[str, np.ndarray] = {}
        for name, spec in layout.items():
            dtype, shape, offset = spec if isinstance(spec, list) and len(spec) == 3 else (None, None, None)
            if not (isinstance(dtype, str) and isinstance(shape, list) and len(shape) == 1 and _count(shape[0])):
                raise self._bad(f"has a damaged header (array {name!r})")
            dt = _dtype(dtype, known.get(name), name)
            if dt is None or not _count(offset):
                raise self._bad(f"has a damaged header (array {name!r} has dtype {dtype!r} at offset {offset!r})")
            lo = start + offset
            hi = lo + shape[0] * dt.itemsize
            if hi > size:
                raise self._bad(f"is truncated or damaged (array {name!r} lies outside the file)")
            arrays[name] = buf[lo:hi].view(dt)
        for name in _OLDER_VERSIONS.get(version, ()):
            arrays.setdefault(name, np.full(self._n, -1, dtype=_PER_FILE[name]))
        missing = [n for n in (*_PER_FILE, *_CONCAT, "keys") if n not in arrays]
        if missing:
            raise self._bad(f"lacks the arrays {missing}")
        byte_arrays = (*_BYTES_PER_FILE, *_BYTES_PER_FRAME, *_blob_dtypes())
        partial = [n for n in byte_arrays if n not in arrays]
        if partial and len(partial) != len(byte_arrays):
            raise self._bad(f"lacks the arrays {partial}")
        self.version = int(version)
        #: Whether the file records packet byte ranges (tables written before they were added do not).
        self.has_byte_ranges = not partial
        self._a = arrays
        self._cache: OrderedDict[int, VideoInfo] = OrderedDict()
        self._check_consistent()

    def require_byte_ranges(self) -> None:
        """Refuse tables that do not record packet byte ranges (what reading a remote index needs).

        Raises:
            IndexValidationError: The tables were written before byte ranges were recorded; the
                message names the command that rebuilds them.
        """
        if self.has_byte_ranges:
            return
        where = repr(self.source or str(self.path))
        name = self.source or str(self.path)
        index = name[: -len(".tables.bin")] + ".json" if name.endswith(".tables.bin") else name
        raise IndexValidationError(
            where,
            [
                f"frame-table file {where} (format version {self.version}) does not record the packets' byte "
                "ranges, which reading videos from remote storage needs (one request per GOP). Rebuild it with "
                f"`vstream index --tables {index}` (or re-run `vstream index` on the dataset)."
            ],
        )

    def _bad(self, what: str) -> IndexValidationError:
        where = repr(self.source or str(self.path))
        return IndexValidationError(where, [f"frame-table file {where} {what}; {_FIX}."])

    def _check_consistent(self) -> None:
        a, n = self._a, self._n
        if any(len(a[name]) != n for name in (*_PER_FILE, "keys")):
            raise self._bad("has per-file arrays of different lengths")
        for offsets, data in (("frame_offsets", ("pts", "crc32")), ("key_offsets", ("key_indices", "key_seek"))):
            off = a[offsets]
            if len(off) != n + 1 or off[0] != 0 or np.any(np.diff(off) <= 0) or any(len(a[d]) != off[-1] for d in data):
                raise self._bad(f"has inconsistent {offsets}")
        if self.has_byte_ranges:
            frames = int(a["frame_offsets"][-1]) if len(a["frame_offsets"]) else 0
            if any(len(a[name]) != n for name in _BYTES_PER_FILE) or any(
                len(a[name]) != frames for name in _BYTES_PER_FRAME
            ):
                raise self._bad("has packet byte-range arrays of the wrong length")
            for blob, offsets in _BLOBS.items():
                off = a[offsets]
                if len(off) != n + 1 or off[0] != 0 or np.any(np.diff(off) < 0) or off[-1] != len(a[blob]):
                    raise self._bad(f"has inconsistent {offsets}")
        for name, dtype in _OPTIONAL_PER_FRAME.items():
            if name not in a:
                continue
            if a[name].dtype != np.dtype(dtype) or a[name].ndim != 1:
                raise self._bad(
                    f"holds array {name!r} as {a[name].dtype.str} of shape {a[name].shape}; the format stores it as "
                    f"{np.dtype(dtype).str}, one value per frame"
                )
            if len(a[name]) != int(a["frame_offsets"][-1]):
                raise self._bad(
                    f"holds {len(a[name])} values in array {name!r} for {int(a['frame_offsets'][-1])} frames"
                )
        if n and (np.any(a["codec"] < 0) or np.any(a["codec"] >= len(self._codecs))):
            raise self._bad("names a codec it does not list")
        if n > 1 and np.any(a["keys"][1:] <= a["keys"][:-1]):
            raise self._bad("has unsorted or repeated keys")

    def __reduce__(self) -> tuple[Any, ...]:
        if self._data is not None:
            return (_tables_in_memory, (self._data, self.source))
        return (_tables, (str(self.path), self.source, self.sha256))

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        return f"FrameTables({str(self.path)!r}, files={self._n})"

    def keys(self) -> Iterator[str]:
        """File keys in sorted order."""
        return (k.decode("utf-8") for k in self._a["keys"])

    @property
    def key_array(self) -> np.ndarray:
        """Every file key (UTF-8) in sorted order, as the memory-mapped ``S`` array: for vectorised searches."""
        return self._a["keys"]

    def rows(self, keys: Sequence[str]) -> np.ndarray:
        """Row of each key, -1 where a key has no table (one vectorised binary search)."""
        table = self._a["keys"]
        if not len(keys):
            return np.zeros(0, dtype=np.int64)
        wanted = np.array([k.encode("utf-8") for k in keys], dtype=f"S{max(table.dtype.itemsize, 1)}")
        if not self._n:
            return np.full(len(keys), -1, dtype=np.int64)
        pos = np.searchsorted(table, wanted)
        found = pos < self._n
        found[found] = table[pos[found]] == wanted[found]
        # Keys longer than the table's width were cut by the array's dtype: never a match.
        found &= np.array([len(k.encode("utf-8")) <= table.dtype.itemsize for k in keys])
        return np.where(found, pos, -1).astype(np.int64)

    def under(self, prefix: str) -> list[tuple[str, int]]:
        """``(key, row)`` of every key starting with ``prefix`` (one binary search; for folder listings)."""
        table = self._a["keys"]
        if not self._n:
            return []
        raw = prefix.encode("utf-8")
        lo = int(np.searchsorted(table, np.array([raw], dtype=table.dtype)[0], side="left"))
        found = []
        for row in range(lo, self._n):
            key = bytes(table[row])
            if not key.startswith(raw):
                break
            found.append((key.decode("utf-8"), row))
        return found

    def row(self, key: str) -> int:
        """Row of one key, or -1."""
        return int(self.rows([key])[0])

    def get(self, key: str) -> VideoInfo | None:
        """Frame table of the file at ``key`` (relative to the index folder), or None."""
        row = self.row(key)
        return None if row < 0 else self.info(row)

    def identity(self, row: int) -> FileIdentity | None:
        """The recorded identity of row ``row``, or None when unknown."""
        a = self._a
        values = [int(a[n][row]) for n in ("size", "mtime_ns", "head_crc32", "tail_crc32")]
        if min(values) < 0:
            return None
        etag = None
        if self.has_byte_ranges:
            e0, e1 = int(a["etag_offsets"][row]), int(a["etag_offsets"][row + 1])
            etag = bytes(a["etag"][e0:e1]).decode("utf-8", "replace") or None
        size, mtime_ns, head, tail = values
        return FileIdentity(size, mtime_ns, head, tail, etag=etag)

    def layout(self, row: int) -> PacketLayout | None:
        """The packet byte ranges of row ``row`` (see :class:`PacketLayout`), or None when unknown."""
        a = self._a
        if not self.has_byte_ranges or not a["has_layout"][row]:
            return None
        f0, f1 = int(a["frame_offsets"][row]), int(a["frame_offsets"][row + 1])
        x0, x1 = int(a["extra_offsets"][row]), int(a["extra_offsets"][row + 1])
        pos = a["pkt_pos"][f0:f1]
        if len(pos) and int(pos.min()) < 0:
            raise self._bad(f"holds a negative packet position for {a['keys'][row].decode('utf-8', 'replace')!r}")
        file_size = int(a["size"][row])
        if file_size >= 0 and len(pos) and np.any(pos > file_size - a["pkt_size"][f0:f1].astype(np.int64)):
            # Also what keeps a crafted packet size from turning into a read (and an allocation) of gigabytes.
            raise self._bad(
                f"holds a packet that ends past the end of {a['keys'][row].decode('utf-8', 'replace')!r} "
                f"({file_size} bytes)"
            )
        colour = tuple(int(a[n][row]) for n in ("col_range", "col_space", "col_primaries", "col_trc"))
        return PacketLayout(
            pos=tuple(pos.tolist()),
            size=tuple(a["pkt_size"][f0:f1].tolist()),
            extradata=bytes(a["extradata"][x0:x1]),
            colour=colour,  # type: ignore[arg-type]
        )

    def info(self, row: int) -> VideoInfo:
        """The :class:`VideoInfo` of row ``row``, built from the arrays (validated like a JSON entry).

        The last :data:`CACHED_INFOS` built are kept, so a file used again and again (a sampler
        asking for its timestamps per sample) is not rebuilt each time.
        """
        cached = self._cache.get(row)
        if cached is not None:
            self._cache.move_to_end(row)
            return cached
        info = self._build(row)
        self._cache[row] = info
        if len(self._cache) > CACHED_INFOS:
            self._cache.popitem(last=False)
        return info

    def _build(self, row: int) -> VideoInfo:
        a = self._a
        f0, f1 = int(a["frame_offsets"][row]), int(a["frame_offsets"][row + 1])
        k0, k1 = int(a["key_offsets"][row]), int(a["key_offsets"][row + 1])
        pts = a["pts"][f0:f1]
        keys = a["key_indices"][k0:k1]
        key = a["keys"][row].decode("utf-8", "replace")
        if np.any(np.diff(pts) <= 0) or keys[0] != 0 or np.any(np.diff(keys) <= 0) or keys[-1] >= f1 - f0:
            raise self._bad(f"holds an inconsistent frame table for {key!r}")
        tb = (int(a["tb_num"][row]), int(a["tb_den"][row]))
        width, height = int(a["width"][row]), int(a["height"][row])
        if min(tb) <= 0 or width <= 0 or height <= 0:
            raise self._bad(f"holds a non-positive size or time base for {key!r}")
        fps = float(a["fps"][row])
        if max(tb) > _MAX_INT32 or max(width, height) > MAX_SIDE or not 0.0 <= fps < 1e9:
            raise self._bad(f"holds a frame size, time base or frame rate no video has for {key!r}")
        config = int(a["config_crc32"][row])
        reorder = int(a["reorder_depth"][row])
        references = None
        if "pkt_ref" in a:
            codes = a["pkt_ref"][f0:f1]
            if np.any((codes > MAX_REFERENCE_CODE) & (codes != REFERENCE_UNKNOWN)):
                raise self._bad(f"holds invalid reference codes (array 'pkt_ref') for {key!r}")
            if not np.all(codes == REFERENCE_UNKNOWN):
                references = tuple(codes.tolist())
        return VideoInfo(
            codec=self._codecs[int(a["codec"][row])],
            width=width,
            height=height,
            time_base=tb,
            pts=tuple(pts.tolist()),
            key_indices=tuple(keys.tolist()),
            key_seek=tuple(a["key_seek"][k0:k1].tolist()),
            average_fps=fps,
            crc32=tuple(a["crc32"][f0:f1].tolist()) if a["has_crc"][row] else None,
            config_crc32=None if config < 0 else config,
            identity=self.identity(row),
            layout=self.layout(row),
            reorder_depth=None if reorder < 0 else reorder,
            references=references,
        )


def _tables(path: str, source: str | None, sha256: str | None = None) -> FrameTables:
    return FrameTables(path, source=source, sha256=sha256)


def _tables_in_memory(data: bytes, source: str) -> FrameTables:
    return FrameTables.from_bytes(data, source=source)


def _dtype(text: str, expected: np.dtype[Any] | None, name: str) -> np.dtype[Any] | None:
    """The dtype a header names for array ``name``, or None when it is not the one that array has."""
    try:
        dt = np.dtype(text)
    except (TypeError, ValueError):
        return None
    if expected is not None:  # the arrays this version knows have their dtype; ``keys``, bytes of any width
        return dt if dt == expected or (name == "keys" and dt.kind == "S" and dt.itemsize > 0) else None
    plain = dt.kind in "biufS" and dt.names is None and dt.subdtype is None and dt.itemsize > 0
    return dt if plain else None  # an array a later version added: plain numbers or bytes


def _count(value: Any) -> bool:
    """Whether ``value`` is a non-negative int (a count, a length or an offset), not a bool."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
