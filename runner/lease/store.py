"""The Redis client, built from settings, and calls made under the connect deadline
(docs/design.md, docs/reliability.md).

``connected`` is the one way in for every caller but a run's own connect, which is a traced
phase sharing its deadline with the acquire (runner.run.execution).

Fail closed: a call that cannot reach Redis is retried with exponential backoff and full
jitter until the deadline, then raises ``StoreUnavailable`` (exit 69). A refusal that no retry
can fix (credentials, ACL, TLS trust) raises ``ConfigError`` (exit 78) at once.

Shapes, from the settings alone: ``redis://``, ``rediss://`` (CA file, optional client
certificate, hostname checked), ``unix://``, Sentinel and Cluster (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import random
import ssl
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import redis
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    ClusterError,
    InvalidResponse,
    NoPermissionError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.sentinel import MasterNotFoundError

from runner import bundle, clock
from runner.config.settings import RedisSettings
from runner.config.timings import SOCKET_TIMEOUT_MAX_S, LeaseTimings
from runner.errors import ConfigError, StoreUnavailable, Terminated
from runner.lease.replies import NotRedis, pong

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)

# Worth another try: the server is away, loading, failing over (a replica that was the
# primary answers READONLY), or a cluster slot is moving or its node is down (TRYAGAIN,
# CLUSTERDOWN, and redis-py's ClusterError once its own redirections are exhausted).
RETRYABLE = (
    RedisConnectionError,
    RedisTimeoutError,
    BusyLoadingError,
    ReadOnlyError,
    TryAgainError,
    ClusterError,
)
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 2.0
# Redis reports a script's own ACL refusal as a plain error, not as NOPERM.
_SCRIPT_ACL_REFUSAL = "can't run this command or subcommand"
# TLS failures that no retry fixes: the server is not the one the CA file vouches for, or it
# wants a client certificate, or it does not speak TLS at all.
_TLS_CONFIG_REASONS = {
    "CERTIFICATE_VERIFY_FAILED",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED",
    "SSLV3_ALERT_BAD_CERTIFICATE",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
    "TLSV1_ALERT_UNKNOWN_CA",
    "WRONG_VERSION_NUMBER",
}


def socket_timeout_s(ttl_s: float | None) -> float:
    """A lease holder's calls must come back well inside one renew interval; a client that
    holds no lease (``ttl_s`` None: status and the other admin commands, serve, dlq, a
    Producer) gets the longest timeout a holder may have, the default TTL's."""
    return SOCKET_TIMEOUT_MAX_S if ttl_s is None else LeaseTimings(ttl_s).socket_timeout_s


