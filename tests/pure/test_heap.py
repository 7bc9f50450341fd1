"""A rank's heap frozen after start-up (nereus.runtime.worker.heap): garbage collected first,
what lives moved out of later collections' reach, what is created afterwards still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from nereus.runtime.worker.heap import settle


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # the rest of the test session as it was


def test_settle_collects_then_freezes(unfrozen: None) -> None:
    dead = _cycle()  # unreachable already: collected, not frozen
    alive = _Node()
    frozen, seconds = settle()
    assert dead() is None
    assert frozen == gc.get_freeze_count() > 0 and seconds >= 0.0
    assert not any(o is alive for o in gc.get_objects())  # out of the collector's reach
    later = _cycle()  # created after the freeze: still collected
    gc.collect()
    assert later() is None


def test_a_frozen_object_is_still_freed_by_reference_counting(unfrozen: None) -> None:
    kept = _Node()
    ref = weakref.ref(kept)
    settle()
    del kept
    assert ref() is None
