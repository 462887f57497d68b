"""Every Python sample in README.md and docs/*.md runs.

Conventions (for doc writers):

- Every fenced block tagged ```` ```python ```` is executed. The blocks of one file run in order
  in one shared namespace, like a notebook, so a later block can use names an earlier one defined.
- Each file runs in a fresh temporary working directory that holds:

  - ``data/``: exactly what ``vstream synth data --clips 8 --cameras 6`` writes (the command
    docs/index.md names): ``data/index.json``, ``data/index.meta.json``,
    ``data/videos/scene-000N/CAM_*.mp4``; nuScenes camera names; 40 frames per clip at 160x96.

- A block whose first line is ``# needs: cuda`` runs only where CUDA is available (it is skipped,
  with a reason, elsewhere).
- Shell commands go in ```` ```bash ````, configs in ```` ```yaml ````, output and error messages in
  ```` ```text ```` (or an untagged fence): none of these is executed here. The commands the docs
  show are exercised by other tests (``vstream demo``: test_demo.py; ``examples/train_stream.py``
  with ``examples/configs/stream.yaml``: test_cli_lightning.py; ``vstream synth`` / ``index``:
  test_synth.py and test_index.py).
- Keep samples small: short ``max_steps``, few workers. The whole file set runs in well under a minute.

``SKIPPED`` below lists blocks that cannot run as written, each with the reason; fix the doc and
remove the entry.
"""

from __future__ import annotations

import re
import shutil
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
FILES = [p for p in [ROOT / "README.md", *DOCS] if p.exists()]
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<tag>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.MULTILINE | re.DOTALL
)

#: (file name, first line of the block) -> why it cannot run as written.
SKIPPED: dict[tuple[str, int], str] = {}


@dataclass(frozen=True)
class Block:
    file: Path
    line: int
    code: str

    @property
    def needs_cuda(self) -> bool:
        return self.code.lstrip().startswith("# needs: cuda")


def python_blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    blocks = []
    for match in FENCE.finditer(text):
        if match.group("tag").strip() == "python":
            line = text.count("\n", 0, match.start()) + 1
            blocks.append(Block(path, line, textwrap.dedent(match.group("body"))))  # fences in list items are indented
    return blocks


@pytest.fixture(scope="session")
def docs_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lightning_vstream.cli import main

    root = tmp_path_factory.mktemp("docs_data")
    # The exact command docs/index.md tells readers to run (plus --jobs, which changes no byte of output).
    assert main(["synth", str(root / "data"), "--clips", "8", "--cameras", "6", "--jobs", "2"]) == 0
    return root


@pytest.fixture
def docs_cwd(docs_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    import torch

    shutil.copytree(docs_data / "data", tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["docs"])  # LightningCLI samples must not see pytest's arguments
    threads = torch.get_num_threads()
    yield tmp_path
    torch.set_num_threads(threads)  # samples may change it (tuning.md does)


def test_every_doc_has_been_found() -> None:
    names = {p.name for p in FILES}
    assert {"README.md", "index.md", "concepts.md", "streaming.md", "errors.md"} <= names


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


#: Pages other contributors are writing; links to them are not checked until they exist.
PENDING = {"performance.md"}


def test_relative_links_resolve() -> None:
    link = re.compile(r"\]\((?!https?://|#)([^)#\s]+)(?:#[^)]*)?\)")
    for path in FILES:
        for target in link.findall(path.read_text(encoding="utf-8")):
            if Path(target).name in PENDING:
                continue
            assert (path.parent / target).exists(), f"{path.name} links to {target}, which does not exist"
