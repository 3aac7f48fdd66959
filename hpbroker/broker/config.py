"""Configuration of one broker: :class:`BrokerConfig`.

One frozen dataclass, validated on construction: a field out of range raises
:class:`~hpbroker.errors.InvalidConfigError` naming the field, the allowed range and the value.
Topic log settings default to :attr:`BrokerConfig.log` (a :class:`~hpbroker.io.LogConfig`); a topic
overrides any of them at creation.

Sources, highest precedence first: explicit overrides (the command line), then the environment
(``HPBROKER_<FIELD>``, e.g. ``HPBROKER_PORT=9192``; ``HPBROKER_LOG_<FIELD>`` for a ``[log]``
setting, e.g. ``HPBROKER_LOG_RETENTION_MS``), then a TOML file, then the defaults.  Every
setting, with its unit, default and range: docs/CONFIGURATION.md (a test keeps it true)::

    [broker]
    port = 9092
    workers = 4
    data_dir = "/var/lib/hpbroker"
    zookeeper = "127.0.0.1:2181/hpb"     # empty or absent: standalone

    [log]               # defaults for every topic's log
    flush_ms = 1
    retention_ms = 604800000
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hpbroker.coord.paths import parse_connect_string
from hpbroker.errors import InvalidConfigError
from hpbroker.io import LogConfig

__all__ = ["BrokerConfig", "super_user_names"]

_ENV_PREFIX = "HPBROKER_"
_LOG_ENV_PREFIX = "HPBROKER_LOG_"  # then a LogConfig field
# HPBROKER_ variables of the other hpbroker commands, which the broker leaves alone (and every
# HPBROKER_CLIENT_ one, a client's: hpbroker.security.client); and the test-only planted bug, read
# by the workers themselves (hpbroker.workers.replication), never a setting.
_NOT_BROKER_VARIABLES = frozenset({"HPBROKER_BOOTSTRAP", "HPBROKER_UNSAFE_ACK_BEFORE_REPLICATION"})
_CLIENT_ENV_PREFIX = "HPBROKER_CLIENT_"


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """How a broker listens, how many workers it runs, where it keeps its data."""

    #: this broker's id in the cluster.  Default 0.  Range [0, 2**31 - 1].
    broker_id: int = 0
    #: address the front-end and data ports bind to and that metadata advertises.  Default loopback.
    host: str = "127.0.0.1"
    #: TCP port of the ZeroMQ front-end.  Default 9092.  Range [1, 65535].
    port: int = 9092
    #: first TCP data port: worker ``s`` serves fetches on ``fetch_port + s``.  Default 9093.
    fetch_port: int = 9093
    #: I/O worker processes (slots).  Default: the number of CPU cores.  Range [1, 256].
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    #: directory holding the topic store and one directory per partition.  Default ``./data``.
    data_dir: str = "data"
    #: directory for the backend socket and heartbeat files; empty: ``<data_dir>/.run`` (the data
    #: directory's lock makes it this broker's alone), or a fresh one under /tmp, removed at exit,
    #: when that path is too long (ipc:// paths are limited to about 100 bytes).  Default empty.
    run_dir: str = ""
    #: ms between a worker's heartbeats.  Default 500.  Range [10, 60_000].
    heartbeat_interval_ms: int = 500
    #: ms without a heartbeat after which a serving worker is killed and respawned.  Default 30_000.
    worker_timeout_ms: int = 30_000
    #: ms a starting worker may take to recover its partitions before it is killed.  Default 600_000.
    worker_boot_timeout_ms: int = 600_000
    #: ms SIGTERM waits for workers to flush and exit before SIGKILL.  Default 30_000.
    graceful_timeout_ms: int = 30_000
    #: bytes; the largest request accepted (header, body and payload).  Default 64 MiB.
    max_request_bytes: int = 64 << 20
    #: open TCP data connections per worker; more are closed at once.  Default 1024.
    max_connections: int = 1024
    #: ms a data-port connection may stay idle (no byte in either direction, no fetch parked)
    #: before the worker closes it, checked at each heartbeat (Kafka's
    #: ``connections.max.idle.ms``).  Default 600_000 (10 min).  Range [10, 2**31 - 1].
    connections_max_idle_ms: int = 600_000
    #: ms a fetch may be parked at most; a longer ``max_wait_ms`` is served as this.  Default
    #: 30_000.  Range [0, 2**31 - 1].
    fetch_max_wait_ms: int = 30_000
    #: open ZeroMQ front-end connections; the newest beyond this are disconnected at once.
    #: Default 10_000.  Range [1, 1_000_000].
    frontend_max_connections: int = 10_000
    #: ms between the front-end's ZMTP heartbeats (PING) to each client; 0: none.  Default 10_000.
    #: Range 0 or [100, ``frontend_heartbeat_timeout_ms``).
    frontend_heartbeat_interval_ms: int = 10_000
    #: ms after which a front-end peer that sent nothing (no request, no heartbeat answer, or no
    #: handshake after connecting) is disconnected.  Default 30_000.  Range [100, 6_553_500].
    frontend_heartbeat_timeout_ms: int = 30_000
    #: ms between a worker's checks for segments to delete by retention (each also writes the
    #: recovery checkpoint of logs whose high watermark moved).  Default 60_000.
    retention_check_interval_ms: int = 60_000
    #: ms a create or delete topic may take (every worker owning a partition opening or removing
    #: it) before it is answered with error 12.  Default 30_000.
    admin_timeout_ms: int = 30_000
    #: whether a produce or fetch for an unknown topic creates it.  Default False.
    auto_create_topics: bool = False
    #: partitions of an automatically created topic.  Default 1.
    default_partitions: int = 1
    #: ZooKeeper connect string, ``host:port[,host:port...][/chroot]``: the broker registers
    #: itself and its topics there (``hpbroker.coord``, docs/COORDINATION.md).  Default empty:
    #: standalone, no ZooKeeper.
    zookeeper: str = ""
    #: ms ZooKeeper keeps the broker's session, and so its registration, without hearing from it;
    #: also the longest the broker waits at start for a ZooKeeper connection.  Default 6000.
    #: Range [1000, 600_000] (the server may narrow it: 2 to 20 ticks by default).
    zookeeper_session_timeout_ms: int = 6000
    #: TCP port of the HTTP metrics endpoint, ``GET /metrics`` in the Prometheus text format
    #: (docs/METRICS.md).  Default 0: no endpoint.  Range [0, 65535]; not ``port`` or a data port.
    metrics_port: int = 0
    #: address the metrics endpoint binds to.  Default empty: ``host``.
    metrics_host: str = ""
    #: ms between two reads of the consumer groups' committed offsets from ZooKeeper, for the lag
    #: metrics (only with ``zookeeper`` and ``metrics_port`` set).  Default 5000.
    metrics_lag_interval_ms: int = 5000
    #: replicas of each partition of a topic created without a replication factor (with
    #: ``zookeeper`` only; a standalone broker holds every replica itself, so 1).  Default 1.
    #: Range [1, 100].
    default_replication_factor: int = 1
    #: ms a follower may go without catching up with its leader's log end before the leader drops
    #: it from the in-sync replicas (Kafka's ``replica.lag.time.max.ms``).  Default 30_000.
    #: Range [100, 2**31 - 1].
    replica_lag_time_max_ms: int = 30_000
    #: bytes a follower asks for in one replica fetch (at least one whole batch comes back).
    #: Default 8 MiB.  Range [1024, 64 MiB].
    replica_fetch_max_bytes: int = 8 << 20
    #: ms a follower's fetch waits at the leader for new records.  Default 500.  Range [0, 30_000].
    replica_fetch_wait_max_ms: int = 500
    #: whether the controller moves each partition's leadership back to its preferred replica
    #: (the first of its replicas) once that replica is in sync again.  Default True.
    auto_leader_rebalance: bool = True
    #: ``"none"``: no authentication, every client may do everything; ``"curve"``: the front-end
    #: is a CurveZMQ server that admits only the public keys in ``allowlist_dir``, every request
    #: is checked against the ACLs, and the data ports serve only token holders
    #: (docs/SECURITY.md).  Default ``"none"``.
    security: str = "none"
    #: the broker's own key pair: the secret key file ``hpbroker keys generate`` wrote (its
    #: public key is the one clients name as the server key; the key's name is this broker's
    #: principal).  Required with ``security = "curve"``.  Default empty.
    server_key_file: str = ""
    #: directory of the public key files (``NAME.key``) of every principal admitted; re-read on
    #: SIGHUP.  Required with ``security = "curve"``.  Default empty.
    allowlist_dir: str = ""
    #: comma-separated principals (key names) allowed everything whatever the ACLs say; the
    #: brokers' own keys belong here (or hold ``cluster_action`` on the cluster).  Default empty.
    super_users: str = ""
    #: ms a fetch token stays valid after it is issued (clients renew before it ends).  Default
    #: 600_000 (10 min).  Range [1000, 86_400_000].
    fetch_token_lifetime_ms: int = 600_000
    #: how the TCP data ports are protected with ``security = "curve"``: ``"token"`` (every
    #: connection first presents a fetch token) or ``"loopback"`` (the data ports bind
    #: 127.0.0.1 and serve consumers without a token or ACL check: only processes on this host
    #: reach them; a replica fetch still needs a token).  Default ``"token"``.
    data_port_auth: str = "token"
    #: file holding ``user:password``, the ZooKeeper digest credentials of the cluster: every
    #: znode the broker creates then carries an ACL (all rights to that user, read to the world).
    #: Required with ``security = "curve"`` and ``zookeeper``.  Default empty.
    zookeeper_credentials_file: str = ""
    #: file holding the bearer token ``GET /metrics`` must present (``Authorization: Bearer``).
    #: With ``security = "curve"`` a metrics endpoint needs a token or a loopback
    #: ``metrics_host``.  Default empty: no token asked.
    metrics_token_file: str = ""
    #: log settings of topics that do not override them.
    log: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self) -> None:
        _check_int("broker_id", self.broker_id, 0, 2**31 - 1)
        _check_int("port", self.port, 1, 65535)
        _check_int("workers", self.workers, 1, 256)
        _check_int("fetch_port", self.fetch_port, 1, 65535 - self.workers + 1)
        _check_int("heartbeat_interval_ms", self.heartbeat_interval_ms, 10, 60_000)
        _check_int("worker_timeout_ms", self.worker_timeout_ms, 2 * self.heartbeat_interval_ms, 2**31 - 1)
        _check_int("worker_boot_timeout_ms", self.worker_boot_timeout_ms, 1, 2**31 - 1)
        _check_int("graceful_timeout_ms", self.graceful_timeout_ms, 0, 2**31 - 1)
        _check_int("max_request_bytes", self.max_request_bytes, 1024, 2**31 - 1)
        _check_int("max_connections", self.max_connections, 1, 1_000_000)
        _check_int("connections_max_idle_ms", self.connections_max_idle_ms, 10, 2**31 - 1)
        _check_int("fetch_max_wait_ms", self.fetch_max_wait_ms, 0, 2**31 - 1)
        _check_int("frontend_max_connections", self.frontend_max_connections, 1, 1_000_000)
        _check_int("frontend_heartbeat_interval_ms", self.frontend_heartbeat_interval_ms, 0, 6_553_500)
        _check_int("frontend_heartbeat_timeout_ms", self.frontend_heartbeat_timeout_ms, 100, 6_553_500)
        if self.frontend_heartbeat_interval_ms and not (
                100 <= self.frontend_heartbeat_interval_ms < self.frontend_heartbeat_timeout_ms):
            # The peers' own libzmq drops the connection when no PING comes within the timeout.
            raise InvalidConfigError(
                f"frontend_heartbeat_interval_ms must be 0 or at least 100 and below "
                f"frontend_heartbeat_timeout_ms {self.frontend_heartbeat_timeout_ms}, "
                f"got {self.frontend_heartbeat_interval_ms}")
        _check_int("retention_check_interval_ms", self.retention_check_interval_ms, 10, 2**31 - 1)
        _check_int("admin_timeout_ms", self.admin_timeout_ms, 1, 2**31 - 1)
        _check_int("default_partitions", self.default_partitions, 1, 100_000)
        _check_int("zookeeper_session_timeout_ms", self.zookeeper_session_timeout_ms, 1000, 600_000)
        _check_int("metrics_port", self.metrics_port, 0, 65535)
        _check_int("metrics_lag_interval_ms", self.metrics_lag_interval_ms, 100, 2**31 - 1)
        _check_int("default_replication_factor", self.default_replication_factor, 1, 100)
        _check_int("replica_lag_time_max_ms", self.replica_lag_time_max_ms, 100, 2**31 - 1)
        _check_int("replica_fetch_max_bytes", self.replica_fetch_max_bytes, 1024, 64 << 20)
        _check_int("replica_fetch_wait_max_ms", self.replica_fetch_wait_max_ms, 0, 30_000)
        _check_int("fetch_token_lifetime_ms", self.fetch_token_lifetime_ms, 1000, 86_400_000)
        for name in ("host", "data_dir", "run_dir", "zookeeper", "metrics_host", "security",
                     "server_key_file", "allowlist_dir", "super_users", "data_port_auth",
                     "zookeeper_credentials_file", "metrics_token_file"):
            if not isinstance(getattr(self, name), str):
                raise InvalidConfigError(f"{name} must be a string, got {getattr(self, name)!r}")
        if not self.host or not self.data_dir:
            raise InvalidConfigError("host and data_dir must not be empty")
        for name in ("auto_create_topics", "auto_leader_rebalance"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidConfigError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.zookeeper:
            try:
                parse_connect_string(self.zookeeper)
            except InvalidConfigError as e:
                raise InvalidConfigError(f"zookeeper: {e.message}") from None
        _check_security(self)
        if not isinstance(self.log, LogConfig):
            raise InvalidConfigError(f"log must be a LogConfig, got {type(self.log).__name__}")
        if self.port in range(self.fetch_port, self.fetch_port + self.workers):
            last = self.fetch_port + self.workers - 1
            raise InvalidConfigError(f"port {self.port} collides with data ports {self.fetch_port}..{last}")
        data_ports = range(self.fetch_port, self.fetch_port + self.workers)
        if self.metrics_port and (self.metrics_port == self.port or self.metrics_port in data_ports):
            raise InvalidConfigError(f"metrics_port {self.metrics_port} collides with port {self.port} or "
                                     f"data ports {self.fetch_port}..{data_ports[-1]}")

    @classmethod
    def load(cls, path: str | None = None, *, environ: Mapping[str, str] | None = None,
             **overrides: Any) -> BrokerConfig:
        """Defaults < TOML file at ``path`` < ``HPBROKER_*`` environment < ``overrides``."""
        broker: dict[str, Any] = {}
        log: dict[str, Any] = {}
        if path is not None:
            try:
                with open(path, "rb") as f:
                    document = tomllib.load(f)
            except (OSError, tomllib.TOMLDecodeError) as e:
                raise InvalidConfigError(f"cannot read the config file {path}: {e}") from None
            unknown = set(document) - {"broker", "log"}
            if unknown:
                raise InvalidConfigError(
                    f"{path}: unknown sections {sorted(unknown)} (expected [broker], [log])"
                )
            for name, section in (("broker", broker), ("log", log)):
                table = document.get(name, {})
                if not isinstance(table, dict):
                    raise InvalidConfigError(f"{path}: [{name}] must be a table, got {table!r}")
                section.update(table)
        from_broker, from_log = _from_environment(os.environ if environ is None else environ)
        broker.update(from_broker)
        log.update(from_log)
        broker.update({k: v for k, v in overrides.items() if v is not None})
        _reject_unknown(broker, {f.name for f in dataclasses.fields(cls)} - {"log"}, "broker")
        _reject_unknown(log, {f.name for f in dataclasses.fields(LogConfig)}, "log")
        try:
            return cls(**broker, log=LogConfig(**log))
        except TypeError as e:
            raise InvalidConfigError(str(e)) from None


def _from_environment(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``HPBROKER_<FIELD>`` and ``HPBROKER_LOG_<FIELD>`` values, converted to the field's type:
    (broker settings, log settings)."""
    broker_types = {f.name: f.type for f in dataclasses.fields(BrokerConfig) if f.name != "log"}
    log_types = {f.name: f.type for f in dataclasses.fields(LogConfig)}
    broker: dict[str, Any] = {}
    log: dict[str, Any] = {}
    for key, raw in environ.items():
        if (not key.startswith(_ENV_PREFIX) or key in _NOT_BROKER_VARIABLES
                or key.startswith(_CLIENT_ENV_PREFIX)):
            continue
        if key.startswith(_LOG_ENV_PREFIX):
            name, types, out = key[len(_LOG_ENV_PREFIX):].lower(), log_types, log
        else:
            name, types, out = key[len(_ENV_PREFIX):].lower(), broker_types, broker
        if name not in types:
            section = "log" if types is log_types else "broker"
            raise InvalidConfigError(f"{key}: no {section} setting {name!r}")
        kind = types[name]
        if kind == "int":
            try:
                out[name] = int(raw)
            except ValueError:
                raise InvalidConfigError(f"{key}={raw!r} is not an integer") from None
        elif kind == "bool":
            if raw.lower() not in ("true", "false", "1", "0"):
                raise InvalidConfigError(f"{key}={raw!r} is not true or false")
            out[name] = raw.lower() in ("true", "1")
        else:
            out[name] = raw
    return broker, log


