"""What both DataModules share beyond the option groups themselves (:mod:`lightning_vstream.options`): the
groups built from their flat arguments, each stage's index file, worker start methods, per-instance
evaluation loaders, hyperparameters that load anywhere, the warning for options the chosen way of
decoding does not use, and the check of ``exclude_clips``.

Imported only by the DataModule modules (it imports lightning); DataLoader workers never load it.
"""

from __future__ import annotations

import abc
import dataclasses
import difflib
import inspect
import multiprocessing
import multiprocessing.context
import warnings
from collections.abc import Callable, Collection, Mapping
from pathlib import Path, PurePath
from typing import IO, TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar

import lightning.pytorch as pl

from lightning_vstream.errors import ConfigurationError, VStreamWarning, user_stacklevel
from lightning_vstream.options import (
    DECODE_MOVES,
    STORAGE_MOVES,
    DecodeOptions,
    EngineOptions,
    ErrorOptions,
    IndexOptions,
    MultiprocessingContext,
    OutputOptions,
    check_arguments,
    check_moved_keywords,
    is_count,
    option_group,
    regroup_moved_keywords,
)
from lightning_vstream.storage.config import StorageConfig
from lightning_vstream.storage.urls import index_location

if TYPE_CHECKING:
    from lightning_vstream.decode.counters import DecodeStats
    from lightning_vstream.index import VideoIndex

__all__ = [
    "SHARED_MOVES",
    "EvalLoader",
    "Stage",
    "VideoDataModule",
    "check_excluded_clips",
    "ignore_lightning_leafspec_warning",
    "plain_hparams",
    "save_init_hyperparameters",
    "stage_index_files",
    "unused_options",
    "warn_unused_options",
    "worker_context",
]

T = TypeVar("T")
Stage = Literal["train", "val", "test", "predict"]


