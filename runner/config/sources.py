"""Where a setting comes from, and how its text is read: a flag, then ``CRON_RUNNER_*``, then
the default (docs/design.md).

Every group of settings (runner.config.settings, runner.config.queue, runner.serve) reads
through ``Source``, so a bad value names the flag or variable it came from and the accepted
form in the same words everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from runner.errors import ConfigError

ENV_PREFIX = "CRON_RUNNER_"
MAX_DURATION_S = 10 * 365 * 86400.0
#: The argparse ``dest`` of a setting's flag is this plus the variable's name without
#: ``CRON_RUNNER_`` (``--lease-ttl`` -> ``setting_LEASE_TTL``).
FLAG_DEST_PREFIX = "setting_"

# [0-9], not \d: \d also matches Arabic-Indic and fullwidth digits, which float() reads.
# Patterns, not compiled: re compiles (and caches) one on its first use, so a start that
# parses no duration or time pays nothing for them (bench/README.md, Cold start).
_DURATION_RE = r"^[ \t]*([0-9]+(?:\.[0-9]+)?)[ \t]*(ms|s|m|h)?[ \t]*\Z"
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
DURATION_FORM = "a number of seconds or a number with a unit: '30', '30s', '1m', '500ms', '1h'"
TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off", ""})


def parse_duration(value: str, origin: str) -> float:
    match = re.match(_DURATION_RE, value)
    if not match:
        raise ConfigError(f"{origin}={value!r} is not a duration: expected {DURATION_FORM}")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    # A float from 400 digits is inf; Redis refuses expiry times past its own range anyway.
    if seconds > MAX_DURATION_S:
        raise ConfigError(f"{origin}={value[:40]!r} is too large: expected at most 10 years")
    return seconds


def whole_number(text: str) -> bool:
    """ASCII digits, not too many: str.isdigit() also accepts '²', which int() refuses."""
    return text.isascii() and text.isdigit() and len(text) <= 9


#: Where main() leaves, on the parsed command line, the option each setting was given by.
OPTIONS_ATTR = "_setting_options"


class Flags(dict[str, "str | None"]):
    """Setting flags keyed like the variables without ``CRON_RUNNER_``, and the option each is
    spelled with (worker's ``--queues`` sets WORKER_QUEUES), so that an error names it."""

    def __init__(self, values: Mapping[str, str | None], options: Mapping[str, str]) -> None:
        super().__init__(values)
        self.options = dict(options)


def setting_options(parser: Any) -> dict[str, str]:
    """The option of each setting flag in an ``argparse`` parser and its subcommands."""
    found: dict[str, str] = {}
    for action in parser._actions:
        choices = getattr(action, "choices", None)
        if isinstance(choices, Mapping):  # a subcommand's parsers
            for sub in choices.values():
                found.update(setting_options(sub))
        if action.dest.startswith(FLAG_DEST_PREFIX) and action.option_strings:
            found[action.dest.removeprefix(FLAG_DEST_PREFIX)] = action.option_strings[0]
    return found


def setting_flags(args: object) -> Flags:
    """The setting flags of a parsed command line (an ``argparse.Namespace``), keyed like the
    variables without ``CRON_RUNNER_`` (``{"LEASE_TTL": "5s"}``), as ``Source`` takes them."""
    return Flags(
        {
            k.removeprefix(FLAG_DEST_PREFIX): v
            for k, v in vars(args).items()
            if k.startswith(FLAG_DEST_PREFIX)
        },
        getattr(args, OPTIONS_ATTR, {}),
    )


class Source:
    """Looks a setting up in the flags, then the environment, and remembers where it came from."""

    def __init__(self, env: Mapping[str, str], flags: Mapping[str, str | None]) -> None:
        self.env = env
        self.flags = flags

    def get(self, name: str) -> tuple[str | None, str]:
        """(value, origin) for ``name`` without the prefix, e.g. 'LEASE_TTL'."""
        flag = self.flags.get(name)
        if flag is not None:
            options = getattr(self.flags, "options", {})
            return flag, options.get(name) or "--" + name.lower().replace("_", "-")
        var = ENV_PREFIX + name
        value = self.env.get(var)
        if value is not None and value.strip() != "":
            return value.strip(), var
        return None, var

    def duration(
        self, name: str, default: float, *, minimum_s: float = 0.0, zero: bool = False
    ) -> float:
        value, origin = self.get(name)
        if value is None:
            return default
        seconds = parse_duration(value, origin)
        if zero and seconds == 0:
            return seconds
        if seconds < minimum_s or seconds <= 0:
            raise ConfigError(
                f"{origin}={value!r} is too small: expected at least {minimum_s or 0.001:g}s"
            )
        return seconds

    def optional_duration(self, name: str, *, minimum_s: float = 0.0) -> float | None:
        """``duration``, or None when the setting is not given at all."""
        if self.get(name)[0] is None:
            return None
        return self.duration(name, 0.0, minimum_s=minimum_s)

    def boolean(self, name: str, default: bool) -> bool:
        value, origin = self.get(name)
        if value is None:
            return default
        if value.lower() in TRUE:
            return True
        if value.lower() in FALSE:
            return False
        raise ConfigError(f"{origin}={value!r} is not a boolean: expected true or false")

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        value, origin = self.get(name)
        if value is None:
            return default
        if value.lower() not in choices:
            raise ConfigError(
                f"{origin}={value!r} is not valid: expected one of {', '.join(choices)}"
            )
        return value.lower()

    def count(self, name: str, minimum: int, maximum: int) -> int | None:
        """A whole number from ``minimum`` to ``maximum``, or None when not given."""
        value, origin = self.get(name)
        if value is None:
            return None
        if not whole_number(value) or not minimum <= int(value) <= maximum:
            raise ConfigError(
                f"{origin}={value[:40]!r} is not valid: expected a whole number from {minimum} "
                f"to {maximum}"
            )
        return int(value)


TIME_FORM = (
    "expected ISO 8601 with Z or an offset (2026-01-02T06:00:00Z, 2026-01-02T07:00:00+01:00) "
    "or epoch seconds (1767333600)"
)
_EPOCH_RE = r"(?a)[0-9]{1,12}(?:\.[0-9]{1,6})?\Z"
_LAST_S = 253_402_300_799  # 9999-12-31T23:59:59Z: past it no time can be shown


def parse_time(value: str, origin: str) -> float:
    """An instant as epoch seconds, from epoch seconds or ISO 8601 with Z or an offset: the one
    reading of every time a command takes (pause --until, backfill --from/--to, ack SLOT). A
    time without a zone is refused: each server, and the operator's own host, would read it
    in its own zone. From 0 (1970) to the end of the year 9999, both included."""
    from datetime import datetime  # noqa: PLC0415 - only the commands that take a time

    text = value.strip()
    if re.match(_EPOCH_RE, text):
        t_s = float(text)
    else:
        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ConfigError(f"{origin}={value[:60]!r} is not a time: {TIME_FORM}") from None
        if when.tzinfo is None:
            raise ConfigError(
                f"{origin}={value[:60]!r} names no time zone: add Z or an offset such as "
                f"+01:00, else each host reads it in its own zone; {TIME_FORM}"
            )
        t_s = when.timestamp()
    if t_s > _LAST_S:
        raise ConfigError(f"{origin}={value[:60]!r} is after the year 9999: {TIME_FORM}")
    if t_s < 0:
        raise ConfigError(f"{origin}={value[:60]!r} is before 1970: {TIME_FORM}")
    return t_s
