"""The in-process stream engine on the CPU: threads, ring, ordering, stamps, errors, resume, shutdown.

The engine's code is the same on a GPU; here it runs with :class:`HostDevice` (or a recording
double of it) and PyAV decoders, so every frame's stamp can be checked.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_vstream import DecodeOptions, EngineOptions, ErrorOptions, OutputOptions, PlanOptions
from lightning_vstream.decode.cpu.probe import probe_video
from lightning_vstream.decode.cpu.pyav import PyAVDecoder
from lightning_vstream.decode.factory import pyav_factory
from lightning_vstream.demos.synth import write_stamped_video
from lightning_vstream.errors import FrameSizeError, VideoDecodeError, WorkerError
from lightning_vstream.index.records import CameraStream
from lightning_vstream.indexing import load_index
from lightning_vstream.stream.engine_device import HostDevice
from lightning_vstream.stream.engine_loader import EngineLoader, build_engine_loader
from lightning_vstream.stream.sampler import StreamSampler
from lightning_vstream.stream.thread_executor import ThreadExecutor
from lightning_vstream.stream.worker import StreamDataset
from lightning_vstream.stream.worker_loader import StreamDataLoader
from lightning_vstream.transforms import FrameTransform
from tests.conftest import batch_stamp_errors

CAMERAS = 2


def _sampler(index: Any, batch_size: int = 2, **kwargs: Any) -> StreamSampler:
    return StreamSampler(
        [c.frame_count for c in index.clips], num_cameras=len(index.camera_names), batch_size=batch_size, **kwargs
    )


def _loader(
    index: Any,
    *,
    threads: int = 3,
    prefetch: int = 2,
    hold: int = 2,
    device: Any = None,
    factory: Any = None,
    transform: Any = None,
    **kwargs: Any,
) -> EngineLoader:
    errors = {k: kwargs.pop(k) for k in ("on_error", "timeout") if k in kwargs}
    executor = ThreadExecutor(
        index=index,
        sampler=_sampler(index, **kwargs),
        device=device or HostDevice(),
        decoder_factory=factory or pyav_factory(threads=1),
        output=OutputOptions(transform=transform),
        errors=ErrorOptions(**errors),
        num_threads=threads,
        prefetch=prefetch,
        hold=hold,
    )
    return EngineLoader(executor)


def _labels(batch: dict[str, Any]) -> tuple[Any, ...]:
    return (
        batch["step"],
        tuple(batch["clip_id"]),
        batch["frame_index"].tolist(),
        batch["is_first"].tolist(),
        batch["valid"].tolist(),
        batch["camera_timestamp"].nan_to_num(-1).tolist(),
    )


def _decode_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("vstream-decode")]


@pytest.fixture(scope="module")
def index(small_index: Path) -> Any:
    return load_index(small_index)


@pytest.mark.parametrize(("threads", "prefetch"), [(1, 1), (3, 2), (4, 5)])
def test_batches_carry_the_right_frames_and_match_the_worker_loader(index: Any, threads: int, prefetch: int) -> None:
    loader = _loader(index, threads=threads, prefetch=prefetch, shuffle=True, seed=3)
    reference = StreamDataLoader(StreamDataset(index=index), sampler=_sampler(index, shuffle=True, seed=3))
    got = []
    for batch in loader:
        assert not batch_stamp_errors(batch), batch_stamp_errors(batch)[:3]
        assert batch["frames"].shape == (2, CAMERAS, 3, 48, 64) and batch["frames"].dtype == torch.uint8
        got.append(_labels(batch))
    assert got == [_labels(b) for b in reference]
    stats = loader.stats
    assert stats.frames_delivered == len(got) * 2 * CAMERAS
    # Every stream stays on its thread: the only frames decoded and not delivered are those from the
    # keyframe before a cut (GOP 6) to the frame a slot's piece starts at, once per camera.
    cut = [s.start for s in loader.sampler.schedule().segments if s.start > 0]
    assert stats.frames_decoded == stats.frames_delivered + sum(start % 6 for start in cut) * CAMERAS
    assert stats.seeks == sum(1 for start in cut if start % 6) * CAMERAS
    assert not _decode_threads()


def test_padding_on_evaluation_plans(index: Any) -> None:
    loader = _loader(index, remainder="pad", shuffle=False)
    padded = 0
    for batch in loader:  # batches are views of the ring: check each while it is current
        assert not batch_stamp_errors(batch)
        for slot in torch.nonzero(~batch["valid"]).flatten().tolist():
            padded += 1
            assert batch["frames"][slot].count_nonzero() == 0 and batch["frame_index"][slot] == -1
            assert batch["camera_timestamp"][slot].isnan().all()
    assert padded


def test_ring_batches_are_recycled_only_after_the_hold(index: Any) -> None:
    loader = _loader(index, prefetch=1, hold=2, shuffle=False)
    ring = loader.executor.ring_size
    assert ring == 3
    seen: list[dict[str, Any]] = []
    for batch in loader:
        seen.append(batch)
        if len(seen) >= 2:
            # The batch before the current one is still held (hold=2): its frames are intact.
            assert not batch_stamp_errors(seen[-2])
        if len(seen) == 2 * ring:
            break
    pointers = [b["frames"].data_ptr() for b in seen]
    assert len(set(pointers)) == ring and pointers[:ring] == pointers[ring:]


class RecordingDevice(HostDevice):
    """HostDevice that logs every event record and wait, with the thread that made it."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, str, int]] = []
        self._lock = threading.Lock()
        self._count = 0

    def new_event(self) -> int:  # type: ignore[override]
        with self._lock:
            self._count += 1
            return self._count

    def record(self, event: Any, stream: Any | None = None) -> None:
        with self._lock:
            self.log.append(("record", threading.current_thread().name, event))

    def wait(self, event: Any, stream: Any | None = None) -> None:
        with self._lock:
            self.log.append(("wait", threading.current_thread().name, event))

    def synchronize(self, event: Any) -> None:
        with self._lock:
            self.log.append(("synchronize", threading.current_thread().name, event))


