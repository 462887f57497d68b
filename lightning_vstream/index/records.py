"""Frozen, validated records of an index: clips, their cameras and frame counts."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lightning_vstream.index.tables import VideoInfo

__all__ = ["CameraStream", "Clip", "VideoIndex"]


@dataclass(frozen=True)
class CameraStream:
    """One camera of one clip: a video file or a folder of images."""

    name: str
    path: Path
    info: VideoInfo | None = None

    @property
    def is_image_folder(self) -> bool:
        """True when the camera is a folder of image files rather than a video."""
        return self.path.is_dir()


@dataclass(frozen=True)
class Clip:
    """A clip: several cameras recorded together, ``frame_count`` frames each."""

    clip_id: str
    video_dir: Path
    frame_count: int
    cameras: tuple[CameraStream, ...]

    @property
    def folder(self) -> Path:
        """Folder holding the clip's camera files."""
        return self.video_dir / self.clip_id

    @property
    def camera_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.cameras)


@dataclass(frozen=True)
class VideoIndex:
    """Validated contents of an index file.

    Example::

        >>> index = load_index("data/index.json")  # doctest: +SKIP
        >>> len(index), index.camera_names[:2], index["scene-0000"].frame_count  # doctest: +SKIP
        (10, ('CAM_BACK', 'CAM_BACK_LEFT'), 40)
    """

    source: Path
    clips: tuple[Clip, ...]
    camera_names: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.clips)

    def __iter__(self) -> Iterator[Clip]:
        return iter(self.clips)

    def __getitem__(self, key: int | str) -> Clip:
        if isinstance(key, int):
            return self.clips[key]
        for clip in self.clips:
            if clip.clip_id == key:
                return clip
        raise KeyError(f"clip {key!r} is not in {str(self.source)!r}.")

    @property
    def total_frames(self) -> int:
        """Frames per camera summed over all clips."""
        return sum(c.frame_count for c in self.clips)
