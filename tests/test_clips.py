"""VideoClipDataset, its decoder cache and collate, the GOP cost model, and ClipVideoDataModule.

Every returned frame is checked against its stamp: clip, camera and frame index must be the
ones requested.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, Sampler

from lightning_vstream import DecodeOptions, SamplingOptions
from lightning_vstream.clips.batch import collate_clips
from lightning_vstream.clips.datamodule import ClipVideoDataModule
from lightning_vstream.clips.dataset import VideoClipDataset
from lightning_vstream.clips.from_files import index_from_files
from lightning_vstream.clips.selection import ClipRequest, at_indices, at_times, multi_rate
from lightning_vstream.clips.windows import FrameWindow, TimeWindow, random_clips, regular_clips
from lightning_vstream.decode.cpu.pyav import PyAVDecoder
from lightning_vstream.demos.synth import (
    Stamp,
    clip_number,
    draw_stamp,
    read_stamp,
    write_stamped_video,
)
from lightning_vstream.indexing import build_index, load_index

VFR_SECONDS = [0.0, 0.04, 0.09, 0.30, 0.31, 0.32, 0.80, 0.85, 1.50, 1.52, 1.60, 2.40, 2.45, 2.50, 3.00, 3.10]


def check_stamps(sample: dict[str, Any], *, camera_numbers: dict[str, int] | None = None) -> None:
    """Every frame of a sample or batch carries the clip, camera and frame index it claims."""
    frames = sample["frames"]
    clip_ids = sample["clip_id"]
    index = sample["frame_index"]
    if frames.dim() == 5:  # one sample -> a batch of one
        frames, clip_ids, index = frames[None], [clip_ids], index[None]
    names = list(sample["camera_names"])
    for b in range(frames.shape[0]):
        for t in range(frames.shape[1]):
            for c, name in enumerate(names):
                stamp = read_stamp(frames[b, t, c])
                expected_cam = camera_numbers[name] if camera_numbers else c
                assert (stamp.clip, stamp.camera, stamp.frame) == (
                    clip_number(clip_ids[b]),
                    expected_cam,
                    int(index[b, t]),
                ), f"sample {b} frame {t} camera {name}"


@pytest.fixture(scope="module")
def vfr_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One variable-frame-rate clip (scene-0005), two cameras, GOP 4, with B-frames."""
    root = tmp_path_factory.mktemp("vfr")
    for camera, name in enumerate(("CAM_A", "CAM_B")):
        write_stamped_video(
            root / "videos" / "scene-0005" / f"{name}.mp4",
            clip=5,
            camera=camera,
            frames=len(VFR_SECONDS),
            timestamps=VFR_SECONDS,
            gop=4,
            bframes=2,
        )
    return build_index(root, output=root / "index.json", video_dirs=["videos"], progress=False)


@pytest.fixture(scope="module")
def bframe_index(make_dataset: Callable[..., Path]) -> Path:
    return make_dataset(clips=2, cameras=1, frames=[40, 33], gop=8, bframes=3)


def write_jpeg_folder(folder: Path, *, clip: int, camera: int, frames: int) -> None:
    from PIL import Image

    folder.mkdir(parents=True)
    for i in range(frames):
        image = np.full((48, 64, 3), 90, np.uint8)
        draw_stamp(image, Stamp(clip, camera, i))
        Image.fromarray(image).save(folder / f"{i}.jpg", quality=95)


