"""GOP reads from the moto S3 server: frames bit-identical to local reads, exact requests and bytes, every fault."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_vstream.decode import make_decoder
from lightning_vstream.decode.cpu.probe import probe_video
from lightning_vstream.decode.cpu.pyav import PyAVDecoder
from lightning_vstream.decode.ranged.gop_reads import GopDecoder, gop_runs
from lightning_vstream.demos.synth import read_stamp, write_stamped_video
from lightning_vstream.errors import ChecksumError, FileChangedError
from lightning_vstream.index import FileIdentity
from lightning_vstream.index.tables import VideoInfo
from lightning_vstream.storage import StorageConfig
from lightning_vstream.storage.client import Storage
from lightning_vstream.storage.fetcher import Fetcher
from tests._remux import remux
from tests._s3 import S3TestServer

BUCKET = "gops"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gop-files")
    made = {
        "h264": write_stamped_video(root / "h264.mp4", clip=3, camera=0, frames=30, gop=6, bframes=2, size=(96, 64)),
        "hevc": write_stamped_video(
            root / "hevc.mp4", clip=3, camera=1, frames=30, gop=8, codec="hevc", bframes=3, size=(96, 64)
        ),
        "audio": write_stamped_video(root / "audio.mp4", clip=3, camera=2, frames=30, gop=6, audio_first=True),
    }
    made["mkv"] = remux(made["h264"], root / "h264.mkv")
    made["ts"] = remux(made["h264"], root / "h264.ts")
    return made


@pytest.fixture
def remote(s3: S3TestServer, files: dict[str, Path]) -> dict[str, tuple[str, VideoInfo]]:
    """Each file uploaded, with its frame table (identity: size and ETag, as `vstream index` on the bucket records)."""
    client = s3.client()
    s3.bucket(BUCKET)
    found = {}
    for name, path in files.items():
        key = f"v/{path.name}"
        client.upload_file(str(path), BUCKET, key)
        etag = client.head_object(Bucket=BUCKET, Key=key)["ETag"]
        info = probe_video(path)
        identity = FileIdentity(path.stat().st_size, 0, 0, 0, etag=etag)
        found[name] = (f"s3://{BUCKET}/{key}", dataclasses.replace(info, identity=identity))
    s3.reset()
    return found


def _fetcher(s3: S3TestServer, **options: Any) -> Fetcher:
    config = StorageConfig(s3.storage_options(backoff_initial=0.01, backoff_max=0.05, **options))
    return Fetcher(Storage(config), threads=2)


def _local_frames(path: Path) -> list[torch.Tensor]:
    with PyAVDecoder(path) as dec:
        return [dec.read() for _ in range(dec.info.frame_count)]


@pytest.mark.parametrize("name", ["h264", "hevc", "audio", "mkv"])
def test_frames_are_bit_identical_to_local_reads(
    s3: S3TestServer, files: dict[str, Path], remote: dict[str, tuple[str, VideoInfo]], name: str
) -> None:
    url, info = remote[name]
    expected = _local_frames(files[name])
    dec = GopDecoder(url, info=info, fetcher=_fetcher(s3))
    got = [dec.read() for _ in range(info.frame_count)]
    for i, (a, b) in enumerate(zip(got, expected)):
        assert torch.equal(a, b), f"frame {i}"
        assert read_stamp(a).frame == i
    # Random order too: each frame from its GOP's keyframe.
    for i in (17, 3, 29, 8, 9, 0):
        assert torch.equal(dec.get(i), expected[i]), f"frame {i}"
    dec.close()


def test_streaming_a_file_is_one_get_per_gop_and_no_head(
    s3: S3TestServer, remote: dict[str, tuple[str, VideoInfo]]
) -> None:
    url, info = remote["h264"]
    runs = gop_runs(url, info)
    dec = GopDecoder(url, info=info, fetcher=_fetcher(s3))
    for _ in range(info.frame_count):
        dec.read()
    requests = s3.requests()
    extents = [(u.start, u.end) for run in runs.units for u in run]
    assert [r.method for r in requests] == ["GET"] * len(info.key_indices)
    assert [r.range for r in requests] == extents
    assert all(r.if_match == info.identity.etag for r in requests)  # type: ignore[union-attr]
    needed = sum(info.layout.size)  # type: ignore[union-attr]
    assert sum(r.bytes for r in requests) == needed  # no other stream in this file: not a byte more


def test_random_access_fetches_exactly_the_gops_it_needs(
    s3: S3TestServer, remote: dict[str, tuple[str, VideoInfo]]
) -> None:
    url, info = remote["h264"]
    units = gop_runs(url, info).units
    dec = GopDecoder(url, info=info, fetcher=_fetcher(s3))
    dec.get(14)  # GOP 2 (frames 12..17): one request, its bytes only
    assert [r.range for r in s3.requests()] == [(units[2][0].start, units[2][0].end)]
    s3.reset()
    dec.close()
    dec.get_many([7, 27])  # GOPs 1 and 4: never the unneeded GOPs between them
    assert sorted(r.range for r in s3.requests()) == [(u[0].start, u[0].end) for u in (units[1], units[4])]
    s3.reset()
    dec.close()
    dec.get_many([19, 25, 13])  # GOPs 2, 3, 4 are adjacent: one request
    assert [r.range for r in s3.requests()] == [(units[2][0].start, units[4][0].end)]


def test_open_gop_frames_shown_before_a_keyframe(
    s3: S3TestServer, files: dict[str, Path], remote: dict[str, tuple[str, VideoInfo]]
) -> None:
    """HEVC's open GOPs: frames shown just before a keyframe are stored after it; their read takes both GOPs."""
    url, info = remote["hevc"]
    expected = _local_frames(files["hevc"])
    runs = gop_runs(url, info)
    leading = [f for f in range(info.frame_count) if len(runs.runs_for(info, f)) > 1]
    assert leading, "x265's open GOPs store leading pictures after their keyframe"
    dec = GopDecoder(url, info=info, fetcher=_fetcher(s3))
    for frame in leading:
        dec.close()
        assert torch.equal(dec.get(frame), expected[frame])


