"""Full verification of an index against its files: every packet re-read and its CRC-32 compared.

This is what ``vstream index INDEX --check`` runs. Every frame the index lists is decoded as well, so
a file whose packets match their checksums but do not decode (a tail cut inside a packet when the
index was built) is found too, naming the frame. Unlike ``load_index(check="thorough")``, which
trusts the frame tables of files whose size and modification time are unchanged, it re-reads
every packet of every file, so a same-size in-place corruption, a swapped or a replaced file is
found, and every problem (file, clip, camera, frames) is listed. An index at a URL is checked the
same way, every file read whole (one GET each, ``If-Match`` on its recorded ETag).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_vstream.decode.cpu.probe import probe_whole_frames
from lightning_vstream.errors import FileChangedError, MissingFileError, VideoDecodeError
from lightning_vstream.index.identity import file_identity
from lightning_vstream.index.local_index import _load_tables, _read_json, read_index_layout
from lightning_vstream.index.records import CameraStream, Clip
from lightning_vstream.index.remote_index import load_remote_index
from lightning_vstream.index.table_file import tables_path
from lightning_vstream.index.tables import VideoInfo, cached_info
from lightning_vstream.indexing.camera_tables import PROBE_THREADS, probe, probe_object
from lightning_vstream.storage.client import Expect, storage_for
from lightning_vstream.storage.config import StorageConfig

__all__ = ["VerifyReport", "files_without_tables", "verify_index", "verify_remote_index"]


@dataclass
class VerifyReport:
    """What :func:`verify_index` found.

    Attributes:
        index: The index file.
        files: Camera files checked.
        frames: Frames (packets) whose checksums were compared.
        decoded: Frames decoded (those the index lists for each clip; local files).
        problems: Every problem, one line each, naming file, clip, camera and frames.
        notes: Harmless findings (a file touched but unchanged).

    Example::

        >>> report = verify_index("data/index.json")  # doctest: +SKIP
        >>> report.ok, report.files  # doctest: +SKIP
        (True, 48)
    """

    index: Path | str  # a URL stays a string
    files: int = 0
    frames: int = 0
    decoded: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems


def _ranges(indices: Iterable[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3, 7"``: every index listed, runs collapsed."""
    parts: list[str] = []
    run: list[int] = []
    for i in indices:
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(parts)


def _compare(stored: VideoInfo, probed: VideoInfo, frames_listed: int, label: str) -> list[str]:
    found = []
    if stored.config_crc32 is not None and probed.config_crc32 != stored.config_crc32:
        found.append(f"{label}: the codec configuration (SPS/PPS) differs from the one recorded in the index.")
    if probed.frame_count != stored.frame_count:
        found.append(f"{label}: holds {probed.frame_count} frames; the index recorded {stored.frame_count}.")
    if probed.frame_count < frames_listed:
        found.append(f"{label}: holds {probed.frame_count} frames, but the index lists {frames_listed} for its clip.")
    stored_at = {p: i for i, p in enumerate(stored.pts)}
    moved = [i for i, p in enumerate(probed.pts) if stored_at.get(p) != i]
    if moved:
        found.append(f"{label}: frames {_ranges(moved)} have timestamps the index does not record at that position.")
    if stored.crc32 is not None and probed.crc32 is not None:
        n = min(len(stored.crc32), len(probed.crc32))
        skip = set(moved)
        bad = [i for i in range(n) if stored.crc32[i] != probed.crc32[i] and i not in skip]
        if bad:
            which = f"frame {bad[0]}" if len(bad) == 1 else f"frames {_ranges(bad)} ({len(bad)} frames)"
            found.append(f"{label}: the compressed data of {which} differs from the checksums recorded in the index.")
    return found


