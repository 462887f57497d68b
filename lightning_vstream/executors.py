"""Where data-preparation work runs: this process, a local process pool, or a Ray cluster.

:func:`map_ordered` applies a picklable function to every item and gives the results back in the
order of the items, whatever ran them; results are small records, the work itself (probing,
encoding) reads and writes files in the task. A task that raises, or whose process dies, is
retried ``retries`` times (``on_retry`` hears of each retry) and then named by the caller's
``describe(item)`` in an :class:`ExecutorError`. When the call ends, by an error or an interrupt
too, no task of it is left running: pending tasks are cancelled and waited for.

Example::

    >>> map_ordered(abs, [-1, 2], executor="local", workers=1)
    [1, 2]
"""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Literal, TypeVar

from lightning_vstream.errors import ConfigurationError, VStreamError

__all__ = ["EXECUTORS", "Executor", "ExecutorError", "check_executor", "map_ordered", "start_local_ray"]

Executor = Literal["local", "ray"]
EXECUTORS: tuple[str, ...] = ("local", "ray")
T = TypeVar("T")
R = TypeVar("R")


class ExecutorError(VStreamError, RuntimeError):
    """A task failed on every try; the message names its item and the cause."""


def check_executor(executor: str, workers: int) -> None:
    """Refuse an unknown executor or a number of workers that is not a positive integer.

    Raises:
        ConfigurationError: Names the argument, the value and what is accepted.

    Example::

        >>> check_executor("ray", 1)
    """
    if executor not in EXECUTORS:
        raise ConfigurationError(f"executor={executor!r} is not supported; use one of {list(EXECUTORS)}.")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigurationError(f"workers={workers!r} must be a positive number of processes.")


def map_ordered(
    fn: Callable[[T], R],
    items: Sequence[T],
    *,
    executor: str = "local",
    workers: int = 1,
    retries: int = 2,
    describe: Callable[[T], str] = repr,
    on_done: Callable[[], None] | None = None,
    on_retry: Callable[[str, BaseException], None] | None = None,
    no_retry: tuple[type[Exception], ...] = (),
    chunk_size: int | None = 1,
    stall_timeout: float | None = 600.0,
) -> list[R]:
    """``[fn(item) for item in items]``, run in this process, a process pool or Ray tasks.

    Args:
        fn: A module-level (picklable) function.
        items: Its arguments, one call each.
        executor: ``"local"`` (``workers`` processes; 1 runs here) or ``"ray"`` (tasks on the
            cluster at ``RAY_ADDRESS``, or a local one started for the call).
        workers: Local processes (ignored by Ray, which uses the cluster's CPUs).
        retries: Extra tries of a failed task before it is named.
        describe: Names an item in the error (file, clip, camera).
        on_done: Called once per finished item (a progress bar).
        on_retry: Called with ``describe(item)`` and the error each time a failed task is tried again.
        no_retry: Errors a retry would only repeat (a malformed input): raised as they are, at once,
            with their own message, which must name the item.
        chunk_size: Items sent per task (1: one task each). ``None`` picks about four tasks per
            worker, so cheap items (probing a file) do not pay a task's overhead each. A failed
            chunk is retried whole; its error names every item in it.
        stall_timeout: On Ray, seconds without any task finishing after which the call gives up
            (a hung cluster); None waits as long as tasks run (encoding a long video can take hours).

    Returns:
        The results, in the order of ``items``.

    Raises:
        ExecutorError: A task failed ``retries + 1`` times (named, with its cause).
        Exception: A task raised one of ``no_retry`` (the task's own error, from any executor).
        KeyboardInterrupt: Interrupted; the pending tasks are cancelled first.

    Example::

        >>> map_ordered(abs, [-3], executor="local")
        [3]
    """
    check_executor(executor, workers)
    if chunk_size != 1 and len(items) > 1:
        return _map_chunked(
            fn, items, executor, workers, retries, describe, on_done, on_retry, no_retry, chunk_size, stall_timeout
        )
    if executor == "ray":
        return _map_ray(
            fn,
            items,
            retries=retries,
            describe=describe,
            on_done=on_done,
            on_retry=on_retry,
            no_retry=no_retry,
            stall_timeout=stall_timeout,
        )
    if workers == 1 or len(items) <= 1:
        return [_call_retrying(fn, item, retries, describe, on_done, on_retry, no_retry) for item in items]
    context = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(max_workers=min(workers, len(items)), mp_context=context) as pool:
        futures = [pool.submit(fn, item) for item in items]
        results: list[R] = []
        try:
            for item, future in zip(items, futures):
                try:
                    results.append(future.result())
                except no_retry:
                    raise
                except Exception as err:
                    if retries < 1:
                        raise ExecutorError(f"{describe(item)}: failed 1 time(s): {err}") from err
                    if on_retry is not None:
                        on_retry(describe(item), err)
                    # Retried here: a pool whose process died is broken for the tasks after it too.
                    results.append(_call_retrying(fn, item, retries, describe, None, on_retry, no_retry, tried=1))
                if on_done is not None:
                    on_done()
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    return results


def _call_retrying(
    fn: Callable[[T], R],
    item: T,
    retries: int,
    describe: Callable[[T], str],
    on_done: Any,
    on_retry: Callable[[str, BaseException], None] | None,
    no_retry: tuple[type[Exception], ...],
    *,
    tried: int = 0,
) -> R:
    """``fn(item)`` tried up to ``retries + 1`` times in all (``tried`` of them already failed elsewhere)."""
    for attempt in range(tried, max(0, retries) + 1):
        try:
            result = fn(item)
            break
        except no_retry:
            raise
        except Exception as err:
            if attempt >= retries:
                raise ExecutorError(f"{describe(item)}: failed {attempt + 1} time(s): {err}") from err
            if on_retry is not None:
                on_retry(describe(item), err)
    if on_done is not None:
        on_done()
    return result


