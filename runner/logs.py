"""Structured logging for ``kubectl logs``: one line per event, JSON in a cluster, text on a terminal."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

# Fields a run's log lines carry, in the order the text format shows them.
RUN_FIELDS = ("task", "slot", "holder", "fence", "outcome", "duration_ms", "exit_code")
_EXTRA_FIELDS = (*RUN_FIELDS, "event", "reason", "run_holder", "ttl_ms", "finished_at",
                 "command", "message_id", "pid", "pids", "queue", "attempt", "delay_ms",
                 "port")  # fmt: skip


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: getattr(record, k) for k in _EXTRA_FIELDS if getattr(record, k, None) is not None}


def _utc(created: float) -> str:
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
        + f".{int(created % 1 * 1000):03d}Z"
    )


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = _fields(record)
        if "task" in fields:
            # A run's line: every run field is there, null until known, so a query over many
            # tasks' logs (one crontab file, one log index) never misses a key.
            line.update(dict.fromkeys(RUN_FIELDS))
        line.update(fields)
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def _text_value(key: str, value: Any) -> Any:
    # For people: a slot as the time it stands for, as status and history show it. JSON keeps
    # epoch seconds, which queries compare as numbers.
    if key == "slot" and isinstance(value, int) and not isinstance(value, bool):
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(value))
    return value


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(
            f"{k}={_text_value(k, v)}" for k, v in _fields(record).items() if k != "event"
        )
        text = f"{_utc(record.created)} {record.levelname:<7} {record.getMessage()}"
        if fields:
            text += f"  {fields}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def setup(fmt: str, level: str) -> None:
    # The CLI's sys.stderr drops a write that fails (a pipe whose reader is gone, a full disk):
    # a lost log line never stops a run (runner/streams.py).
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


class RunLogger(logging.LoggerAdapter[logging.Logger]):
    """Adds the run's fields (task, slot, holder, fence) to every line."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs

    def bind(self, **fields: Any) -> None:
        assert isinstance(self.extra, dict)
        self.extra.update(fields)


def run_logger(task: str, holder: str) -> RunLogger:
    return RunLogger(logging.getLogger("runner"), {"task": task, "holder": holder})


def keeper_logger(run_log: RunLogger) -> RunLogger:
    """The keeper's lines under their own logger name, with the run's fields: the same dict,
    so fields bound later (the fence) reach them too."""
    return RunLogger(logging.getLogger("runner.keeper"), run_log.extra)
