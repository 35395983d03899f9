"""Differential test: the runner's schedules against robfig/cron v3.0.1 itself (issue 13).

Random expressions (seeded; CRON_ORACLE_SEED picks another seed) are given to the real
``cron.ParseStandard`` and to the runner: both must accept or refuse alike. Each accepted one is
then queried in several zones, at random instants and next to every offset change of the zone
from 2000 to 2040: the runner's next fire time must be robfig's ``Next``, and its previous fire
time ``p`` must be what robfig's ``Next`` reaches (``Next(p - 1s) == p`` and ``Next(p) > t``).

Where they differ, robfig's answer is checked against robfig's own fields (the oracle's
``match``): a disagreement is one of robfig's documented DST faults (runner/slots.py,
docs/design.md) only when robfig's answer goes backwards, is not a time its own fields match,
or skips a time its fields match, and only when an offset change at local midnight or off
the hour lies inside the search (from a day before the instant to a day after both answers). Anything else is a runner fault, and there must be none.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from runner.errors import ConfigError
from runner.schedule import cron as cronexpr
from runner.schedule.slots import Schedule
from tests.schedule.conftest import Oracle

SEED = int(os.environ.get("CRON_ORACLE_SEED", "13"))
ACCEPTANCE_EXPRESSIONS = 4000
FIRE_TIME_EXPRESSIONS = 330
ZONES_PER_EXPRESSION = 3
RANDOM_INSTANTS = 6

ZONES = (
    "UTC",
    "Europe/Berlin",
    "Europe/London",
    "Europe/Dublin",  # negative DST in tzdata
    "America/New_York",
    "America/Sao_Paulo",  # DST began at midnight until 2019
    "America/Havana",  # changes at midnight
    "America/Santiago",  # changes at 24:00
    "America/Asuncion",  # changes at midnight
    "America/St_Johns",  # -03:30 with DST
    "Asia/Tehran",  # changes at midnight until 2022
    "Asia/Beirut",  # changes at midnight
    "Asia/Gaza",  # changes at midnight, some years
    "Asia/Kolkata",  # +05:30
    "Asia/Kathmandu",  # +05:45
    "Africa/Casablanca",  # midnight changes until 2018, Ramadan changes since
    "Australia/Lord_Howe",  # a 30-minute DST change
    "Pacific/Chatham",  # +12:45 with DST
    "Pacific/Apia",  # skipped 30 December 2011
    "Antarctica/Troll",  # a two-hour DST change
    "Australia/Sydney",
)
START_S = int(datetime(2000, 1, 1, tzinfo=UTC).timestamp())
# robfig's Next never returns from before Apia's skipped day (30 December 2011) to after it:
# that is test_robfig_never_returns_across_apias_skipped_day. The main run starts after it.
APIA_START_S = int(datetime(2012, 1, 1, tzinfo=UTC).timestamp())
END_S = int(datetime(2040, 1, 1, tzinfo=UTC).timestamp())
NEAR_CHANGE_S = (-86_400, -3601, -3600, -1800, -61, -60, -1, 0, 1, 59, 60, 1799, 3600, 86_400)


# -- expressions --------------------------------------------------------------------------------

FIELDS = (  # (low, high, names)
    (0, 59, ()),
    (0, 23, ()),
    (1, 31, ()),
    (1, 12, ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")),
    (0, 6, ("sun", "mon", "tue", "wed", "thu", "fri", "sat")),
)


def _case(rng: random.Random, name: str) -> str:
    return "".join(c.upper() if rng.random() < 0.5 else c for c in name)


def _value(rng: random.Random, low: int, high: int, names: tuple[str, ...], valid: bool) -> str:
    if not valid and rng.random() < 0.5:
        return rng.choice([str(high + 1), str(low - 1) if low else "-1", "x", "", "L", "5L",
                           "1#2", "W", "99999999999999999999", "\u0661", "7" if high == 6 else "0"])  # fmt: skip
    v = rng.randint(low, high)
    roll = rng.random()
    if names and roll < 0.3:
        return _case(rng, names[v - low])
    if roll < 0.35:
        return "0" + str(v)
    if roll < 0.38:
        return "+" + str(v)
    return str(v)


def _item(rng: random.Random, field: int, valid: bool) -> str:
    low, high, names = FIELDS[field]
    span = high - low
    step = str(rng.choice([1, 1, 2, 3, 5, rng.randint(1, span + 3)]))
    a = rng.randint(low, high)
    b = rng.randint(a, high)

    def v(x: int | None = None) -> str:
        if x is None:
            return _value(rng, low, high, names, valid)
        return _case(rng, names[x - low]) if names and rng.random() < 0.3 else str(x)

    forms = [
        lambda: "*",
        lambda: "?",
        lambda: f"*/{step}",
        lambda: f"?/{step}",
        lambda: "*/1",
        v,
        lambda: f"{v(a)}-{v(b)}",
        lambda: f"{v(a)}-{v(a)}",  # a single-value range
        lambda: f"{v(a)}/{step}",  # N/step is N-max/step
        lambda: f"{v(a)}-{v(b)}/{step}",
        lambda: f"*-{v(b)}",  # robfig reads no further than the star
    ]
    if not valid:
        forms += [
            lambda: f"{v(b)}-{v(a)}",
            lambda: f"{v(a)}-{v(b)}-{v(b)}",
            lambda: f"{v(a)}/{step}/{step}",
            lambda: f"*/{rng.choice(['0', '', 'x', '-1', '-0', '+2'])}",
            lambda: f"{v(a)}-",
            lambda: f"/{step}",
        ]
    return rng.choice(forms)()


def _field(rng: random.Random, field: int, valid: bool) -> str:
    items = [_item(rng, field, valid) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
    if rng.random() < 0.05:
        items.insert(rng.randint(0, len(items)), "")  # empty list items are dropped
    return ",".join(items)


def expression(rng: random.Random, *, valid: bool) -> str:
    roll = rng.random()
    if roll < 0.06:
        macro = rng.choice(list(cronexpr.MACROS))
        if not valid:
            macro = rng.choice([macro.upper(), f" {macro}", f"{macro} ", "@reboot", "@"])
        return macro
    if roll < 0.1:
        duration = rng.choice(["1h", "90s", "1h30m", "500ms", "0", "-5m", "1.5h", ".5s", "1e3s",
                               "5", "5 m", "1us", "2µs", "3μs", "10ns", "1h1h", "", "+3m",
                               "9223372036s", "3000000h", "0.000000001s", "1.s", ".s", "-0", "00",
                               "2562047h47m16.854775807s", "2562047h47m16.854775808s",
                               "1.0000000000000000000000001h", "1.5µs", "5mµs"])  # fmt: skip
        return f"@every {duration}"
    fields = [_field(rng, i, valid) for i in range(5)]
    if not valid and rng.random() < 0.2:
        fields = fields[: rng.choice([0, 1, 4])] if rng.random() < 0.5 else [*fields, "0"]
    separators = [" ", " ", " ", "  ", "\t", "\u00a0"] if valid else [" ", "\u001f", "\u3000"]
    text = "".join(f + rng.choice(separators) for f in fields[:-1]) + (fields[-1] if fields else "")
    if rng.random() < 0.05:
        text = rng.choice([" ", "\t"]) + text + rng.choice(["", " ", "\n"])
    return text


# -- offset changes -----------------------------------------------------------------------------


def offset_changes(zone_name: str, start_s: int = START_S, end_s: int = END_S) -> list[int]:
    """Every change of UTC offset from 2000 to 2040 (or as given), to the second (probes 6 hours
    apart)."""
    zone = ZoneInfo(zone_name)

    def offset(t: int) -> float:
        delta = datetime.fromtimestamp(t, zone).utcoffset()
        assert delta is not None
        return delta.total_seconds()

    changes = []
    t = start_s
    while t < end_s:
        probe = t + 6 * 3600
        if offset(probe) != offset(t):
            low, high = t, probe
            while high - low > 1:
                mid = (low + high) // 2
                low, high = (mid, high) if offset(mid) == offset(t) else (low, mid)
            changes.append(high)
        t = probe
    return changes


def change_kind(zone_name: str, change: int) -> str:
    """'midnight' when the wall clock jumps from or to 00:00; 'off the hour' when it jumps from
    or to a time that is not a whole hour (Lord Howe's 02:00 -> 02:30, Chatham's 02:45 -> 03:45,
    St John's 00:01 -> 01:01 until 2011); else 'on the hour'."""
    zone = ZoneInfo(zone_name)
    before = datetime.fromtimestamp(change - 1, zone) + timedelta(seconds=1)  # the old offset
    after = datetime.fromtimestamp(change, zone)
    walls = {(before.hour, before.minute), (after.hour, after.minute)}
    if (0, 0) in walls:
        return "midnight"
    return "off the hour" if any(minute for _, minute in walls) else "on the hour"


# -- the comparison -----------------------------------------------------------------------------


class Tally:
    def __init__(self) -> None:
        self.classes: Counter[str] = Counter()
        self.by_zone: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}

    def add(self, cls: str, example: str, zone: str | None = None) -> None:
        self.classes[cls] += 1
        if zone is not None:
            self.by_zone[f"{cls} in {zone}"] += 1
        self.examples.setdefault(cls, [])
        if len(self.examples[cls]) < 5:
            self.examples[cls].append(example)


