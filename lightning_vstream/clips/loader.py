"""ClipDataLoader: the StatefulDataLoader of ClipVideoDataModule, with its workers' counters.

Imported when the DataModule builds a loader (torchdata is not needed before that).

Every batch wait has a deadline. torch's own ``timeout`` covers only the wait for a batch to be
queued: a worker stopped (``SIGSTOP``, a frozen container) after it queued a batch but before it
handed over the batch's shared-memory file descriptors blocks the receiving process inside
``rebuild_storage_fd`` for ever. So while the loader waits, a watchdog thread checks at the
deadline which workers are stopped (``/proc/PID/stat`` state ``T``), kills them (which ends the
blocked receive) and the wait ends as a :class:`~lightning_vstream.errors.WorkerError` naming
each stopped worker and its pid. A worker stopped half-way through writing a batch to the result
pipe leaves the receive waiting for bytes no one sends: if the wait has not ended
:data:`WATCHDOG_ESCALATE_S` after the kill, the watchdog ends the other workers and closes this
process's own write end, so the read meets the end of the pipe.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import weakref
from collections.abc import Iterable
from typing import Any

from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_vstream.clips.epochs import REMOTE_FIELDS, STAT_FIELDS, EpochClipDataset
from lightning_vstream.decode.counters import DecodeStats
from lightning_vstream.errors import WorkerError
from lightning_vstream.storage.stats import StorageStats
from lightning_vstream.worker_processes import stop_workers

__all__ = ["ClipDataLoader", "stopped_workers"]

#: Seconds past the timeout the watchdog waits before it looks for stopped workers.
WATCHDOG_GRACE_S = 0.5
#: Seconds the watchdog waits, once it killed stopped workers, before it ends the other workers too.
WATCHDOG_ESCALATE_S = 2.0


def stopped_workers(parts_iter: Any) -> list[tuple[int, int]]:
    """``(worker id, pid)`` of every worker of ``parts_iter`` that is stopped (``SIGSTOP``, traced).

    Example:
        >>> stopped_workers(object())
        []
    """
    stopped = []
    for worker_id, worker in enumerate(getattr(parts_iter, "_workers", ())):
        pid = worker.pid
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                state = stat.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # gone, or no /proc: torch's own checks report a dead worker
        if state in (b"T", b"t"):
            stopped.append((worker_id, pid))
    return stopped


def _watched_get(ref: weakref.ref[Any], timeout: float) -> Any:
    parts_iter = ref()
    assert parts_iter is not None  # it is calling us
    found: list[tuple[int, int]] = []
    fired = threading.Event()
    returned = threading.Event()

    def watchdog() -> None:
        if returned.wait(timeout + WATCHDOG_GRACE_S):
            return
        fired.set()
        found.extend(stopped_workers(parts_iter))
        _kill(pid for _, pid in found)  # ends the handover the receiving thread is blocked in
        if not found or returned.wait(WATCHDOG_ESCALATE_S):
            return
        # Still blocked: a stopped worker had begun writing a batch to the result pipe, and the other workers
        # and this process keep its write end open, so the read waits for bytes that never come. With every
        # write end closed the read ends (EOFError), and the wait with it.
        _kill(worker.pid for worker in getattr(parts_iter, "_workers", ()))
        writer = getattr(getattr(parts_iter, "_worker_result_queue", None), "_writer", None)
        if writer is not None:
            writer.close()

    guard = threading.Thread(target=watchdog, name="vstream-clip-loader-watchdog", daemon=True)
    guard.start()
    try:
        data = type(parts_iter)._get_data(parts_iter)
    except Exception as err:
        returned.set()
        stopped = found if fired.is_set() else stopped_workers(parts_iter)
        if not stopped:
            raise
        raise WorkerError(_stopped_message(parts_iter, stopped, timeout)) from err
    returned.set()
    if fired.is_set() and found:  # a batch got through, but a worker had to be killed
        raise WorkerError(_stopped_message(parts_iter, found, timeout))
    return data


def _kill(pids: Iterable[int | None]) -> None:
    for pid in pids:
        if pid is None:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _stopped_message(parts_iter: Any, stopped: list[tuple[int, int]], timeout: float) -> str:
    try:
        stop_workers(parts_iter)
    except Exception:
        pass
    who = "; ".join(f"decoding worker {worker} (pid {pid})" for worker, pid in stopped)
    return (
        f"{who} of ClipVideoDataModule is stopped (process state T: SIGSTOP, a debugger or a frozen "
        f"container) and sent no batch within timeout={timeout:g} s. The workers were stopped and the "
        "DataLoader cannot continue: resume the process (SIGCONT) or find what froze it."
    )


class ClipDataLoader(StatefulDataLoader):
    """The ``StatefulDataLoader`` of :class:`~lightning_vstream.ClipVideoDataModule`, with its workers' counters
    in :attr:`stats` (what :class:`~lightning_vstream.callbacks.StreamThroughputMonitor` logs)."""

    dataset: EpochClipDataset

    def _get_iterator(self) -> Any:
        iterator = super()._get_iterator()
        if self.timeout > 0 and hasattr(iterator, "_workers") and hasattr(type(iterator), "_get_data"):
            # A weak reference: a cycle would keep the workers alive until the garbage collector runs.
            iterator._get_data = functools.partial(_watched_get, weakref.ref(iterator), self.timeout)
        return iterator

    @property
    def stats(self) -> DecodeStats:
        """What every worker (and this process) decoded, delivered and skipped since the loader was built."""
        values = self.dataset.counters.sum(dim=0).tolist()
        totals = dict(zip(STAT_FIELDS, values))
        remote = StorageStats(**dict(zip(REMOTE_FIELDS, values[len(STAT_FIELDS) :])))
        return DecodeStats(**totals, remote=remote)

    def close(self) -> None:
        """End persistent workers and close this process's decoders (they reopen lazily)."""
        iterator = getattr(self, "_iterator", None)
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()
        self._iterator = None
        self.dataset.close()
