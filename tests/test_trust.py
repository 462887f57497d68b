"""What comes from a store, a cache folder or a shared temporary folder is checked before it is used.

Each test plays an attacker or an unlucky operator: a dataset rebuilt in place, copies planted in the
cache, symbolic links and FIFOs where files should be, paths that climb out of the dataset, a server
that goes away for a second or redirects to another host, crafted index and table files, a cache folder
that cannot be written. Every case ends in the right frames or a named error, never a hang, a raw
``OSError`` or a secret on disk.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from lightning_vstream import (
    ClipVideoDataModule,
    EngineOptions,
    ErrorOptions,
    SamplingOptions,
    StorageConfig,
    StreamVideoDataModule,
    VideoClipDataset,
    VStreamError,
    VStreamWarning,
    at_indices,
    load_index,
)
from lightning_vstream.demos.synth import clip_number, read_stamp, write_dataset
from lightning_vstream.errors import (
    ConfigurationError,
    IndexValidationError,
    RemoteAccessError,
    VideoDecodeError,
)
from lightning_vstream.index.table_file import FrameTables, tables_path
from lightning_vstream.storage import storage_for
from lightning_vstream.storage.cache import NodeCache
from tests._s3 import S3TestServer
from tests.conftest import batch_stamp_errors

HERE = Path(__file__).parent


def _stamps(frames: torch.Tensor, clip_id: str, indices: list[int]) -> list[tuple[int, int, int]]:
    """(clip, camera, frame) read from every camera of every frame of one sample."""
    stamps = [read_stamp(frames[t, c]) for t in range(len(indices)) for c in range(frames.shape[1])]
    return [(s.clip, s.camera, s.frame) for s in stamps]


def _expected(clip_id: str, indices: list[int], cameras: int) -> list[tuple[int, int, int]]:
    return [(clip_number(clip_id), c, f) for f in indices for c in range(cameras)]


def _sample(url: str, cache: Path | None, clip: str = "scene-0001", frames: tuple[int, ...] = (0, 5)) -> torch.Tensor:
    dataset = VideoClipDataset(
        index=url,
        requests=[at_indices(clip, list(frames))],
        storage=StorageConfig(cache_dir=None if cache is None else str(cache)),
    )
    return dataset[0]["frames"]


# -- 1. tables copies are identified by their content ---------------------------------------------------
def test_a_dataset_rebuilt_in_place_is_never_read_through_its_old_tables(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    index = write_dataset(root, clips=2, cameras=2, frames=8, size=(160, 96), gop=4)
    url = index.resolve().as_uri()
    cache = tmp_path / "cache"
    first = _sample(url, cache)
    assert first.shape[-2:] == (96, 160) and _stamps(first, "scene-0001", [0, 5]) == _expected("scene-0001", [0, 5], 2)
    old_size = tables_path(index).stat().st_size
    write_dataset(root, clips=2, cameras=2, frames=8, size=(192, 96), gop=4, replace=True)
    assert tables_path(index).stat().st_size == old_size  # the case that fooled a size check
    again = _sample(url, cache)
    assert again.shape[-2:] == (96, 192)
    assert _stamps(again, "scene-0001", [0, 5]) == _expected("scene-0001", [0, 5], 2)


def test_a_planted_tables_copy_is_replaced_by_the_stores(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    index = write_dataset(root, clips=2, cameras=2, frames=8, size=(64, 48), gop=4)
    other = write_dataset(tmp_path / "other", clips=2, cameras=2, frames=8, size=(64, 48), gop=4, fps=10.0)
    url = index.resolve().as_uri()
    cache = tmp_path / "cache"
    _sample(url, cache)
    [copy] = (cache / "tables").iterdir()
    planted = tables_path(other).read_bytes()
    assert len(planted) == copy.stat().st_size
    copy.write_bytes(planted)  # same size, another dataset's packets
    frames = _sample(url, cache)
    assert _stamps(frames, "scene-0001", [0, 5]) == _expected("scene-0001", [0, 5], 2)
    assert not any(p.read_bytes() == planted for p in (cache / "tables").iterdir())


@pytest.mark.parametrize("plant", ["fifo", "dev-zero", "other-bytes"])
def test_a_planted_tables_copy_of_a_store_with_etags_is_fetched_again(
    s3: S3TestServer, remote_dataset: Path, tmp_path: Path, plant: str
) -> None:
    url = s3.upload(remote_dataset.parent, "trust-etag", "ds") + "/index.json"
    cache = tmp_path / "cache"
    options = s3.storage_options()
    load_index(url, storage_options=options, cache_dir=str(cache))
    [copy] = (cache / "tables").iterdir()
    original = copy.read_bytes()
    copy.unlink()
    if plant == "fifo":
        os.mkfifo(copy)
    elif plant == "dev-zero":
        copy.symlink_to("/dev/zero")
    else:
        copy.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))  # same size, other bytes
    s3.reset()
    index = load_index(url, storage_options=options, cache_dir=str(cache))  # no hang, no MemoryError
    assert [r.method for r in s3.requests()] == ["GET", "HEAD", "GET"]  # the tables fetched again
    assert [p.read_bytes() for p in (cache / "tables").iterdir()] == [original]
    frames = VideoClipDataset(index=index, requests=[at_indices("scene-0001", [0, 5])])[0]["frames"]
    assert _stamps(frames, "scene-0001", [0, 5]) == _expected("scene-0001", [0, 5], 2)


# -- 2. private folders, temporary files that follow no link ---------------------------------------------
@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The system's temporary folder, pointed at a folder of this test's own."""
    folder = tmp_path / "systmp"
    folder.mkdir(mode=0o777)
    os.chmod(folder, 0o1777)  # what /tmp is: everyone may create entries in it
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_the_temporary_tables_folder_is_private_and_checked(tmp_path: Path, private_tmp: Path) -> None:
    index = write_dataset(tmp_path / "ds", clips=2, cameras=2, frames=8, size=(64, 48), gop=4)
    url = index.resolve().as_uri()
    folder = private_tmp / f"lightning_vstream-{os.getuid()}"
    frames = _sample(url, None)
    assert _stamps(frames, "scene-0001", [0, 5]) == _expected("scene-0001", [0, 5], 2)
    st = os.lstat(folder)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    # A folder of ours that others may only read (the usual umask) is made private ...
    os.chmod(folder, 0o755)
    _sample(url, None)
    assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700
    # ... one anybody may write to, or another user's, is refused, naming it.
    os.chmod(folder, 0o777)
    with pytest.raises(ConfigurationError, match=rf"{folder}.* writable by other users"):
        _sample(url, None)
    os.chmod(folder, 0o700)
    os.chown(folder, 12345, 12345)
    with pytest.raises(ConfigurationError, match=rf"{folder}.* belongs to user 12345"):
        _sample(url, None)


