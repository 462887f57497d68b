"""Bad data: errors that name the file, or skips that are counted; no hangs, no leftover workers."""

from __future__ import annotations

import multiprocessing
import os
import random
import re
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from _stream_models import RecordingModel
from _trainers import quiet_trainer

from lightning_vstream import EngineOptions, ErrorOptions, PlanOptions
from lightning_vstream.decode.base import VideoDecodeError
from lightning_vstream.decode.cpu.pyav import PyAVDecoder
from lightning_vstream.demos.synth import clip_name, read_stamp, write_stamped_video
from lightning_vstream.errors import WorkerError
from lightning_vstream.indexing import build_index, load_index
from lightning_vstream.stream.parts import StreamTask
from lightning_vstream.stream.sampler import StreamSampler
from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule
from lightning_vstream.stream.worker import StreamDataset
from lightning_vstream.stream.worker_loader import StreamDataLoader
from tests._tables import build_index_with_json_tables

LENGTHS = [20, 13, 27, 16, 22]
BAD_CLIP = 2  # scene-0002, 27 frames
BAD_CAMERA = "CAM_BACK_LEFT"


def _dataset(root: Path) -> Path:
    """Five faststart clips (index first, so truncated files still open), two cameras, GOP 6."""
    for clip, frames in enumerate(LENGTHS):
        for cam, name in enumerate(["CAM_BACK", "CAM_BACK_LEFT"]):
            write_stamped_video(
                root / "videos" / clip_name(clip) / f"{name}.mp4",
                clip=clip,
                camera=cam,
                frames=frames,
                size=(64, 48),
                gop=6,
                faststart=True,
            )
    return build_index(root, output=root / "index.json", progress=False)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _dataset(tmp_path_factory.mktemp("pristine")).parent


def _copy(pristine: Path, tmp_path: Path) -> Path:
    import shutil

    shutil.copytree(pristine, tmp_path / "ds")
    return tmp_path / "ds"


def _bad_file(root: Path) -> Path:
    return root / "videos" / clip_name(BAD_CLIP) / f"{BAD_CAMERA}.mp4"


