"""How a dataset lays out on disk: clip folders, camera files and image folders."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from lightning_vstream.errors import IndexValidationError

__all__ = ["IMAGE_EXTENSIONS", "VIDEO_EXTENSIONS", "discover_cameras", "image_files", "is_dir", "natural_key"]

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


def discover_cameras(folder: Path) -> dict[str, Path]:
    """Camera name -> file (or image folder) found in a clip folder."""
    found: dict[str, Path] = {}
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        path = Path(entry.path)
        if entry.is_file() and path.suffix.lower() in VIDEO_EXTENSIONS:
            if path.stem in found:
                raise IndexValidationError(
                    str(folder), [f"{str(folder)!r} holds two files for camera {path.stem!r}: "
                                  f"{found[path.stem].name!r} and {path.name!r}; keep one."]
                )
            found[path.stem] = path
        elif entry.is_dir() and image_files(path):
            found.setdefault(entry.name, path)
    # Order by camera name (the stem), not by file name: "CAM-2.mp4" sorts before "CAM.mp4".
    return dict(sorted(found.items()))
