"""Redis in production shapes, configured from the environment alone: TLS (CA, client
certificate, hostname), ACL (the documented minimal rule, and that it has nothing to spare),
replica acknowledgement (WAIT), Sentinel and Cluster. Every server here is a real process."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from redis.crc import key_slot
from redis.exceptions import NoPermissionError, ResponseError

from runner.config.settings import load_settings
from runner.errors import ConfigError, FinishIncomplete, StoreUnavailable
from runner.keys import TaskKeys
from runner.lease import store
from runner.lease.scripts import Acquired, Held, Lease, SlotDone
from runner.lease.store import replicas_acknowledged
from runner.testing import RedisServer
from tests.helpers.lease_tools import command_calls
from tests.helpers.proc import LEASE, ROOT, events, outcome, run, runner_env, side_effects
from tests.helpers.tcpproxy import TcpProxy
from tests.helpers.topologies import (
    ClusterTopology,
    SentinelTopology,
    TlsFiles,
    TlsRedisServer,
    make_tls_files,
    task_names_per_node,
)
from tests.helpers.wait import wait_for

SCHEDULE = "0 0 * * *"


def _effect(effects: Path, hold_s: float = 0.0) -> list[str]:
    return ["sh", "-c", f'echo "ran $CRON_RUNNER_FENCING_TOKEN" >> {effects}; sleep {hold_s}']


# -- TLS ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_server(tls: TlsFiles) -> Iterator[TlsRedisServer]:
    # Also on 127.0.0.2, a name the server's certificate does not carry.
    server = TlsRedisServer(
        tls, require_client_cert=True, extra_args=["--bind", "127.0.0.1 127.0.0.2"]
    )
    with server:
        yield server


def _tls_env(server: TlsRedisServer, tls: TlsFiles, **extra: str) -> dict[str, str]:
    env = {
        "CRON_RUNNER_REDIS_TLS_CA_FILE": tls.ca_cert,
        "CRON_RUNNER_REDIS_TLS_CERT_FILE": tls.client_cert,
        "CRON_RUNNER_REDIS_TLS_KEY_FILE": tls.client_key,
        "CRON_RUNNER_SCHEDULE": SCHEDULE,
    }
    env.update(extra)
    return runner_env(server.url, **env)


def test_tls_with_ca_and_client_certificate_runs(
    tls_server: TlsRedisServer, tls: TlsFiles, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    env = _tls_env(tls_server, tls)
    ran = run(["exec", "--name", "tls", "--", *_effect(effects)], env)
    again = run(["exec", "--name", "tls", "--", *_effect(effects)], env)
    check = run(["check"], env)
    assert (ran.returncode, outcome(ran.stderr)) == (0, "ran"), ran.stderr
    assert (again.returncode, outcome(again.stderr)) == (0, "skipped_done"), again.stderr
    assert check.returncode == 0, check.stdout + check.stderr
    assert len(side_effects(effects)) == 1


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({"CRON_RUNNER_REDIS_TLS_CERT_FILE": "", "CRON_RUNNER_REDIS_TLS_KEY_FILE": ""},
         "CERTIFICATE_REQUIRED"),
        ({"CRON_RUNNER_REDIS_TLS_CA_FILE": "other"}, "CERTIFICATE_VERIFY_FAILED"),
        ({"host": "127.0.0.2"}, "CERTIFICATE_VERIFY_FAILED"),
    ],
    ids=["no-client-certificate", "another-ca", "a-name-the-certificate-lacks"],
)  # fmt: skip
def test_tls_refusals_exit_78_at_once_and_never_run(
    tls_server: TlsRedisServer,
    tls: TlsFiles,
    tmp_path: Path,
    change: dict[str, str],
    refusal: str,
) -> None:
    effects = tmp_path / "effects"
    env = _tls_env(tls_server, tls, CRON_RUNNER_CONNECT_TIMEOUT="20s")
    for name, value in change.items():
        if name == "host":
            env["CRON_RUNNER_REDIS_URL"] = tls_server.url.replace("127.0.0.1", value)
        else:
            env[name] = tls.other_ca_cert if value == "other" else value
    started = time.monotonic()
    res = run(["exec", "--name", "tls", "--", *_effect(effects)], env)
    assert res.returncode == 78, res.stderr
    assert refusal in res.stderr
    assert "CRON_RUNNER_REDIS_TLS_CA_FILE" in res.stderr
    assert "Traceback" not in res.stderr
    assert not effects.exists()
    # Not retried until the 20 s connect deadline: no retry fixes a refused certificate.
    assert time.monotonic() - started < 15


# -- ACL ----------------------------------------------------------------------------------

# The rule docs/reliability.md publishes, word for word (a test below checks the docs).
ACL_RULE = (
    "resetkeys ~cron-runner:* resetchannels -@all "
    "+evalsha +eval +get +set +pexpire +pttl +incr +time +hmget +hget +del +xadd +hset +sadd +ping"
)
ACL_OPTIONAL = {
    "+wait": "CRON_RUNNER_REDIS_MIN_REPLICAS",
    "+info": "check",
    "+hincrby +hsetnx": "skips counted on the slot marker and recorded once per slot",
}
ACL_COMMANDS = [w for w in ACL_RULE.split() if w.startswith("+")]
# Added for Redis Cluster (redis-py reads the slot table and the command table; ASKING
# follows a slot being moved), and for status, history, watchdog and unlock.
ACL_CLUSTER = "+cluster|slots +command +asking"
ACL_OPS = (
    "+scan +hgetall +xrange +xrevrange +hsetnx +smembers +srem +zrange +exists +zadd +zrem +hdel"
)
# Added when the URL names a database other than 0: redis-py selects it on connect.
ACL_DB = "+select"


def _acl_user(admin: redis.Redis, rule: str, name: str = "cron-runner") -> None:
    admin.execute_command("ACL", "SETUSER", name, "reset", "on", ">s3cret", *rule.split())


def exercise(client: redis.Redis, *, wait: bool = False) -> None:
    """Every path of a run's lease, as the runner takes them, PING, and WAIT if asked."""
    keys = TaskKeys("cron-runner", "acl", "every-path")
    slot = 1_700_000_000
    mine = Lease(client, keys, "pod-a:1", ttl_ms=5000)
    other = Lease(client, keys, "pod-b:2", ttl_ms=5000)
    assert isinstance(mine.acquire(slot), Acquired)  # HMGET HSET GET SET TIME INCR
    assert isinstance(other.acquire(slot), Held)  # PTTL
    mine.renew()  # PEXPIRE
    done = {"outcome": "ran"}
    mine.complete(slot, done, {"last_outcome": "ran"}, {"fence": 1})  # DEL XADD HSET
    mine.complete(slot, done, {}, {})  # a retry whose reply was lost: HGET
    mine.index()  # SADD (complete did it, but a refusal there is only logged)
    assert isinstance(other.acquire(slot), SlotDone)
    assert isinstance(other.acquire(slot + 60), Acquired)
    other.release({"outcome": "failed"}, {"last_outcome": "failed"})
    if wait:
        replicas_acknowledged(client, keys.lease, 0, 10, 1.0)
    client.ping()


