"""The schedule language of the Kubernetes CronJob controller: robfig/cron v3.0.1's
``cron.ParseStandard``, reproduced rule by rule (its ``parser.go`` and ``spec.go``).

The API server accepts a CronJob's ``schedule`` when ``ParseStandard`` does (and it holds no
``TZ``), and the controller matches wall-clock times against the fields ``ParseStandard``
builds. This module does both, so a server reads a schedule exactly as the cluster does:

* 5 fields split on Go's white space; each a comma list (empty items ignored) of ``*`` or
  ``?`` (any field), ``N``, ``N-M`` (``1-1`` is the single value 1), each with an optional
  ``/step``; ``N/step`` means ``N-max/step``; ``*-anything`` is ``*``. Numbers are Go's
  ``Atoi`` (``+5`` and ``05`` are 5); month and day-of-week names in any case; day of week
  0-6 (7 is refused).
* The day rule: when the day-of-month or the day-of-week field holds a bare ``*`` or ``?``
  (``*/1`` too, not ``*/N`` with N > 1), a day must match both fields, otherwise either.
* The macros ``@yearly``, ``@annually``, ``@monthly``, ``@weekly``, ``@daily``,
  ``@midnight``, ``@hourly``, spelt exactly so, and ``@every <Go duration>``
  (:func:`every_delay_s`), which counts from when the CronJob was created and has no wall-clock
  fire times (:class:`Every`).

Imported only when a schedule is parsed: a CronJob pod takes its slot from the Job name.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from datetime import date
from typing import Final, NamedTuple

_MONTH_NAMES: Final = {n: i + 1 for i, n in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))}  # fmt: skip
_DOW_NAMES: Final = {n: i for i, n in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}

MACROS: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

# Go's unicode.IsSpace, which strings.Fields splits on (Python's str.split() also splits on
# U+001C..U+001F, which Go does not).
_GO_SPACE: Final = re.compile(
    "[\t\n\v\f\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+"
)
# strconv.Atoi: an optional sign and ASCII digits, within int64.
_GO_INT: Final = re.compile(r"[+-]?[0-9]+\Z", re.ASCII)
_INT64_MAX: Final = 2**63 - 1
_EPOCH_ORDINAL: Final = date(1970, 1, 1).toordinal()
_DAY_S: Final = 86_400


class CronSyntaxError(ValueError):
    """What ParseStandard would refuse, and why."""


_Bad = Callable[[str], CronSyntaxError]


class _Bounds(NamedTuple):
    name: str
    low: int
    high: int
    names: dict[str, int]


_MINUTE: Final = _Bounds("minute", 0, 59, {})
_HOUR: Final = _Bounds("hour", 0, 23, {})
_DOM: Final = _Bounds("day-of-month", 1, 31, {})
_MONTH: Final = _Bounds("month", 1, 12, _MONTH_NAMES)
_DOW: Final = _Bounds("day-of-week", 0, 6, _DOW_NAMES)


class Every(NamedTuple):
    """``@every <duration>``: robfig's ConstantDelaySchedule, a delay in whole seconds."""

    delay_s: int


class CronSpec(NamedTuple):
    """The fields as robfig's SpecSchedule holds them: value sets, and the day fields' star bits."""

    minutes: frozenset[int]
    hours: frozenset[int]
    doms: frozenset[int]
    months: frozenset[int]
    dows: frozenset[int]  # Sunday is 0
    dom_star: bool
    dow_star: bool

    @property
    def both_days(self) -> bool:
        """robfig's dayMatches: a star bit on either day field means both must match."""
        return self.dom_star or self.dow_star

    def day_matches(self, ordinal: int) -> bool:
        day = date.fromordinal(ordinal)
        if day.month not in self.months:
            return False
        in_dom = day.day in self.doms
        in_dow = ordinal % 7 in self.dows  # ordinal 7 (0001-01-07) is a Sunday
        return (in_dom and in_dow) if self.both_days else (in_dom or in_dow)

    def weekdays_only(self) -> frozenset[int] | None:
        """The matching weekdays, when whether a day matches depends on its weekday alone."""
        if len(self.months) != 12:
            return None
        full_dom, full_dow = len(self.doms) == 31, len(self.dows) == 7
        if self.both_days:
            if not self.doms:
                return frozenset()
            return self.dows if full_dom else None
        if full_dom or full_dow:
            return frozenset(range(7))
        return self.dows if not self.doms else None

    def times_of_day(self) -> list[int]:
        """Matching minutes of the day, ascending."""
        return sorted(h * 60 + m for h in self.hours for m in self.minutes)


