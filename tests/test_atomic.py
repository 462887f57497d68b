"""Nothing lost: every file the package writes is whole or absent, and the previous version survives a failure.

Replayed as an operator meets them: a full disk (a 2 MB tmpfs in a private mount namespace where the
machine allows one), a file-size limit (``RLIMIT_FSIZE``), a process killed (``SIGKILL``) at the moment
of the write, two ``vstream index`` runs at once with a reader loading the index meanwhile, an ``-o``
that names a camera file or a file that is not an index. The writers themselves are enumerated from
the package's source, so a new direct write fails :func:`test_every_writer_goes_through_the_atomic_helper`.
"""

from __future__ import annotations

import ast
import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lightning_vstream.demos.synth import write_dataset
from lightning_vstream.errors import ConfigurationError, FileWriteError
from lightning_vstream.index import tables_path
from lightning_vstream.indexing import build_index, load_index
from lightning_vstream.storage.atomic import atomic_path, is_temporary, open_atomic, remove_abandoned, write_atomic

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "lightning_vstream"

#: Writes that do not go through ``storage.atomic``, each with why that is right. (file, function) -> reason.
DIRECT_WRITES = {
    ("storage/cache.py", "claim"): "the claim file is a lock: O_EXCL creation is the claim, a torn stamp reads as none",
    ("doctor.py", "_ten_bit_file"): "a scratch video in the doctor's own temporary folder, removed with it",
    ("decode/nvdec/probe_child.py", "_write_clip"): "a scratch video in a temporary folder, removed with it",
    ("demos/demo.py", "_dataset"): "a whole staging folder (written through the helper) renamed into place",
    ("encode/writer.py", "_encode_into"): "muxes into the temporary path encode_file's atomic_path hands it",
    ("preview.py", "_repr_png_"): "an in-memory PNG for notebooks (io.BytesIO), no file",
    ("commands/preview.py", "run"): "Picture.save, which writes through open_atomic",
    ("callbacks/preview.py", "_save"): "Picture.save, which writes through open_atomic",
}