def _truncate(path: Path, keep: float = 0.55) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _flip_bits(path: Path, seed: int = 0) -> None:
    """Flip bits inside the frame data, after the index (faststart puts it first)."""
    data = bytearray(path.read_bytes())
    rng = random.Random(seed)
    for _ in range(8):
        i = rng.randrange(int(len(data) * 0.5), int(len(data) * 0.9))
        data[i] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def _stream(root: Path, *, num_workers: int, on_error: str) -> tuple[list[dict[str, Any]], Any]:
    dm = StreamVideoDataModule(
        index_file=root / "index.json",
        batch_size=2,
        engine=EngineOptions(num_workers=num_workers, kind="workers"),
        errors=ErrorOptions(on_error=on_error),
        plan=PlanOptions(shuffle=False),
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    batches = list(loader)
    return batches, loader


@pytest.mark.parametrize("damage", [_truncate, _flip_bits], ids=["truncated", "bit-flipped"])
def test_raise_names_file_clip_camera_and_frame(pristine: Path, tmp_path: Path, damage: Any) -> None:
    root = _copy(pristine, tmp_path)
    damage(_bad_file(root))
    with pytest.raises(
        VideoDecodeError, match=rf"{BAD_CAMERA}\.mp4.*clip 'scene-0002', camera '{BAD_CAMERA}'.* frame \d+"
    ):
        _stream(root, num_workers=0, on_error="raise")


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("damage", [_truncate, _flip_bits], ids=["truncated", "bit-flipped"])
def test_skip_delivers_only_right_frames_and_counts_exactly(
    pristine: Path, tmp_path: Path, damage: Any, num_workers: int
) -> None:
    root = _copy(pristine, tmp_path)
    damage(_bad_file(root))
    batches, loader = _stream(root, num_workers=num_workers, on_error="skip")
    delivered: dict[str, list[int]] = {}
    for batch in batches:
        for slot in range(2):
            if not batch["valid"][slot]:
                assert batch["clip_id"][slot] == "" and not batch["frames"][slot].any()
                continue
            clip_id, frame = batch["clip_id"][slot], int(batch["frame_index"][slot])
            delivered.setdefault(clip_id, []).append(frame)
            for cam in range(2):
                stamp = read_stamp(batch["frames"][slot, cam])
                assert (stamp.clip, stamp.camera, stamp.frame) == (int(clip_id[-4:]), cam, frame)
    stats = loader.stats
    plan = loader.sampler.schedule()
    bad_segments = [s for s in plan.segments if s.clip == BAD_CLIP]
    assert 1 <= stats.skipped_clips <= len(bad_segments) and stats.bad_files == 1
    assert stats.read_errors >= 1
    # A segment of the damaged clip stops at the failure and never resumes; every other segment is whole.
    for segment in plan.segments:
        frames = [f for f in delivered.get(clip_name(segment.clip), []) if 0 <= f - segment.start < segment.length]
        assert frames == list(range(segment.start, segment.start + len(frames)))
        if segment.clip != BAD_CLIP:
            assert len(frames) == segment.length
    bad = delivered.get(clip_name(BAD_CLIP), [])
    assert len(bad) < LENGTHS[BAD_CLIP]
    # Training drops the remainder, so the plan has no padding: every invalid slot-step was lost
    # to the skip and is counted once; only valid slots count as delivered.
    invalid = sum(int((~b["valid"]).sum()) for b in batches)
    assert stats.skipped_samples == invalid >= 1
    assert stats.frames_delivered == (2 * len(batches) - invalid) * 2


def test_checksums_catch_corruption_that_ffmpeg_conceals(pristine: Path, tmp_path: Path) -> None:
    root = _copy(pristine, tmp_path)
    path = root / "videos" / clip_name(0) / "CAM_BACK.mp4"
    _flip_bits(path, seed=3)
    info = load_index(root / "index.json")[clip_name(0)].cameras[0].info
    assert info is not None and info.crc32 is not None
    decoder = PyAVDecoder(path, info=info)
    with pytest.raises(VideoDecodeError, match="differs from the checksum recorded when the index was built"):
        for k in range(info.frame_count):
            assert read_stamp(decoder.read()).frame == k


class _StallingDataset(StreamDataset):
    """A dataset whose worker blocks forever on step 2 (an event nobody sets)."""

    def __getitem__(self, task: StreamTask) -> Any:
        if task.step == 2:
            threading.Event().wait()
        return super().__getitem__(task)


class _DyingDataset(StreamDataset):
    def __getitem__(self, task: StreamTask) -> Any:
        if task.step == 2:
            os._exit(3)
        return super().__getitem__(task)


_STALL_AND_EXIT = r"""
import signal, sys, threading
from lightning_vstream.errors import WorkerError
from lightning_vstream.index import load_index
from lightning_vstream.stream.worker_loader import StreamDataLoader
from lightning_vstream.stream.sampler import StreamSampler
from lightning_vstream.stream.worker import StreamDataset

class Stalling(StreamDataset):
    def __getitem__(self, task):
        if task.step == 2 and task.part == 1:
            # Training scripts often install a SIGTERM handler that the workers inherit: a
            # stalled worker then outlives terminate(), and multiprocessing waits for it at exit.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            threading.Event().wait()
        return super().__getitem__(task)

index = load_index(sys.argv[1])
sampler = StreamSampler([c.frame_count for c in index.clips], num_cameras=2, batch_size=2, num_parts=2)
loader = StreamDataLoader(Stalling(index=index), sampler=sampler, num_workers=2, timeout=2,
                          persistent_workers=sys.argv[2] == "persistent")
try:
    for batch in loader:
        pass
except WorkerError as err:
    print("WorkerError:", err, flush=True)
"""


@pytest.mark.parametrize("persistent", ["persistent", "transient"])
def test_a_stalled_worker_is_ended_so_the_process_exits(pristine: Path, persistent: str) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", _STALL_AND_EXIT, str(pristine / "index.json"), persistent],
        check=False,
        timeout=240,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert re.search(
        r"WorkerError: decoding worker 1 \(pid \d+\) sent nothing for timeout=2 s while the loader waited for part 1 "
        r"of step 2; it decodes the camera streams slot 0 CAM_BACK_LEFT \(clip 'scene-\d+', frame 2, "
        r"'[^']+CAM_BACK_LEFT\.mp4'\), slot 1 CAM_BACK_LEFT \(clip 'scene-\d+', frame \d+, '[^']+'\)\. The workers were "
        r"stopped \(DataLoader timed out after 2 seconds\)",
        result.stdout,
    ), (result.stdout + result.stderr)[-2000:]


@pytest.mark.parametrize(
    ("dataset_cls", "timeout", "match"),
    [
        (_StallingDataset, 2, r"^decoding worker [01] \(pid \d+\) sent nothing for timeout=2 s"),
        # A dead worker is reported within a second, long before the timeout.
        (_DyingDataset, 60, r"^decoding worker [01] \(pid \d+\) exited with code 3 while the loader waited for part"),
    ],
)
def test_stalled_or_dead_worker_surfaces_as_an_error(
    pristine: Path, dataset_cls: type, timeout: int, match: str
) -> None:
    import gc

    index = load_index(pristine / "index.json")
    sampler = StreamSampler(LENGTHS, num_cameras=2, batch_size=2, num_parts=2)
    loader = StreamDataLoader(dataset_cls(index=index), sampler=sampler, num_workers=2, timeout=timeout)
    before = {p.pid for p in psutil.Process().children(recursive=True)}  # e.g. a forkserver
    with pytest.raises(WorkerError, match=match):
        for _ in loader:
            pass
    # The workers were ended (and reaped) on the error, not left for the exit to wait on.
    assert [p for p in psutil.Process().children(recursive=True) if p.pid not in before] == []
    del loader
    gc.collect()  # shut the remaining worker down before the next test


@pytest.fixture
def worker_1_parks(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], Any]:
    """``park(after)``: decoding worker 1 (part 1 of every step) stops inside its first task of a step after
    ``after`` and says so (the Event it sets); forked workers inherit the patched dataset.

    Killed there, the worker is decoding, as when the kernel's OOM killer picks it. Killed at a random moment,
    it may be taking a task's shared batch buffers from this process's resource sharer, whose thread then
    prints a ConnectionResetError traceback of its own (outside the test's captured output when it runs late).
    """
    real = StreamDataset.__getitem__

    def park(after: int) -> Any:
        parked = multiprocessing.Event()

        def getitem(self: StreamDataset, task: StreamTask) -> Any:
            if task.part == 1 and task.step > after:
                parked.set()
                threading.Event().wait()  # until the test kills this worker
            return real(self, task)

        monkeypatch.setattr(StreamDataset, "__getitem__", getitem)
        return parked

    return park