def test_a_symbolic_link_planted_in_the_temporary_folder_is_refused(tmp_path: Path, private_tmp: Path) -> None:
    index = write_dataset(tmp_path / "ds", clips=2, cameras=2, frames=8, size=(64, 48), gop=4)
    victim = tmp_path / "victim"
    victim.mkdir()
    (private_tmp / f"lightning_vstream-{os.getuid()}").symlink_to(victim)
    with pytest.raises(ConfigurationError, match="is a symbolic link"):
        _sample(index.resolve().as_uri(), None)
    assert list(victim.iterdir()) == []


def test_temporary_files_follow_no_link(tmp_path: Path) -> None:
    from lightning_vstream.storage.private import private_folder, write_file

    folder = private_folder(tmp_path / "private", what="cache_dir")
    target = tmp_path / "precious"
    target.write_bytes(b"keep me")
    (folder / "entry").symlink_to(target)
    write_file(folder / "entry", b"new bytes", tmp=folder)
    assert target.read_bytes() == b"keep me" and (folder / "entry").read_bytes() == b"new bytes"
    assert not (folder / "entry").is_symlink() and sorted(p.name for p in folder.iterdir()) == ["entry"]


# -- 7. what is not a regular file in the cache is a miss ------------------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "symlink-dev-zero", "symlink-file", "folder", "short"])
def test_a_cache_entry_that_is_not_a_regular_file_of_its_size_is_a_miss(tmp_path: Path, kind: str) -> None:
    cache = NodeCache(tmp_path / "cache")
    key = "ab" * 20
    path = cache.path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink-dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "symlink-file":
        (tmp_path / "elsewhere").write_bytes(b"x" * 100)
        path.symlink_to(tmp_path / "elsewhere")
    elif kind == "folder":
        path.mkdir()
    else:
        path.write_bytes(b"x" * 99)
    assert cache.get(key, size=100) is None  # returns at once: no hang on the FIFO, no endless /dev/zero
    assert not os.path.lexists(path)
    cache.put(key, b"y" * 100)
    assert cache.get(key, size=100) == b"y" * 100
    if kind == "symlink-file":
        assert (tmp_path / "elsewhere").read_bytes() == b"x" * 100


# -- 6. file:// and fsspec paths stay inside the index's folder --------------------------------------------
@pytest.fixture
def beside(tmp_path: Path) -> Path:
    """A dataset, and another one beside its folder (``../outside``) that a crafted index would read."""
    root = tmp_path / "ds"
    write_dataset(root, clips=2, cameras=2, frames=8, size=(64, 48), gop=4)
    write_dataset(tmp_path / "outside-ds", clips=2, cameras=2, frames=8, size=(64, 48), gop=4)
    (tmp_path / "outside").symlink_to(tmp_path / "outside-ds" / "videos")
    return root


