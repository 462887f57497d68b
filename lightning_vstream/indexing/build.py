"""Building an index from a dataset tree, or the frame tables of an existing one, by probing every file."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from lightning_vstream.errors import DataFormatError, IndexValidationError, MissingFileError, VideoDecodeError
from lightning_vstream.index.files import discover_cameras, image_files, natural_key
from lightning_vstream.index.load import read_index_layout
from lightning_vstream.index.table_file import tables_path
from lightning_vstream.index.table_write import write_tables
from lightning_vstream.index.tables import (
    META_FORMAT,
    META_VERSION,
    VideoInfo,
    metadata_entry,
    metadata_path,
    table_key,
)
from lightning_vstream.indexing.probe import probe_with_identity

__all__ = ["TableFormat", "build_index", "write_frame_tables", "write_index_tables"]

TableFormat = Literal["binary", "json"]


def _find_clip_folders(root: Path) -> dict[Path, list[Path]]:
    """video_dir -> clip folders under ``root`` (a clip folder holds camera files)."""
    result: dict[Path, list[Path]] = {}
    visited: set[str] = set()
    unreadable: list[str] = []

    def record(err: OSError) -> None:
        unreadable.append(f"folder {err.filename!r} cannot be read ({err.strerror or err}); check its permissions.")

    # Symbolic links to folders are followed (a video folder may be one); each real folder is
    # entered once, so a link loop ends the walk instead of recursing forever.
    for dirpath, dirnames, _ in os.walk(root, onerror=record, followlinks=True):
        folder = Path(dirpath)
        real = os.path.realpath(folder)
        if real in visited:
            dirnames[:] = []
            continue
        visited.add(real)
        dirnames.sort()
        try:
            cams = discover_cameras(folder)
        except IndexValidationError:
            cams = {"": folder}
        except OSError as err:
            record(err)
            continue
        if cams and not image_files(folder):
            result.setdefault(folder.parent, []).append(folder)
            dirnames[:] = [d for d in dirnames if (folder / d) not in cams.values()]
    if unreadable:
        raise IndexValidationError(str(root), unreadable)
    return result


def build_index(
    root: Path | str,
    *,
    output: Path | str,
    video_dirs: Sequence[str] | None = None,
    progress: bool = True,
    metadata: bool = True,
    table_format: TableFormat = "binary",
) -> Path:
    """Scan a dataset tree and write an accvlab index (plus the metadata sidecar).

    Every camera file is probed, so frame counts come from the streams themselves. A clip's
    frame count is the smallest over its cameras; clips whose cameras disagree are reported
    on stderr.

    Args:
        root: Dataset folder; clip folders are found anywhere below it.
        output: Index file to write; ``video_dir`` keys are relative to its folder.
        video_dirs: Only these folders (relative to ``root``) instead of scanning.
        progress: Show a progress bar while probing.
        metadata: Also write every file's frame table and identity next to the index.
        table_format: ``"binary"`` writes ``index.tables.bin`` (memory-mapped, see
            :mod:`~lightning_vstream.index.table_file`); ``"json"`` the older ``index.meta.json``.

    Returns:
        The index path.

    Raises:
        FileNotFoundError: ``root`` does not exist.
        IndexValidationError: No clip folder was found, or files could not be probed.

    Example::

        >>> build_index("data", output="data/index.json")  # doctest: +SKIP
    """
    from tqdm import tqdm

    if table_format not in ("binary", "json"):
        raise DataFormatError(f"table_format={table_format!r} is not supported; use 'binary' or 'json'.")
    # Absolute but not resolved: keys stay relative to the folders as the user sees them, even
    # when a video folder is a symbolic link.
    root = Path(os.path.abspath(root))
    output = Path(os.path.abspath(output))
    if not root.is_dir():
        raise MissingFileError(f"dataset folder {str(root)!r} does not exist.")
    if video_dirs is not None:
        missing = [d for d in video_dirs if not (root / d).is_dir()]
        if missing:
            raise MissingFileError(f"video folder(s) {missing} do not exist under {str(root)!r}.")
        groups = {
            Path(os.path.normpath(root / d)): sorted(
                (p for p in (root / d).iterdir() if p.is_dir()), key=lambda p: natural_key(p.name)
            )
            for d in video_dirs
        }
    else:
        groups = _find_clip_folders(root)
    jobs = [
        (vd, folder, name, path)
        for vd, folders in groups.items()
        for folder in folders
        for name, path in discover_cameras(folder).items()
    ]
    if not jobs:
        raise IndexValidationError(
            str(root), [f"no clip folders with video files or image folders found under {str(root)!r}."]
        )
    infos: dict[Path, VideoInfo] = {}
    problems: list[str] = []
    for _, folder, name, path in tqdm(jobs, desc="probing", unit="file", disable=not progress or len(jobs) < 20):
        try:
            infos[path] = probe_with_identity(path)
        except (VideoDecodeError, OSError, ValueError) as err:
            problems.append(f"clip {folder.name!r}, camera {name!r}: {err}")
    if problems:
        raise IndexValidationError(str(root), problems)
    index: dict[str, dict[str, int]] = {}
    files: dict[str, VideoInfo] = {}
    for vd, folder, _name, path in jobs:
        key = os.path.relpath(vd, output.parent).replace(os.sep, "/")
        counts = index.setdefault(key, {})
        n = infos[path].frame_count
        if folder.name in counts and counts[folder.name] != n:
            print(
                f"vstream index: clip {folder.name!r}: cameras hold different frame counts; "
                f"using the smallest ({min(n, counts[folder.name])}).",
                file=sys.stderr,
            )
        counts[folder.name] = min(n, counts.get(folder.name, n))
        files[table_key(output.parent, path)] = infos[path]
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    if metadata:
        write_frame_tables(output, files, table_format=table_format)
    return output


def write_frame_tables(
    index_path: Path, infos: Mapping[str, VideoInfo], *, table_format: TableFormat = "binary"
) -> Path:
    """Write frame tables next to ``index_path`` and remove the other format's stale file.

    Returns:
        The file written: ``index.tables.bin`` (binary) or ``index.meta.json`` (JSON).
    """
    binary, sidecar = tables_path(index_path), metadata_path(index_path)
    if table_format == "binary":
        write_tables(binary, infos)
        sidecar.unlink(missing_ok=True)
        return binary
    meta = {"format": META_FORMAT, "version": META_VERSION, "files": {k: metadata_entry(v) for k, v in infos.items()}}
    sidecar.write_text(json.dumps(meta, separators=(",", ":")) + "\n", encoding="utf-8")
    binary.unlink(missing_ok=True)
    return sidecar


def write_index_tables(index_path: Path | str, *, table_format: TableFormat = "binary", progress: bool = True) -> Path:
    """Probe every file an existing index lists and write its frame tables (turns integrity checks on).

    The index file itself is left as it is, so a curated index (a subset of a dataset) keeps its
    clips. Existing frame tables are replaced.

    Args:
        index_path: The index file.
        table_format: ``"binary"`` (``index.tables.bin``) or ``"json"`` (``index.meta.json``).
        progress: Show a progress bar while probing.

    Returns:
        The frame-table file written.

    Raises:
        IndexValidationError: The index is invalid, or files could not be probed (every problem listed).

    Example::

        >>> write_index_tables("data/index.json")  # doctest: +SKIP
    """
    from tqdm import tqdm

    index_path = Path(index_path).resolve()
    layout = read_index_layout(index_path)
    infos: dict[str, VideoInfo] = {}
    problems: list[str] = []
    for key, clip_id, camera, path in tqdm(
        layout, desc="probing", unit="file", disable=not progress or len(layout) < 20
    ):
        try:
            infos[key] = probe_with_identity(path)
        except (VideoDecodeError, OSError, ValueError) as err:
            problems.append(f"clip {clip_id!r}, camera {camera!r}: {err}")
    if problems:
        raise IndexValidationError(repr(str(index_path)), problems)
    return write_frame_tables(index_path, infos, table_format=table_format)
