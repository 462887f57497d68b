"""Building an index from a dataset tree, or the frame tables of an existing one, by probing every file.

A dataset with holes (a camera that failed for one drive, a file that cannot be read as video) is
indexed as far as it is whole: :func:`whole_clips` tells the clips that have every camera from the
others, the clips left out are listed beside the index (:func:`incomplete_path`) and warned about.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Literal, TypeVar

from lightning_vstream.errors import (
    ConfigurationError,
    DataFormatError,
    IndexValidationError,
    MissingFileError,
    RotatedVideoError,
    VideoDecodeError,
    VStreamWarning,
)
from lightning_vstream.index.files import discover_cameras, image_files, natural_key
from lightning_vstream.index.local_index import read_index_layout
from lightning_vstream.index.table_file import tables_path
from lightning_vstream.index.table_write import write_tables
from lightning_vstream.index.tables import (
    VideoInfo,
    metadata_path,
    table_key,
)
from lightning_vstream.indexing.camera_tables import probe_for_index
from lightning_vstream.indexing.output import check_output, incomplete_path
from lightning_vstream.storage.atomic import write_atomic

__all__ = [
    "Incomplete",
    "TableFormat",
    "Truncated",
    "build_index",
    "extra_cameras",
    "incomplete_path",
    "not_indexed_note",
    "refuse_incomplete",
    "warn_incomplete",
    "whole_clips",
    "write_frame_tables",
    "write_index_tables",
]

#: The frame-table format written: version-2 binary tables (``index.tables.bin``). JSON sidecars
#: (``index.meta.json``) of earlier releases are still read, never written.
TableFormat = Literal["binary"]
#: What building an index does with a clip that is not whole: leave it out (and list it) or refuse the dataset.
Incomplete = Literal["skip", "raise"]
#: What building an index does with a clip one of whose camera files is cut short: count the clip as not
#: whole (see :data:`Incomplete`), or keep it at the frames every camera holds whole.
Truncated = Literal["incomplete", "shorten"]
K = TypeVar("K", bound=Hashable)


def whole_clips(
    cameras: Mapping[K, Mapping[str, str | None]], *, keep_extra: bool = False
) -> tuple[list[K], dict[K, list[str]]]:
    """Which clips have every camera, and why the others are not whole.

    The cameras every clip should have are the set most clips have (the larger set on a tie): a
    camera that failed for one drive leaves its clip out, not the camera out of every clip.

    Args:
        cameras: Per clip, in index order: camera name -> None when its file is fine, else why it
            cannot be read.
        keep_extra: A camera the other clips lack does not make its clip incomplete (the clip is
            indexed with the common cameras; :func:`extra_cameras` names the files left out).

    Returns:
        The whole clips in order, and per clip left out, every reason (sentences without the clip id).

    Example::

        >>> whole_clips({"a": {"F": None, "B": None}, "b": {"F": None}, "c": {"F": None, "B": "truncated"}})
        (['a'], {'b': ["missing camera file(s) ['B'] (the other clips have ['B', 'F'])"], 'c': ["camera 'B': truncated"]})
    """
    sets = Counter(frozenset(found) for found in cameras.values())
    expected = max(sets, key=lambda s: (sets[s], len(s), sorted(s))) if sets else frozenset()
    whole: list[K] = []
    left_out: dict[K, list[str]] = {}
    for clip, found in cameras.items():
        reasons = []
        missing = sorted(expected - set(found))
        if missing:
            reasons.append(f"missing camera file(s) {missing} (the other clips have {sorted(expected)})")
        extra = sorted(set(found) - expected)
        if extra and not keep_extra:
            reasons.append(f"camera file(s) {extra} that the other clips do not have (they have {sorted(expected)})")
        reasons += [
            f"camera {name!r}: {problem}"
            for name, problem in sorted(found.items())
            if problem is not None and not (keep_extra and name in extra)
        ]
        if reasons:
            left_out[clip] = reasons
        else:
            whole.append(clip)
    return whole, left_out


def extra_cameras(cameras: Mapping[K, Mapping[str, str | None]]) -> dict[K, list[str]]:
    """Per clip, the cameras it has beyond the set most clips have (see :func:`whole_clips`).

    Example::

        >>> extra_cameras({"a": {"F": None}, "b": {"F": None}, "c": {"F": None, "X": None}})
        {'c': ['X']}
    """
    sets = Counter(frozenset(found) for found in cameras.values())
    expected = max(sets, key=lambda s: (sets[s], len(s), sorted(s))) if sets else frozenset()
    return {clip: sorted(set(found) - expected) for clip, found in cameras.items() if set(found) - expected}


def warn_incomplete(root: str, listing: str, left_out: Mapping[str, Sequence[str]], total: int) -> None:
    """Warn (a :class:`VStreamWarning`) that the clips ``left_out`` (id -> reasons) were not indexed."""
    shown = "; ".join(f"{clip!r}: {', '.join(reasons)}" for clip, reasons in list(left_out.items())[:3])
    more = f"; and {len(left_out) - 3} more" if len(left_out) > 3 else ""
    warnings.warn(
        f"{len(left_out)} of {total} clips under {root!r} are incomplete and were left out of the index: "
        f"{shown}{more}. Every one is listed in {listing!r}; restore their files and build the index again to "
        "include them.",
        VStreamWarning,
        stacklevel=3,
    )


def refuse_incomplete(root: str, left_out: Mapping[str, Sequence[str]], *, whole: int) -> IndexValidationError:
    """The error for clips that are not whole, where they are refused (or no clip is whole)."""
    fix = (
        "Restore their files, or index the whole clips only: incomplete='skip' (`vstream index` without --strict) "
        "leaves these out and lists them beside the index."
        if whole
        else "No clip is whole, so there is nothing to index: restore the files."
    )
    problems = [f"clip {clip!r} is incomplete: {', '.join(reasons)}." for clip, reasons in left_out.items()]
    if len(problems) == 1:
        return IndexValidationError(repr(root), [f"{root!r}: {problems[0]} {fix}"])
    return IndexValidationError(f"{root!r} ({len(problems)} incomplete clips; {fix})", problems)


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
    incomplete: Incomplete = "skip",
    truncated: Truncated = "incomplete",
    force: bool = False,
    executor: str = "local",
    workers: int = 1,
) -> Path:
    """Scan a dataset tree and write an accvlab index (plus the metadata sidecar).

    Every camera file is probed, so frame counts come from the streams themselves. A clip's
    frame count is the smallest over its cameras; clips whose cameras disagree are reported
    on stderr.

    A clip that is not whole (a camera file missing where the other clips have one, an extra
    camera, a file that cannot be read as video) is left out with ``incomplete="skip"``: the
    index holds the whole clips, the others are listed with their reasons in
    ``index.incomplete.json`` next to it (:func:`incomplete_path`; removed when every clip is
    whole) and a :class:`~lightning_vstream.VStreamWarning` names them. ``incomplete="raise"``
    refuses the dataset instead, writing nothing.

    A camera file cut short (a copy that stopped; a faststart MP4 still opens) counts only the
    frames whose packets lie whole in it and decode, and makes its clip not whole: the reason
    names the camera and the frames it holds against those its container lists. With
    ``truncated="shorten"`` the clip is kept instead, at the frames every camera holds whole.

    Args:
        root: Dataset folder; clip folders are found anywhere below it.
        output: Index file to write; ``video_dir`` keys are relative to its folder.
        video_dirs: Only these folders (relative to ``root``) instead of scanning.
        progress: Show a progress bar while probing.
        metadata: Also write every file's frame table and identity next to the index.
        table_format: ``"binary"`` writes ``index.tables.bin`` (memory-mapped, see
            :mod:`~lightning_vstream.index.table_file`), the one format written (``index.meta.json``
            files of earlier releases are still read).
        incomplete: ``"skip"`` leaves incomplete clips out and lists them; ``"raise"`` refuses them.
        truncated: ``"incomplete"`` counts a clip with a truncated camera file as not whole;
            ``"shorten"`` keeps it at its cameras' common whole frames (named on stderr).
        force: Replace files at ``output`` (and its tables and list) that are not an index of this
            package; without it they are refused (see :func:`~lightning_vstream.indexing.output.check_output`).
        executor: Where files are probed: ``"local"`` (``workers`` processes) or ``"ray"`` (Ray tasks on
            the cluster at ``RAY_ADDRESS`` or a local one); the index is the same either way.
        workers: Local probing processes (1: in this process).

    Every file is written whole or not at all (a temporary name in its folder, renamed into
    place; the frame tables before the index): a full disk, a kill or a concurrent build leaves
    the previous index and tables as they were, and a reader sees either those or the new ones.

    Returns:
        The index path.

    Raises:
        FileNotFoundError: ``root`` does not exist.
        ConfigurationError: ``output`` is inside a clip folder, or (without ``force``) a file there
            is not ours.
        FileWriteError: A file could not be written (a full disk): the message names it.
        IndexValidationError: No clip folder was found, a file could not be read (a permission, an I/O
            error), no clip is whole, or (``incomplete="raise"``) a clip is not whole.

    Example::

        >>> build_index("data", output="data/index.json")  # doctest: +SKIP
    """
    check_table_format(table_format)
    if incomplete not in ("skip", "raise"):
        raise DataFormatError(f"incomplete={incomplete!r} is not supported; use 'skip' or 'raise'.")
    if truncated not in ("incomplete", "shorten"):
        raise ConfigurationError(f"truncated={truncated!r} is not supported; use 'incomplete' or 'shorten'.")
    # Absolute but not resolved: keys stay relative to the folders as the user sees them, even
    # when a video folder is a symbolic link.
    root = Path(os.path.abspath(root))
    output = Path(os.path.abspath(output))
    groups = _clip_folders(root, video_dirs)
    check_output(output, (folder for folders in groups.values() for folder in folders), force=force, tables=metadata)
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
    infos, cameras = _probe_files(
        root, jobs, progress=progress, truncated=truncated, executor=executor, workers=workers
    )
    # With frame tables, a camera one clip has beyond the others is left out of the index and recorded
    # there as left out on purpose; without them nothing could tell it from a file added later.
    whole, left_out = whole_clips(cameras, keep_extra=metadata)
    listing = Path(incomplete_path(output))
    named = {_clip_key(vd, folder, output): reasons for (vd, folder), reasons in left_out.items()}
    if left_out and (incomplete == "raise" or not whole):
        raise refuse_incomplete(str(root), {key[1]: reasons for key, reasons in named.items()}, whole=len(whole))
    kept = set(whole)
    extra = {clip: names for clip, names in extra_cameras(cameras).items() if clip in kept} if metadata else {}
    skipped = {path for vd, folder, name, path in jobs if name in extra.get((vd, folder), ())}
    index, files = _whole_clips_index([job for job in jobs if job[3] not in skipped], kept, infos, output)
    not_indexed = sorted(table_key(output.parent, path) for path in skipped)
    _write_index_files(output, index, files if metadata else None, named, not_indexed=not_indexed)
    if left_out:
        warn_incomplete(str(root), str(listing), {clip: r for (_, clip), r in named.items()}, len(cameras))
    if not_indexed:
        warnings.warn(
            f"{not_indexed_note(root, output, not_indexed)} To index them, give every clip those cameras and call "
            "build_index(...) again, or move the files out of their clip folders.",
            VStreamWarning,
            stacklevel=2,
        )
    return output


def not_indexed_note(root: Path | str, output: Path | str, not_indexed: Sequence[str]) -> str:
    """The sentence that names the camera files an index build left out because the other clips lack them.

    Example::

        >>> not_indexed_note("data", "data/index.json", ["videos/scene-0001/CAM_EXTRA.mp4"])
        "1 camera file(s) under 'data' are not indexed: the other clips lack their camera, so the index holds \
the cameras every clip has: 'data/videos/scene-0001/CAM_EXTRA.mp4'."
    """
    base = Path(output).parent
    listed = ", ".join(repr(str(base / key)) for key in not_indexed[:5])
    more = f" and {len(not_indexed) - 5} more" if len(not_indexed) > 5 else ""
    return (
        f"{len(not_indexed)} camera file(s) under {str(root)!r} are not indexed: the other clips lack their camera, "
        f"so the index holds the cameras every clip has: {listed}{more}."
    )


def _write_index_files(
    output: Path,
    index: Mapping[str, Mapping[str, int]],
    files: Mapping[str, VideoInfo] | None,
    left_out: Mapping[tuple[str, str], Sequence[str]],
    *,
    not_indexed: Sequence[str] = (),
) -> None:
    """Write the frame tables, the index and the list of clips left out, each whole or not at all.

    The tables go first and the index last but for the list: a build that fails (a full disk, a
    kill) before the index is renamed into place leaves the previous index with the tables that
    describe it, and a reader meanwhile sees the previous files or the new ones.
    """
    output.parent.mkdir(parents=True, exist_ok=True)
    if files is not None:
        write_frame_tables(output, files, not_indexed=not_indexed)
    write_atomic(output, json.dumps(index, indent=2) + "\n")
    listing = Path(incomplete_path(output))
    if left_out:
        listed: dict[str, dict[str, list[str]]] = {}
        for (video_dir, clip_id), reasons in left_out.items():
            listed.setdefault(video_dir, {})[clip_id] = list(reasons)
        write_atomic(listing, json.dumps(listed, indent=2) + "\n")
    else:
        listing.unlink(missing_ok=True)  # a list from an earlier build would name clips that are whole now


def _clip_folders(root: Path, video_dirs: Sequence[str] | None) -> dict[Path, list[Path]]:
    """The clip folders of each video folder: those of ``video_dirs``, or those found anywhere below ``root``."""
    if not root.is_dir():
        raise MissingFileError(f"dataset folder {str(root)!r} does not exist.")
    if video_dirs is None:
        return _find_clip_folders(root)
    missing = [d for d in video_dirs if not (root / d).is_dir()]
    if missing:
        raise MissingFileError(f"video folder(s) {missing} do not exist under {str(root)!r}.")
    return {
        Path(os.path.normpath(root / d)): sorted(
            (p for p in (root / d).iterdir() if p.is_dir()), key=lambda p: natural_key(p.name)
        )
        for d in video_dirs
    }


def _probe_one(path: Path) -> tuple[str, VideoInfo | None, str | None]:
    """Probe one file in a worker: ``("ok", info, cut)``, ``("bad", None, why)`` or ``("error", None, why)``."""
    try:
        info, cut = probe_for_index(path)
        return "ok", info, cut
    except RotatedVideoError as err:  # a readable video, in a form not delivered: refused, not left out
        return "error", None, str(err)
    except (VideoDecodeError, DataFormatError) as err:
        return "bad", None, str(err)
    except (OSError, ValueError) as err:
        return "error", None, str(err)


def _probe_files(
    root: Path,
    jobs: Sequence[tuple[Path, Path, str, Path]],
    *,
    progress: bool,
    truncated: Truncated = "incomplete",
    executor: str = "local",
    workers: int = 1,
) -> tuple[dict[Path, VideoInfo], dict[tuple[Path, Path], dict[str, str | None]]]:
    """The frame table of every camera file, and per clip folder each camera's problem (None: readable).

    A truncated file's table holds its whole frames; the truncation is its problem, or with
    ``truncated="shorten"`` a notice on stderr. Files are probed by ``executor`` (results come back
    in the order of ``jobs``, so the index does not depend on it).

    Raises:
        IndexValidationError: Files could not be read at all (every one listed).
    """
    from tqdm import tqdm

    from lightning_vstream.executors import map_ordered

    infos: dict[Path, VideoInfo] = {}
    problems: list[str] = []
    cameras: dict[tuple[Path, Path], dict[str, str | None]] = {}
    by_path = {path: (folder, name) for _, folder, name, path in jobs}
    with tqdm(total=len(jobs), desc="probing", unit="file", disable=not progress or len(jobs) < 20) as bar:
        results = map_ordered(
            _probe_one,
            [path for *_, path in jobs],
            executor=executor,
            workers=workers,
            describe=lambda p: f"clip {by_path[p][0].name!r}, camera {by_path[p][1]!r}, file {str(p)!r}",
            on_done=lambda: bar.update(1),
            chunk_size=None,  # about four tasks per worker: probing a file is cheaper than a task
        )
    for (vd, folder, name, path), (status, info, detail) in zip(jobs, results):
        found = cameras.setdefault((vd, folder), {})
        found[name] = None
        if status == "ok" and info is not None:
            infos[path] = info
            found[name] = _truncation_problem(folder.name, name, detail, truncated)
        elif status == "bad":
            found[name] = detail  # the file is there but is not a readable video: its clip is not whole
        else:
            problems.append(f"clip {folder.name!r}, camera {name!r}: {detail}")
    if problems:
        raise IndexValidationError(str(root), problems)
    return infos, cameras


def _truncation_problem(clip: str, camera: str, cut: str | None, truncated: Truncated) -> str | None:
    """A truncated camera file's problem (its clip is not whole), or None where it is whole or shortened."""
    if cut is None:
        return None
    if truncated == "incomplete":
        return (
            f"{cut}; restore the file, or keep the clip at the frames every camera holds whole with "
            "truncated='shorten' (`vstream index --shorten-truncated`)"
        )
    print(
        f"vstream index: clip {clip!r}, camera {camera!r}: {cut}; the clip keeps the frames every camera holds "
        "whole (truncated='shorten').",
        file=sys.stderr,
    )
    return None


