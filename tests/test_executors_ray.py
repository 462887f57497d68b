"""Probing on a real local Ray runtime and a local process pool gives the index of one process."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lightning_vstream.errors import ConfigurationError
from lightning_vstream.executors import ExecutorError, map_ordered, start_local_ray
from lightning_vstream.index.table_file import tables_path
from lightning_vstream.indexing import build_index

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'lightning-vstream[ray]')")


@pytest.fixture(scope="module", autouse=True)
def ray_runtime() -> Iterator[None]:
    """One local Ray runtime for the module: 2 CPUs, loopback only, no dashboard; stopped at the end."""
    # This module's task functions travel by value: workers do not have the tests folder on their path.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    start_local_ray(num_cpus=2)
    yield
    ray.shutdown()


def _fail_on_negative(x: int) -> int:
    if x < 0:
        raise ValueError(f"negative {x}")
    return x * 2


def _die_once(path: str) -> str:
    """Ends its worker abruptly the first time it is called with a marker file absent."""
    marker = Path(path)
    if not marker.exists():
        marker.write_text("x")
        os._exit(1)
    return marker.read_text()


def _build(root: Path, out: Path, **kwargs: object) -> tuple[bytes, bytes]:
    build_index(root, output=out, video_dirs=["videos"], progress=False, **kwargs)
    return out.read_bytes(), Path(tables_path(out)).read_bytes()


def test_index_and_tables_are_byte_identical_across_executors(
    make_dataset: Callable[..., Path], tmp_path: Path
) -> None:
    root = make_dataset(clips=3, cameras=2, frames=[20, 13, 27], size=(64, 48), gop=6).parent
    one = _build(root, tmp_path / "one" / "index.json")
    pool = _build(root, tmp_path / "pool" / "index.json", workers=2)
    on_ray = _build(root, tmp_path / "ray" / "index.json", executor="ray")
    assert pool == one
    assert on_ray == one


def test_results_keep_the_order_of_the_items() -> None:
    items = list(range(12))[::-1]
    assert map_ordered(_fail_on_negative, items, executor="ray") == [x * 2 for x in items]


def test_a_failing_task_is_retried_then_named() -> None:
    with pytest.raises(ExecutorError, match=r"(?s)item -3: failed 2 time\(s\).*negative -3"):
        map_ordered(_fail_on_negative, [1, -3], executor="ray", retries=1, describe=lambda x: f"item {x}")
    with pytest.raises(ExecutorError, match=r"item -3: failed 2 time\(s\)"):
        map_ordered(_fail_on_negative, [1, -3], executor="local", workers=2, retries=1, describe=lambda x: f"item {x}")


def test_a_worker_killed_mid_task_loses_only_that_task(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    # The first worker dies; Ray retries the task on a fresh one, which finds the marker.
    assert map_ordered(_die_once, [str(marker)], executor="ray", retries=2) == ["x"]


def test_keyboard_interrupt_cancels_the_pending_tasks() -> None:
    def interrupt() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        map_ordered(_fail_on_negative, list(range(8)), executor="ray", on_done=interrupt)


def test_vstream_index_probes_with_jobs_and_on_ray(make_dataset: Callable[..., Path], tmp_path: Path) -> None:
    from lightning_vstream.cli import main

    root = make_dataset(clips=3, cameras=2, frames=[20, 13, 27], size=(64, 48), gop=6).parent
    outs = []
    for i, flags in enumerate((["-j", "1"], ["-j", "2"], ["--executor", "ray"])):
        out = tmp_path / str(i) / "index.json"
        assert main(["index", str(root), "-o", str(out), "-q", *flags]) == 0
        outs.append((out.read_bytes(), Path(tables_path(out)).read_bytes()))
    assert outs[0] == outs[1] == outs[2]


def test_chunked_tasks_keep_order_and_name_the_failing_chunk() -> None:
    items = list(range(23))
    for executor, workers in (("ray", 1), ("local", 2), ("local", 1)):
        done: list[int] = []
        got = map_ordered(
            _fail_on_negative,
            items,
            executor=executor,
            workers=workers,
            chunk_size=None,
            on_done=lambda done=done: done.append(1),  # type: ignore[misc]
        )
        assert got == [x * 2 for x in items]
        assert len(done) == len(items)
        assert map_ordered(_fail_on_negative, items, executor=executor, workers=workers, chunk_size=5) == got
        with pytest.raises(ExecutorError, match="item -3"):
            map_ordered(
                _fail_on_negative,
                [1, 2, -3, 4],
                executor=executor,
                workers=workers,
                chunk_size=2,
                retries=1,
                describe=lambda x: f"item {x}",
            )
    with pytest.raises(ConfigurationError, match="chunk_size"):
        map_ordered(_fail_on_negative, [1, 2], chunk_size=0)


def test_the_local_ray_runtime_listens_only_on_the_loopback() -> None:
    import psutil

    pids = {os.getpid()} | {p.pid for p in psutil.Process().children(recursive=True)}
    addresses = {
        c.laddr.ip for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid in pids
    }
    assert addresses, "the Ray runtime should listen somewhere"
    assert addresses <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, addresses
