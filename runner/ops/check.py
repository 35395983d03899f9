"""``cron-runner check``: what a run needs of its Redis, checked before a run needs it (helm test).

Configuration, connectivity with latency, permission to run the lease scripts (on scratch
keys in the task keyspace, deleted after), a non-evicting ``maxmemory-policy`` and persistence.
Each finding is one line: ``ok``, ``warn`` or ``FAIL``.
"""

from __future__ import annotations

import re
import secrets
import statistics
import time
from typing import Any, TextIO

from redis.exceptions import NoPermissionError, RedisError, ResponseError

from runner import clock
from runner.config.settings import Settings
from runner.errors import ConfigError, FinishIncomplete, StoreUnavailable
from runner.keys import SCRATCH_TASK_PREFIX, ScratchKeys, TaskKeys
from runner.lease import store
from runner.lease.replies import pong
from runner.lease.scripts import Acquired, Lease, new_token

OK, WARN, FAIL = "ok", "warn", "FAIL"
PING_SAMPLES = 5

_COMMAND_RE = re.compile(r"run the '([^']+)' command")


def _info(client: Any, section: str) -> list[dict[str, Any]]:
    """INFO of every node (one for a single server; each primary's for a Cluster)."""
    reply = client.info(section)
    if reply and all(isinstance(v, dict) for v in reply.values()):
        return list(reply.values())
    return [reply]


def _refused_command(exc: RedisError) -> str:
    match = _COMMAND_RE.search(str(exc))
    return match.group(1).upper() if match else "a command"


