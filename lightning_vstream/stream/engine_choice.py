"""Which way :class:`~lightning_vstream.StreamVideoDataModule` decodes, and the options that way does not use.

``engine="auto"`` decodes in threads of the training process (the stream engine) unless, on the
CPU, an option asks for worker processes: ``num_workers`` of 1 or more, ``persistent_workers`` or a
``multiprocessing_context``. An option the chosen way ignores is warned about once, naming the one
it uses instead, rather than dropped without a word.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from lightning_vstream._datamodule import unused_options, warn_unused_options

__all__ = ["Engine", "choose_engine", "warn_unused_engine_options"]

Engine = Literal["threads", "workers"]


def choose_engine(
    engine: str, device: str, num_workers: int | None, persistent_workers: bool, multiprocessing_context: str | None
) -> tuple[Engine, str]:
    """``("threads" | "workers", why)`` for the DataModule's options and the device it decodes on.

    Example::

        >>> choose_engine("auto", "cpu", 4, False, None)
        ('workers', "engine='auto' with num_workers=4: worker processes")
    """
    if engine != "auto":
        return ("threads" if engine == "threads" else "workers"), f"engine={engine!r}"
    if device != "cpu":
        return "threads", f"engine='auto' decoding on {device}: decode threads in the training process"
    if num_workers:
        return "workers", f"engine='auto' with num_workers={num_workers}: worker processes"
    if persistent_workers:
        return "workers", "engine='auto' with persistent_workers=True, which only worker processes have"
    if multiprocessing_context is not None:
        return "workers", (
            f"engine='auto' with multiprocessing_context={multiprocessing_context!r}, which only worker processes have"
        )
    return "threads", "engine='auto': decode threads in the training process"


def warn_unused_engine_options(engine: str, device: str, options: Mapping[str, Any], *, workers: int) -> None:
    """Warn (a :class:`~lightning_vstream.VStreamWarning`) about the options the chosen engine ignores.

    ``options`` are the DataModule's (its hyperparameters: ``num_workers``, ``persistent_workers``,
    ``multiprocessing_context``, ``engine_threads``); ``workers`` is the number of worker processes
    the worker engine would start (``num_workers``, or its default).
    """
    num_workers, engine_threads = options["num_workers"], options["engine_threads"]
    persistent_workers, multiprocessing_context = options["persistent_workers"], options["multiprocessing_context"]
    choice, _ = choose_engine(engine, device, num_workers, persistent_workers, multiprocessing_context)
    chosen = f"engine={engine!r}" + (f" on {device}" if engine == "auto" else "")
    if choice == "threads":
        threads = "twice the GPU's NVDEC engines" if device != "cpu" else "one per core"
        warn_unused_options(
            "StreamVideoDataModule",
            unused_options(num_workers, persistent_workers, multiprocessing_context),
            f"{chosen} decodes in threads of the training process and starts no worker processes",
            f"Its decode threads are engine_threads={engine_threads!r} (None: {threads}); pass engine='workers' to "
            "decode in worker processes instead.",
        )
    elif engine_threads is not None:
        where = f"{workers} worker processes" if workers else "the training process (num_workers=0)"
        warn_unused_options(
            "StreamVideoDataModule",
            {"engine_threads": engine_threads},
            f"{chosen} decodes in {where}, not in engine threads",
            "Pass engine='threads' to decode with engine_threads threads instead.",
        )
