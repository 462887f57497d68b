"""What loading an index (local or remote) checks and collects per clip before it becomes :class:`ClipArrays`.

Both loaders validate the index JSON clip by clip, with the same checks and words
(:func:`index_object`, :func:`folder_entries_problem`, :func:`entry_problem`), and note, per clip, its
id, frame count, video folder and layout (its camera file names). With frame tables, clips after the first are checked
together in one vectorised search of the tables (:meth:`ClipLists.resolve_deferred`) instead of
one folder listing each.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lightning_vstream.errors import ConfigurationTypeError, DataFormatError, IndexValidationError
from lightning_vstream.index.arrays import ClipArrays, fingerprint, tables_list_files
from lightning_vstream.index.files import VIDEO_EXTENSIONS

if TYPE_CHECKING:
    from lightning_vstream.index.table_file import FrameTables
    from lightning_vstream.storage.config import StorageConfig

__all__ = [
    "MAX_FRAMES",
    "ClipLists",
    "Reference",
    "bad_clip_id",
    "camera_reference",
    "check_exclude_clips",
    "entry_problem",
    "folder_entries_problem",
    "index_object",
    "leave_out_hint",
    "match_cameras",
    "table_cameras",
]

#: Largest frame count an index may list for one clip (2**31 - 1: years of video at 30 fps).
MAX_FRAMES = 2**31 - 1

#: Where the camera order comes from (``"the cameras argument"`` or the first clip) and the camera file names.
Reference = tuple[str, tuple[str, ...]]

#: ``look(clip_id, folder, key_prefix, problems)``: the clip's camera file names in camera order, or
#: None with its problems appended.
Look = Callable[[str, str, str, list[str]], "tuple[str, ...] | None"]


def index_object(data: Any, where: str) -> dict[str, Any]:
    """The parsed index JSON, which must be an object of video folders.

    Raises:
        IndexValidationError: It is not a JSON object.
    """
    if not isinstance(data, dict):
        raise IndexValidationError(
            where,
            [
                f"index file {where} must hold a JSON object {{video_dir: {{clip_id: frame_count}}}}, "
                f"not a {type(data).__name__}."
            ],
        )
    return data


def folder_entries_problem(where: str, video_dir_key: str, entries: Any) -> str | None:
    """What is wrong with a video folder's entry of an index (it must map clip ids to frame counts); None: nothing."""
    if isinstance(entries, dict):
        return None
    return f"{where}: video folder {video_dir_key!r} must map clip ids to frame counts, got a {type(entries).__name__}."


def entry_problem(where: str, video_dir_key: str, clip_id: str, count: Any, seen: dict[str, str]) -> str | None:
    """What is wrong with one clip entry of an index; None when nothing is (then ``seen``, clip id -> its video
    folder, holds it)."""
    if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
        return f"{where}: clip {clip_id!r} has frame count {count!r}; expected a positive integer."
    if count > MAX_FRAMES:
        return (
            f"{where}: clip {clip_id!r} has frame count {count}, more than any video holds (at most "
            f"{MAX_FRAMES}); re-run `vstream index` to rebuild the index."
        )
    if bad_clip_id(clip_id):
        return (
            f"{where}: clip id {clip_id!r} in video folder {video_dir_key!r} is not a plain folder name; "
            "a clip id names one folder inside its video folder (no '/', '\\', '.' or '..'), so that "
            "no clip is read under two ids. Move the clip into a video folder and list it there."
        )
    if clip_id in seen:
        return (
            f"{where}: clip id {clip_id!r} appears in both {seen[clip_id]!r} and {video_dir_key!r}; "
            "clip ids must be unique across the index (rename one, or use separate index files)."
        )
    seen[clip_id] = video_dir_key
    return None


def bad_clip_id(clip_id: str) -> bool:
    """True unless ``clip_id`` names exactly one folder inside its video folder."""
    return (
        not clip_id
        or clip_id in (".", "..")
        or "/" in clip_id
        or "\\" in clip_id
        or "\0" in clip_id
        or clip_id != clip_id.strip("\n\r")
    )


