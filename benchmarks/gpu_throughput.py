"""GPU decoding throughput: the raw NVDEC ceiling against the stream loader as a Lightning input.

Measures, on nuScenes-like data (6 cameras, 1600x900 H.265, GOP 30, no B-frames, 12 fps):

(a) **raw NVDEC ceiling**: PyNvVideoCodec decoding alone: packets demuxed into memory beforehand,
    native NV12 output (no colour conversion, frames never touched), 1..N decoders on as many
    threads (``Decode`` releases the GIL), files spread round-robin;
(b) **stream loader**: frames/sec delivered by ``StreamVideoDataModule(decode_device="cuda")`` as
    the training input of a Lightning ``Trainer`` (or a bare loop with ``--mode loop``), one row per
    ``--loader-config`` (for example workers against main-process threads);
(c) **ratio** (b) / (a), best against best.

Every figure is the median of ``--repeats`` timed runs after warm-up, with min and max. A table goes
to stdout and everything to ``--output`` (JSON). Without CUDA or PyNvVideoCodec the script prints
why, writes ``{"status": "skipped", "reason": ...}`` and exits 0 without generating data.

Example::

    python benchmarks/gpu_throughput.py --data-dir /data/vstream_bench --output gpu_throughput.json
    python benchmarks/gpu_throughput.py --data-dir /data/vstream_bench \\
        --loader-config '{"num_workers": 0}' --loader-config '{"num_workers": 4}'
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

SCHEMA = "lightning_vstream.bench.gpu_throughput/1"
DEFAULT_LOADER_CONFIGS = ('{"num_workers": 0}', '{"num_workers": 2}', '{"num_workers": 4}')


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("vstream_gpu_bench"), help="dataset folder (reused)")
    parser.add_argument("--output", type=Path, default=Path("gpu_throughput.json"), help="JSON result file")
    parser.add_argument("--clips", type=int, default=8)
    parser.add_argument("--cameras", type=int, default=6)
    parser.add_argument("--frames", type=int, default=120, help="frames per clip (120 = 10 s at 12 fps)")
    parser.add_argument("--size", type=_size, default=(1600, 900), help="WIDTHxHEIGHT")
    parser.add_argument("--gop", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel encoders for the data")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--decoders", type=_int_list, default=[1, 2, 4, 6, 8, 12], help="parallel decoder counts")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument(
        "--loader-config", type=_json_object, action="append", default=None,
        help="JSON object of extra StreamVideoDataModule arguments; repeat for several rows "
        f"(default: {', '.join(DEFAULT_LOADER_CONFIGS)})",
    )
    parser.add_argument("--loader-batches", type=int, default=50, help="timed batches per loader run")
    parser.add_argument("--warmup-batches", type=int, default=5, help="untimed batches before each loader run")
    parser.add_argument("--mode", choices=("trainer", "loop"), default="trainer",
                        help="consume batches in a Lightning Trainer (default) or a bare loop")
    parser.add_argument("--skip-raw", action="store_true")
    parser.add_argument("--skip-loader", action="store_true")
    args = parser.parse_args(argv)
    if args.loader_config is None:
        args.loader_config = [json.loads(c) for c in DEFAULT_LOADER_CONFIGS]
    for name in ("clips", "cameras", "frames", "gop", "jobs", "repeats", "batch_size", "loader_batches", "warmup_batches"):
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
    from lightning_vstream.decode.gpu import import_pynvvideocodec

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
        except Exception:  # noqa: BLE001 - reported as missing
            env["pynvvideocodec"] = None
    return env


# -- data ------------------------------------------------------------------------------------------
def prepare_data(args: argparse.Namespace) -> Path:
    """Write the dataset into ``--data-dir`` unless an identical one is there; return the index path."""
    from lightning_vstream.demos.synth import write_dataset

    params = {
        "clips": args.clips, "cameras": args.cameras, "frames": args.frames, "size": list(args.size),
        "codec": "hevc", "gop": args.gop, "bframes": 0, "fps": 12.0,
    }
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
    print(f"writing {args.clips} clips x {args.cameras} cameras, {args.frames} frames of "
          f"{args.size[0]}x{args.size[1]} HEVC to {args.data_dir} ...", flush=True)
    started = time.perf_counter()
    index = write_dataset(
        args.data_dir, clips=args.clips, cameras=args.cameras, frames=args.frames, size=tuple(args.size),
        codec="hevc", gop=args.gop, bframes=0, fps=12.0, jobs=args.jobs,
    )
    marker.write_text(json.dumps(params, indent=2) + "\n")
    print(f"  done in {time.perf_counter() - started:.0f} s")
    return index


def video_files(index_path: Path) -> list[Path]:
    from lightning_vstream.index import load_index

    return [camera.path for clip in load_index(index_path) for camera in clip.cameras]


# -- (a) raw NVDEC ---------------------------------------------------------------------------------
def load_packets(nvc: Any, files: list[Path]) -> list[tuple[list[Any], list[Any], int]]:
    """Per file: prebuilt PacketData objects, the buffers they point into, and the frame count."""
    import numpy as np

    from lightning_vstream.decode.cpu import probe_video
    from lightning_vstream.decode.gpu import _PacketSource

    loaded = []
    for path in files:
        info = probe_video(path)
        source = _PacketSource(path, info.codec)
        try:
            buffers, packets = [], []
            for packet in source.packets():
                buffer = np.frombuffer(bytes(packet), dtype=np.uint8)
                data = nvc.PacketData()
                data.bsl_data = int(buffer.ctypes.data)
                data.bsl = int(buffer.size)
                data.pts = int(packet.pts if packet.pts is not None else 0)
                buffers.append(buffer)
                packets.append(data)
        finally:
            source.close()
        loaded.append((packets, buffers, info.frame_count))
    return loaded


def _create_raw_decoder(nvc: Any, gpu: int, codec: str, width: int, height: int) -> Any:
    from lightning_vstream.decode.gpu import _NVDEC_CODECS

    return nvc.CreateDecoder(
        gpuid=gpu, codec=getattr(nvc.cudaVideoCodec, _NVDEC_CODECS[codec]), cudacontext=0, cudastream=0,
        usedevicememory=True, maxwidth=width, maxheight=height, outputColorType=nvc.OutputColorType.NATIVE,
    )


def raw_decode_run(nvc: Any, decoders: list[Any], files: list[tuple[list[Any], list[Any], int]], gpu: int) -> tuple[int, float]:
    """Decode every file once with ``len(decoders)`` threads; return (frames, seconds)."""
    import torch

    count = len(decoders)
    shares = [files[i::count] for i in range(count)]
    frames = [0] * count
    errors: list[BaseException] = []
    barrier = threading.Barrier(count + 1)
    empty = nvc.PacketData()

    def work(slot: int) -> None:
        decoder = decoders[slot]
        barrier.wait()
        try:
            for packets, _, _ in shares[slot]:
                for packet in packets:
                    frames[slot] += len(decoder.Decode(packet))
                frames[slot] += len(decoder.Decode(empty))  # end of file: flush
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
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


def measure_raw(nvc: Any, index: Path, args: argparse.Namespace) -> dict[str, Any]:
    from lightning_vstream.decode.cpu import probe_video

    files = video_files(index)
    info = probe_video(files[0])
    print(f"(a) raw NVDEC: demuxing {len(files)} files into memory ...", flush=True)
    loaded = load_packets(nvc, files)
    expected = sum(f[2] for f in loaded)
    rows = []
    warm = [_create_raw_decoder(nvc, args.gpu, info.codec, info.width, info.height)]
    raw_decode_run(nvc, warm, loaded[:1], args.gpu)  # warm-up: driver, NVDEC clocks
    for count in args.decoders:
        decoders = [_create_raw_decoder(nvc, args.gpu, info.codec, info.width, info.height) for _ in range(count)]
        fps = []
        for _ in range(args.repeats):
            frames, seconds = raw_decode_run(nvc, decoders, loaded, args.gpu)
            if frames != expected:
                raise RuntimeError(f"raw NVDEC run with {count} decoders returned {frames} frames, expected {expected}")
            fps.append(frames / seconds)
        row = {"decoders": count, "frames_per_run": expected, "fps": summarize(fps)}
        rows.append(row)
        print(f"    {count:3d} decoders: {row['fps']['median']:9.1f} frames/s", flush=True)
        del decoders
    best = max(rows, key=lambda r: r["fps"]["median"])
    return {
        "files": len(files), "codec": info.codec, "width": info.width, "height": info.height,
        "output": "NATIVE (NV12), no colour conversion", "rows": rows, "best": best,
    }


# -- (b) stream loader -----------------------------------------------------------------------------
def _frames_in(batch: Any) -> int:
    frames = batch["frames"]
    return int(frames.shape[0] * frames.shape[1]) if frames.dim() == 5 else int(frames.shape[0])


def _loader_run_trainer(make_dm: Any, args: argparse.Namespace) -> tuple[int, float]:
    import lightning as L
    import torch

    class Sink(L.LightningModule):
        """Consumes each batch on the GPU, as a model's first layer would."""

        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(()))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return batch["frames"].float().mean() * self.weight

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    class Timer(L.Callback):
        def __init__(self) -> None:
            self.seen = 0
            self.frames = 0
            self.start = self.end = 0.0

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            torch.cuda.synchronize()
            self.seen += 1
            if self.seen == args.warmup_batches:
                self.start = time.perf_counter()
            elif self.seen > args.warmup_batches:
                self.frames += _frames_in(batch)
                self.end = time.perf_counter()

    timer = Timer()
    trainer = L.Trainer(
        accelerator="gpu", devices=[args.gpu], max_steps=args.warmup_batches + args.loader_batches,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, callbacks=[timer],
    )
    trainer.fit(Sink(), datamodule=make_dm())
    if timer.frames == 0:
        raise RuntimeError(
            f"the loader delivered only {timer.seen} batches; use more --clips/--frames or fewer --warmup-batches"
        )
    return timer.frames, timer.end - timer.start


