"""Where a new index may be written: never among a dataset's camera files, never over a file that is not ours.

Building an index writes three files: the index (``index.json``), its frame tables
(``index.tables.bin``) and the list of clips left out (``index.incomplete.json``), and removes the
JSON frame tables of earlier releases (``index.meta.json``). Before any
probing, :func:`check_output` makes sure none of them lands inside a clip folder of the dataset
(where it would sit among, or replace, the camera files) and that each one already there is an
earlier file of this package, so a mistyped ``-o`` cannot destroy a video, a notes file or another
tool's output. ``force=True`` (``vstream index --force``) replaces a file that is not ours; a clip
folder is refused whatever it says.

Example::

    >>> check_output(Path("data/index.json"), [Path("data/videos/scene-0001")], force=False)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from lightning_vstream.errors import ConfigurationError
from lightning_vstream.index.files import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS
from lightning_vstream.index.table_file import _MAGIC, tables_path
from lightning_vstream.index.tables import metadata_path

__all__ = ["check_output", "incomplete_path"]

#: Largest file read to tell whether it is one of ours: an index of a million clips holds ~40 MB.
_MAX_READ = 1 << 28


def incomplete_path(index_path: Path | str) -> str:
    """Where the clips left out of an index are listed: ``index.incomplete.json`` next to ``index.json``
    (a path, or a URL for a remote index)."""
    text = str(index_path)
    stem = text[: -len(".json")] if text.endswith(".json") else text
    return f"{stem}.incomplete.json"


def check_output(output: Path, clip_folders: Iterable[Path], *, force: bool, tables: bool = True) -> None:
    """Refuse an index path that would write among the dataset's camera files or over a file that is not ours.

    Args:
        output: The index file to write (absolute).
        clip_folders: Every clip folder of the dataset being indexed.
        force: Replace existing files that are not an index, frame tables or list of this package.
        tables: Whether the frame tables are written too.

    Raises:
        ConfigurationError: ``output`` lies inside a clip folder, one of the files is a folder, or
            (without ``force``) one is not ours or ``output`` has a video or image extension; the
            message names the file and the fix.
    """
    inside = _enclosing(output, clip_folders)
    if inside is not None:
        raise ConfigurationError(
            f"index output {str(output)!r} is inside clip folder {str(inside)!r} of the dataset; an index and its "
            "frame tables are never written among camera files. Write it next to the video folders, e.g. "
            f"{str(inside.parent.parent / 'index.json')!r}."
        )
    fix = "choose another output path (-o), or pass force=True (`vstream index --force`) to replace it"
    if output.suffix.lower() in VIDEO_EXTENSIONS | IMAGE_EXTENSIONS and not force:
        raise ConfigurationError(
            f"index output {str(output)!r} has the extension of a camera file ({output.suffix!r}); an index is a "
            f"JSON file, name it e.g. {str(output.with_suffix('.json'))!r}, or {fix}."
        )
    files = {output: ("an index", _is_index)}
    if tables:
        files[tables_path(output)] = ("frame tables", _is_tables)
        files[metadata_path(output)] = ("frame tables of an earlier release", _is_object)  # removed when written
    files[Path(incomplete_path(output))] = ("a list of incomplete clips", _is_listing)
    for path, (kind, ours) in files.items():
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        except OSError as err:
            raise ConfigurationError(
                f"index output {str(path)!r} cannot be checked ({err.strerror or err}); {fix}."
            ) from None
        if stat.S_ISDIR(st.st_mode):
            raise ConfigurationError(
                f"index output {str(path)!r} is a folder; pass the index file to write, e.g. "
                f"{str(output / 'index.json') if path == output else str(output.with_name('index.json'))!r}."
            )
        if force:
            continue
        if not stat.S_ISREG(st.st_mode):
            raise ConfigurationError(f"{str(path)!r} is not a regular file, so not {kind} of ours; {fix}.")
        if not ours(path, st.st_size):
            raise ConfigurationError(
                f"{str(path)!r} exists and is not {kind} written by `vstream index` ({st.st_size} bytes); it is "
                f"never overwritten unasked: {fix}."
            )


def _enclosing(output: Path, clip_folders: Iterable[Path]) -> Path | None:
    """The clip folder that holds ``output`` (at any depth), or None."""
    folders = {os.path.realpath(folder): folder for folder in clip_folders}
    here = os.path.realpath(output)
    while True:
        parent = os.path.dirname(here)
        if parent in folders:
            return folders[parent]
        if parent == here:
            return None
        here = parent


def _read(path: Path, limit: int) -> bytes | None:
    """Up to ``limit`` bytes of ``path`` (opened without blocking on a FIFO swapped in meanwhile)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(limit)


def _json(path: Path, size: int) -> object:
    raw = _read(path, _MAX_READ) if size <= _MAX_READ else None
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


def _is_index(path: Path, size: int) -> bool:
    """An accvlab index: ``{video_dir: {clip_id: frame_count}}``."""
    data = _json(path, size)
    return isinstance(data, dict) and all(
        isinstance(clips, dict)
        and all(isinstance(count, int) and not isinstance(count, bool) for count in clips.values())
        for clips in data.values()
    )


def _is_listing(path: Path, size: int) -> bool:
    """A list of clips left out: ``{video_dir: {clip_id: [reason, ...]}}``."""
    data = _json(path, size)
    return isinstance(data, dict) and all(
        isinstance(clips, dict) and all(isinstance(reasons, list) for reasons in clips.values())
        for clips in data.values()
    )


def _is_object(path: Path, size: int) -> bool:
    return isinstance(_json(path, size), dict)


def _is_tables(path: Path, size: int) -> bool:
    """Frame tables of this package: they start with its magic bytes."""
    return _read(path, len(_MAGIC)) == _MAGIC
