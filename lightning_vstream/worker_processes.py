"""Watching the stream loader's worker processes: a death or a stall ends as one clear error.

torch learns that a DataLoader worker died from a ``SIGCHLD`` handler, which raises a bare
``RuntimeError`` in the main thread *wherever it is* when the signal arrives: in the training
step, in Lightning's loop, in the loader. No handler of ours can turn that into a named error.
So the stream loader takes its workers out of torch's ``SIGCHLD`` check as soon as they start
(:func:`watch_workers`) and checks them itself, every :data:`WORKER_CHECK_S` seconds, only while it
waits for a part: a dead worker is then always reported by the loader, as a
:class:`~lightning_vstream.errors.WorkerError` naming the worker and its camera streams.
"""

from __future__ import annotations

import functools
import re
import signal
import time
import weakref
from collections.abc import Callable
from typing import Any

from lightning_vstream.errors import WorkerError

__all__ = [
    "STOP_GRACE_S",
    "TORCH_WORKER_FAILURE",
    "WORKER_CHECK_S",
    "WorkerTimeout",
    "dead_workers",
    "describe_exit",
    "forget_worker_pids",
    "stop_workers",
    "watch_workers",
    "worker_failure",
]


class WorkerTimeout(WorkerError):
    """No part arrived within the loader's timeout (the loader reports it with the worker and its streams)."""


#: Seconds between checks that every worker is alive while the loader waits for a part.
WORKER_CHECK_S = 1.0
#: Seconds a worker gets to exit after SIGTERM, once the loader has failed, before SIGKILL.
STOP_GRACE_S = 2.0
#: What torch raises when a worker stalls past the timeout or dies.
TORCH_WORKER_FAILURE = re.compile(
    r"DataLoader timed out after|DataLoader worker \(pid.*(exited unexpectedly|is killed by signal)"
)


def watch_workers(parts_iter: Any, timeout: float) -> None:
    """Check the workers of ``parts_iter`` while it waits for data, instead of torch's ``SIGCHLD`` handler.

    After this, waiting for a part polls the result queue for at most :data:`WORKER_CHECK_S` seconds
    at a time and checks between polls that every worker is alive (torch's own check, which raises
    ``DataLoader worker (pid(s) ...) exited unexpectedly``), and gives up after ``timeout`` seconds
    (0: never) with a :class:`WorkerTimeout`.
    """
    if not hasattr(parts_iter, "_workers"):
        return  # no worker processes
    forget_worker_pids(parts_iter)
    # A weak reference: the iterator must stay free of reference cycles, since dropping it is what
    # ends its workers (a cycle would keep them alive until the garbage collector runs).
    parts_iter._get_data = functools.partial(_get_part, weakref.ref(parts_iter), timeout)


def _get_part(ref: weakref.ref[Any], timeout: float) -> Any:
    parts_iter = ref()
    assert parts_iter is not None  # it is calling us
    deadline = time.monotonic() + timeout if timeout > 0 else None
    while True:
        wait = WORKER_CHECK_S if deadline is None else max(0.0, min(WORKER_CHECK_S, deadline - time.monotonic()))
        received, data = parts_iter._try_get_data(wait)  # raises when a worker has died
        if received:
            return data
        if deadline is not None and time.monotonic() >= deadline:
            raise WorkerTimeout(f"DataLoader timed out after {timeout:g} seconds")


def forget_worker_pids(parts_iter: Any) -> None:
    """Take the workers of ``parts_iter`` out of torch's ``SIGCHLD`` check, which reports any worker exit as a crash."""
    if not getattr(parts_iter, "_worker_pids_set", False):
        return
    from torch.utils.data._utils import signal_handling

    # Blocked in this thread so that the handler cannot run between the two statements.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    try:
        signal_handling._remove_worker_pids(id(parts_iter))
        parts_iter._worker_pids_set = False
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def dead_workers(parts_iter: Any, *, within: float = 0.0) -> list[tuple[int, int | None, int | None]]:
    """``(worker id, pid, exit code)`` of every worker of ``parts_iter`` that is no longer running.

    Args:
        parts_iter: The DataLoader iterator.
        within: Seconds to wait for a worker to be gone, when none is yet: a worker that is dying
            closes its connections (the loader sees them break) a moment before it can be reaped.
    """
    deadline = time.monotonic() + within
    while True:
        dead = [
            (worker_id, worker.pid, worker.exitcode)
            for worker_id, worker in enumerate(getattr(parts_iter, "_workers", ()))
            if not worker.is_alive()
        ]
        if dead or time.monotonic() >= deadline:
            return dead
        time.sleep(0.02)


