"""Differential test: the runner's slots against the Kubernetes CronJob controller's own code,
``k8s.io/kubernetes`` v1.36.3 ``pkg/controller/cronjob`` (oracles/cronjob).

Random CronJobs (seeded; CRON_ORACLE_SEED picks another seed): a schedule from the robfig
test's generator, in a zone of its list or in none (the controller's own zone, UTC here), a
name, a creation time, a last schedule time or none, a ``startingDeadlineSeconds`` or none; and
an instant ``now`` at which the controller syncs it: on time, late, at the deadline's edge, or
anywhere from 2016 to 2100. For each, the controller's code answers with its
``mostRecentScheduleTime`` (with the starting deadline, as ``syncCronJob`` asks it), the
``getJobName`` of that time, and the Job that ``syncCronJob`` creates at ``now``, if any.

a. The Job name. For every most recent schedule time T, the runner in the Job's pod, given the
   name the controller gives T (``CRON_RUNNER_JOB_NAME``, with ``CRON_RUNNER_CRONJOB_NAME`` and
   without), and for a Job the controller created also its scheduled-timestamp annotation,
   schedule and zone (the chart's environment), takes the slot T. An ``@every`` time falls on
   any second and a name holds minutes only (``getTimeHashInMinutes``): its slot is T's minute.

b. The server-side slot. Where ``syncCronJob`` starts a Job now for T (T within
   ``startingDeadlineSeconds``; more than 100 missed start times only add a
   ``TooManyMissedTimes`` event in v1.36, they do not stop the start), a runner started outside
   Kubernetes at the same instant with the same schedule, zone and starting deadline
   (``CRON_RUNNER_SCHEDULE``, ``_TIMEZONE``, ``_STARTING_DEADLINE``) resolves the slot T
   (``resolve_slot``) and runs it (not too late). The comparable notion is the runner's slot with
   a skew tolerance of 0: one clock, read at the instant the controller read it. With the
   default tolerance (checked on a quarter of the cases) the runner's slot is instead the next
   fire time when that is within the tolerance of now (a runner whose clock is behind the
   trigger's); T otherwise.

Where the two differ, the difference must be one of robfig's documented DST faults (as in
test_robfig_oracle.py: an offset change at local midnight or off the hour within a day of
the times involved), which the controller inherits from robfig/cron. Anything else fails.

The converse, where a runner at ``now`` would run a slot after the CronJob's creation and last
schedule time within the same deadline, is counted (the figures at the end of the session): the
controller's own shortcuts make it start nothing in a few such cases, which is a fact about the
controller to know, not a fault of the runner.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from runner.config.settings import load_settings
from runner.logs import run_logger
from runner.run.policy import Policy
from runner.schedule import cron as cronexpr
from runner.schedule.jobname import slot_from_job_name
from runner.schedule.markers import resolve_slot
from runner.schedule.slots import Schedule
from tests.schedule import test_robfig_oracle as robfig_test
from tests.schedule.conftest import Oracle

# The first run builds the controller's oracle: minutes on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(1800)

SEED = int(os.environ.get("CRON_ORACLE_SEED", "13"))
SCHEDULES = 330  # (expression, zone) pairs, about 3% of them @every
CASES_PER_SCHEDULE = 16
START_S = int(datetime(2016, 1, 1, tzinfo=UTC).timestamp())
END_S = int(datetime(2100, 1, 1, tzinfo=UTC).timestamp())
ZONES = (*robfig_test.ZONES, "")  # "": no timeZone, the controller's local zone (UTC here)
DEADLINES = (1, 10, 30, 59, 60, 61, 100, 200, 300, 3600, 86_400)
WORDS = ("backup", "report", "sync", "x", "a1", "nightly", "v2", "db")


@dataclass
class CronJob:
    name: str
    expr: str
    zone: str
    every: bool
    created_s: int
    last_s: int | None
    deadline_s: int | None
    now_ms: int

    def request(self) -> dict[str, object]:
        return {
            "name": self.name,
            "schedule": self.expr,
            "zone": self.zone,
            "created_s": self.created_s,
            "last_s": self.last_s,
            "deadline_s": self.deadline_s,
            "now_ms": self.now_ms,
        }

    @property
    def now_s(self) -> float:
        return self.now_ms / 1000

    @property
    def tz(self) -> str:
        return self.zone or "UTC"


# -- random CronJobs ----------------------------------------------------------------------------


def cronjob_name(rng: random.Random) -> str:
    """A DNS label of up to 52 characters; some end in digits, eight of them at times, as a
    controller's suffix does."""
    parts = [rng.choice(WORDS)]
    for _ in range(rng.choice([0, 0, 1, 2])):
        parts.append(
            rng.choice(
                [rng.choice(WORDS), str(rng.randrange(10)), str(rng.randrange(10**7, 10**8))]
            )
        )
    return "-".join(parts)[:52].strip("-")


