"""The option groups: every moved keyword answered with its new place, groups as dicts, hyperparameters that
rebuild the same DataModule, one check per rule, and the groups shared by both DataModules."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_vstream import (
    ClipVideoDataModule,
    DecodeOptions,
    EngineOptions,
    ErrorOptions,
    FrameTransform,
    GeometryAugment,
    IndexOptions,
    OutputOptions,
    PlanOptions,
    SamplingOptions,
    StorageConfig,
    StreamVideoDataModule,
    VideoClipDataset,
)
from lightning_vstream.clips.datamodule import CLIP_MOVES
from lightning_vstream.clips.dataset import DATASET_MOVES
from lightning_vstream.errors import ConfigurationError, ConfigurationTypeError
from lightning_vstream.options import option_group
from lightning_vstream.stream.stream_datamodule import STREAM_MOVES

OWNERS = {"StreamVideoDataModule": STREAM_MOVES, "ClipVideoDataModule": CLIP_MOVES, "VideoClipDataset": DATASET_MOVES}
CLASSES = {"StreamVideoDataModule": StreamVideoDataModule, "ClipVideoDataModule": ClipVideoDataModule}
CLASSES["VideoClipDataset"] = VideoClipDataset  # type: ignore[assignment]
MOVED = [
    (owner, old, group, kind, new)
    for owner, table in OWNERS.items()
    for group, (kind, fields) in table.items()
    for old, new in fields.items()
]


def _valid(kind: type, field: str) -> Any:
    """A value the group's ``field`` accepts that is not its default (so the error shows it)."""
    value = next(f for f in dataclasses.fields(kind) if f.name == field).default
    special: dict[str, Any] = {
        "kind": "threads",
        "device": "cuda",
        "check": "thorough",
        "camera_frames": "per_camera",
        "on_error": "skip",
        "selection": "random",
        "time_policy": "at_or_before",
        "weighting": "videos",
        "frame_policy": "nearest_keyframe",
        "multiprocessing_context": "spawn",
        "transform": FrameTransform(dtype="float32"),
        "outputs": {"small": FrameTransform(resize=(8, 8))},
        "augment": GeometryAugment(output_size=(8, 8)),
        "annotations": "data/annotations",
        "options": {"anonymous": True},
        "cache_dir": "/tmp/cache",
        "cameras": ["CAM_FRONT"],
        "exclude_clips": ["scene-0001"],
        "segments": [(1.0, 4)],
    }
    if field in special:
        return special[field]
    if isinstance(value, bool):
        return not value
    return 3


@pytest.mark.parametrize(("owner", "old", "group", "kind", "new"), MOVED, ids=[f"{m[0]}-{m[1]}" for m in MOVED])
def test_every_moved_keyword_names_its_group_field_and_yaml_key(
    owner: str, old: str, group: str, kind: type, new: str
) -> None:
    value = _valid(kind, new)
    required = {"index": "data/index.json"} if owner == "VideoClipDataset" else {"index_file": "data/index.json"}
    with pytest.raises(ConfigurationError) as raised:
        CLASSES[owner](**required, **{old: value})
    message = str(raised.value)
    assert message.startswith(f"{owner}: {old}= is an option of the {group} group now: pass ")
    assert f"{group}={kind.__name__}({new}={value!r})" in message
    assert f"(YAML: data.{group}.{new}: " in message
    kind(**{new: value}, **({"cache_dir": "/tmp/cache"} if new == "cache_limit" else {}))  # the fix builds the group


@pytest.mark.parametrize("owner", sorted(CLASSES))
def test_the_constructors_take_few_arguments_all_keyword_only(owner: str) -> None:
    parameters = inspect.signature(CLASSES[owner]).parameters.values()
    assert len(parameters) <= 16
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters)
    moved = {old for _, (_, fields) in OWNERS[owner].items() for old in fields}
    assert not moved & {p.name for p in parameters} - set(OWNERS[owner])  # no old keyword is still a parameter


def test_a_group_may_be_a_dict_of_its_fields() -> None:
    dm = StreamVideoDataModule(
        index_file="data/index.json", engine={"kind": "workers", "num_workers": 3}, errors={"on_error": "skip"}
    )
    assert dm.engine == EngineOptions(kind="workers", num_workers=3)
    assert dm.errors == ErrorOptions(on_error="skip")
    assert dm.hparams["engine"]["num_workers"] == 3 and dm.hparams["errors"]["on_error"] == "skip"


def test_a_dict_naming_an_unknown_option_lists_the_group_options() -> None:
    with pytest.raises(ConfigurationError, match=r"engine=\{'workers': 3\} has unknown option\(s\) \['workers'\]; use"):
        StreamVideoDataModule(index_file="data/index.json", engine={"workers": 3})


