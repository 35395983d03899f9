"""The run's decisions (runner/run/policy.py) from their inputs alone: settings, a slot, a time,
and the acquire script's replies, scripted here. The same decisions against a real Redis are in
tests/integration/test_execution.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from runner.config.settings import load_settings
from runner.errors import Terminated
from runner.lease.scripts import (
    BUFFERED,
    GAVE_UP,
    PREEMPTING,
    SUPERSEDED,
    Acquired,
    AcquireResult,
    Held,
    Paused,
    SlotDone,
    new_token,
)
from runner.logs import run_logger
from runner.outcomes import PAUSED, SKIPPED_DONE, SKIPPED_HELD, SKIPPED_STALE, TOO_LATE
from runner.run.policy import (
    RECORDED,
    RECORDED_WITHOUT_SLOT,
    UNRECORDED,
    Look,
    Policy,
    Skip,
    overlap_wait_s,
)

HOUR_S = 3600
SLOT = 1_767_261_600  # 2026-01-01T10:00Z


def policy(**env: str) -> Policy:
    settings = load_settings(
        {"CRON_RUNNER_LEASE_TTL": "1s", **{f"CRON_RUNNER_{k}": v for k, v in env.items()}}
    )
    return Policy(settings, run_logger("t", "h"))


def scripted(*replies: AcquireResult) -> Look:
    """A look that answers as the acquire script would, in this order."""
    return replay(iter(replies))


def replay(answers: Iterator[AcquireResult], finals: list[bool] | None = None) -> Look:
    """A look that answers from ``answers``, noting in ``finals`` whether each was the last."""

    def look(*, final: bool = False) -> AcquireResult:
        if finals is not None:
            finals.append(final)
        return next(answers)

    return look


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
    got = policy(HELD_WAIT="300ms").decide(Held(token, 1000), SLOT, replay(running_down), never)
    assert isinstance(got, Skip)
    assert (got.outcome, got.exit_code) == (SKIPPED_HELD, 75)


def test_a_stop_request_ends_the_wait() -> None:
    token = new_token("other", SLOT)
    with pytest.raises(Terminated):
        policy().decide(Held(token, 900), SLOT, scripted(), lambda: True)


# -- overlap: buffer-one and replace wait for their turn; paused ---------------------------------


def waiting(note: str, held_slot: int = SLOT - 300) -> Held:
    return Held(new_token("other", held_slot), 5000, note)


@pytest.mark.parametrize("note", [BUFFERED, PREEMPTING])
def test_a_waiting_slot_runs_when_the_look_gives_it_the_lease(note: str) -> None:
    finals: list[bool] = []
    answers: Iterator[AcquireResult] = iter([waiting(note), waiting(note), Acquired(9)])
    got = policy(OVERLAP="buffer-one").decide(waiting(note), SLOT, replay(answers, finals), never)
    assert got == Acquired(9)
    assert finals == [False, False, False]


def test_a_waiting_slot_superseded_by_a_later_one_is_skipped_the_script_recorded_it() -> None:
    got = policy(OVERLAP="buffer-one").decide(
        waiting(BUFFERED), SLOT, scripted(waiting(SUPERSEDED)), never
    )
    assert isinstance(got, Skip)
    assert (got.outcome, got.exit_code, got.journal) == (SKIPPED_HELD, 0, UNRECORDED)
    assert got.reason == "superseded: a later slot waits for the lease or took it"


def test_the_last_look_of_an_overlap_wait_is_final_and_a_lease_still_held_skips() -> None:
    finals: list[bool] = []

    def look(*, final: bool = False) -> AcquireResult:
        finals.append(final)
        return waiting(GAVE_UP if final else BUFFERED)

    p = policy(OVERLAP="buffer-one", OVERLAP_WAIT="250ms")
    got = p.decide(waiting(BUFFERED), SLOT, look, never)
    assert isinstance(got, Skip)
    assert (got.outcome, got.exit_code) == (SKIPPED_HELD, 0)
    assert got.reason is not None and "CRON_RUNNER_OVERLAP_WAIT" in got.reason
    assert finals[-1] is True
    assert not any(finals[:-1])
    assert 2 <= len(finals) <= 4  # a look per poll (ttl/12 here), not a busy loop


def test_a_waiting_slot_whose_own_slot_took_the_lease_waits_for_that_holder() -> None:
    mine = Held(new_token("replica", SLOT), 900)
    answers = iter([mine, Held(mine.token, 1000)])
    got = policy(OVERLAP="replace").decide(waiting(PREEMPTING), SLOT, replay(answers), never)
    assert got == Skip(SKIPPED_HELD, 0, "running at replica", logged=True)


def test_a_stop_request_ends_an_overlap_wait() -> None:
    with pytest.raises(Terminated):
        policy(OVERLAP="buffer-one").decide(waiting(BUFFERED), SLOT, scripted(), lambda: True)


def test_a_paused_task_is_skipped_exit_0() -> None:
    paused = Paused(note="migration", by="ops", at=None, until=SLOT + 3600.0)
    got = policy().decide(paused, SLOT, scripted(), never)
    assert isinstance(got, Skip)
    assert (got.outcome, got.exit_code, got.journal) == (PAUSED, 0, UNRECORDED)
    assert got.reason == "paused by ops until 2026-01-01T11:00:00Z: migration"


@pytest.mark.parametrize(
    ("env", "wait_s"),
    [
        ({"OVERLAP": "replace"}, 1 + 25 + 10),  # TTL + shutdown grace + 10 s
        ({"OVERLAP": "replace", "SHUTDOWN_GRACE": "5s"}, 1 + 5 + 10),
        ({"OVERLAP": "buffer-one", "SCHEDULE": "*/5 * * * *"}, 300),  # the shortest gap
        ({"OVERLAP": "buffer-one", "SCHEDULE": "0 9,17 * * *"}, 8 * HOUR_S),
        ({"OVERLAP": "buffer-one", "SCHEDULE": "@every 1h", "JOB_NAME": "j-1"}, 36),
        ({"OVERLAP": "buffer-one"}, 36),  # no schedule: as replace
        ({"OVERLAP": "buffer-one", "OVERLAP_WAIT": "90s"}, 90),
    ],
)
def test_the_overlap_wait_defaults(env: dict[str, str], wait_s: float) -> None:
    assert overlap_wait_s(policy(**env).settings) == wait_s
