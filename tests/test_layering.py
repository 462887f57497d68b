"""The package's layers: data flows one way, so a package imports only from the layers below it.

Every import counts, at module level, inside functions and under ``TYPE_CHECKING``, parsed with
``ast`` (nothing is imported to check). The one exception is :mod:`lightning_vstream.index`'s
``__init__``, which keeps its documented names that probe files (``load_index``, ``build_index``...)
importable by loading :mod:`lightning_vstream.indexing` on first access, never at import.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_vstream"

#: Package (or top-level module) -> the packages it may import from. Those not listed may import anything
#: that keeps the whole graph free of cycles.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "_exports": set(),  # the packages' lazy exports
    "profiling": {"errors"},
    "storage": {"errors"},
    "outputs": {"errors"},
    "executors": {"errors"},
    "worker_processes": {
        "errors"
    },  # watching DataLoader worker processes, for both ways of reading  # where preparation work runs (processes or Ray); knows nothing of video
    "annotations": {"errors", "storage"},  # storage.atomic: annotation files are written whole
    "preview": {"errors", "storage"},  # storage.atomic: preview images are written whole
    "callbacks": {"errors", "preview"},
    "index": {"_exports", "errors", "storage"},
    "options": {"errors", "outputs", "index", "transforms", "annotations"},  # the last two for type hints only
    "decode": {"_exports", "errors", "profiling", "storage", "index"},
    "indexing": {"errors", "storage", "index", "decode", "executors"},
    "transforms": {"errors", "profiling", "decode"},  # decode.base.Layout only
    "_datamodule": {
        "errors",
        "indexing",
        "outputs",
        "options",
        "storage",
        "index",
        "decode",
    },  # decode: resolve_decode_device, lazily
    # The two ways of reading are siblings: neither imports the other.
    "stream": {
        "errors",
        "profiling",
        "storage",
        "index",
        "indexing",
        "decode",
        "annotations",
        "outputs",
        "options",
        "transforms",
        "callbacks",
        "_datamodule",
        "worker_processes",
    },
    "clips": {
        "errors",
        "profiling",
        "storage",
        "index",
        "indexing",
        "decode",
        "annotations",
        "outputs",
        "options",
        "transforms",
        "_datamodule",
        "worker_processes",
    },
}

#: Imports no layer rule allows but the graph must still not turn into a cycle: the top-level
#: ``__init__`` names the public API of every layer, and ``index/__init__.py`` forwards its documented
#: names to ``indexing`` lazily (checked below).
FACADES = {"__init__.py", "index/__init__.py"}


def _layer(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> list[tuple[int, str, bool]]:
    """``(line, imported lightning_vstream module, at import time)`` of every import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str, bool]] = []

    def visit(node: ast.AST, eager: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, eager) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{path}:{node.lineno}: relative import; import lightning_vstream.* by name.")
            found.append((node.lineno, node.module or "", eager))
        for child in ast.iter_child_nodes(node):
            lazy = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or (
                isinstance(node, ast.If) and child in node.body and "TYPE_CHECKING" in ast.unparse(node.test)
            )
            visit(child, eager and not lazy)

    visit(tree, True)
    return [(line, name, eager) for line, name, eager in found if name.startswith("lightning_vstream.")]


@functools.cache
def _edges() -> dict[str, dict[str, list[str]]]:
    """Layer -> imported layer -> the places (``file:line``) that import it (parsed once; read, never changed)."""
    edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in FACADES:
            continue
        layer = _layer(path)
        for line, name, _ in _imports(path):
            target = name.split(".")[1]
            if target != layer:
                edges[layer][target].append(f"{rel}:{line}")
    return edges


def test_each_layer_imports_only_from_the_layers_below() -> None:
    edges = _edges()
    wrong = [
        f"{layer} imports {target} ({', '.join(places)})"
        for layer, allowed in ALLOWED.items()
        for target, places in sorted(edges.get(layer, {}).items())
        if target not in allowed
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    ("layer", "above"),
    [
        ("index", "decode"),
        ("index", "indexing"),
        ("decode", "stream"),
        ("decode", "clips"),
        ("stream", "clips"),
        ("clips", "stream"),
        ("options", "decode"),
    ],
)
def test_named_rules_hold(layer: str, above: str) -> None:
    # The rules of the style guide, spelled out: the allow-list above already implies them.
    assert above not in _edges().get(layer, {}), f"{layer} imports {above}"


def test_the_layers_form_no_cycle() -> None:
    edges = _edges()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges.get(node, {})):
            if state.get(target) == 1:
                cycle = [*path[path.index(target) :], target]
                raise AssertionError(f"import cycle {' -> '.join(cycle)} ({edges[node][target][0]})")
            if state.get(target) is None:
                walk(target, [*path, target])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            walk(node, [node])


def test_index_facade_forwards_lazily_and_only_to_indexing() -> None:
    facade = PACKAGE / "index" / "__init__.py"
    for line, name, eager in _imports(facade):
        layer = name.split(".")[1]
        assert layer in ALLOWED["index"] | {"index"} or (layer == "indexing" and not eager), (
            f"index/__init__.py:{line} imports {name}" + (" at import time" if layer == "indexing" else "")
        )


def test_importing_index_loads_no_decoder_and_its_documented_names_still_work() -> None:
    code = (
        "import sys\n"
        "import lightning_vstream.index as index\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('lightning_vstream.decode', 'lightning_vstream.indexing'))"
        " or m in ('av', 'torch', 'PyNvVideoCodec'))\n"
        "assert not loaded, loaded\n"
        "from lightning_vstream.index import VerifyReport, build_index, load_index, probe, verify_index, "
        "write_index_tables\n"
        "import lightning_vstream.indexing as indexing\n"
        "assert load_index is indexing.load_index and build_index is indexing.build_index\n"
        "assert (probe, verify_index, VerifyReport, write_index_tables) == (indexing.probe, indexing.verify_index, "
        "indexing.VerifyReport, indexing.write_index_tables)\n"
        "try:\n"
        "    index.no_such_name\n"
        "except AttributeError as err:\n"
        "    assert 'no_such_name' in str(err)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_every_module_a_forkserver_preloads_exists() -> None:
    # The forkserver skips a preload module it cannot import without a word: a stale name would only
    # slow the workers' start down.
    import importlib.util

    from lightning_vstream._datamodule import WORKER_MODULES

    missing = [name for name in WORKER_MODULES if importlib.util.find_spec(name) is None]
    assert not missing, missing


def test_options_import_neither_torch_nor_lightning() -> None:
    # Workers unpickle datasets holding option groups; importing them must stay cheap.
    code = (
        "import sys\n"
        "import lightning_vstream.options\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'lightning'))\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
