"""Redis in production shapes, all real processes: TLS, Sentinel (1 primary, 1 replica,
3 sentinels) and Cluster (3 primaries). Built on ``runner.testing.RedisServer``.

Every topology is a context manager that kills what it started, on any exit.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self, cast

import redis
from redis.crc import key_slot

from runner.testing import RedisServer, Service, free_port
from tests.helpers.wait import wait_for

# -- TLS ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca_cert: str  # a CA that signed nothing here: a client trusting it must refuse


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ec_key(name: str, cwd: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", name, cwd=cwd)  # fmt: skip


def _self_signed_ca(name: str, cwd: Path) -> None:
    _ec_key(f"{name}.key", cwd)
    _openssl("req", "-x509", "-new", "-key", f"{name}.key", "-out", f"{name}.crt",
             "-subj", f"/CN={name}", "-days", "2", cwd=cwd)  # fmt: skip


def _signed(name: str, ca: str, ext: str, cwd: Path) -> None:
    _ec_key(f"{name}.key", cwd)
    _openssl("req", "-new", "-key", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
             cwd=cwd)  # fmt: skip
    (cwd / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "2",
             "-extfile", f"{name}.ext", cwd=cwd)  # fmt: skip


def make_tls_files(directory: Path) -> TlsFiles:
    """A CA, a server certificate for 127.0.0.1/localhost, and a client certificate."""
    _self_signed_ca("test-ca", directory)
    _self_signed_ca("other-ca", directory)
    _signed("server", "test-ca",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
            directory)  # fmt: skip
    _signed("client", "test-ca", "extendedKeyUsage=clientAuth\n", directory)
    d = str(directory)
    return TlsFiles(
        ca_cert=f"{d}/test-ca.crt",
        server_cert=f"{d}/server.crt",
        server_key=f"{d}/server.key",
        client_cert=f"{d}/client.crt",
        client_key=f"{d}/client.key",
        other_ca_cert=f"{d}/other-ca.crt",
    )


class TlsRedisServer(RedisServer):
    """TLS only (``--port 0``): ``self.port`` is the TLS port. Client certificates are
    required when ``require_client_cert``."""

    def __init__(self, tls: TlsFiles, *, require_client_cert: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tls = tls
        self.require_client_cert = require_client_cert

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(
            port=self.port,
            decode_responses=True,
            ssl=True,
            ssl_ca_certs=self.tls.ca_cert,
            ssl_certfile=self.tls.client_cert,
            ssl_keyfile=self.tls.client_key,
            **kwargs,  # type: ignore[arg-type]
        )

    def command(self) -> list[str]:
        return [
            *super().command(),
            "--port", "0",
            "--tls-port", str(self.port),
            "--tls-cert-file", self.tls.server_cert,
            "--tls-key-file", self.tls.server_key,
            "--tls-ca-cert-file", self.tls.ca_cert,
            "--tls-auth-clients", "yes" if self.require_client_cert else "no",
        ]  # fmt: skip


# -- Sentinel -----------------------------------------------------------------------------


def _as_dict(reply: Any) -> dict[str, Any]:
    """A RESP2 flat list of field/value pairs, as a dict."""
    return reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2], strict=True))


def sentinel_binary() -> str:
    found = shutil.which("redis-sentinel")
    if not found:
        raise RuntimeError("no redis-sentinel on PATH: apt-get install redis-sentinel")
    return found


class _Processes(Service):
    """Several processes started as one: a start that fails part way closes what it started."""

    def start(self) -> Self:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        raise NotImplementedError


class SentinelProcess:
    def __init__(
        self,
        directory: Path,
        master_port: int,
        master_name: str,
        password: str | None,
        tls: TlsFiles | None = None,
    ) -> None:
        self.port = free_port()
        self.directory = directory
        self.tls = tls
        self.config = directory / f"sentinel-{self.port}.conf"
        listen = [f"port {self.port}"]
        if tls:
            # TLS only, towards clients and towards the servers it monitors.
            listen = ["port 0", f"tls-port {self.port}", f"tls-cert-file {tls.server_cert}",
                      f"tls-key-file {tls.server_key}", f"tls-ca-cert-file {tls.ca_cert}",
                      "tls-auth-clients no", "tls-replication yes"]  # fmt: skip
        lines = [
            *listen,
            "bind 127.0.0.1",
            f"dir {directory}",
            f"sentinel monitor {master_name} 127.0.0.1 {master_port} 2",
            f"sentinel down-after-milliseconds {master_name} 1000",
            # Also how long a sentinel waits before it "fixes" a replica that replicates from
            # an address it does not know (the partition tests' proxy): longer than a test.
            f"sentinel failover-timeout {master_name} 60000",
            f"sentinel parallel-syncs {master_name} 1",
        ]
        if password:
            lines += [f"requirepass {password}", f"sentinel sentinel-pass {password}"]
        self.config.write_text("\n".join(lines) + "\n")
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None

    def client(self) -> redis.Redis:
        tls: dict[str, Any] = {"ssl": True, "ssl_ca_certs": self.tls.ca_cert} if self.tls else {}
        return redis.Redis(
            port=self.port, password=self.password, decode_responses=True, socket_timeout=2, **tls
        )

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sentinel_binary(), str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class SentinelTopology(_Processes):
    """1 primary, 1 replica, 3 sentinels on loopback. ``replica_upstream_port`` makes the
    replica replicate through another port (a proxy in front of ``primary_port``)."""

    def __init__(
        self,
        *,
        master_name: str = "mymaster",
        sentinel_password: str | None = None,
        primary_port: int | None = None,
        replica_upstream_port: int | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self.master_name = master_name
        self._tmp = tempfile.TemporaryDirectory(prefix="cron-runner-sentinel-")
        self.directory = Path(self._tmp.name)
        # Diskless sync with no delay: the default waits 5 s for more replicas to join.
        sync = ["--repl-diskless-sync-delay", "0"]
        if tls:
            sync += ["--tls-replication", "yes"]

        def server(port: int | None, args: list[str]) -> RedisServer:
            if tls:
                return TlsRedisServer(tls, require_client_cert=False, port=port, extra_args=args)
            return RedisServer(port=port, extra_args=args)

        self.primary = server(primary_port, sync)
        self.replica_upstream_port = replica_upstream_port
        self.replica = server(
            None,
            [*sync, "--replicaof", "127.0.0.1", str(replica_upstream_port or self.primary.port)],
        )
        self.sentinels = [
            SentinelProcess(self.directory, self.primary.port, master_name, sentinel_password, tls)
            for _ in range(3)
        ]

    @property
    def sentinel_env(self) -> str:
        return ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)

    def _start(self) -> None:
        self.primary.start()
        self.replica.start()
        self.wait_replica_in_sync()
        for s in self.sentinels:
            s.start()
        self.wait_sentinels_ready()

    def wait_replica_in_sync(self, timeout_s: float = 15) -> None:
        replica = self.replica.client()
        try:
            wait_for(
                lambda: (
                    cast(dict[str, Any], replica.info("replication")).get("master_link_status")
                    == "up"
                ),
                timeout_s=timeout_s,
                what="the replica's link to the primary",
            )
        finally:
            replica.close()

    def _sentinel_view(self, s: SentinelProcess) -> tuple[int, int, int] | None:
        """(known replicas in a good state, other sentinels, master port) as one sentinel sees them."""
        c = s.client()
        try:
            master = cast(dict[str, Any], c.execute_command("SENTINEL", "MASTER", self.master_name))
            replicas = cast(list[Any], c.execute_command("SENTINEL", "REPLICAS", self.master_name))
        except (redis.ConnectionError, redis.ResponseError):
            return None
        finally:
            c.close()
        master = _as_dict(master)
        good = 0
        for r in replicas:
            fields = _as_dict(r)
            flags = str(fields.get("flags", ""))
            if flags == "slave" and str(fields.get("master-link-status", "")) == "ok":
                good += 1
        return good, int(master.get("num-other-sentinels", 0)), int(master.get("port", 0))

    def wait_sentinels_ready(self, timeout_s: float = 30) -> None:
        """Every sentinel knows a healthy replica and the two other sentinels."""

        def ready() -> bool:
            views = [self._sentinel_view(s) for s in self.sentinels]
            return all(v is not None and v[0] >= 1 and v[1] >= 2 for v in views)

        wait_for(ready, timeout_s=timeout_s, what="sentinels to see the replica and each other")

    def master_port(self) -> int:
        c = self.sentinels[0].client()
        try:
            addr = cast(
                list[str],
                c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name),
            )
            return int(addr[1])
        finally:
            c.close()

    def failover(self, timeout_s: float = 30) -> int:
        """Force a failover (no quorum needed) and wait until every sentinel names the new
        primary and it accepts writes. Returns the new primary's port."""
        old = self.master_port()
        c = self.sentinels[0].client()
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    c.execute_command("SENTINEL", "FAILOVER", self.master_name)
                    break
                except redis.ResponseError as exc:
                    # NOGOODSLAVE right after a start: the sentinel's view is still warming up.
                    if time.monotonic() > deadline:
                        raise
                    if "INPROG" in str(exc):
                        break
                    time.sleep(0.1)
        finally:
            c.close()

        def switched() -> bool:
            ports = set()
            for s in self.sentinels:
                view = self._sentinel_view(s)
                ports.add(view[2] if view else 0)
            return len(ports) == 1 and old not in ports and 0 not in ports

        wait_for(switched, timeout_s=timeout_s, what="every sentinel to name the new primary")
        return self.master_port()

    def server_on(self, port: int) -> RedisServer:
        return self.primary if port == self.primary.port else self.replica

    def close(self) -> None:
        for s in self.sentinels:
            s.stop()
        self.replica.close()
        self.primary.close()
        self._tmp.cleanup()


