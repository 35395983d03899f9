from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from helm_python.chart import Chart

from tests.chart.helpers import CHART_DIR


@pytest.fixture(scope="session")
def chart() -> Iterator[Chart]:
    with Chart.load(CHART_DIR) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def schemaless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chart]:
    """A copy of the chart without its schema, as `--skip-schema-validation` would render it:
    the templates' own refusals must hold without the schema."""
    copy = tmp_path_factory.mktemp("chart") / "cron-runner"
    shutil.copytree(CHART_DIR, copy)
    (copy / "values.schema.json").unlink()
    with Chart.load(copy) as loaded:
        yield loaded