def test_consumer_waits_on_every_thread_event_and_threads_wait_for_released_batches_on_the_host(index: Any) -> None:
    """The consumer's stream waits for each decode thread's step; a decode thread waits for a batch's release on
    the host, never on its stream (on which NVDEC copies frames out, see docs/gpu.md)."""
    device = RecordingDevice()
    loader = _loader(index, threads=2, prefetch=1, device=device, shuffle=False)
    engine = loader.executor
    steps = 0
    for batch in loader:
        steps += 1
        slot = batch["step"] % engine.ring_size
        done = {events[slot] for events in engine._done_events}
        consumer_waits = {e for op, who, e in device.log if op == "wait" and who == threading.current_thread().name}
        assert done <= consumer_waits
    main = threading.current_thread().name
    releases = [e for op, who, e in device.log if op == "record" and who == main]
    # The whole ring when the run starts, then one batch per step once the hold is reached.
    assert releases[: engine.ring_size] == engine._release_events
    assert set(releases) <= set(engine._release_events) and len(releases) == engine.ring_size + steps - engine.hold
    assert not [op for op, who, _ in device.log if op == "synchronize" and who == main]
    for t in range(engine.num_threads):
        ops = [(op, e) for op, who, e in device.log if who == f"vstream-decode-{t}"]
        host_waits = [e for op, e in ops if op == "synchronize"]
        records = [e for op, e in ops if op == "record"]
        assert not [e for op, e in ops if op == "wait"]  # a decode thread's stream never waits
        assert len(host_waits) == len(records) == steps  # one release waited for before, one record after each step
        assert set(host_waits) <= set(engine._release_events) and set(records) <= set(engine._done_events[t])


def test_transform_runs_right_after_decoding(index: Any) -> None:
    transform = FrameTransform(resize=(24, 32), dtype="float32")
    loader = _loader(index, transform=transform, shuffle=False)
    batch = next(iter(loader))
    assert batch["frames"].shape == (2, CAMERAS, 3, 24, 32) and batch["frames"].dtype == torch.float32
    loader.close()
    assert not _decode_threads()


def test_frames_of_another_size_need_a_transform(index: Any, tmp_path: Path) -> None:
    larger = write_stamped_video(tmp_path / "large.mp4", clip=2, camera=1, frames=27, size=(96, 64), gop=6)
    mixed = _replace_camera(index, 2, 1, larger, probe_video(larger))
    loader = _loader(mixed, batch_size=2, shuffle=False)
    # Unshuffled, 60 frames on two slots of 30: slot 1 starts in clip 1 and goes on with clip 2 from frame 0.
    first = min(
        (step, r.frame) for step in range(len(loader)) for r in loader.sampler.reads(step, [0, 0]) if r and r.clip == 2
    )
    with pytest.raises(
        FrameSizeError,
        match=rf"^clip 'scene-0002', camera 'CAM_BACK_LEFT', frame {first[1]} \('[^']+large.mp4'\) is \(3, 64, 96\) "
        r"but the batch's frames are \(3, 48, 64\).*resize",
    ):
        list(loader)
    assert not _decode_threads()


