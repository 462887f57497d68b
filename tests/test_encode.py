"""`vstream encode`: image folders and videos -> one video per camera, frame-exact, source times kept."""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from lightning_vstream.cli import main
from lightning_vstream.decode import make_decoder
from lightning_vstream.decode.images import write_timestamps
from lightning_vstream.demos.synth import Stamp, draw_stamp, read_stamp, write_stamped_video
from lightning_vstream.encode import CameraSource, EncodeSettings, encode_index, encode_sources
from lightning_vstream.errors import ConfigurationError, EncodeError, VideoDecodeError
from lightning_vstream.indexing import build_index, load_index

PIL = pytest.importorskip("PIL.Image")

CAMERAS = ("CAM_BACK", "CAM_FRONT")
DROPPED = 4  # frame number missing from every camera's source (a dropped frame)


def _times(clip: int, camera: int, count: int) -> list[float]:
    """Source times: a UNIX start, irregular intervals, a long gap, and the dropped frame's gap."""
    t, out = 1_532_402_927.612_460 + clip, []
    rng = np.random.default_rng(clip * 10 + camera)
    for i in range(count + 1):
        if i != DROPPED:
            out.append(round(t, 6))
        t += 0.083_333 + float(rng.integers(-900, 900)) * 1e-6 + (0.4 if i == 7 else 0.0)
    return out


def write_image_dataset(root: Path, *, clips: int = 2, frames: int = 12) -> Path:
    """Stamped JPEG folders with timestamps.txt; stamps carry the source frame number (4 is missing)."""
    for c in range(clips):
        for k, cam in enumerate(CAMERAS):
            folder = root / "images" / f"scene-{c:04d}" / cam
            folder.mkdir(parents=True)
            rng = np.random.default_rng(c * 10 + k)
            numbers = [i for i in range(frames + 1) if i != DROPPED]
            for n in numbers:
                image = rng.integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
                draw_stamp(image, Stamp(c, k, n))
                PIL.fromarray(image).save(folder / f"{n:06d}.jpg", quality=95)
            write_timestamps(folder, _times(c, k, frames))
    return build_index(root, output=root / "index.json", progress=False)


@pytest.fixture(scope="module")
def image_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_dataset(tmp_path_factory.mktemp("images"))


def _exact_times(info: object) -> list[Fraction]:
    num, den = info.time_base  # type: ignore[attr-defined]
    return [Fraction(p * num, den) for p in info.pts]  # type: ignore[attr-defined]


def check_round_trip(src_index: Path, out_index: Path) -> None:
    """Every frame of every camera decodes to its source image's stamp, at exactly its source time."""
    src, out = load_index(src_index), load_index(out_index)
    assert [c.clip_id for c in out] == [c.clip_id for c in src]
    assert out.camera_names == src.camera_names
    for clip in out:
        assert clip.frame_count == src[clip.clip_id].frame_count
        for k, cam in enumerate(clip.cameras):
            source = make_decoder(src[clip.clip_id].cameras[k].path)
            encoded = make_decoder(cam.path)
            assert cam.path.suffix == ".mp4" and cam.path.parent.parent.name == "videos"
            assert _exact_times(encoded.info) == _exact_times(source.info)  # times kept, gaps included
            expected = [read_stamp(source.get(i)) for i in range(source.info.frame_count)]
            assert [read_stamp(encoded.get(i)) for i in range(encoded.info.frame_count)] == expected
            # Random access lands on the same frames.
            n = len(expected)
            for i in (n - 2, 2, n - 1, 0):
                assert read_stamp(encoded.get(i)) == expected[i]


