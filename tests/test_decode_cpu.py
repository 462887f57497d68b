"""PyAV decoding: every frame of every stream layout comes back exact, and seeks stay within one GOP."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable
from pathlib import Path

import av
import numpy as np
import pytest
import torch

from lightning_vstream import EngineOptions
from lightning_vstream.decode import FrameDecoder, make_decoder
from lightning_vstream.decode.base import VideoDecodeError
from lightning_vstream.decode.cpu.probe import probe_video
from lightning_vstream.decode.cpu.pyav import PyAVDecoder
from lightning_vstream.demos.synth import Stamp, read_stamp, write_stamped_video
from lightning_vstream.index.tables import VideoInfo, is_reference
from tests._remux import remux

FRAMES = 36
GOP = 8
CAMERA = 3


def _irregular_times(count: int) -> list[float]:
    """Strictly increasing times with uneven gaps, starting away from zero."""
    gaps = (0.04, 0.1, 0.0333, 0.2, 0.0125)
    times, t = [], 0.25
    for i in range(count):
        times.append(round(t, 4))
        t += gaps[i % len(gaps)]
    return times


@dataclasses.dataclass(frozen=True)
class Config:
    """One stream layout to encode: codec, B-frames, size, audio placement, timing."""

    name: str
    codec: str = "h264"
    bframes: int = 0
    size: tuple[int, int] = (64, 48)
    audio_first: bool = False
    vfr: bool = False

    def write(self, path: Path, clip: int) -> Path:
        return write_stamped_video(
            path,
            clip=clip,
            camera=CAMERA,
            frames=FRAMES,
            size=self.size,
            codec=self.codec,  # type: ignore[arg-type]
            gop=GOP,
            bframes=self.bframes,
            audio_first=self.audio_first,
            timestamps=_irregular_times(FRAMES) if self.vfr else None,
        )


CONFIGS = [
    Config("h264"),
    Config("h264-bframes3", bframes=3),
    Config("hevc"),
    Config("hevc-bframes3", codec="hevc", bframes=3),
    Config("h264-audio-first", bframes=2, audio_first=True),
    Config("hevc-audio-first", codec="hevc", bframes=2, audio_first=True),
    Config("h264-vfr", bframes=2, vfr=True),
    Config("hevc-vfr", codec="hevc", bframes=2, vfr=True),
    Config("h264-99x57-444", bframes=2, size=(99, 57)),
    Config("hevc-99x57-444", codec="hevc", bframes=2, size=(99, 57)),
    Config("h264-90x62", bframes=2, size=(90, 62)),
    Config("hevc-90x62", codec="hevc", size=(90, 62)),
]
CONFIG_IDS = [c.name for c in CONFIGS]
CLIP_OF = {c.name: i + 1 for i, c in enumerate(CONFIGS)}
BY_NAME = {c.name: c for c in CONFIGS}


@pytest.fixture(scope="session")
def stamped_video(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Config], Path]:
    """Encodes each configuration once per session; the clip number stamped is the config's position."""
    folder = tmp_path_factory.mktemp("stamped")
    cache: dict[str, Path] = {}

    def get(config: Config) -> Path:
        if config.name not in cache:
            cache[config.name] = config.write(folder / f"{config.name}.mp4", CLIP_OF[config.name])
        return cache[config.name]

    return get


@pytest.fixture(params=CONFIGS, ids=CONFIG_IDS)
def video(request: pytest.FixtureRequest, stamped_video: Callable[[Config], Path]) -> tuple[Config, Path]:
    return request.param, stamped_video(request.param)


@pytest.fixture
def h264_b3(stamped_video: Callable[[Config], Path]) -> Path:
    return stamped_video(BY_NAME["h264-bframes3"])


def _gop_length(decoder: PyAVDecoder) -> int:
    """Longest keyframe interval of the file (what one seek may have to decode)."""
    keys = [*decoder.info.key_indices, decoder.info.frame_count]
    return max(b - a for a, b in itertools.pairwise(keys))