class Matcher:
    """Searches naive wall-clock seconds (read as if UTC) for the fields' matches."""

    def __init__(self, spec: CronSpec) -> None:
        self.spec = spec
        self._times = spec.times_of_day()

    def next_at_or_after(self, wall: int, limit_days: int) -> int | None:
        """The earliest matching wall minute >= ``wall``, within ``limit_days`` days."""
        times = self._times
        day, second = divmod(wall, _DAY_S)
        i = bisect_left(times, -(-second // 60))
        for d in range(day, day + limit_days + 1):
            if i < len(times) and self.spec.day_matches(_EPOCH_ORDINAL + d):
                return d * _DAY_S + times[i] * 60
            i = 0
        return None

    def previous_at_or_before(self, wall: int, limit_days: int) -> int | None:
        """The latest matching wall minute <= ``wall``, within ``limit_days`` days."""
        times = self._times
        day, second = divmod(wall, _DAY_S)
        i = bisect_right(times, second // 60)
        for d in range(day, day - limit_days - 1, -1):
            if i > 0 and self.spec.day_matches(_EPOCH_ORDINAL + d):
                return d * _DAY_S + times[i - 1] * 60
            i = len(times)
        return None


def parse(expr: str) -> CronSpec | Every:
    """The schedule ``expr`` as ParseStandard reads it; raises :class:`CronSyntaxError`."""
    if not expr:
        raise CronSyntaxError("it is empty")
    if "TZ" in expr:
        # ParseStandard itself would read the zone, but the API server refuses TZ in a
        # schedule: the zone is a setting of its own.
        raise CronSyntaxError("a time zone (TZ= or CRON_TZ=) inside the schedule is not accepted")
    if expr.startswith("@"):
        macro = MACROS.get(expr)
        if macro is not None:
            return _fields(macro.split())
        if expr.startswith("@every "):
            return Every(every_delay_s(expr[len("@every ") :]))
        raise CronSyntaxError(f"unknown macro {expr!r} (macros are lower case, with no spaces)")
    fields = [f for f in _GO_SPACE.split(expr) if f]
    if len(fields) != 5:
        extra = " (a seconds or year field is not supported)" if len(fields) in (6, 7) else ""
        raise CronSyntaxError(f"it has {len(fields)} fields{extra}")
    return _fields(fields)


def _fields(fields: list[str]) -> CronSpec:
    minutes, _ = _field(fields[0], _MINUTE)
    hours, _ = _field(fields[1], _HOUR)
    doms, dom_star = _field(fields[2], _DOM)
    months, _ = _field(fields[3], _MONTH)
    dows, dow_star = _field(fields[4], _DOW)
    return CronSpec(minutes, hours, doms, months, dows, dom_star, dow_star)


def _field(text: str, bounds: _Bounds) -> tuple[frozenset[int], bool]:
    """getField: the values of a comma list, and whether its star bit is set."""
    values: set[int] = set()
    star = False
    for item in text.split(","):
        if item:  # strings.FieldsFunc drops empty items: "1,,2" and "mon," are valid
            item_values, item_star = _range(item, text, bounds)
            values |= item_values
            star = star or item_star
    return frozenset(values), star


def _range(item: str, text: str, bounds: _Bounds) -> tuple[set[int], bool]:
    """getRange: ``*``/``?``, ``N`` or ``N-M``, then an optional ``/step``."""

    def bad(reason: str) -> CronSyntaxError:
        return CronSyntaxError(f"{bounds.name} field {text!r}: {reason}")

    range_and_step = item.split("/")
    if len(range_and_step) > 2:
        raise bad(f"too many slashes in {item!r}")
    start, end, star = _endpoints(range_and_step[0], bounds, bad)
    step = 1
    if len(range_and_step) == 2:
        step = _go_atoi(range_and_step[1], bad)
        if "-" not in range_and_step[0]:
            end = bounds.high  # "N/step" means "N-max/step"
        star = star and step <= 1
    if start < bounds.low:
        raise bad(f"{start} is below the minimum {bounds.low} (range {bounds.low}-{bounds.high})")
    if end > bounds.high:
        raise bad(f"{end} is above the maximum {bounds.high} (range {bounds.low}-{bounds.high})")
    if start > end:
        raise bad(f"the range {range_and_step[0]} runs backwards")
    if step == 0:
        raise bad("a step must be a positive number")
    return set(range(start, end + 1, step)), star


def _endpoints(text: str, bounds: _Bounds, bad: _Bad) -> tuple[int, int, bool]:
    """The range before any ``/``: (start, end, star bit)."""
    low_high = text.split("-")
    if low_high[0] in ("*", "?"):
        # robfig reads no further than the star: '*-5' and '*-x' are '*'.
        return bounds.low, bounds.high, True
    if len(low_high) > 2:
        raise bad(f"too many hyphens in {text!r}")
    start = _int_or_name(low_high[0], bounds, bad)
    end = _int_or_name(low_high[1], bounds, bad) if len(low_high) == 2 else start
    return start, end, False


def _go_lower(text: str) -> str:
    # Go's strings.ToLower maps U+0130 and U+212A to ASCII 'i' and 'k'; Python does not.
    return text.replace("\u0130", "i").replace("\u212a", "k").lower()


def _int_or_name(text: str, bounds: _Bounds, bad: _Bad) -> int:
    named = bounds.names.get(_go_lower(text))
    if named is not None:
        return named
    if bounds.names and not _GO_INT.match(text):
        names = ", ".join(bounds.names)
        raise bad(f"{text!r} is neither a number nor a name ({names}, in any case)")
    return _go_atoi(text, bad)


def _go_atoi(text: str, bad: _Bad) -> int:
    if not _GO_INT.match(text):
        raise bad(f"{text!r} is not a number")
    value = int(text)
    if value > _INT64_MAX or value < -_INT64_MAX - 1:
        raise bad(f"{text!r} is out of range")
    if value < 0:
        raise bad(f"negative number {text!r} not allowed")
    return value


# -- @every ------------------------------------------------------------------------------------

_UNIT_NS: Final = {
    b"ns": 1,
    b"us": 1_000,
    "\u00b5s".encode(): 1_000,  # micro sign
    "\u03bcs".encode(): 1_000,  # Greek mu
    b"ms": 1_000_000,
    b"s": 1_000_000_000,
    b"m": 60_000_000_000,
    b"h": 3_600_000_000_000,
}
_NS: Final = 1_000_000_000


def every_delay_s(text: str) -> int:
    """``@every``'s delay in whole seconds: Go's time.ParseDuration, then robfig's Every
    (below one second becomes one second; fractions of a second are dropped)."""
    ns = _go_parse_duration(text)
    return max(ns, _NS) // _NS


def _go_parse_duration(text: str) -> int:
    """time.ParseDuration: ``[-+]?([0-9]*(\\.[0-9]*)?[a-z]+)+``, in nanoseconds."""

    def bad() -> CronSyntaxError:
        return CronSyntaxError(f"@every: {text!r} is not a Go duration such as '90s', '1h30m'")

    s = text.encode()
    negative = s[:1] == b"-"
    if s[:1] in (b"-", b"+"):
        s = s[1:]
    if s == b"0":
        return 0
    if not s:
        raise bad()
    total = 0
    while s:
        match = _DURATION_PART.match(s)
        if match is None:
            raise bad()
        whole_text, fraction_text, unit_text = match.groups()
        unit = _UNIT_NS.get(unit_text)
        if unit is None or (not whole_text and not fraction_text):
            raise bad()
        whole = int(whole_text or b"0")
        if whole > _LIMIT // unit:
            raise bad()  # also Go's leadingInt overflow, which comes at a smaller number
        value = whole * unit
        fraction, scale = _leading_fraction(fraction_text or b"")
        if fraction:
            value += int(float(fraction) * (float(unit) / scale))
        total += value
        if value > _LIMIT or total > _LIMIT:
            raise bad()
        s = s[match.end() :]
    if not negative and total > _LIMIT - 1:
        raise bad()
    return -total if negative else total


# One component: digits, an optional fraction, a unit (any bytes up to the next digit or '.').
_DURATION_PART: Final = re.compile(rb"([0-9]*)(?:\.([0-9]*))?([^0-9.]+)")
_LIMIT: Final = 1 << 63


def _leading_fraction(digits: bytes) -> tuple[int, float]:
    """Go's leadingFraction: digits past int64 precision are ignored, not an error."""
    fraction, scale = 0, 1.0
    for c in digits:
        y = fraction * 10 + c - 48
        if fraction > (_LIMIT - 1) // 10 or y > _LIMIT:
            break
        fraction, scale = y, scale * 10
    return fraction, scale