def test_a_flipped_byte_is_read_again(
    s3: S3TestServer, files: dict[str, Path], remote: dict[str, tuple[str, VideoInfo]]
) -> None:
    url, info = remote["h264"]
    expected = _local_frames(files["h264"])
    fetcher = _fetcher(s3)
    s3.faults(rules=[{"kind": "flip", "times": 1}])
    dec = GopDecoder(url, info=info, fetcher=fetcher)
    assert torch.equal(dec.get(2), expected[2])
    assert fetcher.stats.checksum_refetches == 1 and fetcher.stats.checksum_failures == 0
    assert [r.fault for r in s3.requests()] == ["flip", None]


def test_a_packet_that_stays_corrupt_raises(s3: S3TestServer, remote: dict[str, tuple[str, VideoInfo]]) -> None:
    url, info = remote["h264"]
    fetcher = _fetcher(s3)
    s3.faults(rules=[{"kind": "flip", "times": 2}])
    dec = GopDecoder(url, info=info, fetcher=fetcher, label="clip 'c', camera 'CAM'")
    with pytest.raises(
        ChecksumError,
        match=r"gops/v/h264\.mp4' \(clip 'c', camera 'CAM'\) frame \d+: the compressed data \(bytes \d+-\d+\) differs",
    ):
        dec.get(2)
    assert fetcher.stats.checksum_failures == 1


@pytest.mark.parametrize("kind", ["503", "500", "truncate"])
def test_transient_faults_while_decoding(
    s3: S3TestServer, files: dict[str, Path], remote: dict[str, tuple[str, VideoInfo]], kind: str
) -> None:
    url, info = remote["h264"]
    expected = _local_frames(files["h264"])
    fetcher = _fetcher(s3)
    s3.faults(rules=[{"kind": kind, "times": 2}])
    dec = GopDecoder(url, info=info, fetcher=fetcher)
    assert all(torch.equal(dec.read(), expected[i]) for i in range(info.frame_count))
    assert fetcher.stats.retries == 2


