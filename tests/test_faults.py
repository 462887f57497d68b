"""The fault suite: damaged files of many kinds through both stream loaders, read the same way.

Every case damages one camera file of one clip (or the index's promise about it). Each loader (the
worker loader with 0 and 2 workers, and the thread engine) reads the dataset's evaluation plan
(every frame once, padding at the end) under ``on_error="raise"`` and ``"skip"``:

- ``raise``: the batches before the failure come out, then the error a plain decoder reading the
  file in order meets (same class, same first line naming the file, clip, camera and the frame that
  failed), as itself: ``except FileChangedError`` catches a replaced file.
- ``skip``: every delivered frame carries its own stamp; the damaged clip delivers exactly the
  frames before the failure; the counters are exact (``skipped_samples`` is the frames lost,
  ``frames_delivered`` the valid slots' frames, one clip and one file skipped).
- always: no hang (a watchdog), no decode thread or worker process left behind.

Files are tiny and generated once per module; each case is one copy of the dataset.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from lightning_vstream import DecodeOptions, EngineOptions, ErrorOptions, PlanOptions, SamplingOptions
from lightning_vstream.decode.cpu.pyav import PyAVDecoder
from lightning_vstream.demos.synth import clip_name, write_stamped_video
from lightning_vstream.errors import FileChangedError, FrameSizeError, MissingFileError, VideoDecodeError
from lightning_vstream.index.listing import leave_out_hint
from lightning_vstream.indexing import build_index, load_index
from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule
from tests.conftest import batch_stamp_errors

LENGTHS = [14, 10, 18, 12]
CAMERAS = ["CAM_BACK", "CAM_BACK_LEFT"]
BAD_CLIP, BAD_CAMERA = 2, 1  # scene-0002 (18 frames, read from step 0), CAM_BACK_LEFT
PROMISED = 22  # the "more" case's index lists this many frames for the bad clip; its files hold 18
HANG_SECONDS = 120
LOADERS = ["workers0", "workers2", "engine"]


@dataclass(frozen=True)
class Case:
    """One kind of damage: what it does to the dataset, and what a reader must raise."""

    name: str
    damage: Callable[[Path, Path], None]  # (dataset root, bad file)
    error: type[Exception]
    #: The failure is not the decoder's own (its first line is given here, a regex, with k its frame).
    message: str | None = None
    #: Damage done after the index is loaded (a file that disappears during training).
    after_setup: bool = False


def _truncate(keep: float) -> Callable[[Path, Path], None]:
    def damage(root: Path, path: Path) -> None:
        data = path.read_bytes()
        path.write_bytes(data[: int(len(data) * keep)])

    return damage


def _flip_packet(root: Path, path: Path) -> None:
    data = bytearray(path.read_bytes())
    start = int(len(data) * 0.55)  # frame data (faststart files keep their index in front)
    for i in range(start, start + 8):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _damage_header(root: Path, path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[data.index(b"avcC") + 18] ^= 0x01  # one bit of the SPS in the sample description
    path.write_bytes(bytes(data))


def _hide(root: Path, path: Path) -> None:
    path.rename(path.with_suffix(".hidden"))


def _unhide(path: Path) -> None:
    hidden = path.with_suffix(".hidden")
    if hidden.exists():
        hidden.rename(path)


def _replace(root: Path, path: Path) -> None:
    # Another file of the same length and size: the other camera's stamps.
    write_stamped_video(path, clip=BAD_CLIP, camera=0, frames=LENGTHS[BAD_CLIP], size=(64, 48), gop=6, faststart=True)


def _promise_more(root: Path, path: Path) -> None:
    index_file = root / "index.json"
    index = json.loads(index_file.read_text())
    for clips in index.values():
        if clip_name(BAD_CLIP) in clips:
            clips[clip_name(BAD_CLIP)] = PROMISED
    index_file.write_text(json.dumps(index))


def _other_size(root: Path, path: Path) -> None:
    write_stamped_video(
        path, clip=BAD_CLIP, camera=BAD_CAMERA, frames=LENGTHS[BAD_CLIP], size=(96, 64), gop=6, faststart=True
    )
    build_index(root, output=root / "index.json", progress=False)  # an index that knows the new file


CASES = {
    case.name: case
    for case in [
        Case("truncated-30%", _truncate(0.3), FileChangedError),  # cut before the first whole packet
        Case("truncated-55%", _truncate(0.55), VideoDecodeError),
        Case("truncated-85%", _truncate(0.85), VideoDecodeError),
        Case("flipped-bytes-in-a-packet", _flip_packet, VideoDecodeError),
        Case("header-damage", _damage_header, FileChangedError),
        Case("missing-file", _hide, MissingFileError, after_setup=True),
        Case("replaced-after-indexing", _replace, FileChangedError),
        Case(
            "index-promises-more-frames",
            _promise_more,
            VideoDecodeError,
            message=(
                r"clip 'scene-0002', camera 'CAM_BACK', frame 18 \('[^']+/CAM_BACK\.mp4'\): IndexError: frame 18 is "
                r"out of range for '[^']+/CAM_BACK\.mp4' \(clip 'scene-0002', camera 'CAM_BACK'\), which holds 18 "
                r"frames \(valid: 0\.\.17\)\."
            ),
        ),
        Case(
            "wrong-frame-size",
            _other_size,
            FrameSizeError,
            message=(
                r"clip 'scene-0002', camera 'CAM_BACK_LEFT', frame 0 \('[^']+/CAM_BACK_LEFT\.mp4'\) is \(3, 64, 96\) "
                r"but the batch's frames are \(3, 48, 64\); batches stack frames of one size, so pass a resize "
                r"transform"
            ),
        ),
    ]
}


@dataclass(frozen=True)
class Damaged:
    """A damaged copy of the dataset, and what reading its bad file in order gives."""

    root: Path
    bad_file: Path
    failing_read: int  # the first frame a reader asks for and does not get
    first_line: str  # a regex the first line of the error matches from its start
    frames: int  # frames the index lists for the bad clip


def _reference(case: Case, root: Path, bad_file: Path) -> tuple[int, str]:
    """Read the bad file in order, as a stream does, with the index's frame table: where and how it fails."""
    if case.message is not None:
        failing = {"index-promises-more-frames": LENGTHS[BAD_CLIP], "wrong-frame-size": 0}[case.name]
        return failing, case.message
    stream = load_index(root / "index.json").clips[BAD_CLIP].cameras[BAD_CAMERA]
    if case.after_setup:
        case.damage(root, bad_file)
    label = f"clip {clip_name(BAD_CLIP)!r}, camera {stream.name!r}"
    decoder = PyAVDecoder(stream.path, info=stream.info, label=label, threads=1)
    try:
        for frame in range(LENGTHS[BAD_CLIP]):
            try:
                decoder.get(frame)
            except case.error as err:
                first = str(err).split("\n", 1)[0]
                if isinstance(err, MissingFileError):  # the loaders say how to go on without the clip
                    first += " " + leave_out_hint(clip_name(BAD_CLIP))
                return frame, re.escape(first) + r"\Z"
    finally:
        decoder.close()
        _unhide(bad_file)
    raise AssertionError(f"{case.name}: the damaged file decodes without an error")


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Damaged]:
    """A damaged copy of the dataset per case, made once per module."""
    pristine = tmp_path_factory.mktemp("faults-pristine")
    for clip, frames in enumerate(LENGTHS):
        for camera, name in enumerate(CAMERAS):
            # faststart: the MP4 index comes first, so a truncated file still opens.
            write_stamped_video(
                pristine / "videos" / clip_name(clip) / f"{name}.mp4",
                clip=clip,
                camera=camera,
                frames=frames,
                size=(64, 48),
                gop=6,
                faststart=True,
            )
    build_index(pristine, output=pristine / "index.json", progress=False)
    made: dict[str, Damaged] = {}

    def make(name: str) -> Damaged:
        if name not in made:
            case = CASES[name]
            root = tmp_path_factory.mktemp("faults") / "data"
            shutil.copytree(pristine, root)
            bad_file = root / "videos" / clip_name(BAD_CLIP) / f"{CAMERAS[BAD_CAMERA]}.mp4"
            if not case.after_setup:
                case.damage(root, bad_file)
            failing, first_line = _reference(case, root, bad_file)
            frames = PROMISED if name == "index-promises-more-frames" else LENGTHS[BAD_CLIP]
            made[name] = Damaged(root, bad_file, failing, first_line, frames)
        return made[name]

    return make