@pytest.fixture
def excepthook_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What reached ``sys.excepthook`` during the test (the resource sharer's thread reports there)."""
    reported: list[str] = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, tb: reported.append(f"{kind.__name__}: {value}"))
    return reported


def _kill_worker(loader: StreamDataLoader, worker_id: int, parked: Any) -> int:
    """SIGKILL one decoding worker once it has parked and wait until it is dead (not reaped): torch's SIGCHLD has been
    sent then."""
    assert parked.wait(timeout=120), f"decoding worker {worker_id} never parked"
    pid = next(pid for pid, wid in loader.engine.counts if wid == worker_id)
    os.kill(pid, signal.SIGKILL)
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    return pid


# Worker 1 decodes camera 1 of both slots; step and clips vary with the loop.
_KILLED = (
    r"^decoding worker 1 \(pid (?P<pid>\d+)\) was killed by signal SIGKILL while the loader waited for part 1 of step "
    r"\d+; it decodes the camera streams slot 0 CAM_BACK_LEFT \(clip 'scene-\d+', frame \d+, '[^']+CAM_BACK_LEFT.mp4'\), "
    r"slot 1 CAM_BACK_LEFT \(clip 'scene-\d+', frame \d+, '[^']+CAM_BACK_LEFT.mp4'\)\. The other workers were stopped"
)


@pytest.mark.parametrize("persistent", [False, True], ids=["transient", "persistent"])
def test_a_worker_killed_during_a_plain_loop_is_a_worker_error_from_the_loader(
    pristine: Path, persistent: bool, worker_1_parks: Callable[[int], Any], excepthook_calls: list[str]
) -> None:
    index = load_index(pristine / "index.json")
    sampler = StreamSampler(LENGTHS, num_cameras=2, batch_size=2, num_parts=2, shuffle=False)
    parked = worker_1_parks(3)  # in step 4, which this loop has not asked for when it kills the worker
    loader = StreamDataLoader(StreamDataset(index=index), sampler=sampler, num_workers=2, persistent_workers=persistent)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    killed = None
    with pytest.raises(WorkerError, match=_KILLED) as caught:
        for step, _ in enumerate(loader):
            if step == 3:
                killed = _kill_worker(loader, 1, parked)
                # The signal arrived while this loop body runs: torch's own handler would raise its
                # RuntimeError right here. Give pending handlers bytecodes to run on.
                assert sum(range(10_000)) > 0
    match = re.match(_KILLED, str(caught.value))
    assert match is not None and int(match["pid"]) == killed
    assert [p for p in psutil.Process().children(recursive=True) if p.pid not in before] == []
    assert excepthook_calls == []


class _KillsWorkerModel(RecordingModel):
    """Kills decoding worker 1 with SIGKILL in the middle of its fourth training step."""

    killed: int | None = None
    parked: Any = None

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
        if batch_idx == 3:
            self.killed = _kill_worker(self.trainer.train_dataloader, 1, self.parked)  # type: ignore[arg-type]
        return super().training_step(batch, batch_idx)


