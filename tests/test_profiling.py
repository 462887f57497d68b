"""NVTX ranges: documented names, balanced push/pop, and silence when nvtx is missing."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
import torch

from lightning_vstream import profiling
from lightning_vstream.profiling import (
    NVTX_DOMAIN,
    RANGE_COLLATE,
    RANGE_COLOR_CONVERT,
    RANGE_DECODE,
    RANGE_DEMUX,
    RANGE_HANDOFF,
    RANGE_NAMES,
    RANGE_TRANSFORM,
    nvtx_available,
    nvtx_range,
)
from lightning_vstream.transforms import FrameTransform


class RecordingDomain:
    """Stands in for an nvtx domain and records what a profiler would see."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.registered: list[str] = []
        self.depth = 0

    def get_event_attributes(self, message: str, color: str) -> str:
        self.registered.append(message)
        return message

    def push_range(self, attributes: str) -> None:
        self.depth += 1
        self.events.append(("push", attributes))

    def pop_range(self) -> None:
        self.depth -= 1
        self.events.append(("pop", ""))


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    profiling._nvtx_domain.cache_clear()
    profiling._attributes.clear()
    yield
    profiling._nvtx_domain.cache_clear()
    profiling._attributes.clear()


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> RecordingDomain:
    domain = RecordingDomain()
    monkeypatch.setattr(profiling, "_nvtx_domain", lambda: domain)
    return domain


def test_names_are_the_documented_constants() -> None:
    assert NVTX_DOMAIN == "lightning_vstream"
    assert (RANGE_DEMUX, RANGE_DECODE, RANGE_COLOR_CONVERT, RANGE_HANDOFF, RANGE_TRANSFORM, RANGE_COLLATE) == (
        "vstream/demux",
        "vstream/decode",
        "vstream/color_convert",
        "vstream/handoff",
        "vstream/transform",
        "vstream/collate",
    )
    assert RANGE_NAMES == (
        RANGE_DEMUX,
        RANGE_DECODE,
        RANGE_COLOR_CONVERT,
        RANGE_HANDOFF,
        RANGE_TRANSFORM,
        RANGE_COLLATE,
    )
    for name in RANGE_NAMES:
        assert f"``{name}``" in (profiling.__doc__ or ""), f"{name} is not documented in the module docstring"


def test_ranges_nest_without_a_profiler() -> None:
    # The real nvtx package with no profiler attached.
    with nvtx_range(RANGE_COLLATE) as outer:
        with nvtx_range(RANGE_DECODE):
            with nvtx_range(RANGE_DEMUX):
                pass
    assert outer.name == RANGE_COLLATE

    @nvtx_range(RANGE_TRANSFORM)
    def twice(x: int) -> int:
        return 2 * x

    assert [twice(i) for i in range(3)] == [0, 2, 4]


def test_ranges_push_and_pop_in_order(recorder: RecordingDomain) -> None:
    with nvtx_range(RANGE_COLLATE):
        with nvtx_range(RANGE_DECODE):
            pass
        with nvtx_range(RANGE_DECODE):
            pass
    assert recorder.events == [
        ("push", RANGE_COLLATE),
        ("push", RANGE_DECODE),
        ("pop", ""),
        ("push", RANGE_DECODE),
        ("pop", ""),
        ("pop", ""),
    ]
    assert recorder.registered == [RANGE_COLLATE, RANGE_DECODE]  # registered once per name


def test_range_closes_when_the_body_raises(recorder: RecordingDomain) -> None:
    @nvtx_range(RANGE_DECODE)
    def broken() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        broken()
    assert recorder.depth == 0


def test_missing_nvtx_makes_ranges_no_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nvtx", None)
    assert nvtx_available() is False
    with nvtx_range(RANGE_DECODE):
        with nvtx_range(RANGE_DEMUX):
            pass


@pytest.mark.parametrize("name", ["", None, 3])
def test_rejects_names_that_are_not_strings(name: object) -> None:
    with pytest.raises(TypeError, match="non-empty string"):
        nvtx_range(name)  # type: ignore[arg-type]


def test_frame_transform_marks_its_work(recorder: RecordingDomain) -> None:
    frames = torch.zeros((2, 3, 8, 8), dtype=torch.uint8)
    FrameTransform()(frames)  # identity: nothing to mark
    assert recorder.events == []
    FrameTransform(resize=(4, 4))(frames)
    assert recorder.events == [("push", RANGE_TRANSFORM), ("pop", "")]


def test_repr() -> None:
    assert repr(nvtx_range(RANGE_DECODE)) == "nvtx_range('vstream/decode')"