def schedules(rng: random.Random) -> list[tuple[str, str, bool]]:
    """(expression, zone, is @every): 5-field schedules and macros that fire, and @every."""
    found: list[tuple[str, str, bool]] = []
    while len(found) < SCHEDULES:
        expr = robfig_test.expression(rng, valid=True)
        zone = rng.choice(ZONES)
        with contextlib.suppress(cronexpr.CronSyntaxError):
            spec = cronexpr.parse(expr)
            if isinstance(spec, cronexpr.Every):
                if spec.delay_s >= 1 and rng.random() < 0.5:
                    found.append((expr, zone, True))
            elif robfig_test.runner_schedule(expr, zone or "UTC") is not None:
                found.append((expr, zone, False))
    return found


def cronjobs(rng: random.Random, expr: str, zone: str, every: bool) -> list[CronJob]:
    schedule = None if every else Schedule.parse(expr, zone or "UTC", 0)
    jobs = []
    for _ in range(CASES_PER_SCHEDULE):
        deadline = rng.choice([None, None, *DEADLINES, rng.randrange(1, 10**7)])
        anchor = rng.randrange(START_S, END_S)
        fire = anchor if schedule is None else schedule.next_after(anchor)
        kind = rng.choice(["on time", "on time", "late", "edge", "anywhere"])
        if kind == "on time":  # the controller syncs about 100 ms after a fire time
            now_ms = fire * 1000 + rng.choice([0, 1, 100, 101, rng.randrange(10_000)])
        elif kind == "late":
            now_ms = fire * 1000 + rng.randrange(3 * 1000 * (deadline or 3600))
        elif kind == "edge" and deadline is not None:
            now_ms = (fire + deadline) * 1000 + rng.choice([-1000, -1, 0, 1, 1000])
        else:
            now_ms = anchor * 1000 + rng.randrange(1000)
        now_s = now_ms // 1000
        age = rng.choice([rng.randrange(1, 600), rng.randrange(600, 2 * 86_400),
                          rng.randrange(86_400, 3 * 366 * 86_400)])  # fmt: skip
        created = now_s - age
        last = None
        if rng.random() < 0.5:
            t = rng.randrange(created, now_s + 1)
            last = t if schedule is None else schedule.previous_at_or_before(t)
            last = last if last >= created else None
        name = cronjob_name(rng)
        jobs.append(CronJob(name, expr, zone, every, created, last, deadline, now_ms))
    return jobs


# -- the runner's answers -----------------------------------------------------------------------


def pod_slot(job: CronJob, job_name: str, timestamp: str | None) -> int | None:
    """The slot the runner takes in the Job's pod, with the chart's environment."""
    env = {
        "CRON_RUNNER_JOB_NAME": job_name,
        "CRON_RUNNER_CRONJOB_NAME": job.name,
        "CRON_RUNNER_SCHEDULE": job.expr,
        "CRON_RUNNER_TIMEZONE": job.tz,
    }
    if timestamp is not None:
        env["CRON_RUNNER_SCHEDULED_TIMESTAMP"] = timestamp
    return resolve_slot(load_settings(env), job.now_s)


