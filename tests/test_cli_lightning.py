"""examples/train_stream.py: LightningCLI parses examples/configs/stream.yaml, fits, and rejects bad values early."""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import yaml

from lightning_vstream import EngineOptions, PlanOptions
from lightning_vstream.callbacks import StreamThroughputMonitor, TemporalStateReset
from lightning_vstream.demos.models import TinyStreamPETR
from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "configs" / "stream.yaml"
#: DataModule arguments the example config leaves out on purpose (the Trainer provides them).
FROM_TRAINER = {"rank", "world_size"}


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_stream", ROOT / "examples" / "train_stream.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _no_pytest_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["train_stream.py"])  # LightningCLI(args=...) warns about extra argv


@pytest.fixture(scope="module")
def cli_index(make_dataset: Any) -> Path:
    return make_dataset(clips=4, cameras=2, frames=[8, 6, 7, 9], size=(64, 48), gop=4)


def _args(index: Path, *extra: str) -> list[str]:
    return [
        "--config",
        str(CONFIG),
        "--data.index_file",
        str(index),
        "--data.val_index_file",
        str(index),
        "--data.engine.num_workers",
        "0",
        "--trainer.max_steps",
        "3",
        "--trainer.log_every_n_steps",
        "1",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.logger",
        "false",
        *extra,
    ]


def test_config_sets_every_datamodule_option() -> None:
    data = yaml.safe_load(CONFIG.read_text())["data"]
    options = set(inspect.signature(StreamVideoDataModule.__init__).parameters) - {"self"}
    assert set(data) == options - FROM_TRAINER, "examples/configs/stream.yaml must list every DataModule option"


def test_cli_parses_the_config_and_fits(cli_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cli = _example().main(_args(cli_index, "--data.batch_size", "2", "--data.plan.segment_length", "4"), run=False)
    dm, model, trainer = cli.datamodule, cli.model, cli.trainer
    assert isinstance(dm, StreamVideoDataModule) and isinstance(model, TinyStreamPETR)
    assert (
        dm.batch_size,
        dm.plan.segment_length,
        dm.engine.num_workers,
        dm.decode.decoder_threads,
        dm.errors.on_error,
    ) == (2, 4, 0, 1, "raise")
    monitors = [c for c in trainer.callbacks if isinstance(c, StreamThroughputMonitor)]
    resets = [c for c in trainer.callbacks if isinstance(c, TemporalStateReset)]
    assert len(monitors) == len(resets) == 1 and monitors[0].window == 10 and monitors[0].prog_bar
    trainer.fit(model, datamodule=dm)
    assert trainer.global_step == 3
    assert monitors[0].metrics["train/samples_per_sec"] > 0
    assert trainer.callback_metrics["train/samples_per_sec"] > 0
    assert model.slots_reset >= 2  # the first batch starts a clip in both slots


def test_cli_fit_subcommand_runs(cli_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cli = _example().main(["fit", *_args(cli_index)])
    assert cli.trainer.global_step == 3
    assert (tmp_path / "runs" / "stream").is_dir()


def _merge(into: dict[str, Any], data: dict[str, Any]) -> None:
    """Set ``data`` in the config section ``into``, group sections (``decode: {device: ...}``) key by key."""
    for key, value in data.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict) and "class_path" not in value:
            _merge(into[key], value)
        else:
            into[key] = value


def _bad_config(tmp_path: Path, index: Path, **data: Any) -> Path:
    config = yaml.safe_load(CONFIG.read_text())
    _merge(config["data"], {"index_file": str(index), "val_index_file": str(index), **data})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_wrong_choice_in_yaml_fails_at_parse_time_naming_the_option(cli_index: Path, tmp_path: Path) -> None:
    config = _bad_config(tmp_path, cli_index, engine={"kind": "thread"})
    stderr = io.StringIO()
    with pytest.raises(SystemExit), contextlib.redirect_stderr(stderr):
        _example().main(["--config", str(config)], run=False)
    assert 'Parser key "data.engine.kind"' in stderr.getvalue()
    assert "Expected a typing.Literal['auto', 'threads', 'workers']. Got value: thread" in stderr.getvalue()
    # decode.device also takes 'cuda:<index>' (a dataset), so its group checks it when built, naming it.
    config = _bad_config(tmp_path, cli_index, decode={"device": "tpu"})
    with pytest.raises(
        ValueError,
        match=re.escape("DecodeOptions: device='tpu' is invalid; expected 'cpu', 'cuda', 'cuda:<index>' or 'auto'."),
    ):
        _example().main(["--config", str(config)], run=False)


def test_wrong_number_in_yaml_fails_before_training_with_a_clear_message(cli_index: Path, tmp_path: Path) -> None:
    config = _bad_config(tmp_path, cli_index, batch_size=-1)
    with pytest.raises(ValueError, match=r"StreamVideoDataModule: batch_size=-1 is invalid; expected an integer >= 1"):
        _example().main(["--config", str(config)], run=False)


@pytest.mark.parametrize(
    ("section", "key", "args", "message"),
    [
        (
            "data",
            "batch_sze",
            [],
            "error: Group 'data' does not accept option 'batch_sze'; did you mean 'data.batch_size'?",
        ),
        (
            "trainer",
            "max_step",
            [],
            "error: Group 'trainer' does not accept option 'max_step'; did you mean 'trainer.max_steps'?",
        ),
        (
            "data",
            "batch_sze",
            ["fit"],
            "error: Subcommand 'fit' does not accept option 'data.batch_sze'; did you mean 'data.batch_size'?",
        ),
        (
            "data",
            "num_workers",
            [],
            "error: Group 'data' does not accept option 'num_workers'; did you mean 'data.engine.num_workers'?",
        ),
    ],
)
def test_a_misspelt_option_is_named_first_with_the_closest_valid_one(
    cli_index: Path, tmp_path: Path, section: str, key: str, args: list[str], message: str
) -> None:
    config = yaml.safe_load(CONFIG.read_text())
    config["data"].update(index_file=str(cli_index), val_index_file=str(cli_index))
    config[section][key] = 2
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(config))
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(stderr):
        _example().main([*args, "--config", str(path)], run=bool(args))
    assert exit_info.value.code == 2
    lines = stderr.getvalue().splitlines()
    assert lines[0] == message  # first, not after a usage dump
    assert lines[1].startswith("tip: `") and "--help` lists every option" in lines[1]
    assert len(lines) == 2