def iso(t: int | None, zone: ZoneInfo) -> str:
    return "none" if t is None else datetime.fromtimestamp(t, zone).isoformat()


def test_acceptance_matches_parse_standard(robfig: Oracle, figures: Callable[[str], None]) -> None:
    rng = random.Random(SEED)
    exprs = [expression(rng, valid=rng.random() < 0.6) for _ in range(ACCEPTANCE_EXPRESSIONS)]
    answers = robfig([{"expr": e, "zone": "UTC", "next": [], "match": []} for e in exprs])
    tally = Tally()
    for expr, answer in zip(exprs, answers, strict=True):
        try:
            parsed: cronexpr.CronSpec | cronexpr.Every | None = cronexpr.parse(expr)
        except cronexpr.CronSyntaxError:
            parsed = None
        if answer["ok"] != (parsed is not None):
            tally.add("acceptance differs", f"{expr!r}: robfig {answer.get('error') or 'accepts'}")
        elif isinstance(parsed, cronexpr.Every) and parsed.delay_s != answer["every_s"]:
            tally.add("@every delay differs", f"{expr!r}: {parsed.delay_s} != {answer['every_s']}")
        else:
            tally.add("accepted by both" if parsed is not None else "refused by both", expr)
    figures(
        f"acceptance: {len(exprs)} expressions (seed {SEED}): "
        + ", ".join(f"{k} {v}" for k, v in sorted(tally.classes.items()))
    )
    assert tally.classes["refused by both"] > 500
    assert tally.classes["accepted by both"] > 500
    wrong = {
        k: tally.examples[k]
        for k in ("acceptance differs", "@every delay differs")
        if k in tally.classes
    }
    assert not wrong, wrong


