"""The one runner of decoding threads (DecodeThreads), its GOP front (GopExecutor) and the decoder table."""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_vstream.decode.base import VideoDecodeError, VideoInfo
from lightning_vstream.decode.cpu.pyav import PyAVDecoder
from lightning_vstream.decode.decoder_table import DecoderTable
from lightning_vstream.decode.gops import GopPlanner, GopTask
from lightning_vstream.decode.threads import DecodeThreads, GopExecutor, ThreadSlot, frames_decoder_tasks
from lightning_vstream.demos.synth import clip_number, read_stamp
from lightning_vstream.errors import WorkerError
from lightning_vstream.indexing import load_index

FRAMES = 40
GOP = 10


def _info(frames: int = 40, keys: tuple[int, ...] = (0, 10, 20, 30)) -> VideoInfo:
    return VideoInfo("h264", 256, 256, (1, 30), tuple(range(frames)), keys, keys, 30.0)


@pytest.fixture(scope="module")
def index_path(make_dataset: Callable[..., Path]) -> Path:
    return make_dataset(clips=3, cameras=2, frames=FRAMES, size=(64, 48), gop=GOP)


# -- the executor with PyAV decoders -----------------------------------------------------------
def _pyav_executor(workers: int, **kwargs: Any) -> GopExecutor:
    return GopExecutor(
        lambda task: frames_decoder_tasks(PyAVDecoder(task.source, info=task.info, threads=1)),
        workers=workers,
        **kwargs,
    )


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_executor_decodes_every_frame_exactly_once_per_gop(index_path: Path, workers: int) -> None:
    index = load_index(index_path)
    rng = random.Random(7)
    planner = GopPlanner()
    wanted: dict[tuple[int, int, int], tuple[str, int]] = {}
    for b, clip in enumerate(index.clips):
        for c, cam in enumerate(clip.cameras):
            frames = [rng.randrange(FRAMES) for _ in range(6)]
            for t, f in enumerate(frames):
                planner.add(str(cam.path), cam.info, f, (b, t, c))
                wanted[(b, t, c)] = (clip.clip_id, f)
    got: dict[Any, tuple[int, torch.Tensor]] = {}
    lock = threading.Lock()

    def deliver(task: GopTask, index: int, frame: torch.Tensor, target: Any) -> None:
        with lock:
            assert target not in got
            got[target] = (index, frame.clone())

    decoded_before: list[int] = []
    with _pyav_executor(workers) as executor:
        tasks = planner.tasks()
        executor.run(tasks, deliver)
        assert executor.tasks_run == len(tasks)
        for sources in executor.open_sources().values():
            assert len(sources) == len(set(sources))
        decoded_before.append(executor.opened)
    assert set(got) == set(wanted)
    for (b, t, c), (clip_id, frame) in wanted.items():
        index, image = got[(b, t, c)]
        stamp = read_stamp(image)
        assert index == frame and (stamp.clip, stamp.camera, stamp.frame) == (clip_number(clip_id), c, frame)
    # Every decoder was opened once per worker that used its file (a GOP never decoded twice).
    assert decoded_before[0] <= len({t.source for t in tasks}) * max(workers, 1)


def test_gop_is_decoded_once_from_its_keyframe(index_path: Path) -> None:
    cam = load_index(index_path).clips[0].cameras[0]
    decoders: list[PyAVDecoder] = []

    def open_decoder(task: GopTask) -> Any:
        decoders.append(PyAVDecoder(task.source, info=task.info, threads=1))
        return frames_decoder_tasks(decoders[-1])

    planner = GopPlanner()
    planner.add_many(str(cam.path), cam.info, [17, 12, 13, 35, 12], range(5))
    with GopExecutor(open_decoder, workers=0) as executor:
        executor.run(planner.tasks(), lambda *args: None)
    # GOP 1 from keyframe 10 to 17 (8 frames) + GOP 3 from 30 to 35 (6 frames).
    assert decoders[0].frames_decoded == 8 + 6