def server_side(job: CronJob, tolerance: str | None) -> tuple[int | None, bool, float]:
    """The slot a runner outside Kubernetes resolves at ``now``, whether it runs it (not past
    its starting deadline), and its skew tolerance."""
    env = {"CRON_RUNNER_SCHEDULE": job.expr, "CRON_RUNNER_TIMEZONE": job.tz}
    if tolerance is not None:
        env["CRON_RUNNER_SKEW_TOLERANCE"] = tolerance
    if job.deadline_s is not None:
        env["CRON_RUNNER_STARTING_DEADLINE"] = f"{job.deadline_s}s"
    settings = load_settings(env)
    slot = resolve_slot(settings, job.now_s)
    skip = Policy(settings, run_logger("oracle", "oracle")).before_acquire(slot, job.now_s)
    return slot, skip is None, settings.slots.skew_tolerance_s


# -- differences --------------------------------------------------------------------------------


def iso(t: float | None, zone: str) -> str:
    return "none" if t is None else datetime.fromtimestamp(t, ZoneInfo(zone or "UTC")).isoformat()


def describe(job: CronJob, answer: dict[str, Any], **more: object) -> str:
    extra = ", ".join(
        f"{k} {iso(v, job.zone) if isinstance(v, int) else v}" for k, v in more.items()
    )
    return (
        f"{job.name} {job.expr!r} in {job.zone or 'no zone'}, created {iso(job.created_s, job.zone)}"
        f", last {iso(job.last_s, job.zone)}, deadline {job.deadline_s}, now "
        f"{iso(job.now_s, job.zone)}: controller {iso(answer['recent_s'], job.zone)} "
        f"(missed {answer['missed']}, job {(answer['job'] or {}).get('name')}, events "
        f"{answer['events']}), {extra}"
    )


def search_start(job: CronJob) -> float:
    """Where mostRecentScheduleTime starts robfig's Next: the last schedule time or the
    creation, or now less the starting deadline when that is later."""
    start: float = job.last_s if job.last_s is not None else job.created_s
    if job.deadline_s is not None:
        start = max(start, job.now_s - job.deadline_s)
    return start


def estimate_passes(job: CronJob, slot: int) -> bool:
    """Whether mostRecentScheduleTime's estimate of the missed start times (utils.go: the gap
    between the first two fire times after the search start, fitted into the time elapsed; the
    search resumes two gaps before the estimate's end) resumes after ``slot``, so that its
    loop never sees it. Computed with the runner's fire times, which are robfig's away from
    its DST faults."""
    schedule = Schedule.parse(job.expr, job.tz, 0)
    t1 = schedule.next_after(search_start(job))
    t2 = schedule.next_after(t1)
    if job.now_s < t2:
        return False
    gap = t2 - t1
    missed = int(job.now_s - t1) // gap + 1
    return t1 + (missed - 2) * gap >= slot


class Changes:
    """Offset changes of each zone from 2013 to 2100, found on first use."""

    def __init__(self) -> None:
        self._known: dict[str, list[int]] = {}

    def kinds(self, zone: str, low: float, high: float) -> set[str]:
        if not zone:
            return set()
        if zone not in self._known:
            self._known[zone] = robfig_test.offset_changes(
                zone,
                int(datetime(2013, 1, 1, tzinfo=UTC).timestamp()),
                int(datetime(2101, 1, 1, tzinfo=UTC).timestamp()),
            )
        return {
            robfig_test.change_kind(zone, c)
            for c in self._known[zone]
            if low - 86_400 <= c <= high + 86_400
        }


class Verdicts:
    """What each comparison found: counted classes, and the faults, which fail the test."""

    def __init__(self) -> None:
        self.tally = robfig_test.Tally()
        self.faults: dict[str, list[str]] = {}
        self._changes = Changes()

    def add(self, cls: str, example: str, zone: str | None = None) -> None:
        self.tally.add(cls, example, zone)

    def fault(self, cls: str, example: str) -> None:
        self.tally.add(cls, example)
        self.faults.setdefault(cls, []).append(example)

    def robfigs_dst(self, job: CronJob, *times: float | None) -> bool:
        """A difference where robfig's Next is known to go wrong (test_robfig_oracle.py): an
        offset change at local midnight or off the hour from a day before the controller's
        search start to a day after the times compared."""
        known = [t for t in times if t is not None]
        kinds = self._changes.kinds(job.zone, search_start(job), max(known, default=job.now_s))
        return bool(kinds & {"midnight", "off the hour"})


