"""What both DataModules share with users: the temporal-reset warning, errors that say what to do,
teardown, and the grouped GPU options (with LightningCLI)."""

from __future__ import annotations

import gc
import warnings
import weakref
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from _trainers import quiet_trainer

from lightning_vstream import (
    ClipVideoDataModule,
    EngineOptions,
    GpuOptions,
    IndexOptions,
    SamplingOptions,
    StreamVideoDataModule,
    VStreamWarning,
)
from lightning_vstream.callbacks import TemporalStateReset
from lightning_vstream.demos.models import TinyStreamPETR
from lightning_vstream.errors import ConfigurationError, IndexValidationError, MissingFileError


@pytest.fixture(scope="module")
def index(make_dataset: Any) -> Path:
    return make_dataset(clips=3, cameras=2, frames=[6, 5, 7], size=(64, 48), gop=3)


def _fit(model: pl.LightningModule, dm: pl.LightningDataModule, tmp_path: Path, **kwargs: Any) -> pl.Trainer:
    trainer = quiet_trainer(tmp_path, **{"max_steps": 3, **kwargs})
    trainer.fit(model, datamodule=dm)
    return trainer


def _stream(index_file: Path, **kwargs: Any) -> StreamVideoDataModule:
    return StreamVideoDataModule(index_file=index_file, batch_size=2, engine=EngineOptions(num_workers=0), **kwargs)


