"""Encoding a dataset: camera streams in, accvlab layout (one video per camera and clip) plus its index out.

``OUT_DIR/videos/<clip_id>/<camera>.mp4`` holds every frame of each source camera stream at its
source presentation time (see :mod:`lightning_vstream.encode.writer`). Each camera file is one
task, run in this process, a local process pool or a Ray task (:mod:`lightning_vstream.executors`):
it finds out whether its file is already done (it probes with the expected codec, frame count and
times), else encodes it under a temporary name in its folder and renames it into place, and sends
back a small :class:`FileRecord`. The driver writes ``OUT_DIR/index.json`` and its frame-table
sidecar once, at the end, each whole or not at all (:func:`~lightning_vstream.build_index`).

Test-only fault injection: the environment variable :data:`FAULT_VARIABLE`, read by the driver
when a run starts and carried by every task (so it reaches workers on other machines), makes the
task writing one file fail half way through it, with that file's temporary name open. Its value
is ``MODE:CLIP/CAMERA`` or ``MODE-once:CLIP/CAMERA:MARKER``: ``exit`` ends the task's process
(``os._exit``), ``raise`` raises an :class:`~lightning_vstream.errors.InjectedFaultError`; the ``-once`` forms fail only while the file
``MARKER`` does not exist yet, and create it. It is for tests of retries and reruns; leave it
unset otherwise.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from lightning_vstream.encode.settings import CameraSource, Codec, EncodeSettings, EncodeSummary
from lightning_vstream.encode.writer import encode_file, mismatch, plan_file
from lightning_vstream.encode.writer import source_bytes as source_size
from lightning_vstream.errors import (
    ConfigurationError,
    DataFormatError,
    DatasetImportError,
    EncodeError,
    FileWriteError,
    IndexValidationError,
    InjectedFaultError,
    MissingFileError,
    VideoDecodeError,
)
from lightning_vstream.executors import Executor, ExecutorError, check_executor, map_ordered

__all__ = [
    "FAULT_VARIABLE",
    "EncodeJob",
    "FileRecord",
    "check_run_options",
    "encode_index",
    "encode_job",
    "encode_sources",
]

#: Tries of a failed file after the first (a crashed process, an I/O error); errors about the data
#: itself (an unreadable frame, an encoder that drops frames) are not retried: they would repeat.
RETRIES = 2
_DATA_ERRORS = (
    ConfigurationError,
    DataFormatError,
    DatasetImportError,
    EncodeError,
    FileWriteError,
    IndexValidationError,
    MissingFileError,
    VideoDecodeError,
)
#: The test-only fault-injection variable (see the module docstring).
FAULT_VARIABLE = "VSTREAM_TEST_ENCODE_FAULT"
_FAULT_MODES = ("exit", "raise", "exit-once", "raise-once")


@dataclass(frozen=True)
class EncodeJob:
    """One task: the camera file to write, and everything a process on another machine needs for it.

    Attributes:
        source: The camera stream.
        path: The file to write (``OUT_DIR/videos/<clip_id>/<camera>.mp4``).
        settings: Codec and rate control.
        threads: Encoder threads (0: the encoder's own choice from its machine's cores).
        fault: The test-only fault spec (see the module docstring), None in real runs.
    """

    source: CameraSource
    path: Path
    settings: EncodeSettings
    threads: int = 0
    fault: str | None = None

    def describe(self) -> str:
        """The file, clip and camera, for errors and retries."""
        return f"{str(self.path)!r} (clip {self.source.clip_id!r}, camera {self.source.camera!r})"


@dataclass(frozen=True)
class FileRecord:
    """What one task did: small, so a driver collects one per file of a dataset of any size.

    Attributes:
        encoded: True when the task wrote the file; False when it was already done and left alone.
        frames: Frames encoded (0 when already done).
        source_bytes: Size of the source (0 when already done).
        output_bytes: Size of the written file (0 when already done).
    """

    encoded: bool
    frames: int = 0
    source_bytes: int = 0
    output_bytes: int = 0


def encode_job(job: EncodeJob) -> FileRecord:
    """Run one task: leave a file that is already done, else encode and write it (the task's function).

    Raises:
        VideoDecodeError: A source frame could not be read.
        EncodeError: The encoder failed or its output does not keep the source frames and times.
        FileWriteError: The file could not be written.
    """
    task = plan_file(job.source, job.path)
    if job.path.is_file() and mismatch(task, job.path, job.settings.codec, job.settings.stride) is None:
        return FileRecord(encoded=False)
    on_frame = _fault(job.fault, job.source, len(task.ticks)) if job.fault else None
    frames, source_bytes, output_bytes = encode_file(task, job.settings, job.threads, on_frame)
    return FileRecord(True, frames, source_bytes, output_bytes)


def _parse_fault(spec: str) -> tuple[str, str, str, Path | None]:
    """``(mode, clip_id, camera, marker)`` of a fault spec.

    Raises:
        ConfigurationError: The spec is malformed (names the variable, the value and the form).
    """
    mode, _, rest = spec.partition(":")
    marker = None
    if mode.endswith("-once"):
        rest, _, text = rest.partition(":")
        marker = Path(text) if text else None
    clip_id, _, camera = rest.rpartition("/")
    if mode not in _FAULT_MODES or not clip_id or not camera or (mode.endswith("-once") and marker is None):
        raise ConfigurationError(
            f"{FAULT_VARIABLE}={spec!r} is not a fault spec; write MODE:CLIP/CAMERA (MODE exit or raise) or "
            "MODE-once:CLIP/CAMERA:MARKER_FILE, or unset it (it is for tests only)."
        )
    return mode, clip_id, camera, marker


def _fault(spec: str, source: CameraSource, frames: int) -> Callable[[int], None] | None:
    """The frame callback that injects ``spec``'s fault into this file half way, or None when it is not the target."""
    mode, clip_id, camera, marker = _parse_fault(spec)
    if (clip_id, camera) != (source.clip_id, source.camera):
        return None
    at = max(1, frames // 2)

    def inject(count: int) -> None:
        if count != at:
            return
        if marker is not None:
            if marker.exists():
                return
            from lightning_vstream.storage.atomic import write_atomic

            write_atomic(marker, f"{clip_id}/{camera}\n")
        if mode.startswith("exit"):
            os._exit(1)
        raise InjectedFaultError(
            f"test fault from {FAULT_VARIABLE} at frame {count} of clip {clip_id!r}, camera {camera!r}"
        )

    return inject


def _written_earlier(job: EncodeJob) -> FileRecord:
    """The record of a file this run wrote in a try whose result was lost: what the try would have returned."""
    return FileRecord(
        True, len(plan_file(job.source, job.path).ticks), source_size(job.source), job.path.stat().st_size
    )


def check_run_options(*, jobs: int, executor: str, threads: int | None) -> None:
    """Refuse ``jobs``, ``executor`` or ``threads`` values an encoding run cannot take (before any work).

    Raises:
        ConfigurationError: Names the argument, the value and what is accepted.

    Example::

        >>> check_run_options(jobs=2, executor="local", threads=None)
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigurationError(f"jobs={jobs!r} must be a positive number of processes.")
    check_executor(executor, jobs)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 0):
        raise ConfigurationError(f"threads={threads!r} must be a number of encoder threads (0: the encoder's choice).")


def _default_threads(executor: str, workers: int) -> int:
    """Encoder threads per file: a Ray task holds one CPU; local processes share this machine's cores."""
    if executor == "ray":
        return 1
    return 0 if workers == 1 else max(1, (os.cpu_count() or 1) // workers)


def _remove_debris(jobs: Sequence[EncodeJob], *, writers_ended: bool) -> int:
    """Remove the temporary files of earlier tries of these jobs' files that no process writes any more."""
    from lightning_vstream.storage.atomic import remove_abandoned

    names: dict[Path, set[str]] = {}
    for job in jobs:
        names.setdefault(job.path.parent, set()).add(job.path.name)
    return sum(
        len(remove_abandoned(folder, targets=targets, writers_ended=writers_ended)) for folder, targets in names.items()
    )


def encode_sources(
    sources: Sequence[CameraSource],
    out_dir: Path | str,
    *,
    settings: EncodeSettings | None = None,
    jobs: int = 1,
    executor: Executor = "local",
    threads: int | None = None,
    progress: bool = True,
    video_dir: str = "videos",
    index_name: str = "index.json",
) -> EncodeSummary:
    """Encode camera streams to ``out_dir/<video_dir>/<clip_id>/<camera>.mp4`` and index them.

    Each file is one task, which writes it under a temporary name, probes it (frame count, codec
    and every frame time must match the source, and with a keyframe stride exactly the frames on
    the stride must be references) and renames it into place; a file already there that probes
    right is left alone. The index is written once, at the end, by this process. A task that
    fails for a reason a retry may cure (its process died, an I/O error) is retried twice, then
    named; an interrupted or failed run keeps the files finished, leaves no temporary files of
    its own in the output folders, and a rerun encodes only the rest. Two runs writing into one
    output folder at once are not supported.

    Args:
        sources: The camera streams; ``(clip_id, camera)`` pairs must be unique.
        out_dir: Output folder (created).
        settings: Codec and rate control (defaults: :class:`EncodeSettings`).
        jobs: Files encoded at once by local processes (1: in this process); Ray uses its cluster's CPUs.
        executor: ``"local"`` (``jobs`` processes) or ``"ray"`` (Ray tasks on the cluster at
            ``RAY_ADDRESS``, or on a local runtime started for the call; ``out_dir`` and the sources
            must be at the same paths on every worker).
        threads: Encoder threads per file; None: this machine's cores over ``jobs`` (the encoder's
            own choice for one process), 1 on Ray (a task holds one CPU). x264 and x265 can write
            other bytes with other thread counts (and, on a busy machine, now and then with the same
            one); frames and times are the same whatever it is.
        progress: Show a progress bar over files (and retries on stderr).
        video_dir: Folder under ``out_dir`` that holds the clip folders.
        index_name: Index file written under ``out_dir`` (with its frame-table sidecar).

    Returns:
        An :class:`EncodeSummary`.

    Raises:
        ConfigurationError: ``jobs`` < 1, an unknown executor, duplicate streams, or ``out_dir`` is a file.
        VideoDecodeError: A source frame could not be read (names clip, camera and frame).
        EncodeError: The encoder failed or its output does not keep the source frames and times,
            or a task failed on every try (names the file, clip, camera and cause).

    Example::

        >>> src = CameraSource("scene-0000", "CAM_FRONT", Path("images/scene-0000/CAM_FRONT"))
        >>> encode_sources([src], "out", settings=EncodeSettings(codec="h264"))  # doctest: +SKIP
    """
    from tqdm import tqdm

    from lightning_vstream.indexing.build import build_index

    settings = settings if settings is not None else EncodeSettings()
    check_run_options(jobs=jobs, executor=executor, threads=threads)
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigurationError(f"output folder {str(out_dir)!r} is a file; give a folder to write videos into.")
    if not sources:
        raise ConfigurationError("there are no camera streams to encode.")
    seen: set[tuple[str, str]] = set()
    for src in sources:
        key = (src.clip_id, src.camera)
        if key in seen:
            raise ConfigurationError(f"clip {src.clip_id!r}, camera {src.camera!r} is listed twice; give each once.")
        seen.add(key)
    fault = os.environ.get(FAULT_VARIABLE) or None
    if fault is not None:
        _parse_fault(fault)
    workers = min(jobs, len(sources))
    per_file = threads if threads is not None else _default_threads(executor, workers)
    todo = [
        EncodeJob(src, out_dir / video_dir / src.clip_id / f"{src.camera}.mp4", settings, per_file, fault)
        for src in sources
    ]
    start = time.perf_counter()
    retries = 0
    # Left by processes of an earlier run killed on this machine (those of a cluster's machines: at the end).
    _remove_debris(todo, writers_ended=False)
    existed = {job.path for job in todo if job.path.is_file()}  # files this run did not write
    with tqdm(total=len(todo), desc="encoding", unit="file", disable=not progress) as bar:

        def retried(what: str, err: BaseException) -> None:
            nonlocal retries
            retries += 1
            if progress:
                cause = (str(err).strip().splitlines() or [type(err).__name__])[0]
                bar.write(f"encoding: retrying {what}: {cause}", file=sys.stderr)

        try:
            records = map_ordered(
                encode_job,
                todo,
                executor=executor,
                workers=workers,
                retries=RETRIES,
                describe=EncodeJob.describe,
                on_done=lambda: bar.update(1),
                on_retry=retried,
                no_retry=_DATA_ERRORS,
                stall_timeout=None,  # one long video may take longer than any fixed limit
            )
        except ExecutorError as err:
            raise EncodeError(f"{err} The files finished are kept: run again to encode the rest.") from err
        finally:
            # Every task has ended here (finished, failed or cancelled): what a killed one left is debris.
            _remove_debris(todo, writers_ended=True)
    index = build_index(
        out_dir, output=out_dir / index_name, video_dirs=[video_dir], progress=False, executor=executor, workers=workers
    )
    # A file left alone that was not there at the start was written by this run, in a try whose result was
    # lost (its pool broke when another process died after it had renamed the file into place).
    records = [r if r.encoded or job.path in existed else _written_earlier(job) for r, job in zip(records, todo)]
    done = [r for r in records if r.encoded]
    return EncodeSummary(
        index,
        files_encoded=len(done),
        files_skipped=len(records) - len(done),
        frames_encoded=sum(r.frames for r in done),
        seconds=time.perf_counter() - start,
        source_bytes=sum(r.source_bytes for r in done),
        output_bytes=sum(r.output_bytes for r in done),
        retries=retries,
    )


def encode_index(
    src_index: Path | str,
    out_dir: Path | str,
    *,
    codec: Codec = "hevc",
    gop: int | None = None,
    bframes: int = 0,
    crf: int | None = None,
    bitrate: int | str | None = None,
    preset: str = "fast",
    keyframe_stride: int | None = None,
    cameras: Sequence[str] | None = None,
    jobs: int = 1,
    executor: Executor = "local",
    threads: int | None = None,
    progress: bool = True,
) -> EncodeSummary:
    """Transcode every camera of every clip of an index into ``out_dir`` (accvlab layout) and index it.

    Each camera stream is encoded whole (all the frames it holds, at their source times) to
    ``out_dir/videos/<clip_id>/<camera>.mp4``; ``out_dir/index.json`` and its frame-table sidecar
    are written with :func:`~lightning_vstream.build_index`. Running it again skips the files
    that are already done (see :func:`encode_sources`).

    Args:
        src_index: Index of the source dataset (image folders, videos, or both).
        out_dir: Output folder; must not be a folder the source's clips live in.
        codec: ``"hevc"`` or ``"h264"``.
        gop: Keyframe interval in frames; None: 12, or six references per GOP in the stride layout (36 at
            ``keyframe_stride=6``; see :class:`EncodeSettings`).
        bframes: Maximum consecutive B-frames.
        crf: Constant quality (0..51); the codec's default when neither this nor ``bitrate`` is given.
        bitrate: Target bit rate (bits per second, or ``"4M"`` / ``"800k"``) instead of ``crf``.
        preset: Encoder speed preset.
        keyframe_stride: ``N`` > 1 writes the stride layout (every ``N``-th frame a reference, the
            frames between non-reference B-frames: see :class:`EncodeSettings`); None or 1: the
            usual layout (an index does not say which of its frames are key frames).
        cameras: Cameras to encode (all when None).
        jobs: Files encoded in parallel by local processes (1: in this process).
        executor: ``"local"`` (``jobs`` processes) or ``"ray"`` (Ray tasks; see :func:`encode_sources`).
        threads: Encoder threads per file (None: see :func:`encode_sources`).
        progress: Show a progress bar.

    Returns:
        An :class:`EncodeSummary` (speed, sizes, files encoded and skipped).

    Raises:
        FileNotFoundError: ``src_index`` does not exist.
        IndexValidationError: The source index does not match its files.
        ConfigurationError: An argument is out of range, or ``out_dir`` would overwrite the source.
        VideoDecodeError: A source frame could not be read.
        EncodeError: The encoder failed or its output does not keep the source frames and times.

    Example::

        >>> encode_index("images/index.json", "encoded", codec="h264", crf=18, jobs=2)  # doctest: +SKIP
    """
    from lightning_vstream.indexing import load_index

    settings = EncodeSettings(
        codec=codec, gop=gop, bframes=bframes, crf=crf, bitrate=bitrate, preset=preset, keyframe_stride=keyframe_stride
    )
    check_run_options(jobs=jobs, executor=executor, threads=threads)
    index = load_index(src_index, cameras=cameras)
    if isinstance(index.source, str):
        raise ConfigurationError(
            f"vstream encode reads local files; {index.source!r} is remote. Download the dataset first, or encode "
            "where the images are."
        )
    if (Path(out_dir) / "index.json").resolve() == index.source.resolve():
        raise ConfigurationError(
            f"output folder {str(out_dir)!r} holds the source index {str(index.source)!r}, which encoding would "
            "overwrite; choose another output folder."
        )
    video_root = (Path(out_dir) / "videos").resolve()
    sources: list[CameraSource] = []
    for clip in index:
        if (video_root / clip.clip_id).resolve() == Path(clip.folder).resolve():
            raise ConfigurationError(
                f"output folder {str(out_dir)!r} would write clip {clip.clip_id!r} into its own source folder "
                f"{str(clip.folder)!r}; choose another output folder."
            )
        # No pts: each source is probed once, and decoded with that frame table.
        sources.extend(CameraSource(clip.clip_id, cam.name, Path(cam.path)) for cam in clip.cameras)
    return encode_sources(
        sources, out_dir, settings=settings, jobs=jobs, executor=executor, threads=threads, progress=progress
    )
