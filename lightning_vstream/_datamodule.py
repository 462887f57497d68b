"""What both DataModules share beyond the option groups themselves (:mod:`lightning_vstream.options`): the
groups built from their flat arguments, each stage's index file, worker start methods, per-instance
evaluation loaders, hyperparameters that load anywhere, the warning for options the chosen way of
decoding does not use, and the check of ``exclude_clips``.

Imported only by the DataModule modules (it imports lightning); DataLoader workers never load it.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import multiprocessing
import multiprocessing.context
import warnings
from collections.abc import Callable, Collection, Mapping
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import lightning.pytorch as pl

from lightning_vstream.errors import ConfigurationError, VStreamWarning, user_stacklevel
from lightning_vstream.options import (
    CameraFrames,
    DecodeOptions,
    ErrorOptions,
    MultiprocessingContext,
    OnError,
    OutputOptions,
    WorkerOptions,
)
from lightning_vstream.storage.urls import index_location

if TYPE_CHECKING:
    from lightning_vstream.index import VideoIndex
    from lightning_vstream.outputs import OutputTransform

__all__ = [
    "DEFAULT_NUM_WORKERS",
    "EvalLoader",
    "check_excluded_clips",
    "ignore_lightning_leafspec_warning",
    "plain_hparams",
    "save_init_hyperparameters",
    "shared_options",
    "stage_index_files",
    "unused_options",
    "warn_unused_options",
    "worker_context",
]

T = TypeVar("T")

#: Worker processes when ``num_workers`` is None, where the DataModule decodes in worker processes.
DEFAULT_NUM_WORKERS = 2


def unused_options(
    num_workers: int | None, persistent_workers: bool, multiprocessing_context: str | None
) -> dict[str, object]:
    """The worker-process options among these that were given a value that needs worker processes."""
    given: dict[str, object] = {}
    if num_workers:
        given["num_workers"] = num_workers
    if persistent_workers:
        given["persistent_workers"] = persistent_workers
    if multiprocessing_context is not None:
        given["multiprocessing_context"] = multiprocessing_context
    return given


def ignore_lightning_leafspec_warning() -> None:
    """Silence the one FutureWarning torch (2.13 on) raises each time Lightning wraps a DataModule's loaders.

    Lightning's ``CombinedLoader`` flattens the loaders with its own copy of a ``torch.utils._pytree``
    function that builds the deprecated ``LeafSpec``; nothing in the user's code or ours can change it.
    Called in the DataModules' ``setup()``, the step before Lightning builds its loaders; the filter
    matches that message from that Lightning module only (adding it again replaces it).
    """
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=r"lightning\.pytorch\.utilities\._pytree",
    )


def check_excluded_clips(
    owner: str, exclude_clips: Collection[str], index_files: Mapping[Any, object], loaded: Mapping[Any, VideoIndex]
) -> None:
    """Refuse ``exclude_clips`` ids that none of the DataModule's indexes lists (a typo would leave the clip in).

    Checked once every index file the DataModule was given (``index_files``, per split) is among the
    ``loaded`` indexes: an id may belong to the test index only.

    Raises:
        ConfigurationError: Names the ids, the indexes and the closest clip id.
    """
    if not exclude_clips or any(path is not None and split not in loaded for split, path in index_files.items()):
        return
    indexes = list(loaded.values())
    found = set().union(*(index.excluded for index in indexes))
    unknown = sorted(set(exclude_clips) - found)
    if not unknown:
        return
    ids = [i for index in indexes for i in (*index.excluded, *(index.clip_id(k) for k in range(len(index))))]
    close = difflib.get_close_matches(unknown[0], ids, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else "; remove them, or check the clip ids in the index."
    files = ", ".join(repr(str(index.source)) for index in indexes)
    raise ConfigurationError(f"{owner}: exclude_clips={unknown!r}: no index lists them ({files}){hint}")


def warn_unused_options(owner: str, unused: Mapping[str, object], because: str, instead: str) -> None:
    """Warn (a :class:`VStreamWarning`) that the ``unused`` options have no effect, ``because`` ..., and what
    sets the same thing for the chosen way of decoding (``instead``).

    Example::

        >>> warn_unused_options("StreamVideoDataModule", {"num_workers": 16},
        ...                     "engine='threads' decodes in threads of the training process",
        ...                     "engine_threads sets how many")  # doctest: +SKIP
        VStreamWarning: StreamVideoDataModule: num_workers=16 is not used: engine='threads' decodes in ...
    """
    if not unused:
        return
    named = " and ".join(f"{name}={value!r}" for name, value in unused.items())
    verb = "is" if len(unused) == 1 else "are"
    warnings.warn(
        f"{owner}: {named} {verb} not used: {because}. {instead}", VStreamWarning, stacklevel=user_stacklevel()
    )


def shared_options(
    owner: str,
    *,
    decode_device: str,
    decoder_threads: int,
    max_open_decoders: int | None,
    camera_frames: CameraFrames,
    unbounded: bool,
    transform: Callable[[Any], Any] | None,
    outputs: Mapping[str, OutputTransform] | None,
    on_error: OnError,
    timeout: float,
    num_workers: int | None,
    prefetch_factor: int,
    persistent_workers: bool,
    multiprocessing_context: MultiprocessingContext | None,
    pin_memory: bool,
) -> tuple[DecodeOptions, OutputOptions, ErrorOptions, WorkerOptions]:
    """The option groups both DataModules build from the flat arguments of their ``__init__``, each checked for
    ``owner`` (``unbounded``: ``max_open_decoders=None`` is accepted)."""
    return (
        DecodeOptions.of(
            owner,
            decode_device=decode_device,
            decoder_threads=decoder_threads,
            max_open_decoders=max_open_decoders,
            camera_frames=camera_frames,
            unbounded=unbounded,
        ),
        OutputOptions.of(owner, transform=transform, outputs=outputs),
        ErrorOptions.of(owner, on_error=on_error, timeout=timeout),
        WorkerOptions.of(
            owner,
            num_workers=num_workers,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            multiprocessing_context=multiprocessing_context,
            pin_memory=pin_memory,
        ),
    )


def stage_index_files(
    owner: str, *, train: Path | str | None, val: Path | str | None, test: Path | str | None, predict: Path | str | None
) -> dict[Any, Path | str | None]:
    """Each stage's index file (``index_file``, ``val_index_file``... of a DataModule); a URL stays a string.

    Raises:
        ConfigurationError: No stage has an index.
    """
    files = {"train": train, "val": val, "test": test, "predict": predict}
    if all(path is None for path in files.values()):
        raise ConfigurationError(
            f"{owner} needs at least one of index_file, val_index_file, test_index_file or predict_index_file."
        )
    return {stage: index_location(path) for stage, path in files.items()}


def rank_decode_device(decode_device: str, trainer: pl.Trainer | None) -> str:
    """The device this rank decodes on, ``"cpu"`` or ``"cuda:N"``: the Trainer's device for this rank when it has one."""
    from lightning_vstream.decode.gpu import resolve_decode_device

    local_rank = trainer.local_rank if trainer is not None else 0
    root = trainer.strategy.root_device if trainer is not None else None
    return str(resolve_decode_device(decode_device, local_rank, root_device=root))  # type: ignore[arg-type]