# -- the checks ---------------------------------------------------------------------------------

DST = "differs next to a midnight or off-the-hour offset change (robfig's DST faults)"


def check_name(job: CronJob, answer: dict[str, Any], verdicts: Verdicts) -> None:
    """a. The controller's name for T, read back by the runner, is T (T's minute for @every)."""
    recent = answer["recent_s"]
    if recent is None:
        return
    expected = recent // 60 * 60 if job.every else recent
    for cronjob in (job.name, None):
        got = slot_from_job_name(answer["recent_name"], cronjob)
        if got != expected:
            verdicts.fault("a: the name's slot is not the controller's time",
                           describe(job, answer, name=answer["recent_name"], runner=got))  # fmt: skip
    verdicts.add("a: names of T read back", answer["recent_name"])
    created = answer["job"]
    if created is not None:
        assert created["name"] == answer["recent_name"], describe(job, answer)
        got = pod_slot(job, created["name"], created["scheduled_timestamp"])
        if got != expected:
            verdicts.fault("a: the pod's slot is not the controller's time",
                           describe(job, answer, runner=got))  # fmt: skip
        verdicts.add("a: Jobs created, the pod's slot read back", created["name"])


def check_server_side(
    job: CronJob,
    answer: dict[str, Any],
    slot: int | None,
    runs: bool,
    verdicts: Verdicts,
    *,
    default_tolerance: bool,
) -> None:
    """b. Where the controller starts T now, the runner's own slot for now is T, and it runs;
    with ``default_tolerance``, also as a runner with the default skew tolerance."""
    recent = answer["recent_s"]
    if slot == recent and (runs or job.deadline_s is None):
        verdicts.add("b: the controller starts T, the runner claims and runs T", job.expr)
    elif verdicts.robfigs_dst(job, recent, slot):
        verdicts.add(f"b: {DST}", describe(job, answer, runner=slot, runs=runs), job.zone)
    else:
        verdicts.fault("b: the controller starts T, the runner does not claim or run T",
                       describe(job, answer, runner=slot, runs=runs))  # fmt: skip
    if not default_tolerance:
        return
    with_tolerance, _, tolerance = server_side(job, None)
    following = Schedule.parse(job.expr, job.tz, 0).next_after(job.now_s)
    wanted = following if following <= job.now_s + tolerance else recent
    if with_tolerance == wanted:
        verdicts.add("b: with the default skew tolerance, T or the next fire time as documented",
                     job.expr)  # fmt: skip
    elif verdicts.robfigs_dst(job, recent, slot, following):
        verdicts.add(f"b, default tolerance: {DST}", describe(job, answer, runner=with_tolerance))
    else:
        verdicts.fault("b: with the default skew tolerance, neither T nor the next fire time",
                       describe(job, answer, runner=with_tolerance, tolerance=tolerance))  # fmt: skip


def count_converse(job: CronJob, answer: dict[str, Any], slot: int, verdicts: Verdicts) -> None:
    """Where the runner runs S, the controller should start S, unless it started S before, or
    S is not after the CronJob's creation (the controller never starts such a time)."""
    if slot <= max(job.created_s, job.last_s or job.created_s):
        return
    if answer["job"] is not None and answer["recent_s"] == slot:
        verdicts.add("converse: the runner runs S, the controller starts S", job.expr)
    elif job.now_ms == (slot + (job.deadline_s or 0)) * 1000:
        verdicts.add(
            "converse: at now = S + startingDeadlineSeconds exactly, the runner runs S (as the "
            "controller's own tooLate check would), but mostRecentScheduleTime searches after "
            "now - deadline = S and finds nothing",
            describe(job, answer, runner=slot),
        )
    elif answer["recent_s"] is None and estimate_passes(job, slot):
        verdicts.add(
            "converse: the controller's estimate of the missed start times resumes its search "
            "past S, and it starts nothing",
            describe(job, answer, runner=slot),
        )
    elif verdicts.robfigs_dst(job, answer["recent_s"], slot):
        verdicts.add(f"converse: {DST}", describe(job, answer, runner=slot), job.zone)
    else:
        verdicts.fault("converse: the runner runs S, the controller does not start it",
                       describe(job, answer, runner=slot))  # fmt: skip