def _writes(tree: ast.AST) -> list[tuple[str, int, str, set[str]]]:
    """``(function, line, call, names bound by open_atomic/atomic_path in that function)`` of every write."""
    found: list[tuple[str, int, str, set[str]]] = []

    def visit(node: ast.AST, function: str, bound: set[str]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function, bound = node.name, set()
            for child in ast.walk(node):
                if isinstance(child, ast.withitem) and isinstance(child.context_expr, ast.Call):
                    called = ast.unparse(child.context_expr.func)
                    if called.split(".")[-1] in ("open_atomic", "atomic_path") and child.optional_vars is not None:
                        bound.add(ast.unparse(child.optional_vars))
        if isinstance(node, ast.Call):
            text = ast.unparse(node)
            name = ast.unparse(node.func)
            mode = [ast.unparse(a) for a in node.args[1:2]] + [
                ast.unparse(k.value) for k in node.keywords if k.arg == "mode"
            ]
            writing_mode = any(any(c in m for c in "wax+") for m in mode)
            flags = " ".join(ast.unparse(a) for a in node.args[1:])
            if (
                name.endswith((".write_text", ".write_bytes", ".tofile", ".rename"))
                or name in ("os.replace", "os.rename", "shutil.move", "shutil.copy", "shutil.copyfile", "shutil.copy2")
                or name in ("np.save", "np.savez", "np.savez_compressed", "numpy.save", "torch.save")
                or (name in ("open", "io.open", "av.open", "os.fdopen") and writing_mode)
                or (name == "os.open" and any(f in flags for f in ("O_WRONLY", "O_RDWR", "O_CREAT")))
                or name.endswith(".save")
            ):
                target = node.args[0] if node.args else None
                inner = target.args[0] if isinstance(target, ast.Call) and target.args else target
                through_helper = inner is not None and ast.unparse(inner) in bound
                if not through_helper:
                    found.append((function, node.lineno, text, bound))
        for child in ast.iter_child_nodes(node):
            visit(child, function, bound)

    visit(tree, "<module>", set())
    return found


def test_every_writer_goes_through_the_atomic_helper() -> None:
    direct = []
    used = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "storage/atomic.py":
            continue
        for function, line, text, _ in _writes(ast.parse(path.read_text(encoding="utf-8"))):
            if (rel, function) in DIRECT_WRITES:
                used.add((rel, function))
                continue
            direct.append(f"lightning_vstream/{rel}:{line} in {function}(): {text}")
    assert not direct, (
        "these write files directly; write through lightning_vstream.storage.atomic (write_atomic, open_atomic, "
        "atomic_path) so a failure leaves the previous file and no debris, or list them in DIRECT_WRITES with "
        "the reason:\n" + "\n".join(direct)
    )
    assert used == set(DIRECT_WRITES), f"DIRECT_WRITES lists writes that are gone: {set(DIRECT_WRITES) - used}"


def test_the_scan_finds_a_direct_write() -> None:
    source = textwrap.dedent(
        """
        def save(path, data, image):
            path.write_text(data)
            with open(path, "wb") as f:
                f.write(data)
            image.save(path)
            with open_atomic(path) as f:
                image.save(f, format="PNG")
        """
    )
    found = [text for _, _, text, _ in _writes(ast.parse(source))]
    assert found == ["path.write_text(data)", "open(path, 'wb')", "image.save(path)"]


# -- the helper --------------------------------------------------------------------------------------
def _debris(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if is_temporary(name) or name.endswith(".tmp"))


def test_a_failed_write_keeps_the_previous_file_and_leaves_nothing(tmp_path: Path) -> None:
    target = write_atomic(tmp_path / "index.json", "previous\n")
    for failure in (KeyboardInterrupt, RuntimeError):
        with pytest.raises(failure), open_atomic(target) as f:
            f.write(b"half of the new")
            raise failure()
    with pytest.raises(ValueError), atomic_path(target) as partial:
        partial.write_bytes(b"new")
        raise ValueError("the encoder failed")
    assert target.read_text() == "previous\n" and _debris(tmp_path) == []


def test_a_full_disk_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = write_atomic(tmp_path / "index.json", "previous\n")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(FileWriteError, match=r"cannot write '.*index\.json': No space left on device; free space"):
        write_atomic(target, "new\n")
    assert target.read_text() == "previous\n" and _debris(tmp_path) == []


def test_a_writer_that_opens_the_file_itself_gets_its_disk_errors_named(tmp_path: Path) -> None:
    target = tmp_path / "CAM_FRONT.mp4"
    with pytest.raises(FileWriteError, match=r"cannot write '.*CAM_FRONT\.mp4': File too large") as caught:
        with atomic_path(target):
            raise OSError(errno.EFBIG, "File too large")
    assert caught.value.errno == errno.EFBIG and not target.exists() and _debris(tmp_path) == []


def test_temporary_names_are_hidden_and_never_a_camera_file(tmp_path: Path) -> None:
    from lightning_vstream.index.files import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS

    with atomic_path(tmp_path / "CAM_FRONT.mp4") as partial:
        partial.write_bytes(b"x")
        assert partial.parent == tmp_path and partial.name.startswith(".") and is_temporary(partial.name)
        assert partial.suffix not in VIDEO_EXTENSIONS | IMAGE_EXTENSIONS


def test_remove_abandoned_removes_only_our_temporaries_whose_writer_is_gone(tmp_path: Path) -> None:
    from lightning_vstream.storage.atomic import _host

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(gone.stdout)  # a process that has ended
    names = {
        "dead": f".CAM_FRONT.mp4.{_host()}.{dead}.0a1b2c3d.tmp",
        "alive": f".CAM_FRONT.mp4.{_host()}.{os.getppid()}.0a1b2c3d.tmp",
        "elsewhere": f".CAM_FRONT.mp4.other-node.{dead}.0a1b2c3d.tmp",
        "other target": f".CAM_BACK.mp4.{_host()}.{dead}.0a1b2c3d.tmp",
        "not ours": f".CAM_FRONT.mp4.{_host()}.{dead}.tmp",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "CAM_FRONT.mp4").write_bytes(b"done")
    assert remove_abandoned(tmp_path, targets=["CAM_FRONT.mp4"]) == [tmp_path / names["dead"]]
    # Once every writer is known to have ended, those of other hosts and live processes go too.
    removed = remove_abandoned(tmp_path, targets=["CAM_FRONT.mp4"], writers_ended=True)
    assert sorted(removed) == sorted(tmp_path / names[k] for k in ("alive", "elsewhere"))
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([names["other target"], names["not ours"], "CAM_FRONT.mp4"])
    assert remove_abandoned(tmp_path / "missing") == []


# -- replayed as an operator would -------------------------------------------------------------------
@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("atomic") / "ds"
    write_dataset(root, clips=3, cameras=2, frames=8, gop=4)
    return root


def _copy(dataset: Path, tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    shutil.copytree(dataset, root)
    return root


def _vstream(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "lightning_vstream.cli", *args], capture_output=True, text=True, env=env, **kwargs
    )  # type: ignore[call-overload]


def _intact(root: Path, before: dict[str, bytes]) -> None:
    for name, data in before.items():
        assert (root / name).read_bytes() == data, f"{name} changed"
    assert len(load_index(root / "index.json")) == 3


def test_a_file_size_limit_keeps_the_previous_index_and_leaves_no_debris(dataset: Path, tmp_path: Path) -> None:
    root = _copy(dataset, tmp_path)
    before = {name: (root / name).read_bytes() for name in ("index.json", "index.tables.bin")}

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))  # python ignores SIGXFSZ: writes fail (EFBIG)

    done = _vstream("index", str(root), "-q", preexec_fn=limit)
    assert done.returncode == 1, done.stderr
    assert f"cannot write '{root / 'index.tables.bin'}': File too large" in done.stderr
    _intact(root, before)
    assert _debris(root) == []