def test_a_group_of_the_wrong_kind_is_a_type_error_naming_the_group() -> None:
    with pytest.raises(ConfigurationTypeError, match=r"decode=3 is invalid; expected DecodeOptions\(\.\.\.\), a dict"):
        option_group("StreamVideoDataModule", "decode", DecodeOptions, 3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "field", "value", "accepted"),
    [
        (IndexOptions, "check", "quick", "'fast' or 'thorough'"),
        (PlanOptions, "min_segment_length", 0, "an integer >= 1"),
        (SamplingOptions, "clips_per_epoch", 0, "None or an integer >= 1"),
        (DecodeOptions, "decoder_threads", -1, "an integer >= 0"),
        (EngineOptions, "prefetch_factor", 0, "an integer >= 1"),
        (ErrorOptions, "timeout", -1, "a number of seconds >= 0"),
    ],
)
def test_each_group_checks_its_fields_when_made(kind: type, field: str, value: Any, accepted: str) -> None:
    pattern = rf"^{kind.__name__}: {field}={value!r} is invalid; expected {re.escape(accepted)}\.$"
    with pytest.raises(ConfigurationError, match=pattern):
        kind(**{field: value})


def test_a_window_given_two_ways_is_refused_by_the_sampling_group() -> None:
    with pytest.raises(ConfigurationError, match=r"SamplingOptions: pass either segments=.* or clip_frames=4"):
        SamplingOptions(segments=[(1.0, 4)], clip_frames=4)
    with pytest.raises(ConfigurationError, match=r"PlanOptions: seq_split_num=2 is invalid; .*not with segment_length"):
        PlanOptions(seq_split_num=2, segment_length=10)


def test_a_datamodule_refuses_a_numbered_gpu_and_a_dataset_refuses_auto() -> None:
    with pytest.raises(ConfigurationError, match=r"StreamVideoDataModule: decode\.device='cuda:1' is invalid"):
        StreamVideoDataModule(index_file="data/index.json", decode=DecodeOptions(device="cuda:1"))
    with pytest.raises(ConfigurationError, match=r"VideoClipDataset: decode\.device='auto' is invalid"):
        VideoClipDataset(index="data/index.json", decode=DecodeOptions(device="auto"))


def test_the_clip_datamodule_chooses_its_engine_by_device() -> None:
    with pytest.raises(
        ConfigurationError, match=r"ClipVideoDataModule: engine\.kind='threads' is invalid; expected 'auto'"
    ):
        ClipVideoDataModule(index_file="data/index.json", engine=EngineOptions(kind="threads"))


@pytest.mark.parametrize("cls", [StreamVideoDataModule, ClipVideoDataModule])
def test_hyperparameters_rebuild_the_same_groups_without_secrets_or_transforms(cls: type, tmp_path: Path) -> None:
    storage = StorageConfig(
        {"access_key_id": "kept", "secret_access_key": "s3cr3t"}, cache_dir="/tmp/c", cache_limit="1GB"
    )
    augment = GeometryAugment(output_size=(8, 16), scale=(0.9, 1.1), flip=0.5)
    output = OutputOptions(transform=FrameTransform(dtype="float32"), augment=augment, pad_annotations=True)
    dm = cls(
        index_file="data/index.json",
        index=IndexOptions(cameras=["CAM_FRONT"], exclude_clips=["b", "a"]),
        decode=DecodeOptions(decoder_threads=2),
        output=output,
        engine=EngineOptions(num_workers=3),
        storage=storage,
    )
    hparams = dict(dm.hparams)
    assert hparams["storage"] == {
        "options": {"access_key_id": "kept", "secret_access_key": None},
        "cache_dir": "/tmp/c",
        "cache_limit": 1_000_000_000,
    }
    assert "s3cr3t" not in repr(hparams) and "s3cr3t" not in repr(dm.hparams_initial)
    assert "transform" not in hparams["output"] and "outputs" not in hparams["output"]
    assert hparams["index"] == {"cameras": ["CAM_FRONT"], "exclude_clips": ["a", "b"], "check": "fast"}
    path = tmp_path / "hparams.pt"
    torch.save({"datamodule_hyper_parameters": hparams}, path)
    hparams = torch.load(path, weights_only=True)["datamodule_hyper_parameters"]  # plain types only, as checkpoints
    rebuilt = cls(**hparams)  # what load_from_checkpoint does with them
    assert rebuilt.index_options == dm.index_options and rebuilt.decode == dm.decode and rebuilt.engine == dm.engine
    assert rebuilt.output == dataclasses.replace(output, transform=None)  # transforms are passed again
    assert rebuilt.output.augment == augment  # the augmentation comes back from its fields
    assert rebuilt.storage.options == {"access_key_id": "kept"} and rebuilt.storage.cache_limit == 1_000_000_000


def test_a_subclass_with_an_old_name_as_its_own_argument_keeps_it(tmp_path: Path) -> None:
    class Tuned(StreamVideoDataModule):
        def __init__(self, *, num_workers: int = 1, **kwargs: Any) -> None:
            super().__init__(engine=EngineOptions(num_workers=num_workers), **kwargs)

    dm = Tuned(num_workers=4, index_file=str(tmp_path / "index.json"))
    assert dm.engine.num_workers == 4 and dm.hparams["num_workers"] == 4
    with pytest.raises(ConfigurationError, match=r"Tuned: on_error= is an option of the errors group now"):
        Tuned(on_error="skip", index_file=str(tmp_path / "index.json"))


def test_the_frozen_groups_are_shared_defaults_nobody_changes() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        DecodeOptions().device = "cuda"  # type: ignore[misc]
    first, second = StreamVideoDataModule(index_file="a.json"), StreamVideoDataModule(index_file="b.json")
    assert first.decode is second.decode  # the same default object, safe because it cannot change
