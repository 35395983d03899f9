"""A CronJob pod's slot, from its Job's name and scheduled-timestamp annotation (docs/design.md,
CronJob slots).

The Kubernetes CronJob controller names each Job ``<cronjob>-<scheduled time in minutes since
the Unix epoch>``, so a pod knows its slot exactly however late it starts. Pure, and cheap: a
CronJob pod starts cold every time, so this path never imports the schedule parser
(:mod:`runner.schedule.cron`).
"""

from __future__ import annotations

import re
import time
from typing import Final

from runner.errors import ConfigError

#: 2015-01-01T00:00Z in minutes. CronJobs (then ScheduledJobs) first shipped in Kubernetes 1.4,
#: September 2016, so no controller ever named a Job for an earlier minute.
MIN_SLOT_MINUTES: Final = 23_667_840
#: Exclusive bound, the first 9-digit minute (2160-02-18): the controller writes 8 digits today.
MAX_SLOT_MINUTES: Final = 100_000_000

# 8 ASCII digits, no leading zero ("%d" never writes one). The prefix is greedy, so digits
# inside the CronJob's own name ("report-v2", "backup-2") stay in the prefix. \Z, not $. A
# pattern, compiled (and cached by re) on first use: a run outside a CronJob never needs it.
_JOB_NAME_RE: Final = r"(?a)(?P<cronjob>.+)-(?P<minutes>[1-9][0-9]{7})\Z"


def utc(t_s: float) -> str:
    """A time as slots are shown: ISO 8601 in UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_s))


def slot_from_job_name(job_name: str, cronjob_name: str | None) -> int | None:
    """The slot (epoch seconds) encoded in a CronJob's Job name, or ``None`` for a manual run.

    The name must be ``<cronjob>-<minutes>``, where ``<minutes>`` is a plausible minute since
    the Unix epoch as the controller writes it: exactly 8 ASCII digits, no leading zero, and a
    value from 2015-01-01 (:data:`MIN_SLOT_MINUTES`) up to February 2160
    (:data:`MAX_SLOT_MINUTES`, where a ninth digit appears). That rule is what tells a
    controller's name from the names people and tools give manual Jobs:

    * short numbers (``backup-2``, ``job-42``) and 5-character generated suffixes are too short;
    * epoch seconds (``x-1767225600``, 10 digits) and ``date +%Y%m%d%H%M`` stamps are too long;
    * ``date +%Y%m%d`` (``x-20260115``) has 8 digits but reads as a minute in 2008, before any
      CronJob existed;
    * ``x-manual``, ``x-abc`` or a hash with letters do not parse at all.

    When ``cronjob_name`` is given (``CRON_RUNNER_CRONJOB_NAME``), everything before the last
    ``-`` must equal it exactly; a Job created by hand as ``kubectl create job --from=cronjob/x
    y-29500000`` is then a manual run too. When it is ``None`` or empty, any non-empty prefix is
    accepted.
    """
    match = re.fullmatch(_JOB_NAME_RE, job_name)
    if match is None:
        return None
    if cronjob_name and match["cronjob"] != cronjob_name:
        return None
    minutes = int(match["minutes"])
    if minutes < MIN_SLOT_MINUTES:
        return None
    return minutes * 60


def cronjob_slot(
    job_name: str | None, cronjob_name: str | None, scheduled_at_s: float | None
) -> int | None:
    """The slot of a CronJob's pod: the Job name's minute, checked against the controller's
    scheduled-timestamp annotation when both are there; None for a manual run."""
    named = slot_from_job_name(job_name, cronjob_name) if job_name else None
    if scheduled_at_s is None:
        return named
    # The annotation has seconds, the name minutes (the controller's getTimeHashInMinutes):
    # the slot stays the name's minute, the one the previous release used too.
    annotated = int(scheduled_at_s // 60) * 60
    if not MIN_SLOT_MINUTES <= annotated // 60 < MAX_SLOT_MINUTES:
        raise ConfigError(
            f"CRON_RUNNER_SCHEDULED_TIMESTAMP says {utc(max(scheduled_at_s, 0.0))}: expected a "
            "time from 2015 to 2160, as the CronJob controller writes"
        )
    if named is not None and named != annotated:
        raise ConfigError(
            f"CRON_RUNNER_JOB_NAME={job_name!r} names the slot {utc(named)} but "
            f"CRON_RUNNER_SCHEDULED_TIMESTAMP (batch.kubernetes.io/cronjob-scheduled-timestamp) "
            f"says {utc(scheduled_at_s)}: expected both from the CronJob controller, agreeing "
            "to the minute"
        )
    return annotated