@pytest.mark.parametrize(("codec", "bframes"), [("h264", 0), ("hevc", 2)])
def test_image_folders_round_trip_with_source_times(
    image_index: Path, tmp_path: Path, codec: str, bframes: int
) -> None:
    summary = encode_index(image_index, tmp_path / "out", codec=codec, gop=4, bframes=bframes, crf=18, progress=False)
    assert summary.index == tmp_path / "out" / "index.json"
    assert (summary.files_encoded, summary.files_skipped, summary.frames_encoded) == (4, 0, 48)
    assert summary.output_bytes > 0 and summary.source_bytes > 0 and summary.frames_per_second > 0
    check_round_trip(image_index, summary.index)
    info = make_decoder(load_index(summary.index)[0].cameras[0].path).info
    assert info.codec == codec and info.key_indices == (0, 4, 8)
    times = info.timestamps
    assert times[0] == pytest.approx(1_532_402_927.612_460, abs=1e-6)
    gaps = np.diff(times)
    assert gaps[DROPPED - 1] == pytest.approx(2 * gaps[0], rel=0.05)  # the dropped frame stays a gap
    assert gaps.max() > 0.4  # so does the long one


def test_rerun_skips_done_files_and_redoes_damaged_ones(image_index: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    encode_index(image_index, out, codec="h264", crf=18, progress=False)
    again = encode_index(image_index, out, codec="h264", crf=18, progress=False)
    assert (again.files_encoded, again.files_skipped, again.frames_encoded) == (0, 4, 0)
    damaged = out / "videos" / "scene-0001" / "CAM_FRONT.mp4"
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    (out / "videos" / "scene-0000" / "CAM_BACK.mp4").unlink()
    stale = out / "videos" / "scene-0000" / "CAM_FRONT.mp4.partial"
    stale.write_bytes(b"left over by a killed run")
    third = encode_index(image_index, out, codec="h264", crf=18, progress=False)
    assert (third.files_encoded, third.files_skipped) == (2, 2)
    check_round_trip(image_index, third.index)
    # A different codec is not "done": the files are encoded again.
    assert encode_index(image_index, out, codec="hevc", progress=False).files_encoded == 4


def test_video_source_keeps_variable_frame_times(tmp_path: Path) -> None:
    times = [0.0, 0.05, 0.1, 0.35, 0.4, 0.41, 0.9, 1.0]
    for k, cam in enumerate(CAMERAS):
        write_stamped_video(
            tmp_path / "src" / "videos" / "scene-0003" / f"{cam}.mp4",
            clip=3,
            camera=k,
            frames=len(times),
            timestamps=times,
            bframes=2,
            gop=4,
        )
    src = build_index(tmp_path / "src", output=tmp_path / "src" / "index.json", progress=False)
    summary = encode_index(src, tmp_path / "out", codec="hevc", crf=20, gop=3, progress=False)
    check_round_trip(src, summary.index)
    assert load_index(summary.index, check="thorough")[0].cameras[1].info.timestamps == pytest.approx(times)


def test_encode_sources_from_image_lists_and_cli(
    image_index: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = load_index(image_index)[0].cameras[0].path
    files = tuple(sorted(folder.glob("*.jpg")))[:5]
    src = CameraSource("clip-a", "CAM_X", files, tuple(1_000_000 * i + 7 for i in (0, 1, 2, 5, 6)))
    summary = encode_sources([src], tmp_path / "lists", settings=EncodeSettings(codec="h264", crf=18), progress=False)
    info = load_index(summary.index)[0].cameras[0].info
    assert info is not None and info.pts == (7, 1_000_007, 2_000_007, 5_000_007, 6_000_007)
    assert info.time_base == (1, 1_000_000)
    assert main(["encode", str(image_index), str(tmp_path / "cli"), "--codec", "h264", "--crf", "18", "-q"]) == 0
    assert "4 files (4 encoded, 0 already done), 48 frames, " in capsys.readouterr().out
    assert main(["encode", str(image_index), str(tmp_path / "cli"), "--codec", "h264", "--crf", "18", "-q"]) == 0
    assert "4 files (0 encoded, 4 already done), 0 frames, " in capsys.readouterr().out
    assert (
        main(["encode", str(image_index), str(tmp_path / "cli2"), "--bitrate", "fast", "-q"]) == 2
    )  # a malformed option value: the command line is wrong
    assert "vstream encode: error: bitrate='fast' is not a bit rate" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        main(["encode", str(image_index), str(tmp_path / "cli2"), "--crf", "70"])
    assert usage.value.code == 2 and "'70' must be from 0 (lossless) to 51" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"codec": "vp9"}, "codec='vp9' is not supported; use 'hevc' or 'h264'"),
        ({"gop": 0}, "gop=0 must be a keyframe interval of at least 1 frame"),
        ({"bframes": -1}, "bframes=-1 must be an integer from 0 to 16"),
        ({"crf": 20, "bitrate": "4M"}, "were both given; pick one"),
        ({"bitrate": "fast"}, "bitrate='fast' is not a bit rate"),
        ({"bitrate": 0}, "bitrate=0 must be positive"),
        ({"keyframe_stride": 0}, r"keyframe_stride=0 must be an integer from 1 \(the usual layout\) to 17"),
        ({"keyframe_stride": 18}, "keyframe_stride=18 must be an integer from 1"),
        ({"keyframe_stride": True}, "keyframe_stride=True must be an integer"),
        (
            {"gop": 12, "keyframe_stride": 5},
            r"gop=12 is not a multiple of keyframe_stride=5: .* Use gop=15 \(--gop 15\)",
        ),
        ({"bframes": 2, "keyframe_stride": 6}, r"bframes=2 does not fit keyframe_stride=6, .* set it to 5\)"),
    ],
)
def test_bad_settings_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        EncodeSettings(**kwargs)