class Stateless(pl.LightningModule):
    """Keeps nothing from one step to the next, and has no reset method."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        return self.layer(batch["frames"].float().mean(dim=(1, 3, 4)) / 255).pow(2).mean()

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class SaysItHandlesIsFirst(Stateless):
    handles_is_first = True


# -- the temporal-reset warning ---------------------------------------------------------------------
def test_fitting_without_a_reset_warns_once_naming_the_callback_and_the_hook(index: Path, tmp_path: Path) -> None:
    with pytest.warns(VStreamWarning) as caught:
        _fit(Stateless(), _stream(index, val_index_file=index), tmp_path, max_steps=6, val_check_interval=2)
    mine = [w for w in caught if issubclass(w.category, VStreamWarning)]
    assert len(mine) == 1  # once, although validation ran and the loop went on
    message = str(mine[0].message)
    assert message.startswith("StreamVideoDataModule: the Trainer has no TemporalStateReset callback, so nothing")
    assert "give Stateless a method reset_temporal_state(mask)" in message
    assert "add TemporalStateReset() to the Trainer's callbacks" in message
    assert "`handles_is_first = True`" in message


def test_a_model_with_the_hook_but_no_callback_is_told_to_add_the_callback(index: Path, tmp_path: Path) -> None:
    with pytest.warns(VStreamWarning, match=r"TinyStreamPETR defines reset_temporal_state\(mask\), but no "):
        _fit(TinyStreamPETR(), _stream(index), tmp_path)


@pytest.mark.parametrize(
    ("model", "callbacks"),
    [(TinyStreamPETR, [TemporalStateReset()]), (SaysItHandlesIsFirst, [])],
    ids=["with the callback", "handles_is_first"],
)
def test_no_warning_when_the_reset_is_handled(
    index: Path, tmp_path: Path, model: type[pl.LightningModule], callbacks: list[Any]
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", VStreamWarning)
        trainer = _fit(model(), _stream(index), tmp_path, callbacks=callbacks)
    assert trainer.global_step == 3


def test_the_warning_is_for_fit_only(index: Path, tmp_path: Path) -> None:
    dm = StreamVideoDataModule(val_index_file=index, batch_size=2, engine=EngineOptions(num_workers=0))
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, limit_val_batches=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", VStreamWarning)
        trainer.validate(TinyStreamPETR(), datamodule=dm, verbose=False)


# -- errors that say what to do ---------------------------------------------------------------------
@pytest.mark.parametrize("module", [StreamVideoDataModule, ClipVideoDataModule])
def test_an_index_file_that_is_a_folder_names_the_file_inside(
    module: type[pl.LightningDataModule], index: Path, tmp_path: Path
) -> None:
    with pytest.raises(ConfigurationError, match=rf"index file '{index.parent}' is a folder; pass '{index}'\."):
        module(index_file=index.parent, engine=EngineOptions(num_workers=0)).setup("fit")
    videos = index.parent / "videos"
    with pytest.raises(
        ConfigurationError, match=rf"is a folder; run `vstream index {videos}` to write '{videos}/index"
    ):
        module(index_file=videos, engine=EngineOptions(num_workers=0)).setup("fit")


@pytest.mark.parametrize("module", [StreamVideoDataModule, ClipVideoDataModule])
def test_a_missing_index_names_the_commands_that_make_one(module: type[pl.LightningDataModule], tmp_path: Path) -> None:
    with pytest.raises(MissingFileError) as info:
        module(index_file=tmp_path / "index.json", engine=EngineOptions(num_workers=0)).setup("fit")
    assert str(info.value) == (
        f"index file '{tmp_path / 'index.json'}' does not exist. Run `vstream index DATASET_FOLDER` to index your "
        "videos, or `vstream synth FOLDER` to write a stamped synthetic dataset."
    )


def test_an_unknown_camera_is_one_problem_listing_the_cameras(index: Path) -> None:
    with pytest.raises(IndexValidationError) as info:
        _stream(index, index=IndexOptions(cameras=["CAM_BACK", "CAM_FRNT"])).setup("fit")
    assert len(info.value.problems) == 1  # not one per clip
    assert str(info.value).endswith(
        "cameras=['CAM_BACK', 'CAM_FRNT']: no clip has camera(s) ['CAM_FRNT']; the index's clips have cameras "
        "['CAM_BACK', 'CAM_BACK_LEFT']. Pass names from that list, or cameras=None for all of them."
    )


# -- teardown ----------------------------------------------------------------------------------------
def test_stream_teardown_without_a_stage_stops_persistent_workers(index: Path) -> None:
    psutil = pytest.importorskip("psutil")

    dm = StreamVideoDataModule(
        index_file=index, batch_size=2, engine=EngineOptions(num_workers=2, persistent_workers=True)
    )
    dm.teardown(None)  # before setup: nothing to close
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    dm.setup(None)
    next(iter(dm.train_dataloader()))
    workers = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert len(workers) == 2
    dm.teardown(None)
    assert not workers & {p.pid for p in psutil.Process().children(recursive=True)}
    assert next(iter(dm.train_dataloader()))["frames"].shape[:2] == (2, 2)  # usable again
    dm.teardown(None)


@pytest.mark.parametrize(
    ("module", "options"),
    [
        (StreamVideoDataModule, {"engine": EngineOptions(kind="workers", num_workers=2)}),
        (ClipVideoDataModule, {"engine": EngineOptions(num_workers=2), "sampling": SamplingOptions(clip_frames=3)}),
    ],
)
def test_a_dropped_datamodule_and_its_unfinished_workers_go_at_once(
    module: type[pl.LightningDataModule], options: dict[str, Any], index: Path
) -> None:
    # Freed by reference counting, not left to the cycle collector: in a collection pass the
    # loader queues' feeder threads stop before the iterator's clean-up, and each worker then
    # waits seconds for a stop message that never comes.
    psutil = pytest.importorskip("psutil")

    class Subclass(module):  # type: ignore[valid-type, misc]
        def __init__(self, extra: int = 7, **kwargs: Any) -> None:
            super().__init__(**kwargs)

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    gc.disable()
    try:
        dm = Subclass(index_file=index, batch_size=2, **options)
        assert dm.hparams["extra"] == 7 and dm.hparams["batch_size"] == 2  # the subclass's arguments too
        dm.setup("fit")
        iterator = iter(dm.train_dataloader())
        next(iterator)
        assert len({p.pid for p in psutil.Process().children(recursive=True)} - before) == 2
        alive = weakref.ref(dm)
        del dm, iterator
        assert alive() is None
    finally:
        gc.enable()
    # Ended by the iterator's clean-up (asked, then terminated): gone within seconds on a loaded machine,
    # where the cycle collector would leave them running for as long as it does not pass.
    workers = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    _gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, alive


def test_stream_teardown_ends_the_workers_of_an_unfinished_pass(index: Path) -> None:
    psutil = pytest.importorskip("psutil")

    dm = StreamVideoDataModule(index_file=index, batch_size=2, engine=EngineOptions(num_workers=2, kind="workers"))
    dm.setup("fit")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    batches = iter(dm.train_dataloader())
    next(batches)  # the pass is held, unfinished
    workers = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert len(workers) == 2
    dm.teardown(None)
    assert not workers & {p.pid for p in psutil.Process().children(recursive=True)}
    batches.close()


# -- GPU-only options in one object --------------------------------------------------------------------
def test_gpu_options_are_one_checked_object() -> None:
    dm = StreamVideoDataModule(index_file="data/index.json", gpu=GpuOptions(fallback="cpu", probe=False))
    assert dm.gpu == GpuOptions(fallback="cpu", probe=False)
    assert dm.hparams["gpu"] == {"fallback": "cpu", "probe": False}  # plain types in checkpoints
    assert StreamVideoDataModule(index_file="x.json", gpu={"fallback": "cpu"}).gpu.fallback == "cpu"  # type: ignore[arg-type]
    assert StreamVideoDataModule(index_file="x.json").gpu == GpuOptions()
    with pytest.raises(ConfigurationError, match=r"GpuOptions: fallback='gpu' is invalid; expected 'none' or 'cpu'"):
        GpuOptions(fallback="gpu")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"gpu=\{'fallbak': 'cpu'\} has unknown option\(s\) \['fallbak'\]"):
        StreamVideoDataModule(index_file="x.json", gpu={"fallbak": "cpu"})  # type: ignore[arg-type]


def test_gpu_options_from_a_yaml_section(index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning.pytorch.cli import LightningCLI

    monkeypatch.setattr("sys.argv", ["train"])
    config = tmp_path / "gpu.yaml"
    config.write_text(f"data:\n  index_file: {index}\n  gpu:\n    fallback: cpu\n    probe: false\n")
    args = ["--config", str(config), "--trainer.logger", "false", "--seed_everything", "0"]
    cli = LightningCLI(TinyStreamPETR, StreamVideoDataModule, run=False, args=args)
    assert cli.datamodule.gpu == GpuOptions(fallback="cpu", probe=False)


# -- options: the public signatures stay, every shared option is refused in one wording ------------
Row = tuple[str, str | None, str]
#: The rows the constructors share, each written once.
_TOP: list[Row] = [
    *((f"{stage}index_file", "None", "Path | str | None") for stage in ("", "val_", "test_", "predict_")),
    ("batch_size", "4", "int"),
    ("seed", "0", "int"),
]
_GROUPS: dict[str, Row] = {
    "index": ("index", "IndexOptions(cameras=None, exclude_clips=(), check='fast')", "IndexOptions"),
    "plan": (
        "plan",
        "PlanOptions(shuffle=True, segment_length=None, seq_split_num=None, min_segment_length=8, frame_stride=1)",
        "PlanOptions",
    ),
    "sampling": (
        "sampling",
        "SamplingOptions(selection='regular', clip_frames=None, frame_stride=1, segments=None, time_policy='nearest', "
        "hop=None, clips_per_epoch=None, weighting='frames', frame_policy='exact', shuffle=True, drop_last=False)",
        "SamplingOptions",
    ),
    "decode": (
        "decode",
        "DecodeOptions(device='cpu', decoder_threads=0, max_open_decoders=None, camera_frames='stacked')",
        "DecodeOptions",
    ),
    "output": (
        "output",
        "OutputOptions(transform=None, outputs={}, annotations=None, augment=None, pad_annotations=False)",
        "OutputOptions",
    ),
    "engine": (
        "engine",
        "EngineOptions(kind='auto', threads=None, num_workers=None, prefetch_factor=2, persistent_workers=False, "
        "multiprocessing_context=None, pin_memory=False)",
        "EngineOptions",
    ),
    "errors": ("errors", "ErrorOptions(on_error='raise', timeout=300.0)", "ErrorOptions"),
    "gpu": ("gpu", "GpuOptions(fallback='none', probe=True)", "GpuOptions"),
    "storage": ("storage", "StorageConfig(options={}, cache_dir=None, cache_limit=None)", "StorageConfig"),
}
_PLACEMENT: list[Row] = [("rank", "None", "int | None"), ("world_size", "None", "int | None")]


def _groups(*names: str) -> list[Row]:
    return [_GROUPS[name] for name in names]


#: Every public constructor's parameters since the option groups: name, default (repr) and annotation.
#: YAML configs, saved hyperparameters and checkpoints name these; they change only on purpose.
SIGNATURES: dict[str, list[Row]] = {
    "StreamVideoDataModule": [
        *_TOP,
        *_groups("index", "plan", "decode", "output", "engine", "errors", "gpu", "storage"),
        *_PLACEMENT,
    ],
    "ClipVideoDataModule": [
        *_TOP,
        _GROUPS["sampling"],
        ("sampler", "None", "Callable[[VideoClipDataset], Sampler[Any]] | None"),
        *_groups("index", "decode", "output", "engine", "errors", "storage"),
        *_PLACEMENT,
    ],
    "VideoClipDataset": [
        ("index", None, "VideoIndex | Path | str"),
        ("requests", "()", "Sequence[ClipRequest]"),
        ("cameras", "None", "Sequence[str] | None"),
        *_groups("decode", "output", "errors", "storage"),
        ("size", "None", "tuple[int, int] | None"),
        ("gop_threads", "None", "int | None"),
        ("frame_policy", "'exact'", "FramePolicy"),
        ("seed", "0", "int"),
        ("epoch", "0", "int"),
    ],
}


@pytest.mark.parametrize("owner", sorted(SIGNATURES))
def test_public_signatures_are_unchanged(owner: str) -> None:
    import inspect

    import lightning_vstream

    parameters = inspect.signature(getattr(lightning_vstream, owner).__init__).parameters
    now = [
        (name, None if p.default is inspect.Parameter.empty else repr(p.default), str(p.annotation))
        for name, p in parameters.items()
        if name != "self"
    ]
    assert now == SIGNATURES[owner]


@pytest.mark.parametrize(
    ("group", "option", "value", "accepted"),
    [
        ("decode", "camera_frames", "sideways", "'stacked' or 'per_camera'"),
        ("errors", "on_error", "ignore", "'raise' or 'skip'"),
        ("decode", "decoder_threads", -1, "an integer >= 0"),
        ("decode", "max_open_decoders", 0, "an integer >= 1"),
        ("output", "transform", 3, "None or a callable on frame tensors"),
    ],
)
def test_shared_options_are_refused_in_one_wording(
    index: Path, group: str, option: str, value: Any, accepted: str
) -> None:
    from lightning_vstream import DecodeOptions, ErrorOptions, OutputOptions, VideoClipDataset
    from lightning_vstream.errors import ConfigurationTypeError

    kinds = {"decode": DecodeOptions, "errors": ErrorOptions, "output": OutputOptions}
    owners = {
        "StreamVideoDataModule": lambda **kwargs: StreamVideoDataModule(index_file=index, **kwargs),
        "ClipVideoDataModule": lambda **kwargs: ClipVideoDataModule(index_file=index, **kwargs),
        "VideoClipDataset": lambda **kwargs: VideoClipDataset(index=index, **kwargs),
    }
    kind = ConfigurationTypeError if option == "transform" else ConfigurationError
    # The option is checked by its group, in the group's name, whether the group is made directly or
    # by each owner from a plain dict of its options.
    pattern = rf"^{kinds[group].__name__}: {option}={value!r} is invalid; expected .*{accepted}"
    with pytest.raises(kind, match=pattern):
        kinds[group](**{option: value})
    for make in owners.values():
        with pytest.raises(kind, match=pattern):
            make(**{group: {option: value}})


@pytest.mark.parametrize("module", [StreamVideoDataModule, ClipVideoDataModule])
def test_a_bool_is_no_batch_size(module: type[pl.LightningDataModule]) -> None:
    with pytest.raises(ConfigurationError, match=r"batch_size=True is invalid; expected an integer >= 1"):
        module(index_file="x.json", batch_size=True)  # type: ignore[call-arg]
