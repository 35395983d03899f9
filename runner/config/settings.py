"""Typed, grouped settings, built once at the CLI edge from flags, then ``CRON_RUNNER_*``, then
defaults (docs/design.md).

A bad value raises ``ConfigError`` naming the flag or variable it came from and the accepted
form (runner.config.sources reads the text; runner.config.timings derives the lease's timings).
"""

# No `from __future__ import annotations` here: typing.NamedTuple turns each string
# annotation into a ForwardRef, compiling it, which made creating these classes take about
# twice as long at every start (bench/README.md, Cold start).

import os
import re
import socket
import stat
import sys
from collections.abc import Mapping
from typing import NamedTuple
from urllib.parse import SplitResult, parse_qsl, unquote, urlencode, urlsplit

from runner.config.sources import (
    DURATION_FORM,
    ENV_PREFIX,
    Source,
    parse_duration,
    whole_number,
)
from runner.config.timings import MIN_TTL_S, LeaseTimings
from runner.config.urls import redact_url
from runner.errors import ConfigError
from runner.keys import PREFIX_RE, validate_name

_SECRETS = frozenset({"password", "sentinel_password"})
# The overlap policies: what a run does when an earlier slot still holds the lease
# (docs/design.md, Overlap policies). The lease scripts speak them (runner.lease.scripts).
SKIP = "skip"
BUFFER_ONE = "buffer-one"
REPLACE = "replace"
ALLOW_OTHER_SLOTS = "allow-other-slots"
OVERLAPS = (SKIP, BUFFER_ONE, REPLACE, ALLOW_OTHER_SLOTS)
# The runner's own credentials: removed from the task's environment (task_environment).
CREDENTIAL_VARIABLES = tuple(
    ENV_PREFIX + name
    for name in ("REDIS_PASSWORD", "REDIS_PASSWORD_FILE", "REDIS_SENTINEL_PASSWORD",
                 "REDIS_SENTINEL_PASSWORD_FILE")
)  # fmt: skip
# URL query options: credentials only (moved to their fields, so that the URL is safe to show).
# redis-py would pass any other as a keyword to its connection (a TypeError for '?foo=bar') and
# let '?socket_timeout=' override the timeouts the lease depends on.
_URL_CREDENTIAL_OPTIONS = ("username", "password")


# Named tuples rather than dataclasses: as immutable and as typed, and created in a tenth of the
# time, which every pod start pays once per class (bench/README.md, Cold start).
class RedisSettings(NamedTuple):
    url: str = "redis://localhost:6379/0"
    username: str | None = None
    password: str | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    sentinels: tuple[tuple[str, int], ...] = ()
    sentinel_master: str = "mymaster"
    sentinel_password: str | None = None
    cluster: bool = False
    min_replicas: int = 0
    connect_timeout_s: float = 10.0

    @property
    def display_url(self) -> str:
        """The URL without credentials: safe for logs and errors."""
        return redact_url(self.url)

    @property
    def display_target(self) -> str:
        """Where Redis is, for messages: the URL without credentials, or the sentinels asked."""
        if self.sentinels:
            hosts = ",".join(f"{host}:{port}" for host, port in self.sentinels)
            return f"{self.sentinel_master!r} via sentinels {hosts}"
        return self.display_url

    def __repr__(self) -> str:
        # Settings end up in logs and tracebacks: the passwords never do.
        shown = (f"{k}={v!r}" for k, v in zip(self._fields, self, strict=True) if k not in _SECRETS)
        return f"RedisSettings({', '.join(shown)})"


class LeaseSettings(NamedTuple):
    ttl_s: float = 30.0
    prefix: str = "cron-runner"
    scope: str = "default"
    holder: str = ""
    slot_retention_s: float | None = None
    # How long a run waits for a holder of its own slot to finish, renew or expire; None: the
    # TTL plus 10 s, which is enough to see one of them when the holder's TTL is ours.
    held_wait_s: float | None = None
    # Replace the task's stored definition with this runner's (a change made on purpose).
    redefine: bool = False
    # The overlap policy (OVERLAPS); None: not set here, so the task's @task(overlap=), or skip.
    overlap: str | None = None
    # How long buffer-one and replace wait for the holder; None: their defaults (run.policy).
    overlap_wait_s: float | None = None

    @property
    def held_wait(self) -> float:
        return (
            self.held_wait_s if self.held_wait_s is not None else self.timings.default_held_wait_s
        )

    @property
    def overlap_policy(self) -> str:
        return self.overlap or SKIP

    # Runs kept in a task's history stream (about 100 bytes each: docs/operating.md, Sizing).
    history_length: int = 1000
    # Pause the task after this many consecutive failures (0: never); None: not set here, so the
    # task's @task(pause_on_failures=), or never (docs/design.md, Pause).
    pause_on_failures: int | None = None

    @property
    def failures_before_pause(self) -> int:
        return self.pause_on_failures or 0

    @property
    def ttl_ms(self) -> int:
        return int(self.ttl_s * 1000)

    @property
    def timings(self) -> LeaseTimings:
        return LeaseTimings(self.ttl_s)


