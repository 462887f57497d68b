"""Streaming loader without Lightning: stamps, decode amplification, resume, padding, limits."""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_vstream.demos.synth import clip_name, write_stamped_video
from lightning_vstream.errors import FrameSizeError
from lightning_vstream.indexing import build_index, load_index
from lightning_vstream.options import DecodeOptions, ErrorOptions, OutputOptions
from lightning_vstream.stream.sampler import StreamSampler
from lightning_vstream.stream.worker import StreamDataset
from lightning_vstream.stream.worker_loader import StreamDataLoader
from lightning_vstream.transforms import FrameTransform


@pytest.fixture(scope="session")
def stream_index(make_dataset: Any) -> Path:
    """Five clips of uneven length, three cameras, GOP 6 (P-frames between keyframes)."""
    return make_dataset(clips=5, cameras=3, frames=[20, 13, 27, 16, 22], size=(64, 48), gop=6)


def _loader(
    index_path: Path,
    *,
    num_workers: int = 0,
    batch_size: int = 2,
    remainder: str = "drop",
    shuffle: bool = True,
    seed: int = 1,
    max_open_decoders: int | None = None,
    transform: Any = None,
    on_error: str = "raise",
    pin_memory: bool = False,
    **kw: Any,
) -> StreamDataLoader:
    index = load_index(index_path)
    sampler = StreamSampler(
        [c.frame_count for c in index.clips],
        num_cameras=len(index.camera_names),
        batch_size=batch_size,
        seed=seed,
        shuffle=shuffle,
        remainder=remainder,
        num_parts=max(1, num_workers),
        **kw,  # type: ignore[arg-type]
    )
    dataset = StreamDataset(
        index=index,
        decode=DecodeOptions(max_open_decoders=max_open_decoders),
        output=OutputOptions(transform=transform),
        errors=ErrorOptions(on_error=on_error),  # type: ignore[arg-type]
    )
    return StreamDataLoader(dataset, sampler=sampler, num_workers=num_workers, pin_memory=pin_memory)


def _key(batch: dict[str, Any]) -> list[tuple[str, int, bool]]:
    return list(zip(batch["clip_id"], batch["frame_index"].tolist(), batch["is_first"].tolist()))


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_stamps_match_schedule_and_amplification_stays_low(
    stream_index: Path, num_workers: int, assert_stamps: Any
) -> None:
    loader = _loader(stream_index, num_workers=num_workers)
    plan = loader.sampler.schedule()
    steps = 0
    for step, batch in enumerate(loader):
        assert batch["frames"].shape == (2, 3, 3, 48, 64)
        assert batch["frames"].dtype == torch.uint8
        assert batch["camera_names"] == ["CAM_BACK", "CAM_BACK_LEFT", "CAM_BACK_RIGHT"]
        expected = [(loader.dataset.index.clips[r.clip].clip_id, r.frame, r.is_first) for r in plan.reads(step)]
        assert _key(batch) == expected
        assert_stamps(batch)
        steps += 1
    assert steps == len(loader) == plan.num_steps
    stats = loader.stats
    assert stats.frames_delivered == steps * 2 * 3
    assert stats.amplification <= 1.05, stats
    assert stats.seeks == 0


def test_four_workers_keep_stream_affinity(stream_index: Path, assert_stamps: Any) -> None:
    loader = _loader(stream_index, num_workers=4, batch_size=2)
    for batch in loader:
        assert_stamps(batch)
    assert loader.stats.amplification <= 1.05


def test_timestamps_are_the_frames_presentation_times(stream_index: Path) -> None:
    loader = _loader(stream_index)
    index = loader.dataset.index
    batch = next(iter(loader))
    for slot, clip_id in enumerate(batch["clip_id"]):
        info = index[clip_id].cameras[0].info
        assert batch["timestamp"][slot].item() == pytest.approx(info.timestamp(int(batch["frame_index"][slot])))
        assert batch["timestamp"][slot].item() == pytest.approx(int(batch["frame_index"][slot]) / 12.0)


def test_main_process_opens_no_decoder_when_workers_decode(stream_index: Path) -> None:
    loader = _loader(stream_index, num_workers=2)
    for _ in loader:
        pass
    assert len(loader.dataset.decoders) == 0


def test_dataset_pickles_without_decoders(stream_index: Path) -> None:
    loader = _loader(stream_index)
    next(iter(loader))
    assert len(loader.dataset.decoders) > 0
    clone = pickle.loads(pickle.dumps(loader.dataset))
    assert len(clone.decoders) == 0