def test_acl_rule_is_what_the_runner_uses(redis_server: RedisServer, r: redis.Redis) -> None:
    """As an unrestricted user, the commands that runs, a check and every lease path execute
    (INFO commandstats counts those inside scripts too) are exactly the rule's, plus the
    optional ones: nothing is missing from the rule, and it allows nothing unused."""
    env = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE=SCHEDULE, CRON_RUNNER_LEASE_TTL="1s")
    r.set(LEASE % "held", "someone:1", px=10_000)
    before = command_calls(r)
    assert run(["exec", "--name", "t", "--", "sleep", "0.6"], env).returncode == 0  # renews
    assert run(["exec", "--name", "t", "--", "sleep", "0.6"], env).returncode == 0  # skips
    assert run(["exec", "--name", "failing", "--", "false"], env).returncode == 1
    assert run(["exec", "--name", "held", "--", "true"], env).returncode == 0
    assert run(["check"], env).returncode == 0
    exercise(redis.Redis(port=redis_server.port, decode_responses=True), wait=True)
    after = command_calls(r)
    used = {name for name, calls in after.items() if calls != before.get(name, 0)}
    # INFO: the test's own commandstats, and check's optional eviction and persistence
    # findings (CONFIG GET save, when AOF is off); WAIT: only with MIN_REPLICAS; HINCRBY and
    # HSETNX: a skip's count and record, which a skip does without (pcall).
    optional = {"info", "config|get", "wait", "hincrby", "hsetnx"}
    assert used - optional == {c.removeprefix("+") for c in ACL_COMMANDS}
    assert "wait" in used


