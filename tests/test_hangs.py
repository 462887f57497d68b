"""Nothing hangs: a stopped (SIGSTOP) worker of ClipVideoDataModule ends as a WorkerError naming it.

torch's DataLoader ``timeout`` covers only the wait for a batch to be queued; a worker stopped while
it hands over a batch's shared memory blocks the loader inside ``rebuild_storage_fd`` for ever. The
loader's watchdog names the stopped worker's pid within about the timeout.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lightning_vstream import ClipVideoDataModule
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


@pytest.mark.parametrize("round_", range(2))
def test_a_stopped_clip_worker_raises_a_worker_error_naming_its_pid(
    make_dataset: Callable[..., Path], round_: int
) -> None:
    index = make_dataset(clips=4, cameras=1, frames=[9, 9, 9, 9], size=(64, 48), gop=4)
    dm = ClipVideoDataModule(
        index_file=index, clip_frames=3, hop=1, batch_size=1, num_workers=2, timeout=TIMEOUT, seed=round_
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


def test_stopped_workers_is_empty_for_running_workers(make_dataset: Callable[..., Path]) -> None:
    index = make_dataset(clips=2, cameras=1, frames=[9, 9], size=(64, 48), gop=4)
    dm = ClipVideoDataModule(index_file=index, clip_frames=3, hop=2, batch_size=1, num_workers=2, timeout=TIMEOUT)
    dm.setup("fit")
    loader = dm.train_dataloader()
    batches = iter(loader)
    next(batches)
    try:
        assert stopped_workers(batches) == []
        assert sum(1 for _ in batches) >= 1
    finally:
        loader.close()
