"""One two-rank CPU DDP session for every DDP test, started once per pytest session.

Starting two ranks costs three interpreters importing torch and Lightning, far more than the small
fits the tests run. So the DDP tests' fits (:data:`JOBS`) run one after another in the same two
processes (:func:`main`, run as a script): Lightning's launcher starts rank 1 at the first fit and
the later fits reuse the process group. Each job is one test's fit script (``tests/_ddp_*.py``,
called as ``main([INDEX, OUT_DIR, *args])``) writing ``rank<r>.json`` into its own folder; each test
reads its own job's results and asserts on them (:meth:`DdpSession.ranks`). The session runs the
jobs of the test files that the pytest run selected.

Usage (as a script): python _ddp.py JOBS.json   (a list of {"name", "script", "index", "out", "args"})
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
#: Seconds the whole session may take (every job's fit, plus starting both ranks).
TIMEOUT = 300.0


@dataclass(frozen=True)
class DdpJob:
    """A test's two-rank fit: its script, the stamped dataset it reads, extra script arguments."""

    test_file: str
    script: str
    dataset: Mapping[str, Any]
    args: Sequence[str] = field(default_factory=tuple)


_EIGHT_CLIPS = {"clips": 8, "cameras": 2, "frames": [9, 7, 11, 8, 10, 6, 9, 12], "size": (64, 48), "gop": 4}

#: Every DDP test's fit, by name. Datasets come from the session's ``make_dataset`` (cached by arguments).
JOBS: dict[str, DdpJob] = {
    "stream-sampler": DdpJob("test_lightning_stream.py", "_ddp_stream.py", _EIGHT_CLIPS, ("1",)),
    "stream-own-sampler": DdpJob("test_lightning_stream.py", "_ddp_stream.py", _EIGHT_CLIPS, ("0",)),
    "stream-engine": DdpJob("test_engine_lightning.py", "_ddp_stream.py", _EIGHT_CLIPS, ("1", "threads")),
    "clips": DdpJob(
        "test_clip_datamodule.py",
        "_ddp_clips.py",
        {"clips": 3, "cameras": 2, "frames": [12, 9, 14], "size": (64, 48), "gop": 4},
    ),
    "annotations": DdpJob(
        "test_annotations_stream.py",
        "_ddp_annotations.py",
        {"clips": 4, "cameras": 2, "frames": [10, 7, 12, 9], "size": (96, 64), "gop": 5, "annotations": True},
    ),
    "resume-skip": DdpJob(
        "test_resume_plan.py",
        "_ddp_resume.py",
        {"clips": 6, "cameras": 2, "frames": [12, 9, 14, 10, 11, 13], "size": (64, 48), "gop": 4},
    ),
    "throughput": DdpJob(
        "test_callbacks.py",
        "_ddp_throughput.py",
        {"clips": 4, "cameras": 2, "frames": [5, 9, 7, 6], "size": (64, 48), "gop": 4},
    ),
}


class DdpSession:
    """Runs the selected :data:`JOBS` in one two-rank DDP session at the first request; hands out results."""

    def __init__(self, work: Path, names: Sequence[str], make_dataset: Any) -> None:
        self.work = work
        self.names = list(names)
        self.make_dataset = make_dataset
        self._output: str | None = None

    def ranks(self, name: str) -> list[dict[str, Any]]:
        """What each rank of job ``name`` wrote (``rank0.json``, ``rank1.json``); fails the test with the run's output when missing."""
        import pytest

        if name not in self.names:
            self.names.append(name)  # selected by a run that did not collect its file: run it now
            self._output = None
        if self._output is None:
            self._output = self._run()
        out = self.work / name
        error = sorted(out.glob("rank*.error"))
        if error:
            pytest.fail(f"DDP job {name!r} raised:\n{error[0].read_text()[-3000:]}", pytrace=False)
        files = [out / f"rank{r}.json" for r in range(2)]
        if not all(f.is_file() for f in files):
            pytest.fail(
                f"DDP job {name!r} wrote no results; the DDP session's output ended:\n{self._output}", pytrace=False
            )
        return [json.loads(f.read_text()) for f in files]

    def _run(self) -> str:
        run = self.work / f"run{len(list(self.work.glob('run*')))}"
        run.mkdir(parents=True)
        jobs = []
        for name in self.names:
            job = JOBS[name]
            out = self.work / name
            out.mkdir(exist_ok=True)
            for stale in out.iterdir():
                stale.unlink()
            index = self.make_dataset(**job.dataset)
            jobs.append(
                {"name": name, "script": job.script, "index": str(index), "out": str(out), "args": list(job.args)}
            )
        (run / "jobs.json").write_text(json.dumps(jobs))
        # A rank environment left by an outer launcher would make Lightning join it instead of starting rank 1.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE"))}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
        try:
            done = subprocess.run(
                [sys.executable, str(HERE / "_ddp.py"), str(run / "jobs.json")],
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                env=env,
                cwd=run,
                check=False,
            )
            output = f"exit code {done.returncode}\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}"
        except subprocess.TimeoutExpired as err:
            output = f"timed out after {TIMEOUT:g} s\n{str(err.stderr or '')[-3000:]}"
        return output


def ddp_trainer(**kwargs: Any) -> Any:
    """A two-rank CPU DDP ``Trainer`` with no logger, checkpoints, progress bar or model summary; ``kwargs`` add to it."""
    import lightning.pytorch as pl

    options: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 2,
        "strategy": "ddp",
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    return pl.Trainer(**{**options, **kwargs})


def selected_jobs(test_files: set[str]) -> list[str]:
    """The jobs of the given test files (base names), in :data:`JOBS` order."""
    return [name for name, job in JOBS.items() if job.test_file in test_files]


def main(argv: list[str] | None = None) -> None:
    """Run every job of JOBS.json in this rank, in order; a job that raises writes ``rank<r>.error`` and ends the run."""
    import torch

    argv = sys.argv[1:] if argv is None else argv
    jobs = json.loads(Path(argv[0]).read_text())
    try:
        for job in jobs:
            spec = importlib.util.spec_from_file_location(
                f"ddp_job_{job['name'].replace('-', '_')}", HERE / job["script"]
            )
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            try:
                module.main([job["index"], job["out"], *job["args"]])
            except BaseException:
                rank = os.environ.get("LOCAL_RANK", "0")
                (Path(job["out"]) / f"rank{rank}.error").write_text(traceback.format_exc())
                raise
    finally:
        if torch.distributed.is_initialized():  # stop gloo's threads before the interpreter exits
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