DOCUMENTED = ("robfig goes backwards", "robfig returns a time its fields do not match",
              "robfig skips a time its fields match")  # fmt: skip

Case = tuple[str, str, list[int]]  # expression, zone, instants


def fire_time_cases(rng: random.Random, changes: dict[str, list[int]]) -> list[Case]:
    """Each expression in a few zones at random instants; and next to every offset change of
    every zone, instants dealt round-robin over the expressions of that zone."""
    exprs: list[str] = []
    while len(exprs) < FIRE_TIME_EXPRESSIONS:
        expr = expression(rng, valid=True)
        with contextlib.suppress(cronexpr.CronSyntaxError):
            if isinstance(cronexpr.parse(expr), cronexpr.CronSpec):
                exprs.append(expr)
    cases: list[Case] = []
    for i, expr in enumerate(exprs):
        last = "UTC" if i % 4 else rng.choice(ZONES)
        for zone in [*rng.sample(ZONES[1:], ZONES_PER_EXPRESSION - 1), last]:
            start = APIA_START_S if zone == "Pacific/Apia" else START_S
            instants = [rng.randrange(start, END_S) for _ in range(RANDOM_INSTANTS)]
            cases.append((expr, zone, instants))
    for zone, zone_changes in changes.items():
        mine = [c for c in cases if c[1] == zone]
        for k, change in enumerate(zone_changes):
            for j, delta in enumerate(rng.sample(NEAR_CHANGE_S, 4)):
                mine[(4 * k + j) % len(mine)][2].append(change + delta)
    return cases


