"""GPU streaming throughput: our loader against the raw NVDEC ceiling and the seed design, in one run.

Data: nuScenes-like, 6 cameras, 1600x900 H.265, GOP 30, no B-frames, 12 fps, about 0.5 Mbit per
frame (``--crf`` sets the rate; the measured bits per frame are reported). Three measurements:

(a) **raw NVDEC ceiling**: PyNvVideoCodec alone, packets demuxed into memory beforehand, NV12 out
    (no colour conversion, frames never touched), each decoder on its own CUDA stream and thread
    (``Decode`` releases the GIL), for every count in ``--decoders`` (1..28) and both latency modes;
    the best row is the ceiling.
(b) **our loader**: ``StreamVideoDataModule(decode=DecodeOptions(device="cuda"))`` (the in-process stream engine)
    feeding a Lightning training step, one row per ``--loader-config``; the best row counts.
(c) **the seed design**: a map-style dataset decoding one multi-camera sample per item with
    PyNvVideoCodec (:class:`NvDecoder`) in 2 spawn DataLoader workers, frames handed to the training
    process over CUDA IPC, the same Lightning step consuming them.

Reported: (b), (b)/(a), (b)/(c), peak GPU memory and CPU use (process and children, in cores) of
each, against the goals (b) >= 4,000 camera-frames/s on one H100, (b)/(a) >= 0.9, (b)/(c) >= 1.6.
Every figure is the median of ``--repeats`` timed runs after warm-up, with min and max; a table
goes to stdout and everything to ``--output`` (JSON). Without CUDA or PyNvVideoCodec the script
says why, writes ``{"status": "skipped", "reason": ...}`` and exits 0 without generating data.

Example::

    python benchmarks/gpu_throughput.py --data-dir /data/vstream_bench --output $OUT/gpu_throughput.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

SCHEMA = "lightning_vstream.bench.gpu_throughput/2"
DEFAULT_LOADER_CONFIGS = (
    "{}",
    '{"engine": {"threads": 7}}',
    '{"engine": {"threads": 28}}',
    '{"engine": {"prefetch_factor": 4}}',
)
DEFAULT_DECODERS = "1,2,4,6,7,8,12,14,16,21,28"
GOALS = {"loader_fps": 4000.0, "loader_over_raw": 0.9, "loader_over_seed": 1.6}


# -- helpers ---------------------------------------------------------------------------------------
def summarize(values: list[float]) -> dict[str, Any]:
    """Median, min and max of repeated measurements, keeping the raw runs."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": list(values)}


def _size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text!r} must look like WIDTHxHEIGHT, for example 1600x900.") from None
    return width, height


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} must be a comma-separated list of integers.") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} must list positive integers.")
    return values


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"loader config {text!r} is not JSON: {err.msg}.") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"loader config {text!r} must be a JSON object of DataModule arguments.")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("vstream_gpu_bench"), help="dataset folder (reused)")
    parser.add_argument("--output", type=Path, default=Path("gpu_throughput.json"), help="JSON result file")
    parser.add_argument("--clips", type=int, default=8)
    parser.add_argument("--cameras", type=int, default=6)
    parser.add_argument("--frames", type=int, default=120, help="frames per clip (120 = 10 s at 12 fps)")
    parser.add_argument("--size", type=_size, default=(1600, 900), help="WIDTHxHEIGHT")
    parser.add_argument("--gop", type=int, default=30)
    parser.add_argument("--crf", type=int, default=18, help="x265 quality; 18 gives about 0.5 Mbit per frame")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel encoders for the data")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument(
        "--decoders",
        type=_int_list,
        default=_int_list(DEFAULT_DECODERS),
        help=f"parallel decoder counts for (a) (default {DEFAULT_DECODERS})",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument(
        "--loader-config",
        type=_json_object,
        action="append",
        default=None,
        help="JSON object of extra StreamVideoDataModule arguments; repeat for several rows "
        f"(default: {', '.join(DEFAULT_LOADER_CONFIGS)})",
    )
    parser.add_argument("--loader-batches", type=int, default=100, help="timed batches per loader run")
    parser.add_argument("--warmup-batches", type=int, default=10, help="untimed batches before each loader run")
    parser.add_argument("--seed-workers", type=int, default=2, help="spawn DataLoader workers of the seed design (c)")
    parser.add_argument("--skip-raw", action="store_true")
    parser.add_argument("--skip-loader", action="store_true")
    parser.add_argument("--skip-seed", action="store_true")
    args = parser.parse_args(argv)
    if args.loader_config is None:
        args.loader_config = [json.loads(c) for c in DEFAULT_LOADER_CONFIGS]
    for name in (
        "clips",
        "cameras",
        "frames",
        "gop",
        "jobs",
        "repeats",
        "batch_size",
        "loader_batches",
        "warmup_batches",
        "seed_workers",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def gpu_unavailable_reason(gpu: int) -> str | None:
    """Why this machine cannot run the benchmark, or None when it can."""
    import torch

    if not torch.cuda.is_available():
        return "no GPU: torch.cuda.is_available() is False (CUDA is required for this benchmark)"
    if gpu >= torch.cuda.device_count():
        return f"--gpu {gpu} does not exist: this process sees {torch.cuda.device_count()} CUDA device(s)"
    from lightning_vstream.decode.nvdec.decoder import import_pynvvideocodec

    try:
        import_pynvvideocodec()
    except ImportError as err:
        return f"CUDA is available but PyNvVideoCodec is not: {err}"
    return None


def environment(gpu: int | None) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cpu_count": os.cpu_count(),
    }
    if gpu is not None and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(gpu)
        try:
            import PyNvVideoCodec

            env["pynvvideocodec"] = getattr(PyNvVideoCodec, "__version__", "unknown")
            from lightning_vstream.decode.nvdec.session import decoder_caps

            env["nvdec_engines"] = decoder_caps(gpu, "hevc").engines
        except Exception as err:
            env["pynvvideocodec_error"] = repr(err)
    return env