def test_bitrate_suffixes() -> None:
    assert EncodeSettings(bitrate="4M").bitrate == 4_000_000
    assert EncodeSettings(bitrate="800k").quality == "800000 bit/s"
    assert EncodeSettings(codec="h264").quality == "crf 23"


def test_bad_inputs_give_named_errors(image_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        encode_index(tmp_path / "missing.json", tmp_path / "out", progress=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigurationError, match="is a file; give a folder"):
        encode_index(image_index, tmp_path / "file", progress=False)
    with pytest.raises(ConfigurationError, match="jobs=0 must be a positive number"):
        encode_index(image_index, tmp_path / "out", jobs=0, progress=False)
    with pytest.raises(ConfigurationError, match=r"holds the source index .* which encoding would overwrite"):
        encode_index(image_index, image_index.parent / "images" / "..", progress=False)
    write_stamped_video(tmp_path / "v" / "videos" / "scene-0000" / "CAM.mp4", clip=0, camera=0, frames=2)
    video_index = build_index(tmp_path / "v", output=tmp_path / "v" / "train.json", progress=False)
    with pytest.raises(ConfigurationError, match="would write clip 'scene-0000' into its own source folder"):
        encode_index(video_index, tmp_path / "v", progress=False)
    with pytest.raises(ConfigurationError, match="are not strictly increasing"):
        CameraSource("c", "CAM", (Path("a.jpg"), Path("b.jpg")), (5, 5))
    with pytest.raises(ConfigurationError, match="2 image files but 1 timestamps"):
        CameraSource("c", "CAM", (Path("a.jpg"), Path("b.jpg")), (5,))
    with pytest.raises(ConfigurationError, match="listed twice"):
        src = CameraSource("c", "CAM", (Path("a.jpg"),), (5,))
        encode_sources([src, src], tmp_path / "out", progress=False)
    broken = tmp_path / "broken"
    files = sorted(load_index(image_index)[0].cameras[0].path.glob("*.jpg"))[:3]
    (tmp_path / "bad.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(VideoDecodeError, match=r"clip 'c', camera 'CAM' frame 2 \(.*bad.jpg'\): unreadable image"):
        encode_sources(
            [CameraSource("c", "CAM", (*files[:2], tmp_path / "bad.jpg"), (0, 1, 2))], broken, progress=False
        )
    assert not list(broken.rglob("*.mp4*"))  # nothing half-written is left behind

    from lightning_vstream.encode import writer

    monkeypatch.setattr(writer, "mismatch", lambda task, path, codec, stride=1: "frame 3 is at 1.0 s instead of 1.5 s")
    with pytest.raises(
        EncodeError,
        match=r"clip 'c', camera 'CAM': the encoded file does not keep the source "
        r"frames: frame 3 is at 1.0 s instead of 1.5 s\. Use bframes=0",
    ):
        encode_sources(
            [CameraSource("c", "CAM", tuple(files), (0, 1, 2))],
            broken,
            settings=EncodeSettings(codec="h264", bframes=2),
            progress=False,
        )
    assert not list(broken.rglob("*.mp4*"))


@pytest.mark.slow
def test_parallel_jobs(image_index: Path, tmp_path: Path) -> None:
    summary = encode_index(image_index, tmp_path / "out", codec="h264", crf=18, jobs=2, progress=False)
    assert summary.files_encoded == 4 and os.path.isfile(summary.index)
    check_round_trip(image_index, summary.index)


@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_keyframe_stride_layout_keeps_every_frame_and_only_the_stride_as_references(
    image_index: Path, tmp_path: Path, codec: str
) -> None:
    from lightning_vstream.decode.cpu.probe import probe_video
    from lightning_vstream.decode.gops import plan_feed
    from lightning_vstream.index import is_reference

    summary = encode_index(image_index, tmp_path / "out", codec=codec, gop=8, keyframe_stride=4, progress=False)
    check_round_trip(image_index, summary.index)  # every frame, frame-exact, at its source time (gaps kept)
    for clip in load_index(summary.index):
        for cam in clip.cameras:
            info = cam.info
            assert info is not None and info.references is not None
            assert info.key_indices == (0, 8)
            refs = [f for f in range(info.frame_count) if is_reference(info.references[f])]
            # 12 frames: 0, 4, 8 on the stride; the encoder closes the stream with a reference (11).
            assert refs == [0, 4, 8, 11]
            order = sorted(range(info.frame_count), key=probe_video(cam.path).layout.pos.__getitem__)  # type: ignore[union-attr]
            assert plan_feed(order=order, wanted=[0, 4, 8], references=info.references) == (0, 4, 8)
    # Asked again: done. Asked for the usual layout: done too (any layout holds every frame). Asked for
    # another stride: encoded again.
    assert (
        encode_index(image_index, tmp_path / "out", codec=codec, gop=8, keyframe_stride=4, progress=False).files_skipped
        == 4
    )
    assert encode_index(image_index, tmp_path / "out", codec=codec, gop=8, progress=False).files_skipped == 4
    assert (
        encode_index(image_index, tmp_path / "out", codec=codec, gop=8, keyframe_stride=2, progress=False).files_encoded
        == 4
    )


def test_the_keyframe_interval_defaults_to_six_references_per_gop_in_the_stride_layout() -> None:
    import dataclasses

    assert EncodeSettings().keyframe_interval == 12 and EncodeSettings().gop is None
    expected = {1: 12, 2: 12, 3: 18, 5: 30, 6: 36, 16: 96}
    for stride, interval in expected.items():
        assert EncodeSettings(keyframe_stride=stride).keyframe_interval == interval
        # An importer sets the stride on the defaults later: the interval follows it.
        assert dataclasses.replace(EncodeSettings(), keyframe_stride=stride).keyframe_interval == interval
    assert EncodeSettings(gop=12, keyframe_stride=6).keyframe_interval == 12  # given: kept
    assert EncodeSettings(gop=7).keyframe_interval == 7


@pytest.mark.parametrize(("stride", "keyframes"), [(1, (0, 12, 24, 36)), (3, (0, 18, 36))])
def test_encodes_without_a_gop_put_keyframes_at_the_default_interval(
    tmp_path: Path, stride: int, keyframes: tuple[int, ...]
) -> None:
    source = write_stamped_video(tmp_path / "src.mp4", clip=0, camera=0, frames=40, gop=40)
    settings = EncodeSettings(codec="h264", keyframe_stride=stride, preset="ultrafast")
    summary = encode_sources([CameraSource("c", "CAM", source)], tmp_path / "out", settings=settings, progress=False)
    info = load_index(summary.index)[0].cameras[0].info
    assert info is not None and info.key_indices == keyframes
    if stride > 1:
        assert info.references is not None
        assert [f for f in range(36) if info.references[f] & 1] == list(range(0, 36, stride))


def test_the_command_line_takes_the_default_interval_for_any_stride(image_index: Path, tmp_path: Path) -> None:
    """Without --gop a stride that does not divide 12 is no error: the interval follows the stride."""
    out = tmp_path / "cli"
    assert main(["encode", str(image_index), str(out), "--codec", "h264", "--keyframe-stride", "5", "-q"]) == 0
    info = load_index(out / "index.json")[0].cameras[0].info
    assert info is not None and info.references is not None and info.key_indices == (0,)
    assert [f for f in range(11) if info.references[f] & 1] == [0, 5, 10]


@pytest.mark.parametrize("preset", ["ultrafast", "superfast"])
def test_keyframe_stride_with_the_fastest_presets(image_index: Path, tmp_path: Path, preset: str) -> None:
    """x265's fastest presets look ahead fewer frames than the stride layout's B-frames in a row: raised, not refused."""
    summary = encode_index(
        image_index, tmp_path / "out", codec="hevc", gop=6, keyframe_stride=6, preset=preset, progress=False
    )
    check_round_trip(image_index, summary.index)
    info = load_index(summary.index)[0].cameras[0].info
    assert info is not None and info.references is not None
    assert [f for f in range(6) if info.references[f] & 1] == [0]


def test_keyframe_stride_on_the_command_line(
    image_index: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli"
    argv = ["encode", str(image_index), str(out), "--codec", "h264", "--gop", "6", "--keyframe-stride", "3", "-q"]
    assert main(argv) == 0
    info = load_index(out / "index.json")[0].cameras[0].info
    assert info is not None and info.references is not None
    assert [f for f in range(9) if info.references[f] & 1] == [0, 3, 6]
    assert main([*argv[:-3], "--keyframe-stride", "4", "-q"]) == 2
    assert "gop=6 is not a multiple of keyframe_stride=4" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        main([*argv[:-3], "--keyframe-stride", "0"])
    assert usage.value.code == 2 and "'0' must be at least 1" in capsys.readouterr().err


def test_a_file_not_in_the_stride_layout_is_named(image_index: Path, tmp_path: Path) -> None:
    from lightning_vstream.encode.writer import FileTask, mismatch, plan_file

    summary = encode_index(image_index, tmp_path / "out", codec="h264", gop=4, bframes=2, progress=False)
    path = load_index(summary.index)[0].cameras[0].path
    src = load_index(image_index)[0].cameras[0]
    task: FileTask = plan_file(CameraSource("scene-0000", "CAM_BACK", Path(src.path)), path)
    assert mismatch(task, path, "h264") is None
    assert mismatch(task, path, "h264", 4) == "frame 1 is a reference picture (keyframe stride 4)"


def _debris(root: Path) -> list[Path]:
    from lightning_vstream.storage.atomic import is_temporary

    return [p for p in root.rglob("*") if is_temporary(p.name)]


def test_a_failing_file_is_retried_then_named_and_a_rerun_encodes_the_rest(
    image_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_vstream.encode.run import FAULT_VARIABLE

    out = tmp_path / "out"
    marker = tmp_path / "marker"
    monkeypatch.setenv(FAULT_VARIABLE, f"raise-once:scene-0001/CAM_FRONT:{marker}")
    summary = encode_index(image_index, out, codec="h264", crf=18, progress=False)
    assert (summary.files_encoded, summary.retries) == (4, 1) and marker.is_file()
    check_round_trip(image_index, summary.index)
    assert _debris(out) == []
    # Failing on every try: named (file, clip, camera, cause) after 3 tries; the other files are kept.
    monkeypatch.setenv(FAULT_VARIABLE, "raise:scene-0001/CAM_FRONT")
    failed = tmp_path / "failed"
    with pytest.raises(
        EncodeError,
        match=r"'[^']*scene-0001/CAM_FRONT\.mp4' \(clip 'scene-0001', camera 'CAM_FRONT'\): failed 3 time\(s\): "
        r"test fault from VSTREAM_TEST_ENCODE_FAULT at frame 6 .* run again to encode the rest",
    ):
        encode_index(image_index, failed, codec="h264", crf=18, jobs=2, progress=False)
    assert _debris(failed) == [] and not (failed / "index.json").exists()
    monkeypatch.delenv(FAULT_VARIABLE)
    again = encode_index(image_index, failed, codec="h264", crf=18, jobs=2, progress=False)
    assert (again.files_encoded, again.files_skipped, again.retries) == (1, 3, 0)
    check_round_trip(image_index, again.index)


def test_a_file_written_by_a_try_whose_result_was_lost_counts_as_encoded(
    image_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pool breaks when one of its processes dies: a task another process had just finished (its file renamed
    # into place) fails with it, and its retry finds the file done. The run still wrote that file.
    from lightning_vstream.encode import run

    real = run.encode_job

    def lost_result(job: run.EncodeJob) -> run.FileRecord:
        record = real(job)
        if job.source.camera == "CAM_BACK" and job.source.clip_id == "scene-0000":
            return real(job)  # the retry: the file is there and right, so it is left alone
        return record

    monkeypatch.setattr(run, "encode_job", lost_result)
    summary = encode_index(image_index, tmp_path / "out", codec="h264", crf=18, jobs=1, progress=False)
    assert (summary.files_encoded, summary.files_skipped) == (4, 0)
    assert summary.frames_encoded == sum(clip.frame_count * len(clip.cameras) for clip in load_index(summary.index))
    again = encode_index(image_index, tmp_path / "out", codec="h264", crf=18, jobs=1, progress=False)
    assert (again.files_encoded, again.files_skipped, again.frames_encoded) == (0, 4, 0)  # there before: left alone


@pytest.mark.slow
def test_a_process_killed_mid_file_is_retried_and_leaves_no_temporary_file(
    image_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_vstream.encode.run import FAULT_VARIABLE

    monkeypatch.setenv(FAULT_VARIABLE, f"exit-once:scene-0000/CAM_BACK:{tmp_path / 'marker'}")
    summary = encode_index(image_index, tmp_path / "out", codec="h264", crf=18, jobs=2, progress=False)
    # The pool whose process died fails the tasks it held; each is tried again.
    assert summary.files_encoded == 4 and summary.retries >= 1
    assert _debris(tmp_path / "out") == []
    check_round_trip(image_index, summary.index)


def test_executor_options_are_checked_before_any_work(
    image_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from lightning_vstream.encode.run import FAULT_VARIABLE

    with pytest.raises(ConfigurationError, match=r"executor='dask' is not supported; use one of \['local', 'ray'\]"):
        encode_index(image_index, tmp_path / "out", executor="dask", progress=False)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="threads=-1 must be a number of encoder threads"):
        encode_index(image_index, tmp_path / "out", threads=-1, progress=False)
    monkeypatch.setenv(FAULT_VARIABLE, "crash:scene-0000")
    with pytest.raises(ConfigurationError, match="VSTREAM_TEST_ENCODE_FAULT='crash:scene-0000' is not a fault spec"):
        encode_index(image_index, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit) as usage:
        main(["encode", str(image_index), str(tmp_path / "out"), "--executor", "dask"])
    assert usage.value.code == 2 and "invalid choice: 'dask'" in capsys.readouterr().err
