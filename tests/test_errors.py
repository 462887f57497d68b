"""Every error the package raises on purpose is a VStreamError, so users can catch ours apart."""

from __future__ import annotations

import ast
import builtins
import inspect
import pickle
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader, Dataset

import lightning_vstream
from lightning_vstream import DecodeOptions, EngineOptions, errors

PACKAGE = Path(lightning_vstream.__file__).parent
#: Built-in exceptions the package may raise as they are: protocol signals, not errors of ours.
PROTOCOL = {"NotImplementedError", "StopIteration", "AttributeError", "KeyError", "IndexError", "ImportError"}


def _raised_names() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(node.exc, ast.Name) and node.exc.id == "TypeError":
                    continue  # a bare `raise TypeError` jumps to a handler in the same function
                if isinstance(exc, ast.Name):
                    found.append((str(path.relative_to(PACKAGE)), node.lineno, exc.id))
    return found


def test_every_raised_builtin_error_is_one_of_ours() -> None:
    builtin_errors = {
        name for name, obj in vars(builtins).items() if inspect.isclass(obj) and issubclass(obj, BaseException)
    }
    bare = [
        f"{file}:{line} raises {name}"
        for file, line, name in _raised_names()
        if name in builtin_errors and name not in PROTOCOL
    ]
    assert not bare, "raise a lightning_vstream.errors class instead:\n" + "\n".join(bare)


@pytest.mark.parametrize("name", errors.__all__)
def test_error_classes_derive_from_the_base_and_a_builtin(name: str) -> None:
    cls = getattr(errors, name)
    assert issubclass(cls, errors.VStreamError)
    if cls is not errors.VStreamError:
        assert any(base.__module__ == "builtins" and base is not Exception for base in cls.__mro__[1:-2]), name


def _message(name: str, i: int = 0) -> str:
    return f"clip 'scene-{i:04d}', camera 'CAM_FRONT', frame 3 ('/data/{name}.mp4'): it failed\nsecond line"


@pytest.mark.parametrize("name", errors.__all__)
def test_every_error_survives_pickling_with_its_type_and_message(name: str) -> None:
    cls = getattr(errors, name)
    err = cls(_message(name))
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and str(back) == str(err) == _message(name)


def test_structured_index_errors_keep_their_fields_through_pickling() -> None:
    err = errors.FileChangedError("'a.mp4' (clip 'x', camera 'C')", ["first problem", "second problem"])
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is errors.FileChangedError
    assert (back.source, back.problems, str(back)) == (err.source, err.problems, str(err))
    # One argument is the whole message: how pickle and torch rebuild an error from its text.
    single = errors.FileChangedError("'a.mp4' changed since the index was built")
    assert (str(single), single.problems) == ("'a.mp4' changed since the index was built", [str(single)])


class _RaisesEveryError(Dataset):
    """Item ``i`` raises the ``i``-th error class of the package, chained to an OSError."""

    def __len__(self) -> int:
        return len(errors.__all__)

    def __getitem__(self, i: int) -> None:
        name = errors.__all__[i]
        try:
            raise OSError("the cause")
        except OSError as cause:
            raise getattr(errors, name)(_message(name, i)) from cause


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata's, under torch 2.13
@pytest.mark.parametrize("loader_cls", ["DataLoader", "StatefulDataLoader"])
def test_every_error_raised_in_a_dataloader_worker_reaches_the_user_as_itself(loader_cls: str) -> None:
    if loader_cls == "DataLoader":
        cls: Any = DataLoader
    else:
        from torchdata.stateful_dataloader import StatefulDataLoader as cls  # the clip loaders' loader
    # torch keeps an iterator usable after re-raising a worker's error: one pair of workers serves every class.
    it = iter(cls(_RaisesEveryError(), batch_size=None, num_workers=2))
    for i, name in enumerate(errors.__all__):
        with pytest.raises(getattr(errors, name)) as caught:
            next(it)
        assert type(caught.value) is getattr(errors, name)
        lines = str(caught.value).splitlines()
        # The worker's own message comes first, whole; torch's preamble and the traceback follow it.
        assert lines[:2] == _message(name, i).splitlines()
        assert lines[3] == f"(raised in DataLoader worker process {i % 2}; the worker's traceback:)"
        assert "OSError: the cause" in str(caught.value)
    # Ended here, not by the garbage collector: the last traceback holds the iterator in a cycle, and a
    # collected iterator's workers miss the shutdown message and are joined for 5 s each.
    with pytest.raises(StopIteration):
        next(it)


def test_messages_that_only_look_like_torch_rebuilt_ones_are_kept() -> None:
    text = "Caught VideoDecodeError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
    assert str(errors.VideoDecodeError(text)) == text  # no "module.Class: message" line to recover
    assert str(errors.WorkerError(text)) == text  # another class's name


def test_a_clip_dataset_on_cuda_without_a_gpu_gives_the_datamodules_error(tmp_path: Path) -> None:
    import torch

    from lightning_vstream import ClipVideoDataModule, VideoClipDataset
    from lightning_vstream.clips.selection import at_indices
    from lightning_vstream.demos.synth import write_dataset

    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU here")
    index = write_dataset(tmp_path / "d", clips=1, cameras=2, frames=4, size=(64, 48))
    dataset = VideoClipDataset(
        index=index, requests=[at_indices("scene-0000", [0, 3])], decode=DecodeOptions(device="cuda")
    )
    loader = DataLoader(dataset, batch_size=1, collate_fn=lambda samples: samples)
    with pytest.raises(errors.DecoderCapabilityError) as from_dataset:
        next(iter(loader))  # once an AssertionError ("Torch not compiled with CUDA enabled")
    dm = ClipVideoDataModule(index_file=index, decode=DecodeOptions(device="cuda"), engine=EngineOptions(num_workers=0))
    with pytest.raises(errors.DecoderCapabilityError) as from_datamodule:
        dm.setup("fit")
        next(iter(dm.train_dataloader()))
    assert str(from_dataset.value) == str(from_datamodule.value)
    assert "decode.device='cuda' needs a CUDA GPU" in str(from_dataset.value)