class Usage:
    """Wall time, CPU time (this process and its finished children) and peak GPU memory of a block."""

    def __init__(self, gpu: int | None) -> None:
        self.gpu = gpu

    def __enter__(self) -> Usage:
        import torch

        if self.gpu is not None and torch.cuda.is_available():
            torch.cuda.synchronize(self.gpu)
            torch.cuda.reset_peak_memory_stats(self.gpu)
        self._wall = time.perf_counter()
        self._cpu = self._cpu_seconds()
        return self

    @staticmethod
    def _cpu_seconds() -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    def __exit__(self, *exc: object) -> None:
        import torch

        wall = time.perf_counter() - self._wall
        self.result = {"wall_s": wall, "cpu_cores": (self._cpu_seconds() - self._cpu) / wall if wall else 0.0}
        if self.gpu is not None and torch.cuda.is_available():
            self.result["gpu_peak_allocated_gib"] = torch.cuda.max_memory_allocated(self.gpu) / 2**30
            self.result["gpu_peak_reserved_gib"] = torch.cuda.max_memory_reserved(self.gpu) / 2**30


# -- data ------------------------------------------------------------------------------------------
def _write_one(job: dict[str, Any]) -> None:
    from lightning_vstream.demos.synth import write_stamped_video

    write_stamped_video(**job)


def data_params(args: argparse.Namespace) -> dict[str, Any]:
    """What the benchmark dataset is made of (6 cameras 1600x900 HEVC, no B-frames, by default)."""
    return {
        "clips": args.clips,
        "cameras": args.cameras,
        "frames": args.frames,
        "size": list(args.size),
        "codec": "hevc",
        "gop": args.gop,
        "bframes": 0,
        "fps": 12.0,
        "crf": args.crf,
    }