def test_early_exit_stops_every_thread_and_closes_decoders(index: Any) -> None:
    closed: list[str] = []

    class Tracked(PyAVDecoder):
        def close(self) -> None:
            closed.append(str(self.path))
            super().close()

    loader = _loader(index, factory=lambda path, info, label: Tracked(path, info=info, label=label))
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert not _decode_threads()
    assert len(closed) == loader.stats.files_opened


def test_errors_raised_in_decode_threads_reach_the_consumer(index: Any) -> None:
    def factory(path: Path, info: Any, label: str) -> Any:
        raise RuntimeError(f"no decoder for {label}")

    with pytest.raises(RuntimeError, match=r"no decoder for clip '.*', camera"):
        list(_loader(index, factory=factory))
    assert not _decode_threads()


def _replace_camera(index: Any, clip: int, camera: int, path: Path, info: Any) -> Any:
    cameras = list(index.clips[clip].cameras)
    cameras[camera] = CameraStream(cameras[camera].name, path, info)
    clips = list(index.clips)
    clips[clip] = dataclasses.replace(clips[clip], cameras=tuple(cameras))
    return dataclasses.replace(index, clips=tuple(clips))


def _truncated_index(index: Any, tmp_path: Path) -> Any:
    camera = index.clips[2].cameras[1]  # the longest clip, read from step 0
    data = bytearray(camera.path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(64)  # damage packets in the middle: their checksums no longer match
    target = tmp_path / camera.path.name
    target.write_bytes(bytes(data))
    return _replace_camera(index, 2, 1, target, camera.info)


def test_on_error_raise_names_clip_camera_and_frame(index: Any, tmp_path: Path) -> None:
    index = _truncated_index(index, tmp_path)
    # The decoder's own message: the file, clip, camera and the frame whose packet failed its checksum.
    with pytest.raises(
        VideoDecodeError,
        match=r"^'[^']+CAM_BACK_LEFT.mp4' \(clip 'scene-0002', camera 'CAM_BACK_LEFT'\) frame \d+: the compressed "
        r"data differs from the checksum",
    ):
        list(_loader(index, shuffle=False))
    assert not _decode_threads()


def test_on_error_skip_moves_the_slot_to_its_next_clip(index: Any, tmp_path: Path) -> None:
    index = _truncated_index(index, tmp_path)
    loader = _loader(index, shuffle=False, on_error="skip", remainder="pad")
    batches = []
    for batch in loader:
        assert not batch_stamp_errors(batch)  # every valid frame is the right one
        batches.append({k: v for k, v in batch.items() if k != "frames"})
    bad = index.clips[2].clip_id
    invalid_steps = [b["step"] for b in batches if not bool(b["valid"].all())]
    assert invalid_steps
    delivered = [int(b["frame_index"][s]) for b in batches for s in range(2) if b["clip_id"][s] == bad]
    assert delivered == list(range(len(delivered))) and len(delivered) < 27  # stopped early
    stats = loader.stats
    assert stats.skipped_clips == 1 and stats.bad_files == 1 and stats.read_errors >= 1
    # The slot starts its next clip with is_first after giving up.
    firsts = [(b["step"], b["clip_id"][s]) for b in batches for s in range(2) if bool(b["is_first"][s])]
    assert any(step > min(invalid_steps) for step, _ in firsts)


@pytest.mark.parametrize("workers", [0, 1])
def test_the_one_constructor_gives_either_executor_the_same_batches_and_skips(
    index: Any, tmp_path: Path, workers: int
) -> None:
    from lightning_vstream.stream.loaders import build_stream_loader

    index = _truncated_index(index, tmp_path)
    options = {
        "decode": DecodeOptions(decoder_threads=1),
        "errors": ErrorOptions(on_error="skip"),
        "engine": EngineOptions(num_workers=workers, multiprocessing_context="spawn" if workers else None),
    }
    threads = build_stream_loader(
        index, _sampler(index, shuffle=True, seed=4, remainder="pad"), executor="threads", **options
    )
    processes = build_stream_loader(
        index,
        _sampler(index, shuffle=True, seed=4, remainder="pad", num_parts=max(1, workers)),
        executor="workers",
        **options,
    )
    assert isinstance(threads, EngineLoader) and isinstance(processes, StreamDataLoader)
    assert type(threads.engine) is type(processes.engine)  # one engine, two executors
    try:
        for got, expected in zip(threads, processes, strict=True):
            assert not batch_stamp_errors(got) and not batch_stamp_errors(expected)
            _same(got, expected, f"step {got['step']}")
        ours, theirs = threads.stats, processes.stats
        if workers:  # a worker learns of a skip only from its next task: it decodes the window's other cameras
            assert theirs.frames_decoded >= ours.frames_decoded
            ours, theirs = dataclasses.replace(ours, frames_decoded=0), dataclasses.replace(theirs, frames_decoded=0)
        _same(ours, theirs, "stats")
        assert ours.skipped_clips == 1 and ours.bad_files == 1 and ours.frames_delivered > 0
    finally:
        threads.close()
        processes.close()


def test_stats_are_a_copy_the_caller_may_change(index: Any) -> None:
    loader = _loader(index)
    stats = loader.stats  # before any step: nothing decoded yet, only the ledger's counters
    assert stats is not loader.sampler.ledger.stats
    stats.read_errors += 5
    assert loader.sampler.ledger.stats.read_errors == 0 and loader.stats.read_errors == 0


def test_the_one_constructor_names_the_executors_it_takes(index: Any) -> None:
    from lightning_vstream.errors import ConfigurationError
    from lightning_vstream.stream.loaders import build_stream_loader

    with pytest.raises(ConfigurationError, match=r"executor='processes' is invalid; expected 'threads' or 'workers'"):
        build_stream_loader(index, _sampler(index), executor="processes")  # type: ignore[arg-type]


def test_resume_mid_epoch_continues_frame_exactly(index: Any) -> None:
    full = [_labels(b) for b in _loader(index, shuffle=True, seed=5)]
    first = _loader(index, shuffle=True, seed=5)
    for i, batch in enumerate(first):
        first.mark_consumed(batch)
        if i == 4:
            break
    state = first.state_dict()
    assert state["step"] == 5
    resumed = _loader(index, shuffle=True, seed=5)
    resumed.load_state_dict(state)
    rest = []
    for batch in resumed:
        assert not batch_stamp_errors(batch)
        rest.append(_labels(batch))
    assert rest == full[5:]


def test_resume_rejects_other_settings(index: Any) -> None:
    from lightning_vstream.errors import ResumeStateError

    state = _loader(index, seed=1).state_dict()
    with pytest.raises(ResumeStateError, match="seed=1 but this one has seed=2"):
        _loader(index, seed=2).load_state_dict(state)


def test_a_stalled_decoder_times_out_with_a_clear_error(index: Any) -> None:
    gate = threading.Event()

    class Stalled(PyAVDecoder):
        def get(self, i: int, out: Any = None) -> torch.Tensor:
            gate.wait()
            return super().get(i, out=out)

    loader = _loader(index, timeout=0.5, factory=lambda path, info, label: Stalled(path, info=info, label=label))
    try:
        with pytest.raises(
            WorkerError,
            match=r"no batch for step 0 within timeout=0.5 s: decode thread 0 did not finish the camera streams "
            r"slot 0 CAM_BACK \(clip 'scene-\d+', frame 0, '[^']+CAM_BACK.mp4'\)",
        ):
            next(iter(loader))
    finally:
        gate.set()
    loader.close()
    assert not _decode_threads()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prefetch": 0}, "prefetch=0"),
        ({"threads": 0}, "num_threads=0"),
        ({"on_error": "ignore"}, "on_error='ignore'"),
    ],
)
def test_engine_rejects_bad_settings(index: Any, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _loader(index, **kwargs)


# -- the engine offers what the worker loader offers ------------------------------------------------


def _same(a: Any, b: Any, where: str = "batch") -> None:
    """Equal structures; tensors equal in dtype, shape and every value (NaNs in the same places)."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, dict):
        assert a.keys() == b.keys(), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for key in a:
            _same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype} {a.shape} != {b.dtype} {b.shape}"
        assert torch.equal(a.nan_to_num(-7.0), b.nan_to_num(-7.0)), f"{where}: values differ"
        assert torch.equal(a.isnan(), b.isnan()) if a.is_floating_point() else True, f"{where}: NaNs differ"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _both(index_file: Path, split: str = "train", **options: Any) -> tuple[Any, Any]:
    """The engine's and the worker loader's loaders of one DataModule configuration."""
    from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule

    loaders = []
    for engine in ("threads", "workers"):
        key = "index_file" if split == "train" else f"{split}_index_file"
        dm = StreamVideoDataModule(
            **{key: index_file}, batch_size=2, engine=EngineOptions(kind=engine, num_workers=0), **options
        )
        dm.setup("fit" if split == "train" else "validate")
        loaders.append(dm.train_dataloader() if split == "train" else dm.val_dataloader())
    assert isinstance(loaders[0], EngineLoader) and isinstance(loaders[1], StreamDataLoader)
    return loaders[0], loaders[1]


def _assert_same_batches(engine: Any, workers: Any) -> int:
    steps = 0
    for got, expected in zip(engine, workers, strict=True):
        _same(got, expected, f"step {steps}")
        steps += 1
    _same(engine.stats, workers.stats, "stats")
    return steps


@pytest.fixture(scope="module")
def annotated(make_dataset: Any) -> Path:
    """Four clips of uneven length, two cameras, 96x64, with synthetic annotations."""
    return make_dataset(clips=4, cameras=2, frames=[10, 7, 12, 9], size=(96, 64), gop=5, annotations=True)


@pytest.mark.parametrize(
    ("split", "options"),
    [
        ("train", {"plan": PlanOptions(shuffle=True), "seed": 3}),
        ("train", {"output": {"pad_annotations": True}}),
        ("train", {"output": {"augment": "random"}, "seed": 7}),
        ("val", {"output": {"augment": "random"}}),  # evaluation: the augmentation's deterministic version
        ("train", {"output": {"transform": FrameTransform(resize=(32, 48))}}),  # resized inside the decoder
        ("train", {"output": {"transform": FrameTransform(crop=(4, 8, 56, 80), resize=(28, 40), dtype="float32")}}),
        ("train", {"output": {"augment": "random", "transform": FrameTransform(resize=(28, 40), dtype="float32")}}),
        ("train", {"decode": DecodeOptions(max_open_decoders=2)}),
    ],
    ids=["annotations", "padded", "augment", "val-augment", "decoder-resize", "crop-float", "augment-float", "lru"],
)
def test_the_engine_delivers_what_the_worker_loader_delivers(annotated: Path, split: str, options: Any) -> None:
    from lightning_vstream.annotations.augment import GeometryAugment

    output = dict(options.get("output", {}))
    if output.get("augment") == "random":
        output["augment"] = GeometryAugment(output_size=(56, 80), scale=(0.9, 1.3), flip=0.5)
    options = {**options, "output": OutputOptions(annotations=annotated.parent / "annotations", **output)}
    engine, workers = _both(annotated, split, **options)
    assert _assert_same_batches(engine, workers) == len(workers) > 0


def test_the_engine_delivers_per_camera_frames_of_each_cameras_size(tmp_path: Path) -> None:
    from _annotation_checks import MIXED_SIZES, write_mixed_rig

    index_file = write_mixed_rig(tmp_path)
    engine, workers = _both(
        index_file,
        output=OutputOptions(annotations=tmp_path / "annotations"),
        decode=DecodeOptions(camera_frames="per_camera"),
    )
    steps = 0
    for got, expected in zip(engine, workers, strict=True):
        assert [tuple(f.shape[2:]) for f in got["frames"]] == [(h, w) for w, h in MIXED_SIZES.values()]
        _same(got, expected, f"step {steps}")
        steps += 1
    assert steps > 0


def test_the_engine_counts_missing_annotations_like_the_worker_loader(annotated: Path, tmp_path: Path) -> None:
    from _annotation_checks import holey_annotations

    folder = holey_annotations(annotated, tmp_path)
    engine, workers = _both(
        annotated,
        output=OutputOptions(annotations=folder),
        errors=ErrorOptions(on_error="skip"),
        plan=PlanOptions(shuffle=False),
    )
    _assert_same_batches(engine, workers)
    assert engine.stats.missing_annotations > 0


def test_cpu_batches_stay_intact_while_referenced(index: Any) -> None:
    # CPU engine batches come from a pool: memory is reused only once no batch refers to it.
    loader = build_engine_loader(
        index, _sampler(index, shuffle=False), "cpu", engine=EngineOptions(threads=2, prefetch_factor=1)
    )
    kept = list(loader)
    assert len({b["frames"].data_ptr() for b in kept}) == len(kept)
    for batch in kept:
        assert not batch_stamp_errors(batch)


def test_auto_uses_threads_on_the_cpu_with_one_thread_per_available_core(annotated: Path) -> None:
    import os

    from lightning_vstream.stream.engine_loader import cpu_threads
    from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule

    dm = StreamVideoDataModule(index_file=annotated, batch_size=4)
    assert dm.engine_choice() == ("threads", "engine.kind='auto': decode threads in the training process")
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert isinstance(loader, EngineLoader)
    assert loader.executor.num_threads == min(cpu_threads(), 4 * 2) == min(len(os.sched_getaffinity(0)), 8)
    assert loader.executor.buffers == "pool"
    for options, why in [
        ({"persistent_workers": True}, "persistent_workers=True"),
        ({"multiprocessing_context": "spawn"}, "multiprocessing_context='spawn'"),
    ]:
        choice, reason = StreamVideoDataModule(index_file=annotated, engine=EngineOptions(**options)).engine_choice()
        assert choice == "workers" and why in reason
    assert StreamVideoDataModule(index_file=annotated, engine=EngineOptions(kind="workers")).engine_choice() == (
        "workers",
        "engine.kind='workers'",
    )


def test_an_option_the_chosen_engine_does_not_use_is_warned_about_once(annotated: Path) -> None:
    import warnings

    from lightning_vstream.errors import VStreamWarning
    from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule

    # engine="auto" on the CPU: worker processes asked for by their count are worker processes.
    dm = StreamVideoDataModule(index_file=annotated, engine=EngineOptions(num_workers=3))
    assert dm.engine_choice() == ("workers", "engine.kind='auto' with num_workers=3: worker processes")
    assert (
        StreamVideoDataModule(index_file=annotated, engine=EngineOptions(num_workers=0)).engine_choice()[0] == "threads"
    )
    # The thread engine starts no processes: num_workers is named with what sets its parallelism.
    dm = StreamVideoDataModule(index_file=annotated, batch_size=2, engine=EngineOptions(kind="threads", num_workers=16))
    dm.setup("fit")
    with pytest.warns(
        VStreamWarning,
        match=r"^StreamVideoDataModule: engine\.num_workers=16 is not used: engine\.kind='threads' decodes in threads of the "
        r"training process and starts no worker processes\. Its decode threads are engine\.threads=None \(None: one "
        r"per core\); pass engine=EngineOptions\(kind='workers'\) to decode in worker processes instead\.$",
    ):
        loader = dm.train_dataloader()
    assert isinstance(loader, EngineLoader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dm.train_dataloader()  # once per DataModule
    dm.teardown()
    # On a GPU, engine="auto" keeps the stream engine: options of worker processes are named together.
    gpu = StreamVideoDataModule(index_file=annotated, engine=EngineOptions(num_workers=4, persistent_workers=True))
    gpu._resolved_device = "cuda:0"  # as resolve_decode_device gives on a GPU machine
    with pytest.warns(
        VStreamWarning,
        match=r"engine\.num_workers=4 and engine\.persistent_workers=True are not used: engine\.kind='auto' on cuda:0 decodes in "
        r"threads of the training process .* engine\.threads=None \(None: twice the GPU's NVDEC engines\)",
    ):
        gpu._warn_unused_options()
    # Worker processes have no engine threads.
    workers = StreamVideoDataModule(
        index_file=annotated, batch_size=2, engine=EngineOptions(kind="workers", num_workers=0, threads=4)
    )
    workers.setup("fit")
    with pytest.warns(
        VStreamWarning,
        match=r"StreamVideoDataModule: engine\.threads=4 is not used: engine\.kind='workers' decodes in the training process "
        r"\(num_workers=0\), not in engine threads\. Pass engine=EngineOptions\(kind='threads'\) to decode with "
        r"those threads instead\.",
    ):
        workers.train_dataloader()
    workers.teardown()


def test_a_new_iteration_stops_an_unfinished_one(index: Any) -> None:
    import gc

    loader = _loader(index, shuffle=True, seed=2)
    reference = [_labels(b) for b in StreamDataLoader(StreamDataset(index=index), sampler=_sampler(index, seed=2))]
    unfinished = iter(loader)
    assert _labels(next(unfinished)) == reference[0]
    # Lightning may start the next epoch before it drops the last epoch's iterator.
    assert [_labels(b) for b in loader] == reference
    del unfinished
    gc.collect()  # the dropped iterator's clean-up must leave the engine usable
    assert [_labels(b) for b in loader] == reference
    assert not _decode_threads()
