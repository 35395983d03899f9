"""The outcome table (runner/outcomes.py) against what reads outcomes and exit codes elsewhere."""

from __future__ import annotations

import re

import pytest

from runner.cli.main import EXIT_CODES
from runner.errors import LeaseLost, StoreUnavailable, Terminated
from runner.outcomes import (
    FAILED,
    LEASE_LOST,
    OUTCOMES,
    REPLACED,
    SKIPPED_HELD,
    TERMINATED,
    UNAVAILABLE,
    exit_code,
    is_failure,
    is_skip,
)


def test_each_outcome_is_a_skip_a_success_or_a_failure() -> None:
    for name, row in OUTCOMES.items():
        assert not (row.skip and row.success), name
    failures = {name for name in OUTCOMES if is_failure(name)}
    assert failures == {FAILED, LEASE_LOST, TERMINATED, UNAVAILABLE, REPLACED}
    assert not any(is_skip(name) for name in failures)


def test_serve_counts_as_failures_what_the_table_does() -> None:
    # serve keeps its own set (not yet read from the table): it must not drift from it.
    from runner.serve.snapshot import FAILURES  # noqa: PLC0415

    assert {name for name in OUTCOMES if is_failure(name)} == FAILURES


def test_an_outcome_s_fixed_exit_code_is_its_error_s() -> None:
    assert exit_code(LEASE_LOST) == LeaseLost.exit_code
    assert exit_code(TERMINATED) == Terminated.exit_code
    assert exit_code(UNAVAILABLE) == StoreUnavailable.exit_code


def test_every_fixed_exit_code_is_in_the_cli_help() -> None:
    listed = {int(code) for code in re.findall(r"^  (\d+) ", EXIT_CODES, re.MULTILINE)}
    fixed = {row.exit_code for row in OUTCOMES.values() if row.exit_code is not None}
    assert fixed <= listed


@pytest.mark.parametrize("outcome", [FAILED, SKIPPED_HELD])
def test_an_outcome_without_a_fixed_code_takes_the_one_given(outcome: str) -> None:
    assert exit_code(outcome, 7) == 7
    with pytest.raises(ValueError, match="no fixed exit code"):
        exit_code(outcome)
