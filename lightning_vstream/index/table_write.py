"""Writing the binary frame-table file (its layout: :mod:`lightning_vstream.index.table_file`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lightning_vstream.errors import DataFormatError
from lightning_vstream.index.table_file import (
    _ALIGN,
    _BLOBS,
    _BYTES_PER_FILE,
    _BYTES_PER_FRAME,
    _CONCAT,
    _I64,
    _MAGIC,
    _OPTIONAL_PER_FRAME,
    _PER_FILE,
    _PREFIX,
    TABLES_FORMAT,
    TABLES_VERSION,
    _blob_dtypes,
)
from lightning_vstream.index.tables import MAX_REFERENCE_CODE, REFERENCE_UNKNOWN, VideoInfo
from lightning_vstream.storage.atomic import open_atomic

__all__ = ["write_table_arrays", "write_tables"]


def write_tables(path: Path | str, infos: Mapping[str, VideoInfo], *, not_indexed: Sequence[str] = ()) -> Path:
    """Write frame tables keyed by file path (relative to the index folder) to a binary table file.

    The file is written to a temporary name and renamed, so readers never see half a file.

    Args:
        path: File to write (see :func:`tables_path`).
        infos: Key -> frame table.
        not_indexed: Keys of camera files in clip folders that the index build left out on purpose (a
            camera the other clips lack): recorded so that a check of the folders does not take them for
            files added since (:attr:`FrameTables.not_indexed`).

    Returns:
        ``path``.

    Raises:
        ValueError: A value does not fit the format (a timestamp beyond 64 bits, a key with a NUL).

    Example::

        >>> write_tables(tables_path("data/index.json"), {"videos/a/CAM.mp4": info})  # doctest: +SKIP
    """
    path = Path(path)
    keys = sorted(infos)
    encoded = [k.encode("utf-8") for k in keys]
    if any(b"\0" in k or not k for k in encoded):
        raise DataFormatError("frame-table keys must be non-empty and hold no NUL character.")
    codecs = sorted({infos[k].codec for k in keys})
    codec_id = {c: i for i, c in enumerate(codecs)}
    rows: dict[str, list[Any]] = {name: [] for name in _PER_FILE}
    pts: list[int] = []
    crcs: list[int] = []
    key_indices: list[int] = []
    key_seek: list[int] = []
    frame_offsets = [0]
    key_offsets = [0]
    layout_rows: dict[str, list[int]] = {name: [] for name in _BYTES_PER_FILE}
    pkt_pos: list[int] = []
    pkt_size: list[int] = []
    pkt_ref: list[int] = []
    blobs: dict[str, list[bytes]] = {name: [] for name in _BLOBS}
    for k in keys:
        info = infos[k]
        pkt_ref.extend(info.references if info.references is not None else [REFERENCE_UNKNOWN] * info.frame_count)
        layout = info.layout
        layout_rows["has_layout"].append(int(layout is not None))
        colour = layout.colour if layout is not None else (-1, -1, -1, -1)
        for name, value in zip(("col_range", "col_space", "col_primaries", "col_trc"), colour):
            layout_rows[name].append(value)
        pkt_pos.extend(layout.pos if layout is not None else [-1] * info.frame_count)
        pkt_size.extend(layout.size if layout is not None else [0] * info.frame_count)
        blobs["extradata"].append(layout.extradata if layout is not None else b"")
        etag = info.identity.etag if info.identity is not None else None
        blobs["etag"].append((etag or "").encode("utf-8"))
        ident = info.identity
        values: dict[str, Any] = {
            "codec": codec_id[info.codec],
            "width": info.width,
            "height": info.height,
            "tb_num": info.time_base[0],
            "tb_den": info.time_base[1],
            "fps": info.average_fps,
            "has_crc": int(info.crc32 is not None),
            "config_crc32": -1 if info.config_crc32 is None else info.config_crc32,
            "size": -1 if ident is None else ident.size,
            "mtime_ns": -1 if ident is None else ident.mtime_ns,
            "head_crc32": -1 if ident is None else ident.head_crc32,
            "tail_crc32": -1 if ident is None else ident.tail_crc32,
            "reorder_depth": -1 if info.reorder_depth is None else info.reorder_depth,
        }
        for name, value in values.items():
            rows[name].append(value)
        pts.extend(info.pts)
        crcs.extend(info.crc32 if info.crc32 is not None else [0] * info.frame_count)
        key_indices.extend(info.key_indices)
        key_seek.extend(info.key_seek)
        frame_offsets.append(len(pts))
        key_offsets.append(len(key_indices))
    columns: list[tuple[str, list[Any]]] = [("pts", pts), ("key_seek", key_seek), *rows.items()]
    for name, column in columns:
        ints = [v for v in column if isinstance(v, int)]
        if ints and (min(ints) < _I64[0] or max(ints) > _I64[1]):
            raise DataFormatError(
                f"frame-table field {name!r} holds a value beyond 64 bits; these files cannot be indexed."
            )
    arrays: dict[str, np.ndarray] = {
        name: np.asarray(rows[name], dtype=dtype).reshape(len(keys)) for name, dtype in _PER_FILE.items()
    }
    concatenated = {
        "pts": pts,
        "crc32": crcs,
        "key_indices": key_indices,
        "key_seek": key_seek,
        "frame_offsets": frame_offsets,
        "key_offsets": key_offsets,
    }
    for name, column in concatenated.items():
        arrays[name] = np.asarray(column, dtype=_CONCAT[name]).reshape(len(column))
    arrays.update(_layout_arrays(layout_rows, pkt_pos, pkt_size, blobs))
    arrays["pkt_ref"] = np.asarray(pkt_ref, dtype=_OPTIONAL_PER_FRAME["pkt_ref"]).reshape(len(pkt_ref))
    return write_table_arrays(path, encoded, codecs, arrays, not_indexed=not_indexed)


def _layout_arrays(
    rows: Mapping[str, list[int]], pkt_pos: list[int], pkt_size: list[int], blobs: Mapping[str, list[bytes]]
) -> dict[str, np.ndarray]:
    """The version-2 arrays (packet byte ranges, colour tags, extradata and ETags) from per-file lists."""
    arrays = {
        name: np.asarray(rows[name], dtype=dtype).reshape(len(rows[name])) for name, dtype in _BYTES_PER_FILE.items()
    }
    arrays["pkt_pos"] = np.asarray(pkt_pos, dtype=_BYTES_PER_FRAME["pkt_pos"]).reshape(len(pkt_pos))
    arrays["pkt_size"] = np.asarray(pkt_size, dtype=_BYTES_PER_FRAME["pkt_size"]).reshape(len(pkt_size))
    for blob, offsets in _BLOBS.items():
        pieces = blobs[blob]
        arrays[offsets] = np.concatenate([[0], np.cumsum([len(b) for b in pieces], dtype=np.int64)]).astype("<i8")
        arrays[blob] = np.frombuffer(b"".join(pieces), dtype=np.uint8).copy()
    return arrays


def write_table_arrays(
    path: Path | str,
    keys: Sequence[bytes] | np.ndarray,
    codecs: Sequence[str],
    arrays: Mapping[str, np.ndarray],
    *,
    not_indexed: Sequence[str] = (),
) -> Path:
    """Write frame tables given directly as arrays (for generated or converted tables at scale).

    Args:
        path: File to write.
        keys: UTF-8 encoded file keys, sorted and distinct (a list of bytes or an ``S`` array).
        codecs: Codec names the ``codec`` array indexes.
        arrays: Every per-file array (one row per key) and concatenated array of the format (see
            the module docs), in any integer or float dtype that converts losslessly;
            ``reorder_depth`` and ``pkt_ref`` may be left out (unknown).
        not_indexed: Keys of files left out of the index on purpose (see :func:`write_tables`).

    Returns:
        ``path``.

    Raises:
        ValueError: An array is missing, or has the wrong length.

    Example::

        >>> write_table_arrays("t.tables.bin", [b"a.mp4"], ["h264"], arrays)  # doctest: +SKIP
    """
    path = Path(path)
    key_array = (
        np.asarray(keys)
        if isinstance(keys, np.ndarray)
        else (
            np.array(list(keys), dtype=f"S{max((len(k) for k in keys), default=1)}") if len(keys) else np.zeros(0, "S1")
        )
    )
    arrays = {"reorder_depth": np.full(len(key_array), -1), **arrays}  # optional: unknown unless given
    missing = sorted(name for name in (*_PER_FILE, *_CONCAT) if name not in arrays)
    if missing:
        raise DataFormatError(f"frame-table arrays {missing} are missing.")
    if any(name not in arrays for name in (*_BYTES_PER_FILE, *_BYTES_PER_FRAME, *_BLOBS, *_BLOBS.values())):
        # Tables generated without packet byte ranges: every file is read through its container.
        files, frames = len(key_array), int(np.asarray(arrays["frame_offsets"])[-1])
        no_layout = {name: [0 if name == "has_layout" else -1] * files for name in _BYTES_PER_FILE}
        empty = {blob: [b""] * files for blob in _BLOBS}
        arrays = {**_layout_arrays(no_layout, [-1] * frames, [0] * frames, empty), **arrays}
    out: dict[str, np.ndarray] = {"keys": key_array}
    for name, dtype in {**_PER_FILE, **_CONCAT, **_BYTES_PER_FILE, **_BYTES_PER_FRAME, **_blob_dtypes()}.items():
        arr = np.asarray(arrays[name])
        if arr.ndim != 1:
            raise DataFormatError(f"frame-table array {name!r} must be one-dimensional, got shape {arr.shape}.")
        out[name] = arr.astype(dtype, copy=False)
    for name, dtype in _OPTIONAL_PER_FRAME.items():
        if name in arrays:
            arr = np.asarray(arrays[name])
            if arr.shape != (len(out["pts"]),):
                raise DataFormatError(
                    f"frame-table array {name!r} needs one value per frame ({len(out['pts'])}), got shape {arr.shape}."
                )
            if arr.size and np.any(((arr < 0) | (arr > MAX_REFERENCE_CODE)) & (arr != REFERENCE_UNKNOWN)):
                raise DataFormatError(
                    f"frame-table array {name!r} holds values other than reference codes (0 .. {MAX_REFERENCE_CODE}, "
                    f"or {REFERENCE_UNKNOWN} for unknown)."
                )
            out[name] = arr.astype(dtype, copy=False)
    if any(len(out[name]) != len(key_array) for name in (*_PER_FILE, *_BYTES_PER_FILE)):
        raise DataFormatError("every per-file frame-table array needs one row per key.")
    if len(key_array) > 1 and np.any(key_array[1:] <= key_array[:-1]):
        raise DataFormatError("frame-table keys must be sorted and distinct.")
    header: dict[str, Any] = {"files": len(key_array), "codecs": list(codecs)}
    if not_indexed:
        header["not_indexed"] = sorted(not_indexed)
    _write_arrays(path, out, header)
    return path


def _write_arrays(path: Path, arrays: Mapping[str, np.ndarray], extra: Mapping[str, Any]) -> None:
    layout: dict[str, list[Any]] = {}
    offset = 0
    for name, arr in arrays.items():
        layout[name] = [arr.dtype.str, list(arr.shape), offset]
        offset += -(-arr.nbytes // _ALIGN) * _ALIGN
    header = json.dumps({"format": TABLES_FORMAT, "version": TABLES_VERSION, **extra, "arrays": layout}).encode()
    start = -(-(_PREFIX.size + len(header)) // _ALIGN) * _ALIGN
    path.parent.mkdir(parents=True, exist_ok=True)
    # Every byte written, padding included: a file with holes is memory-mapped fine on most disks, but
    # on a full tmpfs reading a hole through the map needs a page the disk no longer has (SIGBUS).
    with open_atomic(path) as f:
        head = _PREFIX.pack(_MAGIC, TABLES_VERSION, len(header)) + header
        f.write(head + bytes(start - len(head)))
        for arr in arrays.values():
            data = np.ascontiguousarray(arr)
            f.write(data.reshape(-1).view(np.uint8).data)
            f.write(bytes(-data.nbytes % _ALIGN))
