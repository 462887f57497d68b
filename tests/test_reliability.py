"""Bad data: errors that name the file, or skips that are counted; no hangs, no leftover workers."""

from __future__ import annotations

import os
import random
import re
import signal
import threading
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import psutil
import pytest
from _stream_models import RecordingModel

from lightning_vstream.decode.base import VideoDecodeError
from lightning_vstream.decode.cpu import PyAVDecoder
from lightning_vstream.demos.synth import clip_name, read_stamp, write_stamped_video
from lightning_vstream.errors import WorkerError
from lightning_vstream.indexing import build_index, load_index
from lightning_vstream.options import DecodeOptions, ErrorOptions
from lightning_vstream.stream.engine_loader import build_engine_loader
from lightning_vstream.stream.parts import StreamTask
from lightning_vstream.stream.sampler import StreamSampler
from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule
from lightning_vstream.stream.worker import StreamDataset
from lightning_vstream.stream.worker_loader import StreamDataLoader

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
        num_workers=num_workers,
        on_error=on_error,  # type: ignore[arg-type]
        shuffle=False,
        engine="workers",
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
    assert (stats.skipped_clips, stats.bad_files) == (1, 1)
    assert stats.read_errors >= 1
    # The damaged clip stops at the failure and never resumes; other clips are complete prefixes.
    bad = delivered.get(clip_name(BAD_CLIP), [])
    assert bad == list(range(len(bad))) and len(bad) < LENGTHS[BAD_CLIP]
    for frames in delivered.values():
        assert frames == list(range(len(frames)))
    # Training drops the remainder, so the plan has no padding: every invalid slot-step was lost
    # to the skip and is counted once; only valid slots count as delivered.
    invalid = sum(int((~b["valid"]).sum()) for b in batches)
    assert stats.skipped_samples == invalid >= 1
    assert stats.frames_delivered == (2 * len(batches) - invalid) * 2


def test_skipping_moves_the_slot_to_its_next_clip(pristine: Path, tmp_path: Path) -> None:
    root = _copy(pristine, tmp_path)
    _truncate(_bad_file(root), keep=0.3)
    batches, _ = _stream(root, num_workers=0, on_error="skip")
    # Find the slot that followed the bad clip and check what it reads right after.
    for step, batch in enumerate(batches):  # noqa: B007 - step is used after the loop
        if clip_name(BAD_CLIP) in batch["clip_id"]:
            slot = batch["clip_id"].index(clip_name(BAD_CLIP))
            break
    else:
        pytest.fail("the damaged clip was never started")
    following = [(b["clip_id"][slot], bool(b["is_first"][slot]), bool(b["valid"][slot])) for b in batches[step:]]
    after = [f for f in following if f[0] != clip_name(BAD_CLIP)]
    first_valid = next(f for f in after if f[2])
    assert first_valid[1] is True  # the next clip starts flagged is_first
    skipped = sum(1 for f in following[: following.index(first_valid)] if not f[2])
    assert skipped <= 1  # without workers nothing was prefetched: the slot moves on at once


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


def _skip_loader(
    root: Path, *, num_workers: int, prefetch: int = 2, remainder: str = "drop", engine_threads: int = 0
) -> Any:
    """The worker loader (``engine_threads=0``) or the thread engine on the same plan, under on_error="skip".

    Both decode with one FFmpeg thread per decoder (the engine's CPU default), so the damaged packet
    stops both at the same frame (frame threads read packets ahead, and stop earlier).
    """
    index = load_index(root / "index.json")
    sampler = StreamSampler(
        LENGTHS,
        num_cameras=2,
        batch_size=2,
        shuffle=False,
        remainder=remainder,  # type: ignore[arg-type]
        num_parts=1 if engine_threads else max(1, num_workers),
    )
    if engine_threads:
        return build_engine_loader(
            index,
            sampler,
            "cpu",
            threads=engine_threads,
            prefetch=prefetch,
            errors=ErrorOptions(on_error="skip"),
            decode=DecodeOptions(decoder_threads=1),
        )
    return StreamDataLoader(
        StreamDataset(index=index, errors=ErrorOptions(on_error="skip"), decode=DecodeOptions(decoder_threads=1)),
        sampler=sampler,
        num_workers=num_workers,
        prefetch_factor=prefetch if num_workers else None,
    )


def _stamp(stamp: Any) -> tuple[int, int, int]:
    return (stamp.clip, stamp.camera, stamp.frame)


