"""Nothing hangs: a stopped (SIGSTOP) worker of ClipVideoDataModule ends as a WorkerError naming it.

torch's DataLoader ``timeout`` covers only the wait for a batch to be queued; a worker stopped while
it hands over a batch's shared memory blocks the loader inside ``rebuild_storage_fd`` for ever. The
loader's watchdog names the stopped worker's pid within about the timeout.
"""

from __future__ import annotations

import os
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lightning_vstream import ClipVideoDataModule, EngineOptions, ErrorOptions, SamplingOptions
from lightning_vstream.clips.loader import stopped_workers
from lightning_vstream.errors import WorkerError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/stat")

TIMEOUT = 3.0


def _resume(pid: int) -> None:
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


@pytest.mark.timeout(90)
@pytest.mark.parametrize("round_", range(2))
def test_a_stopped_clip_worker_raises_a_worker_error_naming_its_pid(
    make_dataset: Callable[..., Path], round_: int
) -> None:
    index = make_dataset(clips=4, cameras=1, frames=[9, 9, 9, 9], size=(64, 48), gop=4)
    dm = ClipVideoDataModule(
        index_file=index,
        sampling=SamplingOptions(clip_frames=3, hop=1),
        batch_size=1,
        engine=EngineOptions(num_workers=2),
        errors=ErrorOptions(timeout=TIMEOUT),
        seed=round_,
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    batches = iter(loader)
    next(batches)
    pid = batches._workers[round_ % 2].pid  # type: ignore[attr-defined]
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 2
        while not stopped_workers(batches) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (round_ % 2, pid) in stopped_workers(batches)
        start = time.monotonic()
        with pytest.raises(WorkerError, match=rf"decoding worker {round_ % 2} \(pid {pid}\).*stopped"):
            for _ in batches:
                pass
        took = time.monotonic() - start
        assert took < TIMEOUT + 6, took
    finally:
        _resume(pid)
        loader.close()


@pytest.mark.timeout(90)
def test_stopped_workers_is_empty_for_running_workers(make_dataset: Callable[..., Path]) -> None:
    index = make_dataset(clips=2, cameras=1, frames=[9, 9], size=(64, 48), gop=4)
    dm = ClipVideoDataModule(
        index_file=index,
        sampling=SamplingOptions(clip_frames=3, hop=2),
        batch_size=1,
        engine=EngineOptions(num_workers=2),
        errors=ErrorOptions(timeout=TIMEOUT),
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    batches = iter(loader)
    next(batches)
    try:
        assert stopped_workers(batches) == []
        assert sum(1 for _ in batches) >= 1
    finally:
        loader.close()


@pytest.mark.timeout(90)
def test_a_batch_cut_mid_write_by_stopped_workers_ends_as_a_worker_error(make_dataset: Callable[..., Path]) -> None:
    """Both workers stopped with the result pipe holding the start of a message: the read would wait for ever.

    Iterated on a thread of its own (no SIGCHLD handler of torch's breaks the read there): the watchdog kills the
    stopped workers, and when the read still waits, closes the last write end.
    """
    index = make_dataset(clips=4, cameras=1, frames=[9, 9, 9, 9], size=(64, 48), gop=4)
    dm = ClipVideoDataModule(
        index_file=index,
        sampling=SamplingOptions(clip_frames=3, hop=1),
        batch_size=1,
        engine=EngineOptions(num_workers=2),
        errors=ErrorOptions(timeout=TIMEOUT),
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    outcome: list[BaseException | None] = []
    ready = threading.Event()
    go = threading.Event()

    def consume() -> None:
        batches = iter(loader)
        next(batches)
        ready.set()
        go.wait(10)
        try:
            for _ in batches:
                pass
            outcome.append(None)
        except BaseException as err:  # reported below, on the test's thread
            outcome.append(err)

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    assert ready.wait(30)
    batches = loader._iterator  # type: ignore[attr-defined]
    pids = [worker.pid for worker in batches._workers]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        # The header of a 1,000-byte message, and nothing after it.
        os.write(batches._worker_result_queue._writer.fileno(), struct.pack("!i", 1000))
        start = time.monotonic()
        go.set()
        reader.join(TIMEOUT + 20)
        assert not reader.is_alive(), "the loader hung on a batch cut mid-write"
        assert len(outcome) == 1 and isinstance(outcome[0], WorkerError), outcome
        assert all(f"(pid {pid})" in str(outcome[0]) for pid in pids), outcome[0]
        assert time.monotonic() - start < TIMEOUT + 12
    finally:
        for pid in pids:
            _resume(pid)
        loader.close()