@pytest.fixture(scope="module")
def mixed_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scene-0007: camera CAM_A is a video, CAM_B a folder of JPEG frames."""
    root = tmp_path_factory.mktemp("mixed")
    clip = root / "videos" / "scene-0007"
    write_stamped_video(clip / "CAM_A.mp4", clip=7, camera=0, frames=15, gop=5)
    write_jpeg_folder(clip / "CAM_B", clip=7, camera=1, frames=15)
    return build_index(root, output=root / "index.json", video_dirs=["videos"], progress=False)


# -- explicit indices -------------------------------------------------------------------------
def test_indices_in_any_order_with_repeats_across_cameras(small_index: Path) -> None:
    ds = VideoClipDataset(index=small_index, requests=[at_indices("scene-0002", [26, 3, 3, 0, 14])])
    sample = ds[0]
    assert sample["frames"].shape == (5, 2, 3, 48, 64) and sample["frames"].dtype == torch.uint8
    assert sample["frame_index"].tolist() == [26, 3, 3, 0, 14] and sample["frame_index"].dtype == torch.int64
    assert sample["camera_names"] == ["CAM_BACK", "CAM_BACK_LEFT"] and sample["clip_id"] == "scene-0002"
    assert sample["timestamp"].dtype == torch.float64
    assert sample["timestamp"].tolist() == pytest.approx([26 / 12, 3 / 12, 3 / 12, 0.0, 14 / 12])
    check_stamps(sample)
    assert len(ds) == 1 and "1 requests" in repr(ds)


def test_single_camera_and_camera_order(small_index: Path) -> None:
    ds = VideoClipDataset(index=small_index, cameras=["CAM_BACK_LEFT", "CAM_BACK"])
    numbers = {"CAM_BACK": 0, "CAM_BACK_LEFT": 1}
    both = ds[at_indices("scene-0001", [5, 6])]
    assert both["camera_names"] == ["CAM_BACK_LEFT", "CAM_BACK"]
    check_stamps(both, camera_numbers=numbers)
    one = ds[at_indices("scene-0001", [12], cameras=["CAM_BACK"])]
    assert one["frames"].shape == (1, 1, 3, 48, 64)
    check_stamps(one, camera_numbers=numbers)


# -- timestamps -------------------------------------------------------------------------------
def test_timestamps_on_variable_frame_rate_file(vfr_index: Path) -> None:
    ds = VideoClipDataset(index=vfr_index)
    times = [0.0, 0.2, 0.5, 0.6, 1.515, 2.0, 3.05, 3.1]  # 2.0 and 3.05 are ties: earlier frame
    nearest = ds[at_times("scene-0005", times)]
    assert nearest["frame_index"].tolist() == [0, 3, 5, 6, 9, 10, 14, 15]
    before = ds[at_times("scene-0005", times, policy="at_or_before")]
    assert before["frame_index"].tolist() == [0, 2, 5, 5, 8, 10, 14, 15]
    for sample in (nearest, before):
        check_stamps(sample)
        # Real presentation times of the returned frames, not the requested times.
        expected = [VFR_SECONDS[i] for i in sample["frame_index"].tolist()]
        assert sample["timestamp"].tolist() == pytest.approx(expected, abs=1e-4)
    # Requesting returned timestamps gives the same frames back.
    again = ds[at_times("scene-0005", nearest["timestamp"].tolist(), policy="at_or_before")]
    assert again["frame_index"].tolist() == nearest["frame_index"].tolist()


def test_time_out_of_range_names_clip_and_camera(vfr_index: Path) -> None:
    ds = VideoClipDataset(index=vfr_index)
    with pytest.raises(IndexError, match=r"time 9.0 s is outside the frames in clip 'scene-0005', camera 'CAM_A'"):
        ds[at_times("scene-0005", [1.0, 9.0])]


def test_multi_rate_segments(make_dataset: Callable[..., Path]) -> None:
    index_path = make_dataset(clips=1, cameras=2, frames=60, fps=12.0, gop=12)
    ds = VideoClipDataset(index=index_path)
    # 4 frames at 2 fps, then 4 at 6 fps, then 2 at 12 fps, from 0.5 s: frames every 6, then 2, then 1.
    sample = ds[multi_rate("scene-0000", start=0.5, segments=[(2.0, 4), (6.0, 4), (12.0, 2)])]
    assert sample["frame_index"].tolist() == [6, 12, 18, 24, 30, 32, 34, 36, 38, 39]
    check_stamps(sample)


def test_random_time_windows_on_vfr(vfr_index: Path) -> None:
    index = load_index(vfr_index)
    reqs = random_clips(index, TimeWindow([(4.0, 3), (10.0, 2)]), count=12, seed=5)
    ds = VideoClipDataset(index=index, requests=reqs)
    for i in range(len(ds)):
        sample = ds[i]
        check_stamps(sample)
        assert sample["frame_index"].tolist() == sorted(sample["frame_index"].tolist())


# -- B-frames and the cost model --------------------------------------------------------------
def _gop_bound(info: Any, wanted: list[int]) -> tuple[int, int]:
    """(frames decoded from each needed GOP's keyframe up to its last needed frame, one GOP per frame)."""
    last_in_gop: dict[int, int] = {}
    for f in wanted:
        key = info.keyframe_at_or_before(f)
        last_in_gop[key] = max(last_in_gop.get(key, key), f)
    exact = sum(last - key + 1 for key, last in last_in_gop.items())
    ends = [*list(info.key_indices[1:]), info.frame_count]
    per_frame = sum(ends[info.gop_of(f)] - info.keyframe_at_or_before(f) for f in set(wanted))
    return exact, per_frame


@pytest.mark.parametrize("bframes", [0, 3])
def test_random_request_decodes_at_most_one_gop_per_needed_frame(
    make_dataset: Callable[..., Path], bframes: int
) -> None:
    index = load_index(make_dataset(clips=1, cameras=1, frames=120, gop=10, bframes=bframes))
    cam = index.clips[0].cameras[0]
    assert cam.info is not None and len(cam.info.key_indices) == 12
    rng = np.random.default_rng(bframes)
    for trial in range(6):
        wanted = [int(f) for f in rng.choice(range(10, 120), size=int(rng.integers(2, 9)), replace=False)]
        dec = PyAVDecoder(cam.path, info=cam.info)
        frames = dec.get_many(wanted)
        assert [read_stamp(f).frame for f in frames] == wanted
        exact, per_frame = _gop_bound(cam.info, wanted)
        assert dec.frames_decoded <= per_frame, (trial, wanted)
        if bframes == 0:
            assert dec.frames_decoded == exact, (trial, wanted)  # each GOP once, never from the start
        gops = {cam.info.gop_of(f) for f in wanted}
        assert dec.seeks <= len(gops)
    # The same bound holds through the dataset, whose decoders persist across requests.
    # With parallel GOPs each GOP is still decoded once, by one of the file's decoders.
    reqs = random_clips(index, FrameWindow(4, stride=7), count=8, seed=1)
    for gop_threads in (1, 2):
        ds = VideoClipDataset(index=index, requests=reqs, gop_threads=gop_threads)
        for i, req in enumerate(reqs):
            before = ds.decoders.frames_decoded
            check_stamps(ds[i])
            assert ds.decoders.frames_decoded - before <= _gop_bound(cam.info, list(req.frames))[1]
        assert ds.decoders.opened == gop_threads  # decoders of the file, reused


def test_bframes_random_requests_multi_camera(bframe_index: Path) -> None:
    index = load_index(bframe_index)
    reqs = random_clips(index, FrameWindow(5, stride=3), count=10, seed=2)
    reqs += [at_indices("scene-0001", [32, 0, 31, 8, 7])]
    ds = VideoClipDataset(index=index, requests=reqs)
    for i in range(len(ds)):
        check_stamps(ds[i])


def test_get_many_rejects_out_of_range_before_decoding(small_index: Path) -> None:
    cam = load_index(small_index)["scene-0001"].cameras[0]
    dec = PyAVDecoder(cam.path, info=cam.info)
    with pytest.raises(IndexError, match=r"frame 13 is out of range for .*CAM_BACK.mp4', which holds 13 frames"):
        dec.get_many([2, 13])
    assert dec.frames_decoded == 0


# -- image folders ----------------------------------------------------------------------------
def test_image_folder_camera_next_to_a_video_camera(mixed_index: Path) -> None:
    index = load_index(mixed_index)
    assert [c.is_image_folder for c in index.clips[0].cameras] == [False, True]
    ds = VideoClipDataset(index=index, requests=regular_clips(index, FrameWindow(3, stride=2)))
    assert len(ds) == 3
    for i in range(len(ds)):
        check_stamps(ds[i])
    # Times resolve on the first requested camera: the image folder, indexed at the default 30 fps.
    sample = ds[at_times("scene-0007", [0.1, 0.3], cameras=["CAM_B", "CAM_A"])]
    assert sample["frame_index"].tolist() == [3, 9]
    assert sample["timestamp"].tolist() == pytest.approx([0.1, 0.3])
    check_stamps(sample, camera_numbers={"CAM_A": 0, "CAM_B": 1})


@pytest.mark.parametrize(
    ("gop_threads", "decoder_threads", "ffmpeg_threads"),
    [(None, 0, 1), (3, 0, 1), (1, 0, 0), (None, 2, 2), (1, 3, 3)],
)
def test_ffmpeg_threads_follow_the_gop_threads(
    small_index: Path, gop_threads: int | None, decoder_threads: int, ffmpeg_threads: int
) -> None:
    """GOPs decoded at once are the parallelism: each decoder then gets one FFmpeg thread, unless asked for more."""
    index = load_index(small_index)
    reqs = random_clips(index, FrameWindow(3, stride=2), count=4, seed=1)
    ds = VideoClipDataset(
        index=index, requests=reqs, decode=DecodeOptions(decoder_threads=decoder_threads), gop_threads=gop_threads
    )
    assert ds.ffmpeg_threads == ffmpeg_threads
    for i in range(len(ds)):
        check_stamps(ds[i])
    opened = [slot.decoders.peek(key) for slot in ds.decoders.pool.slots for key in slot.decoders.keys()]  # noqa: SIM118
    assert opened and {task.decoder.threads for task in opened} == {ffmpeg_threads}
    ds.close()


# -- DataLoader, samplers, workers ------------------------------------------------------------
@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_with_random_sampler(small_index: Path, num_workers: int) -> None:
    index = load_index(small_index)
    reqs = random_clips(index, FrameWindow(3, stride=2), count=10, seed=0)
    ds = VideoClipDataset(index=index, requests=reqs, decode=DecodeOptions(decoder_threads=1))
    loader = DataLoader(
        ds,
        batch_size=4,
        sampler=RandomSampler(ds, generator=torch.Generator().manual_seed(0)),
        num_workers=num_workers,
        collate_fn=collate_clips,
    )
    seen = []
    for batch in loader:
        assert batch["frames"].shape[1:] == (3, 2, 3, 48, 64)
        assert batch["frame_index"].shape == batch["timestamp"].shape == batch["frames"].shape[:2]
        assert batch["camera_names"] == ["CAM_BACK", "CAM_BACK_LEFT"]
        check_stamps(batch)
        seen += [(c, tuple(f)) for c, f in zip(batch["clip_id"], batch["frame_index"].tolist())]
    assert sorted(seen) == sorted((r.clip_id, r.frames) for r in reqs)


def test_distributed_sampler_ranks_are_disjoint(small_index: Path) -> None:
    index = load_index(small_index)
    reqs = regular_clips(index, FrameWindow(2), hop=3)
    ds = VideoClipDataset(index=index, requests=reqs)
    got = []
    for rank in (0, 1):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=3, drop_last=True)
        sampler.set_epoch(1)
        loader = DataLoader(ds, batch_size=3, sampler=sampler, collate_fn=collate_clips)
        mine = set()
        for batch in loader:
            check_stamps(batch)
            mine |= {(c, tuple(f)) for c, f in zip(batch["clip_id"], batch["frame_index"].tolist())}
        got.append(mine)
    assert got[0] and got[1] and not got[0] & got[1]
    assert len(got[0] | got[1]) == 2 * (len(reqs) // 2)


class RequestSampler(Sampler[ClipRequest]):
    """A user-written sampler that yields requests instead of positions."""

    def __init__(self, clip_ids: list[str]) -> None:
        self.clip_ids = clip_ids

    def __iter__(self) -> Iterator[ClipRequest]:
        for k, clip_id in enumerate(self.clip_ids):
            yield at_indices(clip_id, [k, k + 2, k + 4])

    def __len__(self) -> int:
        return len(self.clip_ids)


def test_user_sampler_yielding_requests(small_index: Path) -> None:
    ds = VideoClipDataset(index=small_index)
    loader = DataLoader(
        ds, batch_size=2, sampler=RequestSampler(["scene-0000", "scene-0002", "scene-0001"]), collate_fn=collate_clips
    )
    batches = list(loader)
    assert [b["clip_id"] for b in batches] == [["scene-0000", "scene-0002"], ["scene-0001"]]
    assert batches[0]["frame_index"].tolist() == [[0, 2, 4], [1, 3, 5]]
    for b in batches:
        check_stamps(b)


def test_workers_forked_from_a_used_dataset_open_their_own_decoders(small_index: Path) -> None:
    index = load_index(small_index)
    reqs = regular_clips(index, FrameWindow(3), hop=5)
    ds = VideoClipDataset(index=index, requests=reqs)  # FFmpeg picks its thread count
    check_stamps(ds[0])  # decoders (and FFmpeg threads) now open in this process
    loader = DataLoader(ds, batch_size=3, num_workers=2, collate_fn=collate_clips, multiprocessing_context="fork")
    seen = 0
    for batch in loader:
        check_stamps(batch)
        seen += len(batch["clip_id"])
    assert seen == len(reqs)
    assert len(ds.decoders) == 2  # the parent's own decoders are still usable
    check_stamps(ds[1])


def test_dataset_pickles_without_open_decoders(small_index: Path) -> None:
    ds = VideoClipDataset(index=small_index, requests=[at_indices("scene-0000", [1, 2])])
    ds[0]
    assert len(ds.decoders) == 2
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._executor is None
    check_stamps(clone[0])


# -- errors -----------------------------------------------------------------------------------
def test_dataset_errors_name_request_clip_and_camera(small_index: Path) -> None:
    with pytest.raises(ValueError, match=r"requests\[1\]: clip 'scene-0099' is not in the index 'index.json'"):
        VideoClipDataset(index=small_index, requests=[at_indices("scene-0000", [0]), at_indices("scene-0099", [0])])
    with pytest.raises(
        IndexError,
        match=r"requests\[0\]: frame 13 is out of range for clip 'scene-0001' in 'index.json', which holds 13 frames",
    ):
        VideoClipDataset(index=small_index, requests=[at_indices("scene-0001", [0, 13])])
    with pytest.raises(ValueError, match=r"clip 'scene-0000' has no camera\(s\) \['CAM_FRONT'\]"):
        VideoClipDataset(index=small_index, requests=[at_indices("scene-0000", [0], cameras=["CAM_FRONT"])])
    with pytest.raises(TypeError, match=r"requests\[0\] is a tuple; build requests with at_indices"):
        VideoClipDataset(index=small_index, requests=[("scene-0000", [0])])  # type: ignore[list-item]
    ds = VideoClipDataset(index=small_index)
    with pytest.raises(IndexError, match="request 0 is out of range: the dataset holds 0 requests"):
        ds[0]
    with pytest.raises(ValueError, match=r"cameras=\['CAM_FRONT'\]: \['CAM_FRONT'\] not in the index 'index.json'"):
        VideoClipDataset(index=small_index, cameras=["CAM_FRONT"])
    with pytest.raises(ValueError, match="max_open_decoders=0"):
        VideoClipDataset(index=small_index, decode=DecodeOptions(max_open_decoders=0))


def test_cameras_of_different_sizes_are_refused_by_name(tmp_path: Path) -> None:
    write_stamped_video(tmp_path / "videos" / "scene-0001" / "CAM_A.mp4", clip=1, camera=0, frames=4, size=(64, 48))
    write_stamped_video(tmp_path / "videos" / "scene-0001" / "CAM_B.mp4", clip=1, camera=1, frames=4, size=(96, 64))
    index_path = build_index(tmp_path, output=tmp_path / "index.json", video_dirs=["videos"], progress=False)
    ds = VideoClipDataset(index=index_path)
    with pytest.raises(ValueError, match=r"different frame sizes \(CAM_A=64x48, CAM_B=96x64\); samples stack cameras"):
        ds[at_indices("scene-0001", [0])]
    check_stamps(ds[at_indices("scene-0001", [3], cameras=["CAM_B"])], camera_numbers={"CAM_B": 1})


def test_collate_errors(small_index: Path) -> None:
    ds = VideoClipDataset(index=small_index)
    a = ds[at_indices("scene-0000", [0, 1])]
    b = ds[at_indices("scene-0001", [0, 1, 2])]
    c = ds[at_indices("scene-0001", [0, 1], cameras=["CAM_BACK"])]
    with pytest.raises(
        ValueError,
        match=r"cannot batch clip 'scene-0000' \(frames \(2, 2, 3, 48, 64\)\) with clip 'scene-0001' \(frames \(3,",
    ):
        collate_clips([a, b])
    with pytest.raises(ValueError, match="must name the same cameras"):
        collate_clips([a, c])
    with pytest.raises(ValueError, match="empty list"):
        collate_clips([])


# -- index_from_files -------------------------------------------------------------------------
def test_index_from_files_caches_frame_tables(
    small_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = load_index(small_index)
    files = [index["scene-0002"].cameras[1].path, index["scene-0001"].cameras[0].path]
    cache = tmp_path / "tables.json"
    built = index_from_files(files, ids=["scene-0002", "scene-0001"], camera="CAM", cache_file=cache)
    assert [c.frame_count for c in built] == [27, 13] and cache.is_file()

    def no_probe(path: Path) -> None:
        raise AssertionError(f"{path} was probed again")

    monkeypatch.setattr("lightning_vstream.indexing.probe", no_probe)
    again = index_from_files(files, ids=["scene-0002", "scene-0001"], camera="CAM", cache_file=cache)
    ds = VideoClipDataset(index=again)
    sample = ds[at_indices("scene-0002", [20, 4])]
    assert [read_stamp(f).camera for f in sample["frames"][:, 0]] == [1, 1]
    assert [read_stamp(f).frame for f in sample["frames"][:, 0]] == [20, 4]
    with pytest.raises(ValueError, match="clip id 'CAM_BACK' is used by both"):
        index_from_files([files[1], index["scene-0000"].cameras[0].path])


# -- ClipVideoDataModule ----------------------------------------------------------------------
class TinyModel:
    @staticmethod
    def make() -> Any:
        import lightning as L

        class Tiny(L.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.layer = torch.nn.Linear(3, 1)
                self.batches: list[dict[str, Any]] = []

            def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
                check_stamps(batch)
                self.batches.append({"clip_id": batch["clip_id"], "frame_index": batch["frame_index"].tolist()})
                x = batch["frames"].float().mean(dim=(1, 2, 4, 5)) / 255
                return self.layer(x).pow(2).mean()

            def configure_optimizers(self) -> torch.optim.Optimizer:
                return torch.optim.SGD(self.parameters(), lr=0.01)

        return Tiny()


def test_datamodule_fits_with_a_trainer(small_index: Path) -> None:
    import lightning as L

    dm = ClipVideoDataModule(
        index_file=small_index,
        sampling=SamplingOptions(segments=[(6.0, 2), (12.0, 2)], selection="random", clips_per_epoch=6),
        batch_size=2,
        seed=1,
    )
    model = TinyModel.make()
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        reload_dataloaders_every_n_epochs=1,
    )
    trainer.fit(model, dm)
    assert trainer.global_step == 6 and dm.world_size == 1 and dm.rank == 0
    first, second = model.batches[:3], model.batches[3:]
    assert first != second  # fresh random clips in the second epoch
    assert all(len(f) == 4 for b in model.batches for f in b["frame_index"])


def test_datamodule_distributed_split_and_samplers(small_index: Path) -> None:
    shards = []
    for rank in (0, 1):
        dm = ClipVideoDataModule(
            index_file=small_index,
            sampling=SamplingOptions(clip_frames=3, frame_stride=2, drop_last=True),
            batch_size=2,
            world_size=2,
            rank=rank,
        )
        dm.setup("fit")
        loader = dm.train_dataloader()
        assert isinstance(loader.sampler, DistributedSampler)
        shards.append({(c, tuple(f)) for b in loader for c, f in zip(b["clip_id"], b["frame_index"].tolist())})
    everything = {(r.clip_id, r.frames) for r in dm.train_requests()}
    assert len(everything) == 11  # odd: drop_last leaves one request out rather than repeating one
    assert not shards[0] & shards[1] and len(shards[0]) == len(shards[1]) == 4  # 5 each, last batch dropped
    assert shards[0] | shards[1] <= everything
    sequential = ClipVideoDataModule(
        index_file=small_index, sampling=SamplingOptions(clip_frames=2, shuffle=False), batch_size=50
    )
    sequential.setup("fit")
    [batch] = sequential.train_dataloader()  # read to the end: its workers stop now, not when collected
    assert [(c, tuple(f)) for c, f in zip(batch["clip_id"], batch["frame_index"].tolist())] == [
        (r.clip_id, r.frames) for r in sequential.train_requests()
    ]
    custom = ClipVideoDataModule(
        index_file=small_index,
        sampling=SamplingOptions(clip_frames=2),
        sampler=lambda ds: RequestSampler(["scene-0001"]),
        val_index_file=small_index,
    )
    custom.setup("fit")
    [batch] = custom.train_dataloader()
    assert batch["frame_index"].tolist() == [[0, 2, 4]]
    assert len(custom.val_dataloader().dataset) == len(regular_clips(load_index(small_index), FrameWindow(2)))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sampling": {"segments": [(1.0, 2)], "clip_frames": 4}}, "^SamplingOptions: pass either segments"),
        (
            {"sampling": {"segments": [(1.0, 2)], "frame_stride": 2}},
            "^SamplingOptions: frame_stride=2 applies to frame windows",
        ),
        (
            {"sampling": {"selection": "uniform"}},
            "^SamplingOptions: selection='uniform' is invalid; expected 'regular' or 'random'",
        ),
        ({"sampler": "shuffle"}, "sampler='shuffle' is invalid; expected None or a callable"),
        ({"batch_size": 0}, "batch_size=0 is invalid; expected an integer >= 1"),
        ({"world_size": 2, "rank": 2}, r"rank=2 is invalid; expected None or an integer in 0..world_size-1"),
        (
            {"engine": {"multiprocessing_context": "thread"}},
            r"^EngineOptions: multiprocessing_context='thread' is invalid",
        ),
        (
            {"errors": {"on_error": "ignore"}},
            r"^ErrorOptions: on_error='ignore' is invalid; expected 'raise' or 'skip'",
        ),
        (
            {"output": {"transform": 3}},
            r"^OutputOptions: transform=3 is invalid; expected None or a callable on frame tensors",
        ),
    ],
)
def test_datamodule_argument_errors(small_index: Path, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ClipVideoDataModule(index_file=small_index, **kwargs)


def test_dataset_refuses_a_camera_string_and_a_clip_id_as_position(small_index: Path) -> None:
    from lightning_vstream.errors import ConfigurationTypeError

    with pytest.raises(
        ConfigurationTypeError,
        match=r"cameras='CAM_BACK' must be a list of camera names, not a single "
        r"string; pass \['CAM_BACK'\]",
    ):
        VideoClipDataset(index=small_index, cameras="CAM_BACK")  # type: ignore[arg-type]
    ds = VideoClipDataset(index=small_index, requests=[at_indices("scene-0000", [1, 2])])
    with pytest.raises(
        ConfigurationTypeError,
        match=r"indexed by request position \(an int in 0\.\.0\) or by a "
        r"ClipRequest, not by a str \('scene-0000'\); to read clip 'scene-0000', pass a request such "
        r"as dataset\[at_indices\('scene-0000', \[0, 1, 2\]\)\]",
    ):
        ds["scene-0000"]  # type: ignore[index]
    with pytest.raises(TypeError, match=r"not by a float \(0\.0\)\.$"):
        ds[0.0]  # type: ignore[index]
    sample = ds[np.int64(0)]  # type: ignore[index]
    check_stamps(sample)


# -- GOPs decoded in parallel -----------------------------------------------------------------------
def test_parallel_gops_return_exactly_the_sequential_frames(bframe_index: Path) -> None:
    index = load_index(bframe_index)
    reqs = random_clips(index, FrameWindow(6, stride=5), count=6, seed=3)
    reqs += [at_indices("scene-0001", [32, 0, 31, 8, 7, 32])]
    one = VideoClipDataset(index=index, requests=reqs, gop_threads=1)
    three = VideoClipDataset(index=index, requests=reqs, gop_threads=3)
    for i in range(len(reqs)):
        a, b = one[i], three[i]
        check_stamps(b)
        assert torch.equal(a["frames"], b["frames"]) and torch.equal(a["frame_index"], b["frame_index"])
    assert three.decoders.opened > one.decoders.opened


def test_forked_workers_start_their_own_gop_threads(small_index: Path) -> None:
    index = load_index(small_index)
    reqs = [at_indices("scene-0002", [1, 20, 8, 14]), at_indices("scene-0000", [19, 2, 13])]
    with pytest.raises(ValueError, match="gop_threads=0 is invalid; expected None or an integer >= 1"):
        VideoClipDataset(index=index, gop_threads=0)
    ds = VideoClipDataset(index=index, requests=reqs, gop_threads=2)
    check_stamps(ds[0])  # the parent's GOP pool and decoders now exist
    loader = DataLoader(ds, batch_size=1, num_workers=2, collate_fn=collate_clips, multiprocessing_context="fork")
    for batch in loader:
        check_stamps(batch)
    ds.close()