def test_executor_reuses_decoders_across_runs_and_limits_them(index_path: Path) -> None:
    index = load_index(index_path)
    cams = [cam for clip in index.clips for cam in clip.cameras]
    executor = _pyav_executor(1, max_open_per_worker=2)
    try:
        for cam in cams[:2]:
            planner = GopPlanner()
            planner.add(str(cam.path), cam.info, 5, 0)
            executor.run(planner.tasks(), lambda *args: None)
        planner = GopPlanner()
        planner.add(str(cams[0].path), cams[0].info, 25, 0)
        executor.run(planner.tasks(), lambda *args: None)
        assert executor.opened == 2
        planner = GopPlanner()
        planner.add(str(cams[2].path), cams[2].info, 5, 0)
        executor.run(planner.tasks(), lambda *args: None)
        assert executor.open_sources() == {0: [str(cams[0].path), str(cams[2].path)]}
    finally:
        executor.close()


class _Boom:
    def __init__(self, fail_on: int, log: list[int]) -> None:
        self.fail_on, self.log = fail_on, log
        self.closed = False

    def decode_gop(self, task: GopTask, emit: Any) -> None:
        self.log.append(task.gop)
        if task.gop == self.fail_on:
            raise VideoDecodeError(f"gop {task.gop} is broken")
        for f in task.frames:
            emit(f, f)

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("workers", [0, 2])
def test_first_failure_propagates_and_no_thread_is_left(workers: int) -> None:
    info = _info(frames=100, keys=tuple(range(0, 100, 10)))
    log: list[int] = []
    made: list[_Boom] = []

    def open_decoder(task: GopTask) -> _Boom:
        made.append(_Boom(fail_on=3, log=log))
        return made[-1]

    planner = GopPlanner()
    planner.add_many("a", info, [g * 10 + 9 for g in range(10)], range(10))
    executor = GopExecutor(open_decoder, workers=workers)
    with pytest.raises(VideoDecodeError, match=r"gop 3 is broken"):
        executor.run(planner.tasks(), lambda *args: None)
    threads = executor.threads
    assert any(d.closed for d in made)  # the failing decoder was dropped
    # The executor stays usable after a failure.
    ok = GopPlanner()
    ok.add("a", info, 5, 0)
    got: list[Any] = []
    executor.run(ok.tasks(), lambda task, index, frame, target: got.append(frame))
    assert got == [5]
    executor.close()
    assert executor.threads == [] and not any(t.is_alive() for t in threads)


def test_dropped_executor_stops_its_threads() -> None:
    import gc

    executor = GopExecutor(lambda task: _Boom(-1, []), workers=3)
    planner = GopPlanner()
    planner.add("a", _info(), 1, 0)
    executor.run(planner.tasks(), lambda *args: None)
    threads = executor.threads
    assert len(threads) == 3
    del executor
    gc.collect()
    for thread in threads:
        thread.join(timeout=10)
    assert not any(t.is_alive() for t in threads)


def test_executor_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"workers=-1 must be an integer >= 0"):
        GopExecutor(lambda task: _Boom(-1, []), workers=-1)
    with pytest.raises(ValueError, match=r"max_open_per_worker=0 must be a positive integer"):
        GopExecutor(lambda task: _Boom(-1, []), max_open_per_worker=0)