# Catch-up (docs/design.md, Catch-up, trigger and backfill): what a run does with earlier slots
# of its schedule that never ran. Checked with the schedule and the task's @task options, once a run has them all
# (runner.schedule.catchup.check_catchup).
CATCHUP_NONE = "none"
CATCHUPS = (CATCHUP_NONE, "latest", "all")


class SlotSettings(NamedTuple):
    schedule: str | None = None
    timezone: str = "UTC"
    skew_tolerance_s: float = 30.0
    job_name: str | None = None
    cronjob_name: str | None = None
    # Without a Job name: a run that starts this long after its slot does not run (too_late),
    # like a CronJob's startingDeadlineSeconds.
    starting_deadline_s: float = 300.0
    # The batch.kubernetes.io/cronjob-scheduled-timestamp annotation (Kubernetes 1.32+), in
    # epoch seconds, when the chart's downward API finds it on the pod.
    scheduled_at_s: float | None = None
    # None: not set here, so the task's @task(catchup=, catchup_window=), else none and 0.
    catchup: str | None = None
    catchup_window_s: float | None = None

    @property
    def catches_up(self) -> bool:
        """Whether a run looks back for earlier slots that never ran (latest or all)."""
        return (self.catchup or CATCHUP_NONE) != CATCHUP_NONE


class RunSettings(NamedTuple):
    shutdown_grace_s: float = 25.0
    mode: str = "run"
    task_modules: tuple[str, ...] = ()
    # The task's environment keeps the runner's Redis credentials (off: see task_environment).
    share_credentials: bool = False
    # Stored with each run: status, the watchdog and serve report a run holding its lease longer.
    max_runtime_s: float | None = None
    # Healthchecks.io-style ping URL (runner/ping.py); None: no pings, nothing imported.
    ping_url: str | None = None
    ping_timeout_s: float = 3.0


class LogSettings(NamedTuple):
    format: str = "text"
    level: str = "INFO"


class TelemetrySettings(NamedTuple):
    """OpenTelemetry is on only when an OTLP endpoint is set; the SDK reads every other OTEL_*."""

    traces: bool = False
    metrics: bool = False
    traces_protocol: str = "http/protobuf"
    metrics_protocol: str = "http/protobuf"
    # Our metrics are recorded when the run ends and exported then; a periodic export (for a
    # long task's own metrics) happens only when OTEL_METRIC_EXPORT_INTERVAL asks for it.
    periodic_metrics: bool = False
    # Bounds the export at exit, so a dead collector never holds a pod past its grace period.
    flush_timeout_s: float = 3.0

    @property
    def enabled(self) -> bool:
        return self.traces or self.metrics


class Settings(NamedTuple):
    redis: RedisSettings = RedisSettings()
    lease: LeaseSettings = LeaseSettings()
    slots: SlotSettings = SlotSettings()
    run: RunSettings = RunSettings()
    log: LogSettings = LogSettings()
    telemetry: TelemetrySettings = TelemetrySettings()


DEFAULTS = Settings()


def task_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The environment a task inherits: without the runner's Redis credentials, so that a task
    cannot use them to unlock, forget or re-fence another task's lease (docs/design.md)."""
    out = {k: v for k, v in env.items() if k not in CREDENTIAL_VARIABLES}
    url_var = ENV_PREFIX + "REDIS_URL"
    if url_var in out:
        try:
            out[url_var] = _without_credentials(out[url_var])
        except ValueError:  # not a URL the runner would have accepted: nothing to keep
            del out[url_var]
    return out