def _check_frame(frame: torch.Tensor, config: Config, index: int) -> None:
    width, height = config.size
    assert frame.shape == (3, height, width)
    assert frame.dtype == torch.uint8
    assert read_stamp(frame) == Stamp(CLIP_OF[config.name], CAMERA, index)


# -- frame table ----------------------------------------------------------------------------


def test_probe_frame_table(video: tuple[Config, Path]) -> None:
    config, path = video
    info = probe_video(path)
    assert info.codec == config.codec
    assert (info.width, info.height) == config.size
    assert info.frame_count == FRAMES
    # The encoder was asked for a keyframe every GOP frames; the seek-cost bounds below rely on it.
    assert info.key_indices == tuple(range(0, FRAMES, GOP))
    assert len(info.key_seek) == len(info.key_indices)
    assert all(b > a for a, b in zip(info.pts, info.pts[1:]))
    if config.vfr:
        expected = _irregular_times(FRAMES)
        assert max(abs(a - b) for a, b in zip(info.timestamps, expected)) < 1e-4
    else:
        assert info.average_fps == pytest.approx(12.0, rel=1e-3)


@pytest.mark.parametrize(
    ("name", "pix_fmt"),
    [
        ("h264-99x57-444", "yuv444p"),
        ("hevc-99x57-444", "yuv444p"),
        ("h264-90x62", "yuv420p"),
        ("hevc-90x62", "yuv420p"),
    ],
)
def test_odd_sizes_are_encoded_444(stamped_video: Callable[[Config], Path], name: str, pix_fmt: str) -> None:
    with av.open(str(stamped_video(BY_NAME[name]))) as container:
        assert container.streams.video[0].codec_context.pix_fmt == pix_fmt


def test_audio_first_puts_video_second(stamped_video: Callable[[Config], Path]) -> None:
    with av.open(str(stamped_video(BY_NAME["h264-audio-first"]))) as container:
        assert [s.type for s in container.streams] == ["audio", "video"]


# -- frame-exact decoding -------------------------------------------------------------------


def test_sequential_read_decodes_every_frame_once(video: tuple[Config, Path]) -> None:
    config, path = video
    decoder = PyAVDecoder(path)
    for index in range(FRAMES):
        assert decoder.position == index
        _check_frame(decoder.read(), config, index)
    assert decoder.position == FRAMES
    # Amplification 1.0: nothing decoded twice, nothing decoded only to be thrown away.
    assert decoder.frames_decoded == FRAMES
    assert decoder.seeks == 0
    decoder.close()


@pytest.mark.parametrize("order", ["shuffled", "backwards"])
def test_random_access_returns_the_requested_frame(video: tuple[Config, Path], order: str) -> None:
    config, path = video
    indices = list(range(FRAMES))
    if order == "shuffled":
        random.Random(1234).shuffle(indices)
    else:
        indices.reverse()
    decoder = PyAVDecoder(path)
    gop = _gop_length(decoder)
    for index in indices:
        before = decoder.frames_decoded
        _check_frame(decoder.get(index), config, index)
        assert decoder.position == index + 1
        assert 1 <= decoder.frames_decoded - before <= gop, f"get({index}) decoded more than one GOP"
    decoder.close()


def test_every_frame_from_a_fresh_decoder_costs_at_most_one_gop(video: tuple[Config, Path]) -> None:
    config, path = video
    info = probe_video(path)
    for index in range(FRAMES):
        decoder = PyAVDecoder(path, info=info)
        _check_frame(decoder.get(index), config, index)
        # Frames from the keyframe at or before the target up to the target, nothing more (non-reference
        # pictures before the target are not decoded at all).
        assert 1 <= decoder.frames_decoded <= index - info.keyframe_at_or_before(index) + 1
        decoder.close()


# -- seek cost --------------------------------------------------------------------------------


def test_far_jump_decodes_only_the_last_gop(h264_b3: Path) -> None:
    decoder = PyAVDecoder(h264_b3)
    decoder.get(0)
    seeks = decoder.seeks
    for index in range(FRAMES - GOP + 1, FRAMES):
        decoder.get(0)
        before = decoder.frames_decoded
        assert read_stamp(decoder.get(index)).frame == index
        # Never decoded from the file start: only the last GOP's frames up to the target.
        assert decoder.frames_decoded - before <= GOP
        key = decoder.info.keyframe_at_or_before(index)
        # Every reference picture shown before the target, and the target; non-reference ones are left out.
        assert _references(decoder.info, key, index) + 1 <= decoder.frames_decoded - before <= index - key + 1
    assert decoder.seeks > seeks


