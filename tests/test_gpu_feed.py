"""NVDEC fed only the packets the frames read need: NvDecoder, NvGopDecoder and the batch reader.

The files are the GOP shapes of ``tests/_gop_shapes.py`` (the stride layout of ``vstream encode
--keyframe-stride 6``, B-frame pyramids and flat B-frames, open and closed GOPs, x265's temporal
sub-layers, Annex-B in MPEG-TS), at 192x144 (NVDEC decodes HEVC from 144x144 up) and 43 frames, so a
stream read at the stride of 6 ends on a frame read.

Over the real PyNvVideoCodec and the fake NVIDIA driver (`nvdriver` tests) the packets NVDEC receives
are read from the driver's log (``cuvidParseVideoData``, by timestamp) and every frame returned is
proven by the stamp written into its output buffer by timestamp (``tests/_nvdriver.py``). The fake
decodes no pixels, so the pixels of frames decoded from the packets fed are checked on the stand-in
(``tests/_fake_nvc.py``: FFmpeg behind the library's call names): identical to the same frames decoded
from every packet.
"""

from __future__ import annotations

import functools
import random
import re
import sys
import types
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from _fake_nvc import StandInMemory, caps_runner, fake_module
from _nvdriver import FakeLog, Marker, fake_format, install_marker, probed, stamped_rgb

from lightning_vstream.clips.gpu_reader import BatchReader, PlannedSample
from lightning_vstream.decode.base import VideoDecodeError
from lightning_vstream.decode.gops import GopPlanner, GopTask, plan_feed
from lightning_vstream.decode.nvdec import decoder as decode_gpu
from lightning_vstream.decode.nvdec import session as nvdec
from lightning_vstream.decode.nvdec import sources as nvdec_sources
from lightning_vstream.decode.nvdec.decoder import NvDecoder, NvGopDecoder
from lightning_vstream.decode.nvdec.pool import DecoderPool
from lightning_vstream.index.tables import VideoInfo, is_reference
from tests import _gop_shapes

SIZE = (192, 144)
FRAMES = 43  # 0 .. 42: at the stride of 6 the stream ends on a frame read
STRIDE = 6
STRIDE_SHAPES = ["hevc-stride6", "h264-stride6-open-gop"]
B_SHAPES = [
    "h264-b3-pyramid",
    "h264-b3-flat",
    "h264-b3-annexb-ts",
    "hevc-b3-pyramid-open-gop",
    "hevc-b3-closed-gop",
    "hevc-temporal-layers",
    "hevc-b3-annexb-ts",
]
SHAPES = ["h264-ippp", "hevc-ippp", *STRIDE_SHAPES, *B_SHAPES]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``shape -> path`` of its 192x144 video, each encoded once per module when first asked for."""
    root = tmp_path_factory.mktemp("feed-shapes")
    made: dict[str, Path] = {}

    def get(shape: str) -> Path:
        encoder, _, _, suffix = _gop_shapes.SHAPES[shape]
        _gop_shapes.require_encoder(encoder)
        if shape not in made:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(_gop_shapes, "SIZE", SIZE)  # the shapes' own 64x48 is below NVDEC's minimum
                made[shape] = _gop_shapes.encode(root / f"{shape}.{suffix}", shape, frames=FRAMES)
        return made[shape]

    return get


@pytest.fixture
def marker(monkeypatch: pytest.MonkeyPatch) -> Marker:
    """Stamps every frame the GPU readers decode (see tests/_nvdriver.py)."""
    return install_marker(monkeypatch)


@pytest.fixture
def fake_log() -> FakeLog:
    """The fake driver's call log from the start of the test."""
    return FakeLog()