def _without_credentials(url: str) -> str:
    """The URL without user, password and credential query options (they have their fields)."""
    parts = urlsplit(url)
    query = [
        (k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
        if k.lower() not in _URL_CREDENTIAL_OPTIONS
    ]  # fmt: skip
    if (
        parts.username is None
        and parts.password is None
        and len(query) == len(parse_qsl(parts.query, keep_blank_values=True))
    ):
        return url
    return parts._replace(netloc=parts.netloc.rpartition("@")[2], query=urlencode(query)).geturl()


def _split_url(url: str, origin: str, form: str) -> SplitResult:
    try:
        return urlsplit(url)
    except ValueError as exc:  # e.g. an unclosed IPv6 bracket; not shown: it may hold a password
        raise ConfigError(f"{origin} is not a valid URL ({exc}): expected {form}") from exc


def _redis(src: Source) -> RedisSettings:
    url, origin = src.get("REDIS_URL")
    url = url or DEFAULTS.redis.url
    form = (
        "redis://[user[:password]@]host[:port][/db], rediss://... or unix:///path/to/socket "
        "(percent-encode '/', '#', '?' and '@' in a password, or set CRON_RUNNER_REDIS_PASSWORD)"
    )
    parts = _split_url(url, origin, form)
    options = _check_url(parts, f"{origin}={redact_url(url)!r}", form)

    password = _secret(src, "REDIS_PASSWORD")
    username, _ = src.get("REDIS_USERNAME")
    sentinels_raw, sentinels_origin = src.get("REDIS_SENTINELS")
    sentinels: list[tuple[str, int]] = []
    for item in (sentinels_raw or "").split(","):
        if not item.strip():
            continue
        host, sep, port_s = item.strip().rpartition(":")
        if not sep or not host or not whole_number(port_s) or not 0 < int(port_s) < 65536:
            raise ConfigError(
                f"{sentinels_origin} entry {_entry(item)!r} is not valid: expected host:port[,host:port...]"
            )
        _check_host(host.strip("[]"), f"{sentinels_origin} entry {_entry(item)!r}")
        sentinels.append((host, int(port_s)))
    master, _ = src.get("REDIS_SENTINEL_MASTER")
    sentinel_password = _secret(src, "REDIS_SENTINEL_PASSWORD")
    min_replicas_raw, min_origin = src.get("REDIS_MIN_REPLICAS")
    if min_replicas_raw is not None and not whole_number(min_replicas_raw):
        raise ConfigError(
            f"{min_origin}={min_replicas_raw!r} is not valid: expected a whole number >= 0"
        )
    tls = {name: src.get(f"REDIS_TLS_{name}_FILE") for name in ("CA", "CERT", "KEY")}
    for value, file_origin in tls.values():
        if value is not None and not os.path.isfile(value):  # noqa: PTH113 - a path string from env
            raise ConfigError(f"{file_origin}={value!r}: no such file")
    _check_tls_files(tls)
    cluster = src.boolean("REDIS_CLUSTER", False)
    if cluster and sentinels:
        raise ConfigError(
            "CRON_RUNNER_REDIS_CLUSTER and CRON_RUNNER_REDIS_SENTINELS exclude each other: set one"
        )
    # Credentials move to their own fields, so the URL is safe to show anywhere: in our
    # messages, and in redis-py's (a socket path, a host), which we do not redact.
    kept = _without_credentials(url)
    if redact_url(kept) != kept:
        raise ConfigError(
            f"{origin}={redact_url(url)!r} holds text that would have to be hidden when shown (a "
            f"space, a control character, a secret-like option): expected {form}"
        )
    return RedisSettings(
        url=kept,
        username=username
        or (unquote(parts.username) if parts.username else options.get("username")),
        password=password
        or (unquote(parts.password) if parts.password else options.get("password")),
        tls_ca_file=tls["CA"][0],
        tls_cert_file=tls["CERT"][0],
        tls_key_file=tls["KEY"][0],
        sentinels=tuple(sentinels),
        sentinel_master=master or DEFAULTS.redis.sentinel_master,
        sentinel_password=sentinel_password,
        cluster=cluster,
        min_replicas=int(min_replicas_raw or 0),
        connect_timeout_s=src.duration("CONNECT_TIMEOUT", DEFAULTS.redis.connect_timeout_s),
    )


def _entry(item: str) -> str:
    """A sentinel entry as it may be shown: one written as a URL may hold a password."""
    item = item.strip()
    return redact_url(item) if "@" in item or "://" in item else item


def _check_url(parts: SplitResult, where: str, form: str) -> dict[str, str]:
    """Refuse what redis-py would misread or crash on; return the URL's credential options."""
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(f"{where} is not a Redis URL: expected {form}")
    try:
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{where} has a bad port: expected {form}") from exc
    if port == 0:  # redis-py would quietly connect to 6379
        raise ConfigError(f"{where} has port 0: expected a port from 1 to 65535")
    if parts.scheme != "unix" and not parts.hostname:
        raise ConfigError(f"{where} has no host: expected {form}")
    if parts.scheme != "unix":
        _check_host(parts.hostname or "", where)
    if parts.fragment:
        # A Redis URL has none: most likely an unencoded '#' in a password.
        raise ConfigError(f"{where} has a fragment ('#...'): expected {form}")
    if parts.scheme == "unix" and not parts.path:
        raise ConfigError(f"{where} has no socket path: expected {form}")
    db = parts.path.strip("/") if parts.scheme != "unix" else ""
    if db and not whole_number(db):
        raise ConfigError(f"{where} has a bad database: expected a number (/0)")
    return _url_options(parts.query, where)


_URL_OPTIONS_FORM = (
    "no query options, or only ?password=... / ?username=... (better: CRON_RUNNER_REDIS_PASSWORD"
    "_FILE); timeouts come from CRON_RUNNER_LEASE_TTL and CRON_RUNNER_CONNECT_TIMEOUT, the "
    "database from the path (/0)"
)


def _url_options(query: str, where: str) -> dict[str, str]:
    """The credentials in the URL's query; any other option is refused (see
    _URL_CREDENTIAL_OPTIONS)."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise ConfigError(f"{where} has a malformed query: expected {_URL_OPTIONS_FORM}") from exc
    options: dict[str, str] = {}
    for name, value in pairs:
        if name.lower() not in _URL_CREDENTIAL_OPTIONS:
            raise ConfigError(
                f"{where}: URL option {name[:40]!r} is not supported: expected {_URL_OPTIONS_FORM}"
            )
        options[name.lower()] = value
    return options


def _check_host(host: str, where: str) -> None:
    """What the resolver would refuse with a UnicodeError: a label over 63 characters, a name
    over 253, or one that has no IDNA form."""
    if host.startswith("[") or ":" in host:  # an IPv6 address; urlsplit has checked brackets
        return
    try:
        encoded = host.encode("idna")
    except UnicodeError as exc:
        raise ConfigError(
            f"{where}: the host name is not valid ({exc}): expected DNS labels of 1-63 "
            "characters, at most 253 in all"
        ) from exc
    if len(encoded) > 253 or any(len(label) > 63 for label in encoded.split(b".")):
        raise ConfigError(
            f"{where}: the host name is too long: expected DNS labels of 1-63 characters, at "
            "most 253 in all"
        )


_SECRET_FILE_MAX_CHARS = 4096


def _secret(src: Source, name: str) -> str | None:
    """A password from ``CRON_RUNNER_<name>``, or read from the file ``CRON_RUNNER_<name>_FILE``
    names (a mounted Secret: nothing in the environment for a task or `ps e` to read)."""
    value, origin = src.get(name)
    path, path_origin = src.get(name + "_FILE")
    if path is None:
        return value
    if value is not None:
        raise ConfigError(f"{origin} and {path_origin} are both set: set one")
    try:
        # A regular file (or a link to one) only: opening a FIFO waits for a writer, past
        # the connect deadline, and reading a device or a terminal may never end.
        if not stat.S_ISREG(os.stat(path).st_mode):  # noqa: PTH116 - a path string from env
            raise ConfigError(
                f"{path_origin}={path[:200]!r} is not a regular file: expected a file holding "
                "the password (a mounted Secret's file, or a link to one)"
            )
        # O_NONBLOCK: should the path become a FIFO after the check, open still returns.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, encoding="utf-8") as f:  # noqa: PTH123 - a descriptor
            # Bounded: the file may be huge.
            secret = f.read(_SECRET_FILE_MAX_CHARS + 1).rstrip("\r\n")
    except (OSError, UnicodeError, ValueError) as exc:
        raise ConfigError(
            f"{path_origin}={path[:200]!r} cannot be read ({type(exc).__name__}): expected a "
            "readable file holding the password"
        ) from exc
    if not secret or len(secret) > _SECRET_FILE_MAX_CHARS:
        raise ConfigError(
            f"{path_origin}={path[:200]!r} is empty or longer than {_SECRET_FILE_MAX_CHARS} "
            "characters: expected the password"
        )
    return secret


def _check_tls_files(tls: Mapping[str, tuple[str | None, str]]) -> None:
    """Load the CA and the client pair once here, so an unreadable or wrong file is a
    configuration error (exit 78) rather than handshakes failing until the connect deadline."""
    (ca, ca_origin), (cert, cert_origin), (key, key_origin) = tls["CA"], tls["CERT"], tls["KEY"]
    if ca is None and cert is None and key is None:
        return
    import ssl  # noqa: PLC0415 - only for TLS users (redis-py has imported it anyway)

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if ca is not None:
        try:
            context.load_verify_locations(cafile=ca)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"{ca_origin}={ca!r} is not a usable CA file ({exc}): expected PEM certificates"
            ) from exc
    if key is not None and cert is None:
        raise ConfigError(
            f"{key_origin} is set but {cert_origin} is not: a key needs its certificate"
        )
    if cert is not None:
        try:  # without a key file, the key is in the certificate file
            context.load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"{cert_origin}={cert!r} (with {key_origin}={key!r}) is not a usable PEM "
                f"certificate and key ({exc})"
            ) from exc


def default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _lease(src: Source) -> LeaseSettings:
    ttl_raw, ttl_origin = src.get("LEASE_TTL")
    ttl_s = DEFAULTS.lease.ttl_s
    if ttl_raw is not None:
        ttl_s = parse_duration(ttl_raw, ttl_origin)
        if ttl_s < MIN_TTL_S:
            raise ConfigError(
                f"{ttl_origin}={ttl_raw!r} is too small: the lease is renewed every ttl/3 and "
                f"needs at least {MIN_TTL_S:g}s ({DURATION_FORM})"
            )
    prefix, prefix_origin = src.get("KEY_PREFIX")
    if prefix is not None and not PREFIX_RE.match(prefix):
        raise ConfigError(
            f"{prefix_origin}={prefix!r} is not valid: expected letters, digits, '.', '_', '-' "
            "or ':' (no braces), at most 63 characters"
        )
    scope, scope_origin = src.get("SCOPE")
    if scope is not None:
        validate_name(scope_origin, scope)
    holder, holder_origin = src.get("HOLDER")
    if holder is not None and (len(holder) > 253 or not holder.isprintable() or " " in holder):
        raise ConfigError(
            f"{holder_origin}={holder[:260]!r} is not valid: expected at most 253 printable "
            "characters, no spaces"
        )
    holder = holder or default_holder()
    # The cluster (or site) goes in front of the holder, so the lease, every run's log lines
    # and records, `status` and `history` say which of several clusters ran a slot.
    cluster_name, cluster_origin = src.get("CLUSTER_NAME")
    if cluster_name is not None:
        validate_name(cluster_origin, cluster_name)
        holder = f"{cluster_name}/{holder}"
    history_raw, history_origin = src.get("HISTORY_LENGTH")
    if history_raw is not None and not (whole_number(history_raw) and int(history_raw) >= 100):
        raise ConfigError(
            f"{history_origin}={history_raw!r} is not valid: expected a whole number of runs, "
            "at least 100 (Redis trims a stream 100 entries at a time)"
        )
    return LeaseSettings(
        ttl_s=ttl_s,
        prefix=prefix or DEFAULTS.lease.prefix,
        scope=scope or DEFAULTS.lease.scope,
        holder=holder,
        slot_retention_s=src.optional_duration("SLOT_RETENTION", minimum_s=60.0),
        held_wait_s=src.optional_duration("HELD_WAIT"),
        redefine=src.boolean("REDEFINE", False),
        history_length=int(history_raw or DEFAULTS.lease.history_length),
        overlap=src.choice("OVERLAP", "", OVERLAPS) or None,
        overlap_wait_s=(
            src.duration("OVERLAP_WAIT", 0.0) if src.get("OVERLAP_WAIT")[0] is not None else None
        ),
        pause_on_failures=_pause_on_failures(src),
    )


#: More failures in a row than anyone would wait for before looking: a typo, most likely.
MAX_PAUSE_ON_FAILURES = 10_000


def _pause_on_failures(src: Source) -> int | None:
    value, origin = src.get("PAUSE_ON_FAILURES")
    if value is None:
        return None
    if not whole_number(value) or int(value) > MAX_PAUSE_ON_FAILURES:
        raise ConfigError(
            f"{origin}={value[:40]!r} is not valid: expected how many consecutive failures pause "
            f"the task, a whole number from 1 to {MAX_PAUSE_ON_FAILURES}, or 0 for never"
        )
    return int(value)


def _slots(src: Source) -> SlotSettings:
    tz, tz_origin = src.get("TIMEZONE")
    if tz is not None:
        # Here, not at the top: zoneinfo costs about 1.5 ms of every start, and most runs
        # (a CronJob pod, a manual exec) name no time zone.
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # noqa: PLC0415

        try:
            ZoneInfo(tz)
        # OSError: a name longer than the file system allows ("File name too long").
        except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
            raise ConfigError(
                f"{tz_origin}={tz[:60]!r} is not a known time zone: expected an IANA name such as "
                "'UTC' or 'Europe/Berlin'"
            ) from exc
    schedule, _ = src.get("SCHEDULE")
    job_name, _ = src.get("JOB_NAME")  # get() strips whitespace
    cronjob_name, _ = src.get("CRONJOB_NAME")
    scheduled, scheduled_origin = src.get("SCHEDULED_TIMESTAMP")
    return SlotSettings(
        scheduled_at_s=None if scheduled is None else _rfc3339(scheduled, scheduled_origin),
        schedule=schedule,
        timezone=tz or DEFAULTS.slots.timezone,
        # 0: clocks are trusted to agree (NTP-disciplined hosts); a slot is claimed only once due.
        skew_tolerance_s=src.duration("SKEW_TOLERANCE", DEFAULTS.slots.skew_tolerance_s, zero=True),
        job_name=job_name,
        cronjob_name=cronjob_name,
        starting_deadline_s=src.duration("STARTING_DEADLINE", DEFAULTS.slots.starting_deadline_s),
        catchup=src.choice("CATCHUP", "", CATCHUPS) or None,
        catchup_window_s=_window(src, "CATCHUP_WINDOW"),
    )


def _window(src: Source, name: str) -> float | None:
    value, origin = src.get(name)
    if value is None:
        return None
    if value.startswith("-"):
        raise ConfigError(f"{origin}={value[:40]!r} is negative: expected a duration >= 0")
    return src.duration(name, 0.0, zero=True)


# What the controller writes: Go's time.RFC3339, whole seconds, 'Z' or a numeric offset. A
# pattern, not compiled: re compiles it on first use, only where the annotation is set.
_RFC3339_RE = r"(?a)[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?(?:Z|[+-][0-9]{2}:[0-9]{2})\Z"


def _rfc3339(value: str, origin: str) -> float:
    from datetime import datetime  # noqa: PLC0415 - only when the annotation is there

    try:
        if not re.match(_RFC3339_RE, value):
            raise ValueError(value)
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError as exc:
        raise ConfigError(
            f"{origin}={value[:60]!r} is not a time: expected RFC 3339 such as "
            "'2026-03-29T01:00:00Z', as Kubernetes writes batch.kubernetes.io/"
            "cronjob-scheduled-timestamp"
        ) from exc


def _telemetry(src: Source) -> TelemetrySettings:
    """On per signal when its endpoint (or the shared one) is set and its exporter is not 'none'."""

    def otel(name: str) -> str:
        return src.env.get(f"OTEL_{name}", "").strip()

    flush_timeout_s = src.duration("TELEMETRY_FLUSH_TIMEOUT", DEFAULTS.telemetry.flush_timeout_s)
    if otel("SDK_DISABLED").lower() == "true":
        return TelemetrySettings(flush_timeout_s=flush_timeout_s)
    shared = otel("EXPORTER_OTLP_ENDPOINT")
    protocol = otel("EXPORTER_OTLP_PROTOCOL") or DEFAULTS.telemetry.traces_protocol
    return TelemetrySettings(
        traces=bool(shared or otel("EXPORTER_OTLP_TRACES_ENDPOINT"))
        and otel("TRACES_EXPORTER").lower() != "none",
        metrics=bool(shared or otel("EXPORTER_OTLP_METRICS_ENDPOINT"))
        and otel("METRICS_EXPORTER").lower() != "none",
        traces_protocol=otel("EXPORTER_OTLP_TRACES_PROTOCOL") or protocol,
        metrics_protocol=otel("EXPORTER_OTLP_METRICS_PROTOCOL") or protocol,
        periodic_metrics=bool(otel("METRIC_EXPORT_INTERVAL")),
        flush_timeout_s=flush_timeout_s,
    )


def _ping_url(src: Source) -> str | None:
    value, origin = src.get("PING_URL")
    if value is None:
        return None
    parts = urlsplit(value)
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    # urllib sends no user:pass@ and no control character: such a URL would fail every ping.
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or "@" in parts.netloc
        or not port_ok
        or any(c.isspace() or not c.isprintable() for c in value)
    ):
        raise ConfigError(
            f"{origin}={redact_url(value, keep_path=False)!r} is not valid: expected an http:// or https:// URL "
            "with a host, no user:password@ and no spaces or control characters, "
            "e.g. https://hc-ping.com/UUID"
        )
    return value.rstrip("/")


def _ping_timeout(src: Source) -> float:
    seconds = src.duration("PING_TIMEOUT", DEFAULTS.run.ping_timeout_s, minimum_s=0.1)
    if seconds > 60:
        _, origin = src.get("PING_TIMEOUT")
        raise ConfigError(
            f"{origin}: {seconds:g}s is too long: a ping may delay a run's end by this much; "
            "expected at most 60s"
        )
    return seconds


def load_settings(
    env: Mapping[str, str], flags: Mapping[str, str | None] | None = None
) -> Settings:
    """Flags are keyed like the variables without ``CRON_RUNNER_`` (e.g. ``{"LEASE_TTL": "5s"}``)."""
    src = Source(env, flags or {})
    modules_raw, _ = src.get("TASK_MODULES")
    # None when fd 2 was closed at start (outside the CLI, which reopens it: runner/streams.py).
    log_format_default = "text" if sys.stderr is not None and sys.stderr.isatty() else "json"
    settings = Settings(
        redis=_redis(src),
        lease=_lease(src),
        slots=_slots(src),
        run=RunSettings(
            shutdown_grace_s=src.duration("SHUTDOWN_GRACE", DEFAULTS.run.shutdown_grace_s),
            mode=src.choice("MODE", "run", ("run", "enqueue")),
            task_modules=tuple(m.strip() for m in (modules_raw or "").split(",") if m.strip()),
            share_credentials=src.boolean("TASK_SHARES_CREDENTIALS", False),
            max_runtime_s=src.optional_duration("MAX_RUNTIME", minimum_s=1.0),
            ping_url=_ping_url(src),
            ping_timeout_s=_ping_timeout(src),
        ),
        log=LogSettings(
            format=src.choice("LOG_FORMAT", log_format_default, ("json", "text")),
            level=src.choice("LOG_LEVEL", "info", ("debug", "info", "warning", "error")).upper(),
        ),
        telemetry=_telemetry(src),
    )
    # In a CronJob pod the slot comes from the Job name and Kubernetes has validated the
    # schedule, which is kept only for status and the watchdog: croniter stays off the start path.
    if settings.slots.schedule is not None and not (
        settings.slots.job_name or settings.slots.scheduled_at_s is not None
    ):
        settings = settings._replace(slots=_checked_schedule(src, settings.slots))
    return settings


def _checked_schedule(src: Source, slots: SlotSettings) -> SlotSettings:
    """Validate the schedule now (bad cron, tolerance too large) so the error names the setting.

    The default tolerance (30 s) is not below half of a one-minute gap: for such schedules the
    default becomes just under that half, while a tolerance set explicitly is checked as given.
    """
    from runner.schedule.slots import Schedule, ToleranceTooLarge  # noqa: PLC0415 - croniter only if needed

    assert slots.schedule is not None
    try:
        Schedule.parse(slots.schedule, slots.timezone, slots.skew_tolerance_s)
        return slots
    except ToleranceTooLarge as exc:
        tolerance, origin = src.get("SKEW_TOLERANCE")
        if tolerance is not None:
            raise ConfigError(f"{origin}: {exc}") from exc
        slots = slots._replace(skew_tolerance_s=exc.min_gap_s / 2 - 1)
        Schedule.parse(slots.schedule or "", slots.timezone, slots.skew_tolerance_s)
        return slots
    except ConfigError as exc:
        raise ConfigError(f"{src.get('SCHEDULE')[1]}: {exc}") from exc