def test_forward_get_within_a_gop_decodes_forward_without_seeking(h264_b3: Path) -> None:
    decoder = PyAVDecoder(h264_b3)
    decoder.get(GOP)
    seeks, decoded = decoder.seeks, decoder.frames_decoded
    assert read_stamp(decoder.get(GOP + 2)).frame == GOP + 2
    assert read_stamp(decoder.get(2 * GOP - 1)).frame == 2 * GOP - 1
    assert decoder.seeks == seeks
    # Frames GOP+1 .. 2*GOP-1 at most once each; the references among them and the two read at least.
    assert _references(decoder.info, GOP + 1, 2 * GOP - 1) + 1 <= decoder.frames_decoded - decoded <= GOP - 1


def _references(info: VideoInfo, first: int, stop: int) -> int:
    """Reference pictures among frames ``first .. stop - 1``."""
    assert info.references is not None
    return sum(is_reference(info.references[f]) for f in range(first, stop))


def test_backward_get_within_a_gop_seeks(h264_b3: Path) -> None:
    decoder = PyAVDecoder(h264_b3)
    decoder.get(GOP + 5)
    seeks = decoder.seeks
    assert read_stamp(decoder.get(GOP + 1)).frame == GOP + 1
    assert decoder.seeks == seeks + 1


def test_overshooting_seek_steps_back_one_gop(h264_b3: Path) -> None:
    info = probe_video(h264_b3)
    # Seek targets of the following keyframe: every jump lands one GOP late, as a demuxer may.
    late = dataclasses.replace(info, key_seek=(*info.key_seek[1:], info.key_seek[-1]))
    for index in (GOP, GOP + 3, 3 * GOP - 1, FRAMES - 5):
        decoder = PyAVDecoder(h264_b3, info=late)
        assert read_stamp(decoder.get(index)).frame == index
        assert decoder.seeks == 2  # the late landing, then one step back


def test_seek_then_read_continues_sequentially(h264_b3: Path) -> None:
    decoder = PyAVDecoder(h264_b3)
    decoder.seek(17)
    assert decoder.position == 17
    assert decoder.frames_decoded == 0  # seek() only moves the cursor
    frames = [read_stamp(decoder.read()).frame for _ in range(5)]
    assert frames == [17, 18, 19, 20, 21]
    assert decoder.frames_decoded == 17 - 16 + 5


def test_close_keeps_position_and_reopens(h264_b3: Path) -> None:
    with PyAVDecoder(h264_b3) as decoder:
        decoder.get(10)
        decoder.close()
        assert "closed" in repr(decoder)
        assert decoder.position == 11
        assert read_stamp(decoder.read()).frame == 11
        assert "open" in repr(decoder)
    assert "closed" in repr(decoder)


def test_metadata_info_is_used_without_probing(h264_b3: Path) -> None:
    info = probe_video(h264_b3)
    decoder = PyAVDecoder(h264_b3, info=info)
    assert decoder.info is info
    assert read_stamp(decoder.get(30)).frame == 30


# -- layout, dtype, factory -----------------------------------------------------------------


@pytest.mark.parametrize(("layout", "shape"), [("chw", (3, 48, 64)), ("hwc", (48, 64, 3))])
def test_layout(h264_b3: Path, layout: str, shape: tuple[int, int, int]) -> None:
    frame = PyAVDecoder(h264_b3, layout=layout).get(5)  # type: ignore[arg-type]
    assert frame.shape == shape
    assert frame.dtype == torch.uint8
    assert read_stamp(frame, layout=layout).frame == 5  # type: ignore[arg-type]