def _whole_clips_index(
    jobs: Sequence[tuple[Path, Path, str, Path]],
    keep: set[tuple[Path, Path]],
    infos: Mapping[Path, VideoInfo],
    output: Path,
) -> tuple[dict[str, dict[str, int]], dict[str, VideoInfo]]:
    """The index of the whole clips (a clip's frame count: its shortest camera's) and their files' frame tables."""
    index: dict[str, dict[str, int]] = {}
    files: dict[str, VideoInfo] = {}
    per_camera: dict[tuple[Path, Path], dict[str, int]] = {}
    for vd, folder, name, path in jobs:
        if (vd, folder) not in keep:
            continue
        key = os.path.relpath(vd, output.parent).replace(os.sep, "/")
        counts = index.setdefault(key, {})
        n = infos[path].frame_count
        per_camera.setdefault((vd, folder), {})[name] = n
        counts[folder.name] = min(n, counts.get(folder.name, n))
        files[table_key(output.parent, path)] = infos[path]
    for (_, folder), held in per_camera.items():
        if len(set(held.values())) > 1:
            fewest = min(held.values())
            short = [name for name, n in held.items() if n == fewest]
            listed = ", ".join(f"{name} {n}" for name, n in held.items())
            print(
                f"vstream index: clip {folder.name!r}: cameras hold different frame counts; using the smallest "
                f"({fewest}), that of camera(s) {short} ({listed}).",
                file=sys.stderr,
            )
    return index, files


