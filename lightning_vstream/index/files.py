"""How a dataset lays out on disk: clip folders, camera files and image folders."""

from __future__ import annotations

import os
import re
import stat as stat_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_vstream.errors import ConfigurationError, IndexValidationError, MissingFileError
from lightning_vstream.storage.urls import is_url

if TYPE_CHECKING:
    from lightning_vstream.storage.config import StorageConfig

__all__ = [
    "IMAGE_EXTENSIONS",
    "VIDEO_EXTENSIONS",
    "discover_cameras",
    "image_files",
    "irregular_cameras",
    "is_dir",
    "natural_key",
    "read_index_bytes",
    "scan_cameras",
]

VIDEO_EXTENSIONS = frozenset({".mp4", ".mov", ".mkv", ".avi", ".webm", ".m4v", ".ts", ".h264", ".h265", ".hevc"})
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png"})


def is_dir(path: Path) -> bool:
    """``path.is_dir()`` that answers False for paths the OS rejects (names over 255 bytes...)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def natural_key(text: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def image_files(folder: Path) -> list[Path]:
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    files = [Path(e.path) for e in entries if e.is_file() and Path(e.name).suffix.lower() in IMAGE_EXTENSIONS]
    return sorted(files, key=lambda p: natural_key(p.name))


def scan_cameras(folder: str) -> dict[str, str]:
    """Camera name -> file (or image folder) name in a clip folder, sorted by camera name.

    Strings, not paths: an index of a million files scans them all on load.

    Raises:
        IndexValidationError: Two files name the same camera.
        OSError: The folder cannot be read.
    """
    found: dict[str, str] = {}
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        stem, ext = os.path.splitext(entry.name)
        if ext.lower() in VIDEO_EXTENSIONS and entry.is_file():
            if stem in found:
                raise IndexValidationError(
                    str(folder),
                    [
                        (
                            f"{str(folder)!r} holds two files for camera {stem!r}: "
                            f"{found[stem]!r} and {entry.name!r}; keep one."
                        )
                    ],
                )
            found[stem] = entry.name
        elif entry.is_dir() and image_files(Path(entry.path)):
            found.setdefault(entry.name, entry.name)
    # Order by camera name (the stem), not by file name: "CAM-2.mp4" sorts before "CAM.mp4".
    return dict(sorted(found.items()))


_KINDS = {
    stat_module.S_IFIFO: "a FIFO (named pipe)",
    stat_module.S_IFSOCK: "a socket",
    stat_module.S_IFCHR: "a character device",
    stat_module.S_IFBLK: "a block device",
}


def irregular_cameras(folder: str) -> dict[str, str]:
    """Camera name -> what its video-named entry is, for entries that are neither a file nor a folder.

    :func:`scan_cameras` leaves such entries (a FIFO, a socket, a device) out; this names them, so that a
    clip's camera can be reported as "not a regular file" rather than missing.

    Example:
        >>> irregular_cameras("/nonexistent-folder")
        {}
    """
    found: dict[str, str] = {}
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return found
    for entry in entries:
        stem, ext = os.path.splitext(entry.name)
        if ext.lower() not in VIDEO_EXTENSIONS:
            continue
        try:
            mode = entry.stat().st_mode
        except OSError:
            continue  # a dangling link: missing, as scan_cameras says
        if not stat_module.S_ISREG(mode) and not stat_module.S_ISDIR(mode):
            found[stem] = f"{entry.name!r} is {_KINDS.get(stat_module.S_IFMT(mode), 'not a regular file')}"
    return found


def discover_cameras(folder: Path) -> dict[str, Path]:
    """Camera name -> file (or image folder) found in a clip folder."""
    return {name: folder / file for name, file in scan_cameras(str(folder)).items()}


def read_index_bytes(path: Path | str, *, storage: StorageConfig | None = None) -> bytes:
    """The bytes of an index file (also what a worker re-reads to rebuild the clip arrays).

    An index at a URL is read through remote storage (one request, retried like every other),
    with ``storage``'s options.

    Raises:
        FileNotFoundError: The file does not exist.
        IndexValidationError: It cannot be read.
        RemoteStorageError: Remote storage failed for good (retries spent).
    """
    where = repr(str(path))
    if is_url(path):
        from lightning_vstream.storage.client import storage_for
        from lightning_vstream.storage.config import StorageConfig

        try:
            raw, _ = storage_for(storage or StorageConfig()).read(str(path), label="index")
        except MissingFileError:
            raise MissingFileError(f"index file {where} does not exist.") from None
        return bytes(raw)
    path = Path(path)
    if path.is_dir():
        inside = path / "index.json"
        fix = f"pass {str(inside)!r}" if inside.is_file() else f"run `vstream index {path}` to write {str(inside)!r}"
        raise ConfigurationError(f"index file {where} is a folder; {fix}.")
    if not path.is_file():
        raise MissingFileError(
            f"index file {where} does not exist. Run `vstream index DATASET_FOLDER` to index your videos, "
            "or `vstream synth FOLDER` to write a stamped synthetic dataset."
        )
    try:
        return path.read_bytes()
    except OSError as err:
        raise IndexValidationError(
            where, [f"index file {where} cannot be read ({err.strerror or err}); check its permissions."]
        ) from None