def prepare_data(args: argparse.Namespace) -> Path:
    """Write the dataset into ``--data-dir`` unless an identical one is there; return the index path."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from lightning_vstream.demos.synth import NUSCENES_CAMERAS, clip_name
    from lightning_vstream.indexing import build_index

    params = data_params(args)
    marker = args.data_dir / "bench_params.json"
    index = args.data_dir / "index.json"
    if marker.is_file() and index.is_file():
        existing = json.loads(marker.read_text())
        if existing != params:
            raise SystemExit(
                f"{str(args.data_dir)!r} holds a dataset written with {existing}, not {params}; "
                "pass another --data-dir or matching options."
            )
        print(f"reusing dataset in {args.data_dir}")
        return index
    names = (
        sorted(NUSCENES_CAMERAS[: args.cameras]) if args.cameras <= 6 else [f"CAM_{i:02d}" for i in range(args.cameras)]
    )
    jobs = [
        {
            "path": args.data_dir / "videos" / clip_name(c) / f"{name}.mp4",
            "clip": c,
            "camera": k,
            "frames": args.frames,
            "size": tuple(args.size),
            "codec": "hevc",
            "gop": args.gop,
            "bframes": 0,
            "fps": 12.0,
            "crf": args.crf,
        }
        for c in range(args.clips)
        for k, name in enumerate(names)
    ]
    print(
        f"writing {args.clips} clips x {args.cameras} cameras, {args.frames} frames of "
        f"{args.size[0]}x{args.size[1]} HEVC (crf {args.crf}) to {args.data_dir} ...",
        flush=True,
    )
    started = time.perf_counter()
    context = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(max_workers=min(args.jobs, len(jobs)), mp_context=context) as pool:
        list(pool.map(_write_one, jobs))
    build_index(args.data_dir, output=index, video_dirs=["videos"], progress=False)
    marker.write_text(json.dumps(params, indent=2) + "\n")
    print(f"  done in {time.perf_counter() - started:.0f} s")
    return index


def video_files(index_path: Path) -> list[Path]:
    from lightning_vstream.indexing import load_index

    return [camera.path for clip in load_index(index_path).clips for camera in clip.cameras]


def data_rate(files: list[Path], frames_per_file: list[int]) -> float:
    """Mean compressed size in Mbit per frame."""
    return sum(p.stat().st_size for p in files) * 8 / 1e6 / max(1, sum(frames_per_file))


# -- (a) raw NVDEC ---------------------------------------------------------------------------------
def load_packets(nvc: Any, files: list[Path]) -> list[tuple[list[Any], list[Any], int]]:
    """Per file: prebuilt PacketData objects, the buffers they point into, and the frame count."""
    import numpy as np

    from lightning_vstream.decode.cpu.probe import probe_video
    from lightning_vstream.decode.nvdec.sources import PacketSource

    loaded = []
    for path in files:
        info = probe_video(path)
        source = PacketSource(path, info)
        try:
            buffers, packets = [], []
            for packet in source.packets():
                buffer = np.frombuffer(bytes(packet), dtype=np.uint8)
                data = nvc.PacketData()
                data.bsl_data = int(buffer.ctypes.data)
                data.bsl = int(buffer.size)
                data.pts = int(packet.pts)
                buffers.append(buffer)
                packets.append(data)
        finally:
            source.close()
        loaded.append((packets, buffers, info.frame_count))
    return loaded


def _create_raw_decoder(nvc: Any, gpu: int, codec: str, width: int, height: int, latency: str) -> Any:
    from lightning_vstream.decode.device import frame_memory
    from lightning_vstream.decode.nvdec.session import DecoderKey, create_session

    # Each decoder on a CUDA stream of its own (the NULL stream would synchronise after every frame).
    return create_session(nvc, DecoderKey(gpu, codec, width, height, latency=latency), frame_memory())  # type: ignore[arg-type]


def raw_decode_run(
    nvc: Any, sessions: list[Any], files: list[tuple[list[Any], list[Any], int]], gpu: int, low_latency: bool = False
) -> tuple[int, float]:
    """Decode every file once with ``len(sessions)`` threads; return (frames, seconds)."""
    import torch

    count = len(sessions)
    shares = [files[i::count] for i in range(count)]
    frames = [0] * count
    errors: list[BaseException] = []
    barrier = threading.Barrier(count + 1)
    empty = nvc.PacketData()
    flag = getattr(getattr(nvc, "VideoPacketFlag", None), "ENDOFPICTURE", None)

    def work(slot: int) -> None:
        decoder = sessions[slot].decoder
        barrier.wait()
        try:
            for packets, _, _ in shares[slot]:
                for packet in packets:
                    if low_latency and flag is not None:
                        packet.decode_flag = flag
                    frames[slot] += len(decoder.Decode(packet))
                frames[slot] += len(decoder.Decode(empty))  # end of file: flush
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    if torch.cuda.is_available():  # always on a GPU run; tests drive this with a CPU stand-in
        torch.cuda.synchronize(gpu)
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"raw NVDEC decoding failed: {errors[0]!r}") from errors[0]
    return sum(frames), elapsed


def measure_raw(
    nvc: Any, index: Path, args: argparse.Namespace, latencies: tuple[str, ...] = ("NATIVE", "LOW")
) -> dict[str, Any]:
    from lightning_vstream.decode.cpu.probe import probe_video

    files = video_files(index)
    info = probe_video(files[0])
    print(f"(a) raw NVDEC: demuxing {len(files)} files into memory ...", flush=True)
    loaded = load_packets(nvc, files)
    expected = sum(f[2] for f in loaded)
    rows = []
    warm = [_create_raw_decoder(nvc, args.gpu, info.codec, info.width, info.height, "NATIVE")]
    raw_decode_run(nvc, warm, loaded[:1], args.gpu)  # warm-up: driver, NVDEC clocks
    for latency in latencies:
        for count in args.decoders:
            sessions = [
                _create_raw_decoder(nvc, args.gpu, info.codec, info.width, info.height, latency) for _ in range(count)
            ]
            fps = []
            with Usage(args.gpu) as usage:
                for _ in range(args.repeats):
                    frames, seconds = raw_decode_run(nvc, sessions, loaded, args.gpu, latency == "LOW")
                    if frames != expected:
                        raise RuntimeError(
                            f"raw NVDEC run with {count} decoders returned {frames} frames, expected {expected}"
                        )
                    fps.append(frames / seconds)
            row = {
                "latency": latency,
                "decoders": count,
                "frames_per_run": expected,
                "fps": summarize(fps),
                "usage": usage.result,
            }
            rows.append(row)
            print(f"    {latency:<6} {count:3d} decoders: {row['fps']['median']:9.1f} frames/s", flush=True)
            del sessions
    best = max(rows, key=lambda r: r["fps"]["median"])
    return {
        "files": len(files),
        "codec": info.codec,
        "width": info.width,
        "height": info.height,
        "mbit_per_frame": data_rate(files, [f[2] for f in loaded]),
        "output": "NATIVE (NV12), no colour conversion, one CUDA stream per decoder",
        "rows": rows,
        "best": best,
    }


# -- (b) and (c): a Lightning training step consuming batches ---------------------------------------
def _frames_in(batch: Any) -> int:
    frames = batch["frames"]
    return int(frames.shape[0] * frames.shape[1]) if frames.dim() == 5 else int(frames.shape[0])


def _fit(datamodule: Any, train_loader: Any, args: argparse.Namespace) -> tuple[int, float, dict[str, Any]]:
    """Train a one-parameter model on the batches; return (camera frames, seconds, usage) of the timed part."""
    import lightning as L
    import torch

    class Sink(L.LightningModule):
        """Reads every pixel of each batch on the GPU, as a model's first layer would."""

        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(()))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return batch["frames"].float().mean() * self.weight

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    class Timer(L.Callback):
        def __init__(self) -> None:
            self.seen = self.frames = 0
            self.usage: Usage | None = None

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            self.seen += 1
            if self.seen == args.warmup_batches:
                self.usage = Usage(args.gpu).__enter__()  # synchronises once, then times
            elif self.seen > args.warmup_batches:
                self.frames += _frames_in(batch)
                if self.seen == args.warmup_batches + args.loader_batches and self.usage is not None:
                    torch.cuda.synchronize(args.gpu)
                    self.usage.__exit__(None, None, None)

    timer = Timer()
    trainer = L.Trainer(
        accelerator="gpu",
        devices=[args.gpu],
        max_steps=args.warmup_batches + args.loader_batches,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[timer],
    )
    if datamodule is not None:
        trainer.fit(Sink(), datamodule=datamodule)
    else:
        trainer.fit(Sink(), train_dataloaders=train_loader)
    if timer.usage is None or not hasattr(timer.usage, "result"):
        raise RuntimeError(
            f"the loader delivered only {timer.seen} batches; use more --clips/--frames or fewer "
            "--warmup-batches / --loader-batches"
        )
    return timer.frames, timer.usage.result["wall_s"], timer.usage.result


