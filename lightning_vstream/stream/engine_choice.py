"""Which way :class:`~lightning_vstream.StreamVideoDataModule` decodes, and the options that way does not use.

``engine="auto"`` decodes in threads of the training process (the stream engine) unless, on the
CPU, an option asks for worker processes: ``num_workers`` of 1 or more, ``persistent_workers`` or a
``multiprocessing_context``. An option the chosen way ignores is warned about once, naming the one
it uses instead, rather than dropped without a word.
"""

from __future__ import annotations

from typing import Literal

from lightning_vstream._datamodule import unused_options, warn_unused_options
from lightning_vstream.options import EngineOptions

__all__ = ["Engine", "choose_engine", "warn_unused_engine_options"]

Engine = Literal["threads", "workers"]


def choose_engine(engine: EngineOptions, device: str) -> tuple[Engine, str]:
    """``("threads" | "workers", why)`` for the DataModule's engine options and the device it decodes on.

    Example::

        >>> choose_engine(EngineOptions(num_workers=4), "cpu")
        ('workers', "engine.kind='auto' with num_workers=4: worker processes")
    """
    kind = engine.kind
    if kind != "auto":
        return ("threads" if kind == "threads" else "workers"), f"engine.kind={kind!r}"
    if device != "cpu":
        return "threads", f"engine.kind='auto' decoding on {device}: decode threads in the training process"
    if engine.num_workers:
        return "workers", f"engine.kind='auto' with num_workers={engine.num_workers}: worker processes"
    if engine.persistent_workers:
        return "workers", "engine.kind='auto' with persistent_workers=True, which only worker processes have"
    if engine.multiprocessing_context is not None:
        return "workers", (
            f"engine.kind='auto' with multiprocessing_context={engine.multiprocessing_context!r}, which only worker "
            "processes have"
        )
    return "threads", "engine.kind='auto': decode threads in the training process"


def warn_unused_engine_options(engine: EngineOptions, device: str, *, workers: int) -> None:
    """Warn (a :class:`~lightning_vstream.VStreamWarning`) about the options the chosen engine ignores.

    ``workers`` is the number of worker processes the worker engine would start (``num_workers``,
    or its default).
    """
    num_workers, engine_threads = engine.num_workers, engine.threads
    persistent_workers, multiprocessing_context = engine.persistent_workers, engine.multiprocessing_context
    choice, _ = choose_engine(engine, device)
    chosen = f"engine.kind={engine.kind!r}" + (f" on {device}" if engine.kind == "auto" else "")
    if choice == "threads":
        threads = "twice the GPU's NVDEC engines" if device != "cpu" else "one per core"
        warn_unused_options(
            "StreamVideoDataModule",
            unused_options(num_workers, persistent_workers, multiprocessing_context),
            f"{chosen} decodes in threads of the training process and starts no worker processes",
            f"Its decode threads are engine.threads={engine_threads!r} (None: {threads}); pass "
            "engine=EngineOptions(kind='workers') to decode in worker processes instead.",
        )
    elif engine_threads is not None:
        where = f"{workers} worker processes" if workers else "the training process (num_workers=0)"
        warn_unused_options(
            "StreamVideoDataModule",
            {"engine.threads": engine_threads},
            f"{chosen} decodes in {where}, not in engine threads",
            "Pass engine=EngineOptions(kind='threads') to decode with those threads instead.",
        )
