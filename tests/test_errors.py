"""Every error the package raises on purpose is a VStreamError, so users can catch ours apart."""

from __future__ import annotations

import ast
import builtins
import inspect
from pathlib import Path

import pytest

import lightning_vstream
from lightning_vstream import errors

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