def table_cameras(tables: FrameTables, folder_key: str, *, image_folders: bool = False) -> dict[str, str]:
    """Camera name -> file name of the cameras directly in ``folder_key``, as the frame tables list them.

    A video file's camera is its name without the extension. With ``image_folders`` an image folder
    (a key without a video extension: the tables list no other kind) is a camera too, named by its
    whole name as the folder scan names it; indexes at URLs read video files only.
    """
    found: dict[str, str] = {}
    prefix = folder_key + "/" if folder_key else ""
    for key, _ in tables.under(prefix):
        name = key[len(prefix) :]
        if "/" in name:
            continue
        stem, ext = os.path.splitext(name)
        if ext.lower() in VIDEO_EXTENSIONS:
            found.setdefault(stem, name)
        elif image_folders:
            found.setdefault(name, name)
    return dict(sorted(found.items()))


def leave_out_hint(clip_id: str) -> str:
    """How to go on without clip ``clip_id`` (a camera file missing or unreadable), for error messages."""
    return (
        f"Restore the file, or leave the clip out: exclude_clips=[{clip_id!r}] (either DataModule, or "
        "load_index); `vstream index DATASET_FOLDER` re-indexes a dataset with only its whole clips."
    )


def check_exclude_clips(exclude_clips: Collection[str] | None) -> frozenset[str]:
    """The ``exclude_clips`` argument as a set of clip ids.

    Raises:
        TypeError: It is a single string, or holds something other than strings.
    """
    if exclude_clips is None:
        return frozenset()
    if isinstance(exclude_clips, str):
        raise ConfigurationTypeError(
            f"exclude_clips={exclude_clips!r} must be a list of clip ids, not a string; pass [{exclude_clips!r}]."
        )
    ids = list(exclude_clips)
    wrong = [i for i in ids if not isinstance(i, str)]
    if wrong:
        raise ConfigurationTypeError(f"exclude_clips must hold clip ids (strings); got {wrong[0]!r}.")
    return frozenset(ids)


def camera_reference(cameras: Sequence[str] | None) -> tuple[list[str] | None, Reference | None]:
    """The ``cameras`` argument checked, as a list, and the camera order it sets (None: the first clip's).

    Raises:
        TypeError: ``cameras`` is a single string.
        ValueError: ``cameras`` is empty or repeats a name.
    """
    if cameras is None:
        return None, None
    if isinstance(cameras, str):
        raise ConfigurationTypeError(
            f"cameras={cameras!r} must be a list of camera names, not a string; pass [{cameras!r}]."
        )
    cameras = list(cameras)
    if not cameras or len(set(cameras)) != len(cameras):
        raise DataFormatError(f"cameras={cameras!r} must be a non-empty list of distinct camera names.")
    return cameras, ("the cameras argument", tuple(cameras))


def _extra_files(found: Mapping[str, str], names: Sequence[str]) -> str:
    """The camera files of ``found`` beyond ``names``, in words (``'CAM_X.mp4'``, ``'A.mp4', 'B.mp4'``)."""
    return ", ".join(repr(file) for name, file in sorted(found.items()) if name not in names) or "a camera"


def match_cameras(
    found: Mapping[str, str],
    reference: Reference,
    cameras: Sequence[str] | None,
    *,
    clip_id: str,
    where: str,
    folder: str,
    listed: str,
    out: list[str],
    reindex: str = "",
) -> tuple[str, ...] | None:
    """The clip's camera file names in ``reference``'s camera order, or None with its problem added to ``out``.

    ``found`` maps camera name -> file name in the clip's ``folder``; ``listed`` says where they were
    found, for the message (``""`` or ``"its frame tables list [...]; "``). Without ``cameras`` a clip
    must have exactly the reference's cameras. ``reindex`` is the command that rebuilds the index, for the
    message about a camera file the others lack.
    """
    names = reference[1]
    missing = [n for n in names if n not in found]
    if missing:
        out.append(
            f"{where}: clip {clip_id!r} is missing camera file(s) {missing} in {folder!r} "
            f"({listed}expected the cameras of {reference[0]}: {list(names)}). {leave_out_hint(clip_id)}"
        )
        return None
    if cameras is None and set(found) != set(names):
        out.append(
            f"{where}: clip {clip_id!r} has cameras {sorted(found)} but {reference[0]} has {list(names)}: "
            f"{_extra_files(found, names)} is not in the index (added since it was built?). "
            + (f"Re-index: {reindex} indexes the cameras every clip has and names the others; " if reindex else "")
            + "move the file out of the clip folder, or, in Python, pass cameras=[...] to load a common subset."
        )
        return None
    return tuple(found[n] for n in names)


