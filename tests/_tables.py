"""JSON frame tables (``index.meta.json``) as earlier releases wrote them: the package reads them, tests write them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lightning_vstream.index.table_file import FrameTables, tables_path
from lightning_vstream.index.tables import META_FORMAT, META_VERSION, VideoInfo, metadata_path
from lightning_vstream.indexing import build_index


def metadata_entry(info: VideoInfo) -> dict[str, Any]:
    """The JSON sidecar entry of one file: its identity and frame table."""
    ident = info.identity
    entry: dict[str, Any] = {"size": ident.size if ident is not None else None}
    if ident is not None:
        entry["identity"] = ident.to_dict()
    entry["info"] = info.to_dict()
    return entry


def write_json_sidecar(index_path: Path) -> Path:
    """Replace an index's binary frame tables by the JSON sidecar holding the same tables; the sidecar's path."""
    binary = tables_path(index_path)
    tables = FrameTables(binary)
    files = {key: metadata_entry(info) for key in tables.keys() if (info := tables.get(key)) is not None}  # noqa: SIM118
    sidecar = metadata_path(index_path)
    meta = {"format": META_FORMAT, "version": META_VERSION, "files": files}
    sidecar.write_text(json.dumps(meta, separators=(",", ":")) + "\n", encoding="utf-8")
    binary.unlink()
    return sidecar


def build_index_with_json_tables(root: Path, **kwargs: Any) -> Path:
    """:func:`~lightning_vstream.build_index`, with the frame tables in a JSON sidecar instead."""
    index = build_index(root, **kwargs)
    write_json_sidecar(index)
    return index
