"""Fixtures of the queue tests: the worker processes a test starts, stopped after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.queue.helpers import WorkerProc


@pytest.fixture
def workers() -> Iterator[list[WorkerProc]]:
    started: list[WorkerProc] = []
    yield started
    for w in started:
        w.stop()