class ClipLists:
    """Per clip, in order: id, frame count, video folder and layout; and the clips left for the tables to check."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.counts: list[int] = []
        self.dir_of: list[int] = []
        self.layout_of: list[int] = []
        self.layouts: dict[tuple[str, ...], int] = {}
        self.video_dirs: list[str] = []
        self.dir_keys: list[str] = []
        # Clips whose camera files come from the tables: (position, where their problems go, id, folder, key prefix).
        self.deferred: list[tuple[int, int, str, str, str]] = []
        #: Clip ids left out of the index by :meth:`leave_out` (``exclude_clips``) that it lists.
        self.excluded: frozenset[str] = frozenset()

    def leave_out(self, data: dict[str, Any], exclude: frozenset[str]) -> dict[str, Any]:
        """The index JSON ``data`` without the clips ``exclude`` names (ids it does not list are ignored).

        The clips left out are not checked at all (their files may be gone) and are recorded in
        :attr:`excluded`, so that a process rebuilding the clips from the index file leaves them out too.
        """
        if not exclude:
            return data
        kept: dict[str, Any] = {}
        found: set[str] = set()
        for video_dir, entries in data.items():
            if isinstance(entries, dict):
                found.update(exclude.intersection(entries))
                entries = {clip_id: count for clip_id, count in entries.items() if clip_id not in exclude}
            kept[video_dir] = entries
        self.excluded = frozenset(found)
        return kept

    def add_folder(self, video_dir: str, key_prefix: str) -> int:
        """Note a video folder (its path or URL, and its frame-table key prefix); returns its position."""
        self.video_dirs.append(video_dir)
        self.dir_keys.append(key_prefix)
        return len(self.video_dirs) - 1

    def defer(self, place: int, clip_id: str, folder: str, key_prefix: str) -> None:
        """Leave the next clip's camera files to :meth:`resolve_deferred`; its problems go to ``place``."""
        self.deferred.append((len(self.ids), place, clip_id, folder, key_prefix))

    def add(self, clip_id: str, count: int, folder: int, files: tuple[str, ...] | None) -> None:
        """Note a clip; ``files`` None for a deferred one."""
        self.ids.append(clip_id)
        self.counts.append(count)
        self.dir_of.append(folder)
        self.layout_of.append(0 if files is None else self.layouts.setdefault(files, len(self.layouts)))

    def resolve_deferred(
        self, tables: FrameTables | None, cameras: Sequence[str] | None, look: Look, problems: list[str]
    ) -> set[int]:
        """Check the deferred clips in one search of ``tables``; returns the positions of those the tables describe.

        A clip the tables do not describe exactly like the first (another camera file name, a file
        missing) is looked at alone with ``look``, and its problems take the place in ``problems``
        they would have had.
        """
        described: set[int] = set()
        if not self.deferred:
            return described
        assert tables is not None
        template = next(iter(self.layouts))
        ok = tables_list_files(tables, [d[4] for d in self.deferred], template, only=cameras is None).tolist()
        for (at, place, clip_id, folder, prefix), good in reversed(list(zip(self.deferred, ok))):
            if good:
                described.add(at)
                continue
            found: list[str] = []
            files = look(clip_id, folder, prefix, found)
            problems[place:place] = found
            if files is not None:
                self.layout_of[at] = self.layouts.setdefault(files, len(self.layouts))
        return described

    def arrays(
        self,
        source: str,
        raw: bytes,
        camera_names: tuple[str, ...],
        tables: FrameTables | None,
        storage: StorageConfig | None = None,
    ) -> ClipArrays:
        """The clips as :class:`ClipArrays` of the index ``source`` whose bytes are ``raw``."""
        return ClipArrays(
            source=source,
            fingerprint=fingerprint(raw),
            clip_ids=self.ids,
            frame_counts=self.counts,
            dir_of_clip=self.dir_of,
            video_dirs=self.video_dirs,
            dir_keys=self.dir_keys,
            camera_names=camera_names,
            layouts=list(self.layouts),
            layout_of_clip=self.layout_of,
            tables=tables,
            storage=storage,
            excluded=self.excluded,
        )