def _decode_problems(file: Path, stored: VideoInfo, listed: int, label: str) -> list[str]:
    """Decode the first ``listed`` frames of ``file`` (those its clip reads): what does not come out, named."""
    import av

    from lightning_vstream.decode.cpu.probe import open_container, video_stream

    wanted = {p: i for i, p in enumerate(stored.pts[: listed or stored.frame_count])}
    seen: set[int] = set()
    failure = ""
    container = open_container(file)
    try:
        video = video_stream(container, file)
        for packet in container.demux(video):
            try:
                seen.update(frame.pts for frame in packet.decode() if frame.pts in wanted)
            except av.FFmpegError as err:
                at = wanted.get(packet.pts if packet.pts is not None else packet.dts)
                failure = f" (the decoder failed at {f'frame {at}' if at is not None else 'a packet'}: {err})"
                break
            if len(seen) == len(wanted):
                break
    except av.FFmpegError as err:
        failure = f" (demuxing failed: {err})"
    finally:
        container.close()
    missing = sorted(i for p, i in wanted.items() if p not in seen)
    if not missing:
        return []
    which = f"frame {missing[0]}" if len(missing) == 1 else f"frames {_ranges(missing)}"
    return [
        f"{label}: {which} of the {len(wanted)} the index lists for its clip do not decode{failure}; restore "
        "the file, or re-run `vstream index` to index only the frames it holds whole."
    ]


def files_without_tables(path: Path | str) -> list[str]:
    """The video files an index lists that its frame tables do not describe, each as a problem sentence.

    ``load_index`` warns about such files (their checksums and fingerprints go unchecked) and
    ``vstream index --check`` reports them; ``--quick-check`` reports them from this, without reading a
    file. Frame tables that describe none of the index's files (copied from another dataset) are named
    first, with some keys they hold. Image folders carry no tables and are not counted.

    Example::

        >>> files_without_tables("data/index.json")  # doctest: +SKIP
        []
    """
    path = Path(path).resolve()
    layout = [entry for entry in read_index_layout(path) if not entry[3].is_dir()]
    tables, meta = _load_tables(path)
    rows = tables.rows([key for key, *_ in layout]).tolist() if tables is not None else [-1] * len(layout)
    bare = [
        (key, clip_id, camera, file)
        for (key, clip_id, camera, file), row in zip(layout, rows)
        if row < 0 and cached_info(meta, key) is None
    ]
    problems = [
        f"{str(file)!r} (clip {clip_id!r}, camera {camera!r}): the index holds no frame table for this file, so its "
        f"checksums cannot be verified; run `vstream index --tables {str(path)!r}` to record them."
        for _, clip_id, camera, file in bare
    ]
    if tables is not None and bare and len(tables):
        others = [key for key in itertools.islice(tables.keys(), 3)]
        what = "none" if len(bare) == len(layout) else f"{len(bare)} of {len(layout)}"
        problems.insert(
            0,
            f"the frame tables next to the index ({str(tables_path(path))!r}) describe {what} of its video files; "
            f"they list other files ({', '.join(repr(k) for k in others)}{', ...' if len(tables) > 3 else ''}): "
            f"tables of another dataset, or of an earlier layout? `vstream index --tables {str(path)!r}` writes "
            "this index's own.",
        )
    return problems


