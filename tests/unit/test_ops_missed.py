"""The watchdog's arithmetic: which fire times after the last success should have run by now."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from runner.ops.state import Missed, missed_slots
from runner.schedule.slots import Schedule


def t(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp())


MIN = 60


@pytest.mark.parametrize(
    ("expr", "now", "tolerance_s", "covered", "held", "expected"),
    [
        # Ran its latest slot: nothing missed.
        ("0 3 * * *", "2026-03-10T12:00", 600, "2026-03-10T03:00", False,
         Missed(t("2026-03-10T03:00"), (), False)),
        # The 03:00 run may take until 03:10 (the tolerance): not missed at 03:09 ...
        ("0 3 * * *", "2026-03-10T03:09", 600, "2026-03-09T03:00", False,
         Missed(t("2026-03-09T03:00"), (), False)),
        # ... missed at 03:10.
        ("0 3 * * *", "2026-03-10T03:10", 600, "2026-03-09T03:00", False,
         Missed(t("2026-03-10T03:00"), (t("2026-03-10T03:00"),), False)),
        # Stopped three days ago: every slot since, oldest first.
        ("0 3 * * *", "2026-03-10T12:00", 600, "2026-03-07T03:00", False,
         Missed(t("2026-03-10T03:00"),
                (t("2026-03-08T03:00"), t("2026-03-09T03:00"), t("2026-03-10T03:00")), False)),
        # Held: the latest missed slot may be the one running now.
        ("0 3 * * *", "2026-03-10T03:30", 600, "2026-03-09T03:00", True,
         Missed(t("2026-03-10T03:00"), (), False, running=t("2026-03-10T03:00"))),
        ("0 3 * * *", "2026-03-10T03:30", 600, "2026-03-08T03:00", True,
         Missed(t("2026-03-10T03:00"), (t("2026-03-09T03:00"),), False,
                running=t("2026-03-10T03:00"))),
        # A success after its slot (a manual run's time) covers the slots up to it.
        ("*/5 * * * *", "2026-03-10T12:00", 5 * MIN, "2026-03-10T11:53:20", False,
         Missed(t("2026-03-10T11:55"), (t("2026-03-10T11:55"),), False)),
        # Capped listing.
        ("* * * * *", "2026-03-10T12:00", 0, "2026-03-10T11:00", False,
         Missed(t("2026-03-10T12:00"), tuple(t("2026-03-10T11:00") + MIN * i
                                             for i in range(1, 4)), True)),
        # Daylight saving: 02:30 Berlin does not exist on 2026-03-29, so it is not missed.
        ("30 2 * * *", "2026-03-29T12:00", 600, "2026-03-28T01:30", False,
         Missed(t("2026-03-28T01:30"), (), False)),
    ],
)  # fmt: skip
def test_missed_slots(  # noqa: PLR0917 - one parameter per table column
    expr: str,
    now: str,
    tolerance_s: float,
    covered: str,
    held: bool,
    expected: Missed,
) -> None:
    tz = "Europe/Berlin" if expr == "30 2 * * *" else "UTC"
    schedule = Schedule.parse(expr, tz, 0)
    got = missed_slots(
        schedule,
        now_s=t(now),
        tolerance_s=tolerance_s,
        covered_until_s=t(covered),
        held=held,
        limit=3,
    )
    assert got == expected