def _clip_key(video_dir: Path, folder: Path, output: Path) -> tuple[str, str]:
    """``(video_dir key as the index writes it, clip id)`` of a clip folder."""
    return os.path.relpath(video_dir, output.parent).replace(os.sep, "/"), folder.name


def check_table_format(table_format: str) -> None:
    """Refuse a frame-table format that is not written (JSON sidecars are read, no longer written).

    Raises:
        ConfigurationError: ``table_format`` is not ``"binary"``.
    """
    if table_format != "binary":
        raise ConfigurationError(
            f"table_format={table_format!r}: frame tables are written as binary tables (index.tables.bin) only; "
            "JSON frame tables (index.meta.json) of earlier releases are still read, but no longer written. "
            "Pass table_format='binary' (the default)."
        )


def write_frame_tables(index_path: Path, infos: Mapping[str, VideoInfo], *, not_indexed: Sequence[str] = ()) -> Path:
    """Write the version-2 binary frame tables next to ``index_path`` and remove a stale JSON sidecar.

    ``not_indexed`` lists the camera files the build left out on purpose (see ``write_tables``).

    Returns:
        The file written (``index.tables.bin``).
    """
    binary = tables_path(index_path)
    write_tables(binary, infos, not_indexed=not_indexed)
    metadata_path(index_path).unlink(missing_ok=True)
    return binary