def _mount_tmpfs_allowed() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-r", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt || mount -t tmpfs tmpfs /tmp"],
        capture_output=True,
    )
    return probe.returncode == 0


@pytest.mark.skipif(sys.platform != "linux" or not _mount_tmpfs_allowed(), reason="cannot mount a tmpfs here")
def test_a_full_disk_keeps_the_previous_index_and_names_the_file(dataset: Path, tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    # A 2 MB tmpfs in a private mount namespace: a first build fits, then the disk is filled and the
    # build runs again; afterwards the index still loads (its tables memory-mapped: no hole to fault on).
    script = textwrap.dedent(
        f"""
        set -u
        mount -t tmpfs -o size=2m tmpfs {disk}
        {sys.executable} -m lightning_vstream.cli index {dataset} -o {disk}/index.json -q > /dev/null || exit 90
        cp {disk}/index.json {disk}/index.json.before; cp {disk}/index.tables.bin {disk}/tables.before
        head -c 4000000 /dev/zero > {disk}/filler 2>/dev/null
        {sys.executable} -m lightning_vstream.cli index {dataset} -o {disk}/index.json -q --force 2> {tmp_path}/err
        echo "rc=$?"
        rm {disk}/filler
        cmp {disk}/index.json {disk}/index.json.before && cmp {disk}/index.tables.bin {disk}/tables.before || exit 91
        {sys.executable} -c "from lightning_vstream.indexing import load_index; print(len(load_index('{disk}/index.json')))"
        cat {tmp_path}/err; ls -a {disk}
        """
    )
    done = subprocess.run(
        ["unshare", "-r", "-m", "sh", "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.split()
    assert "rc=1" in lines and "3" in lines, done.stdout
    assert f"cannot write '{disk}/index.tables.bin': No space left on device" in done.stdout
    listed = {line for line in lines if line.startswith(".") and line not in (".", "..")}
    assert not listed, f"temporary files left on the full disk: {listed}"


@pytest.mark.parametrize("moment", ["index.tables.bin", "index.json"])
def test_a_kill_at_the_moment_of_the_write_keeps_the_previous_index(dataset: Path, tmp_path: Path, moment: str) -> None:
    root = _copy(dataset, tmp_path)
    before = {name: (root / name).read_bytes() for name in ("index.json", "index.tables.bin")}
    # The build stops where the new file is complete under its temporary name, just before the rename,
    # and says so; it is killed there.
    script = textwrap.dedent(
        f"""
        import os, sys
        import lightning_vstream.storage.atomic as atomic
        from lightning_vstream.indexing import build_index
        real = os.replace
        def replace(src, dst):
            if os.path.basename(dst) == {moment!r}:
                print("writing", flush=True)
                sys.stdin.read()
            real(src, dst)
        atomic.os.replace = replace
        build_index({str(root)!r}, output={str(root / "index.json")!r}, progress=False)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert child.stdout is not None and child.stdout.readline() == "writing\n"
    assert len(_debris(root)) == 1  # the new file, whole, under its temporary name
    child.send_signal(signal.SIGKILL)
    child.wait()
    _intact(root, before)
    # The next build into that folder removes what the killed one left.
    build_index(root, output=root / "index.json", progress=False)
    assert _debris(root) == []


def test_two_builds_at_once_never_show_a_reader_a_partial_index(dataset: Path, tmp_path: Path) -> None:
    root = _copy(dataset, tmp_path)
    expected = json.loads((root / "index.json").read_text())
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    loads = 0
    for _ in range(2):
        builds = [
            subprocess.Popen(
                [sys.executable, "-m", "lightning_vstream.cli", "index", str(root), "-q"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for _ in range(2)
        ]
        while any(b.poll() is None for b in builds):
            assert json.loads((root / "index.json").read_bytes()) == expected
            assert len(load_index(root / "index.json")) == 3
            loads += 1
        for build in builds:
            assert build.returncode == 0, build.stderr.read() if build.stderr else ""
    assert loads > 0 and _debris(root) == []


# -- vstream index -o --------------------------------------------------------------------------------
def test_index_refuses_to_write_over_a_camera_file(dataset: Path, tmp_path: Path) -> None:
    root = _copy(dataset, tmp_path)
    camera = root / "videos" / "scene-0000" / "CAM_BACK.mp4"
    before = camera.read_bytes()
    done = _vstream("index", str(root), "-o", str(camera), "-q", "--force")
    assert done.returncode == 2
    assert f"index output '{camera}' is inside clip folder '{camera.parent}' of the dataset" in done.stderr
    assert camera.read_bytes() == before and sorted(p.name for p in camera.parent.iterdir()) == [
        "CAM_BACK.mp4",
        "CAM_BACK_LEFT.mp4",
    ]
    with pytest.raises(ConfigurationError, match="is inside clip folder"):
        build_index(root, output=camera.parent / "index.json", progress=False)


def test_index_refuses_a_file_that_is_not_an_index_unless_forced(dataset: Path, tmp_path: Path) -> None:
    root = _copy(dataset, tmp_path)
    notes = tmp_path / "notes.json"
    notes.write_text("my notes\n")
    done = _vstream("index", str(root), "-o", str(notes), "-q")
    assert done.returncode == 2
    assert f"'{notes}' exists and is not an index written by `vstream index` (9 bytes)" in done.stderr
    assert "--force" in done.stderr and notes.read_text() == "my notes\n"
    assert not tables_path(notes).exists()
    foreign_tables = tables_path(tmp_path / "other.json")
    foreign_tables.write_bytes(b"not our tables")
    with pytest.raises(ConfigurationError, match=r"other\.tables\.bin' exists and is not frame tables"):
        build_index(root, output=tmp_path / "other.json", progress=False)
    with pytest.raises(ConfigurationError, match=r"has the extension of a camera file \('\.mp4'\)"):
        build_index(root, output=tmp_path / "out.mp4", progress=False)
    assert _vstream("index", str(root), "-o", str(notes), "-q", "--force").returncode == 0
    assert len(load_index(notes)) == 3
    # An index of ours (and its tables) is rebuilt without asking.
    assert _vstream("index", str(root), "-o", str(notes), "-q").returncode == 0


def test_a_preview_is_written_whole_and_an_unknown_suffix_is_named(tmp_path: Path) -> None:
    from PIL import Image

    from lightning_vstream.preview import Preview

    picture = Preview(Image.new("RGB", (8, 6), (200, 30, 30)), ())
    written = picture.save(tmp_path / "out" / "preview.png")
    with Image.open(written) as back:
        assert back.format == "PNG" and back.getpixel((3, 3)) == (200, 30, 30)
    with pytest.raises(ConfigurationError, match=r"preview path '.*preview\.pgnx': '\.pgnx' names no image format"):
        picture.save(tmp_path / "preview.pgnx")
    assert _debris(tmp_path / "out") == [] and not (tmp_path / "preview.pgnx").exists()