def test_a_misspelt_command_line_option_is_named_with_the_closest_valid_one(cli_index: Path) -> None:
    stderr = io.StringIO()
    with pytest.raises(SystemExit), contextlib.redirect_stderr(stderr):
        _example().main(["--data.index_file", str(cli_index), "--data.batch_sze", "2"], run=False)
    assert stderr.getvalue().splitlines()[0] == (
        "error: unrecognized arguments: --data.batch_sze 2; did you mean 'data.batch_size'?"
    )
    # A key of earlier releases is answered with its place in its option group.
    stderr = io.StringIO()
    with pytest.raises(SystemExit), contextlib.redirect_stderr(stderr):
        _example().main(["--data.index_file", str(cli_index), "--data.num_workers", "2"], run=False)
    assert stderr.getvalue().splitlines()[0] == (
        "error: unrecognized arguments: --data.num_workers 2; did you mean 'data.engine.num_workers'?"
    )


@pytest.mark.parametrize(
    "transform",
    [
        {"resize": [32, 48], "dtype": "float32"},
        {"class_path": "lightning_vstream.FrameTransform", "init_args": {"resize": [32, 48], "dtype": "float32"}},
    ],
    ids=["options", "class_path"],
)
def test_frame_transform_from_yaml_by_its_options_or_class_path(
    cli_index: Path, tmp_path: Path, transform: dict[str, Any]
) -> None:
    from lightning_vstream import FrameTransform

    config = yaml.safe_load(CONFIG.read_text())
    _merge(
        config["data"],
        {
            "index_file": str(cli_index),
            "val_index_file": None,
            "engine": {"num_workers": 0},
            "batch_size": 2,
            "output": {"transform": transform},
        },
    )
    path = tmp_path / "transform.yaml"
    path.write_text(yaml.safe_dump(config))
    dm = _example().main(["--config", str(path)], run=False).datamodule
    assert dm.output.transform == FrameTransform(resize=(32, 48), dtype="float32")
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["frames"].shape == (2, 2, 3, 32, 48) and batch["frames"].dtype == torch.float32


