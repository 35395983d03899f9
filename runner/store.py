"""The Redis client, built from settings, and calls made under the connect deadline.

Fail closed: a call that cannot reach Redis is retried with exponential backoff and full
jitter until the deadline, then raises ``StoreUnavailable`` (exit 3).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.exceptions import AuthenticationError, BusyLoadingError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from runner import clock
from runner.errors import ConfigError, StoreUnavailable
from runner.settings import RedisSettings

T = TypeVar("T")

RETRYABLE = (RedisConnectionError, RedisTimeoutError, BusyLoadingError)
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 2.0


def socket_timeout_s(ttl_s: float) -> float:
    """A renewal must come back well inside one renew interval (ttl/3)."""
    return max(0.2, min(5.0, ttl_s / 4))


def _common_kwargs(settings: RedisSettings, ttl_s: float) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": socket_timeout_s(ttl_s),
        "socket_connect_timeout": max(0.1, min(2.0, settings.connect_timeout_s / 3)),
        # Skip CLIENT SETINFO: two round trips on every cold start of a CronJob pod.
        "lib_name": None,
        "lib_version": None,
    }
    if settings.username:
        kwargs["username"] = settings.username
    if settings.password:
        kwargs["password"] = settings.password
    if settings.url.startswith("rediss://"):
        kwargs["ssl_ca_certs"] = settings.tls_ca_file
        kwargs["ssl_certfile"] = settings.tls_cert_file
        kwargs["ssl_keyfile"] = settings.tls_key_file
    return kwargs


def connect(settings: RedisSettings, ttl_s: float, *, decode_responses: bool = True) -> Any:
    """A client for the configured shape. No I/O happens here: the first command connects.

    ``decode_responses=False`` is for Dramatiq (queue mode), which decodes its own bytes.
    """
    kwargs = _common_kwargs(settings, ttl_s)
    kwargs["decode_responses"] = decode_responses
    if settings.cluster:
        from redis.cluster import RedisCluster  # noqa: PLC0415 - only for Cluster users

        kwargs.pop("lib_name"), kwargs.pop("lib_version")
        return RedisCluster.from_url(settings.url, **kwargs)
    if settings.sentinels:
        from redis.sentinel import Sentinel  # noqa: PLC0415 - only for Sentinel users

        sentinel_kwargs: dict[str, Any] = {
            "socket_timeout": kwargs["socket_timeout"],
            "socket_connect_timeout": kwargs["socket_connect_timeout"],
        }
        if settings.sentinel_password:
            sentinel_kwargs["password"] = settings.sentinel_password
        db = settings.url.rsplit("/", 1)[-1] if settings.url.count("/") >= 3 else "0"
        return Sentinel(
            list(settings.sentinels), sentinel_kwargs=sentinel_kwargs, **kwargs
        ).master_for(settings.sentinel_master, db=int(db or 0))
    return redis.Redis.from_url(settings.url, **kwargs)


def with_deadline(
    call: Callable[[], T],
    *,
    deadline_s: float,
    what: str,
    where: str,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``call`` until it succeeds or ``deadline_s`` (monotonic) passes."""
    attempt = 0
    while True:
        try:
            return call()
        except AuthenticationError as exc:
            raise ConfigError(f"Redis at {where} refused the credentials: {exc}") from exc
        except ResponseError as exc:
            if str(exc).startswith("NOPERM"):
                raise ConfigError(
                    f"Redis at {where}: the ACL user lacks a permission: {exc}"
                ) from exc
            raise
        except RETRYABLE as exc:
            remaining = deadline_s - clock.monotonic()
            if remaining <= 0:
                raise StoreUnavailable(f"{what}: Redis at {where} unreachable: {exc}") from exc
            backoff = random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt))
            sleep(min(remaining, backoff))
            attempt += 1
