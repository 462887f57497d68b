"""`vstream index` on a bucket: building an index in place (ETags recorded), --check, --quick-check and --tables."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from lightning_vstream import VideoClipDataset, at_indices, load_index
from lightning_vstream.cli import main
from lightning_vstream.demos.synth import Stamp, read_stamp
from tests._s3 import S3TestServer

BUCKET = "remote-cli"


@pytest.fixture(scope="module")
def dataset(make_dataset: Callable[..., Path]) -> Path:
    return make_dataset(clips=2, cameras=2, frames=[9, 7], size=(64, 48), gop=4)


def _options(s3: S3TestServer) -> list[str]:
    return [arg for key, value in s3.storage_options().items() for arg in ("--storage-option", f"{key}={value}")]


def _upload_videos(s3: S3TestServer, dataset: Path, prefix: str) -> list[Path]:
    s3.bucket(BUCKET)
    files = sorted((dataset.parent / "videos").rglob("*.mp4"))
    for path in files:
        s3.client().upload_file(str(path), BUCKET, f"{prefix}/videos/{path.parent.name}/{path.name}")
    s3.reset()
    return files


def test_index_a_dataset_in_place_on_a_bucket(
    s3: S3TestServer, dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _upload_videos(s3, dataset, "built")
    assert main(["index", f"s3://{BUCKET}/built", "-q", *_options(s3)]) == 0
    assert "wrote s3://remote-cli/built/index.json: 2 clips" in capsys.readouterr().out
    requests = s3.requests()
    puts = sorted(r.path for r in requests if r.method == "PUT")
    assert puts == [f"/{BUCKET}/built/index.json", f"/{BUCKET}/built/index.tables.bin"]
    file_gets = [r for r in requests if r.method == "GET" and r.path.endswith(".mp4")]
    assert len(file_gets) == len(files) and all(r.range is None for r in file_gets)  # each file read once, whole
    index = load_index(f"s3://{BUCKET}/built/index.json", storage_options=s3.storage_options())
    local = load_index(dataset)
    assert [c.clip_id for c in index] == [c.clip_id for c in local]
    cam = index.clips[0].cameras[1]
    head = s3.client().head_object(Bucket=BUCKET, Key="built/videos/scene-0000/CAM_BACK_LEFT.mp4")
    assert cam.info is not None and cam.info.identity is not None and cam.info.identity.etag == head["ETag"]
    assert cam.info == local.clips[0].cameras[1].info
    s3.reset()
    sample = VideoClipDataset(index=index, requests=[at_indices("scene-0000", [5])])[0]
    assert read_stamp(sample["frames"][0, 1]).frame == 5
    assert all(r.if_match == cam.info.identity.etag for r in s3.requests() if "CAM_BACK_LEFT" in r.path)


def test_check_on_a_bucket_finds_replaced_objects(
    s3: S3TestServer, dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _upload_videos(s3, dataset, "checked")
    url = f"s3://{BUCKET}/checked/index.json"
    assert main(["index", f"s3://{BUCKET}/checked", "-q", *_options(s3)]) == 0
    assert main(["index", "--check", url, "-q", *_options(s3)]) == 0
    assert "4 files, 32 frames: every packet matches its checksum" in capsys.readouterr().out
    assert main(["index", "--quick-check", url, "-q", *_options(s3)]) == 0
    other = (dataset.parent / "videos" / "scene-0001" / "CAM_BACK.mp4").read_bytes()
    s3.put_bytes(BUCKET, "checked/videos/scene-0000/CAM_BACK.mp4", other)
    capsys.readouterr()
    assert main(["index", "--check", url, "-q", *_options(s3)]) == 1
    err = capsys.readouterr().err
    assert "1 problem(s) in 4 files" in err and "scene-0000/CAM_BACK.mp4' (clip 'scene-0000', camera 'CAM_BACK')" in err
    assert "the object changed since the index was built" in err
    assert main(["index", "--quick-check", url, "-q", *_options(s3)]) == 1


def test_tables_for_an_uploaded_accvlab_index(
    s3: S3TestServer, dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _upload_videos(s3, dataset, "accvlab")
    s3.client().upload_file(str(dataset), BUCKET, "accvlab/index.json")
    url = f"s3://{BUCKET}/accvlab/index.json"
    assert main(["index", "--tables", url, "-q", *_options(s3)]) == 0
    assert "wrote s3://remote-cli/accvlab/index.tables.bin" in capsys.readouterr().out
    index = load_index(url, storage_options=s3.storage_options())
    assert all(cam.info is not None and cam.info.layout is not None for clip in index for cam in clip.cameras)


def test_quick_check_says_which_identities_it_compared(
    s3: S3TestServer, dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Built on the bucket: every file's size and ETag recorded.
    _upload_videos(s3, dataset, "quick")
    assert main(["index", f"s3://{BUCKET}/quick", "-q", *_options(s3)]) == 0
    capsys.readouterr()
    assert main(["index", "--quick-check", f"s3://{BUCKET}/quick/index.json", "-q", *_options(s3)]) == 0
    assert "every file's size and ETag match the index (quick check)." in capsys.readouterr().out
    # Built locally and uploaded: sizes only, and the message says so.
    _upload_videos(s3, dataset, "uploaded")
    for name in ("index.json", "index.tables.bin"):
        s3.client().upload_file(str(dataset.parent / name), BUCKET, f"uploaded/{name}")
    assert main(["index", "--quick-check", f"s3://{BUCKET}/uploaded/index.json", "-q", *_options(s3)]) == 0
    out = capsys.readouterr().out
    assert "ETag match" not in out
    assert "every file's size matches the index; it recorded no ETags (it was built from local files)" in out


def test_index_on_a_bucket_leaves_out_incomplete_clips(
    s3: S3TestServer, dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _upload_videos(s3, dataset, "holes")
    s3.client().delete_object(Bucket=BUCKET, Key="holes/videos/scene-0001/CAM_BACK.mp4")
    assert main(["index", f"s3://{BUCKET}/holes", "-q", *_options(s3)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("wrote s3://remote-cli/holes/index.json: 1 clips")
    assert out[1] == "left out 1 incomplete clip(s), listed in s3://remote-cli/holes/index.incomplete.json:"
    assert out[2] == (
        "  scene-0001: missing camera file(s) ['CAM_BACK'] (the other clips have ['CAM_BACK', 'CAM_BACK_LEFT'])"
    )
    index = load_index(f"s3://{BUCKET}/holes/index.json", storage_options=s3.storage_options())
    assert [c.clip_id for c in index] == ["scene-0000"]
    sample = VideoClipDataset(index=index, requests=[at_indices("scene-0000", [3])])[0]
    assert [read_stamp(sample["frames"][0, c]) for c in range(2)] == [Stamp(0, 0, 3), Stamp(0, 1, 3)]
    assert main(["index", f"s3://{BUCKET}/holes", "--strict", "-q", *_options(s3)]) == 1
    assert "clip 'scene-0001' is incomplete: missing camera file(s) ['CAM_BACK']" in capsys.readouterr().err