# -- Cluster ------------------------------------------------------------------------------


class ClusterTopology(_Processes):
    """3 primaries, no replicas, created with ``redis-cli --cluster create``."""

    def __init__(self, size: int = 3) -> None:
        args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "3000"]  # fmt: skip
        # The bus port defaults to port + 10000, past 65535 for a high free port.
        self.nodes = [
            RedisServer(extra_args=[*args, "--cluster-port", str(free_port())]) for _ in range(size)
        ]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def _start(self) -> None:
        for node in self.nodes:
            node.start()
        subprocess.run(
            ["redis-cli", "--cluster", "create",
             *(f"127.0.0.1:{n.port}" for n in self.nodes), "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        self.wait_ok()

    def wait_ok(self, timeout_s: float = 30) -> None:
        def ok() -> bool:
            for node in self.nodes:
                c = node.client()
                try:
                    info = cast(str, c.execute_command("CLUSTER", "INFO"))
                except redis.RedisError:
                    return False
                finally:
                    c.close()
                if "cluster_state:ok" not in info:
                    return False
            return True

        wait_for(ok, timeout_s=timeout_s, what="cluster_state:ok on every node")

    def node_id(self, node: RedisServer) -> str:
        c = node.client()
        try:
            return cast(str, c.execute_command("CLUSTER", "MYID"))
        finally:
            c.close()

    def slot_owners(self) -> list[tuple[int, int, int]]:
        """(first slot, last slot, primary port) for every range, from CLUSTER SLOTS."""
        c = self.nodes[0].client()
        try:
            ranges = cast(list[Any], c.execute_command("CLUSTER", "SLOTS"))
        finally:
            c.close()
        return [(int(start), int(end), int(primary[1])) for start, end, primary, *_ in ranges]

    def owner_of_slot(self, slot: int) -> RedisServer:
        for start, end, port in self.slot_owners():
            if start <= slot <= end:
                return next(n for n in self.nodes if n.port == port)
        raise AssertionError(f"slot {slot} is not covered")

    def owner_of(self, key: str) -> RedisServer:
        return self.owner_of_slot(key_slot(key.encode()))

    def migrate_slot(self, slot: int, target: RedisServer) -> int:
        """Move one hash slot, keys and all, the way ``redis-cli --cluster reshard`` does.
        Returns how many keys moved."""
        source = self.begin_migration(slot, target)
        moved = self.move_keys(slot, source, target)
        self.finish_migration(slot, target)
        return moved

    def begin_migration(self, slot: int, target: RedisServer) -> RedisServer:
        """IMPORTING on the target, MIGRATING on the owner; returns the owner."""
        source = self.owner_of_slot(slot)
        src, dst = source.client(), target.client()
        try:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(source))
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(target))
        finally:
            src.close()
            dst.close()
        return source

    def move_keys(
        self, slot: int, source: RedisServer, target: RedisServer, only: list[str] | None = None
    ) -> int:
        """MIGRATE the slot's keys (or ``only`` those), TTLs kept."""
        src = source.client()
        moved = 0
        try:
            while keys := only or cast(
                list[str], src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
            ):
                src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
                if only:
                    break
        finally:
            src.close()
        return moved

    def finish_migration(self, slot: int, target: RedisServer) -> None:
        """SETSLOT NODE on every node, the target first, as redis-cli does."""
        target_id = self.node_id(target)
        for node in (target, *(n for n in self.nodes if n is not target)):
            c = node.client()
            try:
                c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
            finally:
                c.close()

    def close(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.close()


def task_names_per_node(cluster: ClusterTopology, prefix: str, scope: str) -> dict[int, str]:
    """One task name whose keys live on each node: {port: task name}."""
    from runner.keys import TaskKeys  # noqa: PLC0415

    owners = cluster.slot_owners()
    found: dict[int, str] = {}
    for i in range(10_000):
        name = f"task-{i}"
        slot = key_slot(TaskKeys(prefix, scope, name).lease.encode())
        port = next(p for start, end, p in owners if start <= slot <= end)
        found.setdefault(port, name)
        if len(found) == len(cluster.nodes):
            return found
    raise AssertionError("no task name found for some node")
