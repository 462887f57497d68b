"""Probing and encoding on a real local Ray runtime and a local process pool give the files of one process."""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from lightning_vstream.decode import make_decoder
from lightning_vstream.demos.synth import Stamp, read_stamp
from lightning_vstream.encode import EncodeSummary, encode_index
from lightning_vstream.encode.run import FAULT_VARIABLE
from lightning_vstream.errors import ConfigurationError, EncodeError
from lightning_vstream.executors import ExecutorError, map_ordered, start_local_ray
from lightning_vstream.index.table_file import tables_path
from lightning_vstream.indexing import build_index, load_index
from lightning_vstream.storage.atomic import is_temporary

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


@pytest.mark.parametrize(("executor", "workers"), [("ray", 1), ("local", 2), ("local", 1)])
def test_retries_are_heard_of_and_errors_about_the_input_pass_at_once(executor: str, workers: int) -> None:
    heard: list[str] = []

    def retried(what: str, err: BaseException) -> None:
        heard.append(f"{what}: {err}")

    with pytest.raises(ExecutorError, match=r"item -3: failed 3 time\(s\)"):
        map_ordered(
            _fail_on_negative,
            [1, -3],
            executor=executor,
            workers=workers,
            describe=lambda x: f"item {x}",
            on_retry=retried,
        )
    assert len(heard) == 2 and all(h.startswith("item -3: ") and "negative -3" in h for h in heard)
    heard.clear()
    # An error a retry would only repeat comes back as itself (unwrapped from Ray), on the first try.
    with pytest.raises(ValueError, match=r"\Anegative -3\Z") as raised:
        map_ordered(
            _fail_on_negative, [1, -3], executor=executor, workers=workers, on_retry=retried, no_retry=(ValueError,)
        )
    assert type(raised.value) is ValueError and heard == []


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


# -- encoding ----------------------------------------------------------------------------------------
CAMERAS = ["CAM_BACK", "CAM_FRONT"]


@pytest.fixture(scope="module")
def video_index(make_dataset: Callable[..., Path]) -> Path:
    return make_dataset(clips=3, cameras=CAMERAS, frames=[8, 5, 9], size=(64, 48), gop=4)


