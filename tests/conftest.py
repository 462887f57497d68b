"""Shared fixtures: small stamped datasets generated once per session; the `cuda` and `nvdriver` markers.

`nvdriver` tests run the real PyNvVideoCodec over the fake NVIDIA driver (``../shared/tools/fake-nvdriver``
builds it). The dynamic loader reads ``LD_LIBRARY_PATH`` only when a process starts, so when
``VSTREAM_FAKE_NVDRIVER`` names the folder holding the built libraries, this session runs every
selected `nvdriver` test in one child pytest process started with that library path (and
``VSTREAM_NVDEC_HOST_MEMORY=1``, under which the project views the fake's "device" memory as host
memory), and reports each test's own result here. Without the variable they are skipped, saying why.

Torch ops run on one thread (``OMP_NUM_THREADS=1`` unless set outside), in this process and the ones it
starts: on tiny frames a second thread saves nothing and spins, which costs the suite a fifth of its CPU time.

The DDP tests' fits run in one two-rank DDP session (`ddp_session`, tests/_ddp.py). A test that
leaves a DataLoader iterator with workers unfinished must end it itself (read it to the end, or
``close()`` a generator): one that the garbage collector finds instead has its queues closed
before its workers hear that they should stop, and torch then waits 5 s for each worker.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Set before torch is imported (see the module docs); a value set outside wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest

from lightning_vstream.demos.synth import write_dataset

if TYPE_CHECKING:
    from tests._ddp import DdpSession
    from tests._s3 import S3TestServer


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip `cuda` tests without a GPU (VSTREAM_REQUIRE_CUDA=1 makes that a failure), `nvdriver` tests without the driver."""
    if "nvdriver" in item.keywords:
        folder, reason = nvdriver_folder()
        if folder is None:
            pytest.skip(reason)
    if "cuda" not in item.keywords or _cuda_available():
        return
    if os.environ.get("VSTREAM_REQUIRE_CUDA", "") not in ("", "0"):
        pytest.fail("VSTREAM_REQUIRE_CUDA=1 is set but CUDA is not available", pytrace=False)
    pytest.skip("needs CUDA and PyNvVideoCodec")


# -- nvdriver: the real PyNvVideoCodec over the fake NVIDIA driver, in one child process ------------
FAKE_NVDRIVER_ENV = "VSTREAM_FAKE_NVDRIVER"
_CHILD_REPORTS_ENV = "VSTREAM_NVDRIVER_REPORTS"  # set in the child: where it writes its test reports
_FAKE_LIBS = ("libcuda.so.1", "libnvcuvid.so.1", "libnvidia-encode.so.1")
_CHILD_TIMEOUT = 900.0


#: Where the fake driver's sources lie: beside the repository (never inside it), as `.ci/run` looks for them.
FAKE_NVDRIVER_SOURCES = Path(__file__).resolve().parents[2] / "shared" / "tools" / "fake-nvdriver"


def fake_driver_hint(sources: Path = FAKE_NVDRIVER_SOURCES) -> str:
    """How to build the fake driver and run the `nvdriver` tests over it, from this checkout."""
    build = "bash ../shared/tools/fake-nvdriver/build /tmp/fake-nvdriver"
    run = f"{FAKE_NVDRIVER_ENV}=/tmp/fake-nvdriver python -m pytest -m nvdriver"
    if (sources / "build").is_file():
        return f"build the fake driver from the repository root with `{build}` (needs cc), then `{run}`"
    return (
        "the fake driver's sources are not part of the repository; with them beside it "
        f"(../shared/tools/fake-nvdriver) build it with `{build}` (needs cc), then `{run}`; "
        ".ci/run does both when the sources are there"
    )


def nvdriver_folder() -> tuple[Path | None, str]:
    """The folder of the built fake driver, or None and why the `nvdriver` tests cannot run."""
    value = os.environ.get(FAKE_NVDRIVER_ENV, "")
    if not value:
        return None, f"{FAKE_NVDRIVER_ENV} is not set; {fake_driver_hint()}"
    folder = Path(value)
    missing = [lib for lib in _FAKE_LIBS if not (folder / lib).is_file()]
    if missing:
        return None, f"{FAKE_NVDRIVER_ENV}={value!r} does not hold the built fake driver (missing {missing}); " + (
            fake_driver_hint()
        )
    if importlib.util.find_spec("PyNvVideoCodec") is None:
        return None, "PyNvVideoCodec is not installed (pip install pynvvideocodec==2.2.4)"
    return folder, ""