def test_a_replaced_object_raises_file_changed(
    s3: S3TestServer, files: dict[str, Path], remote: dict[str, tuple[str, VideoInfo]]
) -> None:
    url, info = remote["h264"]
    s3.put_bytes(BUCKET, "v/h264.mp4", files["h264"].read_bytes())  # same bytes, new ETag? moto: same MD5 ETag
    replaced = files["hevc"].read_bytes()
    s3.put_bytes(BUCKET, "v/h264.mp4", replaced)
    with pytest.raises(
        FileChangedError, match=r"h264\.mp4 bytes \d+-\d+: the object changed since the index was built"
    ):
        GopDecoder(url, info=info, fetcher=_fetcher(s3)).get(0)
    # An index built locally and uploaded records no ETag: the size in the response tells.
    local = dataclasses.replace(info, identity=dataclasses.replace(info.identity, etag=None))  # type: ignore[arg-type]
    with pytest.raises(FileChangedError, match=r"holds \d+ bytes where the index recorded \d+"):
        GopDecoder(url, info=local, fetcher=_fetcher(s3)).get(0)


def test_same_size_replacement_without_etag_fails_its_checksums(
    s3: S3TestServer, files: dict[str, Path], remote: dict[str, tuple[str, VideoInfo]]
) -> None:
    url, info = remote["h264"]
    data = bytearray(files["h264"].read_bytes())
    layout = info.layout
    assert layout is not None
    data[layout.pos[0] + 10] ^= 0x55
    s3.put_bytes(BUCKET, "v/h264.mp4", bytes(data))
    local = dataclasses.replace(info, identity=dataclasses.replace(info.identity, etag=None))  # type: ignore[arg-type]
    with pytest.raises(ChecksumError, match="also when read again"):
        GopDecoder(url, info=local, fetcher=_fetcher(s3)).get(0)


def test_files_without_a_packet_layout_read_through_their_container(
    s3: S3TestServer, files: dict[str, Path], remote: dict[str, tuple[str, VideoInfo]]
) -> None:
    url, info = remote["ts"]
    assert info.layout is None
    config = StorageConfig(s3.storage_options())
    dec = make_decoder(url, info=info, storage=config)
    assert isinstance(dec, PyAVDecoder)
    expected = _local_frames(files["ts"])
    assert all(torch.equal(dec.read(), expected[i]) for i in range(info.frame_count))
    assert all(r.method == "GET" for r in s3.requests())


def test_file_urls_read_gops_with_pread(files: dict[str, Path]) -> None:
    path = files["audio"]
    info = probe_video(path)
    dec = make_decoder(f"file://{path}", info=info)
    assert isinstance(dec, GopDecoder)
    expected = _local_frames(path)
    assert all(torch.equal(dec.read(), expected[i]) for i in range(info.frame_count))
    assert torch.equal(dec.get(4), expected[4])


def test_closing_mid_gop_with_frame_threads_never_hangs(tmp_path: Path) -> None:
    """Packets own FFmpeg memory: freeing a codec whose frame threads still hold packets needs no GIL.

    (Packets made from Python bytes are freed by a callback that takes the GIL; a frame thread doing
    that while this thread frees the codec, holding the GIL, deadlocked: with such packets this script
    hung within the first 7 of its 30 decoders in every try, so small frames and a short switch
    interval, which make the GIL change hands often, keep it quick without losing the race.)
    """
    import subprocess
    import sys
    import textwrap

    path = write_stamped_video(tmp_path / "v.mp4", clip=1, camera=0, frames=24, gop=12, codec="hevc", size=(160, 96))
    script = textwrap.dedent(
        f"""
        import sys
        import threading
        from lightning_vstream.decode import make_decoder
        from lightning_vstream.decode.cpu.probe import probe_video
        info = probe_video({str(path)!r})
        sys.setswitchinterval(0.0005)
        busy = threading.Event()
        def spin():  # another Python thread, as I/O threads are: the GIL changes hands
            while not busy.is_set():
                sum(range(1000))
        threading.Thread(target=spin, daemon=True).start()
        for k in range(30):
            dec = make_decoder("file://" + {str(path)!r}, info=info, threads=4)
            dec.get(k % 3)
            dec.close()
            del dec
        busy.set()
        """
    )
    done = subprocess.run([sys.executable, "-c", script], timeout=60, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