@pytest.mark.parametrize(
    "climb", ["../outside", "videos/../../outside", "{root}/../outside", "{root}/videos/../..//outside"]
)
def test_file_urls_cannot_leave_the_index_folder(beside: Path, climb: str) -> None:
    crafted = beside / "crafted.json"
    folder = climb.format(root=beside.resolve().as_uri())
    crafted.write_text(json.dumps({folder: {"scene-0000": 8}}))
    (beside / "crafted.tables.bin").write_bytes((beside / "index.tables.bin").read_bytes())
    with pytest.raises(IndexValidationError, match=r"does not lie under the index's folder|climbs above"):
        load_index(crafted.resolve().as_uri())


@pytest.mark.parametrize("entry", [{"%2e%2e/outside": {"scene-0000": 8}}, {"videos": {"%2e%2e": 8}}])
def test_percent_escapes_in_file_urls_name_files_and_never_climb(beside: Path, entry: dict[str, Any]) -> None:
    """A path in an index is a path: ``%2e%2e`` names a folder of that name, never the parent folder."""
    crafted = beside / "crafted.json"
    crafted.write_text(json.dumps(entry))
    with pytest.raises(IndexValidationError) as raised:
        load_index(crafted.resolve().as_uri())
    assert "%252e%252e" in str(raised.value) and "outside-ds" not in str(raised.value)


@pytest.mark.parametrize(
    "folder", ["../secret", "memory://trust/ds/../secret", "memory://trust/ds/videos/../../secret"]
)
def test_fsspec_urls_cannot_leave_the_index_folder(folder: str) -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe_file("/trust/ds/index.json", json.dumps({folder: {"scene-0000": 8}}).encode())
    fs.pipe_file("/trust/secret/scene-0000/CAM_FRONT.mp4", b"not for this index")
    with pytest.raises(IndexValidationError, match=r"does not lie under the index's folder|climbs above"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", VStreamWarning)
            load_index("memory://trust/ds/index.json")


# -- 8. crafted inputs end in named errors ------------------------------------------------------------------
def _file_dataset(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "ds", clips=2, cameras=2, frames=8, size=(64, 48), gop=4)


@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("url", [True, False])
def test_an_index_listing_more_frames_than_its_tables_is_a_named_data_fault(
    tmp_path: Path, on_error: str, url: bool
) -> None:
    """Read like any file that lost frames: a named VideoDecodeError, or under ``on_error="skip"`` skipped and counted."""
    index = _file_dataset(tmp_path)
    data = json.loads(index.read_text())
    data["videos"]["scene-0001"] = 12
    index.write_text(json.dumps(data))
    location = index.resolve().as_uri() if url else str(index)
    common: dict[str, Any] = {
        "index_file": location,
        "batch_size": 2,
        "engine": EngineOptions(num_workers=0),
        "seed": 1,
    }
    clips = ClipVideoDataModule(
        sampling=SamplingOptions(clip_frames=3), errors=ErrorOptions(on_error=on_error), **common
    )  # type: ignore[arg-type]
    clips.setup("fit")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VStreamWarning)
        if on_error == "raise":
            with pytest.raises(
                VideoDecodeError,
                match=r"clip 'scene-0001', camera 'CAM_BACK' .*the index lists 12 frames, but the file holds 8, so "
                r"frame \d+ cannot be read\. Re-run `vstream index`",
            ):
                list(clips.train_dataloader())
        else:
            batches = list(clips.train_dataloader())
            valid = [(clip, bool(ok)) for b in batches for clip, ok in zip(b["clip_id"], b["valid"])]
            assert all(ok for clip, ok in valid if clip == "scene-0000") and not all(ok for _, ok in valid)
            assert clips.decode_stats("train").skipped_samples == sum(not ok for _, ok in valid) > 0
        stream = StreamVideoDataModule(errors=ErrorOptions(on_error=on_error), **common)  # type: ignore[arg-type]
        stream.setup("fit")
        if on_error == "raise":  # the plan reads every frame the index lists: frame 8 is named
            with pytest.raises(
                VideoDecodeError, match=r"clip 'scene-0001', camera '\w+', frame 8 .*which holds 8 frames"
            ):
                list(stream.train_dataloader())
        else:
            batches = list(stream.train_dataloader())
            for batch in batches:
                assert not batch_stamp_errors(batch)
            assert stream.decode_stats("train").skipped_clips >= 1


@pytest.mark.parametrize(
    "text,message",
    [
        ('{"videos": {"scene-0000": 1' + "0" * 5000 + "}}", r"number of more than 4300 digits, which no frame count"),
        ('{"videos": {"scene-\\ud800": 8}}', r"lists the name 'scene-\\ud800', which is not valid Unicode"),
        ('{"vid\\udfffeos": {"scene-0000": 8}}', r"lists the name 'vid\\udfffeos', which is not valid Unicode"),
        ("[" * 100_000 + "]" * 100_000, r"nests JSON too deeply"),
    ],
)
def test_crafted_index_json_is_a_named_error(tmp_path: Path, text: str, message: str) -> None:
    index = _file_dataset(tmp_path)
    index.write_text(text)
    for location in (index, index.resolve().as_uri()):
        with pytest.raises(VStreamError, match=message):
            load_index(location)


