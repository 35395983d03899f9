"""The journal's schema, field by field and in order: the previous release reads these records
and state hashes, so a change here is a change of the contract between releases."""

from __future__ import annotations

from runner.lease import journal

AT_S = 1_767_261_600.123456
SLOT = 1_767_261_600


def test_a_runs_record() -> None:
    record = journal.run_record(slot=SLOT, holder="pod-1", fence=42, outcome="failed",
                                exit_code=3, started_at_s=AT_S - 9.5, duration_ms=9500,
                                error="boom " * 200)  # fmt: skip
    assert list(record.items()) == [
        ("slot", SLOT), ("holder", "pod-1"), ("fence", 42), ("outcome", "failed"),
        ("exit_code", 3), ("started_at", "1767261590.623"), ("duration_ms", 9500),
        ("error", ("boom " * 200)[:500]),
    ]  # fmt: skip
    manual = journal.run_record(slot=None, holder="pod-1", fence=42, outcome="ran", exit_code=0,
                                started_at_s=AT_S, duration_ms=1)  # fmt: skip
    assert list(manual) == ["slot", "holder", "fence", "outcome", "exit_code", "started_at",
                            "duration_ms"]  # fmt: skip
    assert manual["slot"] == ""


def test_a_workers_record_adds_the_message_id_before_the_error() -> None:
    record = journal.run_record(slot=None, holder="pod-1#0", fence=7, outcome="failed",
                                exit_code=1, started_at_s=AT_S, duration_ms=5, error="E: x",
                                message_id="")  # fmt: skip
    assert list(record)[-2:] == ["message_id", "error"]
    assert record["message_id"] == ""


def test_a_runs_state_for_each_summary() -> None:
    def state(outcome: str, code: int = 0) -> list[tuple[str, object]]:
        return list(journal.state(outcome=outcome, exit_code=code, fence=42, holder="pod-1",
                                  slot=SLOT, at_s=AT_S, duration_ms=9500, schedule="0 3 * * *",
                                  timezone="Europe/Berlin", max_runtime_s=90).items())  # fmt: skip

    head = [("last_run_at", "1767261600.123"), ("last_outcome", "ran"), ("last_fence", 42),
            ("last_holder", "pod-1"), ("last_slot", SLOT), ("schedule", "0 3 * * *"),
            ("timezone", "Europe/Berlin"), ("max_runtime_ms", 90000)]  # fmt: skip
    assert state("ran") == [*head, ("last_success_at", "1767261600.123"),
                            ("last_success_duration_ms", 9500), ("last_success_slot", SLOT)]  # fmt: skip
    head[1] = ("last_outcome", "enqueued")
    assert state("enqueued") == [*head, ("last_enqueued_at", "1767261600.123"),
                                 ("last_enqueued_duration_ms", 9500),
                                 ("last_enqueued_slot", SLOT)]  # fmt: skip
    head[1] = ("last_outcome", "lease_lost")
    assert state("lease_lost", 75) == [*head, ("last_failure_at", "1767261600.123"),
                                       ("last_failure_duration_ms", 9500),
                                       ("last_failure_slot", SLOT),
                                       ("last_failure_outcome", "lease_lost"),
                                       ("last_failure_exit_code", 75)]  # fmt: skip


def test_a_workers_state_leaves_the_schedule_to_the_run() -> None:
    fields = journal.state(outcome="failed", exit_code=1, fence=7, holder="pod-1#0", slot=None,
                           at_s=AT_S, duration_ms=5)  # fmt: skip
    assert list(fields) == ["last_run_at", "last_outcome", "last_fence", "last_holder",
                            "last_failure_at", "last_failure_duration_ms",
                            "last_failure_outcome", "last_failure_exit_code"]  # fmt: skip


def test_an_admins_record() -> None:
    assert list(journal.admin_record("unlocked", "ops", AT_S).items()) == [
        ("outcome", "unlocked"), ("holder", "ops"), ("started_at", "1767261600.123"),
        ("duration_ms", 0),
    ]  # fmt: skip