def _loader_run_loop(make_dm: Any, args: argparse.Namespace) -> tuple[int, float]:
    import torch

    device = torch.device("cuda", args.gpu)
    dm = make_dm()
    dm.setup("fit")
    batches = iter(dm.train_dataloader())
    sink = torch.zeros((), device=device)
    for _ in range(args.warmup_batches):
        sink += next(batches)["frames"].to(device, non_blocking=True).float().mean()
    torch.cuda.synchronize(device)
    started = time.perf_counter()
    frames = 0
    for _ in range(args.loader_batches):
        batch = next(batches)
        sink += batch["frames"].to(device, non_blocking=True).float().mean()
        frames += _frames_in(batch)
    torch.cuda.synchronize(device)
    return frames, time.perf_counter() - started


def measure_loader(index: Path, config: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    try:
        from lightning_vstream.stream.datamodule import StreamVideoDataModule
    except Exception as err:  # noqa: BLE001 - reported, the raw figures still stand
        return {"config": config, "status": "unavailable",
                "reason": f"lightning_vstream.stream.datamodule.StreamVideoDataModule cannot be imported ({type(err).__name__}: {err})"}
    kwargs = {"index_file": str(index), "batch_size": args.batch_size, "num_workers": 0, "decode_device": "cuda", **config}
    try:
        StreamVideoDataModule(**kwargs)
    except TypeError as err:
        return {"config": config, "status": "unavailable", "reason": f"StreamVideoDataModule({kwargs}) failed: {err}"}
    except ValueError as err:
        return {"config": config, "status": "invalid", "reason": str(err)}
    run = _loader_run_trainer if args.mode == "trainer" else _loader_run_loop
    fps = []
    for _ in range(args.repeats):
        try:
            frames, seconds = run(lambda: StreamVideoDataModule(**kwargs), args)
        except Exception as err:  # noqa: BLE001 - one failing configuration must not lose the others
            return {"config": config, "status": "failed", "reason": f"{type(err).__name__}: {err}"}
        fps.append(frames / seconds)
    return {"config": config, "status": "ok", "datamodule_kwargs": kwargs, "mode": args.mode, "fps": summarize(fps)}


# -- report ----------------------------------------------------------------------------------------
def print_table(result: dict[str, Any]) -> None:
    raw = result.get("raw_nvdec")
    if raw:
        print(f"\n(a) raw NVDEC ceiling: {raw['files']} files of {raw['width']}x{raw['height']} {raw['codec']}, "
              f"{raw['output']}")
        print(f"    {'decoders':>8}  {'median fps':>11}  {'min':>9}  {'max':>9}")
        for row in raw["rows"]:
            f = row["fps"]
            print(f"    {row['decoders']:>8}  {f['median']:>11.1f}  {f['min']:>9.1f}  {f['max']:>9.1f}")
    loader = result.get("loader")
    if loader:
        print(f"\n(b) stream loader, decode_device='cuda', batch_size={result['batch_size']}, mode={result['mode']}")
        print(f"    {'config':<40}  {'median fps':>11}  {'min':>9}  {'max':>9}  {'/ raw best':>10}")
        for row in loader:
            name = json.dumps(row["config"])
            if row["status"] != "ok":
                print(f"    {name:<40}  {row['status']}: {row['reason']}")
                continue
            f = row["fps"]
            share = f"{row['ratio_to_raw_best']:.3f}" if row.get("ratio_to_raw_best") is not None else "-"
            print(f"    {name:<40}  {f['median']:>11.1f}  {f['min']:>9.1f}  {f['max']:>9.1f}  {share:>10}")
    if result.get("ratio") is not None:
        print(f"\n(c) loader / raw NVDEC ceiling = {result['ratio']:.3f}")


def _write(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
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
    from lightning_vstream.decode.gpu import import_pynvvideocodec

    nvc = import_pynvvideocodec()
    result.update(status="ok", environment=environment(args.gpu), batch_size=args.batch_size, mode=args.mode)
    index = prepare_data(args)
    result["data"] = {"index": str(index), "clips": args.clips, "cameras": args.cameras, "frames": args.frames,
                      "size": list(args.size), "codec": "hevc", "gop": args.gop, "bframes": 0, "fps": 12.0}
    if not args.skip_raw:
        result["raw_nvdec"] = measure_raw(nvc, index, args)
    if not args.skip_loader:
        rows = []
        for config in args.loader_config:
            print(f"(b) stream loader {json.dumps(config)} ...", flush=True)
            rows.append(measure_loader(index, config, args))
        result["loader"] = rows
    raw_best = result.get("raw_nvdec", {}).get("best", {}).get("fps", {}).get("median")
    measured = [r for r in result.get("loader", []) if r["status"] == "ok"]
    for row in measured:
        row["ratio_to_raw_best"] = row["fps"]["median"] / raw_best if raw_best else None
    if measured and raw_best:
        best = max(measured, key=lambda r: r["fps"]["median"])
        result["ratio"] = best["fps"]["median"] / raw_best
        result["ratio_detail"] = {"loader_config": best["config"], "raw_decoders": result["raw_nvdec"]["best"]["decoders"]}
    else:
        result["ratio"] = None
    print_table(result)
    _write(args.output, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
