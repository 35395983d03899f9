"""How the operations commands reach Redis and the task registry (runner.cli.ops and
runner.cli.pause): Redis errors become exit codes, a task's registration is looked up without
failing a read."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from runner.config.settings import Settings
from runner.errors import ConfigError, StoreUnavailable


@contextmanager
def connected(settings: Settings, what: str) -> Iterator[Any]:
    """A client that has answered a PING within the connect deadline (exit 69 if not); Redis
    lost or refusing later is exit 69 or 78 too, not a traceback."""
    from redis.exceptions import ConnectionError as RedisConnectionError  # noqa: PLC0415
    from redis.exceptions import NoPermissionError, TimeoutError  # noqa: PLC0415

    from runner.lease import store  # noqa: PLC0415

    where = settings.redis.display_target
    with store.connected(settings.redis, what) as client:
        try:
            yield client
        except (RedisConnectionError, TimeoutError) as exc:
            raise StoreUnavailable(f"{what}: lost Redis at {where}: {exc}") from exc
        except NoPermissionError as exc:
            raise ConfigError(f"{what}: the ACL user may not do this at {where}: {exc}") from exc


def registered(settings: Settings, task: str) -> bool:
    """A task of CRON_RUNNER_TASK_MODULES or the entry points: known, even before it runs."""
    from runner.tasks import Registry  # noqa: PLC0415

    try:
        return task in Registry.discover(settings.run.task_modules).names()
    except ConfigError:  # status is a read: tasks that cannot be imported here are not its job
        return False