def _is_nvdriver_child() -> bool:
    return bool(os.environ.get(_CHILD_REPORTS_ENV))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """Report a delegated `nvdriver` test from the child run (started at the first such test)."""
    if "nvdriver" not in item.keywords or _is_nvdriver_child() or nvdriver_folder()[0] is None:
        return None
    reports = _nvdriver_reports(item.session)
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    got = reports["tests"].get(item.nodeid)
    if not got:
        got = [_lost_report(item, reports["tail"])]
    for data in got:
        report = item.config.hook.pytest_report_from_serializable(config=item.config, data=data)
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _lost_report(item: pytest.Item, tail: str) -> dict[str, Any]:
    report = pytest.TestReport(
        item.nodeid,
        item.location,
        {},
        "failed",
        f"the nvdriver child process gave no result for this test (it crashed or timed out). Its output ended:\n{tail}",
        "call",
    )
    return item.config.hook.pytest_report_to_serializable(config=item.config, report=report)  # type: ignore[no-any-return]


def _nvdriver_reports(session: pytest.Session) -> dict[str, Any]:
    """Run every selected `nvdriver` test in one child process (once); their serialised reports by node id."""
    cached = getattr(session, "_vstream_nvdriver_reports", None)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    folder, _ = nvdriver_folder()
    assert folder is not None
    nodeids = [i.nodeid for i in session.items if "nvdriver" in i.keywords]
    work = Path(tempfile.mkdtemp(prefix="vstream-nvdriver-"))
    results = work / "reports.jsonl"
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(folder.resolve()), env.get("LD_LIBRARY_PATH", "")) if p)
    env[_CHILD_REPORTS_ENV] = str(results)
    env["VSTREAM_NVDEC_HOST_MEMORY"] = "1"
    env["FAKE_LOG"] = str(work / "fake.log")  # the fake driver logs every call; tests read it (fake_log)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={work / 'tmp'}", *nodeids]
    tail = ""
    try:
        done = subprocess.run(
            cmd,
            cwd=session.config.rootpath,
            env=env,
            capture_output=True,
            text=True,
            timeout=_CHILD_TIMEOUT,
            check=False,
        )
        tail = (done.stdout + done.stderr)[-3000:]
    except subprocess.TimeoutExpired as err:
        tail = f"timed out after {_CHILD_TIMEOUT:g} s\n" + str(err.stdout or "")[-3000:]
    tests: dict[str, list[dict[str, Any]]] = {}
    if results.is_file():
        for line in results.read_text().splitlines():
            data = json.loads(line)
            tests.setdefault(data["nodeid"], []).append(data)
    shutil.rmtree(work, ignore_errors=True)
    cached = {"tests": tests, "tail": tail}
    session._vstream_nvdriver_reports = cached  # type: ignore[attr-defined]
    return cached


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """In the child: write each report of an `nvdriver` test for the parent session."""
    path = os.environ.get(_CHILD_REPORTS_ENV)
    if not path or "nvdriver" not in report.keywords:
        return
    config = _CONFIG[0]
    data = config.hook.pytest_report_to_serializable(config=config, report=report)
    with open(path, "a") as f:
        f.write(json.dumps(data) + "\n")


_CONFIG: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG.append(config)


@pytest.fixture
def kernel_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[bool], Any]]:
    """``fresh(interpret)``: the NV12 kernel module imported afresh, under Triton's interpreter or not.

    Triton reads ``TRITON_INTERPRET`` when a kernel is defined, i.e. when the module is imported, so
    the module is imported again for the test, and the one imported before is put back after it.
    """
    from lightning_vstream.decode.nvdec import nv12

    if not nv12.triton_available():
        pytest.skip("Triton is not installed")
    import lightning_vstream.decode as decode

    name = "lightning_vstream.decode.nvdec.nv12_kernel"
    before = sys.modules.get(name)

    def fresh(interpret: bool) -> Any:
        if interpret:
            monkeypatch.setenv("TRITON_INTERPRET", "1")
        else:
            monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        sys.modules.pop(name, None)
        return importlib.import_module(name)

    monkeypatch.setattr(nv12, "_checked", {})
    yield fresh
    if before is None:
        sys.modules.pop(name, None)
        decode.__dict__.pop("nv12_kernel", None)
    else:
        sys.modules[name] = before
        decode.nvdec.nv12_kernel = before  # type: ignore[attr-defined]


