from __future__ import annotations

from collections.abc import Iterator

import pytest
from helm_python.chart import Chart

from tests.chart.helpers import CHART_DIR


@pytest.fixture(scope="session")
def chart() -> Iterator[Chart]:
    with Chart.load(CHART_DIR) as loaded:
        yield loaded