def describe_exit(exitcode: int | None) -> str:
    """How a process ended, in words: ``"was killed by signal SIGKILL"``, ``"exited with code 3"``."""
    if exitcode is None:
        return "ended"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by signal {name}"
    return f"exited with code {exitcode}"


def stop_workers(parts_iter: Any) -> None:
    """End the worker processes of ``parts_iter`` (terminate, then kill) and close its queues."""
    workers = list(getattr(parts_iter, "_workers", ()))
    for attempt in range(3):
        try:
            forget_worker_pids(parts_iter)
            break
        except RuntimeError as err:
            # torch's SIGCHLD handler may report the dying worker before its pid is forgotten.
            if attempt == 2 or not TORCH_WORKER_FAILURE.search(str(err)):
                raise
    # Ask first, as torch's own shutdown does: a worker that is receiving an item is handed its shared
    # buffers' file descriptors by this process's resource sharer, and one killed in that handshake
    # makes the sharer's thread print a ConnectionResetError traceback here. Told that the workers are
    # done, a worker finishes the item it is on without decoding the next and leaves at the end marker.
    done = getattr(parts_iter, "_workers_done_event", None)
    if done is not None and any(worker.is_alive() for worker in workers):
        done.set()
        for queue in getattr(parts_iter, "_index_queues", ()):
            try:
                queue.put(None)
            except (OSError, ValueError):  # a queue already closed
                pass
        deadline = time.monotonic() + STOP_GRACE_S
        for worker in workers:
            worker.join(timeout=max(0.0, deadline - time.monotonic()))
    for worker in workers:
        if worker.is_alive():
            worker.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for worker in workers:
        worker.join(timeout=max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            worker.kill()  # SIGTERM ignored, e.g. a handler inherited from the training script
            worker.join()
    shutdown = getattr(parts_iter, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()  # queues and events; the processes are gone, so nothing waits


def worker_failure(
    parts_iter: Any,
    step: int,
    part: int,
    err: BaseException,
    *,
    stalled: bool,
    timeout: float,
    streams: Callable[[int, int], str],
) -> str:
    """The message of a dead or stalled worker: which worker, how it ended, the camera streams it decodes.

    Args:
        parts_iter: The DataLoader's iterator the loader waited on.
        step: The step the loader waited for.
        part: The part of it (the worker that serves it).
        err: What the wait raised.
        stalled: The worker sent nothing for ``timeout`` seconds (else it died or broke its connection).
        timeout: The loader's timeout, in seconds.
        streams: ``(step, worker) -> `` the camera streams that worker decodes at that step.
    """
    waiting = f"while the loader waited for part {part} of step {step}"
    if stalled:
        workers = getattr(parts_iter, "_workers", [])
        pid = f" (pid {workers[part].pid})" if part < len(workers) else ""
        return (
            f"decoding worker {part}{pid} sent nothing for timeout={timeout:g} s {waiting}; it decodes "
            f"{streams(step, part)}. The workers were stopped ({err}). A worker stalls when a file system "
            "stops answering or a decoder hangs: check the files named, or raise `timeout` if decoding is only slow."
        )
    dead = dead_workers(parts_iter, within=STOP_GRACE_S)
    if not dead:
        who = f"a decoding worker broke its connection {waiting} ({type(err).__name__}: {err})"
    else:
        who = "; ".join(
            f"decoding worker {worker} (pid {pid}) {describe_exit(code)} {waiting}; it decodes {streams(step, worker)}"
            for worker, pid, code in dead
        )
    return (
        f"{who}. The other workers were stopped and the DataLoader cannot continue. A worker is usually killed "
        "for memory: check its memory limit (the kernel log lists OOM kills) and the files named."
    )