def _common_kwargs(settings: RedisSettings, ttl_s: float | None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "decode_responses": True,
        # Never above the connect deadline: one try against a server that accepts and never
        # answers must not outlast it.
        "socket_timeout": min(socket_timeout_s(ttl_s), settings.connect_timeout_s),
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
        kwargs.update(_tls_kwargs(settings))
    return kwargs


def _tls_kwargs(settings: RedisSettings) -> dict[str, Any]:
    # redis-py does not check the server's name by default: any certificate the CA signed
    # would do. Without a CA file the system's CAs are trusted, so the name is all we have.
    # The self-contained runner finds the image's CAs, or carries its own (runner/bundle.py).
    return {
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": True,
        "ssl_ca_certs": settings.tls_ca_file or bundle.ca_file(),
        "ssl_certfile": settings.tls_cert_file,
        "ssl_keyfile": settings.tls_key_file,
    }


class SentinelPrimary(redis.Redis):
    """The primary, as named by the sentinels, asked again at most every ``recheck_s``.

    redis-py asks the sentinels only when it opens a connection, and the old primary keeps
    answering until Sentinel demotes it, seconds after the switch (never, if Sentinel cannot
    reach it). A runner renewing there would not see that the new primary lacks its lease.
    Asking before a command moves the next renewal to the new primary, which refuses it if the
    key did not replicate: the lease is lost within one renew interval of the switch. If no
    sentinel answers, the command fails like any unreachable Redis (fail closed).
    """

    recheck_s: float = 1.0
    _recheck_at: float = 0.0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        now = clock.monotonic()
        if now >= self._recheck_at:
            self._recheck_at = now + self.recheck_s
            # Closes idle connections to the old primary when the address changed.
            self.connection_pool.get_master_address()
        return super().execute_command(*args, **options)


def _cluster_class() -> type[Any]:
    from redis.cluster import RedisCluster  # noqa: PLC0415 - only for Cluster users

    class Cluster(RedisCluster):
        """RedisCluster whose "no node reachable" is a ConnectionError, as for one server.

        redis-py raises RedisClusterException (not a RedisError) when it cannot rebuild the
        slot table, e.g. while every node is restarting: the keeper and the connect deadline
        must treat that as Redis being away, not as a crash.
        """

        def execute_command(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().execute_command(*args, **kwargs)
            except RedisClusterException as exc:
                raise RedisConnectionError(f"Redis Cluster: {exc}") from exc

    return Cluster


def connect(
    settings: RedisSettings, ttl_s: float | None = None, *, decode_responses: bool = True
) -> Any:
    """A client for the configured shape. No I/O happens here: ``open_connection`` or the first
    command connects, except for Cluster, whose client reads the slot table at once (under the
    connect deadline). ``ttl_s``: the TTL of the lease this client holds, which bounds its
    socket timeout; None for a client that holds none. Most callers want ``connected``.

    ``decode_responses=False`` is for Dramatiq (queue mode), which decodes its own bytes.
    """
    kwargs = _common_kwargs(settings, ttl_s)
    kwargs["decode_responses"] = decode_responses
    db = _db(settings.url)
    if settings.cluster:
        if db != 0:
            raise ConfigError(
                f"CRON_RUNNER_REDIS_URL={settings.display_url!r}: Redis Cluster has only database 0"
            )
        if settings.url.startswith("unix://"):
            raise ConfigError("CRON_RUNNER_REDIS_CLUSTER: Redis Cluster needs a host, not unix://")
        cluster_class = _cluster_class()
        kwargs.pop("lib_name"), kwargs.pop("lib_version")

        def build() -> Any:
            try:
                return cluster_class.from_url(settings.url, **kwargs)
            except RedisClusterException as exc:
                refused = _caused_by(exc, NoPermissionError)
                if refused is not None:  # redis-py reports it as "cluster mode is not enabled"
                    raise refused from exc
                raise RedisConnectionError(str(exc)) from exc
            except ValueError as exc:
                raise _url_options_refused(settings, exc) from exc

        return with_deadline(
            build,
            deadline_s=clock.monotonic() + settings.connect_timeout_s,
            what="connect",
            where=settings.display_target,
        )
    if settings.sentinels:
        from redis.sentinel import Sentinel  # noqa: PLC0415 - only for Sentinel users

        sentinel_kwargs: dict[str, Any] = {
            "socket_timeout": kwargs["socket_timeout"],
            "socket_connect_timeout": kwargs["socket_connect_timeout"],
        }
        if settings.sentinel_password:
            sentinel_kwargs["password"] = settings.sentinel_password
        if settings.url.startswith("rediss://"):
            # TLS everywhere: sentinels of a TLS deployment listen on TLS ports too.
            kwargs["ssl"] = True
            sentinel_kwargs.update(ssl=True, **_tls_kwargs(settings))
        primary: SentinelPrimary = Sentinel(
            list(settings.sentinels), sentinel_kwargs=sentinel_kwargs, **kwargs
        ).master_for(settings.sentinel_master, redis_class=SentinelPrimary, db=db)
        primary.recheck_s = socket_timeout_s(ttl_s)  # below ttl/3: every renewal asks
        primary._recheck_at = clock.monotonic() + primary.recheck_s  # connecting asks anyway
        return primary
    try:
        pool = redis.ConnectionPool.from_url(settings.url, **kwargs)
    except ValueError as exc:
        raise _url_options_refused(settings, exc) from exc
    if settings.url.startswith("rediss://"):
        pool.connection_class = TlsConnection
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True  # as Redis.from_url does
    return client


@contextmanager
def connected(
    settings: RedisSettings,
    what: str,
    *,
    ttl_s: float | None = None,
    decode_responses: bool = True,
    ping: bool = True,
) -> Iterator[Any]:
    """A client (``connect``) that has answered a PING within the connect deadline, closed on
    the way out: ``StoreUnavailable`` (exit 69) when Redis stays away, ``ConfigError`` (78)
    when it refuses the settings. ``what`` names the caller in those errors.

    ``ping=False`` for a caller whose own first call goes through ``within_connect_deadline``
    (one round trip fewer), or that must start while Redis is away (serve).
    """
    client = connect(settings, ttl_s, decode_responses=decode_responses)
    try:
        if ping:
            # The handshake: a server that does not answer PONG is not Redis (exit 78).
            pong(within_connect_deadline(settings, client.ping, what=what), settings.display_target)
        yield client
    finally:
        with contextlib.suppress(RedisError):
            client.close()


def within_connect_deadline(
    settings: RedisSettings,
    call: Callable[[], T],
    *,
    what: str,
    stop: Callable[[], bool] | None = None,
) -> T:
    """``call``, retried as ``with_deadline`` does until CRON_RUNNER_CONNECT_TIMEOUT from now."""
    return with_deadline(
        call,
        deadline_s=clock.monotonic() + settings.connect_timeout_s,
        what=what,
        where=settings.display_target,
        stop=stop,
    )


class PlainServer(OSError):
    """The TLS handshake got no answer, and the server answers plain Redis: rediss:// is wrong."""


class TlsConnection(redis.connection.SSLConnection):
    """A plain Redis reads a TLS ClientHello as the start of a command and waits for the rest:
    the handshake would only time out, which looks like a server that is away (exit 69) and is
    retried until the deadline. When it times out, one plain PING tells the two apart."""

    def _connect(self) -> Any:
        # The handshake is part of connecting: it gets the connect timeout, not the read one.
        read_timeout_s = self.socket_timeout
        self.socket_timeout = self.socket_connect_timeout
        try:
            sock = super()._connect()
        except (TimeoutError, ssl.SSLError) as exc:
            if isinstance(exc, ssl.SSLError) and "timed out" not in str(exc):
                raise
            if _answers_plain_redis(self.host, self.port, self.socket_connect_timeout or 1.0):
                raise PlainServer(f"{self.host}:{self.port} answers plain Redis, not TLS") from exc
            raise
        finally:
            self.socket_timeout = read_timeout_s
        sock.settimeout(read_timeout_s)
        return sock


def _answers_plain_redis(host: str, port: int, timeout_s: float) -> bool:
    import socket  # noqa: PLC0415 - only on a failed TLS handshake

    try:
        with socket.create_connection((host, port), timeout=min(timeout_s, 1.0)) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(1) in (b"+", b"-")
    except OSError:
        return False


def open_connection(client: Any, key: str) -> None:
    """Open the pooled connection that the first command on ``key`` will use, and send no
    command: only the handshake a first command would have made (AUTH with credentials,
    SELECT for a database other than 0). A run's round trips stay what they were.

    Plain, TLS and unix: the client's pool. Sentinel: the pool asks the sentinels for the
    primary, then connects to it. Cluster: the node that holds ``key``'s slot in the table read
    when the client was built.
    """
    if getattr(client, "get_node_from_key", None) is not None:
        _open_cluster_node(client, key)
        return
    _open_pooled(client.connection_pool)
    if isinstance(client, SentinelPrimary):
        # The sentinels were just asked: the first command need not ask them again.
        client._recheck_at = clock.monotonic() + client.recheck_s


def _open_pooled(pool: Any) -> None:
    # Nothing is sent. redis-py 5.2 requires a command name (only for its bookkeeping);
    # 5.3 and later deprecate passing one.
    try:
        connection = pool.get_connection()
    except TypeError:
        connection = pool.get_connection("_")
    pool.release(connection)


def _open_cluster_node(client: Any, key: str) -> None:
    try:
        node = client.get_node_from_key(key)
        try:
            _open_pooled(client.get_redis_connection(node).connection_pool)
        except AuthenticationError:
            raise
        except (RedisConnectionError, RedisTimeoutError):
            # What RedisCluster does when a command cannot reach a node: forget the node and
            # read the slot table again, so that the next try goes where the slot lives now
            # (a replica promoted in the meantime). If no node answers, the next try says so.
            client.nodes_manager.startup_nodes.pop(node.name, None)
            node.redis_connection = None
            with contextlib.suppress(RedisClusterException, RedisError):
                client.nodes_manager.initialize()
            raise
    except RedisClusterException as exc:  # e.g. the key's slot is not covered, for now
        raise RedisConnectionError(f"Redis Cluster: {exc}") from exc


def _url_options_refused(settings: RedisSettings, exc: ValueError) -> ConfigError:
    """redis-py parses the URL's query (``?socket_timeout=...``) itself."""
    return ConfigError(f"CRON_RUNNER_REDIS_URL={settings.display_url!r}: {exc}")


def _db(url: str) -> int:
    """The database number in the URL's path (settings has checked it is a number)."""
    if url.startswith("unix://"):
        return 0
    path = url.split("://", 1)[-1].partition("/")[2].split("?", 1)[0]
    return int(path) if path.isdigit() else 0


def wait_timeout_ms(ttl_s: float) -> int:
    """LeaseTimings.wait_timeout_ms, for the run's WAIT (replicas_acknowledged)."""
    return LeaseTimings(ttl_s).wait_timeout_ms


def wait_reply_timeout_s(ttl_s: float) -> float:
    """LeaseTimings.wait_reply_timeout_s, for the run's WAIT (replicas_acknowledged)."""
    return LeaseTimings(ttl_s).wait_reply_timeout_s


class WaitUnanswered(RedisTimeoutError):
    """WAIT sent, no reply within wait_reply_timeout_s: the count is unknown, not 0."""


def replicas_acknowledged(
    client: Any, key: str, wanted: int, timeout_ms: int, reply_timeout_s: float
) -> int:
    """``WAIT wanted timeout_ms`` on the connection and node that wrote ``key``, its reply
    read within ``reply_timeout_s`` rather than the client's socket timeout.

    On Cluster, redis-py would send WAIT to every primary and add up the answers; it must go
    to the node that holds the key's slot, which is where the acquisition was written.
    """
    get_node = getattr(client, "get_node_from_key", None)
    if get_node is None:
        pool = client.connection_pool
    else:
        pool = client.get_redis_connection(get_node(key)).connection_pool
    # The pool hands back the connection it was last given (LIFO): the one that wrote the key,
    # which WAIT must run on (it counts the replication offset of this connection's writes).
    try:
        connection = pool.get_connection()
    except TypeError:  # redis-py 5.2 wants a command name
        connection = pool.get_connection("WAIT")
    try:
        connection.send_command("WAIT", wanted, timeout_ms)
        sock = connection._sock
        sock.settimeout(reply_timeout_s)
        try:
            return int(connection.read_response())
        except RedisTimeoutError as exc:
            raise WaitUnanswered(
                f"no reply to WAIT within {reply_timeout_s * 1000:.0f} ms"
            ) from exc
        finally:
            if connection._sock is not None:
                connection._sock.settimeout(connection.socket_timeout)
    finally:
        pool.release(connection)


def _caused_by(exc: BaseException, kind: type[E]) -> E | None:
    """The first ``kind`` among the exceptions that led to ``exc``."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kind):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _tls_refusal(exc: BaseException) -> ssl.SSLError | None:
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, ssl.SSLError) and (
        isinstance(cause, ssl.SSLCertVerificationError) or cause.reason in _TLS_CONFIG_REASONS
    ):
        return cause
    return None


def _sentinel_refusal(exc: BaseException) -> str | None:
    """What to check when the sentinels refused us (not merely were away), else None.

    redis-py folds every sentinel's error into one MasterNotFoundError, as text (the same
    in 5.2 and 8.x): reading it is the only way to tell a wrong password or CA, which no
    retry fixes, from sentinels that are down.
    """
    if not isinstance(exc, MasterNotFoundError):
        return None
    text = str(exc)
    if "AuthenticationError(" in text:
        return "CRON_RUNNER_REDIS_SENTINEL_PASSWORD"
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return "CRON_RUNNER_REDIS_TLS_CA_FILE (the sentinels' certificates do not verify)"
    return None


_CLUSTER_OFF = "Cluster mode is not enabled on this node"


def _wrong_server(exc: BaseException) -> str | None:
    """Why a connection error is the settings' fault (no retry helps), else None."""
    if _caused_by(exc, PlainServer) is not None:
        return (
            "the URL says rediss:// (TLS) but the server answers plain Redis: use redis://, "
            "or turn TLS on at the server"
        )
    if _CLUSTER_OFF in str(exc):
        return (
            f"not a Redis Cluster ({_CLUSTER_OFF}): unset CRON_RUNNER_REDIS_CLUSTER, or point "
            "CRON_RUNNER_REDIS_URL at a cluster node"
        )
    return None


def _config_refusal(text: str) -> str | None:
    """What to change when an error answer means the settings are wrong, else None."""
    if "unauthenticated" in text:  # Redis refuses a long command before AUTH this way
        return (
            "the server requires a password: set CRON_RUNNER_REDIS_PASSWORD (or _PASSWORD_FILE), "
            "and CRON_RUNNER_REDIS_USERNAME for an ACL user"
        )
    if "DB index is out of range" in text:
        return (
            "the database in CRON_RUNNER_REDIS_URL (/N) must be below the server's "
            "'databases' setting (16 by default)"
        )
    if "unknown command 'SENTINEL'" in text or "unknown command `SENTINEL`" in text:
        return (
            "CRON_RUNNER_REDIS_SENTINELS names a plain Redis, not a sentinel: list the "
            "sentinels (port 26379 by default), or unset it and set CRON_RUNNER_REDIS_URL"
        )
    return None


def _as_redis(call: Callable[[], T], *, what: str, where: str) -> T:
    try:
        return call()
    except InvalidResponse as exc:
        # Bytes that are not RESP (a web server, TLS, garbage): no retry makes it Redis.
        raise NotRedis(where, f"{what}: its reply is not the Redis protocol: {exc}") from exc


def with_deadline(
    call: Callable[[], T],
    *,
    deadline_s: float,
    what: str,
    where: str,
    sleep: Callable[[float], None] = time.sleep,
    stop: Callable[[], bool] | None = None,
) -> T:
    """Run ``call`` until it succeeds or ``deadline_s`` (monotonic) passes.

    Retries what may pass (RETRYABLE); refusals of the configuration raise ``ConfigError``;
    any other error answer from Redis raises ``StoreUnavailable`` without a retry.
    """
    attempt = 0
    while True:
        try:
            return _as_redis(call, what=what, where=where)
        except AuthenticationError as exc:
            raise ConfigError(
                f"Redis at {where} refused the credentials: {exc}: check "
                "CRON_RUNNER_REDIS_PASSWORD (or _PASSWORD_FILE) and CRON_RUNNER_REDIS_USERNAME"
            ) from exc
        except NoPermissionError as exc:
            raise ConfigError(f"Redis at {where}: the ACL user lacks a permission: {exc}") from exc
        except RETRYABLE as exc:
            wrong = _wrong_server(exc)
            if wrong is not None:
                raise ConfigError(f"Redis at {where}: {wrong}") from exc
            check = _sentinel_refusal(exc)
            if check is not None:
                raise ConfigError(
                    f"Redis at {where}: the sentinels refused us: check {check}"
                ) from exc
            tls = _tls_refusal(exc)
            if tls is not None:
                raise ConfigError(
                    f"Redis at {where}: TLS refused ({tls.reason}): check "
                    "CRON_RUNNER_REDIS_TLS_CA_FILE, _TLS_CERT_FILE/_TLS_KEY_FILE and that the "
                    "server's certificate names the host in CRON_RUNNER_REDIS_URL"
                ) from exc
            remaining = deadline_s - clock.monotonic()
            if remaining <= 0:
                raise StoreUnavailable(f"{what}: Redis at {where} unreachable: {exc}") from exc
            if stop is not None and stop():
                # Asked to stop (SIGTERM) while Redis was away: retrying on would only take a
                # lease to then give it back.
                raise Terminated(f"{what}: stopped while Redis at {where} was unreachable") from exc
            backoff = random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt))
            sleep(min(remaining, backoff))
            attempt += 1
        except ResponseError as exc:
            refusal = _config_refusal(str(exc))
            if refusal is not None:
                raise ConfigError(f"Redis at {where}: {exc}: {refusal}") from exc
            if _SCRIPT_ACL_REFUSAL in str(exc):
                raise ConfigError(
                    f"Redis at {where}: the ACL user lacks a command the lease scripts use: {exc}"
                ) from exc
            raise StoreUnavailable(f"{what}: Redis at {where} answered an error: {exc}") from exc