def test_user_transform_class_from_yaml_class_path(
    cli_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any callable class on frame tensors (torchvision v2 / kornia style) is given by class_path."""
    from _user_transforms import Brighten

    monkeypatch.chdir(tmp_path)
    config = yaml.safe_load(CONFIG.read_text())
    _merge(
        config["data"],
        {
            "index_file": str(cli_index),
            "val_index_file": str(cli_index),
            "engine": {"num_workers": 0},
            "batch_size": 2,
            "plan": {"shuffle": False},
            "output": {"transform": {"class_path": "_user_transforms.Brighten", "init_args": {"amount": 40}}},
        },
    )
    path = tmp_path / "brighten.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = _example().main(
        [
            "--config",
            str(path),
            "--trainer.max_steps",
            "2",
            "--trainer.logger",
            "false",
            "--trainer.enable_progress_bar",
            "false",
        ],
        run=False,
    )
    dm = cli.datamodule
    assert isinstance(dm.output.transform, Brighten) and dm.output.transform.amount == 40
    # any object: not stored in checkpoints
    assert "transform" not in dm.hparams and "transform" not in dm.hparams["output"]
    plain = StreamVideoDataModule(
        index_file=cli_index, engine=EngineOptions(num_workers=0), batch_size=2, plan=PlanOptions(shuffle=False)
    )
    for module in (dm, plain):
        module.setup("fit")
    bright, base = next(iter(dm.train_dataloader())), next(iter(plain.train_dataloader()))
    assert torch.equal(bright["frames"], (base["frames"].to(torch.int16) + 40).clamp(0, 255).to(torch.uint8))
    cli.trainer.fit(cli.model, datamodule=dm)
    assert cli.trainer.global_step == 2


def test_the_example_prints_no_warning(cli_index: Path, tmp_path: Path) -> None:
    """`examples/train_stream.py fit` as the docs run it: Lightning's log lines, but no warning."""
    import os
    import re
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHONWARNINGS")}
    argv = [
        "fit",
        "--config",
        str(CONFIG),
        "--data.index_file",
        str(cli_index),
        "--data.val_index_file",
        str(cli_index),
    ]
    argv += ["--data.engine.num_workers", "0", "--trainer.max_steps", "3", "--trainer.log_every_n_steps", "1"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_stream.py"), *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if re.search(r"\.py:\d+: |Warning", line)]
    assert warned == []
    assert (tmp_path / "runs" / "stream" / "lightning_logs" / "version_0" / "metrics.csv").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [
                "--trainer.callbacks+=lightning_vstream.callbacks.StreamThroughputMonitor",
                "--trainer.callbacks.windw",
                "3",
            ],
            "error: trainer.callbacks: lightning_vstream.callbacks.StreamThroughputMonitor does not accept option "
            "'windw'; did you mean 'window'?",
        ),
        (
            [
                "--data.output.transform",
                '{"class_path": "lightning_vstream.FrameTransform", "init_args": {"resise": [8, 8]}}',
            ],
            "error: data.output.transform: lightning_vstream.FrameTransform does not accept option 'resise'; "
            "did you mean 'resize'?",
        ),
    ],
)
def test_a_misspelt_class_argument_is_named_with_the_closest_valid_one(
    cli_index: Path, args: list[str], message: str
) -> None:
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(stderr):
        _example().main(["--data.index_file", str(cli_index), *args], run=False)
    assert exit_info.value.code == 2
    lines = stderr.getvalue().splitlines()
    assert lines[0] == message  # one line, not jsonargparse's dump of every type of the union
    assert lines[1].startswith("tip: `") and len(lines) == 2


def test_an_error_while_running_is_its_message_and_an_exit_status(
    cli_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("VSTREAM_DEBUG", raising=False)
    missing = tmp_path / "nowhere" / "index.json"
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(stderr):
        _example().main(["fit", *_args(cli_index, "--data.index_file", str(missing))])
    assert exit_info.value.code == 1
    last = stderr.getvalue().splitlines()[-1]
    assert last == (
        f"error: index file {str(missing)!r} does not exist. Run `vstream index DATASET_FOLDER` to index your "
        "videos, or `vstream synth FOLDER` to write a stamped synthetic dataset."
    )
    assert "Traceback" not in stderr.getvalue()
    # A value the DataModule refuses is a configuration error: exit status 2, as for a wrong option.
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(stderr):
        _example().main(["fit", *_args(cli_index, "--data.batch_size", "-1")])
    assert exit_info.value.code == 2
    assert stderr.getvalue().splitlines()[-1] == (
        "error: StreamVideoDataModule: batch_size=-1 is invalid; expected an integer >= 1."
    )
    # VSTREAM_DEBUG=1 prints the traceback as well.
    monkeypatch.setenv("VSTREAM_DEBUG", "1")
    stderr = io.StringIO()
    with pytest.raises(SystemExit), contextlib.redirect_stderr(stderr):
        _example().main(["fit", *_args(cli_index, "--data.index_file", str(missing))])
    assert "Traceback (most recent call last)" in stderr.getvalue()