def _map_ray(
    fn: Callable[[T], R],
    items: Sequence[T],
    *,
    retries: int,
    describe: Callable[[T], str],
    on_done: Callable[[], None] | None,
    on_retry: Callable[[str, BaseException], None] | None,
    no_retry: tuple[type[Exception], ...],
    stall_timeout: float | None,
) -> list[R]:
    try:
        import ray
    except ImportError as err:  # pragma: no cover - depends on the installation
        raise ConfigurationError("executor='ray' needs Ray: pip install 'lightning-vstream[ray]'.") from err
    _ray_init()
    # Retried here rather than by Ray, so each retry is counted and heard of (a dead worker too:
    # its task's result is a WorkerCrashedError).
    remote = ray.remote(max_retries=0, retry_exceptions=False)(fn)
    index: dict[Any, int] = {}
    tries = [0] * len(items)

    def submit(i: int) -> None:
        tries[i] += 1
        index[remote.remote(items[i])] = i

    for i in range(len(items)):
        submit(i)
    results: list[Any] = [None] * len(items)
    try:
        while index:
            ready, _ = ray.wait(list(index), num_returns=1, timeout=stall_timeout)
            if not ready:
                raise ExecutorError(f"no task finished in {stall_timeout} s; {len(index)} pending.")
            for ref in ready:
                i = index.pop(ref)
                try:
                    results[i] = ray.get(ref)
                except Exception as err:
                    # A task's own error comes wrapped (a RayTaskError that is also an instance of it).
                    cause = err.cause if isinstance(err, ray.exceptions.RayTaskError) else err
                    if isinstance(cause, no_retry):
                        raise cause from None
                    if tries[i] > retries:
                        raise ExecutorError(f"{describe(items[i])}: failed {tries[i]} time(s): {err}") from err
                    if on_retry is not None:
                        on_retry(describe(items[i]), err)
                    submit(i)
                    continue
                if on_done is not None:
                    on_done()
    except BaseException:
        _cancel_ray(list(index))
        raise
    return results


def _cancel_ray(refs: list[Any]) -> None:
    """Cancel ``refs`` and wait (a bounded while) until they have ended, so none still writes a file."""
    import ray

    for ref in refs:
        ray.cancel(ref, force=True)
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=60)


def _apply_all(task: tuple[Callable[[T], R], Sequence[T]]) -> list[R]:
    """``[fn(item) for item in group]`` for ``task = (fn, group)`` (one task running a chunk)."""
    fn, group = task
    return [fn(item) for item in group]


def _map_chunked(
    fn: Callable[[T], R],
    items: Sequence[T],
    executor: str,
    workers: int,
    retries: int,
    describe: Callable[[T], str],
    on_done: Callable[[], None] | None,
    on_retry: Callable[[str, BaseException], None] | None,
    no_retry: tuple[type[Exception], ...],
    chunk_size: int | None,
    stall_timeout: float | None,
) -> list[R]:
    if chunk_size is None:
        slots = workers
        if executor == "ray":
            slots = _ray_cpus()
        chunk_size = max(1, math.ceil(len(items) / (4 * max(1, slots))))
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigurationError(f"chunk_size={chunk_size!r} must be a positive number of items or None.")
    groups = chunks(items, chunk_size)

    def describe_group(task: tuple[Callable[[T], R], Sequence[T]]) -> str:
        return "one of " + "; ".join(describe(item) for item in task[1])

    remaining = len(items)

    def group_done() -> None:
        # Groups finish in any order on Ray; all but the last hold chunk_size items, so counting
        # min(chunk_size, remaining) ends exactly on len(items).
        nonlocal remaining
        step = min(int(chunk_size or 1), remaining)
        remaining -= step
        if on_done is not None:
            for _ in range(step):
                on_done()

    out = map_ordered(
        _apply_all,
        [(fn, group) for group in groups],
        executor=executor,
        workers=workers,
        retries=retries,
        describe=describe_group,
        on_done=group_done,
        on_retry=on_retry,
        no_retry=no_retry,
        stall_timeout=stall_timeout,
    )
    return [result for group in out for result in group]


def _ray_cpus() -> int:
    """The CPUs of the Ray cluster (started here if needed)."""
    import ray

    _ray_init()
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _ray_init() -> None:
    if not ray_is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        if address:
            import ray

            ray.init(address=address)
        else:
            start_local_ray()


def ray_is_initialized() -> bool:
    """Whether this process is connected to a Ray runtime."""
    import ray

    return bool(ray.is_initialized())


def start_local_ray(num_cpus: int | None = None) -> None:
    """Start a Ray runtime on this machine that listens on the loopback only, without a dashboard.

    Ray replaces a node address of 127.0.0.1 by the machine's outward address and then listens on
    it (and on every interface); with its cluster mode off it keeps the loopback, so nothing of the
    runtime is reachable from the network. Stop it with ``ray.shutdown()``.

    Args:
        num_cpus: CPUs the runtime may use (None: all of the machine's).

    Example::

        >>> start_local_ray(num_cpus=2)  # doctest: +SKIP
    """
    import ray
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # keep 127.0.0.1 as the node's address
    ray.init(
        num_cpus=num_cpus,
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        log_to_driver=False,
    )


def chunks(items: Iterable[T], size: int) -> list[list[T]]:
    """``items`` in lists of ``size`` (the last may be shorter)."""
    out: list[list[T]] = []
    for item in items:
        if not out or len(out[-1]) >= size:
            out.append([])
        out[-1].append(item)
    return out