def runner_schedule(expr: str, zone: str) -> Schedule | None:
    """None for a schedule that never fires, which the runner refuses at start."""
    try:
        return Schedule.parse(expr, zone, 0)
    except ConfigError as exc:
        assert "ever matches" in str(exc), (expr, zone, exc)
        return None


def first_request(case: Case, schedule: Schedule | None) -> dict[str, object]:
    """robfig's Next at each instant t, and at p - 1 and p for the runner's previous fire time
    p; whether the runner's next and previous fire times are times robfig's fields match."""
    expr, zone, instants = case
    if schedule is None:
        return {"expr": expr, "zone": zone, "next": instants, "match": []}
    prevs = [schedule.previous_at_or_before(t) for t in instants]
    nexts = [schedule.next_after(t) for t in instants]
    return {
        "expr": expr, "zone": zone,
        "next": [*instants, *(p - 1 for p in prevs), *prevs],
        "match": [*nexts, *prevs],
    }  # fmt: skip


Differing = tuple[int, int, int, int | None]  # case index, after, the runner's, robfig's


def compare(
    index: int, case: Case, schedule: Schedule, answer: dict[str, Any], tally: Tally
) -> list[Differing]:
    expr, zone, instants = case
    n = len(instants)
    for hung in answer["hung"]:
        tally.add("robfig never returns", f"{expr!r} in {zone} after {answer['next'][hung]}", zone)
    nexts_r, before_prev_r, after_prev_r = (
        answer["next"][:n], answer["next"][n : 2 * n], answer["next"][2 * n :]
    )  # fmt: skip
    differing: list[Differing] = []
    for i, t in enumerate(instants):
        ours_next = schedule.next_after(t)
        ours_prev = schedule.previous_at_or_before(t)
        assert answer["match"][i] and answer["match"][n + i], (expr, zone, t, "not a fire time")
        checks = [
            (t, ours_next, nexts_r[i]),  # next
            (ours_prev - 1, ours_prev, before_prev_r[i]),  # previous: robfig reaches it
            (ours_prev, ours_next, after_prev_r[i]),  # previous: nothing in (p, t]
        ]
        found = [(index, after, ours, theirs) for after, ours, theirs in checks if ours != theirs]
        tally.add("pairs that differ" if found else "pairs that agree", expr)
        differing += found
    return differing


def classify(
    case: Case, differing: Differing, theirs_match: bool, changes: list[int]
) -> tuple[str, str]:
    """(class, example) of one comparison where robfig and the runner differ."""
    expr, zone, _ = case
    _, after, ours, theirs = differing
    if theirs is None:
        cls = "robfig finds nothing"
    elif theirs <= after:
        cls = DOCUMENTED[0]
    elif not theirs_match:
        cls = DOCUMENTED[1]
    elif theirs > ours:
        cls = DOCUMENTED[2]
    else:
        cls = "the runner skips a time robfig's fields match"
    low = min(after, ours, theirs or ours) - 86_400
    high = max(after, ours, theirs or ours) + 86_400
    kinds = {change_kind(zone, c) for c in changes if low <= c <= high}
    if cls in DOCUMENTED and not kinds & {"midnight", "off the hour"}:
        cls = f"{cls}, but not next to a change at midnight or off the hour"
    z = ZoneInfo(zone)
    example = (
        f"{expr!r} in {zone} after {iso(after, z)}: runner {iso(ours, z)}, robfig {iso(theirs, z)}"
        f" (changes near: {sorted(kinds)})"
    )
    return cls, example


