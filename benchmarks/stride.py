"""Reading at a stride and at random places, against torchcodec, decord2 and SPDL, on three encodes of one footage.

The footage is the camera-like content of ``benchmarks/encode.py`` (sky, road, moving boxes, moving
multi-scale texture, sensor noise), ``--clips`` clips x ``--cameras`` cameras (6) x ``--frames`` frames at
``--size`` (1600x900), 12 fps, each clip drawn from its own seeds, written losslessly once and encoded with
:func:`lightning_vstream.encode.encode_sources` three ways:

- ``ippp``: the usual layout, what ``vstream encode`` writes by default (H.265, GOP 12 or ``--gop``, no B-frames);
- ``stride``: the stride layout, ``EncodeSettings(keyframe_stride=--keyframe-stride)`` (6, nuScenes' key
  frames): every 6th frame a reference picture, the frames between non-reference B-frames; GOP 36 (six
  references, ``vstream encode``'s default there) or ``--gop``;
- ``x264b``: H.264 as x264 writes it by default (``bframes=3``, ``b-pyramid=normal``, adaptive B-frames),
  GOP ``--bframes-gop`` (36), as camera footage encoded by others often is; read in random access only.

Every reader then reads the same frames:

- **streaming** at ``frame_stride`` 1, 2 and 6 on ``ippp`` and ``stride``: every ``frame_stride``-th
  frame of every camera file from frame 0, each file opened once per pass;
- **random access** on all three: ``--samples`` samples, each ``--ra-frames`` frames ``--ra-spacing``
  apart from a random place of a random clip, every camera; one sample per clip first (untimed), so
  readers that keep decoders have them open.

Readers and their settings (a peer runs each of its settings; the tables show its best per case,
and the JSON every setting):

- ``vstream`` (the baseline): ``StreamVideoDataModule(batch_size=clips,
  plan=PlanOptions(frame_stride=N, shuffle=False), engine=EngineOptions(kind="threads"))`` (the CPU default: decode threads in the process, one per core, one FFmpeg thread
  per decoder, frames written once into recycled batch memory); random access ``VideoClipDataset``
  over ``at_indices`` requests (its defaults: two GOPs decoded at once, one FFmpeg thread per decoder, one
  kept decoder per file). Frames decoded per frame delivered come from ``decode_stats()`` (streaming)
  and ``VideoClipDataset.decoders.frames_decoded`` (random access). ``--ours-baseline DIR`` adds
  ``vstream@baseline``, the same reader imported from another checkout (a worktree of the commit
  before a change), measured in the same run.
- ``torchcodec``: ``VideoDecoder(path, seek_mode="exact", device="cpu", num_ffmpeg_threads=T)``,
  streaming with the batched ``get_frames_in_range(start, stop, step)`` over ``--chunk`` delivered
  frames per call, random access with ``get_frames_at(indices)`` on a decoder kept per file.
- ``decord2``: ``VideoReader(path, ctx=cpu(0), num_threads=T)``, frames to torch through DLPack, the batched
  ``get_batch(indices)`` (``--chunk`` frames per call when streaming), kept per file in random access.
- ``spdl``: streaming through ``Demuxer.streaming_demux`` and a ``Decoder`` whose filter keeps every
  N-th frame before the RGB conversion (``select=not(mod(n,N)),format=rgb24``); random access with
  ``sample_decode_video`` (decodes from the keyframe before each wanted frame, stops after the last)
  over packets demuxed once per file and kept; every batch converted into a kept ``cpu_storage``
  (reused output memory, as the stream loader recycles its batches; torchcodec and decord2 take no
  output buffer). ``decode_config(decoder_options={"threads": T})``.

Peer settings (``--peer-settings``, default ``0x1,1xC``: ``T`` FFmpeg threads per decoder x files
decoded at once by a thread pool; ``0`` lets FFmpeg choose, ``C`` is the number of cores). Every reader
at every setting runs in a process of its own, kept for the run; each case is read by every reader in
turn before the next case, the order rotating from case to case and repeat to repeat, so a change of
machine load falls on all of them alike. Wall time and process CPU time (all threads) of each timed
pass are taken, and the goals are given in both: on a shared machine the CPU-time ratios are the
steadier.

Frame-exactness: in the first repeat every reader's frames of the first camera of each clip
(streaming) and of every camera (the untimed random-access samples) are reduced to 16x16-pixel block
means and compared with a full PyAV decode of the file: each must be nearest to the frame asked for and
within one grey level of it. A reader that fails is reported as such and left out of the ratios.

Goals, reported (never asserted): stride 6 on ``stride`` >= 2.5x our stride 6 on ``ippp`` and >= 2.5x
the best peer's stride 6 (either encode); random access on ``x264b`` >= 1.5x torchcodec's best; stride 1
unchanged (``vstream`` / ``vstream@baseline``, within the spread of the repeats).

Peers: a peer that is not installed or does not import is listed as not measured, with the reason.

- decord2 and SPDL install beside lightning_vstream: ``pip install decord2 spdl``. SPDL loads the
  system's FFmpeg libraries (``apt-get install ffmpeg``); decord2 ships its own.
- torchcodec 0.17 on PyPI is a CUDA build: it imports only next to the CUDA build of torch (it then
  decodes on the CPU without a GPU) and the system's FFmpeg libraries. Keep it in a venv of its own and
  name its interpreter with ``--torchcodec-python`` (or ``VSTREAM_TORCHCODEC_PYTHON``; by default this
  interpreter, then ``/tmp/torchcodec-venv/bin/python``, are tried)::

      apt-get install -y ffmpeg
      python3.11 -m venv /tmp/torchcodec-venv
      /tmp/torchcodec-venv/bin/pip install torch==2.13.0 torchcodec==0.17.0 numpy

  (a pip configured with a local folder of CPU torch wheels picks one of those, and torchcodec then
  fails to load: run the install with that configuration off, ``env -u PIP_FIND_LINKS
  PIP_CONFIG_FILE=/dev/null``, and check that ``torch.__version__`` ends in ``+cu130``). The peer
  processes import only numpy, torch and the peer, never lightning_vstream.

Data go to ``--data`` (default ``/tmp/vstream_stride_bench``), reused by later runs with the same
parameters; the JSON to ``--json``.

Usage::

    python benchmarks/stride.py --quick                      # 1 clip x 6 cameras x 24 frames, 1 repeat: a smoke run
    python benchmarks/stride.py                              # 2 clips x 6 cameras x 48 frames, 3 repeats (15 min)
    python benchmarks/stride.py --ours-baseline /tmp/vstream-before  # and the package of another commit

where ``/tmp/vstream-before`` holds ``lightning_vstream`` as of that commit
(``git archive COMMIT lightning_vstream | tar -x -C /tmp/vstream-before``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lightning_vstream import DecodeOptions, EngineOptions, PlanOptions

SCHEMA = "lightning_vstream.bench.stride/1"
PEERS = ("torchcodec", "decord2", "spdl")
OURS = "vstream"
BASELINE = "vstream@baseline"
#: Side of the pixel blocks whose means are compared with the reference decode.
BLOCK = 16
#: Largest mean difference (grey levels) between a reader's block means and the reference's.
MAX_BLOCK_ERROR = 1.0
TORCHCODEC_VENV = Path("/tmp/torchcodec-venv/bin/python")
ENCODE_LABELS = {
    "ippp": "usual IPPP",
    "stride": "stride layout",
    "x264b": "x264 B-frames",
}


# -- what every reader process shares: block means, timing ------------------------------------------------
def block_means(frame: Any, layout: str) -> Any:
    """The ``BLOCK`` x ``BLOCK`` block means of one RGB frame (``"chw"`` or ``"hwc"``, a tensor or an array)."""
    import numpy as np

    array = np.asarray(frame.numpy() if hasattr(frame, "numpy") else frame)
    if layout == "chw":
        array = array.transpose(1, 2, 0)
    h, w = array.shape[0] // BLOCK * BLOCK, array.shape[1] // BLOCK * BLOCK
    blocks = array[:h, :w].reshape(h // BLOCK, BLOCK, w // BLOCK, BLOCK, 3)
    return blocks.mean(axis=(1, 3), dtype=np.float32)


class Checked:
    """Block means of delivered frames, keyed ``case|clip|camera|frame`` (thread-safe)."""

    def __init__(self) -> None:
        self.means: dict[str, Any] = {}
        self._lock = threading.Lock()

    def add(self, case: str, clip: str, camera: str, frame: int, image: Any, layout: str) -> None:
        means = block_means(image, layout)
        with self._lock:
            self.means[f"{case}|{clip}|{camera}|{frame}"] = means


def _timed(run: Callable[[], int]) -> dict[str, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    delivered = run()
    return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu, "delivered": delivered}


def _in_pool(pool: ThreadPoolExecutor | None, work: Callable[[Any], int], items: Sequence[Any]) -> int:
    if pool is None:
        return sum(work(item) for item in items)
    return sum(pool.map(work, items))


def _pool(parallel: int) -> ThreadPoolExecutor | None:
    """Threads for ``parallel`` files at once, kept for a whole pass; None: one file at a time, here."""
    return ThreadPoolExecutor(parallel) if parallel > 1 else None


# -- peers: each imports only numpy, torch and itself (torchcodec may run in a venv of its own) -------------
class Peer:
    """One peer library at one setting: ``threads`` FFmpeg threads per decoder, ``parallel`` files at once."""

    name = ""
    layout = "chw"

    def __init__(self, threads: int, parallel: int) -> None:
        self.threads, self.parallel = threads, parallel
        self._kept: dict[str, Any] = {}
        self._lock = threading.Lock()

    @staticmethod
    def version() -> str:
        raise NotImplementedError

    def stream(self, path: str, frames: int, stride: int, chunk: int) -> Iterable[Any]:
        """Every ``stride``-th frame of the file from frame 0, in batches of up to ``chunk`` frames (a new decoder)."""
        raise NotImplementedError

    def sample(self, path: str, indices: list[int]) -> Any:
        """The frames at ``indices`` (sorted) from the decoder kept for ``path``."""
        raise NotImplementedError

    def kept(self, path: str, make: Callable[[], Any]) -> Any:
        with self._lock:
            if path not in self._kept:
                self._kept[path] = make()
            return self._kept[path]

    def drop_kept(self) -> None:
        """Close the kept decoders (between cases, so a process holds one case's decoders at a time)."""
        with self._lock:
            self._kept.clear()


class TorchCodecPeer(Peer):
    name = "torchcodec"

    @staticmethod
    def version() -> str:
        import torchcodec
        from torchcodec.decoders import VideoDecoder  # noqa: F401  (the import that fails without FFmpeg)

        return str(torchcodec.__version__)

    def _decoder(self, path: str) -> Any:
        from torchcodec.decoders import VideoDecoder

        return VideoDecoder(path, seek_mode="exact", device="cpu", num_ffmpeg_threads=self.threads)

    def stream(self, path: str, frames: int, stride: int, chunk: int) -> Iterable[Any]:
        decoder = self._decoder(path)
        for start in range(0, frames, stride * chunk):
            yield decoder.get_frames_in_range(start, min(frames, start + stride * chunk), stride).data

    def sample(self, path: str, indices: list[int]) -> Any:
        return self.kept(path, lambda: self._decoder(path)).get_frames_at(indices).data


class DecordPeer(Peer):
    name = "decord2"
    layout = "hwc"

    @staticmethod
    def version() -> str:
        import decord

        return str(decord.__version__)

    def _reader(self, path: str) -> Any:
        import decord

        return decord.VideoReader(path, ctx=decord.cpu(0), num_threads=self.threads)

    @staticmethod
    def _batch(reader: Any, indices: list[int]) -> Any:
        from decord.bridge import to_torch

        # To torch through DLPack, no copy (decord's set_bridge is per thread; this works in any).
        return to_torch(reader.get_batch(indices))

    def stream(self, path: str, frames: int, stride: int, chunk: int) -> Iterable[Any]:
        reader = self._reader(path)
        wanted = list(range(0, frames, stride))
        for start in range(0, len(wanted), chunk):
            yield self._batch(reader, wanted[start : start + chunk])

    def sample(self, path: str, indices: list[int]) -> Any:
        return self._batch(self.kept(path, lambda: self._reader(path)), indices)


class SpdlPeer(Peer):
    name = "spdl"
    layout = "hwc"

    def __init__(self, threads: int, parallel: int) -> None:
        super().__init__(threads, parallel)
        self._storage = threading.local()  # one reused output buffer per thread

    @staticmethod
    def version() -> str:
        import spdl.io

        spdl.io.decode_config()  # loads libspdl, which needs the system's FFmpeg libraries
        from importlib.metadata import version

        return version("spdl")

    def _config(self) -> Any:
        import spdl.io

        return spdl.io.decode_config(decoder_options={"threads": str(self.threads)})

    def _convert(self, frames: Any, count: int, frame_bytes: int) -> Any:
        import spdl.io

        storage = getattr(self._storage, "buffer", None)
        if storage is None or getattr(self._storage, "frames", 0) < count:
            self._storage.buffer = storage = spdl.io.cpu_storage(count * frame_bytes, pin_memory=False)
            self._storage.frames = count
        return spdl.io.to_torch(spdl.io.convert_frames(frames, storage=storage))

    def stream(self, path: str, frames: int, stride: int, chunk: int) -> Iterable[Any]:
        import spdl.io

        demuxer: Any = spdl.io.Demuxer(path)
        codec = demuxer.video_codec
        keep = f"select='not(mod(n\\,{stride}))'," if stride > 1 else ""
        decoder = spdl.io.Decoder(codec, filter_desc=f"{keep}format=pix_fmts=rgb24", decode_config=self._config())
        frame_bytes = codec.width * codec.height * 3
        for packets in demuxer.streaming_demux(demuxer.video_stream_index, num_packets=stride * chunk):
            for decoded in decoder.streaming_decode_packets(packets):
                yield self._convert(decoded, 2 * chunk, frame_bytes)
        for decoded in decoder.flush():
            yield self._convert(decoded, 2 * chunk, frame_bytes)

    def sample(self, path: str, indices: list[int]) -> Any:
        import spdl.io

        packets = self.kept(path, lambda: spdl.io.demux_video(path))
        frames = spdl.io.sample_decode_video(packets.clone(), indices, decode_config=self._config())
        return self._convert(frames, len(indices), packets.width * packets.height * 3)


PEER_CLASSES: dict[str, type[Peer]] = {c.name: c for c in (TorchCodecPeer, DecordPeer, SpdlPeer)}


def peer_stream_pass(
    peer: Peer, case: dict[str, Any], chunk: int, files: list[dict[str, Any]], check: Checked | None
) -> int:
    def read(file: dict[str, Any]) -> int:
        wanted = range(0, file["frames"], case["stride"])
        count = 0
        for batch in peer.stream(file["path"], file["frames"], case["stride"], chunk):
            if check is not None:
                for image in batch:
                    check.add(case["name"], file["clip"], file["camera"], wanted[count], image, peer.layout)
                    count += 1
            else:
                count += len(batch)
        if count != len(wanted):
            raise RuntimeError(f"{peer.name} delivered {count} frames of {file['path']}, {len(wanted)} asked for")
        return count

    pool = _pool(peer.parallel)
    try:
        return _in_pool(pool, read, files)
    finally:
        if pool is not None:
            pool.shutdown()


def peer_random_pass(peer: Peer, case: dict[str, Any], requests: list[list[Any]], check: Checked | None) -> int:
    by_clip: dict[str, list[dict[str, Any]]] = {}
    for file in case["files"]:
        by_clip.setdefault(file["clip"], []).append(file)
    delivered = 0
    pool = _pool(peer.parallel)
    try:
        for clip, indices in requests:

            def read(file: dict[str, Any], clip: str = clip, indices: list[int] = indices) -> int:
                frames = peer.sample(file["path"], indices)
                if len(frames) != len(indices):
                    raise RuntimeError(f"{peer.name} returned {len(frames)} frames of {file['path']} for {indices}")
                if check is not None:
                    for index, image in zip(indices, frames):
                        check.add(case["name"], clip, file["camera"], index, image, peer.layout)
                return len(frames)

            delivered += _in_pool(pool, read, by_clip[clip])
    finally:
        if pool is not None:
            pool.shutdown()
    return delivered


def peer_case(peer: Peer, case: dict[str, Any], chunk: int, check: Checked | None) -> dict[str, Any]:
    """One case: the untimed check or warm-up pass, then the timed pass; kept decoders are dropped after it."""
    try:
        if case["kind"] == "stream":
            if check is not None:  # untimed: one camera per clip, checked
                first = [f for f in case["files"] if f["camera"] == case["cameras"][0]]
                peer_stream_pass(peer, case, chunk, first, check)
            result = _timed(lambda: peer_stream_pass(peer, case, chunk, case["files"], None))
        else:
            peer_random_pass(peer, case, case["warmup"], check)  # opens the kept decoders
            result = _timed(lambda: peer_random_pass(peer, case, case["requests"], None))
    finally:
        peer.drop_kept()
    return {**result, "decoded": None}  # no peer says how many frames it decoded


def _guarded(run: Callable[[dict[str, Any]], dict[str, Any]], case: dict[str, Any]) -> dict[str, Any]:
    """``run(case)``, or the error it raised: one case a reader cannot read does not stop the others."""
    try:
        return run(case)
    except Exception as err:
        return {"error": f"{type(err).__name__}: {err}"[:500]}


# -- lightning_vstream, through its public API only ---------------------------------------------------------
def _stats(dm: Any) -> dict[str, Any]:
    import dataclasses

    stats = dm.decode_stats("train")
    return {k: v for k, v in dataclasses.asdict(stats).items() if isinstance(v, (int, float))}


def ours_stream_pass(case: dict[str, Any], check: Checked | None, epochs: int) -> list[dict[str, Any]]:
    from lightning_vstream import StreamVideoDataModule

    dm = StreamVideoDataModule(
        index_file=case["index"],
        batch_size=case["clips"],
        plan=PlanOptions(frame_stride=case["stride"], shuffle=False),
        engine=EngineOptions(kind="threads"),
        seed=0,
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    expected = {(f["clip"], i) for f in case["files"] for i in range(0, f["frames"], case["stride"])}
    results = []
    for epoch in range(epochs):
        before = _stats(dm)
        seen: set[tuple[str, int]] = set()
        checking = check is not None and epoch == 0

        def run(checking: bool = checking, seen: set[tuple[str, int]] = seen) -> int:
            delivered = 0
            for batch in loader:
                names = batch["camera_names"]
                for slot, clip in enumerate(batch["clip_id"]):
                    if not bool(batch["valid"][slot]):
                        continue
                    frame = int(batch["frame_index"][slot])
                    seen.add((clip, frame))
                    delivered += len(names)
                    if checking:
                        assert check is not None
                        check.add(case["name"], clip, names[0], frame, batch["frames"][slot, 0], "chw")
            return delivered

        result = _timed(run)
        if seen != expected:
            wrong = sorted(expected ^ seen)[:5]
            raise RuntimeError(f"{case['name']}: the stream loader's frames differ from those asked for at {wrong}")
        after = _stats(dm)
        result["stats"] = {k: after[k] - before.get(k, 0) for k in after}
        result["decoded"] = result["stats"].get("frames_decoded")
        results.append(result)
    dm.teardown()
    return results


def ours_random_pass(case: dict[str, Any], check: Checked | None) -> dict[str, Any]:
    from lightning_vstream import VideoClipDataset, at_indices

    warmup, requests = case["warmup"], case["requests"]
    dataset = VideoClipDataset(
        index=case["index"],
        requests=[at_indices(clip, indices) for clip, indices in [*warmup, *requests]],
        decode=DecodeOptions(max_open_decoders=len(case["files"])),
    )

    def decoded() -> int | None:
        try:
            return int(dataset.decoders.frames_decoded)
        except AttributeError:  # not exposed by this version
            return None

    try:
        for i, (clip, indices) in enumerate(warmup):
            sample = dataset[i]
            if sample["frame_index"].tolist() != indices:
                raise RuntimeError(
                    f"{case['name']}: asked for {indices} of {clip}, got {sample['frame_index'].tolist()}"
                )
            if check is not None:
                for t, index in enumerate(indices):
                    for k, camera in enumerate(sample["camera_names"]):
                        check.add(case["name"], clip, camera, index, sample["frames"][t, k], "chw")
        before = decoded()

        def run() -> int:
            delivered = 0
            for i, (clip, indices) in enumerate(requests, start=len(warmup)):
                sample = dataset[i]
                if sample["frame_index"].tolist() != indices:
                    raise RuntimeError(
                        f"{case['name']}: asked for {indices} of {clip}, got {sample['frame_index'].tolist()}"
                    )
                delivered += sample["frames"].shape[0] * sample["frames"].shape[1]
            return delivered

        result = _timed(run)
        after = decoded()
        result["decoded"] = after - before if after is not None and before is not None else None
        return result
    finally:
        dataset.close()  # its kept decoders


def ours_case(case: dict[str, Any], check: Checked | None) -> dict[str, Any]:
    if case["kind"] == "stream":
        # With a check, the checked epoch is untimed and the second one is the measurement.
        return ours_stream_pass(case, check, 2 if check is not None else 1)[-1]
    return ours_random_pass(case, check)


def ours_version() -> str:
    import lightning_vstream

    return f"{lightning_vstream.__version__} ({Path(lightning_vstream.__file__).parent.parent})"


# -- the reader process --------------------------------------------------------------------------------------
#: Marks the reader process's answers on its standard output (libraries may print there too).
ANSWER = "@@stride-bench@@ "


def serve() -> None:
    """A reader process (``--serve``): the first line of stdin names the reader and its setting, each later line
    a case to run (with ``check`` and where to write the block means); each answer is one line on stdout."""
    import numpy as np

    header = json.loads(sys.stdin.readline())
    peer = None if header["reader"] in (OURS, BASELINE) else PEER_CLASSES[header["reader"]](**header["setting"])
    if peer is None:  # imports before the first timed pass
        from lightning_vstream import StreamVideoDataModule, VideoClipDataset  # noqa: F401
    else:
        peer.version()
    for line in sys.stdin:
        message = json.loads(line)
        check = Checked() if message["check"] else None

        def run(case: dict[str, Any], check: Checked | None = check) -> dict[str, Any]:
            return ours_case(case, check) if peer is None else peer_case(peer, case, header["chunk"], check)

        result = _guarded(run, message["case"])
        if check is not None:
            np.savez(message["means"], **check.means)
        sys.stdout.write(ANSWER + json.dumps(result) + "\n")
        sys.stdout.flush()


def probe(reader: str) -> None:
    """Print the reader's version as JSON, or why it does not import (``--probe``)."""
    try:
        version = ours_version() if reader in (OURS, BASELINE) else PEER_CLASSES[reader].version()
        print(json.dumps({"version": version}))
    except Exception as err:  # any failure to import is the answer
        print(json.dumps({"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]}))


# -- the parent: data, peers, orchestration, report ----------------------------------------------------------
def encode_settings(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    common: dict[str, Any] = {"preset": args.preset}
    gop = {} if args.gop is None else {"gop": args.gop}  # None: what vstream encode writes (12; 6 x N at stride N)
    return {
        "ippp": {"codec": "hevc", **gop, **common},
        "stride": {"codec": "hevc", **gop, "keyframe_stride": args.keyframe_stride, **common},
        "x264b": {"codec": "h264", "gop": args.bframes_gop, "bframes": 3, **common},
    }


def prepare(args: argparse.Namespace) -> dict[str, Any]:
    """Write (or reuse) the footage's three encodes; the index, the bytes and every file's reference block means."""
    import numpy as np
    from keyframe_stride import write_sources  # benchmarks/keyframe_stride.py, beside this script

    from lightning_vstream import load_index
    from lightning_vstream.encode import CameraSource, EncodeSettings, encode_sources

    width, height = args.size
    params = {
        "clips": args.clips,
        "cameras": args.cameras,
        "frames": args.frames,
        "size": [width, height],
        "encodes": encode_settings(args),
        "block": BLOCK,
    }
    root = args.data / f"{width}x{height}_c{args.clips}_k{args.cameras}_f{args.frames}"
    marker = root / "params.json"
    if not (marker.is_file() and json.loads(marker.read_text()) == params):
        shutil.rmtree(root, ignore_errors=True)
        started = time.perf_counter()
        print(
            f"writing {args.clips} clips x {args.cameras} cameras x {args.frames} frames at {width}x{height} ...",
            flush=True,
        )
        sources = []
        for c in range(args.clips):
            clip_id = f"clip-{c:04d}"
            paths = write_sources(root / "src" / clip_id, args.cameras, args.frames, (width, height), seed=100 * c)
            sources += [CameraSource(clip_id, p.stem, p) for p in paths]
        for name, settings in encode_settings(args).items():
            print(f"  encoding {name}: {settings}", flush=True)
            encode_sources(sources, root / name, settings=EncodeSettings(**settings), jobs=args.jobs, progress=False)
        shutil.rmtree(root / "src")  # lossless sources are large; the encodes are what is read
        for name in encode_settings(args):
            means = {}
            for clip in load_index(root / name / "index.json"):
                for camera in clip.cameras:
                    means[f"{clip.clip_id}|{camera.name}"] = reference_means(str(camera.path))
            np.savez(root / name / "reference_means.npz", **means)
        marker.write_text(json.dumps(params))
        print(f"  ready in {time.perf_counter() - started:.0f} s: {root}", flush=True)
    encodes = {}
    for name in encode_settings(args):
        index = load_index(root / name / "index.json")
        files: list[dict[str, Any]] = [
            {"path": str(camera.path), "clip": clip.clip_id, "camera": camera.name, "frames": clip.frame_count}
            for clip in index
            for camera in clip.cameras
        ]
        encodes[name] = {
            "index": str(root / name / "index.json"),
            "files": files,
            "bytes": sum(Path(f["path"]).stat().st_size for f in files),
            "cameras": list(index[0].camera_names),
            "clips": len(index),
        }
    return encodes


def reference_means(path: str) -> Any:
    """Block means of every frame of a file, in presentation order, from a plain PyAV decode."""
    import av
    import numpy as np

    with av.open(path) as container:
        frames = sorted(((f.pts, f.to_ndarray(format="rgb24")) for f in container.decode(video=0)), key=lambda x: x[0])
    return np.stack([block_means(image, "hwc") for _, image in frames])


def plan_cases(args: argparse.Namespace, encodes: dict[str, Any]) -> list[dict[str, Any]]:
    strides = sorted({1, 2, args.keyframe_stride})
    cases = []
    for encode in ("ippp", "stride"):
        for stride in strides:
            cases.append({"name": f"stream {stride}/{encode}", "kind": "stream", "stride": stride, "encode": encode})
    frames = min(f["frames"] for f in encodes["ippp"]["files"])
    span = (args.ra_frames - 1) * args.ra_spacing
    if span >= frames:
        raise SystemExit(f"--ra-frames {args.ra_frames} x --ra-spacing {args.ra_spacing} do not fit {frames} frames")
    rng = random.Random(args.seed)
    clips = sorted({f["clip"] for f in encodes["ippp"]["files"]})

    def request(clip: str) -> list[Any]:
        start = rng.randrange(frames - span)
        return [clip, [start + k * args.ra_spacing for k in range(args.ra_frames)]]

    warmup = [request(clip) for clip in clips]
    requests = [request(rng.choice(clips)) for _ in range(args.samples)]
    for encode in ("ippp", "stride", "x264b"):
        cases.append(
            {"name": f"random/{encode}", "kind": "random", "encode": encode, "warmup": warmup, "requests": requests}
        )
    for case in cases:
        e = encodes[case["encode"]]
        case.update(index=e["index"], files=e["files"], cameras=e["cameras"], clips=e["clips"])
    return cases


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _ask(python: str, arguments: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run this script with ``python`` and ``arguments``; its last line of output as JSON, or ``{"error": why}``."""
    try:
        done = subprocess.run(
            [python, str(Path(__file__).resolve()), *arguments],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:  # no such interpreter, or a reader that hangs
        return {"error": f"{type(err).__name__}: {err}"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-6:]
        return {"error": f"exit {done.returncode}: " + " | ".join(tail)[-800:]}
    return json.loads(lines[-1])


def readers(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The readers to run (name, interpreter, environment, settings) and the peers not measured, with why."""
    import lightning_vstream

    env = dict(os.environ)
    here = str(Path(lightning_vstream.__file__).resolve().parent.parent)  # the copy this process imports
    ours: list[dict[str, Any]] = [
        {"name": OURS, "python": sys.executable, "env": {**env, "PYTHONPATH": here}, "settings": [{}]}
    ]
    if args.ours_baseline is not None:
        tree = str(args.ours_baseline.resolve())
        ours.append({"name": BASELINE, "python": sys.executable, "env": {**env, "PYTHONPATH": tree}, "settings": [{}]})
    found: list[dict[str, Any]] = []
    missing: dict[str, str] = {}
    for reader in ours:
        answer = _ask(reader["python"], ["--probe", reader["name"]], reader["env"], 300)
        if "version" not in answer:
            raise SystemExit(f"{reader['name']} does not import: {answer.get('error')}")
        reader["version"] = answer["version"]
        found.append(reader)
    settings = [dict(zip(("threads", "parallel"), s)) for s in args.peer_settings]
    for name in PEERS:
        if name in args.skip:
            missing[name] = "skipped (--skip)"
            continue
        pythons = [sys.executable]
        if name == "torchcodec":
            given = args.torchcodec_python or os.environ.get("VSTREAM_TORCHCODEC_PYTHON")
            pythons = (
                [given] if given else [sys.executable, *([str(TORCHCODEC_VENV)] if TORCHCODEC_VENV.exists() else [])]
            )
        reasons = []
        for python in pythons:
            answer = _ask(python, ["--probe", name], env, 300)
            if "version" in answer:
                found.append(
                    {"name": name, "python": python, "env": env, "settings": settings, "version": answer["version"]}
                )
                break
            reasons.append(f"{python}: {answer.get('error')}")
        else:
            missing[name] = "; ".join(reasons)
    return found, missing


def setting_label(name: str, setting: dict[str, Any]) -> str:
    if not setting:
        return name
    threads = "auto" if setting["threads"] == 0 else str(setting["threads"])
    return (
        f"{name} [ffmpeg threads {threads}, {setting['parallel']} file{'s' if setting['parallel'] > 1 else ''} at once]"
    )


def verify(means_file: Path, reference: dict[str, Any]) -> tuple[dict[str, int], dict[str, list[str]]]:
    """Per case, how many delivered frames were compared with the reference decode, and those that differ."""
    import numpy as np

    checked: dict[str, int] = {}
    bad: dict[str, list[str]] = {}
    if not means_file.exists():  # no case delivered a frame to check
        return checked, bad
    with np.load(means_file) as delivered:
        for key in delivered.files:
            case, clip, camera, frame = key.split("|")
            checked[case] = checked.get(case, 0) + 1
            ref = reference[case.split("/")[-1]][f"{clip}|{camera}"]
            errors = np.abs(ref - delivered[key][None]).mean(axis=(1, 2, 3))
            if int(errors.argmin()) != int(frame) or errors[int(frame)] > MAX_BLOCK_ERROR:
                bad.setdefault(case, []).append(
                    f"{clip} {camera} frame {frame} is nearest to frame {int(errors.argmin())} "
                    f"(mean error {errors[int(frame)]:.2f})"
                )
    return checked, bad


class ReaderProcess:
    """One reader at one setting in a process of its own, kept for the whole run and given one case at a time."""

    def __init__(self, reader: dict[str, Any], setting: dict[str, Any], chunk: int, errors: Path) -> None:
        self.label = setting_label(reader["name"], setting)
        self._errors = errors.open("w+")  # a file, not a pipe: a chatty library cannot fill it and stall
        self.process = subprocess.Popen(
            [reader["python"], str(Path(__file__).resolve()), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            text=True,
            env=reader["env"],
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._send({"reader": reader["name"], "setting": setting, "chunk": chunk})

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def run(self, case: dict[str, Any], check: bool, means: Path, timeout: float) -> dict[str, Any]:
        """The case's result, ``{"error": why}`` when the reader raised, or also ``"fatal": True`` when its process
        ended or did not answer in ``timeout`` seconds (then it is stopped)."""
        try:
            self._send({"case": case, "check": check, "means": str(means)})
        except OSError:
            return {"error": self._ended(), "fatal": True}
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.close()
                return {"error": f"no answer in {timeout:.0f} s", "fatal": True}
            if line is None:
                return {"error": self._ended(), "fatal": True}
            if line.startswith(ANSWER):
                return dict(json.loads(line[len(ANSWER) :]))

    def _ended(self) -> str:
        code = self.process.wait(timeout=60)
        self._errors.seek(0)
        tail = " | ".join(self._errors.read().strip().splitlines()[-6:])[-800:]
        return f"the reader's process ended (exit {code}): {tail}"

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                assert self.process.stdin is not None
                self.process.stdin.close()
                self.process.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self._errors.close()


def measure(
    args: argparse.Namespace,
    encodes: dict[str, Any],
    cases: list[dict[str, Any]],
    found: list[dict[str, Any]],
    work: Path,
) -> dict[str, Any]:
    """Every case, every reader in turn (the order rotating), ``--repeats`` times; frames checked in the first."""
    import numpy as np

    reference = {}
    for name in encodes:
        with np.load(Path(encodes[name]["index"]).parent / "reference_means.npz") as refs:
            reference[name] = {key: refs[key] for key in refs.files}
    results: dict[str, dict[str, Any]] = {}
    processes: list[ReaderProcess] = []
    loads = []
    try:
        for reader in found:
            for setting in reader["settings"]:
                process = ReaderProcess(reader, setting, args.chunk, work / f"reader-{len(processes)}.log")
                processes.append(process)
                results[process.label] = {
                    "reader": reader["name"],
                    "setting": setting,
                    "cases": {},
                    "failed": {},
                    "frames_checked": 0,
                }
        for repeat in range(args.repeats):
            for c, case in enumerate(cases):
                started = time.perf_counter()
                k = (repeat + c) % len(processes)
                for n, process in enumerate(processes[k:] + processes[:k]):
                    entry, name = results[process.label], case["name"]
                    # A reader whose process ended is not asked again; nor is one about a case it failed.
                    if "*" in entry["failed"] or name in entry["failed"]:
                        continue
                    means = work / f"means-{c}-{n}.npz"
                    answer = process.run(case, repeat == 0, means, args.timeout)
                    if "error" in answer:
                        entry["failed"]["*" if answer.get("fatal") else name] = answer["error"]
                        print(f"  {process.label}: {name}: {answer['error']}", flush=True)
                        continue
                    if repeat == 0:
                        checked, bad = verify(means, reference)
                        entry["frames_checked"] += sum(checked.values())
                        if bad:
                            entry["failed"][name] = (
                                f"wrong frames: {len(bad[name])} of {checked[name]} checked differ from the "
                                "reference, " + "; ".join(bad[name][:2])
                            )
                            print(f"  {process.label}: {name}: {entry['failed'][name]}", flush=True)
                            continue
                    entry["cases"].setdefault(name, []).append(answer)
                print(
                    f"  repeat {repeat + 1}/{args.repeats}: {case['name']} "
                    f"({time.perf_counter() - started:.0f} s, load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
            loads.append(os.getloadavg())
    finally:
        for process in processes:
            process.close()
    return {"results": results, "load_after_repeats": loads}


def tabulate(results: dict[str, Any], cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Per case, every reader at every setting (median, spread) and each reader's best setting."""
    from keyframe_stride import summarize  # benchmarks/keyframe_stride.py: median, min, max and the runs

    table: dict[str, Any] = {}
    for case in cases:
        name = case["name"]
        rows = {}
        for label, entry in results.items():
            runs = entry["cases"].get(name)
            if not runs or name in entry["failed"]:
                continue
            fps = [r["delivered"] / r["wall_s"] for r in runs]
            cpu = [1000 * r["cpu_s"] / r["delivered"] for r in runs]
            decoded = [r["decoded"] / r["delivered"] for r in runs if r.get("decoded") is not None]
            rows[label] = {
                "reader": entry["reader"],
                "setting": entry["setting"],
                "frames_per_s": summarize(fps),
                "cpu_ms_per_frame": summarize(cpu),
                "decoded_per_delivered": statistics.median(decoded) if decoded else None,
                "delivered": runs[0]["delivered"],
                "stats": runs[-1].get("stats"),
            }
        best: dict[str, str] = {}
        for label, row in rows.items():
            current = best.get(row["reader"])
            if current is None or row["frames_per_s"]["median"] > rows[current]["frames_per_s"]["median"]:
                best[row["reader"]] = label
        ours = rows.get(OURS)
        for row in rows.values():
            row["x_vstream"] = row["frames_per_s"]["median"] / ours["frames_per_s"]["median"] if ours else None
        table[name] = {"rows": rows, "best": best}
    return table


def _best(table: dict[str, Any], case: str, reader: str) -> dict[str, Any] | None:
    """The row of ``reader``'s best setting in ``case``, None when it was not measured there."""
    entry = table.get(case)
    if entry is None or reader not in entry["best"]:
        return None
    return dict(entry["rows"][entry["best"][reader]])


def _compare(goal: str, target: float, a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any]:
    """``a`` against ``b``: the ratio of their wall-time rates and of their CPU time per frame (b's over a's), each
    with its spread (the least and the most favourable pair of repeats)."""
    out: dict[str, Any] = {"goal": goal, "target": target, "ratio": None, "spread": None, "cpu_ratio": None}
    if a is None or b is None:
        return out
    fa, fb, ca, cb = a["frames_per_s"], b["frames_per_s"], a["cpu_ms_per_frame"], b["cpu_ms_per_frame"]
    out["ratio"] = fa["median"] / fb["median"]
    out["spread"] = [fa["min"] / fb["max"], fa["max"] / fb["min"]]
    out["cpu_ratio"] = cb["median"] / ca["median"]
    out["cpu_spread"] = [cb["min"] / ca["max"], cb["max"] / ca["min"]]
    return out


def goals(table: dict[str, Any], stride: int) -> list[dict[str, Any]]:
    """The task's goals in figures: each ratio (wall time and CPU time), its target and whether this run meets it.

    A rate goal is met when the wall-time ratio reaches the target; "unchanged" when neither the wall-time nor the
    CPU-time ratio is below 1.0 beyond the spread of the repeats.
    """
    ours_stride = _best(table, f"stream {stride}/stride", OURS)
    peers = [
        (row["frames_per_s"]["median"], f"{p} on {ENCODE_LABELS[e]}", row)
        for p in PEERS
        for e in ("ippp", "stride")
        if (row := _best(table, f"stream {stride}/{e}", p)) is not None
    ]
    best_peer = max(peers, key=lambda peer: peer[0], default=None)
    out = [
        _compare(
            f"stride {stride} on the stride layout / our stride {stride} on IPPP",
            2.5,
            ours_stride,
            _best(table, f"stream {stride}/ippp", OURS),
        ),
        _compare(
            f"stride {stride} on the stride layout / best peer's stride {stride} "
            f"({best_peer[1] if best_peer else 'none measured'})",
            2.5,
            ours_stride,
            best_peer[2] if best_peer else None,
        ),
        _compare(
            "random access on x264 B-frame files / torchcodec's best",
            1.5,
            _best(table, "random/x264b", OURS),
            _best(table, "random/x264b", "torchcodec"),
        ),
    ]
    for g in out:
        g["met"] = None if g["ratio"] is None else g["ratio"] >= g["target"]
    for encode in ("ippp", "stride"):
        case = f"stream 1/{encode}"
        g = _compare(
            f"stride 1 on {ENCODE_LABELS[encode]} / the same before the change (--ours-baseline)",
            1.0,
            _best(table, case, OURS),
            _best(table, case, BASELINE),
        )
        g["met"] = None
        if g["ratio"] is not None:
            g["met"] = all(g[r] >= 1.0 or g[s][1] >= 1.0 for r, s in (("ratio", "spread"), ("cpu_ratio", "cpu_spread")))
        out.append(g)
    return out


def report(
    table: dict[str, Any], goal_rows: list[dict[str, Any]], header: str, failed: dict[str, dict[str, str]]
) -> str:
    lines = [header, ""]
    lines.append(
        f"{'case':<22} {'reader (best setting)':<58} {'frames/s (min-max)':>22} {'CPU ms/f':>9} {'dec/del':>8} {'x vstream':>10}"
    )
    for case, entry in table.items():
        rows = entry["rows"]
        order = sorted(entry["best"].values(), key=lambda label: (rows[label]["reader"] != OURS, rows[label]["reader"]))
        for i, label in enumerate(order):
            row = rows[label]
            f, c = row["frames_per_s"], row["cpu_ms_per_frame"]
            dec = "" if row["decoded_per_delivered"] is None else f"{row['decoded_per_delivered']:.2f}"
            fps = f"{f['median']:.1f} ({f['min']:.1f}-{f['max']:.1f})"
            ratio = "" if row["x_vstream"] is None else f"{row['x_vstream']:.2f}x"
            lines.append(f"{case if i == 0 else '':<22} {label:<58} {fps:>22} {c['median']:>9.2f} {dec:>8} {ratio:>10}")
    labels = sorted({label for entry in table.values() for label in entry["rows"]})
    if any(label not in entry["best"].values() for entry in table.values() for label in entry["rows"]):
        short = {case: case.replace("stream ", "s").replace("random/", "ra/") for case in table}
        lines += [
            "",
            "every setting, frames/s (median):",
            f"{'reader':<58}" + "".join(f"{v:>11}" for v in short.values()),
        ]
        for label in labels:
            cells = [table[case]["rows"].get(label, {}).get("frames_per_s", {}).get("median") for case in table]
            lines.append(f"{label:<58}" + "".join(f"{'-' if v is None else f'{v:.1f}':>11}" for v in cells))
    if failed:
        lines += ["", "left out of the table (failed, or delivered frames other than those asked for):"]
        lines += [f"  {label}: {case}: {why}" for label, cases in failed.items() for case, why in cases.items()]
    lines += ["", "goals (reported, not asserted):"]
    for g in goal_rows:
        if g["ratio"] is None:
            value = "not measured"
        else:
            value = (
                f"{g['ratio']:.2f}x wall ({g['spread'][0]:.2f}-{g['spread'][1]:.2f}), "
                f"{g['cpu_ratio']:.2f}x CPU ({g['cpu_spread'][0]:.2f}-{g['cpu_spread'][1]:.2f})"
            )
        met = {True: "met", False: "NOT met", None: ""}[g["met"]]
        lines.append(f"  {g['goal']}: {value}; goal {g['target']}x {met}".rstrip())
    return "\n".join(lines)


def parse_settings(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        threads, parallel = part.lower().split("x")
        out.append((int(threads), _cores() if parallel == "c" else int(parallel)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "vstream_stride_bench")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/stride.json"))
    parser.add_argument("--clips", type=int, default=2)
    parser.add_argument("--cameras", type=int, default=6)
    parser.add_argument("--frames", type=int, default=48, help="frames per camera file")
    parser.add_argument("--size", type=lambda s: tuple(int(v) for v in s.lower().split("x")), default=(1600, 900))
    parser.add_argument(
        "--gop",
        type=int,
        default=None,
        help="keyframe interval of the ippp and stride encodes (default: vstream encode's, 12 and 6 x N)",
    )
    parser.add_argument(
        "--keyframe-stride", type=int, default=6, help="the stride layout's N, and the longest stride read"
    )
    parser.add_argument("--bframes-gop", type=int, default=36, help="keyframe interval of the x264 B-frame encode")
    parser.add_argument("--preset", default="fast", help="encoder preset (vstream encode's default)")
    parser.add_argument("--jobs", type=int, default=_cores(), help="files encoded at once when writing the data")
    parser.add_argument("--samples", type=int, default=8, help="timed random-access samples")
    parser.add_argument("--ra-frames", type=int, default=2, help="frames per random-access sample")
    parser.add_argument("--ra-spacing", type=int, default=6, help="frames between a sample's frames")
    parser.add_argument("--chunk", type=int, default=8, help="frames per batched peer call when streaming")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--peer-settings", type=parse_settings, default=None, help="THREADSxFILES,... (C: cores)")
    parser.add_argument("--skip", type=lambda s: s.split(","), default=[], help="peers not to run, e.g. spdl,decord2")
    parser.add_argument("--torchcodec-python", default=None, help="interpreter of a venv where torchcodec imports")
    parser.add_argument("--ours-baseline", type=Path, default=None, help="another checkout: vstream@baseline")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a reader may take over one case")
    parser.add_argument(
        "--quick", action="store_true", help="1 clip x 24 frames, 4 samples, 1 repeat, one peer setting"
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # a reader process (internal)
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve()
        return 0
    if args.probe is not None:
        probe(args.probe)
        return 0
    if args.quick:
        args.clips, args.frames, args.samples, args.repeats = 1, 24, 4, 1
        args.bframes_gop = min(args.bframes_gop, args.frames)
    if args.peer_settings is None:
        args.peer_settings = parse_settings("0x1" if args.quick else "0x1,1xC")
    load_start = os.getloadavg()
    encodes = prepare(args)
    cases = plan_cases(args, encodes)
    found, missing = readers(args)
    for name, reason in missing.items():
        print(f"  {name}: not measured ({reason})", flush=True)
    with tempfile.TemporaryDirectory(prefix="vstream_stride_") as work:
        measured = measure(args, encodes, cases, found, Path(work))
    table = tabulate(measured["results"], cases)
    goal_rows = goals(table, args.keyframe_stride)
    width, height = args.size
    sizes = ", ".join(
        f"{ENCODE_LABELS[n]} {e['bytes'] / 1e6:.2f} MB ({e['bytes'] / encodes['ippp']['bytes']:.2f}x)"
        for n, e in encodes.items()
    )
    header = (
        f"{args.clips} clips x {len(encodes['ippp']['cameras'])} cameras x {args.frames} frames at {width}x{height}, "
        f"GOP {args.gop} (x264 B-frames: GOP {args.bframes_gop}); random access: {args.samples} samples of "
        f"{args.ra_frames} frames {args.ra_spacing} apart; {args.repeats} repeats, median (min-max) of wall-time "
        f"frames/s; {_cores()} cores, load average {load_start[0]:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end.\nfiles: {sizes}.\nreaders: "
        + "; ".join(f"{r['name']} {r['version']}" for r in found)
        + "".join(f"; {n}: not measured ({why})" for n, why in missing.items())
    )
    failed = {label: e["failed"] for label, e in measured["results"].items() if e["failed"]}
    text = report(table, goal_rows, header, failed)
    print()
    print(text)
    result = {
        "schema": SCHEMA,
        "machine": {
            "cores": _cores(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_start": load_start,
            "load_average_after_repeats": measured["load_after_repeats"],
            "load_average_end": os.getloadavg(),
        },
        "data": {
            "clips": args.clips,
            "cameras": len(encodes["ippp"]["cameras"]),
            "frames": args.frames,
            "size": [width, height],
            "encodes": {n: {"settings": s, "bytes": encodes[n]["bytes"]} for n, s in encode_settings(args).items()},
            "random_access": {"samples": args.samples, "frames": args.ra_frames, "spacing": args.ra_spacing},
        },
        "repeats": args.repeats,
        "chunk": args.chunk,
        "readers": {r["name"]: {"version": r["version"], "python": r["python"]} for r in found},
        "not_measured": missing,
        "failed": failed,
        "frames_checked": {label: e.get("frames_checked") for label, e in measured["results"].items()},
        "cases": table,
        "goals": goal_rows,
        "table": text,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    ours_failed = [label for label, e in measured["results"].items() if e["reader"] in (OURS, BASELINE) and e["failed"]]
    return 1 if ours_failed else 0


if __name__ == "__main__":
    sys.exit(main())