@pytest.fixture
def triton_interpreter(kernel_module: Callable[[bool], Any]) -> Any:
    """The NV12 kernel module imported afresh under Triton's interpreter (its kernel runs on CPU tensors)."""
    return kernel_module(True)


@pytest.fixture(scope="session")
def make_dataset(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory writing a stamped dataset (cached per parameter set); returns the index path."""
    cache: dict[tuple[Any, ...], Path] = {}

    def make(**kwargs: Any) -> Path:
        key = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in kwargs.items()))
        if key not in cache:
            root = tmp_path_factory.mktemp("dataset")
            cache[key] = write_dataset(root, **kwargs)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def small_index(make_dataset: Callable[..., Path]) -> Path:
    """Three clips of uneven length, two cameras, 64x48 H.264, GOP 6."""
    return make_dataset(clips=3, cameras=2, frames=[20, 13, 27], size=(64, 48), gop=6)


def batch_stamp_errors(batch: dict[str, Any]) -> list[str]:
    """Every (slot, camera) of a streaming batch whose stamp disagrees with its labels."""
    from lightning_vstream.demos.synth import clip_number, read_stamp

    errors = []
    frames = batch["frames"]
    for slot in range(frames.shape[0]):
        if "valid" in batch and not bool(batch["valid"][slot]):
            continue
        expected = (clip_number(batch["clip_id"][slot]), int(batch["frame_index"][slot]))
        for camera in range(frames.shape[1]):
            stamp = read_stamp(frames[slot, camera])
            if (stamp.clip, stamp.frame) != expected or stamp.camera != camera:
                errors.append(f"slot {slot} camera {camera}: expected clip/frame {expected}, read {stamp}")
    return errors


def cut_decodes(plans: Any, gop: int, cameras: int) -> int:
    """Frames decoded and not delivered because plan segments start mid-GOP (a cut of the training plan).

    A slot that starts a segment at frame ``f`` of a clip (not where its previous segment ended) decodes
    from the keyframe before it: ``f % gop`` frames per camera that no slot delivers. Files of a fixed GOP.
    """
    extra = 0
    for plan in plans if isinstance(plans, list | tuple) else [plans]:
        for slot in range(plan.batch_size):
            previous = None
            for segment in plan.slot_segments(slot):
                contiguous = previous is not None and (previous.clip, previous.frame(previous.length)) == (
                    segment.clip,
                    segment.start,
                )
                if not contiguous:
                    extra += segment.start % gop
                previous = segment
    return extra * cameras


@pytest.fixture
def assert_stamps() -> Callable[[dict[str, Any]], None]:
    """Asserts that every frame of a streaming batch carries the stamp its labels promise."""

    def check(batch: dict[str, Any]) -> None:
        errors = batch_stamp_errors(batch)
        assert not errors, "\n".join(errors[:10])

    return check


@pytest.fixture(scope="session")
def ddp_session(
    request: pytest.FixtureRequest, make_dataset: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> DdpSession:
    """The DDP tests' fits, run in one two-rank DDP session at the first request (see tests/_ddp.py)."""
    from tests._ddp import DdpSession, selected_jobs

    files = {Path(str(item.path)).name for item in request.session.items}
    return DdpSession(tmp_path_factory.mktemp("ddp"), selected_jobs(files), make_dataset)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3TestServer]:
    """moto's S3 server in a subprocess behind the fault-injecting proxy, for the whole session."""
    pytest.importorskip("moto.server", reason="remote-storage tests need moto[server] (the test extra)")
    from tests._s3 import S3TestServer

    server = S3TestServer(tmp_path_factory.mktemp("s3-server")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3(s3_server: S3TestServer) -> Iterator[S3TestServer]:
    """The session's S3 server with an empty request log and no faults, reset again afterwards."""
    s3_server.reset()
    try:
        yield s3_server
    finally:
        s3_server.reset()