def test_open_files_are_bounded(stream_index: Path, assert_stamps: Any) -> None:
    loader = _loader(stream_index, max_open_decoders=2)
    for batch in loader:
        assert_stamps(batch)
        assert len(loader.dataset.decoders) <= 2
    # Evicted decoders reopen and seek, so more frames are decoded than delivered.
    assert loader.stats.files_opened > 6


def test_frames_after_decoder_close_are_still_exact(stream_index: Path, assert_stamps: Any) -> None:
    loader = _loader(stream_index)
    it = iter(loader)
    for _ in range(3):
        assert_stamps(next(it))
    loader.dataset.close()
    assert_stamps(next(it))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_pad_remainder_delivers_every_frame_once(stream_index: Path, num_workers: int, assert_stamps: Any) -> None:
    loader = _loader(stream_index, num_workers=num_workers, remainder="pad", shuffle=False, batch_size=3)
    seen = Counter()
    for batch in loader:
        assert_stamps(batch)
        for slot in range(3):
            if batch["valid"][slot]:
                seen[(batch["clip_id"][slot], int(batch["frame_index"][slot]))] += 1
            else:
                assert batch["clip_id"][slot] == "" and int(batch["frame_index"][slot]) == -1
                assert torch.isnan(batch["timestamp"][slot])
                assert not batch["frames"][slot].any()
    assert set(seen.values()) == {1}
    assert len(seen) == 20 + 13 + 27 + 16 + 22


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_mid_epoch_continues_exactly(stream_index: Path, num_workers: int) -> None:
    full = [_key(b) for b in _loader(stream_index, num_workers=num_workers)]
    first = _loader(stream_index, num_workers=num_workers)
    it = iter(first)
    for _ in range(5):
        next(it)
    state = first.state_dict()
    assert state["step"] == 5 and state["epoch"] == 0
    resumed = _loader(stream_index, num_workers=num_workers)
    resumed.load_state_dict(state)
    rest = [_key(b) for b in resumed]
    assert rest == full[5:]
    # The next epoch after a resumed one starts from its first step.
    resumed.sampler.set_epoch(1)
    assert len([_key(b) for b in resumed]) == len(resumed)


def test_consumed_position_wins_over_prefetched(stream_index: Path) -> None:
    loader = _loader(stream_index)
    it = iter(loader)
    batches = [next(it) for _ in range(4)]
    loader.mark_consumed(batches[2])
    assert loader.state_dict()["step"] == 3


def test_state_at_epoch_end_points_to_next_epoch(stream_index: Path) -> None:
    loader = _loader(stream_index)
    for _ in loader:
        pass
    state = loader.state_dict()
    assert (state["epoch"], state["step"]) == (1, 0)


def test_resume_with_other_settings_names_the_field(stream_index: Path) -> None:
    state = _loader(stream_index, seed=1).state_dict()
    with pytest.raises(ValueError, match=r"seed=1 but this one has seed=2"):
        _loader(stream_index, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match=r"loader state version 99 is not supported"):
        _loader(stream_index).load_state_dict({**state, "version": 99})


def test_epochs_differ_and_set_epoch_selects_the_plan(stream_index: Path) -> None:
    loader = _loader(stream_index)
    epoch0 = [_key(b) for b in loader]
    loader.sampler.set_epoch(1)
    epoch1 = [_key(b) for b in loader]
    assert epoch0 != epoch1
    loader.sampler.set_epoch(0)
    assert [_key(b) for b in loader] == epoch0


def _mixed_sizes(root: Path, *, odd_clips: tuple[int, ...]) -> Path:
    """Three clips (8, 6, 10 frames), two cameras; CAM_BACK_LEFT of ``odd_clips`` is 128x96, the rest 64x48.

    Unshuffled with two slots of 12 steps, slot 0 reads clip 1 then clip 0's frames 0-5, slot 1 clip 0's
    frames 6-7 (step 0) then clip 2.
    """
    for clip, frames in enumerate([8, 6, 10]):
        for cam, name in enumerate(["CAM_BACK", "CAM_BACK_LEFT"]):
            size = (128, 96) if cam == 1 and clip in odd_clips else (64, 48)
            write_stamped_video(
                root / "videos" / clip_name(clip) / f"{name}.mp4",
                clip=clip,
                camera=cam,
                frames=frames,
                size=size,
                gop=6,
            )
    return build_index(root, output=root / "index.json", progress=False)