def _record(batch: dict[str, Any]) -> tuple[Any, ...]:
    """Everything a batch tells the model, frames as the stamps they carry."""
    stamps = tuple(
        tuple(_stamp(read_stamp(batch["frames"][slot, cam])) for cam in range(2)) if batch["valid"][slot] else None
        for slot in range(2)
    )
    assert all(not batch["frames"][slot].any() for slot in range(2) if not batch["valid"][slot])
    return (
        int(batch["step"]),
        tuple(batch["clip_id"]),
        tuple(batch["frame_index"].tolist()),
        tuple(batch["valid"].tolist()),
        tuple(batch["is_first"].tolist()),
        stamps,
    )


@pytest.mark.parametrize(
    ("num_workers", "engine_threads"),
    [(0, 0), (2, 0), (0, 1), (0, 3)],
    ids=["workers0", "workers2", "engine1", "engine3"],
)
def test_resume_around_a_skip_delivers_what_the_uninterrupted_run_did(
    pristine: Path, tmp_path: Path, num_workers: int, engine_threads: int
) -> None:
    root = _copy(pristine, tmp_path)
    _truncate(_bad_file(root))
    options = {"num_workers": num_workers, "engine_threads": engine_threads}
    full = [_record(b) for b in _skip_loader(root, **options)]
    failed_at = next(i for i, b in enumerate(full) if not all(b[3]))
    # Resume before, at and just after the failing step, inside the prefetch window (steps issued
    # before the skip was found still read the clip given up), and after it.
    for resume_at in range(failed_at - 1, failed_at + 5):
        first = _skip_loader(root, **options)
        it = iter(first)
        produced = [next(it) for _ in range(resume_at + 2)]  # the loop has prefetched two more
        first.mark_consumed(produced[resume_at - 1])
        state = first.state_dict()
        assert state["step"] == resume_at
        del it, produced
        first.close()
        resumed = _skip_loader(root, **options)
        resumed.load_state_dict(state)
        assert [_record(b) for b in resumed] == full[resume_at:], f"resumed at step {resume_at}"


def test_the_engine_delivers_the_same_batches_around_a_skip_whatever_its_threads(
    pristine: Path, tmp_path: Path
) -> None:
    root = _copy(pristine, tmp_path)
    _truncate(_bad_file(root))
    runs = {
        threads: [_record(b) for b in _skip_loader(root, num_workers=0, engine_threads=threads)]
        for threads in (1, 2, 4)
    }
    runs[0] = [_record(b) for b in _skip_loader(root, num_workers=0, engine_threads=4)]  # and again
    assert runs[1] == runs[2] == runs[4] == runs[0]
    assert any(not all(valid) for _, _, _, valid, _, _ in runs[1])  # the skip happened


def test_skip_counters_are_exact_for_every_worker_count_and_prefetch_depth(pristine: Path, tmp_path: Path) -> None:
    root = _copy(pristine, tmp_path)
    _truncate(_bad_file(root))
    bad = clip_name(BAD_CLIP)
    lost = set()
    settings = [(0, 2, 0), (1, 1, 0), (1, 2, 0), (1, 4, 0), (2, 1, 0), (2, 2, 0), (2, 4, 0), (0, 1, 2), (0, 4, 3)]
    for num_workers, prefetch, engine_threads in settings:
        # Evaluation order ("pad"): every frame is due once, so the loss is exact and the same in
        # every setting: the frames of the damaged clip from the failure on.
        loader = _skip_loader(
            root, num_workers=num_workers, prefetch=prefetch, remainder="pad", engine_threads=engine_threads
        )
        batches = list(loader)
        valid = sum(int(b["valid"].sum()) for b in batches)
        delivered_bad = sum(1 for b in batches for slot in range(2) if b["valid"][slot] and b["clip_id"][slot] == bad)
        stats = loader.stats
        setting = f"num_workers={num_workers}, prefetch_factor={prefetch}, engine_threads={engine_threads}"
        assert stats.skipped_samples == LENGTHS[BAD_CLIP] - delivered_bad, setting
        assert valid + stats.skipped_samples == sum(LENGTHS), setting
        assert stats.frames_delivered == valid * 2, setting
        assert (stats.skipped_clips, stats.bad_files) == (1, 1), setting
        lost.add(stats.skipped_samples)
        # Training order ("drop"): no padding in the plan, so every invalid slot-step is a lost one.
        loader = _skip_loader(root, num_workers=num_workers, prefetch=prefetch, engine_threads=engine_threads)
        batches = list(loader)
        invalid = sum(int((~b["valid"]).sum()) for b in batches)
        assert loader.stats.skipped_samples == invalid, setting
        assert loader.stats.frames_delivered == (2 * len(batches) - invalid) * 2, setting
    assert len(lost) == 1 and lost.pop() > 10


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
        r"'[^']+CAM_BACK_LEFT\.mp4'\), slot 1 CAM_BACK_LEFT \(clip 'scene-\d+', frame 2, '[^']+'\)\. The workers were "
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


