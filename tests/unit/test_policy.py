"""The run's decisions (runner/run/policy.py) from their inputs alone: settings, a slot, a time,
and the acquire script's replies, scripted here. The same decisions against a real Redis are in
tests/integration/test_execution.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from runner.config.settings import load_settings
from runner.errors import Terminated
from runner.lease.scripts import Acquired, AcquireResult, Held, SlotDone, new_token
from runner.logs import run_logger
from runner.outcomes import SKIPPED_DONE, SKIPPED_HELD, SKIPPED_STALE, TOO_LATE
from runner.run.policy import RECORDED, RECORDED_WITHOUT_SLOT, UNRECORDED, Policy, Skip

HOUR_S = 3600
SLOT = 1_767_261_600  # 2026-01-01T10:00Z


def policy(**env: str) -> Policy:
    settings = load_settings(
        {"CRON_RUNNER_LEASE_TTL": "1s", **{f"CRON_RUNNER_{k}": v for k, v in env.items()}}
    )
    return Policy(settings, run_logger("t", "h"))


def scripted(*replies: AcquireResult) -> Callable[[], AcquireResult]:
    """A look that answers as the acquire script would, in this order."""
    answers: Iterator[AcquireResult] = iter(replies)
    return lambda: next(answers)


def never() -> bool:
    return False


@pytest.mark.parametrize(("late_s", "too_late"), [(0, False), (300, False), (301, True)])
def test_a_schedule_slot_is_too_late_past_its_starting_deadline(
    late_s: int, too_late: bool
) -> None:
    skip = policy(SCHEDULE="0 * * * *").before_acquire(SLOT, SLOT + late_s)
    assert (skip is not None) == too_late
    if skip is not None:
        assert (skip.outcome, skip.exit_code, skip.journal) == (TOO_LATE, 0, RECORDED)


def test_a_cronjob_slot_is_never_too_late_its_controller_bounds_it() -> None:
    p = policy(SCHEDULE="0 * * * *", JOB_NAME=f"job-{SLOT // 60}")
    assert p.before_acquire(SLOT, SLOT + 2 * HOUR_S) is None


@pytest.mark.parametrize(
    ("age_s", "stale"), [(HOUR_S, False), (24 * HOUR_S, False), (24 * HOUR_S + 1, True)]
)
def test_a_cronjob_slot_is_stale_past_its_marker_retention(age_s: int, stale: bool) -> None:
    skip = policy(JOB_NAME=f"job-{SLOT // 60}").before_connect(SLOT, SLOT + age_s)
    assert (skip is not None) == stale
    if skip is not None:
        assert (skip.outcome, skip.journal) == (SKIPPED_STALE, RECORDED_WITHOUT_SLOT)


def test_acquired_runs_and_a_done_slot_is_skipped() -> None:
    p = policy()
    assert p.decide(Acquired(7), SLOT, scripted(), never) == Acquired(7)
    skip = p.decide(SlotDone("a", None), SLOT, scripted(), never)
    assert isinstance(skip, Skip)
    assert (skip.outcome, skip.exit_code, skip.journal, skip.logged) == (
        SKIPPED_DONE, 0, UNRECORDED, True
    )  # fmt: skip


@pytest.mark.parametrize("held_slot", [None, SLOT - 300])
def test_a_lease_held_for_another_slot_or_none_is_skipped_without_a_look(
    held_slot: int | None,
) -> None:
    held = Held(new_token("other", held_slot), 5000)
    assert policy().decide(held, SLOT, scripted(), never) == Skip(
        SKIPPED_HELD, 0, "held by other", logged=True
    )


def test_the_same_slot_s_holder_seen_renewing_is_running() -> None:
    token = new_token("other", SLOT)
    look = scripted(Held(token, 800), Held(token, 1000))
    assert policy().decide(Held(token, 900), SLOT, look, never) == Skip(
        SKIPPED_HELD, 0, "running at other", logged=True
    )


@pytest.mark.parametrize(
    ("second", "decided"),
    [(Acquired(9), Acquired(9)), (SlotDone("other", None), SKIPPED_DONE)],
)
def test_the_same_slot_s_holder_gone_is_taken_over_or_found_done(
    second: AcquireResult, decided: object
) -> None:
    token = new_token("other", SLOT)
    got = policy().decide(Held(token, 900), SLOT, scripted(Held(token, 500), second), never)
    assert (got.outcome if isinstance(got, Skip) else got) == decided


def test_the_same_slot_s_holder_neither_renewing_nor_gone_fails_the_run_after_the_wait() -> None:
    token = new_token("other", SLOT)
    running_down = (Held(token, ttl) for ttl in range(900, 0, -1))
    got = policy(HELD_WAIT="300ms").decide(
        Held(token, 1000), SLOT, lambda: next(running_down), never
    )
    assert isinstance(got, Skip)
    assert (got.outcome, got.exit_code) == (SKIPPED_HELD, 75)


def test_a_stop_request_ends_the_wait() -> None:
    token = new_token("other", SLOT)
    with pytest.raises(Terminated):
        policy().decide(Held(token, 900), SLOT, scripted(), lambda: True)