def write_index_tables(index_path: Path | str, *, table_format: TableFormat = "binary", progress: bool = True) -> Path:
    """Probe every file an existing index lists and write its frame tables (turns integrity checks on).

    The index file itself is left as it is, so a curated index (a subset of a dataset) keeps its
    clips. Existing frame tables are replaced.

    A camera file cut short is recorded with the frames it holds whole (see :func:`build_index`),
    so an index that lists more frames for its clip fails the thorough check, naming it.

    Args:
        index_path: The index file.
        table_format: ``"binary"`` (``index.tables.bin``), the one format written.
        progress: Show a progress bar while probing.

    Returns:
        The frame-table file written.

    Raises:
        IndexValidationError: The index is invalid, or files could not be probed (every problem listed).

    Example::

        >>> write_index_tables("data/index.json")  # doctest: +SKIP
    """
    from tqdm import tqdm

    check_table_format(table_format)
    index_path = Path(index_path).resolve()
    layout = read_index_layout(index_path)
    infos: dict[str, VideoInfo] = {}
    problems: list[str] = []
    for key, clip_id, camera, path in tqdm(
        layout, desc="probing", unit="file", disable=not progress or len(layout) < 20
    ):
        try:
            infos[key] = probe_for_index(path)[0]  # a cut file: its whole frames (the load check compares counts)
        except (VideoDecodeError, OSError, ValueError) as err:
            problems.append(f"clip {clip_id!r}, camera {camera!r}: {err}")
    if problems:
        raise IndexValidationError(repr(str(index_path)), problems)
    return write_frame_tables(index_path, infos)
