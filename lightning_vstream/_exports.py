"""Lazy exports: names a package offers, imported from their modules the first time they are asked for.

A package's ``__init__`` that would otherwise import heavy modules (PyAV, Lightning, torch) to offer their
names keeps importing nothing (:pep:`562`): it lists where each name lives and takes its module
``__getattr__`` and ``__dir__`` from :func:`lazy_exports`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str], *, computed: Mapping[str, Callable[[], Any]] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package`` for names imported on first use.

    Args:
        package: The package's ``__name__``.
        exports: Name -> the module it is imported from.
        computed: Name -> a function that computes it (``__version__``, say).

    Returns:
        ``(__getattr__, __dir__)``: a name, once imported, is kept in the package's namespace, and
        ``dir()`` lists the namespace and the package's ``__all__``.

    Example::

        __getattr__, __dir__ = lazy_exports(__name__, {"PyAVDecoder": "lightning_vstream.decode.cpu.pyav"})
    """
    namespace = sys.modules[package].__dict__
    made = dict(computed or {})

    def __getattr__(name: str) -> Any:
        if name in made:
            value = made[name]()
        else:
            module = exports.get(name)
            if module is None:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return __getattr__, __dir__