def verify_index(
    path: Path | str, *, progress: Callable[[Iterable[object]], Iterable[object]] | None = None
) -> VerifyReport:
    """Re-read every packet of every file an index lists and compare it with the frame tables.

    Checks, per camera file: that it has a frame table, its fingerprint (size, first and last
    64 KiB), its codec configuration, its frame count against the table and against the clip's
    count in the index, every frame's timestamp, every packet's CRC-32, and that every frame the
    index lists for its clip decodes. A file cut short counts only its whole frames (and a note
    says so).

    Args:
        path: The index file.
        progress: Optional wrapper for the file loop (a ``tqdm``), for a progress bar.

    Returns:
        A :class:`VerifyReport` listing every problem.

    Raises:
        FileNotFoundError: The index file does not exist.
        IndexValidationError: The index does not describe the folders on disk (missing clips or
            cameras, bad frame counts...), every problem listed.

    Example::

        >>> for problem in verify_index("data/index.json").problems:  # doctest: +SKIP
        ...     print(problem)
    """
    path = Path(path).resolve()
    layout = read_index_layout(path)
    tables, meta = _load_tables(path)
    report = VerifyReport(path)
    counts = _clip_counts(path)
    rows = tables.rows([key for key, *_ in layout]).tolist() if tables is not None else [-1] * len(layout)
    items: list[tuple[tuple[str, str, str, Path], int]] = list(zip(layout, rows))
    entry: Any
    for entry in progress(items) if progress else items:
        (key, clip_id, camera, file), row = entry
        label = f"{str(file)!r} (clip {clip_id!r}, camera {camera!r})"
        report.files += 1
        stored = tables.info(row) if tables is not None and row >= 0 else cached_info(meta, key)
        try:
            probed, cut = probe_whole_frames(file) if file.is_file() else (probe(file), None)
        except (VideoDecodeError, OSError, ValueError) as err:
            report.problems.append(f"{label}: cannot be read as a video: {err}")
            continue
        if cut is not None:
            report.notes.append(f"{label}: {cut.describe()}; the frames checked are its whole ones.")
        report.frames += probed.frame_count
        if stored is None:
            report.problems.append(
                f"{label}: the index holds no frame table for this file, so its checksums cannot "
                "be verified; run `vstream index --tables INDEX` to record them."
            )
            continue
        content = _compare(stored, probed, counts.get(clip_id, 0), label)
        if not content and file.is_file():
            content = _decode_problems(file, stored, counts.get(clip_id, 0), label)
            report.decoded += (
                min(counts.get(clip_id, 0) or stored.frame_count, stored.frame_count) if not content else 0
            )
        report.problems.extend(content)
        recorded = stored.identity
        if recorded is None or file.is_dir():
            continue
        current = file_identity(file)
        if recorded.size_only:
            continue
        if (recorded.size, recorded.head_crc32, recorded.tail_crc32) != (
            current.size,
            current.head_crc32,
            current.tail_crc32,
        ):
            if not content:
                report.problems.append(
                    f"{label}: the file changed since the index was built ({recorded.describe_difference(current)}) "
                    "although its frames still match; run `vstream index --tables INDEX` to record it again."
                )
        elif recorded.mtime_ns != current.mtime_ns and not content:
            report.notes.append(f"{label}: modification time changed, content unchanged.")
    return report


def _clip_counts(path: Path) -> dict[str, int]:
    data = _read_json(path)
    return {clip: count for entries in data.values() if isinstance(entries, dict) for clip, count in entries.items()}


def verify_remote_index(
    url: str, *, storage: StorageConfig | None = None, progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None
) -> VerifyReport:
    """``vstream index --check`` for an index at a URL: every file read (one GET each, ``If-Match`` on its
    recorded ETag) and compared packet by packet with the frame tables.

    Returns:
        A :class:`VerifyReport`.

    Example::

        >>> verify_remote_index("s3://bucket/ds/index.json").ok  # doctest: +SKIP
        True
    """
    config = storage or StorageConfig()
    client = storage_for(config)
    index = load_remote_index(url, storage=config)
    report = VerifyReport(url)
    items = [(clip, cam) for clip in index for cam in clip.cameras]

    def one(item: tuple[Clip, CameraStream]) -> tuple[int, list[str]]:
        clip, cam = item
        label = f"{str(cam.path)!r} (clip {clip.clip_id!r}, camera {cam.name!r})"
        stored = cam.info
        if stored is None:
            return 0, [
                f"{label}: the index holds no frame table for this file, so its checksums cannot be verified; run "
                f"`vstream index --tables {url}` to record them."
            ]
        recorded = stored.identity
        expect = Expect(recorded.size, recorded.etag) if recorded is not None else None
        try:
            probed = probe_object(client, str(cam.path), expect)
        except (FileChangedError, MissingFileError) as err:
            return 0, [f"{label}: {err}"]
        except (VideoDecodeError, OSError, ValueError) as err:
            return 0, [f"{label}: cannot be read as a video: {err}"]
        return probed.frame_count, _compare(stored, probed, clip.frame_count, label)

    with ThreadPoolExecutor(max_workers=PROBE_THREADS) as pool:
        results: Iterable[Any] = pool.map(one, items)
        for frames, problems in progress(results) if progress else results:
            report.files += 1
            report.frames += frames
            report.problems.extend(problems)
    return report