def _kill_worker(loader: StreamDataLoader, worker_id: int) -> int:
    """SIGKILL one decoding worker and wait until it is dead (not reaped): torch's SIGCHLD has been sent then."""
    pid = next(pid for pid, wid in loader._worker_stats if wid == worker_id)
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
    pristine: Path, persistent: bool
) -> None:
    index = load_index(pristine / "index.json")
    sampler = StreamSampler(LENGTHS, num_cameras=2, batch_size=2, num_parts=2, shuffle=False)
    loader = StreamDataLoader(StreamDataset(index=index), sampler=sampler, num_workers=2, persistent_workers=persistent)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    killed = None
    with pytest.raises(WorkerError, match=_KILLED) as caught:
        for step, _ in enumerate(loader):
            if step == 3:
                killed = _kill_worker(loader, 1)
                # The signal arrived while this loop body runs: torch's own handler would raise its
                # RuntimeError right here. Give pending handlers bytecodes to run on.
                assert sum(range(10_000)) > 0
    match = re.match(_KILLED, str(caught.value))
    assert match is not None and int(match["pid"]) == killed
    assert [p for p in psutil.Process().children(recursive=True) if p.pid not in before] == []


class _KillsWorkerModel(RecordingModel):
    """Kills decoding worker 1 with SIGKILL in the middle of its fourth training step."""

    killed: int | None = None

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
        if batch_idx == 3:
            self.killed = _kill_worker(self.trainer.train_dataloader, 1)  # type: ignore[arg-type]
        return super().training_step(batch, batch_idx)


def test_a_worker_killed_under_lightning_is_a_worker_error(pristine: Path, tmp_path: Path) -> None:
    dm = StreamVideoDataModule(
        index_file=pristine / "index.json", batch_size=2, num_workers=2, shuffle=False, engine="workers"
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    model = _KillsWorkerModel()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(WorkerError, match=_KILLED) as caught:
        trainer.fit(model, datamodule=dm)
    match = re.match(_KILLED, str(caught.value))
    assert match is not None and int(match["pid"]) == model.killed
    assert model.stamp_errors == [] and len(model.seen) >= 4
    assert [p for p in psutil.Process().children(recursive=True) if p.pid not in before] == []


def test_trainer_shutdown_leaves_no_worker_or_decoder(pristine: Path, tmp_path: Path) -> None:
    for persistent in (False, True):
        dm = StreamVideoDataModule(
            index_file=pristine / "index.json",
            batch_size=2,
            num_workers=2,
            persistent_workers=persistent,
            engine="workers",
        )
        trainer = pl.Trainer(
            accelerator="cpu",
            max_epochs=1,
            limit_train_batches=4,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
        )
        before = {p.pid for p in psutil.Process().children(recursive=True)}  # e.g. a forkserver
        trainer.fit(RecordingModel(), datamodule=dm)
        children = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        _gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"workers still running after fit (persistent_workers={persistent}): {alive}"
        assert dm.train_dataloader().dataset.open_files == 0


def test_unknown_on_error_policy_is_rejected(pristine: Path) -> None:
    with pytest.raises(ValueError, match=r"on_error='ignore' is invalid; expected 'raise' or 'skip'"):
        StreamVideoDataModule(index_file=pristine / "index.json", on_error="ignore")  # type: ignore[arg-type]


def test_thorough_check_reports_every_problem_together(pristine: Path, tmp_path: Path) -> None:
    import json

    from lightning_vstream.index import IndexValidationError, metadata_path
    from lightning_vstream.indexing import build_index

    root = _copy(pristine, tmp_path)
    build_index(root, output=root / "index.json", video_dirs=["videos"], progress=False, table_format="json")
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
from lightning_vstream.decode.cpu import PyAVDecoder
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