def test_fire_times_match_robfig_next(robfig: Oracle, figures: Callable[[str], None]) -> None:
    rng = random.Random(SEED + 1)
    changes = {zone: offset_changes(zone) for zone in ZONES}
    changes["Pacific/Apia"] = [c for c in changes["Pacific/Apia"] if c > APIA_START_S + 86_400]
    cases = fire_time_cases(rng, changes)
    schedules = [runner_schedule(expr, zone) for expr, zone, _ in cases]
    first = robfig([first_request(c, s) for c, s in zip(cases, schedules, strict=True)])

    tally = Tally()
    differing: list[Differing] = []
    for index, (case, schedule, answer) in enumerate(zip(cases, schedules, first, strict=True)):
        assert answer["ok"], (case, answer)
        if schedule is None:
            # ParseStandard accepts a schedule no day or time ever matches; robfig's Next gives
            # up after five years, the runner refuses it at start (there is no slot to run).
            assert all(n is None for n in answer["next"]), (case, answer["next"])
            tally.add("never fires: robfig finds nothing, the runner refuses it", case[0])
        else:
            differing += compare(index, case, schedule, answer, tally)
    # A second look at robfig's differing answers: are they times its own fields match?
    second = robfig([
        {"expr": cases[i][0], "zone": cases[i][1], "next": [], "match": [theirs or 0]}
        for i, _, _, theirs in differing
    ])  # fmt: skip
    for d, answer in zip(differing, second, strict=True):
        case = cases[d[0]]
        cls, example = classify(case, d, answer["match"][0], changes[case[1]])
        tally.add(cls, example, case[1])

    pairs = tally.classes["pairs that agree"] + tally.classes["pairs that differ"]
    figures(
        f"fire times: {pairs} expression-instant pairs "
        f"({len({c[0] for c in cases})} expressions, {len(cases)} expression-zone cases, "
        f"{len(ZONES)} zones, {sum(len(c) for c in changes.values())} offset changes "
        f"2000-2040, seed {SEED})"
    )
    for cls in sorted(tally.classes):
        figures(f"  {cls}: {tally.classes[cls]}")
    for key in sorted(tally.by_zone):
        figures(f"    {key}: {tally.by_zone[key]}")
    for cls in DOCUMENTED:
        for example in tally.examples.get(cls, [])[:2]:
            figures(f"  e.g. {cls}: {example}")
    assert pairs >= 10_000
    allowed = (*DOCUMENTED, "pairs that agree", "pairs that differ")
    faults = {
        cls: tally.examples[cls]
        for cls in tally.classes
        if cls not in allowed and not cls.startswith("never fires")
    }
    assert not faults, faults


def test_robfig_never_returns_across_apias_skipped_day(robfig: Oracle) -> None:
    """Samoa skipped 30 December 2011 (UTC-10 to UTC+14). robfig's Next for @monthly, asked in
    the last hour before the skip, loops forever (the oracle gives up after 2 s); the runner
    answers with the next first of the month."""
    before = int(datetime(2011, 12, 29, 23, tzinfo=ZoneInfo("Pacific/Apia")).timestamp())
    answer = robfig([{"expr": "@monthly", "zone": "Pacific/Apia", "next": [before], "match": []}])
    assert answer[0]["hung"] == [0]
    schedule = Schedule.parse("@monthly", "Pacific/Apia", 0)
    following = datetime.fromtimestamp(schedule.next_after(before), ZoneInfo("Pacific/Apia"))
    assert following.isoformat() == "2012-01-01T00:00:00+14:00"