@pytest.fixture(autouse=True)
def _no_hang_no_leftovers() -> Iterator[None]:
    """A hang dumps every thread's stack and fails the run; every test must end its workers and threads."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}  # e.g. a forkserver
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()
    children = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"worker processes left behind: {alive}"
    assert not [t for t in threading.enumerate() if t.name.startswith("vstream-decode")]


def _loader(kind: str, index_file: Path, on_error: str, *, training: bool = False) -> Any:
    """The loader of ``kind`` for the evaluation plan (or the training plan) of ``index_file``."""
    options: dict[str, Any] = {
        "batch_size": 2,
        "errors": ErrorOptions(on_error=on_error, timeout=60),  # a stalled read fails the test instead of hanging it
        "engine": EngineOptions(
            kind="threads" if kind == "engine" else "workers",
            num_workers=2 if kind == "workers2" else 0,
            threads=3 if kind == "engine" else None,
        ),
        # One FFmpeg thread per decoder, as the reference reads: with frame threads a decoder reads
        # packets ahead, so a damaged packet stops it at an earlier frame (how much earlier depends
        # on the cores); the engine on the CPU uses one anyway.
        "decode": DecodeOptions(decoder_threads=1),
    }
    if training:
        dm = StreamVideoDataModule(index_file=index_file, plan=PlanOptions(shuffle=False), **options)
        dm.setup("fit")
        return dm.train_dataloader()
    dm = StreamVideoDataModule(val_index_file=index_file, **options)
    dm.setup("validate")
    return dm.val_dataloader()


def _read(case: Case, data: Damaged, loader: Any) -> list[dict[str, Any]]:
    """Every batch, checked as it comes (frames are checked while the batch is current), without frames."""
    if case.after_setup:
        case.damage(data.root, data.bad_file)
    seen = []
    try:
        for batch in loader:
            errors = batch_stamp_errors(batch)
            assert not errors, errors[:3]
            for slot in range(2):
                if not batch["valid"][slot]:
                    assert batch["clip_id"][slot] == "" and int(batch["frame_index"][slot]) == -1
                    assert not batch["frames"][slot].any() and batch["camera_timestamp"][slot].isnan().all()
            seen.append({k: v for k, v in batch.items() if k != "frames"})
    finally:
        _unhide(data.bad_file)
    return seen


def _delivered(batches: list[dict[str, Any]], clip: str) -> list[int]:
    return [int(b["frame_index"][s]) for b in batches for s in range(2) if b["valid"][s] and b["clip_id"][s] == clip]


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("case", list(CASES))
def test_raise_stops_at_the_failing_read_with_its_own_error(
    damaged: Callable[[str], Damaged], case: str, loader: str
) -> None:
    data = damaged(case)
    stream = _loader(loader, data.root / "index.json", "raise")
    batches: list[dict[str, Any]] = []
    with pytest.raises(CASES[case].error) as caught:
        batches.extend(_read(CASES[case], data, _Counting(stream, batches)))
    assert type(caught.value) is CASES[case].error  # the class itself, not torch's or a wrapper
    first = str(caught.value).split("\n", 1)[0]
    assert re.match(data.first_line, first), first
    # Every batch before the one holding the failing read came out, with the damaged clip's frames before it.
    assert _delivered(batches, clip_name(BAD_CLIP)) == list(range(data.failing_read))


class _Counting:
    """Iterates a loader, appending each batch (without frames) to ``into`` as it is delivered."""

    def __init__(self, loader: Any, into: list[dict[str, Any]]) -> None:
        self.loader = loader
        self.into = into

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.loader:
            self.into.append({k: v for k, v in batch.items() if k != "frames"})
            yield batch


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("case", list(CASES))
def test_skip_delivers_every_other_frame_and_counts_exactly(
    damaged: Callable[[str], Damaged], case: str, loader: str
) -> None:
    data = damaged(case)
    stream = _loader(loader, data.root / "index.json", "skip")
    batches = _read(CASES[case], data, stream)
    promised = [*LENGTHS[:BAD_CLIP], data.frames, *LENGTHS[BAD_CLIP + 1 :]]
    # The damaged clip delivers exactly the frames before the failing read; every other clip all of its frames.
    for clip, length in enumerate(promised):
        expected = list(range(data.failing_read if clip == BAD_CLIP else length))
        assert _delivered(batches, clip_name(clip)) == expected, clip_name(clip)
    lost = data.frames - data.failing_read
    valid = sum(int(b["valid"].sum()) for b in batches)
    stats = stream.stats
    assert valid == sum(promised) - lost
    assert (stats.skipped_samples, stats.frames_delivered) == (lost, valid * len(CAMERAS))
    assert (stats.skipped_clips, stats.bad_files) == (1, 1)
    # A read error per camera stream that failed: both cameras when the index promises frames that no file holds.
    assert stats.read_errors == (2 if case == "index-promises-more-frames" else 1)


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("case", ["truncated-55%", "replaced-after-indexing", "wrong-frame-size"])
def test_skip_in_training_order_counts_every_invalid_slot_step(
    damaged: Callable[[str], Damaged], case: str, loader: str
) -> None:
    data = damaged(case)
    stream = _loader(loader, data.root / "index.json", "skip", training=True)
    batches = _read(CASES[case], data, stream)
    # Training drops the plan's remainder, so it has no padding: every invalid slot-step was lost to the skip.
    invalid = sum(int((~b["valid"]).sum()) for b in batches)
    stats = stream.stats
    assert stats.skipped_samples == invalid >= 1
    assert stats.frames_delivered == (2 * len(batches) - invalid) * len(CAMERAS)
    assert _delivered(batches, clip_name(BAD_CLIP)) == list(range(data.failing_read))


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata's, under torch 2.13
@pytest.mark.parametrize("case", ["truncated-55%", "replaced-after-indexing"])
def test_the_clip_loaders_workers_raise_the_files_error_as_itself(damaged: Callable[[str], Damaged], case: str) -> None:
    from lightning_vstream.clips.datamodule import ClipVideoDataModule

    data = damaged(case)
    dm = ClipVideoDataModule(
        index_file=data.root / "index.json",
        batch_size=2,
        engine=EngineOptions(num_workers=1),
        sampling=SamplingOptions(clip_frames=6, shuffle=False),
        errors=ErrorOptions(timeout=60),
    )
    dm.setup("fit")
    with pytest.raises(CASES[case].error) as caught:
        for _ in dm.train_dataloader():
            pass
    error = caught.value
    del caught
    assert type(error) is CASES[case].error
    first = str(error).split("\n", 1)[0]  # the worker's own message, not torch's preamble
    assert "clip 'scene-0002'" in first and str(data.bad_file) in first, first
    assert "DataLoader worker process 0" in str(error)  # where it was raised, after the message
    # torch ends a DataLoader's workers when its iterator goes, which the traceback holds on to.
    error.__traceback__ = None
    del error
    dm.teardown("fit")
    gc.collect()