def _rewrite_header(path: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    """Rewrite a frame-table file's JSON header (the arrays stay where they are)."""
    raw = path.read_bytes()
    magic, version, length = raw[:8], raw[8:12], int.from_bytes(raw[12:16], "little")
    header = json.loads(raw[16 : 16 + length])
    header = change(header) or header
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    start = -(-(16 + length) // 64) * 64
    new_start = -(-(16 + len(text)) // 64) * 64
    body = raw[start:]
    path.write_bytes(
        magic + version + len(text).to_bytes(4, "little") + text + b"\0" * (new_start - 16 - len(text)) + body
    )


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda h: h.update(arrays=[]), r"damaged header"),
        (lambda h: h.update(arrays={"pts": "<i8"}), r"damaged header"),
        (lambda h: h.update(files="many"), r"damaged header"),
        (lambda h: b"[" * 50_000 + b"]" * 50_000, r"damaged header"),
        (lambda h: b'{"files": 1' + b"0" * 5000 + b"}", r"damaged header"),
        (lambda h: h["arrays"].update(pts=["<i8", [2**40, 2**40], 0]), r"damaged header"),
        (lambda h: h["arrays"].update(pts=["<i8", [2**40], 0]), r"truncated or damaged"),
        (lambda h: h["arrays"].update(pts=["O", [3], 0]), r"damaged header|truncated or damaged"),
        (lambda h: h["arrays"].update(pts=["<i8", [-5], 0]), r"damaged header|truncated or damaged"),
    ],
)
def test_crafted_table_headers_are_named_errors(
    tmp_path: Path, change: Callable[[dict[str, Any]], Any], message: str
) -> None:
    index = _file_dataset(tmp_path)
    _rewrite_header(tables_path(index), change)
    with pytest.raises(IndexValidationError, match=message):
        FrameTables(tables_path(index))
    with pytest.raises(IndexValidationError, match=message):
        load_index(index.resolve().as_uri())


def test_a_header_length_beyond_the_file_is_a_named_error(tmp_path: Path) -> None:
    path = tables_path(_file_dataset(tmp_path))
    raw = bytearray(path.read_bytes())
    raw[12:16] = (2**32 - 1).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(IndexValidationError, match="damaged header|truncated"):
        FrameTables(path)


def test_a_crafted_packet_size_reads_no_more_than_the_file(tmp_path: Path) -> None:
    index = _file_dataset(tmp_path)
    path = tables_path(index)
    tables = FrameTables(path)
    offset = tables._a["pkt_size"].__array_interface__["data"][0] - tables._buf.__array_interface__["data"][0]
    del tables
    raw = bytearray(path.read_bytes())
    raw[offset : offset + 4] = (2**32 - 1).to_bytes(4, "little")  # the first file's first packet
    path.write_bytes(bytes(raw))
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(VStreamError, match="packet|past the end|damaged"):
            _sample(index.resolve().as_uri(), None, clip="scene-0000", frames=(0,))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20


#: Run first in a child process: as root, give up the right to ignore file permissions (capabilities are
#: per thread; the child has one thread yet), so that a read-only folder is read-only as for any user.
_AS_A_USER = """
import ctypes, os
if os.geteuid() == 0:
    class _Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
    class _Caps(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
    libc = ctypes.CDLL(None, use_errno=True)
    header, caps = _Header(0x20080522, 0), (_Caps * 2)()
    libc.capget(ctypes.byref(header), caps)
    caps[0].effective &= ~0b110  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
    assert libc.capset(ctypes.byref(header), caps) == 0
"""


def _child(script: str) -> str:
    """Run ``script`` in a fresh interpreter that imports this checkout; returns its standard output."""
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


_READ_TWICE = """
import warnings
from lightning_vstream import StorageConfig, VideoClipDataset, at_indices, VStreamWarning
from lightning_vstream.demos.synth import read_stamp
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(2):
        dataset = VideoClipDataset(index={url!r}, requests=[at_indices("scene-0001", [0, 5])], storage=StorageConfig(cache_dir={cache!r}))
        frames = dataset[0]["frames"]
        assert [read_stamp(frames[t, c]).frame for t in range(2) for c in range(2)] == [0, 0, 5, 5]
mine = [str(w.message) for w in caught if issubclass(w.category, VStreamWarning)]
print(len(mine), mine[0] if mine else "")
"""