def unused_options(
    num_workers: int | None, persistent_workers: bool, multiprocessing_context: str | None
) -> dict[str, object]:
    """The worker-process options among these that were given a value that needs worker processes."""
    given: dict[str, object] = {}  # named by their place: the engine group's
    if num_workers:
        given["engine.num_workers"] = num_workers
    if persistent_workers:
        given["engine.persistent_workers"] = persistent_workers
    if multiprocessing_context is not None:
        given["engine.multiprocessing_context"] = multiprocessing_context
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

        >>> warn_unused_options("StreamVideoDataModule", {"engine.num_workers": 16},
        ...                     "engine.kind='threads' decodes in threads of the training process",
        ...                     "engine.threads sets how many")  # doctest: +SKIP
        VStreamWarning: StreamVideoDataModule: engine.num_workers=16 is not used: engine.kind='threads' decodes in ...
    """
    if not unused:
        return
    named = " and ".join(f"{name}={value!r}" for name, value in unused.items())
    verb = "is" if len(unused) == 1 else "are"
    warnings.warn(
        f"{owner}: {named} {verb} not used: {because}. {instead}", VStreamWarning, stacklevel=user_stacklevel()
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
    from lightning_vstream.decode.nvdec.decoder import resolve_decode_device

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
        module.hparams[key] = _plain_value(value)


#: Fields of option groups that may hold any object (transforms): not saved; pass them again.
_UNSAVED_FIELDS: dict[type, tuple[str, ...]] = {OutputOptions: ("transform", "outputs")}


def _plain_value(value: Any) -> Any:
    """``value`` as something ``torch.load(weights_only=True)`` reads: an option group as a dict of its fields
    (secrets of a :class:`StorageConfig` redacted), a path as a string, any other object as its ``repr``."""
    if isinstance(value, StorageConfig):
        return {"options": value.redacted(), "cache_dir": value.cache_dir, "cache_limit": value.cache_limit}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        unsaved = _UNSAVED_FIELDS.get(type(value), ())
        return {
            f.name: _plain_value(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name not in unsaved
        }
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, tuple) and _plain(value):
        return [_plain_value(v) for v in value]
    return value if _plain(value) else repr(value)


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
                f"{owner}: multiprocessing_context='fork' cannot be used with decode.device={device!r}: a CUDA "
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


#: The flat keywords both DataModules took before their option groups, and where each went:
#: ``{group argument: (group class, {old keyword: field})}`` (see :func:`~lightning_vstream.options.moved_keywords`).
SHARED_MOVES: dict[str, tuple[type, dict[str, str]]] = {
    "index": (IndexOptions, {"cameras": "cameras", "exclude_clips": "exclude_clips", "index_check": "check"}),
    "decode": (DecodeOptions, DECODE_MOVES),
    "output": (
        OutputOptions,
        {name: name for name in ("transform", "outputs", "annotations", "augment", "pad_annotations")},
    ),
    "engine": (
        EngineOptions,
        {
            name: name
            for name in (
                "num_workers",
                "prefetch_factor",
                "persistent_workers",
                "multiprocessing_context",
                "pin_memory",
            )
        },
    ),
    "errors": (ErrorOptions, {"on_error": "on_error", "timeout": "timeout"}),
    "storage": (StorageConfig, STORAGE_MOVES),
}


class VideoDataModule(pl.LightningDataModule, abc.ABC):
    """What both DataModules do: the top-level arguments and the shared option groups (checked once, stored
    once), each stage's index, the decode device and the placement of this rank, one loader per stage
    (closed when replaced and on teardown), and the loaders' counters.

    Subclasses build their loaders (``train_dataloader`` and ``_stage_loader(split)`` for the evaluation
    stages), may add to :meth:`setup` through ``_after_setup``, and name in ``moved_keywords`` the flat
    keywords their groups replaced.
    """

    #: ``{group argument: (group class, {old keyword: field})}``: answered with their new place.
    moved_keywords: ClassVar[Mapping[str, tuple[type, Mapping[str, str]]]] = SHARED_MOVES

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # Checked here rather than by wrapping __init__: Lightning collects the hyperparameters of a subclass
        # of ours from the chain of __init__ frames, which a wrapper would cut.
        check_moved_keywords(cls.__name__, cls.moved_keywords, kwargs, keep=cls._own_arguments())
        return super().__new__(cls)

    @classmethod
    def _own_arguments(cls) -> set[str]:
        """The arguments ``__init__`` takes besides the option groups' (a subclass's own may share an old name)."""
        return set(inspect.signature(cls.__init__).parameters) - set(cls.moved_keywords)

    def __init__(
        self,
        *,
        index_file: Path | str | None,
        val_index_file: Path | str | None,
        test_index_file: Path | str | None,
        predict_index_file: Path | str | None,
        batch_size: int,
        seed: int,
        rank: int | None,
        world_size: int | None,
        index: IndexOptions | None,
        decode: DecodeOptions | None,
        output: OutputOptions | None,
        engine: EngineOptions | None,
        errors: ErrorOptions | None,
        storage: StorageConfig | None,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        check_arguments(
            owner,
            {
                "batch_size": (batch_size, is_count(batch_size), "an integer >= 1"),
                "seed": (seed, is_count(seed, 0), "an integer >= 0"),
                "world_size": (world_size, world_size is None or is_count(world_size), "None or an integer >= 1"),
                "rank": (
                    rank,
                    rank is None or (is_count(rank, 0) and rank < (world_size or 1)),
                    "None or an integer in 0..world_size-1",
                ),
            },
        )
        self.index_files: dict[Stage, Path | str | None] = stage_index_files(
            owner, train=index_file, val=val_index_file, test=test_index_file, predict=predict_index_file
        )
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.index_options = option_group(owner, "index", IndexOptions, index)
        self.decode = option_group(owner, "decode", DecodeOptions, decode)
        check_arguments(
            owner,
            {
                "decode.device": (
                    self.decode.device,
                    self.decode.device in ("cpu", "cuda", "auto"),
                    "'cpu', 'cuda' (each rank decodes on its Trainer's GPU) or 'auto'",
                )
            },
        )
        self.output = option_group(owner, "output", OutputOptions, output)
        self.engine = option_group(owner, "engine", EngineOptions, engine)
        self.errors = option_group(owner, "errors", ErrorOptions, errors)
        # Secrets stay in memory: checkpoints get the options without them, loggers none at all.
        self.storage = option_group(owner, "storage", StorageConfig, storage)
        self._indexes: dict[Stage, VideoIndex] = {}
        self._loaders: dict[Stage, Any] = {}
        self._resolved_device: str | None = None

    @classmethod
    def load_from_checkpoint(
        cls,
        checkpoint_path: str | Path | IO[bytes],
        map_location: Any = None,
        hparams_file: str | Path | None = None,
        weights_only: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """The DataModule a checkpoint's hyperparameters describe, as Lightning's ``load_from_checkpoint`` builds it,
        with ``kwargs`` over them, and its state loaded.

        Lightning passes a constructor only the arguments it names, so the flat options of a checkpoint saved
        before the option groups would be dropped without a word; they are put into their groups here (with
        one :class:`~lightning_vstream.VStreamWarning` naming them). A flat keyword in ``kwargs`` is an error
        naming its new place, as in the constructor.

        Example::

            >>> dm = StreamVideoDataModule.load_from_checkpoint("last.ckpt", output=OutputOptions(transform=t))  # doctest: +SKIP
        """
        own = cls._own_arguments()
        check_moved_keywords(cls.__name__, cls.moved_keywords, kwargs, keep=own)
        if hparams_file is not None:  # hyperparameters from a file: Lightning's own reading of it
            return super().load_from_checkpoint(checkpoint_path, map_location, hparams_file, weights_only, **kwargs)
        import fsspec
        import torch

        if isinstance(checkpoint_path, (str, Path)):
            with fsspec.open(str(checkpoint_path), "rb") as f:
                checkpoint = torch.load(f, map_location=map_location or "cpu", weights_only=weights_only)
        else:
            checkpoint = torch.load(checkpoint_path, map_location=map_location or "cpu", weights_only=weights_only)
        saved = dict(checkpoint.get(cls.CHECKPOINT_HYPER_PARAMS_KEY) or {})
        saved, moved = regroup_moved_keywords(cls.moved_keywords, saved, keep=own)
        if moved:
            warnings.warn(
                f"{cls.__name__}: the checkpoint holds options of an earlier release as flat hyperparameters "
                f"({', '.join(moved)}); they were put into their option groups. Save a new checkpoint to keep them "
                "that way.",
                VStreamWarning,
                stacklevel=2,
            )
        arguments = {**saved, **kwargs}
        parameters = inspect.signature(cls.__init__).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            arguments = {name: value for name, value in arguments.items() if name in parameters}
        module = cls(**arguments)
        state = checkpoint.get(type(module).__qualname__)
        if state is not None:
            module.load_state_dict(state)
        return module

    def _record_hyperparameters(self, **own: object) -> None:
        """Store plain hyperparameters, each option group as the checked whole rather than as given: the shared
        groups, then the subclass's ``own``."""
        shared = {"index": self.index_options, "decode": self.decode, "output": self.output, "engine": self.engine}
        for name, group in {**shared, "errors": self.errors, "storage": self.storage, **own}.items():
            self.hparams[name] = group
        plain_hparams(self)

    # -- placement ---------------------------------------------------------------------------
    def _device(self) -> str:
        """The device this rank decodes on: ``"cpu"`` or ``"cuda:N"`` (resolved once)."""
        if self._resolved_device is None:
            self._resolved_device = rank_decode_device(self.decode.device, self.trainer)
        return self._resolved_device

    def _placement(self) -> tuple[int, int]:
        """``(rank, world size)``: as given, else the Trainer's, else a single process."""
        trainer = self.trainer
        rank = self.rank if self.rank is not None else (trainer.global_rank if trainer is not None else 0)
        world = self.world_size if self.world_size is not None else (trainer.world_size if trainer is not None else 1)
        return rank, world

    # -- indexes -----------------------------------------------------------------------------
    def _load_index(self, split: Stage) -> VideoIndex:
        """The parsed index of ``split``, loaded once."""
        if split not in self._indexes:
            from lightning_vstream.indexing import load_index

            path = self.index_files[split]
            if path is None:
                raise ConfigurationError(f"{type(self).__name__} has no {split} index; pass {split}_index_file.")
            options = self.index_options
            self._indexes[split] = load_index(
                path,
                cameras=options.cameras,
                check=options.check,
                exclude_clips=options.exclude_clips,
                storage_options=dict(self.storage.options),
                cache_dir=self.storage.cache_dir,
                cache_limit=self.storage.cache_limit,
            )
        return self._indexes[split]

    def setup(self, stage: str | None = None) -> None:
        """Parse and validate the index files the stage needs (no decoder is opened) and resolve the decode device."""
        wanted: dict[str | None, tuple[Stage, ...]] = {
            "fit": ("train", "val"),
            "validate": ("val",),
            "test": ("test",),
            "predict": ("predict",),
        }
        owner = type(self).__name__
        self._device()
        ignore_lightning_leafspec_warning()
        for split in wanted.get(stage, ("train", "val", "test", "predict")):
            if self.index_files[split] is not None:
                self._load_index(split)
        if stage == "fit" and self.index_files["train"] is None:
            raise ConfigurationError(f"{owner}: Trainer.fit needs index_file (the training index).")
        check_excluded_clips(owner, self.index_options.exclude_clips, self.index_files, self._indexes)
        self._after_setup(stage)

    def _after_setup(self, stage: str | None) -> None:
        """What a subclass adds at the end of :meth:`setup`."""

    # -- loaders -----------------------------------------------------------------------------
    def _keep_loader(self, split: Stage, loader: T) -> T:
        """Make ``loader`` the ``split`` loader, closing the one it replaces."""
        old = self._loaders.get(split)
        if old is not None:
            old.close()
        self._loaders[split] = loader
        return loader

    @abc.abstractmethod
    def _stage_loader(self, split: Stage) -> Any:
        """The loader of an evaluation stage (``"val"``, ``"test"``, ``"predict"``)."""

    # Defined per instance: only a DataModule given that stage's index has the hook (see EvalLoader).
    val_dataloader = EvalLoader("val", lambda dm: dm.index_files["val"] is not None, lambda dm: dm._stage_loader("val"))
    test_dataloader = EvalLoader(
        "test", lambda dm: dm.index_files["test"] is not None, lambda dm: dm._stage_loader("test")
    )
    predict_dataloader = EvalLoader(
        "predict", lambda dm: dm.index_files["predict"] is not None, lambda dm: dm._stage_loader("predict")
    )

    def teardown(self, stage: str | None = None) -> None:
        """Stop the loaders' workers and close the decoders opened in this process; the DataModule can be
        fitted again afterwards."""
        for loader in self._loaders.values():
            loader.close()

    def decode_stats(self, split: Stage = "train") -> DecodeStats:
        """Decoding counters of the ``split`` loader (summed over its workers): frames decoded and delivered,
        seeks, samples or clips skipped, bad files, frames without annotation."""
        from lightning_vstream.decode.counters import DecodeStats

        loader = self._loaders.get(split)
        if loader is None:
            warnings.warn(f"no {split} loader has been created yet; counters are zero.", VStreamWarning, stacklevel=2)
            return DecodeStats()
        return loader.stats