class Check:
    def __init__(self, settings: Settings, out: TextIO) -> None:
        self.settings = settings
        self.out = out
        self.failed = False

    def say(self, level: str, text: str) -> None:
        self.failed = self.failed or level == FAIL
        self.out.write(f"{level:<4}  {text}\n")

    def run(self, *, strict: bool) -> int:
        s = self.settings
        self.say(
            OK,
            f"configuration parses: Redis {s.redis.display_url}, scope {s.lease.scope}, "
            f"key prefix {s.lease.prefix}, lease TTL {s.lease.ttl_s:g}s",
        )
        # Its own PING (reachable): a refusal is a finding here, reported with its exit code.
        with store.connected(s.redis, "check", ttl_s=s.lease.ttl_s, ping=False) as client:
            refused = self.reachable(client)
            if refused is not None:
                return refused
            self.lease_scripts(client)
            self.eviction(client, strict=strict)
            self.persistence(client)
        return 1 if self.failed else 0

    def reachable(self, client: Any) -> int | None:
        """None when Redis answers; else the exit code: 69 unreachable, 78 when it refuses the
        credentials or the settings (as a run would), 1 for any other refusal."""
        where = self.settings.redis.display_target
        try:
            pong(
                store.within_connect_deadline(self.settings.redis, client.ping, what="check"),
                where,
            )
        except StoreUnavailable as exc:
            self.say(FAIL, str(exc))
            return StoreUnavailable.exit_code
        except ConfigError as exc:
            self.say(FAIL, str(exc))
            return ConfigError.exit_code
        except RedisError as exc:
            self.say(FAIL, f"Redis at {where} refused PING: {exc}")
            return 1
        samples_ms = []
        for _ in range(PING_SAMPLES):
            started = time.perf_counter()
            pong(client.ping(), where)
            samples_ms.append((time.perf_counter() - started) * 1000)
        self.say(
            OK,
            f"Redis answers: PING {statistics.median(samples_ms):.2f} ms "
            f"(median of {PING_SAMPLES}, max {max(samples_ms):.2f} ms)",
        )
        return None

    def lease_scripts(self, client: Any) -> None:
        """Acquire, renew and complete on a scratch task, exactly as a run does, then clean up."""
        s = self.settings
        keys = ScratchKeys(
            s.lease.prefix, s.lease.scope, SCRATCH_TASK_PREFIX + secrets.token_hex(4)
        )
        slot = int(clock.wall()) // 60 * 60
        lease = Lease(
            client,
            keys,
            new_token(s.lease.holder),
            ttl_ms=s.lease.ttl_ms,
            retention_ms=60_000,
            indexed=False,
        )
        user = s.redis.username or "default"
        try:
            got = lease.acquire(slot)
            if not isinstance(got, Acquired):
                self.say(FAIL, f"lease scripts: acquire on a fresh scratch key returned {got!r}")
                return
            lease.renew()
            now = f"{clock.wall():.3f}"
            lease.complete(slot, {"outcome": "check"}, {"last_run_at": now}, {"fence": got.fence})
            self.say(OK, f"lease scripts run (acquire, renew, complete) on {keys.base}:*")
        except NoPermissionError as exc:
            what = (
                f"access the keys {keys.base}:*"
                if "keys" in str(exc)
                else f"run {_refused_command(exc)}"
            )
            self.say(FAIL, f"lease scripts: the ACL user {user!r} may not {what}: {exc}")
        except (FinishIncomplete, ResponseError) as exc:
            # A command refused inside a script; the finish script catches each refusal to keep
            # the marker safe, and says less (FinishIncomplete): name them here.
            refused = self._refused_inside_scripts(client, keys, slot)
            error = "" if isinstance(exc, FinishIncomplete) else f": {exc}"
            self.say(
                FAIL,
                f"lease scripts: the ACL user {user!r} may not run "
                f"{', '.join(refused) or 'a command'} inside them{error}",
            )
        except RedisError as exc:
            self.say(FAIL, f"lease scripts: {exc}")
        finally:
            try:
                client.delete(*keys.all_keys(slot))
            except RedisError as exc:
                self.say(FAIL, f"could not delete the scratch keys {keys.base}:*: {exc}")

    @staticmethod
    def _refused_inside_scripts(client: Any, keys: TaskKeys, slot: int) -> list[str]:
        """Redis does not say which command a script was refused: try each one directly."""
        # The very commands the scripts send (redis-py's incr() would send INCRBY).
        probes: list[tuple[str, ...]] = [
            ("GET", keys.lease),
            ("SET", keys.lease, "check", "PX", "1000"),
            ("PEXPIRE", keys.lease, "1000"),
            ("PTTL", keys.lease),
            ("INCR", keys.fence),
            ("TIME",),
            ("HMGET", keys.slot(slot), "holder"),
            ("HSET", keys.state, "check", "1"),
            ("XADD", keys.runs, "MAXLEN", "~", "1", "*", "check", "1"),
            ("DEL", keys.lease),
        ]
        refused = []
        for probe in probes:
            try:
                client.execute_command(*probe)
            except NoPermissionError:
                refused.append(probe[0])
        return refused

    def eviction(self, client: Any, *, strict: bool) -> None:
        try:
            nodes = _info(client, "memory")
        except RedisError as exc:
            self.say(WARN, f"could not read maxmemory-policy ({exc}): make sure it is noeviction")
            return
        evicting = sorted({str(n.get("maxmemory_policy")) for n in nodes} - {"noeviction", "None"})
        if not evicting:
            self.say(OK, "maxmemory-policy is noeviction")
            return
        limit = max(int(n.get("maxmemory", 0) or 0) for n in nodes)
        when = f"at maxmemory {limit} bytes" if limit else "once a maxmemory limit is set"
        self.say(
            FAIL if strict else WARN,
            f"maxmemory-policy is {', '.join(evicting)}: {when} Redis evicts keys, leases "
            "included, and two holders can then run one task; set maxmemory-policy noeviction",
        )

    def persistence(self, client: Any) -> None:
        try:
            nodes = _info(client, "persistence")
        except RedisError as exc:
            self.say(WARN, f"could not read the persistence settings ({exc})")
            return
        if all(str(n.get("aof_enabled")) == "1" for n in nodes):
            self.say(OK, "persistence: AOF is on")
            return
        try:
            save = str(client.config_get("save").get("save", "")) or "none"
        except RedisError:
            save = "unknown (CONFIG GET refused)"
        self.say(
            WARN,
            f"persistence: AOF is off (RDB save points: {save}); after a restart, leases, slot "
            "markers and fencing counters go back to the last snapshot, or are gone: set "
            "appendonly yes",
        )