def save_init_hyperparameters(module: pl.LightningDataModule, ignore: list[str]) -> None:
    """``module.save_hyperparameters(ignore=ignore)`` for the ``__init__`` that calls this, leaving no cycle behind.

    Lightning's own frame lookup keeps a frame that refers to itself, and through it the
    DataModule: one dropped without ``teardown`` was then freed only by the cycle collector, after
    multiprocessing had stopped its loaders' queues, so each worker of an unfinished iterator
    waited 5 s for a stop message that never came. Passing the caller's frame avoids the lookup.
    """
    here = inspect.currentframe()
    caller = here.f_back if here is not None else None
    try:
        module.save_hyperparameters(ignore=ignore, frame=caller)
    finally:
        del here, caller


def plain_hparams(module: pl.LightningDataModule) -> None:
    """Store paths in ``module.hparams`` as strings, and other objects as their ``repr``.

    Checkpoints are read with ``torch.load(weights_only=True)``, which refuses ``Path`` objects
    and arbitrary classes; strings load everywhere and the DataModule accepts paths as strings.
    Objects such as an annotation source or an augmentation are recorded for the reader (their
    ``repr``); pass them again when rebuilding the DataModule from a checkpoint.
    """
    for key, value in list(module.hparams.items()):
        if dataclasses.is_dataclass(value) and not isinstance(value, type):  # an option group such as GpuOptions
            module.hparams[key] = dataclasses.asdict(value)
        elif isinstance(value, PurePath):
            module.hparams[key] = str(value)
        elif not _plain(value):
            module.hparams[key] = repr(value)


def _plain(value: object) -> bool:
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


#: What every DataLoader worker imports; a forkserver imports it once and forks workers with it loaded.
WORKER_MODULES = (
    "lightning_vstream.stream.worker",
    "lightning_vstream.clips.dataset",
    "lightning_vstream.clips.epochs",
)


def worker_context(
    owner: str, requested: MultiprocessingContext | None, device: str, num_workers: int
) -> str | multiprocessing.context.BaseContext | None:
    """The start method of the DataLoader workers: the one requested, else ``spawn`` for CUDA decoding.

    A CUDA context does not survive ``fork``, so decoding on a GPU in workers needs ``spawn`` or
    ``forkserver``; None leaves the choice to torch (``fork`` on Linux before Python 3.14). For
    ``forkserver`` the server preloads torch and the worker modules (besides ``__main__``, its
    default), so each worker forks with them imported instead of importing torch itself.
    """
    if num_workers == 0:
        return None
    method = requested
    if device != "cpu":
        if requested == "fork":
            raise ConfigurationError(
                f"{owner}: multiprocessing_context='fork' cannot be used with decode_device={device!r}: a CUDA "
                "context does not survive fork. Use 'spawn' or 'forkserver', or leave it None (spawn)."
            )
        method = requested or "spawn"
    if method != "forkserver":
        return method
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["__main__", *WORKER_MODULES])  # takes effect when the server starts
    return context


class EvalLoader(Generic[T]):
    """A ``val_dataloader`` / ``test_dataloader`` / ``predict_dataloader`` that exists only with its index.

    Lightning runs a loop (and its sanity check, and warns about a missing ``validation_step``)
    whenever the DataModule overrides the stage's hook. Looking the hook up on a DataModule
    without that stage's index returns LightningDataModule's own method, so Lightning sees it as
    not overridden and skips the stage silently; with the index it returns ``build``.

    Args:
        stage: ``"val"``, ``"test"`` or ``"predict"``.
        has_index: Whether a DataModule instance holds that stage's index.
        build: Builds the stage's loader for a DataModule instance.
    """

    def __init__(self, stage: str, has_index: Callable[[Any], bool], build: Callable[[Any], T]) -> None:
        self.stage = stage
        self.has_index = has_index
        self.build = build
        self.__doc__ = f"The {stage} loader (defined only when the DataModule was given {stage}_index_file)."

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        if self.has_index(instance):
            return self.build.__get__(instance, owner)
        return getattr(pl.LightningDataModule, self.name).__get__(instance, owner)