def test_layouts_hold_the_same_pixels(h264_b3: Path) -> None:
    chw = PyAVDecoder(h264_b3, layout="chw").get(9)
    hwc = PyAVDecoder(h264_b3, layout="hwc").get(9)
    assert torch.equal(chw.permute(1, 2, 0), hwc)


def test_invalid_layout() -> None:
    with pytest.raises(ValueError, match=r"layout='CHW' is not supported; use 'chw' or 'hwc'"):
        PyAVDecoder("unused.mp4", layout="CHW")  # type: ignore[arg-type]


def test_negative_threads() -> None:
    with pytest.raises(ValueError, match=r"threads=-1 must be >= 0"):
        PyAVDecoder("unused.mp4", threads=-1)


def test_constructor_opens_nothing(tmp_path: Path) -> None:
    decoder = PyAVDecoder(tmp_path / "missing.mp4")  # no error until a frame is requested
    assert decoder.position == 0
    with pytest.raises(FileNotFoundError, match=r"missing\.mp4.* does not exist"):
        decoder.get(0)


def test_make_decoder_returns_a_pyav_decoder(h264_b3: Path) -> None:
    decoder = make_decoder(h264_b3, layout="hwc", label="scene-0001/CAM_FRONT")
    assert isinstance(decoder, PyAVDecoder)
    assert isinstance(decoder, FrameDecoder)
    assert decoder.get(3).shape == (48, 64, 3)


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("index", [FRAMES, FRAMES + 10, -1])
def test_out_of_range_frame(h264_b3: Path, index: int) -> None:
    decoder = PyAVDecoder(h264_b3, label="scene-0001/CAM_FRONT")
    expected = (
        rf"frame {index} is out of range for '.*h264-bframes3\.mp4' \(scene-0001/CAM_FRONT\), "
        rf"which holds {FRAMES} frames \(valid: 0\.\.{FRAMES - 1}\)"
    )
    with pytest.raises(IndexError, match=expected):
        decoder.get(index)
    with pytest.raises(IndexError, match=expected):
        decoder.seek(index)


def test_read_past_the_end(h264_b3: Path) -> None:
    decoder = PyAVDecoder(h264_b3)
    decoder.get(FRAMES - 1)
    with pytest.raises(
        IndexError, match=rf"frame {FRAMES} is out of range for '.*h264-bframes3\.mp4'.*\(valid: 0\.\.{FRAMES - 1}\)"
    ):
        decoder.read()


def test_probe_rejects_a_file_that_is_not_a_video(tmp_path: Path) -> None:
    path = tmp_path / "junk.mp4"
    path.write_bytes(b"not a video" * 100)
    with pytest.raises(VideoDecodeError, match=r"junk\.mp4' is not a readable video file"):
        probe_video(path)


def test_probe_rejects_a_file_without_video(tmp_path: Path) -> None:
    path = tmp_path / "audio.mp4"
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("aac", rate=16000)
        for i in range(4):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 16000, i * 1024
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    with pytest.raises(VideoDecodeError, match=r"audio\.mp4' holds no video stream"):
        probe_video(path)


def test_probe_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"video file '.*nothing\.mp4' does not exist"):
        probe_video(tmp_path / "nothing.mp4")


def test_stale_frame_table_longer_than_the_file(tmp_path: Path, h264_b3: Path) -> None:
    # The first 24 packets of the file, copied unchanged: a file cut short after its index was built.
    short = remux(h264_b3, tmp_path / "short.mp4", packets=24)
    assert probe_video(short).frame_count == 24
    decoder = PyAVDecoder(short, info=probe_video(h264_b3), label="clip x")
    assert read_stamp(decoder.get(23)).frame == 23
    match = (
        r"short\.mp4' \(clip x\) frame 24: the file ended before this frame although its frame table lists 36 frames"
    )
    with pytest.raises(VideoDecodeError, match=match):
        decoder.read()
    # The decoder recovers: the file is reopened for the next request.
    assert read_stamp(decoder.get(3)).frame == 3