# Clip 0 is read in step 0 (from frame 6, slot 1), before the batch's size is known (frames come in
# per-part tensors); clip 1 too (slot 0), but then clip 0's frames are first to be checked.
@pytest.mark.parametrize("odd", [0, 1])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_mixed_frame_sizes_name_the_file_clip_camera_and_both_sizes(tmp_path: Path, num_workers: int, odd: int) -> None:
    index_path = _mixed_sizes(tmp_path, odd_clips=(odd,))
    loader = _loader(index_path, batch_size=2, shuffle=False, num_workers=num_workers)
    with pytest.raises(
        FrameSizeError,
        match=rf"clip 'scene-000{odd}', camera 'CAM_BACK_LEFT', frame {6 if odd == 0 else 0} \('[^']*"
        rf"scene-000{odd}/CAM_BACK_LEFT\.mp4'\) is \(3, 96, 128\) but the "
        r"batch's frames are \(3, 48, 64\); .*FrameTransform\(resize=",
    ):
        list(loader)


@pytest.mark.parametrize("odd", [0, 1])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_mixed_frame_sizes_are_skipped_and_counted_under_skip(
    tmp_path: Path, num_workers: int, odd: int, assert_stamps: Any
) -> None:
    index_path = _mixed_sizes(tmp_path, odd_clips=(odd,))
    loader = _loader(index_path, batch_size=2, shuffle=False, num_workers=num_workers, on_error="skip")
    batches = list(loader)
    for batch in batches:
        assert batch["frames"].shape[2:] == (3, 48, 64)
        assert_stamps(batch)
        assert clip_name(odd) not in batch["clip_id"]
    stats = loader.stats
    segments = sum(1 for s in loader.sampler.schedule().segments if s.clip == odd)  # clip 0 is cut in two
    assert (stats.skipped_clips, stats.bad_files) == (segments, 1) and stats.read_errors >= 1
    assert stats.frames_delivered == sum(int(b["valid"].sum()) for b in batches) * 2
    assert odd != 0 or not batches[0]["valid"][1]  # clip 0 was due in slot 1 at step 0


@pytest.mark.parametrize(("num_workers", "pin_memory"), [(0, False), (2, False), (2, True)])
def test_resize_transform_makes_mixed_camera_sizes_stackable(
    tmp_path: Path, num_workers: int, pin_memory: bool, assert_stamps: Any
) -> None:
    # Every clip mixes sizes; doubling 64x48 to 128x96 keeps the stamps readable. Step 0 stacks
    # per-part frames, later steps write into batch buffers (pinned where CUDA is available):
    # every path resizes each camera frame before writing it.
    index_path = _mixed_sizes(tmp_path, odd_clips=(0, 1, 2))
    loader = _loader(
        index_path,
        batch_size=2,
        shuffle=False,
        num_workers=num_workers,
        transform=FrameTransform(resize=(96, 128)),
        pin_memory=pin_memory,
    )
    steps = 0
    for batch in loader:
        assert batch["frames"].shape == (2, 2, 3, 96, 128)
        assert bool(batch["valid"].all())
        assert_stamps(batch)
        steps += 1
    assert steps == len(loader) and loader.stats.frames_delivered == steps * 2 * 2


def test_loader_rejects_parts_that_do_not_match_workers(stream_index: Path) -> None:
    index = load_index(stream_index)
    sampler = StreamSampler([c.frame_count for c in index.clips], num_cameras=3, batch_size=2, num_parts=1)
    with pytest.raises(ValueError, match=r"sampler.num_parts=1 must equal max\(1, num_workers\)=2"):
        StreamDataLoader(StreamDataset(index=index), sampler=sampler, num_workers=2)


def test_sampler_shards_by_rank(stream_index: Path) -> None:
    index = load_index(stream_index)
    lengths = [c.frame_count for c in index.clips]
    clips = []
    for rank in range(2):
        sampler = StreamSampler(lengths, num_cameras=3, batch_size=1, num_replicas=2, rank=rank, seed=3)
        clips.append({read.clip for task in sampler for read in task.reads})
        assert len(sampler) == sampler.schedule().num_steps
    assert not clips[0] & clips[1]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_kept_by_the_user_are_never_overwritten(
    stream_index: Path, num_workers: int, assert_stamps: Any
) -> None:
    loader = _loader(stream_index, num_workers=num_workers)
    kept = list(loader)  # every batch stays referenced until the end
    views = [b["frames"][0, 0] for b in _loader(stream_index, num_workers=num_workers)]  # only views survive
    for batch in kept:
        assert_stamps(batch)
    for _step, view in enumerate(views):
        assert view.any()  # the view's base is still alive, so its storage was not recycled
    assert loader.engine.executor.pool.allocated >= len(kept) - 4  # held batches each needed their own storage


def test_dropped_batches_recycle_their_storage(stream_index: Path, assert_stamps: Any) -> None:
    loader = _loader(stream_index, num_workers=2)
    steps = 0
    for batch in loader:
        assert_stamps(batch)
        steps += 1
    assert steps > 10 and loader.engine.executor.pool.allocated <= 6