def _loader_run_trainer(make_dm: Any, args: argparse.Namespace) -> tuple[int, float, dict[str, Any]]:
    return _fit(make_dm(), None, args)


def measure_loader(index: Path, config: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    try:
        from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule
    except Exception as err:
        return {
            "config": config,
            "status": "unavailable",
            "reason": f"lightning_vstream.stream.stream_datamodule.StreamVideoDataModule cannot be imported "
            f"({type(err).__name__}: {err})",
        }
    kwargs = {"index_file": str(index), "batch_size": args.batch_size, "decode": {"device": "cuda"}, **config}
    try:
        StreamVideoDataModule(**kwargs)
    except TypeError as err:
        return {"config": config, "status": "unavailable", "reason": f"StreamVideoDataModule({kwargs}) failed: {err}"}
    except ValueError as err:
        return {"config": config, "status": "invalid", "reason": str(err)}
    fps, usages = [], []
    for _ in range(args.repeats):
        try:
            result = _loader_run_trainer(lambda: StreamVideoDataModule(**kwargs), args)
        except Exception as err:
            return {"config": config, "status": "failed", "reason": f"{type(err).__name__}: {err}"}
        frames, seconds = result[0], result[1]
        usages.append(result[2] if len(result) > 2 else {})
        fps.append(frames / seconds)
    return {"config": config, "status": "ok", "datamodule_kwargs": kwargs, "fps": summarize(fps), "usage": usages}


class SeedDataset:
    """The seed design: item ``i`` is one multi-camera sample (every camera's frame ``t`` of a clip).

    Decoders are opened per worker and file and kept (map-style, sequential sampler); frames are
    decoded on the GPU in the worker and reach the training process over CUDA IPC.
    """

    def __init__(self, index_path: Path, gpu: int) -> None:
        from lightning_vstream.indexing import load_index

        self.index_path = index_path
        self.gpu = gpu
        index = load_index(index_path)
        self.items = [(c, t) for c, clip in enumerate(index.clips) for t in range(clip.frame_count)]
        self._index: Any = None
        self._decoders: dict[tuple[int, int], Any] = {}

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        import torch

        from lightning_vstream.decode.nvdec.decoder import NvDecoder
        from lightning_vstream.indexing import load_index

        if self._index is None:
            self._index = load_index(self.index_path)
        clip, frame = self.items[i]
        cams = self._index.clips[clip].cameras
        frames = []
        for k, camera in enumerate(cams):
            dec = self._decoders.get((clip, k))
            if dec is None:
                dec = self._decoders[(clip, k)] = NvDecoder(camera.path, info=camera.info, device=self.gpu)
            frames.append(dec.get(frame))
        return {"frames": torch.stack(frames)}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_decoders": {}, "_index": None}


def measure_seed(index: Path, args: argparse.Namespace) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    fps, usages = [], []
    for _ in range(args.repeats):
        loader = DataLoader(
            SeedDataset(index, args.gpu),
            batch_size=args.batch_size,
            shuffle=False,
            num_workers=args.seed_workers,
            multiprocessing_context="spawn",
            prefetch_factor=2,
        )
        try:
            frames, seconds, usage = _fit(None, loader, args)
        except Exception as err:
            return {"status": "failed", "reason": f"{type(err).__name__}: {err}"}
        fps.append(frames / seconds)
        usages.append(usage)
    return {
        "status": "ok",
        "workers": args.seed_workers,
        "fps": summarize(fps),
        "usage": usages,
        "design": "map-style dataset, NvDecoder per worker and file, spawn workers, CUDA IPC hand-off",
    }


# -- report ----------------------------------------------------------------------------------------
def summarize_ratios(result: dict[str, Any]) -> None:
    """Add (b), (b)/(a), (b)/(c) and the goals to ``result``."""
    raw_best = result.get("raw_nvdec", {}).get("best", {}).get("fps", {}).get("median")
    seed = result.get("seed_design", {})
    seed_fps = seed.get("fps", {}).get("median") if seed.get("status") == "ok" else None
    measured = [r for r in result.get("loader", []) if r["status"] == "ok"]
    for row in measured:
        row["ratio_to_raw_best"] = row["fps"]["median"] / raw_best if raw_best else None
    summary: dict[str, Any] = {"loader_fps": None, "loader_over_raw": None, "loader_over_seed": None}
    if measured:
        best = max(measured, key=lambda r: r["fps"]["median"])
        summary["loader_fps"] = best["fps"]["median"]
        summary["loader_config"] = best["config"]
        summary["loader_over_raw"] = best["fps"]["median"] / raw_best if raw_best else None
        summary["loader_over_seed"] = best["fps"]["median"] / seed_fps if seed_fps else None
    summary["goals"] = {k: {"goal": v, "met": summary[k] is not None and summary[k] >= v} for k, v in GOALS.items()}
    result["summary"] = summary


def _usage_text(usage: dict[str, Any] | list[dict[str, Any]] | None) -> str:
    if isinstance(usage, list):
        usage = usage[-1] if usage else None
    if not usage:
        return ""
    text = f"cpu {usage.get('cpu_cores', 0):.1f} cores"
    if "gpu_peak_reserved_gib" in usage:
        text += f", gpu {usage['gpu_peak_reserved_gib']:.2f} GiB"
    return text


def print_table(result: dict[str, Any]) -> None:
    raw = result.get("raw_nvdec")
    if raw:
        print(
            f"\n(a) raw NVDEC ceiling: {raw['files']} files of {raw['width']}x{raw['height']} {raw['codec']}, "
            f"{raw.get('mbit_per_frame', 0):.2f} Mbit/frame, {raw['output']}"
        )
        print(f"    {'latency':<7} {'decoders':>8}  {'median fps':>11}  {'min':>9}  {'max':>9}  usage")
        for row in raw["rows"]:
            f = row["fps"]
            print(
                f"    {row.get('latency', ''):<7} {row['decoders']:>8}  {f['median']:>11.1f}  {f['min']:>9.1f}  "
                f"{f['max']:>9.1f}  {_usage_text(row.get('usage'))}"
            )
    loader = result.get("loader")
    if loader:
        print(
            f"\n(b) our loader (StreamVideoDataModule, decode.device='cuda') in a Lightning step, "
            f"batch_size={result.get('batch_size')}"
        )
        print(f"    {'config':<34}  {'median fps':>11}  {'min':>9}  {'max':>9}  {'/ (a)':>6}  usage")
        for row in loader:
            name = json.dumps(row["config"])
            if row["status"] != "ok":
                print(f"    {name:<34}  {row['status']}: {row['reason']}")
                continue
            f = row["fps"]
            share = f"{row['ratio_to_raw_best']:.3f}" if row.get("ratio_to_raw_best") is not None else "-"
            print(
                f"    {name:<34}  {f['median']:>11.1f}  {f['min']:>9.1f}  {f['max']:>9.1f}  {share:>6}  "
                f"{_usage_text(row.get('usage'))}"
            )
    seed = result.get("seed_design")
    if seed:
        if seed["status"] == "ok":
            f = seed["fps"]
            print(
                f"\n(c) seed design ({seed['workers']} spawn workers): {f['median']:.1f} frames/s "
                f"(min {f['min']:.1f}, max {f['max']:.1f})  {_usage_text(seed.get('usage'))}"
            )
        else:
            print(f"\n(c) seed design: {seed['status']}: {seed['reason']}")
    summary = result.get("summary")
    if summary:
        print("\nsummary (goal: met?)")
        for key, label in (
            ("loader_fps", "(b) camera-frames/s"),
            ("loader_over_raw", "(b)/(a)"),
            ("loader_over_seed", "(b)/(c)"),
        ):
            value = summary.get(key)
            goal = summary["goals"][key]
            shown = "-" if value is None else f"{value:.3f}" if key != "loader_fps" else f"{value:.1f}"
            print(f"    {label:<22} {shown:>10}   goal >= {goal['goal']:g}: {'yes' if goal['met'] else 'no'}")


def _write(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result: dict[str, Any] = {"schema": SCHEMA, "argv": sys.argv[1:] if argv is None else list(argv)}
    reason = gpu_unavailable_reason(args.gpu)
    if reason is not None:
        result.update(status="skipped", reason=reason, environment=environment(None))
        print(f"gpu_throughput skipped: {reason}")
        _write(args.output, result)
        return 0
    from lightning_vstream.decode.nvdec.decoder import import_pynvvideocodec

    nvc = import_pynvvideocodec()
    result.update(status="ok", environment=environment(args.gpu), batch_size=args.batch_size)
    index = prepare_data(args)
    result["data"] = {"index": str(index), **data_params(args)}
    if not args.skip_raw:
        result["raw_nvdec"] = measure_raw(nvc, index, args)
    if not args.skip_loader:
        rows = []
        for config in args.loader_config:
            print(f"(b) our loader {json.dumps(config)} ...", flush=True)
            rows.append(measure_loader(index, config, args))
        result["loader"] = rows
    if not args.skip_seed:
        print(f"(c) seed design, {args.seed_workers} spawn workers ...", flush=True)
        result["seed_design"] = measure_seed(index, args)
    summarize_ratios(result)
    print_table(result)
    _write(args.output, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