def test_a_read_only_cache_folder_warns_once_and_reads_on(tmp_path: Path) -> None:
    index = _file_dataset(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    os.chmod(cache, 0o500)
    out = _child(_AS_A_USER + _READ_TWICE.format(url=index.resolve().as_uri(), cache=str(cache)))
    count, message = out.split(" ", 1)
    assert count == "1" and str(cache) in message and "without" in message, out
    assert os.listdir(cache) == []


def test_a_full_disk_leaves_nothing_partial(tmp_path: Path) -> None:
    index = _file_dataset(tmp_path)
    cache = tmp_path / "cache"
    # Every file written past 1000 bytes fails (EFBIG), the way a full disk fails a write half-way.
    full = "import resource, signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
    full += "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))\n"
    out = _child(full + _READ_TWICE.format(url=index.resolve().as_uri(), cache=str(cache)))
    count, message = out.split(" ", 1)
    assert count == "1" and str(cache) in message, out
    written = [p for p in cache.rglob("*") if p.is_file()]
    assert all(p.stat().st_size <= 1000 and p.suffix in (".gop", ".bin") for p in written), written
    assert not list((cache / "tmp").iterdir())


# -- 3. refused and reset connections are retried ------------------------------------------------------------
@pytest.fixture(scope="module")
def remote_dataset(make_dataset: Callable[..., Path]) -> Path:
    return make_dataset(clips=3, cameras=2, frames=[10, 8, 9], size=(64, 48), gop=3)


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # an I/O thread must not die
def test_a_store_gone_for_a_moment_mid_epoch_costs_retries_not_frames(s3: S3TestServer, remote_dataset: Path) -> None:
    import threading

    url = s3.upload(remote_dataset.parent, "trust-outage", "ds") + "/index.json"
    options = s3.storage_options(
        max_retries=30, backoff_initial=0.05, backoff_max=0.3, retry_deadline=60, prefetch_memory=1, io_threads=1
    )
    common: dict[str, Any] = {"batch_size": 2, "engine": EngineOptions(num_workers=0), "seed": 5}
    dm = StreamVideoDataModule(index_file=url, storage=StorageConfig(options=options), **common)
    local = StreamVideoDataModule(index_file=str(remote_dataset), **common)
    for module in (dm, local):
        module.setup("fit")
    storage = storage_for(dm.storage)
    port = s3.proxy_port
    back = threading.Event()

    def bring_back(errors_before: int) -> None:
        # The store stays away until two requests have failed on it (refused or reset), then comes back.
        try:
            for _ in range(3000):
                if storage.stats.errors >= errors_before + 2 or back.wait(0.01):
                    break
        finally:
            s3.start_proxy(port)
            back.set()

    expected = list(local.train_dataloader())
    got = []
    restarter = threading.Thread(target=bring_back, args=(0,))
    try:
        for number, batch in enumerate(dm.train_dataloader()):
            assert not batch_stamp_errors(batch)
            got.append(batch)
            if number == 1:
                s3.stop_proxy()
                restarter = threading.Thread(target=bring_back, args=(storage.stats.errors,))
                restarter.start()
    finally:
        back.set()
        if restarter.is_alive():
            restarter.join(timeout=60)
    assert len(got) == len(expected) > 2
    assert all(torch.equal(a["frames"], b["frames"]) for a, b in zip(got, expected))
    assert storage.stats.retries >= 2 and storage.stats.errors >= 2


def test_making_room_for_a_sooner_read_drops_units_of_one_due(tmp_path: Path) -> None:
    """Under a tight budget the I/O threads drop units fetched ahead for later reads; two of one due must not
    be compared (that raised TypeError and ended the thread, so the outage test showed a dead I/O thread)."""
    from lightning_vstream.storage.client import Storage
    from lightning_vstream.storage.fetcher import Fetcher, Unit

    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes(range(256)) * 16)
    url = blob.resolve().as_uri()
    fetcher = Fetcher(Storage(StorageConfig()), budget=10**6, threads=1)
    later = [Unit(url, 0, 1000, gop=0), Unit(url, 2000, 3000, gop=2)]  # not adjacent: two requests
    try:
        fetcher.prefetch(later, due=5.0)  # fetched ahead by the I/O thread, held by nobody
        with fetcher._cond:
            assert fetcher._cond.wait_for(lambda: all(fetcher._entries[u].future.done() for u in later), 30)
            fetcher.budget = 1500
            assert fetcher._make_room(1000, 1.0)  # room for a read due sooner: the later units go
        assert fetcher.held_bytes <= 500
    finally:
        fetcher.close()


@pytest.mark.parametrize(
    "message",
    [
        "Generic S3 error: Error performing GET http://127.0.0.1:5/b/k in 1ms - HTTP error: error sending request\n\n"
        "Debug source:\nGeneric { source: RetryError(RetryErrorImpl { inner: Http(HttpError { kind: Connect, source: "
        'ConnectError("tcp connect error", 127.0.0.1:5, Os { code: 111, kind: ConnectionRefused, message: '
        '"Connection refused" }) }) }) }',
        "Generic S3 error: Error performing GET http://127.0.0.1:5/b/k in 1ms - HTTP error: error sending request\n\n"
        "Debug source:\nGeneric { inner: Http(HttpError { kind: Interrupted, source: reqwest::Error { kind: Request, "
        'source: Os { code: 104, kind: ConnectionReset, message: "Connection reset by peer" } } }) }',
    ],
)
def test_refused_and_reset_connections_are_transient(message: str) -> None:
    from lightning_vstream.storage.transport import classify_message

    assert classify_message("GenericError", message).kind == "transient"


