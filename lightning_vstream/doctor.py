"""``vstream doctor``: can this machine decode on the GPU, correctly, and how fast?

One command to run before training on a new machine, and whose JSON to attach to a bug report:

1. **Environment**: Python, torch and its CUDA, the GPU, the NVIDIA driver, PyNvVideoCodec.
2. **NVDEC**: engines and size limits per codec and bit depth (asked in a child process that sees
   only the chosen GPU, see :func:`~lightning_vstream.decode.nvdec.session.probe_nvdec`).
3. **Frames**: stamped synthetic files (HEVC and H.264, 8- and 10-bit, with and without B-frames)
   decoded on NVDEC and on the CPU, compared frame by frame: every stamp exact (the right frame
   under the right index) and colour within the tolerance ``docs/gpu.md`` gives (mean absolute
   difference at most :data:`COLOUR_TOLERANCE` levels).
4. **Throughput**, in one run on the same files: raw NVDEC (PyNvVideoCodec alone), the stream
   engine, and the worker design (``engine.kind="workers"``).

Without an NVIDIA GPU it says so in one line and exits 0. Under a test driver whose device memory
is host memory (``VSTREAM_NVDEC_HOST_MEMORY=1``, how the test suite runs it) it runs everything that
can run, and says plainly that pixels and timings cannot be checked there.

Example::

    $ vstream doctor --json doctor.json
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TextIO

from lightning_vstream import DecodeOptions, EngineOptions
from lightning_vstream.storage.atomic import write_atomic

__all__ = ["COLOUR_TOLERANCE", "SCHEMA", "run_doctor"]

SCHEMA = "lightning_vstream.doctor/1"
#: Largest mean absolute difference (levels of 255) between a GPU frame and the CPU decoder's, per bit depth.
COLOUR_TOLERANCE = {8: 1.0, 10: 1.5}
_NO_PIXELS = "not checked: a test driver decodes no pixels"


# -- is there a GPU at all -------------------------------------------------------------------------
def _gpu_missing(gpu: int) -> str | None:
    """Why the GPU path cannot run here, or None when it can (or a test driver stands in)."""
    from lightning_vstream.decode.device import frame_memory, import_pynvvideocodec

    try:
        import_pynvvideocodec()
    except ImportError as err:
        cause = err.__cause__ or err
        first = (str(cause).strip().splitlines() or [""])[0]
        return f"PyNvVideoCodec does not load: {type(cause).__name__}: {first[:160]}"
    if frame_memory().host:
        return None
    import torch

    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU (a CPU-only torch build, or CUDA_VISIBLE_DEVICES hides every GPU)"
    if gpu >= torch.cuda.device_count():
        return f"GPU {gpu} does not exist: torch sees {torch.cuda.device_count()} GPU(s)"
    return None


def _environment(gpu: int, host: bool) -> dict[str, Any]:
    import torch

    from lightning_vstream.decode.device import import_pynvvideocodec
    from lightning_vstream.decode.nvdec.probe_child import driver_version

    nvc = import_pynvvideocodec()
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "pynvvideocodec": str(getattr(nvc, "__version__", "unknown")),
        "cuda_driver_api": driver_version(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    if host:
        env["gpu"] = "none: a test driver whose device memory is host memory (VSTREAM_NVDEC_HOST_MEMORY=1)"
    else:
        props = torch.cuda.get_device_properties(gpu)
        env["gpu"] = props.name
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    try:
        from lightning_vstream.decode.nvdec.nv12 import triton_available

        env["triton"] = triton_available()
    except Exception:  # pragma: no cover - informational only
        env["triton"] = False
    return env


def _nvdec(report: dict[str, Any]) -> dict[str, Any]:
    codecs: dict[str, dict[str, Any]] = {}

    def order(item: tuple[str, Any]) -> tuple[str, int]:
        codec, depth = item[0].split("/")
        return codec, int(depth)

    for key, caps in sorted(dict(report.get("caps") or {}).items(), key=order):
        codec, depth = key.split("/")
        entry: dict[str, Any] = {"supported": bool(caps.get("supported", 0))}
        if entry["supported"]:
            entry.update(
                engines=int(caps.get("num_decoder_engines", 0)),
                min=f"{caps.get('width_min')}x{caps.get('height_min')}",
                max=f"{caps.get('width_max')}x{caps.get('height_max')}",
            )
        codecs.setdefault(codec, {})[f"{depth}-bit"] = entry
    engines = max((e.get("engines", 0) for c in codecs.values() for e in c.values()), default=0)
    return {"engines": engines, "codecs": codecs, "probe_decode": report.get("decode"), "pixels": report.get("pixels")}


# -- stamped data ------------------------------------------------------------------------------------
def _ten_bit_file(path: Path, size: tuple[int, int], frames: int) -> Path:
    """Stamped HEVC 10-bit (yuv420p10le) with B-frames; synth writes 8-bit only."""
    import av
    import numpy as np

    from lightning_vstream.demos.synth import Stamp, draw_stamp

    width, height = size
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx265", rate=12)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p10le"
        stream.options = {
            "preset": "ultrafast",
            "x265-params": "keyint=8:min-keyint=8:scenecut=0:bframes=2:log-level=error",
        }
        ramp = np.linspace(40, 200, width, dtype=np.float32)
        for i in range(frames):
            image = np.empty((height, width, 3), dtype=np.uint8)
            image[:] = np.stack([np.roll(ramp, i), ramp[::-1], np.full(width, 90, np.float32)], -1).astype(np.uint8)
            draw_stamp(image, Stamp(9, 0, i))
            frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p10le")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def _comparison_files(root: Path, size: tuple[int, int], frames: int) -> list[dict[str, Any]]:
    from lightning_vstream.demos.synth import write_stamped_video

    kinds: list[tuple[str, Literal["h264", "hevc"], int]] = [
        ("hevc 8-bit", "hevc", 0),
        ("hevc 8-bit, B-frames (open GOP)", "hevc", 2),
        ("h264 8-bit", "h264", 0),
        ("h264 8-bit, B-frames", "h264", 3),
    ]
    files = []
    for n, (name, codec, bframes) in enumerate(kinds):
        path = write_stamped_video(
            root / f"compare_{n}.mp4",
            clip=n,
            camera=0,
            frames=frames,
            size=size,
            codec=codec,
            bframes=bframes,
            gop=8,
            preset="ultrafast",
        )
        files.append({"name": name, "path": path, "clip": n, "depth": 8})
    files.append(
        {
            "name": "hevc 10-bit, B-frames",
            "path": _ten_bit_file(root / "compare_10bit.mp4", size, frames),
            "clip": 9,
            "depth": 10,
        }
    )
    return files


def _compare(entry: dict[str, Any], gpu: int, host: bool) -> dict[str, Any]:
    """Decode one file on NVDEC and on the CPU; compare stamps and colour frame by frame."""
    from lightning_vstream.decode.cpu.probe import probe_video
    from lightning_vstream.decode.cpu.pyav import PyAVDecoder
    from lightning_vstream.decode.nvdec.decoder import NvDecoder
    from lightning_vstream.decode.nvdec.pool import DecoderPool
    from lightning_vstream.demos.synth import read_stamp

    path: Path = entry["path"]
    info = probe_video(path)
    result: dict[str, Any] = {"file": entry["name"], "frames": info.frame_count, "reorder_depth": info.reorder_depth}
    wrong_stamps: list[int] = []
    worst = 0.0
    try:
        with NvDecoder(path, info=info, device=gpu, pool=DecoderPool()) as nv, PyAVDecoder(path, info=info) as cpu:
            for i in range(info.frame_count):
                frame = nv.read().cpu()
                if host:
                    continue  # the frame holds the test driver's pattern, not the picture
                reference = cpu.read()
                try:
                    stamp = read_stamp(frame)
                    if (stamp.clip, stamp.frame) != (entry["clip"], i):
                        wrong_stamps.append(i)
                except ValueError:
                    wrong_stamps.append(i)
                worst = max(worst, float((frame.int() - reference.int()).abs().float().mean()))
            result["latency"] = nv.key.latency if nv.key is not None else None
    except Exception as err:  # a diagnostic reports every failure and goes on
        result.update(status="failed", error=f"{type(err).__name__}: {err}")
        return result
    result["order"] = "every frame delivered under its own timestamp, in order"
    if host:
        result.update(status="limited", stamps=_NO_PIXELS, colour=_NO_PIXELS)
        return result
    tolerance = COLOUR_TOLERANCE[entry["depth"]]
    result["stamps"] = "exact" if not wrong_stamps else f"wrong at frames {wrong_stamps[:10]}"
    result["colour_mean_abs_diff_worst_frame"] = round(worst, 3)
    result["colour_tolerance"] = tolerance
    result["status"] = "ok" if not wrong_stamps and worst <= tolerance else "failed"
    return result


# -- throughput ---------------------------------------------------------------------------------------
def _timing_data(root: Path, size: tuple[int, int], frames: int) -> Path:
    from lightning_vstream.demos.synth import write_dataset

    return write_dataset(
        root / "timing", clips=2, cameras=6, frames=frames, size=size, codec="hevc", gop=12, preset="ultrafast"
    )


def _synchronize(gpu: int, host: bool) -> None:
    if not host:
        import torch

        torch.cuda.synchronize(gpu)


def _raw_nvdec(index_path: Path, gpu: int, host: bool, decoders: int) -> dict[str, Any]:
    """PyNvVideoCodec alone: packets in memory, NV12 out, ``decoders`` threads each with its decoder and stream."""
    from lightning_vstream.decode.device import frame_memory, import_pynvvideocodec
    from lightning_vstream.decode.nvdec.session import DecoderKey, create_session
    from lightning_vstream.decode.nvdec.sources import PacketSource
    from lightning_vstream.indexing import load_index

    nvc = import_pynvvideocodec()
    index = load_index(index_path)
    files = [camera for clip in index.clips for camera in clip.cameras]
    demuxed = []
    for camera in files:
        source = PacketSource(camera.path, camera.info)  # type: ignore[arg-type]
        demuxed.append([(p, p.pts) for p in source.packets()])
        source.close()
    first = files[0].info
    assert first is not None
    key = DecoderKey(gpu, "hevc", first.width, first.height)
    memory = frame_memory()
    sessions = [create_session(nvc, key, memory) for _ in range(decoders)]
    counts = [0] * decoders

    def work(slot: int) -> None:
        memory.set_device(gpu)  # every thread that touches the GPU sets its device first
        decoder = sessions[slot].decoder
        for packets in demuxed[slot::decoders]:
            for packet, pts in packets:
                data = nvc.PacketData()
                data.bsl_data, data.bsl, data.pts = packet.buffer_ptr, packet.buffer_size, pts
                counts[slot] += len(decoder.Decode(data))
            counts[slot] += len(decoder.Decode(nvc.PacketData()))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(decoders)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    _synchronize(gpu, host)
    elapsed = time.perf_counter() - start
    return {"decoders": decoders, "frames": sum(counts), "frames_per_s": round(sum(counts) / elapsed, 1)}


def _engine(index_path: Path, gpu: int) -> dict[str, Any]:
    from lightning_vstream.indexing import load_index
    from lightning_vstream.options import GpuOptions
    from lightning_vstream.stream.engine_loader import build_engine_loader
    from lightning_vstream.stream.sampler import StreamSampler

    index = load_index(index_path)
    sampler = StreamSampler([c.frame_count for c in index.clips], num_cameras=len(index.camera_names), batch_size=2)
    loader = build_engine_loader(index, sampler, f"cuda:{gpu}", gpu=GpuOptions(probe=False))
    frames = 0
    start = time.perf_counter()
    for batch in loader:
        frames += int(batch["valid"].sum()) * len(batch["camera_names"])
    _synchronize(gpu, loader.executor.device.torch_device.type == "cpu")
    elapsed = time.perf_counter() - start
    return {"threads": loader.executor.num_threads, "frames": frames, "frames_per_s": round(frames / elapsed, 1)}


def _workers(index_path: Path, gpu: int, batches: int = 12) -> dict[str, Any]:
    from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule

    dm = StreamVideoDataModule(
        index_file=index_path,
        batch_size=2,
        decode=DecodeOptions(device="cuda"),
        engine=EngineOptions(kind="workers", num_workers=2),
        seed=0,
    )
    dm.setup("fit")
    frames = 0
    start = time.perf_counter()
    for n, batch in enumerate(dm.train_dataloader()):
        frames += int(batch["valid"].shape[0]) * len(batch["camera_names"])
        if n + 1 >= batches:
            break
    _synchronize(gpu, False)
    elapsed = time.perf_counter() - start
    dm.teardown("fit")
    return {"num_workers": 2, "frames": frames, "frames_per_s": round(frames / elapsed, 1)}


def _measure(name: str, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return {"status": "ok", **run()}
    except Exception as err:  # a diagnostic reports every failure and goes on
        return {"status": "failed", "error": f"{type(err).__name__}: {err}"}


# -- the report -----------------------------------------------------------------------------------------
def _print_report(result: dict[str, Any], out: TextIO) -> None:
    env = result["environment"]
    print(f"vstream doctor: {result['summary']}", file=out)
    if result["mode"] == "test-driver":
        print(
            "  MODE: a test driver stands in for the GPU (device memory is host memory): frames hold no picture and\n"
            "  timings are host-side only. Nothing below says anything about a real GPU.",
            file=out,
        )
    print(
        f"  GPU {result['gpu']}: {env['gpu']} | CUDA driver API {env['cuda_driver_api']} | "
        f"PyNvVideoCodec {env['pynvvideocodec']} | torch {env['torch']} | Triton {'yes' if env['triton'] else 'no'}",
        file=out,
    )
    nvdec = result["nvdec"]
    supported = [
        f"{codec} ({', '.join(d for d, e in depths.items() if e['supported'])})"
        for codec, depths in nvdec["codecs"].items()
        if any(e["supported"] for e in depths.values())
    ]
    print(f"  NVDEC: {nvdec['engines']} engines; decodes {', '.join(supported) or 'nothing'}", file=out)
    for row in result["frames"]:
        detail = row.get("error") or (
            f"stamps {row.get('stamps')}, colour mean diff {row.get('colour_mean_abs_diff_worst_frame')}"
            f" (<= {row.get('colour_tolerance')})"
            if row["status"] != "limited"
            else "order and timestamps ok; pixels not checked (test driver)"
        )
        print(f"  frames [{row['status']:7}] {row['file']}: {detail}", file=out)
    for name, row in result["throughput"].items():
        shown = f"{row['frames_per_s']} frames/s" if row["status"] == "ok" else row.get("error") or row.get("reason")
        print(f"  throughput {name:10} {shown}", file=out)
    if result.get("json"):
        print(f"  report written to {result['json']}", file=out)


def run_doctor(
    *,
    gpu: int = 0,
    json_path: Path | str | None = "vstream_doctor.json",
    size: tuple[int, int] = (960, 544),
    frames: int = 24,
    timing_frames: int = 48,
    out: TextIO | None = None,
) -> int:
    """Check the GPU path on this machine; print a short report and write the full one as JSON.

    Args:
        gpu: GPU ordinal to check.
        json_path: Where the JSON report goes (None: nowhere).
        size: ``(width, height)`` of the generated files.
        frames: Frames per file compared between NVDEC and the CPU.
        timing_frames: Frames per file of the throughput data (2 clips x 6 cameras).
        out: Where the report is printed (stdout when None).

    Returns:
        0 when every check passed, or when there is no GPU to check (said in one line); 1 when a
        check failed.

    Example::

        >>> run_doctor(json_path="doctor.json")  # doctest: +SKIP
        0
    """
    from lightning_vstream.decode.device import frame_memory

    out = out if out is not None else sys.stdout
    missing = _gpu_missing(gpu)
    if missing is not None:
        print(f"vstream doctor: no usable NVIDIA GPU here ({missing}); decode.device='cpu' is what works.", file=out)
        return 0
    from lightning_vstream.decode.nvdec.session import probe_nvdec

    host = frame_memory().host
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "gpu": gpu,
        "mode": "test-driver" if host else "gpu",
        "environment": _environment(gpu, host),
    }
    try:
        report = probe_nvdec(gpu, force=True)
    except Exception as err:
        result.update(status="failed", summary=f"decoding one frame on GPU {gpu} failed: {err}")
        report = {}
    result["nvdec"] = _nvdec(report)
    with tempfile.TemporaryDirectory(prefix="vstream-doctor-") as tmp:
        root = Path(tmp)
        files = _comparison_files(root, size, frames)
        result["frames"] = [_compare(entry, gpu, host) for entry in files]
        index_path = _timing_data(root, size, timing_frames)
        engines = max(1, int(result["nvdec"]["engines"]))
        throughput = {
            "raw_nvdec_1": _measure("raw", lambda: _raw_nvdec(index_path, gpu, host, 1)),
            f"raw_nvdec_{engines}": _measure("raw", lambda: _raw_nvdec(index_path, gpu, host, engines)),
            "engine": _measure("engine", lambda: _engine(index_path, gpu)),
        }
        if host:
            throughput["workers"] = {
                "status": "skipped",
                "reason": "needs CUDA (spawned workers hand frames over CUDA IPC)",
            }
        else:
            throughput["workers"] = _measure("workers", lambda: _workers(index_path, gpu))
        result["throughput"] = throughput
    failed = [r["file"] for r in result["frames"] if r["status"] == "failed"]
    failed += [f"throughput {k}" for k, v in throughput.items() if v["status"] == "failed"]
    if result.get("status") == "failed":
        pass
    elif failed:
        result.update(status="failed", summary=f"problems: {', '.join(failed)} (details below and in the JSON)")
    elif host:
        result.update(
            status="limited",
            summary="ran over a test driver: calls, order and timestamps checked; pixels and GPU timings cannot be",
        )
    else:
        result.update(status="ok", summary=f"GPU {gpu} decodes every test file exactly; the GPU path can be used")
    if json_path is not None:
        json_path = Path(json_path)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(json_path, json.dumps(result, indent=2, default=str) + "\n")
        result["json"] = str(json_path)
    _print_report(result, out)
    return 1 if result["status"] == "failed" else 0