def test_minimal_acl_rule_runs_every_path(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    _acl_user(r, ACL_RULE)
    effects = tmp_path / "effects"
    env = runner_env(
        redis_server.url,
        CRON_RUNNER_REDIS_USERNAME="cron-runner",
        CRON_RUNNER_REDIS_PASSWORD="s3cret",
        CRON_RUNNER_SCHEDULE=SCHEDULE,
        CRON_RUNNER_LEASE_TTL="1s",
    )
    first = run(["exec", "--name", "acl", "--", *_effect(effects, 0.6)], env)
    again = run(["exec", "--name", "acl", "--", *_effect(effects, 0.6)], env)
    failing = run(["exec", "--name", "acl-fails", "--", "sh", "-c", "exit 7"], env)
    r.set(LEASE % "acl-held", "someone:1", px=10_000)
    held = run(["exec", "--name", "acl-held", "--", *_effect(effects)], env)
    check = run(["check"], env)
    assert [outcome(x.stderr) for x in (first, again, failing, held)] == [
        "ran", "skipped_done", "failed", "skipped_held"
    ], first.stderr + failing.stderr  # fmt: skip
    assert [x.returncode for x in (first, again, failing, held)] == [0, 0, 7, 0]
    assert check.returncode == 0, check.stdout + check.stderr
    assert len(side_effects(effects)) == 1
    exercise(redis.Redis(port=redis_server.port, username="cron-runner", password="s3cret",
                         decode_responses=True))  # fmt: skip


@pytest.mark.parametrize("dropped", [*ACL_COMMANDS, "~cron-runner:*"])
def test_minimal_acl_rule_has_nothing_to_spare(
    redis_server: RedisServer, r: redis.Redis, dropped: str
) -> None:
    _acl_user(r, " ".join(w for w in ACL_RULE.split() if w != dropped))
    client = redis.Redis(port=redis_server.port, username="cron-runner", password="s3cret",
                         decode_responses=True)  # fmt: skip
    # The finish script catches a refusal inside it (FinishIncomplete), to keep the marker safe.
    with pytest.raises((ResponseError, FinishIncomplete)) as refused:
        exercise(client)
    assert isinstance(refused.value, NoPermissionError) or "can't run this command" in str(
        refused.value
    )


def test_acl_refusal_is_a_configuration_error_naming_it(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    _acl_user(r, ACL_RULE.replace(" +incr", ""))
    effects = tmp_path / "effects"
    env = runner_env(redis_server.url, CRON_RUNNER_REDIS_USERNAME="cron-runner",
                     CRON_RUNNER_REDIS_PASSWORD="s3cret")  # fmt: skip
    inside = run(["exec", "--name", "acl", "--", *_effect(effects)], env)
    other_prefix = run(
        ["exec", "--name", "acl", "--", *_effect(effects)], {**env, "CRON_RUNNER_KEY_PREFIX": "x"}
    )
    for res in (inside, other_prefix):
        assert res.returncode == 78, res.stderr
        assert "ACL user lacks" in res.stderr
        assert "Traceback" not in res.stderr
    assert not effects.exists()


def test_a_database_other_than_0_needs_select_added(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    """The table of additions says `+select` for `/1`: without it the run is refused with
    exit 78 naming SELECT; with it the run succeeds."""
    effects = tmp_path / "effects"
    url = redis_server.url.rsplit("/", 1)[0] + "/1"
    env = runner_env(url, CRON_RUNNER_REDIS_USERNAME="cron-runner",
                     CRON_RUNNER_REDIS_PASSWORD="s3cret")  # fmt: skip
    _acl_user(r, ACL_RULE)
    refused = run(["exec", "--name", "db1", "--", *_effect(effects)], env)
    assert refused.returncode == 78, refused.stderr
    assert "'select'" in refused.stderr
    assert not effects.exists()
    _acl_user(r, f"{ACL_RULE} {ACL_DB}")
    ran = run(["exec", "--name", "db1", "--", *_effect(effects)], env)
    assert (ran.returncode, outcome(ran.stderr)) == (0, "ran"), ran.stderr
    assert len(side_effects(effects)) == 1
    fence = "cron-runner:{default:db1}:fence"
    assert (r.exists(fence), redis.Redis(port=redis_server.port, db=1).exists(fence)) == (0, 1)


def test_ops_commands_need_only_the_ops_addition(redis_server: RedisServer, r: redis.Redis) -> None:
    """status, history, watchdog and unlock answer the same to the ACL user as to an
    unrestricted one."""
    _acl_user(r, f"{ACL_RULE} {ACL_OPS}")
    env = runner_env(redis_server.url, CRON_RUNNER_SCHEDULE=SCHEDULE)
    acl_env = {**env, "CRON_RUNNER_REDIS_USERNAME": "cron-runner",
               "CRON_RUNNER_REDIS_PASSWORD": "s3cret"}  # fmt: skip
    assert run(["exec", "--name", "ops", "--", "true"], acl_env).returncode == 0
    assert run(["exec", "--name", "ops-fails", "--", "false"], acl_env).returncode == 1
    expect = ["watchdog", "--expect", "ops-new=0 3 * * *"]
    ack = ["ack", "ops", "--all"]
    for args in (["status"], ["status", "ops"], ["history", "ops"], ["watchdog"], expect, ack):
        free, restricted = run(args, env), run(args, acl_env)
        assert restricted.returncode == free.returncode, (args, restricted.stderr)
        assert restricted.stdout == free.stdout, args
    for env_used in (acl_env, env):
        r.set(LEASE % "ops-held", "someone:1", px=60_000)
        res = run(["unlock", "ops-held", "--force"], env_used)
        assert res.returncode == 0, res.stderr
        assert r.get(LEASE % "ops-held") is None


def test_docs_publish_the_tested_acl_rule() -> None:
    text = (ROOT / "docs" / "reliability.md").read_text().replace("\\|", "|")  # table cells
    docs = re.sub(r"\s*\\\n\s*", " ", text)
    assert f"ACL SETUSER cron-runner on >PASSWORD {ACL_RULE}" in docs
    for addition in (*ACL_OPTIONAL, ACL_CLUSTER, ACL_OPS):
        assert addition in docs


# -- Replica acknowledgement --------------------------------------------------------------


@pytest.fixture
def primary_with_replica() -> Iterator[tuple[RedisServer, RedisServer]]:
    with RedisServer(extra_args=["--repl-diskless-sync-delay", "0"]) as primary:
        replica = RedisServer(extra_args=["--replicaof", "127.0.0.1", str(primary.port)])
        with replica:
            c = replica.client()
            wait_for(
                lambda: cast(dict[str, Any], c.info("replication"))["master_link_status"] == "up",
                15,
                "the replica to sync",
            )
            c.close()
            yield primary, replica


def test_min_replicas_met_runs(
    primary_with_replica: tuple[RedisServer, RedisServer], tmp_path: Path
) -> None:
    primary, replica = primary_with_replica
    effects = tmp_path / "effects"
    env = runner_env(primary.url, CRON_RUNNER_REDIS_MIN_REPLICAS="1")
    res = run(["exec", "--name", "acked", "--", *_effect(effects, 0.2)], env)
    assert (res.returncode, outcome(res.stderr)) == (0, "ran"), res.stderr
    assert len(side_effects(effects)) == 1
    # The lease reached the replica before the task ran: its stream shows the whole run.
    runs = cast(list[Any], replica.client().xrange("cron-runner:{default:acked}:runs"))
    assert [fields["outcome"] for _, fields in runs] == ["ran"]


@pytest.mark.parametrize("replicas", [0, 1], ids=["no-replica", "one-replica-two-wanted"])
def test_min_replicas_unmet_releases_and_exits_3_without_running(
    redis_server: RedisServer,
    primary_with_replica: tuple[RedisServer, RedisServer],
    tmp_path: Path,
    replicas: int,
) -> None:
    primary = redis_server if replicas == 0 else primary_with_replica[0]
    effects = tmp_path / "effects"
    # 6 s: WAIT blocks 1 s and its reply has 2 s to come back (store.wait_reply_timeout_s).
    # At 1.5 s the reply had 75 ms past WAIT's own timeout, and a busy host lost it 5 times
    # in 8: "only 0 of 2" with one replica in sync (issue 12 item 21).
    env = runner_env(primary.url, CRON_RUNNER_REDIS_MIN_REPLICAS=str(replicas + 1),
                     CRON_RUNNER_LEASE_TTL="6s")  # fmt: skip
    res = run(["exec", "--name", "unacked", "--", *_effect(effects)], env)
    assert res.returncode == StoreUnavailable.exit_code, res.stderr
    assert f"only {replicas} of {replicas + 1} replicas acknowledged" in res.stderr
    assert "Traceback" not in res.stderr
    assert not effects.exists()
    client = primary.client()
    assert client.get(LEASE % "unacked") is None  # released, not left to expire
    runs = cast(list[Any], client.xrange("cron-runner:{default:unacked}:runs"))
    assert [fields["outcome"] for _, fields in runs] == ["unavailable"]


def test_a_slow_wait_reply_is_still_counted(
    primary_with_replica: tuple[RedisServer, RedisServer], tmp_path: Path
) -> None:
    """300 ms each way between the runner and the primary: WAIT's reply lands after WAIT's
    own timeout plus 600 ms. The reply still counts (the one replica in sync), where the
    socket timeout (ttl/4) used to cut it off and report 0."""
    primary, _ = primary_with_replica
    effects = tmp_path / "effects"
    with TcpProxy(primary.port) as proxy:
        proxy.set_latency(0.3)
        env = runner_env(f"redis://127.0.0.1:{proxy.port}/0", CRON_RUNNER_LEASE_TTL="6s",
                         CRON_RUNNER_REDIS_MIN_REPLICAS="2")  # fmt: skip
        res = run(["exec", "--name", "slow-wait", "--", *_effect(effects)], env)
    assert res.returncode == StoreUnavailable.exit_code, res.stderr
    assert "only 1 of 2 replicas acknowledged" in res.stderr
    assert not effects.exists()


# -- Sentinel -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sentinel() -> Iterator[SentinelTopology]:
    with SentinelTopology(sentinel_password="sentinel-s3cret") as topology:
        yield topology


def _sentinel_env(topology: SentinelTopology, **extra: str) -> dict[str, str]:
    env = {
        "CRON_RUNNER_REDIS_SENTINELS": topology.sentinel_env,
        "CRON_RUNNER_REDIS_SENTINEL_MASTER": topology.master_name,
        "CRON_RUNNER_REDIS_SENTINEL_PASSWORD": "sentinel-s3cret",
        "CRON_RUNNER_SCHEDULE": SCHEDULE,
    }
    env.update(extra)
    # The URL's host is not used with Sentinel: the sentinels name the primary.
    return runner_env("redis://ignored.invalid:6379/0", **env)


def test_sentinel_runs_on_the_primary_it_names(sentinel: SentinelTopology, tmp_path: Path) -> None:
    effects = tmp_path / "effects"
    env = _sentinel_env(sentinel, CRON_RUNNER_REDIS_MIN_REPLICAS="1")
    ran = run(["exec", "--name", "via-sentinel", "--", *_effect(effects)], env)
    again = run(["exec", "--name", "via-sentinel", "--", *_effect(effects)], env)
    check = run(["check"], env)
    assert (ran.returncode, outcome(ran.stderr)) == (0, "ran"), ran.stderr
    assert outcome(again.stderr) == "skipped_done"
    assert check.returncode == 0, check.stdout + check.stderr
    primary = sentinel.server_on(sentinel.master_port()).client()
    assert primary.keys("cron-runner:{default:via-sentinel}:slot:*")


@pytest.mark.parametrize(
    ("change", "code", "named"),
    [
        ({"CRON_RUNNER_REDIS_SENTINEL_MASTER": "nosuchmaster"}, 69, "'nosuchmaster' via sentinels"),
        # No retry fixes a wrong password: a configuration error, as for the primary's.
        (
            {"CRON_RUNNER_REDIS_SENTINEL_PASSWORD": "wrong"},
            78,
            "CRON_RUNNER_REDIS_SENTINEL_PASSWORD",
        ),
        # Sentinels that want a password and get none refuse the same way.
        ({"CRON_RUNNER_REDIS_SENTINEL_PASSWORD": ""}, 78, "CRON_RUNNER_REDIS_SENTINEL_PASSWORD"),
        (
            {"CRON_RUNNER_REDIS_SENTINELS": "127.0.0.1:1"},
            69,
            "via sentinels 127.0.0.1:1 unreachable",
        ),
        ({"CRON_RUNNER_REDIS_SENTINELS": "127.0.0.1:notaport"}, 78, "CRON_RUNNER_REDIS_SENTINELS"),
    ],
)
def test_sentinel_misconfigured_never_runs(
    sentinel: SentinelTopology, tmp_path: Path, change: dict[str, str], code: int, named: str
) -> None:
    effects = tmp_path / "effects"
    env = _sentinel_env(sentinel, CRON_RUNNER_CONNECT_TIMEOUT="500ms", **change)
    res = run(["exec", "--name", "nope", "--", *_effect(effects)], env)
    assert res.returncode == code, res.stderr
    assert named in res.stderr
    assert "Traceback" not in res.stderr
    assert "sentinel-s3cret" not in res.stderr
    assert not effects.exists()


def test_sentinel_over_tls_reaches_sentinels_and_primary_over_tls(
    tls: TlsFiles, tmp_path: Path
) -> None:
    """rediss:// with Sentinel: every server and sentinel listens on TLS only."""
    effects = tmp_path / "effects"
    with SentinelTopology(tls=tls) as topology:
        env = runner_env(
            "rediss://ignored.invalid:6379/0",
            CRON_RUNNER_REDIS_SENTINELS=topology.sentinel_env,
            CRON_RUNNER_REDIS_TLS_CA_FILE=tls.ca_cert,
            CRON_RUNNER_REDIS_MIN_REPLICAS="1",
            CRON_RUNNER_SCHEDULE=SCHEDULE,
        )
        ran = run(["exec", "--name", "tls-sentinel", "--", *_effect(effects)], env)
        wrong_ca = run(["exec", "--name", "tls-sentinel-2", "--", *_effect(effects)],
                       {**env, "CRON_RUNNER_REDIS_TLS_CA_FILE": tls.other_ca_cert,
                        "CRON_RUNNER_CONNECT_TIMEOUT": "500ms"})  # fmt: skip
    assert (ran.returncode, outcome(ran.stderr)) == (0, "ran"), ran.stderr
    assert len(side_effects(effects)) == 1
    # The sentinels' certificates do not verify: no retry fixes that, so exit 78 at once.
    assert wrong_ca.returncode == 78, wrong_ca.stderr
    assert "CRON_RUNNER_REDIS_TLS_CA_FILE" in wrong_ca.stderr
    assert "Traceback" not in wrong_ca.stderr


# -- Cluster ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterTopology]:
    with ClusterTopology() as topology:
        yield topology


def test_cluster_tasks_on_every_node_run_once(cluster: ClusterTopology, tmp_path: Path) -> None:
    env = runner_env(cluster.url, CRON_RUNNER_REDIS_CLUSTER="true", CRON_RUNNER_SCHEDULE=SCHEDULE)
    names = task_names_per_node(cluster, "cron-runner", "default")
    assert len(set(names.values())) == 3
    for port, name in names.items():
        effects = tmp_path / f"{name}.effects"
        ran = run(["exec", "--name", name, "--", *_effect(effects)], env)
        again = run(["exec", "--name", name, "--", *_effect(effects)], env)
        assert (ran.returncode, outcome(ran.stderr)) == (0, "ran"), ran.stderr
        assert outcome(again.stderr) == "skipped_done", again.stderr
        assert len(side_effects(effects)) == 1
        node = next(n for n in cluster.nodes if n.port == port)
        assert node.client().keys(f"cron-runner:{{default:{name}}}:slot:*"), name
    assert run(["check"], env).returncode == 0


def test_cluster_min_replicas_asks_the_node_holding_the_lease(
    cluster: ClusterTopology, tmp_path: Path
) -> None:
    """WAIT goes to the task's node only (redis-py would ask every primary and add up the
    answers). These primaries have no replicas: the run is refused and the lease released."""
    effects = tmp_path / "effects"
    env = runner_env(cluster.url, CRON_RUNNER_REDIS_CLUSTER="true",
                     CRON_RUNNER_REDIS_MIN_REPLICAS="1", CRON_RUNNER_LEASE_TTL="1500ms")  # fmt: skip
    res = run(["exec", "--name", "wait-cluster", "--", *_effect(effects)], env)
    assert res.returncode == 69, res.stderr
    assert "only 0 of 1 replicas acknowledged" in res.stderr
    assert not effects.exists()
    assert cluster.owner_of(LEASE % "wait-cluster").client().get(LEASE % "wait-cluster") is None


@pytest.mark.parametrize(("url_suffix", "code"), [("/1", 78), ("", 0)])
def test_cluster_database_must_be_0(cluster: ClusterTopology, url_suffix: str, code: int) -> None:
    url = cluster.url.rsplit("/", 1)[0] + url_suffix
    res = run(["exec", "--name", "db", "--", "true"],
              runner_env(url, CRON_RUNNER_REDIS_CLUSTER="true"))  # fmt: skip
    assert res.returncode == code, res.stderr
    assert "Traceback" not in res.stderr
    if code == 78:
        assert "database 0" in res.stderr


def test_cluster_unreachable_exits_3(tmp_path: Path) -> None:
    with RedisServer() as gone:
        url = gone.url
    res = run(["exec", "--name", "x", "--", "true"],
              runner_env(url, CRON_RUNNER_REDIS_CLUSTER="true",
                         CRON_RUNNER_CONNECT_TIMEOUT="500ms"))  # fmt: skip
    assert res.returncode == 69, res.stderr
    assert "Traceback" not in res.stderr
    assert [e.get("exit_code") for e in events(res.stderr) if e.get("event") == "error"] == [69]


def test_cluster_node_of_the_task_away_ends_the_run_in_its_connect_phase(tmp_path: Path) -> None:
    """The slot table comes from a node that answers; the node that holds the task's keys does
    not. The connect phase retries it (reading the table again) until the deadline: exit 69."""
    effects = tmp_path / "effects"
    with ClusterTopology() as away:
        node = away.nodes[1]
        name = task_names_per_node(away, "cron-runner", "default")[node.port]
        node.stop()
        res = run(["exec", "--name", name, "--", *_effect(effects)],
                  runner_env(away.url, CRON_RUNNER_REDIS_CLUSTER="true",
                             CRON_RUNNER_CONNECT_TIMEOUT="1s"))  # fmt: skip
    assert (res.returncode, outcome(res.stderr)) == (69, "unavailable"), res.stderr
    finished = next(e for e in events(res.stderr) if e.get("event") == "finished")
    assert "(connect: " in finished["msg"]
    assert f":{node.port}" in finished["msg"]
    assert "Traceback" not in res.stderr
    assert not effects.exists()


@pytest.mark.parametrize("dropped", ["", *ACL_CLUSTER.split()])
def test_cluster_acl_rule_on_every_node(cluster: ClusterTopology, dropped: str) -> None:
    """The rule plus the Cluster addition, on every node: runs on each node and a renewal
    redirected with ASK while the task's slot moves. Each word of the addition is needed."""
    rule = " ".join(w for w in f"{ACL_RULE} {ACL_CLUSTER}".split() if w != dropped)
    for node in cluster.nodes:
        _acl_user(node.client(), rule, name="cron-runner-cluster")
    env = runner_env(cluster.url, CRON_RUNNER_REDIS_CLUSTER="true",
                     CRON_RUNNER_REDIS_USERNAME="cron-runner-cluster",
                     CRON_RUNNER_REDIS_PASSWORD="s3cret", CRON_RUNNER_CONNECT_TIMEOUT="1s")  # fmt: skip
    codes = [run(["exec", "--name", name, "--", "true"], env).returncode
             for name in task_names_per_node(cluster, "cron-runner", "default").values()]  # fmt: skip
    settings = load_settings(env)
    keys = TaskKeys(
        "cron-runner", "default", f"ask-{dropped.strip('+') or 'all'}".replace("|", "-")
    )
    slot = key_slot(keys.lease.encode())
    target = next(n for n in cluster.nodes if n is not cluster.owner_of_slot(slot))
    asked_ok = True
    try:
        client = store.connect(settings.redis, 3.0)
        lease = Lease(client, keys, "pod:1", ttl_ms=5000)
        assert isinstance(lease.acquire(None), Acquired)
        source = cluster.begin_migration(slot, target)
        cluster.move_keys(slot, source, target, only=[keys.lease])
        try:
            lease.renew()  # the lease key has moved: ASK
        except NoPermissionError:
            asked_ok = False
        finally:
            cluster.move_keys(slot, source, target)
            cluster.finish_migration(slot, target)
        client.close()
    except ConfigError:
        asked_ok = False
    if not dropped:
        assert codes == [0, 0, 0]
        assert asked_ok
    elif dropped == "+asking":
        assert codes == [0, 0, 0]
        assert not asked_ok
    else:
        assert set(codes) == {78}, codes
