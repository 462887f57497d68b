"""The GPU first run: every GPU figure the project needs, in one budgeted call on a lent GPU.

Sections, in order of importance, each in a process of its own (a CUDA fault or an abort inside
PyNvVideoCodec ends that process and loses only its section), the JSON rewritten after each, so a
call cut short still brings back what finished:

1. ``environment``: Python, torch and its CUDA, Triton, PyNvVideoCodec, the driver, the GPU, and
   NVDEC's engines and size limits per codec and bit depth (the one-time probe, in a child).
2. ``data``: stamped files made on the machine (outside the working tree): the file kinds
   ``vstream doctor`` compares (HEVC and H.264, with and without B-frames, 10-bit HEVC), six
   cameras of 1600x900 HEVC (GOP 30, no B-frames) with their index, and one of those cameras
   encoded again in the stride layout (``vstream encode --keyframe-stride 6``: every 6th frame a
   reference picture, the frames between non-reference B-frames; GOP 12).
3. ``kernel``: the NV12 -> RGB kernel compiled and checked against the torch conversion on the
   GPU (:func:`~lightning_vstream.decode.nvdec.nv12.prepare_conversion`), the compile time, and both
   conversions' host and GPU time per 1600x900 frame.
4. ``stamps``: every file kind decoded on NVDEC against PyAV, read in order and shuffled: every
   stamp exact (the right frame under the right index) and the colour within ``docs/gpu.md``'s
   tolerance; the packets NVDEC was fed and those passed over (non-reference pictures before a
   frame read).
5. ``stride``: NVDEC fed only the packets the frames read need. The stride-layout file and the
   camera it was encoded from read at a stride of 6 and of 1 (``NvDecoder``, the frames announced
   with ``expect``), and GOP-planned random access on the stride-layout file (frames 6 apart):
   packets fed and passed over, frames decoded per frame delivered, every stamp (NVDEC decoding a
   stream with pictures left out), frames/s, and stride 6 on the stride layout over stride 6 on
   the usual layout.
6. ``raw_nvdec``: PyNvVideoCodec alone (packets in memory, NV12 out) with 1, 7, 14 and 28
   decoders on threads of their own; the GPU memory one decoder takes, against the estimate the
   memory check uses.
7. ``engine``: the stream engine (no Lightning) on the six cameras, with a light consumer and a
   Python-heavy one (2 ms of GIL-holding Python per step): camera-frames/s, host CPU time per
   frame, device memory (``cudaMemGetInfo``), ratio to raw NVDEC, frames decoded and packets
   passed over.
8. ``slow_consumer``: the engine with a consumer that takes 20 ms per step: every stamp of every
   batch, and of the batch held before it.
9. ``random_access``: GOP-planned batches of random windows (samples/s, frames/s, stamps, frames
   decoded and packets passed over).

Then a summary against the goals (every stamp exact, colour within tolerance, stream >= 1,795
camera-frames/s, engine / raw NVDEC >= 0.8, random access >= 600 frames/s, stride 6 on the stride
layout >= 2.5x stride 6 on the usual layout) and the NVDEC work the stride layout saves. Each section has a
cap and gets at most what is left of ``--budget``; one that does not fit is skipped, saying so.

Under the test driver (``VSTREAM_NVDEC_HOST_MEMORY=1``, the fake NVIDIA driver CI runs the real
PyNvVideoCodec over) the same code runs end to end on small data; frames hold the driver's pattern
and no GPU work is timed, so pixel and timing results say "not checked".

Example::

    python3 benchmarks/gpu_first_run.py --budget 480 --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

SCHEMA = "lightning_vstream.bench.gpu_first_run/1"
NOT_CHECKED = "not checked: the test driver decodes no pixels and times no GPU work"
#: (section, cap in seconds on a GPU, seconds it needs at least), in order of importance.
SECTIONS = (
    ("environment", 60, 10),
    ("data", 150, 20),
    ("kernel", 60, 10),
    ("stamps", 90, 15),
    ("stride", 60, 10),
    ("raw_nvdec", 75, 15),
    ("engine", 100, 20),
    ("slow_consumer", 50, 10),
    ("random_access", 60, 10),
)
GOALS = {
    "stream_camera_frames_per_s": 1795.0,
    "engine_over_raw": 0.8,
    "random_access_frames_per_s": 600.0,
    "stride6_over_ippp": 2.5,
}
#: Set to a section's name to make its process abort (how the suite's own test shows that one section's crash
#: loses only that section).
ABORT_ENV = "VSTREAM_FIRST_RUN_ABORT"
_CAMERAS = 6
#: The keyframe stride of the stride-layout file, and the stride it is read at.
_STRIDE = 6


# -- the parent: sections in processes of their own ------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for every section together")
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_first_run.json and the logs")
    parser.add_argument("--data-dir", type=Path, default=None, help="where the data is made (a temp folder)")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--only", default="", help="comma-separated sections to run (all when empty)")
    parser.add_argument("--section", default="", help=argparse.SUPPRESS)  # a child's one section
    parser.add_argument("--mode", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = [name for name, _, _ in SECTIONS]
    args.only = [s for s in args.only.split(",") if s]
    unknown = [s for s in args.only if s not in names]
    if unknown:
        parser.error(f"--only names unknown sections {unknown}; choose from {names}")
    if args.budget <= 0:
        parser.error("--budget must be positive")
    return args


def _write(path: Path, report: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def run_suite(args: argparse.Namespace) -> dict[str, Any]:
    """Run every section in its own process within the budget; the report (also written after each section)."""
    started = time.monotonic()
    out: Path = args.out
    (out / "sections").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    data = args.data_dir or Path(tempfile.mkdtemp(prefix="vstream-first-run-"))
    mode = "test-driver" if os.environ.get("VSTREAM_NVDEC_HOST_MEMORY", "") not in ("", "0") else "gpu"
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "mode": mode,
        "budget_s": args.budget,
        "data_dir": str(data),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "sections": {},
    }
    path = out / "gpu_first_run.json"
    _write(path, report)
    failed_before: str | None = None
    for name, cap, least in SECTIONS:
        if args.only and name not in args.only:
            continue
        left = args.budget - (time.monotonic() - started)
        if failed_before is not None:
            result = {"status": "skipped", "reason": failed_before}
        elif left < least:
            result = {"status": "skipped", "reason": f"budget: {left:.0f} s left, the section needs {least} s"}
        else:
            result = _run_section(args, name, mode, data, timeout=min(float(cap), left))
        report["sections"][name] = result
        if name in ("environment", "data") and result["status"] not in ("ok", "limited"):
            failed_before = f"section {name!r} did not succeed ({result['status']})"
        report["elapsed_s"] = round(time.monotonic() - started, 1)
        _write(path, report)
        print(f"[{report['elapsed_s']:6.1f} s] {name:14} {result['status']}: {_headline(name, result)}", flush=True)
    report["summary"] = summarize(report)
    report["elapsed_s"] = round(time.monotonic() - started, 1)
    _write(path, report)
    print_summary(report)
    return report


def _run_section(args: argparse.Namespace, name: str, mode: str, data: Path, *, timeout: float) -> dict[str, Any]:
    """One section in a child process; its result, or why it has none (crashed, timed out)."""
    result_path = args.out / "sections" / f"{name}.json"
    result_path.unlink(missing_ok=True)
    log = args.out / "logs" / f"{name}.log"
    command = [sys.executable, str(Path(__file__).resolve()), "--section", name, "--mode", mode, "--out", str(args.out)]
    command += ["--data-dir", str(data), "--gpu", str(args.gpu)]
    begun = time.monotonic()
    with open(log, "w") as output:
        try:
            code = subprocess.run(
                command, stdout=output, stderr=subprocess.STDOUT, timeout=timeout, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            code = None
    seconds = round(time.monotonic() - begun, 1)
    if result_path.exists():
        result = json.loads(result_path.read_text())
    elif code is None:
        result = {"status": "timed out", "reason": f"no result within {timeout:.0f} s"}
    else:
        result = {"status": "crashed", "reason": f"the section's process ended with exit code {code} and no result"}
    if "status" not in result or (code not in (0, None) and result.get("status") == "ok"):
        result["status"] = "failed"
    if result["status"] in ("crashed", "timed out", "failed"):
        result["log_tail"] = log.read_text(errors="replace")[-3000:]
    result["seconds"] = seconds
    return result


def _headline(name: str, result: dict[str, Any]) -> str:
    if result["status"] not in ("ok", "limited"):
        return str(result.get("reason") or result.get("error") or "")[:160]
    keys = {
        "environment": ("gpu", "driver", "pynvvideocodec", "torch", "triton"),
        "data": ("files",),
        "kernel": ("backend", "compile_s"),
        "stamps": ("stamps", "colour"),
        "stride": ("stride6_decoded_per_delivered", "stride6_packets_skipped", "stride6_over_ippp", "stamps"),
        "raw_nvdec": ("best_frames_per_s",),
        "engine": ("light_camera_frames_per_s", "heavy_camera_frames_per_s", "over_raw"),
        "slow_consumer": ("stamps", "steps"),
        "random_access": ("frames_per_s", "stamps"),
    }[name]
    return ", ".join(f"{k}={'not checked' if result.get(k) == NOT_CHECKED else result.get(k)}" for k in keys)


def _goal(measured: Any, goal: float, timed: bool) -> dict[str, Any]:
    if not timed or not isinstance(measured, (int, float)):
        return {"goal": goal, "measured": measured, "met": NOT_CHECKED if not timed else False}
    return {"goal": goal, "measured": measured, "met": measured >= goal}


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """The figures against the goals, from the sections that ran."""
    sections = report["sections"]
    timed = report["mode"] == "gpu"
    stamps = sections.get("stamps", {})
    stride = sections.get("stride", {})
    engine = sections.get("engine", {})
    slow = sections.get("slow_consumer", {})
    access = sections.get("random_access", {})
    checked = {
        "stamps": stamps.get("stamps"),
        "stride": stride.get("stamps"),
        "slow_consumer": slow.get("stamps"),
        "random_access": access.get("stamps"),
    }
    summary: dict[str, Any] = {
        "every_stamp_exact": NOT_CHECKED if not timed else all(v == "exact" for v in checked.values()),
        "stamps_by_section": checked,
        "colour_within_tolerance": NOT_CHECKED if not timed else stamps.get("colour") == "within tolerance",
        "stream_camera_frames_per_s": _goal(
            engine.get("light_camera_frames_per_s"), GOALS["stream_camera_frames_per_s"], timed
        ),
        "engine_over_raw": _goal(engine.get("over_raw"), GOALS["engine_over_raw"], timed),
        "random_access_frames_per_s": _goal(access.get("frames_per_s"), GOALS["random_access_frames_per_s"], timed),
        "stride6_over_ippp": _goal(stride.get("stride6_over_ippp"), GOALS["stride6_over_ippp"], timed),
        "nvdec_work_saved": {
            "stride_layout_at_stride_6": stride.get("stride6_nvdec_work_saved"),
            "stride_layout_random_access": stride.get("random_access", {}).get("nvdec_work_saved"),
        },
        "sections": {name: result["status"] for name, result in sections.items()},
    }
    return summary


def print_summary(report: dict[str, Any]) -> None:
    summary = report["summary"]
    print(f"gpu_first_run ({report['mode']}, {report['elapsed_s']} s of {report['budget_s']:.0f} s):")
    for key, value in summary.items():
        if key != "sections":
            shown = json.dumps(value, default=str).replace(json.dumps(NOT_CHECKED), '"not checked"')
            print(f"  {key:28} {shown}")
    print(f"  sections: {summary['sections']}")


# -- helpers the sections share ----------------------------------------------------------------------------
def _host(mode: str) -> bool:
    return mode == "test-driver"


def _synchronize(gpu: int, host: bool) -> None:
    if not host:
        import torch

        torch.cuda.synchronize(gpu)


def _stamp(frame: Any) -> tuple[int, int, int] | None:
    """The synthetic stamp of a ``[3, H, W]`` frame (on any device), read from its corner only; None if unreadable."""
    from lightning_vstream.demos import synth

    height, width = int(frame.shape[-2]), int(frame.shape[-1])
    side = synth._COLS * synth._cell(width, height)  # the square holding the stamp, read with the frame's cells
    try:
        stamp = synth.read_stamp(frame[:, :side, :side].cpu())
    except ValueError:
        return None
    return stamp.clip, stamp.camera, stamp.frame


def _engine_index(data: Path) -> Path:
    return data / "engine" / "index.json"


#: The frame size of the suite's files: 1600x900 on a GPU; under the test driver, which decodes no pixels,
#: a small size with the same shape of problem (a coded height that NVDEC pads and the library crops) keeps
#: the CPU's cost of making and checking the files small.
GPU_SIZE = (1600, 900)
TEST_DRIVER_SIZE = (320, 180)


def _size(host: bool) -> tuple[int, int]:
    return TEST_DRIVER_SIZE if host else GPU_SIZE


def _fake_format(depth: int, reorder: int) -> None:
    """Under the test driver: announce a file's size, bit depth and reorder depth (a real parser reads them)."""
    width, height = TEST_DRIVER_SIZE
    coded = -(-height // 16) * 16
    os.environ.update(FAKE_W=str(width), FAKE_H=str(height), FAKE_CODED_W=str(width), FAKE_CODED_H=str(coded))
    os.environ["FAKE_DEPTH"] = str(depth)
    os.environ["FAKE_REORDER"] = str(reorder)


def _probe_size(host: bool) -> None:
    """Under the test driver: the size the NVDEC probe's 256x256 frame is announced at (set back by :func:`_fake_format`)."""
    if host:
        for name in ("FAKE_W", "FAKE_H", "FAKE_CODED_W", "FAKE_CODED_H"):
            os.environ[name] = "256"


def _python_work(seconds: float) -> None:
    """Pure-Python work that holds the GIL for ``seconds`` (a Python-heavy training step)."""
    end = time.perf_counter() + seconds
    count = 0
    while time.perf_counter() < end:
        for _ in range(100):
            count += 1


# -- the sections -----------------------------------------------------------------------------------------
def section_environment(args: argparse.Namespace, host: bool) -> dict[str, Any]:
    import torch

    from lightning_vstream.decode.device import import_pynvvideocodec
    from lightning_vstream.decode.nvdec.probe_child import driver_version
    from lightning_vstream.decode.nvdec.session import probe_nvdec
    from lightning_vstream.doctor import _nvdec

    result: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cpus": os.cpu_count(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    try:
        import triton

        result["triton"] = triton.__version__
    except Exception as err:
        result["triton"] = f"missing ({type(err).__name__})"
    import av

    result["av"] = av.__version__
    result["pynvvideocodec"] = str(getattr(import_pynvvideocodec(), "__version__", "unknown"))
    result["driver"] = driver_version()
    if host:
        result["gpu"] = "none: the test driver (device memory is host memory)"
    else:
        if not torch.cuda.is_available():
            return {**result, "status": "failed", "error": "torch sees no CUDA GPU"}
        props = torch.cuda.get_device_properties(args.gpu)
        result.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1))
        result["compute_capability"] = f"{props.major}.{props.minor}"
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            )
            result["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
        except (OSError, subprocess.TimeoutExpired) as err:
            result["nvidia_smi"] = f"unavailable ({type(err).__name__})"
    _probe_size(host)
    probe = probe_nvdec(args.gpu)
    result["nvdec"] = _nvdec(probe)
    result["probe_pixels"] = probe.get("pixels")
    result["status"] = "limited" if host else "ok"
    return result


def section_data(args: argparse.Namespace, host: bool) -> dict[str, Any]:
    from concurrent.futures import ProcessPoolExecutor

    from lightning_vstream.demos.synth import write_dataset
    from lightning_vstream.doctor import _comparison_files

    data: Path = args.data_dir
    size = _size(host)
    frames = 6 if host else 24
    engine_frames = 12 if host else 120  # room for a random-access window of 4 frames, 3 apart
    jobs = max(1, min(12, os.cpu_count() or 1))
    began = time.monotonic()
    with ProcessPoolExecutor(max_workers=2) as pool:  # the comparison files beside the dataset's own jobs
        compare = pool.submit(_comparison_files, data / "compare", size, frames)
        index = write_dataset(
            data / "engine",
            clips=2,
            cameras=_CAMERAS,
            frames=engine_frames,
            size=size,
            codec="hevc",
            gop=30,
            preset="ultrafast",
            jobs=max(1, jobs - 1),
            replace=True,
        )
        files = compare.result()
    listing = [{k: str(v) for k, v in entry.items()} for entry in files]
    (data / "compare.json").write_text(json.dumps(listing))
    stride = _stride_layout_file(index, data / "stride")
    (data / "stride.json").write_text(json.dumps(stride))
    return {
        "status": "ok",
        "files": len(files) + 2 * _CAMERAS + 1,
        "size": "{}x{}".format(*size),
        "compare_frames": frames,
        "engine": f"2 clips x {_CAMERAS} cameras x {engine_frames} frames, HEVC, GOP 30, no B-frames",
        "stride_layout": f"camera {stride['camera']!r} of clip {stride['clip_id']!r} again, HEVC, GOP 12, "
        f"keyframe stride {_STRIDE}",
        "index": str(index),
        "seconds_to_make": round(time.monotonic() - began, 1),
    }


def _stride_layout_file(index_path: Path, root: Path) -> dict[str, Any]:
    """The first camera of the engine data's first clip encoded again in the stride layout (its stamps kept)."""
    from lightning_vstream.demos.synth import clip_number
    from lightning_vstream.encode.settings import CameraSource, EncodeSettings
    from lightning_vstream.encode.writer import encode_file, plan_file
    from lightning_vstream.indexing import load_index

    clip = load_index(index_path).clips[0]
    camera = clip.cameras[0]
    source = Path(camera.path)
    path = root / f"{camera.name}.mp4"
    # superfast: x265's ultrafast looks ahead 5 frames, fewer than the 5 B-frames in a row the layout needs.
    settings = EncodeSettings(codec="hevc", gop=2 * _STRIDE, keyframe_stride=_STRIDE, preset="superfast")
    encode_file(plan_file(CameraSource(clip.clip_id, camera.name, source), path), settings)
    return {
        "path": str(path),
        "source": str(source),
        "clip_id": clip.clip_id,
        "clip": clip_number(clip.clip_id),
        "camera": camera.name,
    }


def section_kernel(args: argparse.Namespace, host: bool) -> dict[str, Any]:
    import torch

    from lightning_vstream.decode.nvdec import nv12

    result: dict[str, Any] = {"triton_available": nv12.triton_available()}
    if host:
        # No CUDA device: the kernel is compiled to a cubin for sm_90 (Triton's compiler needs no GPU).
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        from lightning_vstream.decode.nvdec.nv12_kernel import BLOCK, PARAMETERS, nv12_to_rgb_kernel

        began = time.monotonic()
        for sixteen, sample in ((False, "*u8"), (True, "*i16")):
            types = {"src": sample, "dst": "*u8", **dict.fromkeys(PARAMETERS[2:8], "i32")}
            signature = {**types, **dict.fromkeys(PARAMETERS[8:], "fp32"), "SIXTEEN": "constexpr", "BLOCK": "constexpr"}
            constants = {"SIXTEEN": sixteen, "BLOCK": BLOCK}
            try:
                source = ASTSource(fn=nv12_to_rgb_kernel, signature=signature, constexprs=constants)
            except TypeError:
                source = ASTSource(fn=nv12_to_rgb_kernel, signature=signature, constants=constants)  # type: ignore[call-arg]
            triton.compile(source, target=GPUTarget("cuda", 90, 32))
        result.update(
            status="limited",
            backend=NOT_CHECKED,
            compile_s=round(time.monotonic() - began, 2),
            compiled=f"NV12 and P016 to sm_90 cubins with Triton {triton.__version__}, without a GPU",
        )
        return result
    device = torch.device("cuda", args.gpu)
    torch.cuda.set_device(device)
    began = time.monotonic()
    backend = nv12.prepare_conversion(device)  # compiles both variants and compares them with torch
    result.update(backend=backend, compile_s=round(time.monotonic() - began, 2))
    height, width = 900, 1600
    generator = torch.Generator().manual_seed(1)
    surface = torch.randint(0, 256, (height * 3 // 2, width), generator=generator).to(torch.uint8).to(device)
    out = torch.empty((3, height, width), dtype=torch.uint8, device=device)
    for name in ("triton", "torch") if backend == "triton" else ("torch",):
        convert = nv12.Nv12Converter(nv12.ColorSpec("bt709"), height, width, device=device, backend=name)  # type: ignore[arg-type]
        for _ in range(10):
            convert(surface, out)
        torch.cuda.synchronize(device)
        count = 500
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        c0 = time.process_time()
        start.record()
        for _ in range(count):
            convert(surface, out)
        stop.record()
        host_us = (time.process_time() - c0) / count * 1e6
        torch.cuda.synchronize(device)
        result[name] = {
            "host_us_per_frame": round(host_us, 2),
            "gpu_us_per_frame": round(start.elapsed_time(stop) / count * 1e3, 2),
        }
    reference = torch.empty_like(out)
    nv12.torch_nv12_to_rgb(surface, nv12.coefficients(nv12.ColorSpec("bt709")), reference, chw=True)
    nv12.Nv12Converter(nv12.ColorSpec("bt709"), height, width, device=device, backend=backend)(surface, out)
    result["max_diff_to_torch_1600x900"] = int((out.int() - reference.int()).abs().max())
    result["status"] = "ok" if result["max_diff_to_torch_1600x900"] <= nv12.CHECK_TOLERANCE else "failed"
    return result


def section_stamps(args: argparse.Namespace, host: bool) -> dict[str, Any]:
    import torch

    from lightning_vstream.decode.cpu.probe import probe_video
    from lightning_vstream.decode.cpu.pyav import PyAVDecoder
    from lightning_vstream.decode.nvdec.decoder import NvDecoder
    from lightning_vstream.decode.nvdec.pool import DecoderPool
    from lightning_vstream.doctor import COLOUR_TOLERANCE

    rows = []
    for entry in json.loads((args.data_dir / "compare.json").read_text()):
        path, clip, depth = Path(entry["path"]), int(entry["clip"]), int(entry["depth"])
        info = probe_video(path)
        if host:
            _fake_format(depth, info.reorder_depth or 0)
        row: dict[str, Any] = {"file": entry["name"], "frames": info.frame_count, "reorder_depth": info.reorder_depth}
        order = list(range(info.frame_count))
        shuffled = random.Random(clip).sample(order, len(order))
        for how, indices in (("in_order", order), ("shuffled", shuffled)):
            wrong: list[int] = []
            worst = 0.0
            with (
                NvDecoder(path, info=info, device=args.gpu, pool=DecoderPool()) as nv,
                PyAVDecoder(path, info=info) as cpu,
            ):
                for i in indices:
                    frame = nv.read() if how == "in_order" else nv.get(i)
                    if host:
                        continue  # the frame holds the test driver's pattern
                    reference = (cpu.read() if how == "in_order" else cpu.get(i)).to(frame.device)
                    if _stamp(frame) != (clip, 0, i):
                        wrong.append(i)
                    worst = max(worst, float((frame.int() - reference.int()).abs().float().mean()))
                row["latency"] = nv.key.latency if nv.key is not None else None
                row[f"{how}_seeks"] = nv.seeks
                packets = {"packets_fed": nv.packets_fed, "packets_skipped": nv.packets_skipped}
            if host:
                row[how] = {"stamps": NOT_CHECKED, "order": "every frame under its own timestamp", **packets}
            else:
                tolerance = COLOUR_TOLERANCE[depth]
                row[how] = {
                    "stamps": "exact" if not wrong else f"wrong at frames {wrong[:10]}",
                    "colour_mean_abs_diff_worst": round(worst, 3),
                    "tolerance": tolerance,
                    "colour_ok": worst <= tolerance,
                    **packets,
                }
        rows.append(row)
    if host:
        return {"status": "limited", "stamps": NOT_CHECKED, "colour": NOT_CHECKED, "files": rows}
    exact = all(r[h]["stamps"] == "exact" for r in rows for h in ("in_order", "shuffled"))
    colour = all(r[h]["colour_ok"] for r in rows for h in ("in_order", "shuffled"))
    torch.cuda.synchronize(args.gpu)
    return {
        "status": "ok" if exact and colour else "failed",
        "stamps": "exact" if exact else "wrong",
        "colour": "within tolerance" if colour else "outside tolerance",
        "files": rows,
    }


def section_stride(args: argparse.Namespace, host: bool) -> dict[str, Any]:
    from lightning_vstream.decode.cpu.probe import probe_video
    from lightning_vstream.decode.nvdec.pool import DecoderPool

    entry = json.loads((args.data_dir / "stride.json").read_text())
    clip = int(entry["clip"])
    pool = DecoderPool()
    result: dict[str, Any] = {
        "file": f"camera {entry['camera']!r} of clip {entry['clip_id']!r}",
        "keyframe_stride": _STRIDE,
        "settings": "NvDecoder, frames announced with expect(), one decoder per pass from a kept pool",
    }
    wrong: list[str] = []
    infos: dict[str, Any] = {}
    for layout, key in (("stride_layout", "path"), ("usual_layout", "source")):
        path = Path(entry[key])
        info = infos[layout] = probe_video(path)
        if host:
            _fake_format(8, info.reorder_depth or 0)
        for step in (_STRIDE, 1):
            row = _read_at_stride(args, host, path, info, step, clip, pool)
            wrong += [f"{layout}, stride {step}, frame {i}" for i in row.pop("wrong")]
            result[f"{layout}_stride_{step}"] = row
    ours, usual = result[f"stride_layout_stride_{_STRIDE}"], result[f"usual_layout_stride_{_STRIDE}"]
    result["stride6_decoded_per_delivered"] = ours["decoded_per_delivered"]
    result["stride6_packets_skipped"] = ours["packets_skipped"]
    result["stride6_nvdec_work_saved"] = ours["nvdec_work_saved"]
    result["stride6_over_ippp"] = NOT_CHECKED if host else round(ours["frames_per_s"] / usual["frames_per_s"], 2)
    if host:
        _fake_format(8, infos["stride_layout"].reorder_depth or 0)
    access = _stride_random_access(args, host, Path(entry["path"]), infos["stride_layout"], clip)
    wrong += access.pop("wrong")
    result["random_access"] = access
    if host:
        return {**result, "status": "limited", "stamps": NOT_CHECKED}
    return {**result, "status": "ok" if not wrong else "failed", "stamps": "exact" if not wrong else wrong[:10]}


def _work_saved(fed: int, skipped: int) -> float:
    """The share of the packets on the way that NVDEC was never fed."""
    return round(skipped / (fed + skipped), 3) if fed + skipped else 0.0


def _read_at_stride(
    args: argparse.Namespace, host: bool, path: Path, info: Any, step: int, clip: int, pool: Any
) -> dict[str, Any]:
    """Frames 0, ``step``, 2 ``step``, ... of one file on NVDEC: stamps (first pass), packets, frames/s."""
    from lightning_vstream.decode.nvdec.decoder import NvDecoder

    wanted = range(0, info.frame_count, step)
    wrong: list[int] = []
    seconds: list[float] = []
    repeats = 1 if host else 3
    for repeat in range(repeats + 1):  # the first pass checks the stamps and fills the pool; the others are timed
        with NvDecoder(path, info=info, device=args.gpu, pool=pool) as nv:
            nv.expect(wanted)
            _synchronize(args.gpu, host)
            began = time.perf_counter()
            for i in wanted:
                frame = nv.get(i)
                if repeat == 0 and not host and _stamp(frame) != (clip, 0, i):
                    wrong.append(i)
            _synchronize(args.gpu, host)
            if repeat:
                seconds.append(time.perf_counter() - began)
            fed, skipped, decoded, seeks = nv.packets_fed, nv.packets_skipped, nv.frames_decoded, nv.seeks
    median = sorted(seconds)[len(seconds) // 2]
    return {
        "frames_delivered": len(wanted),
        "frames_decoded": decoded,
        "decoded_per_delivered": round(decoded / len(wanted), 3),
        "packets_fed": fed,
        "packets_skipped": skipped,
        "nvdec_work_saved": _work_saved(fed, skipped),
        "seeks": seeks,
        "frames_per_s": NOT_CHECKED if host else round(len(wanted) / median, 1),
        "spread_s": NOT_CHECKED if host else [round(min(seconds), 4), round(max(seconds), 4)],
        "wrong": wrong,
    }


def _stride_random_access(args: argparse.Namespace, host: bool, path: Path, info: Any, clip: int) -> dict[str, Any]:
    """GOP-planned batches of windows of frames ``_STRIDE`` apart, from random places of one stride-layout file."""
    from lightning_vstream.clips.gpu_reader import BatchReader, PlannedSample, make_reader

    count = min(4, (info.frame_count - 1) // _STRIDE + 1)  # frames per window
    span = (count - 1) * _STRIDE
    rng = random.Random(0)
    starts = [rng.randrange(info.frame_count - span) for _ in range(16 if host else 128)]
    planned = [
        PlannedSample(f"w{n}", ("CAM",), (path,), (info,), (f"window {n}",), tuple(range(s, s + span + 1, _STRIDE)))
        for n, s in enumerate(starts)
    ]
    if host:
        reader = BatchReader(gpu=args.gpu, device="cpu", threads=2)
    else:
        reader = make_reader(f"cuda:{args.gpu}", None, 2, formats=[(path, info)])
    per_batch = 8
    wrong: list[str] = []
    delivered = 0
    try:
        reader.read(planned[:per_batch])  # warm: decoders created
        delivered += per_batch * count
        _synchronize(args.gpu, host)
        began = time.perf_counter()
        for start in range(per_batch, len(planned), per_batch):
            asked = planned[start : start + per_batch]
            for plan, sample in zip(asked, reader.read(asked)):
                delivered += count
                if not host:
                    wrong += [
                        f"random access, frame {i}"
                        for t, i in enumerate(plan.indices)
                        if _stamp(sample[t, 0]) != (clip, 0, i)
                    ]
        _synchronize(args.gpu, host)
        elapsed = time.perf_counter() - began
        decoded, skipped = reader.executor.frames_decoded, reader.packets_skipped
    finally:
        reader.close()
    timed = delivered - per_batch * count
    return {
        "window": f"{count} frames {_STRIDE} apart from a random frame, {len(planned)} windows, {per_batch} a batch",
        "frames_delivered": delivered,
        "frames_decoded": decoded,  # every packet fed comes out of NVDEC once: the packets fed
        "decoded_per_delivered": round(decoded / delivered, 3),
        "packets_skipped": skipped,
        "nvdec_work_saved": _work_saved(decoded, skipped),
        "frames_per_s": NOT_CHECKED if host else round(timed / elapsed, 1) if timed else None,
        "wrong": wrong,
    }


def section_raw_nvdec(args: argparse.Namespace, host: bool) -> dict[str, Any]:
    from lightning_vstream.decode.device import frame_memory, import_pynvvideocodec
    from lightning_vstream.decode.nvdec.memory import nvdec_bytes
    from lightning_vstream.decode.nvdec.session import DecoderKey, create_session
    from lightning_vstream.decode.nvdec.sources import PacketSource
    from lightning_vstream.indexing import load_index

    nvc = import_pynvvideocodec()
    memory = frame_memory()
    memory.set_device(args.gpu)
    index = load_index(_engine_index(args.data_dir))
    demuxed = []
    for clip in index.clips:
        for camera in clip.cameras:
            source = PacketSource(camera.path, camera.info)  # type: ignore[arg-type]
            demuxed.append([(p, p.pts) for p in source.packets()])  # PyAV packets own their bytes
            source.close()
    first = index.clips[0].cameras[0].info
    assert first is not None
    key = DecoderKey(args.gpu, "hevc", first.width, first.height)
    duration = 0.3 if host else 3.0
    rows: dict[str, Any] = {}
    for count in (1, 7, 14, 28):
        free_before = memory.mem_get_info(args.gpu)[0]
        sessions = [create_session(nvc, key, memory) for _ in range(count)]
        counts = [0] * count
        deadline = time.perf_counter() + duration
        threads = [
            threading.Thread(
                target=_decode_until,
                args=(
                    nvc,
                    memory,
                    args.gpu,
                    sessions[i].decoder,
                    demuxed[i % len(demuxed) :: count],
                    deadline,
                    counts,
                    i,
                ),
            )
            for i in range(count)
        ]
        begun = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        _synchronize(args.gpu, host)
        elapsed = time.perf_counter() - begun
        used = free_before - memory.mem_get_info(args.gpu)[0]
        rows[str(count)] = {
            "decoders": count,
            "frames": sum(counts),
            "frames_per_s": NOT_CHECKED if host else round(sum(counts) / elapsed, 1),
            "gpu_memory_per_decoder_mib": NOT_CHECKED if host else round(used / count / 2**20, 1),
        }
        sessions.clear()
    best = None if host else max(r["frames_per_s"] for r in rows.values())
    return {
        "status": "limited" if host else "ok",
        "rows": rows,
        "best_frames_per_s": NOT_CHECKED if host else best,
        "estimate_per_decoder_mib": round(nvdec_bytes("hevc", first.width, first.height, 8) / 2**20, 1),
        "settings": "PyNvVideoCodec alone, packets in memory, NV12 out, NATIVE latency, one thread and stream each",
    }


def _decode_until(
    nvc: Any, memory: Any, gpu: int, decoder: Any, files: list[Any], deadline: float, counts: list[int], slot: int
) -> None:
    """Decode ``files`` (packets in memory) with ``decoder``, whole files, until ``deadline``; frames into ``counts``."""
    memory.set_device(gpu)
    done = 0
    while done == 0 or time.perf_counter() < deadline:
        for packets in files:
            for packet, pts in packets:
                data = nvc.PacketData()
                data.bsl_data, data.bsl, data.pts = packet.buffer_ptr, packet.buffer_size, pts
                counts[slot] += len(decoder.Decode(data))
            counts[slot] += len(decoder.Decode(nvc.PacketData()))
            done += 1
            if time.perf_counter() >= deadline:
                return


def _engine_run(
    args: argparse.Namespace, host: bool, loader: Any, *, python_step: float, seconds: float
) -> dict[str, Any]:
    """Epochs of ``loader`` for about ``seconds`` (a first one to warm it); camera-frames/s and host CPU per frame."""

    def epoch() -> int:
        frames = 0
        for batch in loader:
            frames += int(batch["valid"].sum()) * _CAMERAS
            if python_step:
                _python_work(python_step)
        return frames

    began = time.perf_counter()
    first = epoch()
    _synchronize(args.gpu, host)
    first_s = time.perf_counter() - began
    frames, epochs = 0, 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while epochs == 0 or time.perf_counter() - wall0 < seconds:
        loader.sampler.set_epoch(epochs + 1)
        frames += epoch()
        epochs += 1
    _synchronize(args.gpu, host)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return {
        "epochs": epochs,
        "camera_frames": frames,
        "camera_frames_per_s": NOT_CHECKED if host else round(frames / wall, 1),
        "host_cpu_us_per_frame": NOT_CHECKED if host else round(cpu / frames * 1e6, 1),
        "first_epoch_camera_frames_per_s": NOT_CHECKED if host else round(first / first_s, 1),
        "python_ms_per_step": python_step * 1e3,
    }


def section_engine(args: argparse.Namespace, host: bool) -> dict[str, Any]:
    from lightning_vstream.decode.device import frame_memory
    from lightning_vstream.indexing import load_index
    from lightning_vstream.options import GpuOptions
    from lightning_vstream.stream.engine_loader import build_engine_loader
    from lightning_vstream.stream.sampler import StreamSampler

    if host:
        _fake_format(8, 0)
    memory = frame_memory()
    index = load_index(_engine_index(args.data_dir))
    free0, total = memory.mem_get_info(args.gpu)
    result: dict[str, Any] = {"cameras": _CAMERAS, "batch_size": 2}
    seconds = 0.0 if host else 6.0
    for name, python_step in (("light", 0.0), ("heavy", 0.002)):
        sampler = StreamSampler([c.frame_count for c in index.clips], num_cameras=_CAMERAS, batch_size=2, seed=0)
        if name == "light":
            _probe_size(host)
        loader = build_engine_loader(index, sampler, f"cuda:{args.gpu}", gpu=GpuOptions(probe=name == "light"))
        if host:
            _fake_format(8, 0)
        run = _engine_run(args, host, loader, python_step=python_step, seconds=seconds)
        stats = loader.stats
        run["frames_decoded"] = stats.frames_decoded
        run["packets_skipped"] = int(getattr(stats, "packets_skipped", 0))
        free = memory.mem_get_info(args.gpu)[0]
        run["threads"] = loader.executor.num_threads
        run["gpu_memory_used_gib"] = NOT_CHECKED if host else round((free0 - free) / 2**30, 2)
        loader.engine.close()
        result[name] = run
        result[f"{name}_camera_frames_per_s"] = run["camera_frames_per_s"]
    result["gpu_memory_total_gib"] = NOT_CHECKED if host else round(total / 2**30, 1)
    raw = _read_section(args, "raw_nvdec")
    if host or raw is None:
        result["over_raw"] = NOT_CHECKED if host else "raw_nvdec did not run"
    else:
        result["over_raw"] = round(result["light_camera_frames_per_s"] / raw["best_frames_per_s"], 3)
    result["status"] = "limited" if host else "ok"
    return result


def _read_section(args: argparse.Namespace, name: str) -> dict[str, Any] | None:
    path = args.out / "sections" / f"{name}.json"
    if not path.exists():
        return None
    found = json.loads(path.read_text())
    return found if found.get("status") == "ok" else None


def section_slow_consumer(args: argparse.Namespace, host: bool) -> dict[str, Any]:
    from lightning_vstream.demos.synth import clip_number
    from lightning_vstream.indexing import load_index
    from lightning_vstream.options import GpuOptions
    from lightning_vstream.stream.engine_loader import build_engine_loader
    from lightning_vstream.stream.sampler import StreamSampler

    if host:
        _fake_format(8, 0)
    index = load_index(_engine_index(args.data_dir))
    sampler = StreamSampler([c.frame_count for c in index.clips], num_cameras=_CAMERAS, batch_size=2, seed=1)
    loader = build_engine_loader(index, sampler, f"cuda:{args.gpu}", gpu=GpuOptions(probe=False))

    def wrong(batch: Any) -> list[str]:
        bad = []
        for slot in range(batch["frames"].shape[0]):
            if not batch["valid"][slot]:
                continue
            clip, frame = clip_number(batch["clip_id"][slot]), int(batch["frame_index"][slot])
            for camera in range(_CAMERAS):
                if _stamp(batch["frames"][slot, camera]) != (clip, camera, frame):
                    bad.append(f"step {batch['step']} slot {slot} camera {camera}")
        return bad

    steps, errors = 0, []
    previous = None
    for batch in loader:
        time.sleep(0.02)  # the training step
        steps += 1
        if host:
            continue
        errors += wrong(batch)
        if previous is not None:
            errors += [f"held {e}" for e in wrong(previous)]
        previous = batch
    loader.engine.close()
    if host:
        return {"status": "limited", "steps": steps, "stamps": NOT_CHECKED}
    return {
        "status": "ok" if not errors else "failed",
        "steps": steps,
        "stamps": "exact" if not errors else errors[:10],
    }


def section_random_access(args: argparse.Namespace, host: bool) -> dict[str, Any]:
    from lightning_vstream.clips.gpu_reader import BatchReader, PlannedSample, make_reader
    from lightning_vstream.clips.windows import FrameWindow, random_clips
    from lightning_vstream.decode.nvdec.memory import one_file_per_format
    from lightning_vstream.demos.synth import clip_number
    from lightning_vstream.indexing import load_index

    if host:
        _fake_format(8, 0)
    index = load_index(_engine_index(args.data_dir))
    by_id = {clip.clip_id: clip for clip in index.clips}
    window = FrameWindow(4, stride=3)
    requests = random_clips(index, window, count=256 if not host else 16, seed=0)
    planned = []
    for request in requests:
        clip = by_id[request.clip_id]
        planned.append(
            PlannedSample(
                clip_id=clip.clip_id,
                camera_names=tuple(c.name for c in clip.cameras),
                paths=tuple(Path(c.path) for c in clip.cameras),
                infos=tuple(c.info for c in clip.cameras),  # type: ignore[misc]
                labels=tuple(f"clip {clip.clip_id!r}, camera {c.name!r}" for c in clip.cameras),
                indices=tuple(request.frames),
            )
        )
    if host:  # the test driver's frames are host memory: a reader of CPU batches
        reader = BatchReader(gpu=args.gpu, device="cpu", threads=4)
    else:
        reader = make_reader(f"cuda:{args.gpu}", None, 8, formats=one_file_per_format(index))
    per_batch = 8
    errors: list[str] = []
    samples = frames = 0
    try:
        reader.read(planned[:per_batch])  # warm: decoders created
        _synchronize(args.gpu, host)
        began = time.perf_counter()
        for start in range(per_batch, len(planned), per_batch):
            asked = planned[start : start + per_batch]
            batch = reader.read(asked)
            samples += len(batch)
            for plan, sample in zip(asked, batch):
                frames += sample.shape[0] * sample.shape[1]
                if host:
                    continue
                number = clip_number(plan.clip_id)
                for t, index_ in enumerate(plan.indices):
                    for camera in range(sample.shape[1]):
                        if _stamp(sample[t, camera]) != (number, camera, index_):
                            errors.append(f"clip {number} camera {camera} frame {index_}")
        _synchronize(args.gpu, host)
        elapsed = time.perf_counter() - began
    finally:
        reader.close()
    result: dict[str, Any] = {
        "samples": samples,
        "frames": frames,
        "window": "4 frames, stride 3, 6 cameras",
        "threads": reader.executor.workers,
        "frames_decoded": reader.executor.frames_decoded,  # the warm batch's included
        "packets_skipped": reader.packets_skipped,
        "samples_per_s": NOT_CHECKED if host else round(samples / elapsed, 1),
        "frames_per_s": NOT_CHECKED if host else round(frames / elapsed, 1),
    }
    if host:
        return {**result, "status": "limited", "stamps": NOT_CHECKED}
    return {**result, "status": "ok" if not errors else "failed", "stamps": "exact" if not errors else errors[:10]}


_RUN = {
    "environment": section_environment,
    "data": section_data,
    "kernel": section_kernel,
    "stamps": section_stamps,
    "stride": section_stride,
    "raw_nvdec": section_raw_nvdec,
    "engine": section_engine,
    "slow_consumer": section_slow_consumer,
    "random_access": section_random_access,
}


def run_section(args: argparse.Namespace) -> int:
    """In a child: run one section and write its result."""
    if os.environ.get(ABORT_ENV) == args.section:
        os.abort()  # as a CUDA fault inside the library ends a process
    host = _host(args.mode)
    try:
        result = _RUN[args.section](args, host)
    except Exception as err:
        import traceback

        traceback.print_exc()
        result = {"status": "failed", "error": f"{type(err).__name__}: {err}"}
    _write(args.out / "sections" / f"{args.section}.json", result)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.section:
        return run_section(args)
    report = run_suite(args)
    return 0 if all(r["status"] in ("ok", "limited") for r in report["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