# -- the test -----------------------------------------------------------------------------------


def test_the_runner_takes_the_controllers_slots(
    controller: Oracle, figures: Callable[[str], None]
) -> None:
    rng = random.Random(SEED + 23)
    jobs: list[CronJob] = []
    answers: list[dict[str, Any]] = []
    # One schedule at a time, so that the runner's schedule cache serves all its cases.
    verdicts = Verdicts()
    for expr, zone, every in schedules(rng):
        batch = cronjobs(rng, expr, zone, every)
        batch_answers = controller([job.request() for job in batch])
        for i, (job, answer) in enumerate(zip(batch, batch_answers, strict=True)):
            assert not answer["hung"], describe(job, answer)
            check_name(job, answer, verdicts)
            if job.every:
                continue  # no server-side slot: the runner refuses @every outside a CronJob
            slot, runs, _ = server_side(job, "0")
            if answer["job"] is not None:
                # A quarter with the default tolerance: for a one-minute gap the runner lowers
                # it below half the gap, building the schedule twice each time (slow).
                check_server_side(job, answer, slot, runs, verdicts, default_tolerance=i % 4 == 0)
            if job.deadline_s is not None and runs and slot is not None:
                count_converse(job, answer, slot, verdicts)
        jobs += batch
        answers += batch_answers

    n_every = sum(job.every for job in jobs)
    figures(
        f"controller: {len(jobs)} CronJob syncs ({len(jobs) - n_every} cron, {n_every} @every; "
        f"{len({(j.expr, j.zone) for j in jobs})} schedule-zone pairs, seed {SEED}): "
        f"{sum(a['job'] is not None for a in answers)} Jobs created, "
        f"{sum('TooManyMissedTimes' in a['events'] for a in answers)} of them with "
        "TooManyMissedTimes"
    )
    tally = verdicts.tally
    for cls in sorted(tally.classes):
        figures(f"  {cls}: {tally.classes[cls]}")
        if DST in cls or "exactly" in cls or "estimate" in cls or cls in verdicts.faults:
            for example in tally.examples[cls][:2]:
                figures(f"    e.g. {example}")
    for key in sorted(tally.by_zone):
        figures(f"    {key}: {tally.by_zone[key]}")
    assert len(jobs) >= 5000
    assert tally.classes["b: the controller starts T, the runner claims and runs T"] > 3000
    assert not verdicts.faults, {cls: found[:5] for cls, found in verdicts.faults.items()}


def test_where_the_controller_starts_nothing_that_a_server_runs(controller: Oracle) -> None:
    """The two cases of docs/design.md, one each: the runner on a server runs the slot within
    the starting deadline, the controller's own code starts no Job."""
    at = int(datetime(2026, 3, 2, 14, 31, tzinfo=UTC).timestamp())
    cases = [
        # Missed start times of unevenly spaced fire times: the first two after the search
        # start are a minute apart, so the estimate resumes at 15:12, past 14:31.
        CronJob("report", "28-31 14,17 * * *", "UTC", False, at - 86_400, None, 3600,
                (at + 42 * 60 + 12) * 1000),
        # Now is the slot plus the deadline, to the millisecond.
        CronJob("report", "31 14 * * *", "UTC", False, at - 86_400, None, 60, (at + 60) * 1000),
    ]  # fmt: skip
    for job, answer in zip(cases, controller([job.request() for job in cases]), strict=True):
        assert (answer["recent_s"], answer["job"]) == (None, None), describe(job, answer)
        assert server_side(job, "0")[:2] == (at, True)
        assert estimate_passes(job, at) == (job.deadline_s == 3600)