# -- frames decoded in place, whole GOPs per thread ----------------------------------------------------
class _FakeDecoder:
    """Returns frames whose value is their index (into ``out`` when given); records which frames it decoded."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.got: list[int] = []
        self.frames_decoded = 0

    def get(self, index: int, out: torch.Tensor | None = None) -> torch.Tensor:
        if index == self.fail_at:
            raise RuntimeError(f"frame {index} is damaged")
        self.got.append(index)
        self.frames_decoded += 1
        frame = torch.full((3, 2, 2), index, dtype=torch.uint8)
        if out is None:
            return frame
        out.copy_(frame)
        return out

    def close(self) -> None:
        pass


def test_frames_are_decoded_in_place_and_whole_gops_stay_on_one_thread() -> None:
    info = VideoInfo("h264", 2, 2, (1, 10), tuple(range(40)), (0, 10, 20, 30), (0, 10, 20, 30), 10.0)
    wanted = [35, 3, 12, 5, 27, 12, 21]
    planner = GopPlanner()
    planner.add_many("a.mp4", info, wanted, range(len(wanted)))
    made: list[_FakeDecoder] = []

    def open_decoder(task: GopTask) -> Any:
        made.append(_FakeDecoder())
        return frames_decoder_tasks(made[-1])

    out = torch.zeros((len(wanted), 3, 2, 2), dtype=torch.uint8)
    copies: list[int] = []

    def deliver(task: GopTask, index: int, frame: torch.Tensor, target: Any) -> None:
        if frame.data_ptr() != out[target].data_ptr():
            copies.append(target)
            out[target].copy_(frame)

    with GopExecutor(open_decoder, workers=2) as executor:
        executor.run(planner.tasks(), deliver, into=lambda task, index: out[task.targets[task.frames.index(index)][0]])
        assert out[:, 0, 0, 0].tolist() == wanted
        assert copies == [5]  # only the repeat of frame 12 was copied; every other frame was decoded in place
        assert sorted(index for d in made for index in d.got) == [3, 5, 12, 21, 27, 35]  # each frame decoded once
        for dec in made:  # a decoder takes whole GOPs, in ascending order
            assert dec.got == sorted(dec.got)
        assert executor.frames_decoded == 6 and executor.opened == len(made) <= 2
        broken = GopPlanner()
        broken.add_many("b.mp4", info, [21, 3], [0, 1])
        made.clear()
        with pytest.raises(RuntimeError, match="frame 21 is damaged"):
            executor.open_decoder = lambda task: frames_decoder_tasks(_FakeDecoder(fail_at=21))
            executor.run(broken.tasks(), deliver)
        # The thread whose decoder raised dropped it (the other thread's, if it started GOP 0 first, stays).
        assert [s for sources in executor.open_sources().values() for s in sources].count("b.mp4") <= 1


def test_the_executor_keeps_decoders_of_at_most_max_open_sources_streams() -> None:
    info = _info()
    with GopExecutor(lambda task: frames_decoder_tasks(_FakeDecoder()), workers=2, max_open_sources=2) as executor:
        for source in ["a", "b", "c", "a"]:
            planner = GopPlanner()
            planner.add_many(source, info, [1, 11, 21], range(3))
            executor.run(planner.tasks(), lambda *args: None)
        assert len(executor) == 2
        assert {s for sources in executor.open_sources().values() for s in sources} == {"c", "a"}


# -- the decoder table -------------------------------------------------------------------------
def test_decoder_table_is_a_bounded_lru_with_versions(make_dataset: Callable[..., Path]) -> None:
    index = load_index(make_dataset(clips=3, cameras=2, frames=FRAMES, size=(64, 48), gop=GOP))
    paths = [clip.cameras[0].path for clip in index]
    table = DecoderTable(limit=2)

    def opener(path: Path) -> Callable[[], PyAVDecoder]:
        return lambda: PyAVDecoder(path)

    first = table.get("a", opener(paths[0]))
    assert table.get("a", opener(paths[0])) is first
    first.get(3)
    table.get("b", opener(paths[1]))
    table.get("a", opener(paths[0]))  # most recent again
    table.get("c", opener(paths[2]))  # closes b's
    assert "a" in table and "b" not in table and len(table) == 2 and table.opened == 3
    assert table.frames_decoded == 4
    again = table.get("a", opener(paths[1]), version="another clip")  # another version: reopened
    assert again is not first and table.opened == 4 and table.closed == 2
    table.close_all()
    assert len(table) == 0 and table.frames_decoded == 4 and table.counts().files_opened == 4


def test_decoder_table_counts_open_and_closed_decoders_with_the_readers_errors() -> None:
    class Counting:
        def __init__(self, decoded: int, seeks: int, skipped: int) -> None:
            self.frames_decoded, self.seeks, self.packets_skipped = decoded, seeks, skipped

        def close(self) -> None:
            pass

    table = DecoderTable()
    table.get("a", lambda: Counting(5, 1, 2))
    table.get("b", lambda: Counting(7, 0, 3))
    table.get("c", object)  # a decoder without counters counts zero
    table.drop("a")  # closed: its counters stay
    counts = table.counts(read_errors=4)
    assert (counts.frames_decoded, counts.seeks, counts.packets_skipped) == (12, 1, 5)
    assert (counts.files_opened, counts.read_errors) == (3, 4)
    assert table.counts().read_errors == 0 and table.frames_decoded == 12


# -- the runner: bodies, shutdown, forks ---------------------------------------------------------------
def test_bodies_run_once_per_thread_and_stop_when_their_owner_says() -> None:
    stop = threading.Event()
    seen: list[int] = []

    class Owner:
        def stop(self) -> None:
            stop.set()

    owner = Owner()
    pool = DecodeThreads(threads=3, name="vstream-test", stop=owner.stop)

    def body(slot: ThreadSlot) -> None:
        seen.append(slot.number)
        stop.wait(30)

    pool.start(body)
    threads = pool.threads
    assert sorted(t.name for t in threads) == ["vstream-test-0", "vstream-test-1", "vstream-test-2"]
    assert pool.close(timeout=30) == []  # close() asked the owner to stop its bodies, then joined
    assert sorted(seen) == [0, 1, 2] and not any(t.is_alive() for t in threads) and pool.threads == []


def test_a_thread_that_does_not_stop_is_reported_not_waited_for() -> None:
    release = threading.Event()
    pool = DecodeThreads(threads=1, name="vstream-stuck")
    pool.start(lambda slot: release.wait(30))
    stuck = pool.close(timeout=0.0)
    try:
        assert [t.name for t in stuck] == ["vstream-stuck-0"] and stuck[0].is_alive()
    finally:
        release.set()
        stuck[0].join(timeout=30)


def test_a_timeout_names_the_threads_that_did_not_finish() -> None:
    release = threading.Event()
    pool = DecodeThreads(threads=2, name="vstream-slow")
    try:
        with pytest.raises(WorkerError, match=r"1 of 2 decoding threads did not finish within timeout=0\.2 s"):
            pool.run([[(0, lambda slot: None)], [(1, lambda slot: release.wait(30))]], timeout=0.2)
    finally:
        release.set()
        pool.close(timeout=30)


def test_jobs_run_inline_without_threads() -> None:
    pool = DecodeThreads(threads=0, name="vstream-inline")
    caller = threading.current_thread()
    seen: list[Any] = []
    pool.run([[(0, lambda slot: seen.append(threading.current_thread()))], [(1, lambda slot: seen.append(slot))]])
    assert seen[0] is caller and isinstance(seen[1], ThreadSlot) and pool.threads == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_process_starts_threads_of_its_own() -> None:
    pool = DecodeThreads(threads=2, name="vstream-fork")
    pool.run([[(0, lambda slot: None)], [(1, lambda slot: None)]])
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's threads do not exist here, the pool starts its own
        try:
            seen: list[int] = []
            pool.run([[(0, lambda slot: seen.append(slot.number))], [(1, lambda slot: seen.append(slot.number))]])
            os.write(write, bytes(sorted(seen)))
        finally:
            os._exit(0)
    os.close(write)
    got = os.read(read, 8)
    os.close(read)
    os.waitpid(pid, 0)
    pool.close()
    assert list(got) == [0, 1]
