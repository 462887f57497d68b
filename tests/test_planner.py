"""GOP planning (device-independent), checked on the CPU with PyAV and stamps; the runner is tests/test_threads.py's."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from lightning_vstream import DecodeOptions, EngineOptions, SamplingOptions
from lightning_vstream.clips.batch import collate_clips
from lightning_vstream.clips.dataset import VideoClipDataset
from lightning_vstream.clips.selection import at_indices, snap_to_keyframes
from lightning_vstream.decode.base import VideoDecodeError, VideoInfo
from lightning_vstream.decode.cpu.probe import probe_video
from lightning_vstream.decode.gops import GopPlanner, assign_tasks, plan_feed
from lightning_vstream.demos.synth import Stamp, clip_number, read_stamp
from lightning_vstream.index.tables import REFERENCE_UNKNOWN, is_reference, reference_code, temporal_id
from lightning_vstream.indexing import load_index
from tests._gop_shapes import SHAPES, demuxed, gop_shapes

__all__ = ["gop_shapes"]  # the fixture, imported for pytest

FRAMES = 40
GOP = 10


def _info(frames: int = 40, keys: tuple[int, ...] = (0, 10, 20, 30)) -> VideoInfo:
    return VideoInfo("h264", 256, 256, (1, 30), tuple(range(frames)), keys, keys, 30.0)


@pytest.fixture(scope="module")
def index_path(make_dataset: Callable[..., Path]) -> Path:
    return make_dataset(clips=3, cameras=2, frames=FRAMES, size=(64, 48), gop=GOP)


def _check_sample(sample: dict[str, Any]) -> None:
    clip = clip_number(sample["clip_id"])
    for t, index in enumerate(sample["frame_index"].tolist()):
        for c in range(sample["frames"].shape[1]):
            stamp = read_stamp(sample["frames"][t, c])
            assert (stamp.clip, stamp.camera, stamp.frame) == (clip, c, index), (t, c)


# -- planning ----------------------------------------------------------------------------------
def test_planner_groups_wanted_frames_by_gop_once() -> None:
    info = _info()
    planner = GopPlanner()
    # Two requests sharing GOP 1, repeats and any order.
    planner.add_many("a", info, [25, 12, 3, 12], [(0, t) for t in range(4)])
    planner.add_many("a", info, [15, 11], [(1, t) for t in range(2)])
    planner.add_many("b", info, [39], [(0, 0)])
    tasks = planner.tasks()
    assert [(t.source, t.gop, t.frames) for t in tasks] == [
        ("a", 0, (3,)),
        ("a", 1, (11, 12, 15)),
        ("a", 2, (25,)),
        ("b", 3, (39,)),
    ]
    assert tasks[1].targets == (((1, 1),), ((0, 1), (0, 3)), ((1, 0),))
    assert [t.order for t in tasks] == [0, 1, 2, 3]
    assert [t.cost for t in tasks] == [4, 6, 6, 10] and tasks[1].key_index == 10


def test_planner_rejects_out_of_range_frames() -> None:
    with pytest.raises(IndexError, match=r"frame 40 is out of range for 'a', which holds 40 frames"):
        GopPlanner().add("a", _info(), 40, 0)


def test_snap_to_keyframes_is_nearest_with_ties_to_the_earlier() -> None:
    info = _info(keys=(0, 10, 20, 30))
    assert snap_to_keyframes([0, 4, 5, 6, 10, 24, 25, 26, 35, 39], info) == [0, 0, 0, 10, 10, 20, 20, 30, 30, 30]


def test_assign_balances_cost_and_keeps_plan_order() -> None:
    info = _info()
    planner = GopPlanner()
    planner.add_many("a", info, [9, 19, 29, 39], range(4))
    planner.add_many("b", info, [0], [9])
    plan = assign_tasks(planner.tasks(), 2)
    assert [[(t.source, t.gop) for t in w] for w in plan] == [[("a", 0), ("a", 2), ("b", 0)], [("a", 1), ("a", 3)]]
    assert assign_tasks([], 3) == [[], [], []]
    with pytest.raises(ValueError, match=r"workers=0 must be a positive integer"):
        assign_tasks([], 0)


def test_assign_prefers_a_worker_that_has_the_stream_open() -> None:
    info = _info()
    planner = GopPlanner()
    planner.add_many("a", info, [9, 13], range(2))  # costs 10 and 4
    planner.add("b", info, 8, 2)  # cost 9
    plan = assign_tasks(planner.tasks(), 2)
    # "a" GOP 1 joins "a" GOP 0 (load 10) rather than the least-loaded worker (load 9): within half its cost.
    assert [[(t.source, t.gop) for t in w] for w in plan] == [[("a", 0), ("a", 1)], [("b", 0)]]


# -- the dataset: batched GOP reads and the nearest-keyframe policy, on the CPU ----------------
@pytest.mark.parametrize("gop_threads", [1, 3])
def test_dataset_batched_reads_match_the_per_sample_path(index_path: Path, gop_threads: int) -> None:
    index = load_index(index_path)
    rng = random.Random(3)
    requests = [at_indices(c.clip_id, [rng.randrange(FRAMES) for _ in range(4)]) for c in index.clips for _ in range(2)]
    plain = VideoClipDataset(index=index, requests=requests)
    batched = VideoClipDataset(index=index, requests=requests, gop_threads=gop_threads)
    loader = DataLoader(batched, batch_size=3, collate_fn=collate_clips)
    try:
        seen = 0
        for batch in loader:
            for b in range(len(batch["clip_id"])):
                sample = {
                    k: (v[b] if isinstance(v, (list, torch.Tensor)) and k != "camera_names" else v)
                    for k, v in batch.items()
                }
                reference = plain[seen]
                assert torch.equal(sample["frames"], reference["frames"])
                assert torch.equal(sample["frame_index"], reference["frame_index"])
                _check_sample(sample)
                seen += 1
        assert seen == len(requests)
        assert torch.equal(batched[0]["frames"], plain[0]["frames"])  # single items read the same way
    finally:
        batched.close()


@pytest.mark.parametrize("gop_threads", [None, 2])
def test_nearest_keyframe_policy_returns_real_keyframes_labelled_truly(
    index_path: Path, gop_threads: int | None
) -> None:
    index = load_index(index_path)
    clip = index.clips[1]
    dataset = VideoClipDataset(
        index=index,
        requests=[at_indices(clip.clip_id, [3, 14, 16, 27, 39])],
        frame_policy="nearest_keyframe",
        gop_threads=gop_threads,
    )
    try:
        sample = dataset[0]
        assert sample["frame_index"].tolist() == [0, 10, 20, 30, 30]
        info = clip.cameras[0].info
        assert sample["timestamp"].tolist() == [info.timestamp(i) for i in (0, 10, 20, 30, 30)]
        _check_sample(sample)
    finally:
        dataset.close()


def test_nearest_keyframe_decodes_only_keyframes(index_path: Path) -> None:
    index = load_index(index_path)
    clip = index.clips[0]
    dataset = VideoClipDataset(
        index=index, requests=[at_indices(clip.clip_id, [8, 19, 33])], frame_policy="nearest_keyframe"
    )
    dataset[0]
    assert dataset.decoders.frames_decoded == 3 * len(clip.cameras)


def test_dataset_rejects_unknown_policy_device_and_threads(index_path: Path) -> None:
    with pytest.raises(
        ValueError,
        match=r"VideoClipDataset: frame_policy='keyframe' is invalid; expected 'exact' or 'nearest_keyframe'",
    ):
        VideoClipDataset(index=index_path, frame_policy="keyframe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"DecodeOptions: device='gpu' is invalid; expected 'cpu', 'cuda'"):
        VideoClipDataset(index=index_path, decode=DecodeOptions(device="gpu"))
    with pytest.raises(
        ValueError, match=r"VideoClipDataset: gop_threads=-1 is invalid; expected None or an integer >= 1"
    ):
        VideoClipDataset(index=index_path, gop_threads=-1)


def test_dataset_decode_error_propagates_from_a_thread(index_path: Path, tmp_path: Path) -> None:
    index = load_index(index_path)
    clip = index.clips[0]
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video")
    import dataclasses

    from lightning_vstream.index.records import CameraStream

    cam = clip.cameras[0]
    damaged = dataclasses.replace(clip, cameras=(CameraStream(cam.name, broken, cam.info), *clip.cameras[1:]))
    index = dataclasses.replace(index, clips=(damaged, *index.clips[1:]))
    dataset = VideoClipDataset(index=index, requests=[at_indices(clip.clip_id, [5])], gop_threads=2)
    try:
        with pytest.raises(VideoDecodeError, match=r"broken\.mp4.*not a readable video file"):
            dataset[0]
    finally:
        dataset.close()


# -- the DataModule --------------------------------------------------------------------------------
def test_datamodule_passes_the_frame_policy_and_gop_threads(index_path: Path) -> None:
    from lightning_vstream.clips.datamodule import ClipVideoDataModule

    dm = ClipVideoDataModule(
        index_file=index_path,
        sampling=SamplingOptions(clip_frames=3, frame_stride=7, frame_policy="nearest_keyframe", shuffle=False),
        batch_size=2,
        engine=EngineOptions(num_workers=0, threads=2),
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.dataset.frame_policy == "nearest_keyframe" and loader.dataset.gop_threads == 2
    batch = next(iter(loader))
    for b in range(len(batch["clip_id"])):
        indices = batch["frame_index"][b].tolist()
        assert all(i % GOP == 0 for i in indices)
        for t, index in enumerate(indices):
            stamp = read_stamp(batch["frames"][b, t, 0])
            assert (stamp.clip, stamp.frame) == (clip_number(batch["clip_id"][b]), index)
    loader.dataset.close()


def test_datamodule_cuda_without_a_gpu_names_the_fix(index_path: Path) -> None:
    from lightning_vstream.clips.datamodule import ClipVideoDataModule

    if torch.cuda.is_available():
        pytest.skip("checks the no-GPU path")
    dm = ClipVideoDataModule(
        index_file=index_path, decode=DecodeOptions(device="cuda"), engine=EngineOptions(num_workers=0)
    )
    with pytest.raises(RuntimeError, match=r"decode.device='cuda' needs a CUDA GPU.*decode.device='cpu'"):
        dm.setup("fit")
        dm.train_dataloader()
    with pytest.raises(
        ValueError, match=r"DecodeOptions: device='gpu' is invalid; expected 'cpu', 'cuda', 'cuda:<index>' or 'auto'"
    ):
        ClipVideoDataModule(index_file=index_path, decode=DecodeOptions(device="gpu"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"SamplingOptions: frame_policy='fast' is invalid; expected 'exact'"):
        ClipVideoDataModule(index_file=index_path, sampling=SamplingOptions(frame_policy="fast"))  # type: ignore[arg-type]


# -- plan_feed: which packets a decoder is fed -----------------------------------------------------------
_R, _N = reference_code(reference=True, temporal_id=0), reference_code(reference=False, temporal_id=0)


def test_plan_feed_leaves_out_non_reference_pictures_nobody_wants() -> None:
    # I0 P4 B2(ref) B1 B3 P8 B6(ref) B5 B7: an x264 b-pyramid, in decode order.
    order = [0, 4, 2, 1, 3, 8, 6, 5, 7]
    codes = [_R, _N, _R, _N, _R, _N, _R, _N, _R]
    assert plan_feed(order=order, wanted=[4], references=codes) == (0, 4)
    assert plan_feed(order=order, wanted=[0, 4, 8], references=codes) == (0, 4, 2, 8)  # B2 is decoded before P8
    assert plan_feed(order=order, wanted=[3], references=codes) == (0, 4, 2, 3)  # B3 needs the pyramid's B2
    assert plan_feed(order=order, wanted=[5, 1], references=codes) == (0, 4, 2, 1, 8, 6, 5)
    assert plan_feed(order=order, wanted=[], references=codes) == ()
    # Without codes (tables written before them), everything up to the last wanted packet.
    assert plan_feed(order=order, wanted=[3], references=None) == (0, 4, 2, 1, 3)
    # An unknown code reads as a reference.
    unknown = [_R, REFERENCE_UNKNOWN, _R, _N, _R, _N, _R, _N, _R]
    assert plan_feed(order=order, wanted=[3], references=unknown) == (0, 4, 2, 1, 3)


def test_plan_feed_drops_higher_temporal_sub_layers_and_keeps_lower_ones() -> None:
    # x265 temporal-layers=3: I0 P4(t0) B2(t1, TSA_R) B1 B3 (t2, TSA_N).
    order = [0, 4, 2, 1, 3]
    codes = [
        reference_code(reference=True, temporal_id=0),
        reference_code(reference=False, temporal_id=2),
        reference_code(reference=True, temporal_id=1),
        reference_code(reference=False, temporal_id=2),
        reference_code(reference=True, temporal_id=0),
    ]
    assert plan_feed(order=order, wanted=[4], references=codes) == (0, 4)
    assert plan_feed(order=order, wanted=[2], references=codes) == (0, 4, 2)
    assert plan_feed(order=order, wanted=[3], references=codes) == (0, 4, 2, 3)
    # A sub-layer non-reference picture is a reference for higher sub-layers.
    low_n = [codes[0], codes[1], reference_code(reference=False, temporal_id=1), codes[3], codes[4]]
    assert plan_feed(order=order, wanted=[3], references=low_n) == (0, 4, 2, 3)
    assert plan_feed(order=order, wanted=[1, 4], references=low_n) == (0, 4, 2, 1)


def test_plan_feed_names_what_is_not_planned() -> None:
    with pytest.raises(IndexError, match=r"frames \[9\] are wanted but their packets are not among the 3 packets"):
        plan_feed(order=[0, 2, 1], wanted=[1, 9], references=None)
    with pytest.raises(IndexError, match=r"references covers 2 frames, but the packets planned reach frame 2"):
        plan_feed(order=[0, 2, 1], wanted=[1], references=[_R, _N])


def _full_and_planned(path: Path) -> tuple[VideoInfo, list[int], dict[int, tuple[bytes, int]], dict[int, bytes]]:
    info = probe_video(path)
    packets = [(bytes(p), p.pts) for p in demuxed(path)]
    order = [info.index_of_pts(pts) for _, pts in packets]
    assert None not in order
    by_frame = {info.index_of_pts(pts): (data, pts) for data, pts in packets}
    full = _decode(info, by_frame, order)  # type: ignore[arg-type]
    assert sorted(full) == list(range(info.frame_count))
    return info, order, by_frame, full  # type: ignore[return-value]


def _decode(info: VideoInfo, packets: dict[int, tuple[bytes, int]], feed: Sequence[int]) -> dict[int, bytes]:
    """Every frame a bare codec context outputs when fed the packets of ``feed`` (as the remote GOP decoder feeds them),
    as its raw picture planes."""
    import av

    ctx = av.CodecContext.create(info.codec, "r")
    if info.layout is not None and info.layout.extradata:  # MPEG-TS: the configuration is in the packets
        ctx.extradata = info.layout.extradata
    ctx.thread_count = 1
    out: dict[int, bytes] = {}

    def take(frames: Any) -> None:
        for frame in frames:
            index = info.index_of_pts(frame.pts)
            assert index is not None and index not in out, f"frame {index} output twice or unknown"
            assert not frame.is_corrupt
            out[index] = frame.to_ndarray().tobytes()

    for f in feed:
        data, pts = packets[f]
        packet = av.Packet(data)
        packet.pts, packet.time_base = pts, Fraction(*info.time_base)
        take(ctx.decode(packet))
    take(ctx.decode(None))
    return out


def _cases(info: VideoInfo, rng: random.Random) -> list[tuple[str, int, list[int]]]:
    """``(kind, GOP to start at, wanted frames)``: strides over the file, and per GOP strides, single frames
    and random subsets."""
    cases = []
    n, keys = info.frame_count, info.key_indices
    for stride in (1, 2, 3, 6):
        for phase in range(stride):
            cases.append((f"stride {stride}", 0, list(range(phase, n, stride))))
    for g, key in enumerate(keys):
        end = keys[g + 1] if g + 1 < len(keys) else n
        for stride in (2, 3, 6):
            cases.append((f"GOP stride {stride}", g, list(range(key, end, stride))))
        cases.extend(("single", g, [f]) for f in range(key, end))
        for _ in range(4):
            cases.append(("subset", g, rng.sample(range(key, end), rng.randint(1, end - key))))
    return cases


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_planned_packets_decode_every_wanted_frame_bit_exactly(gop_shapes: Callable[[str], Path], shape: str) -> None:
    """Fed only the planned packets, a bare decoder outputs every wanted frame exactly as a full decode does."""
    path = gop_shapes(shape)
    info, order, packets, full = _full_and_planned(path)
    codes = info.references
    assert codes is not None
    start = {g: order.index(k) for g, k in enumerate(info.key_indices)}
    fed_total = wanted_total = 0
    for kind, gop, wanted in _cases(info, random.Random(shape)):
        feed = plan_feed(order=order[start[gop] :], wanted=wanted, references=codes)
        got = _decode(info, packets, feed)
        for frame in wanted:
            assert got.get(frame) == full[frame], f"{kind} {wanted}: frame {frame} differs from the full decode"
        # Nothing is fed that no wanted picture may be predicted from.
        later_tids = {f: max((temporal_id(codes[w]) for w in wanted if feed.index(w) > at), default=-1)
                      for at, f in enumerate(feed)}  # fmt: skip
        for frame in set(feed) - set(wanted):
            code, above = codes[frame], later_tids[frame]
            assert above >= 0 and (temporal_id(code) < above or is_reference(code)), f"{kind}: frame {frame} fed"
        fed_total, wanted_total = fed_total + len(feed), wanted_total + len(wanted)
    assert fed_total >= wanted_total


@pytest.mark.parametrize("shape", ["hevc-stride6", "h264-stride6-open-gop"])
def test_stride_layout_at_its_stride_decodes_only_the_frames_read(
    gop_shapes: Callable[[str], Path], shape: str
) -> None:
    path = gop_shapes(shape)
    info, order, packets, full = _full_and_planned(path)
    wanted = list(range(0, info.frame_count, 6))
    feed = plan_feed(order=order, wanted=wanted, references=info.references)
    assert sorted(feed) == wanted  # decoded / delivered = 1.0: the off-stride pictures are never decoded
    got = _decode(info, packets, feed)
    assert sorted(got) == wanted
    for frame in wanted:
        assert got[frame] == full[frame]
        image = _rgb(info, packets, feed, frame)
        assert read_stamp(image, layout="hwc") == Stamp(5, 0, frame)
    # At stride 1 nothing is left out; one frame between two references needs only those.
    assert plan_feed(order=order, wanted=range(info.frame_count), references=info.references) == tuple(order)
    assert set(plan_feed(order=order, wanted=[3], references=info.references)) == {0, 6, 3}


def _rgb(info: VideoInfo, packets: dict[int, tuple[bytes, int]], feed: Sequence[int], frame: int) -> Any:
    import av

    ctx = av.CodecContext.create(info.codec, "r")
    if info.layout is not None:
        ctx.extradata = info.layout.extradata
    for f in feed:
        packet = av.Packet(packets[f][0])
        packet.pts, packet.time_base = packets[f][1], Fraction(*info.time_base)
        for decoded in [*ctx.decode(packet)]:
            if info.index_of_pts(decoded.pts) == frame:
                return decoded.to_ndarray(format="rgb24")
    for decoded in ctx.decode(None):
        if info.index_of_pts(decoded.pts) == frame:
            return decoded.to_ndarray(format="rgb24")
    raise AssertionError(f"frame {frame} was not output")