_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def _check_security(config: BrokerConfig) -> None:
    """The security settings agree with each other (docs/SECURITY.md)."""
    if config.security not in ("none", "curve"):
        raise InvalidConfigError(f"security must be 'none' or 'curve', got {config.security!r}")
    if config.data_port_auth not in ("token", "loopback"):
        raise InvalidConfigError(
            f"data_port_auth must be 'token' or 'loopback', got {config.data_port_auth!r}")
    if config.security != "curve":
        return
    missing = [name for name in ("server_key_file", "allowlist_dir") if not getattr(config, name)]
    if config.zookeeper and not config.zookeeper_credentials_file:
        missing.append("zookeeper_credentials_file")
    if missing:
        raise InvalidConfigError(f"security = 'curve' needs {', '.join(missing)} set")
    metrics_host = config.metrics_host or config.host
    if config.metrics_port and not config.metrics_token_file and metrics_host not in _LOOPBACK_HOSTS:
        raise InvalidConfigError(
            f"security = 'curve' with a metrics endpoint on {metrics_host}: set metrics_token_file, or "
            "metrics_host to 127.0.0.1 (the endpoint lists every topic, group and offset)")


def super_user_names(config: BrokerConfig) -> frozenset[str]:
    """``super_users`` as a set of principal names."""
    return frozenset(name.strip() for name in config.super_users.split(",") if name.strip())


def _reject_unknown(values: Mapping[str, Any], known: set[str], section: str) -> None:
    unknown = set(values) - known
    if unknown:
        raise InvalidConfigError(f"unknown [{section}] settings {sorted(unknown)}; known: {sorted(known)}")


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidConfigError(f"{name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise InvalidConfigError(f"{name} must be in [{low}, {high}], got {value}")