def test_a_worker_killed_under_lightning_is_a_worker_error(
    pristine: Path, tmp_path: Path, worker_1_parks: Callable[[int], Any], excepthook_calls: list[str]
) -> None:
    dm = StreamVideoDataModule(
        index_file=pristine / "index.json",
        batch_size=2,
        engine=EngineOptions(num_workers=2, kind="workers"),
        plan=PlanOptions(shuffle=False),
    )
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    model = _KillsWorkerModel()
    model.parked = worker_1_parks(4)  # in step 5: Lightning has fetched batch 4 before its step 3 runs
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(WorkerError, match=_KILLED) as caught:
        trainer.fit(model, datamodule=dm)
    match = re.match(_KILLED, str(caught.value))
    assert match is not None and int(match["pid"]) == model.killed
    assert model.stamp_errors == [] and len(model.seen) >= 4
    assert [p for p in psutil.Process().children(recursive=True) if p.pid not in before] == []
    assert excepthook_calls == []


def test_trainer_shutdown_leaves_no_worker_or_decoder(pristine: Path, tmp_path: Path) -> None:
    for persistent in (False, True):
        dm = StreamVideoDataModule(
            index_file=pristine / "index.json",
            batch_size=2,
            engine=EngineOptions(num_workers=2, persistent_workers=persistent, kind="workers"),
        )
        trainer = quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=4)
        before = {p.pid for p in psutil.Process().children(recursive=True)}  # e.g. a forkserver
        trainer.fit(RecordingModel(), datamodule=dm)
        children = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        _gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"workers still running after fit (persistent_workers={persistent}): {alive}"
        assert len(dm.train_dataloader().dataset.decoders) == 0


def test_unknown_on_error_policy_is_rejected(pristine: Path) -> None:
    with pytest.raises(ValueError, match=r"on_error='ignore' is invalid; expected 'raise' or 'skip'"):
        StreamVideoDataModule(index_file=pristine / "index.json", errors=ErrorOptions(on_error="ignore"))  # type: ignore[arg-type]


def test_thorough_check_reports_every_problem_together(pristine: Path, tmp_path: Path) -> None:
    import json

    from lightning_vstream.index import IndexValidationError, metadata_path

    root = _copy(pristine, tmp_path)
    build_index_with_json_tables(root, output=root / "index.json", video_dirs=["videos"], progress=False)
    meta_file = metadata_path(root / "index.json")
    meta = json.loads(meta_file.read_text())
    meta["files"]["videos/scene-0001/CAM_BACK.mp4"]["info"]["codec"] = "not-a-codec"
    meta_file.write_text(json.dumps(meta))
    index = json.loads((root / "index.json").read_text())
    index["videos"]["scene-0003"] = 99  # more frames than the files hold
    (root / "index.json").write_text(json.dumps(index))
    (root / "videos" / "scene-0004" / "CAM_BACK.mp4").unlink()
    with pytest.raises(IndexValidationError) as err:
        load_index(root / "index.json", check="thorough")
    problems = err.value.problems
    assert len(problems) == 4, problems  # the frame-count mismatch is reported for both cameras
    text = str(err.value)
    assert "has 4 problems" in text
    assert "clip 'scene-0001', camera 'CAM_BACK' (CAM_BACK.mp4) uses codec 'not-a-codec'" in text
    assert "clip 'scene-0003' lists 99 frames, but camera 'CAM_BACK' (CAM_BACK.mp4) holds 16" in text
    assert "clip 'scene-0004' is missing camera file(s) ['CAM_BACK']" in text


_FORK_AFTER_GARBAGE = r"""
import gc, multiprocessing, sys
from lightning_vstream.decode.cpu.pyav import PyAVDecoder
gc.disable()
garbage = []
for path in sys.argv[1:]:
    dec = PyAVDecoder(path)
    dec.read()  # FFmpeg's decoding threads are running now
    garbage.append(dec)
# A container no decoder owns any more, kept only by a reference cycle (as an exception's
# traceback keeps one): nothing but the garbage collector can free it.
orphan = PyAVDecoder(sys.argv[1])
orphan.read()
garbage.append((orphan._container, orphan._stream))
orphan._container = orphan._stream = orphan._frames = None
garbage.append(garbage)
del dec, orphan, garbage

def child():
    # Finalizing inherited FFmpeg state here would wait forever for threads that did not
    # survive the fork; the collector must leave everything inherited alone.
    gc.collect()
    sys.exit(10)

process = multiprocessing.get_context("fork").Process(target=child)
process.start()
process.join(30)
if process.exitcode is None:
    process.kill()
print("child exit code", process.exitcode)
sys.exit(0 if process.exitcode == 10 else 1)
"""


def test_fork_after_decoders_became_garbage_does_not_hang(pristine: Path) -> None:
    import subprocess
    import sys

    paths = [str(p) for p in sorted((pristine / "videos" / clip_name(0)).glob("*.mp4"))]
    result = subprocess.run([sys.executable, "-c", _FORK_AFTER_GARBAGE, *paths], timeout=120, capture_output=True)
    assert result.returncode == 0, (result.stdout.decode() + result.stderr.decode())[-2000:]
