"""The one way a stream loader is built: the executor is a parameter, the rest of the pipeline is shared.

:func:`build_stream_loader` returns the loader of one stream plan for either executor of the
:class:`~lightning_vstream.stream.engine.StreamEngine`: decode threads in the training process
(:class:`~lightning_vstream.stream.engine_loader.EngineLoader`) or DataLoader worker processes
(:class:`~lightning_vstream.stream.worker_loader.StreamDataLoader`). Both deliver the same batches,
counted alike, with the same resumable state. :meth:`EngineOptions.choose
<lightning_vstream.options.EngineOptions.choose>` says which executor a configuration asks for;
:func:`warn_unused_engine_options` names the options the chosen one does not use.
"""

from __future__ import annotations

from typing import Literal

from lightning_vstream._datamodule import unused_options, warn_unused_options, worker_context
from lightning_vstream.index import VideoIndex
from lightning_vstream.options import (
    DEFAULT_GPU_OPTIONS,
    DecodeOptions,
    EngineOptions,
    ErrorOptions,
    GpuOptions,
    OutputOptions,
    check_arguments,
)
from lightning_vstream.stream.loader_shell import StreamLoaderShell
from lightning_vstream.stream.sampler import StreamSampler

__all__ = ["build_stream_loader", "warn_unused_engine_options"]

ExecutorKind = Literal["threads", "workers"]


def build_stream_loader(
    index: VideoIndex,
    sampler: StreamSampler,
    *,
    executor: ExecutorKind,
    decode: DecodeOptions | None = None,
    output: OutputOptions | None = None,
    errors: ErrorOptions | None = None,
    engine: EngineOptions | None = None,
    gpu: GpuOptions = DEFAULT_GPU_OPTIONS,
    seed: int = 0,
    owner: str = "build_stream_loader",
) -> StreamLoaderShell:
    """The loader of ``sampler``'s plan over ``index``, decoded on ``decode.device`` by ``executor``.

    Args:
        index: The clips to read.
        sampler: The rank's stream plan; its ``num_parts`` must be 1 for ``"threads"`` and
            ``engine.worker_processes`` (at least 1) for ``"workers"``.
        executor: ``"threads"``: decode threads of this process
            (:func:`~lightning_vstream.stream.engine_loader.build_engine_loader`); ``"workers"``:
            ``engine.worker_processes`` DataLoader workers, each always decoding the same camera streams.
        decode: Where and how frames are decoded (``device``: ``"cpu"`` or ``"cuda:N"``).
        output: Transform, named outputs, annotations and augmentation.
        errors: What a failed read does, and how long to wait for a step.
        engine: Threads or worker processes, steps decoded ahead, pinned batches.
        gpu: The NVDEC probe and CPU fallback (threads on a GPU).
        seed: Seed of the augmentation draws.
        owner: Who asks, for errors (a DataModule names itself).

    Returns:
        A loader with the stream loaders' pass, length, ``stats`` and ``state_dict``.

    Example::

        >>> loader = build_stream_loader(index, sampler, executor="threads")  # doctest: +SKIP
        >>> next(iter(loader))["frames"].shape  # doctest: +SKIP
        torch.Size([2, 6, 3, 48, 64])
    """
    decode = decode or DecodeOptions()
    errors = errors or ErrorOptions()
    engine = engine or EngineOptions()
    check_arguments(owner, {"executor": (executor, executor in ("threads", "workers"), "'threads' or 'workers'")})
    if executor == "threads":
        from lightning_vstream.stream.engine_loader import build_engine_loader

        return build_engine_loader(
            index,
            sampler,
            decode.device,
            decode=decode,
            output=output,
            errors=errors,
            engine=engine,
            gpu=gpu,
            seed=seed,
        )
    from lightning_vstream.stream.worker import StreamDataset
    from lightning_vstream.stream.worker_loader import StreamDataLoader

    workers = engine.worker_processes
    dataset = StreamDataset(index=index, decode=decode, output=output, errors=errors, seed=seed)
    return StreamDataLoader(
        dataset,
        sampler=sampler,
        num_workers=workers,
        pin_memory=engine.pin_memory,
        prefetch_factor=engine.prefetch_factor,
        persistent_workers=engine.persistent_workers,
        multiprocessing_context=worker_context(owner, engine.multiprocessing_context, decode.device, workers),
        timeout=errors.timeout,
    )


def warn_unused_engine_options(engine: EngineOptions, device: str, choice: str | None = None) -> None:
    """Warn (a :class:`~lightning_vstream.VStreamWarning`) about the options the chosen executor ignores.

    Decode threads start no processes, so the worker-process options do nothing there; worker
    processes decode one part each, so ``threads`` does nothing there. Each is named with what sets
    the same thing for the executor chosen.

    Args:
        engine: The engine options given.
        device: Where frames are decoded.
        choice: The executor already chosen (``engine.choose(device)``'s); None: chosen here.

    Example::

        >>> warn_unused_engine_options(EngineOptions(kind="threads", num_workers=4), "cpu")  # doctest: +SKIP
        VStreamWarning: StreamVideoDataModule: engine.num_workers=4 is not used: engine.kind='threads' decodes ...
    """
    if choice is None:
        choice, _ = engine.choose(device)
    chosen = f"engine.kind={engine.kind!r}" + (f" on {device}" if engine.kind == "auto" else "")
    if choice == "threads":
        threads = "twice the GPU's NVDEC engines" if device != "cpu" else "one per core"
        warn_unused_options(
            "StreamVideoDataModule",
            unused_options(engine.num_workers, engine.persistent_workers, engine.multiprocessing_context),
            f"{chosen} decodes in threads of the training process and starts no worker processes",
            f"Its decode threads are engine.threads={engine.threads!r} (None: {threads}); pass "
            "engine=EngineOptions(kind='workers') to decode in worker processes instead.",
        )
    elif engine.threads is not None:
        workers = engine.worker_processes
        where = f"{workers} worker processes" if workers else "the training process (num_workers=0)"
        warn_unused_options(
            "StreamVideoDataModule",
            {"engine.threads": engine.threads},
            f"{chosen} decodes in {where}, not in engine threads",
            "Pass engine=EngineOptions(kind='threads') to decode with those threads instead.",
        )