def test_stale_frame_table_with_other_timestamps(stamped_video: Callable[[Config], Path], h264_b3: Path) -> None:
    # Without checksums (a plain frame table) the timestamps are what give a stale table away.
    vfr_info = dataclasses.replace(probe_video(stamped_video(BY_NAME["h264-vfr"])), crc32=None, config_crc32=None)
    decoder = PyAVDecoder(h264_b3, info=vfr_info)
    match = r"frame 0: the decoder produced a frame with timestamp \d+, which is not in the file's frame table"
    with pytest.raises(VideoDecodeError, match=match):
        decoder.get(0)


def test_frame_table_of_another_file_fails_its_codec_checksum(
    stamped_video: Callable[[Config], Path], h264_b3: Path
) -> None:
    other = probe_video(stamped_video(BY_NAME["h264-vfr"]))
    with pytest.raises(VideoDecodeError, match=r"the codec configuration \(SPS/PPS\) differs from the checksum"):
        PyAVDecoder(h264_b3, info=other).get(0)


def test_mpegts_with_bframes_seeks_frame_exactly(tmp_path: Path) -> None:
    """TS demuxers land after the keyframe or past it; the decoder must still be exact, within one GOP."""

    src = write_stamped_video(tmp_path / "src.mp4", clip=1, camera=0, frames=30, gop=8, bframes=3, size=(64, 48))
    ts = remux(src, tmp_path / "clip.ts")
    info = probe_video(ts)
    assert info.frame_count == 30
    decoder = PyAVDecoder(ts, info=info)
    for k in random.Random(0).sample(range(30), 30):
        before = decoder.frames_decoded
        assert read_stamp(decoder.get(k)).frame == k
        assert decoder.frames_decoded - before <= 8


def test_both_seeking_decoders_step_back_by_one_rule() -> None:
    """One GOP earlier after an overshoot; nothing done from the first GOP or without a jump (-1)."""
    from lightning_vstream.decode.base import KeyframeSeeking
    from lightning_vstream.decode.nvdec.decoder import NvDecoder

    class Recorder(KeyframeSeeking):
        def __init__(self) -> None:
            self.jumps: list[int] = []

        def _jump(self, key_ordinal: int) -> None:
            self.jumps.append(key_ordinal)

    seeker = Recorder()
    assert [seeker._step_back(k) for k in (3, 1, 0, -1)] == [2, 0, None, None]
    assert seeker.jumps == [2, 0]
    assert issubclass(PyAVDecoder, KeyframeSeeking) and issubclass(NvDecoder, KeyframeSeeking)
    assert "_step_back" not in vars(PyAVDecoder) and "_step_back" not in vars(NvDecoder)


def test_a_display_rotation_is_refused_at_the_first_frame(
    stamped_video: Callable[[Config], Path], tmp_path: Path
) -> None:
    """A file indexed without its rotation being seen (a hand-written index) is refused when first decoded."""
    import json

    from lightning_vstream import StreamVideoDataModule
    from lightning_vstream.errors import RotatedVideoError
    from tests._remux import rotated_copy

    source = stamped_video(CONFIGS[0])
    rotated = rotated_copy(source, tmp_path / "rotated.mp4", 90)
    decoder = PyAVDecoder(rotated, label="clip 'scene-0000', camera 'CAM_FRONT'")
    with pytest.raises(
        RotatedVideoError,
        match=r"\(clip 'scene-0000', camera 'CAM_FRONT'\): the video carries a display rotation of 90 degrees",
    ):
        decoder.get(0)
    assert read_stamp(PyAVDecoder(source).get(0)) is not None  # the same frames without the matrix decode
    # Through a DataModule: the clip and camera are named.
    clip = tmp_path / "videos" / "scene-0000"
    clip.mkdir(parents=True)
    rotated.rename(clip / "CAM_FRONT.mp4")
    (tmp_path / "index.json").write_text(json.dumps({"videos": {"scene-0000": 4}}))
    dm = StreamVideoDataModule(index_file=tmp_path / "index.json", batch_size=1, engine=EngineOptions(kind="threads"))
    with pytest.warns(Warning):
        dm.setup("fit")
    with pytest.raises(RotatedVideoError, match=r"scene-0000.*CAM_FRONT.*display rotation of 90 degrees"):
        next(iter(dm.train_dataloader()))