# -- 25.1. configuration faults fail at once, naming the option --------------------------------------------
def test_a_plain_http_endpoint_without_allow_http_is_named_at_once(
    s3: S3TestServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from lightning_vstream.cli import main
    from lightning_vstream.storage.client import Storage
    from lightning_vstream.storage.obstore_transport import close_helper

    s3.bucket("trust-config")
    options = {k: v for k, v in s3.storage_options().items() if k != "allow_http"}
    storage = Storage(StorageConfig(options))
    with pytest.raises(ConfigurationError, match=r"plain http:// .*allow_http"):
        storage.read("s3://trust-config/index.json")
    # The same through the standard environment (AWS_ENDPOINT_URL), as `vstream index` users set it.
    for key, value in s3.environment().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ALLOW_HTTP")
    close_helper()
    try:
        with pytest.raises(ConfigurationError, match=r"AWS_ENDPOINT_URL.*plain http://.*AWS_ALLOW_HTTP=true"):
            Storage(StorageConfig({})).read("s3://trust-config/index.json")
        # What `vstream index --quick-check` users see: the cause, at once, with the exit code of a usage error.
        assert main(["index", "--quick-check", "s3://trust-config/ds/index.json"]) == 2
        printed = capsys.readouterr().err
        assert "AWS_ENDPOINT_URL=" in printed and "set AWS_ALLOW_HTTP=true" in printed and "attempt" not in printed
    finally:
        close_helper()
    assert s3.requests() == []  # refused before any request


@pytest.mark.parametrize("endpoint", ["ht!tp://[bad", "127.0.0.1:9000", "http://", "http://host:port/"])
def test_a_bad_endpoint_url_is_named(endpoint: str) -> None:
    with pytest.raises(ConfigurationError, match=r"storage_options\['endpoint'\]=.* is not a valid URL"):
        StorageConfig({"endpoint": endpoint})


def test_an_unknown_scheme_is_named() -> None:
    with pytest.raises(
        ConfigurationError, match=r"'nosuchscheme://b/ds/index\.json'.*unknown URL scheme 'nosuchscheme'"
    ):
        load_index("nosuchscheme://b/ds/index.json")


def test_missing_credentials_are_named_at_once(
    s3: S3TestServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from lightning_vstream.cli import main
    from lightning_vstream.storage.client import Storage
    from lightning_vstream.storage.obstore_transport import close_helper

    for key in list(os.environ):
        if key.startswith("AWS_") and key != "AWS_EC2_METADATA_DISABLED":
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    storage = Storage(
        StorageConfig(
            {
                "endpoint": s3.endpoint,
                "allow_http": True,
                "region": "us-east-1",
                "max_retries": 3,
                "backoff_initial": 0.01,
            }
        )
    )
    with pytest.raises(RemoteAccessError, match=r"no credentials.*access_key_id.*AWS_ACCESS_KEY_ID.*anonymous"):
        storage.read("s3://trust-config/index.json")
    assert storage.stats.requests == 1  # not retried
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    close_helper()
    try:
        assert main(["index", "--quick-check", "s3://trust-config/ds/index.json"]) == 1
    finally:
        close_helper()
    assert "no credentials were configured" in capsys.readouterr().err


# -- 4. credentials never follow a redirect to another host ----------------------------------------------
class _Servers:
    """A redirecting server and a capturing one on another port, both on 127.0.0.1."""

    def __init__(self, status: int, scheme: str = "http") -> None:
        import http.server
        import threading

        self.captured: list[dict[str, str]] = []
        captured = self.captured

        class Capture(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                captured.append({k.lower(): v for k, v in self.headers.items()})
                body = b"0123456789"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("ETag", '"e"')
                self.end_headers()
                self.wfile.write(body)

            do_HEAD = do_GET

            def log_message(self, *args: Any) -> None:
                pass

        self.capture = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Capture)
        target = f"{scheme}://127.0.0.1:{self.capture.server_address[1]}"

        class Redirect(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if "/same/" in self.path:  # a redirect on the same server is followed
                    self.send_response(status)
                    self.send_header("Location", self.path.replace("/same/", "/here/", 1))
                elif "/here/" in self.path:
                    body = b"abcdefghij"
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                else:
                    self.send_response(status)
                    self.send_header("Location", target + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_HEAD = do_GET

            def log_message(self, *args: Any) -> None:
                pass

        self.redirect = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
        self.endpoint = f"{scheme}://127.0.0.1:{self.redirect.server_address[1]}"
        for server in (self.capture, self.redirect):
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        for server in (self.capture, self.redirect):
            server.shutdown()
            server.server_close()


@pytest.fixture(params=[302, 307])
def redirecting(request: pytest.FixtureRequest) -> Iterator[_Servers]:
    servers = _Servers(request.param)
    try:
        yield servers
    finally:
        servers.close()


def test_s3_credentials_never_follow_a_redirect_to_another_host(redirecting: _Servers) -> None:
    from lightning_vstream.errors import RemoteStorageError
    from lightning_vstream.storage.client import Storage

    options = {
        "endpoint": redirecting.endpoint,
        "allow_http": True,
        "access_key_id": "AKIDTRUST",
        "secret_access_key": "secret-key-value",
        "session_token": "session-token-value",
        "region": "us-east-1",
        "max_retries": 2,
        "backoff_initial": 0.01,
    }
    storage = Storage(StorageConfig(options))
    with pytest.raises(RemoteStorageError, match=r"redirected to another host \(http://127\.0\.0\.1:\d+\)"):
        storage.read("s3://bucket/ds/index.json")
    leaked = [h for h in redirecting.captured if any(v in json.dumps(h) for v in ("session-token", "AKIDTRUST"))]
    assert leaked == []
    assert storage.stats.requests == 1  # refused at once, not retried


def test_http_headers_never_follow_a_redirect_to_another_host(redirecting: _Servers) -> None:
    from lightning_vstream.errors import RemoteStorageError
    from lightning_vstream.storage.client import Storage

    options = {"allow_http": True, "headers": {"X-Api-Key": "api-key-value"}, "max_retries": 2}
    storage = Storage(StorageConfig(options))
    with pytest.raises(RemoteStorageError, match=r"redirected to another host"):
        storage.read(f"{redirecting.endpoint}/ds/index.json")
    assert [h for h in redirecting.captured if "api-key-value" in json.dumps(h)] == []
    # A redirect within the same server is followed, headers and all.
    data, _ = storage.read(f"{redirecting.endpoint}/same/index.json")
    assert bytes(data) == b"abcdefghij"


@pytest.mark.parametrize("scheme", ["s3", "http"])
def test_a_redirect_carrying_no_secret_but_authorization_is_followed_unguarded(
    redirecting: _Servers, scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the only secret is the ``Authorization`` header (a static S3 key, an HTTP store without
    configured headers), the client drops it on a redirect to another host: no guard relays those bytes,
    and nothing secret reaches the other host."""
    from lightning_vstream.storage.client import Storage
    from lightning_vstream.storage.obstore_transport import store_spec
    from lightning_vstream.storage.urls import parse as parse_location

    for name in ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    options: dict[str, Any] = {"allow_http": True, "max_retries": 2, "backoff_initial": 0.01}
    if scheme == "s3":
        options.update(
            endpoint=redirecting.endpoint,
            access_key_id="AKIDTRUST",
            secret_access_key="secret-key-value",
            region="us-east-1",
        )
        url = "s3://bucket/ds/index.json"
    else:
        url = f"{redirecting.endpoint}/ds/index.json"
    config = StorageConfig(options)
    assert store_spec(parse_location(url), config)["egress"] == []
    data, _ = Storage(config).read(url)
    assert bytes(data) == b"0123456789"  # the other host's answer, reached without credentials
    assert len(redirecting.captured) >= 1
    assert [h for h in redirecting.captured if any(v in json.dumps(h) for v in ("AKIDTRUST", "secret-key"))] == []
    assert all("authorization" not in h for h in redirecting.captured)
    # A session token (S3) or a configured header (HTTP) is a secret outside that header: the guard is back.
    if scheme == "s3":
        monkeypatch.setenv("AWS_SESSION_TOKEN", "session-token-value")
    else:
        config = StorageConfig({**options, "headers": {"X-Api-Key": "api-key-value"}})
    assert store_spec(parse_location(url), config)["egress"] != []


def _certificates(tmp_path: Path) -> tuple[Path, Path, bytes]:
    """A certificate for 127.0.0.1 and its key (files), signed by a test authority (its certificate in PEM)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def issue(subject: str, key: Any, issuer: str, signer: Any, ca: bool) -> Any:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
            builder = builder.add_extension(san, critical=False)
        return builder.sign(signer, hashes.SHA256())

    authority_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    authority = issue("test authority", authority_key, "test authority", authority_key, True)
    server = issue("127.0.0.1", server_key, "test authority", authority_key, False)
    (tmp_path / "cert.pem").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return tmp_path / "cert.pem", tmp_path / "key.pem", authority.public_bytes(serialization.Encoding.PEM)


_HTTPS_CLIENT = """
import json, sys
from lightning_vstream.storage import _obstore_calls
store = _obstore_calls.build_store(json.loads(sys.argv[1]))
for key in ("ds/index.json", "here/x"):  # redirected to the other server; served where it is
    try:
        data, _ = _obstore_calls.call(store, "get", {"key": key, "start": None, "end": None, "if_match": None})
        print(json.dumps(["read", bytes(data).decode()]))
    except _obstore_calls.RedirectRefused as err:
        print(json.dumps(["refused", str(err)]))
"""


def test_https_credentials_never_follow_a_redirect_to_another_host(tmp_path: Path) -> None:
    """Over https the guard only sees which host a tunnel is for: one to another host is refused."""
    import ssl

    cert, key, pem = _certificates(tmp_path)
    servers = _Servers(307, scheme="https")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    for server in (servers.capture, servers.redirect):
        server.socket = context.wrap_socket(server.socket, server_side=True)
    spec = {
        "kind": "s3",
        "root": "bucket",
        "config": {
            "endpoint": servers.endpoint,
            "access_key_id": "AKIDTRUST",
            "secret_access_key": "secret-key-value",
            "session_token": "session-token-value",
            "region": "us-east-1",
        },
        "client_options": {"root_certificate": pem.decode(), "timeout": "10s"},
        "egress": [servers.endpoint.split("://", 1)[1]],
    }
    try:
        # In a child process: obstore in this one would hang the forked DataLoader workers of later tests.
        env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
        done = subprocess.run(
            [sys.executable, "-c", _HTTPS_CLIENT, json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    finally:
        servers.close()
    assert done.returncode == 0, done.stderr
    refused, read = (json.loads(line) for line in done.stdout.splitlines())
    assert refused[0] == "refused" and re.search(r"redirect to another host: https://127\.0\.0\.1:\d+", refused[1])
    assert servers.captured == []  # the tunnel to the other host was never opened
    assert read == ["read", "abcdefghij"]  # without a redirect, the same client reads through the guard's tunnel


# -- 5. the CLI's saved config holds no secret ------------------------------------------------------------
def test_the_cli_saves_its_config_without_secrets(
    tmp_path: Path, remote_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_vstream import VStreamCLI
    from lightning_vstream.demos.models import TinyStreamPETR

    secrets = {"secret_access_key": "SECRET-ACCESS-KEY", "session_token": "SESSION-TOKEN", "headers": {"X": "HDR"}}
    config = tmp_path / "cfg.yaml"
    config.write_text(
        json.dumps(
            {
                "seed_everything": 0,
                "data": {
                    "index_file": remote_dataset.resolve().as_uri(),
                    "storage": {"options": {"access_key_id": "kept", **secrets}},
                    "batch_size": 2,
                    "engine": {"num_workers": 0},
                },
                "trainer": {"max_steps": 1, "default_root_dir": str(tmp_path / "run"), "enable_progress_bar": False},
            }
        )
    )
    monkeypatch.setattr(sys, "argv", ["train"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cli = VStreamCLI(TinyStreamPETR, StreamVideoDataModule, run=False, args=["--config", str(config)])
        assert cli.datamodule.storage.options["secret_access_key"] == "SECRET-ACCESS-KEY"  # in memory, for use
        cli.trainer.fit(cli.model, cli.datamodule)
    written = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert any(p.name == "config.yaml" for p in written) and any(p.suffix == ".ckpt" for p in written)
    for path in written:
        content = path.read_bytes()
        for secret in ("SECRET-ACCESS-KEY", "SESSION-TOKEN", "HDR"):
            assert secret.encode() not in content, f"{secret} written to {path}"
    saved = next(p for p in written if p.name == "config.yaml").read_text()
    assert "access_key_id: kept" in saved and "secret_access_key: null" in saved
    saved_options = yaml.safe_load(saved)["data"]["storage"]["options"]
    assert saved_options["access_key_id"] == "kept"
    assert all(saved_options[key] is None for key in secrets), saved_options


# -- 9. StreamVideoDataModule reads a remote index without tables -----------------------------------------
def test_the_stream_datamodule_reads_a_remote_index_without_tables(s3: S3TestServer, remote_dataset: Path) -> None:
    bucket = s3.bucket("trust-bare")
    for path in sorted((remote_dataset.parent / "videos").rglob("*.mp4")):
        s3.client().upload_file(str(path), bucket, f"bare/videos/{path.parent.name}/{path.name}")
    s3.client().upload_file(str(remote_dataset), bucket, "bare/index.json")
    common: dict[str, Any] = {"batch_size": 2, "engine": EngineOptions(num_workers=0), "seed": 4}
    remote = StreamVideoDataModule(
        index_file=f"s3://{bucket}/bare/index.json", storage=StorageConfig(options=s3.storage_options()), **common
    )
    local = StreamVideoDataModule(index_file=str(remote_dataset), **common)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VStreamWarning)
        for module in (remote, local):
            module.setup("fit")
        got = list(remote.train_dataloader())
    expected = list(local.train_dataloader())
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected):
        assert not batch_stamp_errors(a) and torch.equal(a["frames"], b["frames"])