def _without_mtimes(data: bytes) -> bytes:
    """A frame-table file with its ``mtime_ns`` column zeroed: when each video was written differs from run to run."""
    (header_len,) = struct.unpack_from("<I", data, 12)
    dtype, (count,), offset = json.loads(data[16 : 16 + header_len])["arrays"]["mtime_ns"]
    start = -(-(16 + header_len) // 64) * 64 + offset
    end = start + count * np.dtype(dtype).itemsize
    return data[:start] + bytes(end - start) + data[end:]


def _encode(src: Path, out: Path, **kwargs: object) -> tuple[EncodeSummary, dict[str, bytes]]:
    """Encode ``src`` into ``out`` (H.264, one encoder thread a file); the summary and every file's bytes.

    The ``ultrafast`` preset: with slower presets x264 occasionally writes other bytes for the same
    frames on a busy machine (about 1 encode in 20 of one of these files, one thread, one process, no
    executor involved), which would make byte comparisons of runs flaky for reasons outside this package.
    """
    kwargs.setdefault("threads", 1)
    kwargs.setdefault("preset", "ultrafast")
    summary = encode_index(src, out, codec="h264", gop=4, crf=23, progress=False, **kwargs)  # type: ignore[arg-type]
    files = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    files["index.tables.bin"] = _without_mtimes(files["index.tables.bin"])
    return summary, files


def _frames(index: Path) -> list[tuple[str, str, list[Stamp], tuple[int, ...]]]:
    """Every camera file's stamps, frame after frame, and its frame times."""
    out = []
    for clip in load_index(index):
        for cam in clip.cameras:
            decoder = make_decoder(cam.path)
            stamps = [read_stamp(decoder.get(i)) for i in range(decoder.info.frame_count)]
            out.append((clip.clip_id, cam.name, stamps, decoder.info.pts))
    return out


def _debris(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if is_temporary(p.name)]


@pytest.fixture(scope="module")
def clean_encode(video_index: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The files of a one-process encode, the reference every other run must match byte for byte."""
    return _encode(video_index, tmp_path_factory.mktemp("clean"))[1]


def test_encode_is_byte_identical_across_executors(
    video_index: Path, clean_encode: dict[str, bytes], tmp_path: Path
) -> None:
    pool, pool_files = _encode(video_index, tmp_path / "pool", jobs=2)
    on_ray, ray_files = _encode(video_index, tmp_path / "ray", executor="ray")
    assert sorted(clean_encode) == sorted(
        ["index.json", "index.tables.bin", *(f"videos/scene-000{c}/{cam}.mp4" for c in range(3) for cam in CAMERAS)]
    )
    assert pool_files == clean_encode  # index, frame tables (but for the files' times) and every video
    assert ray_files == clean_encode
    assert (on_ray.files_encoded, on_ray.frames_encoded, on_ray.retries) == (6, 44, 0)
    assert on_ray.output_bytes == pool.output_bytes
    source = _frames(video_index)
    assert _frames(on_ray.index) == source  # every frame decodes to its source's stamp, at its source time
    # With each executor's own encoder threads and the default preset the bytes may differ; the frames
    # and times do not.
    default, _ = _encode(video_index, tmp_path / "default", executor="ray", threads=None, preset="fast")
    assert _frames(default.index) == source


def test_an_encoder_killed_mid_file_on_ray_is_retried(
    video_index: Path, clean_encode: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "marker"
    monkeypatch.setenv(FAULT_VARIABLE, f"exit-once:scene-0001/CAM_FRONT:{marker}")
    summary, files = _encode(video_index, tmp_path / "out", executor="ray")
    assert marker.is_file()  # the first try ended its worker half way through the file
    assert (summary.files_encoded, summary.retries) == (6, 1)
    assert _debris(tmp_path / "out") == []
    assert files == clean_encode


def test_a_file_failing_on_every_try_on_ray_is_named_and_a_rerun_finishes(
    video_index: Path, clean_encode: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    monkeypatch.setenv(FAULT_VARIABLE, "exit:scene-0002/CAM_BACK")
    with pytest.raises(
        EncodeError,
        match=r"'[^']*scene-0002/CAM_BACK\.mp4' \(clip 'scene-0002', camera 'CAM_BACK'\): failed 3 time\(s\): "
        r"(?s:.*)run again to encode the rest",
    ):
        _encode(video_index, out, executor="ray")
    assert _debris(out) == []  # the killed tries' temporary files are gone
    assert not (out / "index.json").exists()
    monkeypatch.delenv(FAULT_VARIABLE)
    again, files = _encode(video_index, out, executor="ray")
    assert again.files_encoded + again.files_skipped == 6 and again.files_encoded >= 1 and again.retries == 0
    assert files == clean_encode


def test_an_interrupted_encode_on_ray_leaves_no_temporary_file_and_a_rerun_finishes(
    video_index: Path, clean_encode: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lightning_vstream.encode.run as run

    real = run.map_ordered

    def interrupted(*args: object, **kwargs: object) -> object:
        done = kwargs["on_done"]

        def ctrl_c() -> None:  # Ctrl-C at the driver once the first file is back
            done()  # type: ignore[operator]
            raise KeyboardInterrupt

        return real(*args, **{**kwargs, "on_done": ctrl_c})  # type: ignore[arg-type]

    out = tmp_path / "out"
    monkeypatch.setattr(run, "map_ordered", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _encode(video_index, out, executor="ray")
    monkeypatch.setattr(run, "map_ordered", real)
    assert _debris(out) == []
    again, files = _encode(video_index, out, executor="ray")
    assert again.files_skipped >= 1 and again.files_encoded + again.files_skipped == 6
    assert files == clean_encode


def test_vstream_encode_on_ray_prints_one_summary_line(
    video_index: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lightning_vstream.cli import main

    argv = ["encode", str(video_index), str(tmp_path / "out"), "--codec", "h264", "--executor", "ray", "-q"]
    assert main(argv) == 0
    line = capsys.readouterr().out.strip()
    assert "\n" not in line
    assert line.startswith(f"wrote {tmp_path / 'out' / 'index.json'}: 6 files (6 encoded, 0 already done), 44 frames, ")
    assert line.endswith(" 0 retries")


def test_import_nuscenes_on_ray_writes_the_videos_index_and_annotations_of_one_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("PIL.Image")
    from _nuscenes_fixture import write_nuscenes

    from lightning_vstream.cli import main

    dataset = write_nuscenes(tmp_path / "nuscenes")
    outs = []
    for name, flags in (("one", ["-j", "1"]), ("ray", ["--executor", "ray"])):
        out = tmp_path / name
        argv = [
            "import-nuscenes",
            str(dataset.root),
            str(out),
            "--codec",
            "h264",
            "--threads",
            "1",
            "--preset",
            "ultrafast",
            "-q",
            *flags,
        ]
        argv += ["--cameras", *dataset.cameras]
        assert main(argv) == 0
        line = capsys.readouterr().out.strip()
        assert "\n" not in line and " encoded, 0 already done), " in line and " 0 retries; keyframe stride " in line
        files = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
        files["index.tables.bin"] = _without_mtimes(files["index.tables.bin"])
        outs.append(files)
    assert any(name.startswith("annotations/") for name in outs[0])
    assert outs[1] == outs[0]