@pytest.fixture(params=["from_the_tables_places", "through_the_demuxer"])
def reading(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both packet sources: the file's bytes at the places the frame tables record, and PyAV's demuxer."""
    if request.param == "through_the_demuxer":
        monkeypatch.setattr(nvdec_sources, "config_format", lambda info: None)
    return str(request.param)


def _sent(log: FakeLog, info: VideoInfo) -> list[int]:
    """The frames whose packets NVDEC received, in the order it received them (end-of-stream calls left out)."""
    lines = [line for line in log.calls("cuvidParseVideoData") if " size=0 " not in line]
    found = [re.search(r" ts=(-?\d+) ", line) for line in lines]
    assert all(found), lines
    return [info.pts_index[int(m.group(1))] for m in found if m]


def _assert_stamped(frames: dict[int, torch.Tensor], clip: int, path: Path) -> None:
    info, spec = probed(path)
    for index, frame in frames.items():
        expected = stamped_rgb((clip, 0, index), info.height, info.width, spec)
        assert torch.equal(frame, expected), f"{path.name}: frame {index} does not carry its own stamp"


def _decode_order(path: Path, info: VideoInfo) -> list[int]:
    return [info.pts_index[packet.pts] for packet in _gop_shapes.demuxed(path)]


def _tasks(info: VideoInfo, wanted: Sequence[int]) -> list[GopTask]:
    planner = GopPlanner()
    planner.add_many("file", info, wanted, range(len(wanted)))
    return planner.tasks()


def _decoded(decoder: NvGopDecoder, task: GopTask) -> dict[int, torch.Tensor]:
    """Decode ``task``; its frames, converted."""
    out: dict[int, torch.Tensor] = {}
    decoder.decode_gop(task, lambda i, f: out.__setitem__(i, f.convert(f.surface)))
    return out


def _planned(order: list[int], info: VideoInfo, task: GopTask) -> tuple[tuple[int, ...], int]:
    """What plan_feed plans for ``task`` and how many packets up to its last wanted one it leaves out."""
    start = order.index(task.key_index)
    plan = plan_feed(order=order[start:], wanted=task.frames, references=info.references)
    last = max(order.index(f) for f in task.frames)
    return plan, last - start + 1 - len(plan)


# -- NvDecoder over the real library ------------------------------------------------------------------
@pytest.mark.nvdriver
@pytest.mark.parametrize("announced", [True, False], ids=["announced", "learnt"])
@pytest.mark.parametrize("shape", STRIDE_SHAPES)
def test_reading_at_the_layouts_stride_feeds_nvdec_only_the_frames_read(
    shapes: Callable[[str], Path],
    shape: str,
    announced: bool,
    reading: str,
    marker: Marker,
    monkeypatch: pytest.MonkeyPatch,
    fake_log: FakeLog,
) -> None:
    path = shapes(shape)
    info, _ = probed(path)
    fake_format(monkeypatch, info)
    marker.add(info, 3, 0)
    wanted = list(range(0, FRAMES, STRIDE))
    assert info.references is not None and [f for f in range(FRAMES) if is_reference(info.references[f])] == wanted
    with NvDecoder(path, info=info, pool=DecoderPool()) as dec:
        if announced:
            dec.expect(range(0, info.frame_count, STRIDE))
        frames = {i: dec.get(i).clone() for i in wanted}
        fed, skipped, decoded, seeks = dec.packets_fed, dec.packets_skipped, dec.frames_decoded, dec.seeks
    _assert_stamped(frames, 3, path)
    sent = _sent(fake_log, info)
    assert fed == len(sent) and fed + skipped == FRAMES and decoded == fed  # each packet fed once or passed over
    assert seeks == 0  # read on across keyframes: what lies between is passed over
    if announced:
        # Decoded / delivered = 1: the pictures between the frames read never reach NVDEC.
        assert sent == wanted and skipped == FRAMES - len(wanted) and decoded == len(wanted)
    else:
        # Two reads 6 apart teach the stride: once it is known (the third read, frame 12), only the frames read
        # are fed; before, pictures after a frame read went to NVDEC too.
        assert set(wanted) <= set(sent) and all(f < 12 for f in sent if f not in wanted)
        assert skipped >= FRAMES - len(wanted) - 2 * (STRIDE - 1)


@pytest.mark.nvdriver
@pytest.mark.parametrize("shape", [*STRIDE_SHAPES, "h264-b3-pyramid", "hevc-temporal-layers"])
def test_a_frame_passed_over_is_read_exactly_after_a_restart(
    shapes: Callable[[str], Path], shape: str, marker: Marker, monkeypatch: pytest.MonkeyPatch, fake_log: FakeLog
) -> None:
    path = shapes(shape)
    info, _ = probed(path)
    fake_format(monkeypatch, info)
    marker.add(info, 4, 0)
    got: dict[int, torch.Tensor] = {}
    with NvDecoder(path, info=info, pool=DecoderPool()) as dec:
        dec.expect(range(0, FRAMES, STRIDE))
        for index in range(0, 24, STRIDE):
            got[index] = dec.get(index).clone()
        seeks = dec.seeks
        assert dec.packets_skipped > 0
        got[20] = dec.get(20).clone()  # ahead, but passed over on the way to 18's output
        if shape in STRIDE_SHAPES:
            assert dec.seeks == seeks + 1  # decoding restarted at its keyframe
        got[21] = dec.read().clone()  # and reads on from there
        got[22] = dec.get(22).clone()
        got[7] = dec.get(7).clone()  # backwards, past pictures passed over
        got[30] = dec.get(30).clone()
    _assert_stamped(got, 4, path)
    assert len(set(_sent(fake_log, info))) < FRAMES  # some packets never went to NVDEC


@pytest.mark.nvdriver
@pytest.mark.parametrize("shape", SHAPES)
def test_reading_every_frame_feeds_every_packet_once(
    shapes: Callable[[str], Path], shape: str, marker: Marker, monkeypatch: pytest.MonkeyPatch, fake_log: FakeLog
) -> None:
    path = shapes(shape)
    info, _ = probed(path)
    fake_format(monkeypatch, info)
    marker.add(info, 5, 0)
    with NvDecoder(path, info=info, pool=DecoderPool()) as dec:
        frames = {i: dec.read().clone() for i in range(FRAMES)}
        assert dec.packets_skipped == 0 and dec.packets_fed == FRAMES == dec.frames_decoded
    with NvDecoder(path, info=info, pool=DecoderPool()) as dec:
        dec.expect(range(FRAMES))  # stride 1, announced
        assert all(torch.equal(dec.get(i), frames[i]) for i in range(FRAMES))
        assert dec.packets_skipped == 0 and dec.seeks == 0
    _assert_stamped(frames, 5, path)
    assert sorted(_sent(fake_log, info)) == sorted(2 * list(range(FRAMES)))  # each decoder: every packet, once


@pytest.mark.nvdriver
@pytest.mark.parametrize("shape", [*STRIDE_SHAPES, *B_SHAPES])
def test_reads_in_any_order_return_their_own_frames(
    shapes: Callable[[str], Path], shape: str, reading: str, marker: Marker, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = shapes(shape)
    info, _ = probed(path)
    fake_format(monkeypatch, info)
    marker.add(info, 6, 0)
    order = random.Random(shape).sample(range(FRAMES), FRAMES)
    with NvDecoder(path, info=info, pool=DecoderPool()) as dec:
        frames = {i: dec.get(i).clone() for i in order}
        assert dec.packets_skipped > 0  # non-reference pictures before a frame read are never fed
    _assert_stamped(frames, 6, path)


# -- NvGopDecoder and the batch reader over the real library ---------------------------------------------
@pytest.mark.nvdriver
@pytest.mark.parametrize("shape", SHAPES)
def test_random_access_feeds_nvdec_what_plan_feed_plans(
    shapes: Callable[[str], Path], shape: str, marker: Marker, monkeypatch: pytest.MonkeyPatch, fake_log: FakeLog
) -> None:
    path = shapes(shape)
    info, _ = probed(path)
    fake_format(monkeypatch, info)
    marker.add(info, 7, 0)
    order = _decode_order(path, info)
    rng = random.Random(7)
    cases = [list(range(0, FRAMES, STRIDE)), list(range(3, FRAMES, STRIDE)), [1, 2, 13, 22, 23, 35, 41]]
    cases += [sorted(rng.sample(range(FRAMES), 5)) for _ in range(4)]
    decoder = NvGopDecoder(path, info=info, gpu=0, pool=DecoderPool())
    fed = skipped = 0
    try:
        for wanted in cases:
            for task in _tasks(info, wanted):
                log = FakeLog()
                out = _decoded(decoder, task)
                plan, left_out = _planned(order, info, task)
                assert tuple(_sent(log, info)) == plan, (wanted, task.frames)
                assert sorted(out) == list(task.frames)
                _assert_stamped(out, 7, path)
                fed += len(plan)
                skipped += left_out
        assert decoder.packets_fed == fed == decoder.frames_decoded  # every frame fed comes out, once
        assert decoder.packets_skipped == skipped
        assert (skipped == 0) == shape.endswith("-ippp")  # only streams where every picture is a reference
    finally:
        decoder.close()


@pytest.mark.nvdriver
def test_the_batch_reader_counts_the_packets_its_decoders_pass_over(
    shapes: Callable[[str], Path], marker: Marker, monkeypatch: pytest.MonkeyPatch, fake_log: FakeLog
) -> None:
    path = shapes("hevc-stride6")
    info, _ = probed(path)
    fake_format(monkeypatch, info)
    marker.add(info, 8, 0)
    windows = [(0, 6, 12, 18), (24, 30, 36, 42), (13, 19, 25, 31)]
    samples = [PlannedSample(f"c{n}", ("CAM",), (path,), (info,), ("CAM",), w) for n, w in enumerate(windows)]
    reader = BatchReader(gpu=0, device="cpu", threads=2, pool=DecoderPool())
    try:
        out = reader.read(samples)
        skipped = reader.packets_skipped
    finally:
        reader.close()
    for window, got in zip(windows, out):
        _assert_stamped({index: got[t, 0] for t, index in enumerate(window)}, 8, path)
    order = _decode_order(path, info)
    planned = [_planned(order, info, task) for task in _tasks(info, [f for w in windows for f in w])]
    assert skipped == sum(left_out for _, left_out in planned) > 0
    assert sorted(_sent(fake_log, info)) == sorted(f for plan, _ in planned for f in plan)
    assert reader.packets_skipped == skipped  # the closed decoders' counts are kept


@pytest.mark.nvdriver
def test_a_wanted_frame_nvdec_never_returns_is_named(
    shapes: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = shapes("h264-ippp")
    info, _ = probed(path)
    fake_format(monkeypatch, info)
    lost = info.pts[5]

    class Losing:
        def __init__(self, real: Any) -> None:
            self.real = real

        def Decode(self, data: Any) -> list[Any]:
            return [f for f in self.real.Decode(data) if f.getPTS() != lost]

    real = nvdec.create_session

    def create(*args: Any, **kwargs: Any) -> Any:
        session = real(*args, **kwargs)
        session.decoder = Losing(session.decoder)
        return session

    monkeypatch.setattr(decode_gpu, "create_session", create)
    decoder = NvGopDecoder(path, info=info, gpu=0, pool=DecoderPool(), label="clip 'x', camera 'CAM'")
    with pytest.raises(VideoDecodeError, match=r"camera 'CAM'\) frame 5: the decoder returned no frame for this"):
        decoder.decode_gop(_tasks(info, [5])[0], lambda i, f: None)


# -- the pixels, on the stand-in --------------------------------------------------------------------------
@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The stand-in module (FFmpeg behind PyNvVideoCodec's names), with GPU 0's capabilities."""
    module = fake_module()
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", module)
    monkeypatch.setattr(nvdec, "_caps_tables", {})
    nvdec.gpu_caps(0, runner=caps_runner())
    return module


@functools.cache
def _every_packet(path: Path) -> dict[int, torch.Tensor]:
    """Every frame of ``path`` as the stand-in decodes it from every packet, in order (no jump)."""
    info, _ = probed(path)
    with NvDecoder(path, info=replace(info, references=None), memory=StandInMemory(), pool=DecoderPool()) as dec:
        return {index: dec.read().clone() for index in range(FRAMES)}


def _differing(got: dict[int, torch.Tensor], path: Path) -> list[int]:
    return [index for index, frame in got.items() if not torch.equal(frame, _every_packet(path)[index])]


@pytest.mark.parametrize("shape", [*STRIDE_SHAPES, *B_SHAPES])
def test_frames_decoded_from_the_packets_fed_are_those_decoded_from_every_packet(
    shapes: Callable[[str], Path], shape: str, stand_in: types.ModuleType
) -> None:
    path = shapes(shape)
    info, _ = probed(path)
    with NvDecoder(path, info=info, memory=StandInMemory(), pool=DecoderPool()) as dec:
        dec.expect(range(0, FRAMES, STRIDE))
        got = {index: dec.get(index).clone() for index in range(0, FRAMES, STRIDE)}
        assert dec.packets_skipped > 0 and (dec.seeks == 0 or shape not in STRIDE_SHAPES)
        assert not _differing(got, path)
        # H.264 open GOPs: a keyframe after the first is a recovery point (no IDR), with no parameter sets in
        # front; the stand-in starts a fresh FFmpeg decoder after every end of stream, so it decodes from it only
        # because the source puts the parameter sets in front of the first packet after a jump.
        got = {20: dec.get(20).clone()}  # passed over on the way to 42's output: decoded again from its keyframe
        for index in random.Random(1).sample(range(FRAMES), FRAMES):
            got[index] = dec.get(index).clone()
        assert not _differing(got, path)
    # GOP tasks: each wanted frame as decoded from every packet.
    decoder = NvGopDecoder(path, info=info, gpu=0, pool=DecoderPool(), memory=StandInMemory())
    try:
        for wanted in (list(range(0, FRAMES, STRIDE)), [2, 9, 10, 23, 37, 41], [5, 6, 7, 8, 40]):
            got = {}
            for task in _tasks(info, wanted):
                got.update(_decoded(decoder, task))
            assert sorted(got) == wanted and not _differing(got, path)
        assert decoder.packets_skipped > 0
    finally:
        decoder.close()
