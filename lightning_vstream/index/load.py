"""Index files -> frozen, validated records of clips, cameras and frame counts.

The index format is accvlab's, unchanged: a JSON object ``{"<video_dir>": {"<clip_id>":
<frame_count>, ...}, ...}`` where each ``<video_dir>/<clip_id>/`` folder holds one video file
per camera (or one folder of images per camera). Relative ``video_dir`` paths resolve against
the index file's folder.

Frame tables come from the sidecar next to the index when it is there (see
:mod:`lightning_vstream.index.tables`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from lightning_vstream.errors import IndexValidationError
from lightning_vstream.index.files import discover_cameras, is_dir
from lightning_vstream.index.records import CameraStream, Clip, VideoIndex
from lightning_vstream.index.tables import cached_info, load_metadata

__all__ = ["Check", "load_index"]

Check = Literal["fast", "thorough"]


def _pairs_without_duplicates(where: str) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise IndexValidationError(
                    where, [f"{where} lists clip or folder {key!r} twice; each clip id must appear once."]
                )
            result[key] = value
        return result

    return hook


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"index file {str(path)!r} does not exist.")
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text, object_pairs_hook=_pairs_without_duplicates(repr(str(path))))
    except json.JSONDecodeError as err:
        raise ValueError(
            f"index file {str(path)!r} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}."
        ) from None
    except RecursionError:
        raise ValueError(f"index file {str(path)!r} nests JSON too deeply to be an index.") from None


def load_index(
    path: Path | str,
    *,
    cameras: Sequence[str] | None = None,
    check: Check = "fast",
) -> VideoIndex:
    """Parse and validate an index file.

    Camera order is the sorted file stems found in the first clip, or ``cameras`` (which may
    also select a subset). Every problem found is reported in one error.

    Args:
        path: The index JSON file.
        cameras: Cameras to load, in this order; all cameras when None.
        check: ``"fast"`` checks that folders and camera files exist and that every clip has
            the same cameras; ``"thorough"`` also probes every file (or uses fresh metadata)
            and checks frame counts, frame sizes and codecs.

    Returns:
        The validated :class:`VideoIndex`.

    Raises:
        FileNotFoundError: The index file does not exist.
        ValueError: The JSON is malformed (message gives line and column), or ``cameras`` is empty
            or repeats a name.
        TypeError: ``cameras`` is a single string instead of a list.
        IndexValidationError: The index disagrees with the files (every problem listed).

    Example::

        >>> index = load_index("data/index.json", cameras=["CAM_FRONT", "CAM_BACK"])  # doctest: +SKIP
    """
    if check not in ("fast", "thorough"):
        raise ValueError(f"check={check!r} is not supported; use 'fast' or 'thorough'.")
    path = Path(path).resolve()
    where = repr(str(path))
    data = _read_json(path)
    if not isinstance(data, dict):
        raise IndexValidationError(
            where, [f"index file {where} must hold a JSON object {{video_dir: {{clip_id: frame_count}}}}, "
                    f"not a {type(data).__name__}."]
        )
    meta = load_metadata(path)
    base = path.parent
    problems: list[str] = []
    seen: dict[str, str] = {}
    reference: tuple[str, tuple[str, ...]] | None = None
    if cameras is not None:
        if isinstance(cameras, str):
            raise TypeError(f"cameras={cameras!r} must be a list of camera names, not a string; pass [{cameras!r}].")
        cameras = list(cameras)
        if not cameras or len(set(cameras)) != len(cameras):
            raise ValueError(f"cameras={cameras!r} must be a non-empty list of distinct camera names.")
        reference = ("the cameras argument", tuple(cameras))
    clips: list[Clip] = []
    for video_dir_key, entries in data.items():
        video_dir = (base / video_dir_key).resolve()
        if not isinstance(entries, dict):
            problems.append(
                f"{where}: video folder {video_dir_key!r} must map clip ids to frame counts, "
                f"got a {type(entries).__name__}."
            )
            continue
        if not is_dir(video_dir):
            problems.append(f"{where}: video folder {video_dir_key!r} ({str(video_dir)!r}) does not exist.")
            continue
        for clip_id, count in entries.items():
            if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
                problems.append(
                    f"{where}: clip {clip_id!r} has frame count {count!r}; expected a positive integer."
                )
                continue
            if clip_id in seen:
                problems.append(
                    f"{where}: clip id {clip_id!r} appears in both {seen[clip_id]!r} and {video_dir_key!r}; "
                    "clip ids must be unique across the index (rename one, or use separate index files)."
                )
                continue
            seen[clip_id] = video_dir_key
            folder = video_dir / clip_id
            if not is_dir(folder):
                problems.append(f"{where}: clip {clip_id!r}: folder {str(folder)!r} does not exist.")
                continue
            try:
                found = discover_cameras(folder)
            except IndexValidationError as err:
                problems.extend(err.problems)
                continue
            if reference is None:
                if not found:
                    problems.append(f"{where}: clip {clip_id!r}: folder {str(folder)!r} holds no camera files.")
                    continue
                reference = (f"clip {clip_id!r}", tuple(found))
            names = reference[1]
            missing = [n for n in names if n not in found]
            if missing:
                problems.append(
                    f"{where}: clip {clip_id!r} is missing camera file(s) {missing} in {str(folder)!r} "
                    f"(expected the cameras of {reference[0]}: {list(names)})."
                )
                continue
            if cameras is None and set(found) != set(names):
                problems.append(
                    f"{where}: clip {clip_id!r} has cameras {sorted(found)} but {reference[0]} has "
                    f"{list(names)}; pass cameras=[...] to load a common subset."
                )
                continue
            streams = tuple(
                CameraStream(n, found[n], cached_info(meta, base, found[n])) for n in names
            )
            clips.append(Clip(clip_id, video_dir, count, streams))
    if check == "thorough":
        from lightning_vstream.index.build import probe_clip

        clips = [probe_clip(clip, where, problems) for clip in clips]
    if problems:
        raise IndexValidationError(where, problems)
    if not clips:
        raise IndexValidationError(where, [f"index file {where} lists no clips."])
    assert reference is not None
    return VideoIndex(path, tuple(clips), reference[1])
