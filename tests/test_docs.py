"""Every sample in README.md and docs/*.md runs: Python blocks, YAML configs and shell commands.

Conventions (for doc writers):

- Every fenced block tagged ```` ```python ```` is executed. The blocks of one file run in order
  in one shared namespace, like a notebook, so a later block can use names an earlier one defined.
  Each file runs in a fresh temporary working directory that holds:

  - ``data/``: exactly what ``vstream synth data --clips 8 --cameras 6`` writes (the command
    docs/index.md names): ``data/index.json``, ``data/index.tables.bin``,
    ``data/videos/scene-000N/CAM_*.mp4``; nuScenes camera names; 40 frames per clip at 160x96;
  - ``examples/``: the repository's examples (configs and scripts).

  A block whose first line is ``# needs: cuda`` runs only where CUDA is available (it is skipped,
  with a reason, elsewhere).
- Every ```` ```yaml ```` block is a LightningCLI config: it is parsed and instantiated by
  ``VStreamCLI(TinyStreamPETR, StreamVideoDataModule, run=False)`` (``ClipVideoDataModule`` when the
  block's first line is ``# data: ClipVideoDataModule``), with ``data.index_file`` set to
  ``data/index.json`` unless the block sets it. A wrong key, type or value fails the test.
- Every ```` ```bash ```` block is run, in order, in an empty temporary folder per file: lines that
  start with ``vstream`` or ``python examples/`` run (as the ``vstream`` command and the example script
  do, in this process); other lines (installing, profiling, benchmarks, the test suite) are shown, not
  run. Absolute paths are moved into the temporary folder, and the inputs a page assumes exist
  (``PREPARED``: a dataset folder, nuScenes tables and images) are made there first; a bucket a page
  names (``BUCKETS``: ``s3://my-bucket/...``) is made on the test suite's moto S3 server, which the
  commands reach through the standard AWS environment variables. Sizes that would
  take long are made small (``smaller``): frame sizes, processes, demo and training steps.
- Every sample runs with warnings as errors (Lightning's, torch's and ours; deprecation warnings as
  Python shows them to a script): a documented example that warns fails here. A page that shows a
  warning on purpose catches it in the sample (``warnings.catch_warnings(record=True)``).
- Output and error messages go in ```` ```text ```` (or an untagged fence): not executed.
- Samples import only public names: the ``__all__`` of ``lightning_vstream`` and of the public
  namespaces it lists.
- Keep samples small: short ``max_steps``, few workers.

``SKIPPED`` below lists what cannot run as written, each with the reason; fix the doc and remove
the entry.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import shlex
import shutil
import textwrap
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
FILES = [p for p in [ROOT / "README.md", *DOCS] if p.exists()]
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<tag>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.MULTILINE | re.DOTALL
)

#: (file name, first line of the block) -> why it cannot run as written.
SKIPPED: dict[tuple[str, int], str] = {}
#: Shell commands (as written) that cannot run here -> why.
SKIPPED_COMMANDS: dict[str, str] = {
    "vstream import-nuscenes /data/nuscenes /data/nuscenes_video --scenes scene-0061 scene-0103": (
        "names scenes of the real v1.0-mini; the test's nuScenes tables have scene-0000 and scene-0001"
    ),
}
#: The namespaces whose ``__all__`` is public (see lightning_vstream/__init__.py).
PUBLIC = (
    "lightning_vstream",
    "lightning_vstream.annotations",
    "lightning_vstream.callbacks",
    "lightning_vstream.cli",
    "lightning_vstream.decode",
    "lightning_vstream.demos",
    "lightning_vstream.encode",
    "lightning_vstream.errors",
    "lightning_vstream.importers",
    "lightning_vstream.index",
)


@contextmanager
def warnings_are_errors() -> Iterator[None]:
    """Every warning a user running the sample would see is an error, whatever the session's filters say.

    As Python's default filters do for a script, deprecation warnings count where the sample's own code
    is warned (its module is ``docs_<page>``); those a library raises about another library's calls
    (jsonargparse about Lightning's, say) are not shown to users and are left alone.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for category in (DeprecationWarning, PendingDeprecationWarning):
            warnings.filterwarnings("ignore", category=category)
            warnings.filterwarnings("error", category=category, module=r"docs_|__main__")
        yield


@dataclass(frozen=True)
class Block:
    file: Path
    line: int
    code: str

    @property
    def needs_cuda(self) -> bool:
        return self.code.lstrip().startswith("# needs: cuda")


def blocks(path: Path, tag: str) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        if match.group("tag").strip() == tag:
            line = text.count("\n", 0, match.start()) + 1
            found.append(Block(path, line, textwrap.dedent(match.group("body"))))  # fences in list items are indented
    return found


def python_blocks(path: Path) -> list[Block]:
    return blocks(path, "python")


@pytest.fixture(scope="session")
def docs_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lightning_vstream.cli import main

    root = tmp_path_factory.mktemp("docs_data")
    # The exact command docs/index.md tells readers to run (plus --jobs, which changes no byte of output).
    assert main(["synth", str(root / "data"), "--clips", "8", "--cameras", "6", "--jobs", "2", "-q"]) == 0
    return root


@pytest.fixture
def docs_cwd(docs_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    import torch

    shutil.copytree(docs_data / "data", tmp_path / "data")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["docs"])  # LightningCLI samples must not see pytest's arguments
    threads = torch.get_num_threads()
    yield tmp_path
    torch.set_num_threads(threads)  # samples may change it (tuning.md does)


def test_every_doc_has_been_found() -> None:
    names = {p.name for p in FILES}
    assert {"README.md", "index.md", "concepts.md", "streaming.md", "errors.md"} <= names


# -- Python ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_python_samples_run(path: Path, docs_cwd: Path) -> None:
    import torch

    namespace: dict[str, object] = {"__name__": f"docs_{path.stem}"}
    ran = 0
    for block in python_blocks(path):
        reason = SKIPPED.get((path.name, block.line))
        if reason is not None or (block.needs_cuda and not torch.cuda.is_available()):
            continue
        code = compile(block.code, f"{path.name}:{block.line}", "exec")
        try:
            with warnings_are_errors():
                exec(code, namespace)
        except Exception as err:
            raise AssertionError(
                f"the sample at {path.relative_to(ROOT)} line {block.line} failed: {type(err).__name__}: {err}"
            ) from err
        ran += 1
    if not ran and not python_blocks(path):
        pytest.skip(f"{path.name} has no python samples")


def test_skip_list_points_at_real_blocks() -> None:
    for (name, line), _ in SKIPPED.items():
        path = ROOT / "docs" / name
        if path.exists():
            assert line in {b.line for b in python_blocks(path)}, f"SKIPPED names {name}:{line}, which is no block"
    commands = {" ".join(c) for path in FILES for block in blocks(path, "bash") for c in _commands(block.code)}
    for command in SKIPPED_COMMANDS:
        assert command in commands, f"SKIPPED_COMMANDS names {command!r}, which no page runs"


# -- YAML ----------------------------------------------------------------------------------------------
YAML_FILES = [p for p in FILES if blocks(p, "yaml")]


@pytest.mark.parametrize("path", YAML_FILES, ids=[p.name for p in YAML_FILES])
def test_yaml_samples_parse_as_configs(path: Path, docs_cwd: Path) -> None:
    import yaml

    from lightning_vstream import ClipVideoDataModule, StreamVideoDataModule, VStreamCLI
    from lightning_vstream.demos import TinyStreamPETR

    for block in blocks(path, "yaml"):
        where = f"{path.relative_to(ROOT)} line {block.line}"
        config = yaml.safe_load(block.code)
        assert isinstance(config, dict), f"the YAML sample at {where} is not a mapping"
        first = block.code.lstrip().splitlines()[0]
        module = ClipVideoDataModule if first == "# data: ClipVideoDataModule" else StreamVideoDataModule
        file = docs_cwd / f"sample-{block.line}.yaml"
        file.write_text(block.code)
        args = ["--data.index_file", "data/index.json", "--trainer.logger", "false", "--seed_everything", "0"]
        args += ["--config", str(file)]
        try:
            with warnings_are_errors():
                cli = VStreamCLI(TinyStreamPETR, module, run=False, args=args)
        except SystemExit as exit:
            raise AssertionError(f"the YAML sample at {where} does not parse (exit {exit.code}); see stderr") from exit
        except Exception as err:
            raise AssertionError(f"the YAML sample at {where} failed: {type(err).__name__}: {err}") from err
        assert isinstance(cli.datamodule, module)
        for key, value in (config.get("data") or {}).items():
            if isinstance(value, (str, int, float, bool)) and key != "index_file":
                assert getattr(cli.datamodule, key, value) == value, f"{where}: data.{key} did not arrive"


# -- shell ---------------------------------------------------------------------------------------------
def _commands(code: str) -> list[list[str]]:
    """The runnable commands of a bash block (``vstream ...``, ``python examples/...``), as argv lists."""
    joined = re.sub(r"\\\n\s*", " ", code)
    found = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words and (
            words[0] == "vstream" or (len(words) > 1 and words[0] == "python" and words[1].startswith("examples/"))
        ):
            found.append(words)
    return found


def _prepare_dataset(target: Path, docs_data: Path) -> None:
    """A dataset folder of one's own videos, not yet indexed."""
    shutil.copytree(docs_data / "data" / "videos", target / "videos")


def _prepare_nuscenes(target: Path, docs_data: Path) -> None:
    from _nuscenes_fixture import write_nuscenes

    from lightning_vstream.demos.synth import NUSCENES_CAMERAS

    write_nuscenes(target, cameras=NUSCENES_CAMERAS, samples=2, sweeps_between=1)


#: Absolute paths pages assume exist -> how the test makes them.
PREPARED: dict[str, Callable[[Path, Path], None]] = {
    "/data/my_dataset": _prepare_dataset,
    "/data/nuscenes": _prepare_nuscenes,
}


def _prepare_bucket(server: Any, docs_data: Path, bucket: str, prefix: str) -> None:
    """A dataset's videos on the test S3 server, not yet indexed."""
    server.upload(docs_data / "data" / "videos", bucket, f"{prefix}/videos")


#: Bucket URLs pages assume exist -> (bucket, prefix) made on the moto S3 server (``tests/_s3.py``).
BUCKETS: dict[str, tuple[str, str]] = {
    "s3://my-bucket/nuscenes": ("my-bucket", "nuscenes"),
}


def smaller(argv: list[str]) -> list[str]:
    """The same command on small data: frame sizes, processes and steps that keep this test fast."""
    out = list(argv)

    def force(option: str, value: str) -> None:
        if option in out:
            out[out.index(option) + 1] = value
        else:
            out.extend([option, value])

    if "--size" in out or out[:2] == ["vstream", "synth"]:
        force("--size", "64x48")
    if "--jobs" in out:
        force("--jobs", "1")
    if out[:2] == ["vstream", "demo"]:
        force("--steps", "1")
        force("--num-workers", "0")
    if out[0] == "python" and "fit" in out:
        out += ["--trainer.max_steps", "2", "--data.engine.num_workers", "0", "--trainer.enable_progress_bar", "false"]
    return out


def _run(argv: list[str]) -> int:
    """Run a documented command in this process: the ``vstream`` console script or an example script."""
    if argv[0] == "vstream":
        from lightning_vstream.cli import main

        return main(argv[1:])
    spec = importlib.util.spec_from_file_location("docs_example", ROOT / argv[1])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.main(argv[2:])
    except SystemExit as exit:  # --print_config and --help end this way
        return int(exit.code or 0)
    return 0


SHELL_FILES = [p for p in FILES if any(_commands(b.code) for b in blocks(p, "bash"))]


@pytest.mark.parametrize("path", SHELL_FILES, ids=[p.name for p in SHELL_FILES])
def test_shell_samples_run(
    path: Path,
    docs_data: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    import sys

    import torch

    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.setattr(sys, "argv", ["docs"])
    threads = torch.get_num_threads()
    prepared: set[str] = set()
    ran = 0
    for block in blocks(path, "bash"):
        for argv in _commands(block.code):
            written = " ".join(argv)
            if any(written.startswith(skipped) for skipped in SKIPPED_COMMANDS):
                continue
            for place, make in PREPARED.items():
                if place in written and place not in prepared:
                    make(tmp_path / place.lstrip("/"), docs_data)
                    prepared.add(place)
            for place, (bucket, prefix) in BUCKETS.items():
                if place in written and place not in prepared:
                    server = request.getfixturevalue("s3")
                    _prepare_bucket(server, docs_data, bucket, prefix)
                    for key, value in server.environment().items():
                        monkeypatch.setenv(key, value)
                    request.addfinalizer(_stop_storage_helper)
                    _stop_storage_helper()  # the next request starts it again, in this environment
                    prepared.add(place)
            local = [str(tmp_path / a.lstrip("/")) if a.startswith("/") else a for a in smaller(argv)]
            try:
                with warnings_are_errors():
                    code = _run(local)
            except Warning as warning:
                raise AssertionError(
                    f"`{written}` ({path.relative_to(ROOT)}, line {block.line}) warned: {warning}"
                ) from warning
            out = capsys.readouterr()
            assert code == 0, (
                f"`{written}` ({path.relative_to(ROOT)}, block at line {block.line}) exited with {code}:\n{out.err}"
            )
            ran += 1
    torch.set_num_threads(threads)
    assert ran > 0


def _stop_storage_helper() -> None:
    """Stop this process's obstore helper process, which took its environment when it started."""
    from lightning_vstream.storage.obstore_transport import close_helper

    close_helper()


# -- public names only -----------------------------------------------------------------------------------


def _python_sources() -> Iterator[tuple[str, str]]:
    for path in FILES:
        for block in python_blocks(path):
            yield f"{path.name}:{block.line}", block.code
    for path in sorted((ROOT / "examples").glob("*.py")):
        yield path.name, path.read_text()


def test_samples_import_only_public_names() -> None:
    problems = []
    for where, code in _python_sources():
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lightning_vstream"):
                module = node.module or ""
                if module not in PUBLIC:
                    problems.append(f"{where}: `from {module} import ...` reaches into an internal module")
                    continue
                exported = set(importlib.import_module(module).__all__)
                hidden = [alias.name for alias in node.names if alias.name not in exported]
                if hidden:
                    problems.append(f"{where}: {hidden} are not in {module}.__all__")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("lightning_vstream") and alias.name not in PUBLIC:
                        problems.append(f"{where}: `import {alias.name}` reaches into an internal module")
    assert not problems, "\n".join(problems)


#: Pages other contributors are writing; links to them are not checked until they exist.
PENDING: set[str] = set()


def test_relative_links_resolve() -> None:
    link = re.compile(r"\]\((?!https?://|#)([^)#\s]+)(?:#[^)]*)?\)")
    for path in FILES:
        for target in link.findall(path.read_text(encoding="utf-8")):
            if Path(target).name in PENDING:
                continue
            assert (path.parent / target).exists(), f"{path.name} links to {target}, which does not exist"
