"""A loadgen run's settings: one frozen dataclass, validated on construction.

Every field has its unit in its name or documented beside it; :mod:`loadgen.cli` maps one
command-line option to each (docs/LOADGEN.md lists them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hpbroker.client import ClientSecurity, resolve_client_security
from loadgen.payload import KeySpec, SizeSpec

__all__ = ["WORKLOADS", "LoadConfig"]

WORKLOADS = ("produce", "consume", "e2e")
DEFAULT_DURATION_S = 10.0


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """What to run, against which broker and topic, how hard, and where the results go."""

    #: "produce" (producers only), "consume" (consumers only) or "e2e" (both, end to end).
    workload: str = "e2e"
    #: the broker's front-end, "host:port".
    bootstrap: str = "127.0.0.1:9092"
    topic: str = "loadgen"
    #: create the topic (with ``partitions`` and ``topic_configs``) unless it exists.
    create_topic: bool = False
    partitions: int = 1
    #: log settings of a topic loadgen creates, e.g. (("flush_fsync", "false"),).
    topic_configs: tuple[tuple[str, str], ...] = ()
    #: delete the topic when the run ends (only one loadgen created).
    delete_topic: bool = False
    #: producer processes and consumer processes.
    producers: int = 1
    consumers: int = 1
    #: value sizes in bytes (loadgen's 24-byte header included).
    record_size: SizeSpec = field(default_factory=lambda: SizeSpec("fixed", 100))
    #: "random" (incompressible) or "log" (JSON access-log lines).
    payload: str = "random"
    keys: KeySpec = field(default_factory=lambda: KeySpec("none"))
    #: records/s of all producers together; None: as fast as possible.
    rate: float | None = None
    #: how long producers send (and, for consume, how long consumers read); see ``records``.
    duration_s: float | None = None
    #: records to send (all producers together), or for consume, to read (all consumers).
    records: int | None = None
    #: consume: read until the end offsets the partitions had at the start.
    until_end: bool = False
    #: the longest a run may take when bounded by ``records`` or ``until_end`` alone.
    max_duration_s: float = 3600.0
    #: producer settings (hpbroker.Producer): acks 0 or 1, "lz4" or None, ms, bytes.
    acks: int = 1
    compression: str | None = None
    linger_ms: float = 5.0
    batch_bytes: int = 1 << 20
    #: the producer's ``enable_idempotence`` (one copy of each record across retries) and
    #: ``max_in_flight_requests_per_partition`` (1..5), and its ``request_timeout_ms``; None: not
    #: passed, the client's default.
    enable_idempotence: bool | None = None
    max_in_flight: int | None = None
    request_timeout_ms: int | None = None
    #: records per send_many call at most; the pacing interval (a chunk of rate * pace_ms records).
    chunk_records: int = 1000
    pace_ms: float = 1.0
    #: where consumers start: "earliest" or "latest" (default: latest for e2e, earliest for consume).
    start_from: str | None = None
    #: parse every consumed record's header: tally, order and e2e latency.  False: count only.
    check: bool = True
    fetch_max_wait_ms: int = 500
    max_partition_fetch_bytes: int = 1 << 20
    #: where consumers fetch: "data_port" (the TCP data ports, sendfile) or "frontend" (the
    #: broker's ZeroMQ front-end, CurveZMQ-encrypted with security on): the consumer's fetch_via.
    fetch_via: str = "data_port"
    #: e2e: how long consumers may take, after the producers finish, to read what they sent.
    drain_timeout_s: float = 30.0
    #: seconds per progress report and timeline point.
    interval_s: float = 1.0
    #: ground truth window length, ms (windows aligned to the epoch).
    window_ms: int = 10_000
    #: seed of payload, sizes and keys; None: random.
    seed: int | None = None
    #: output files (None: not written) and switches.
    truth_path: str | None = None
    report_path: str | None = None
    plot_path: str | None = None
    json_output: bool = False
    #: "auto" (a refreshed line when stderr is a terminal), "lines" (one line per interval), "off".
    progress: str = "auto"
    #: a broker with ``security = "curve"``: this client's secret key file, the broker's public
    #: key file, or a client config file naming both (hpbroker.security.client); None each: from
    #: $HPBROKER_CLIENT_KEY_FILE / $HPBROKER_CLIENT_SERVER_KEY_FILE / $HPBROKER_CLIENT_CONFIG.
    key_file: str | None = None
    server_key_file: str | None = None
    client_config: str | None = None

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload {self.workload!r}: choose one of {', '.join(WORKLOADS)}")
        if not self.topic:
            raise ValueError("topic must not be empty")
        _check("partitions", self.partitions, 1, 100_000)
        _check("producers", self.producers, 1, 1024)
        _check("consumers", self.consumers, 1, 1024)
        if self.payload not in ("random", "log"):
            raise ValueError(f"payload {self.payload!r}: choose random or log")
        self.record_size.check()
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be positive, got {self.rate}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"duration_s must be positive, got {self.duration_s}")
        if self.records is not None:
            _check("records", self.records, 1, 2**62)
            if self.workload != "consume" and self.records < self.producers:
                raise ValueError(f"records {self.records} < producers {self.producers}")
        if self.until_end and self.workload != "consume":
            raise ValueError("until_end applies to the consume workload only")
        _check("max_duration_s", self.max_duration_s, 0.001, 10**7)
        if self.acks not in (0, 1):
            raise ValueError(f"acks must be 0 or 1, got {self.acks}")
        if self.compression not in (None, "lz4"):
            raise ValueError(f"compression {self.compression!r}: choose lz4 or none")
        _check("linger_ms", self.linger_ms, 0, 3_600_000)
        _check("batch_bytes", self.batch_bytes, 1024, 64 << 20)
        if self.enable_idempotence is not None and not isinstance(self.enable_idempotence, bool):
            raise ValueError(f"enable_idempotence must be True, False or None, "
                             f"got {self.enable_idempotence!r}")
        if self.enable_idempotence and self.acks == 0:
            raise ValueError("idempotence needs acks=1: with acks=0 the producer never learns what was "
                             "stored")
        if self.max_in_flight is not None:
            _check("max_in_flight", self.max_in_flight, 1, 5)
        if self.request_timeout_ms is not None:
            _check("request_timeout_ms", self.request_timeout_ms, 1, 3_600_000)
        _check("chunk_records", self.chunk_records, 1, 1_000_000)
        _check("pace_ms", self.pace_ms, 0.01, 10_000)
        if self.start_from not in (None, "earliest", "latest"):
            raise ValueError(f"start_from {self.start_from!r}: choose earliest or latest")
        _check("fetch_max_wait_ms", self.fetch_max_wait_ms, 0, 600_000)
        _check("max_partition_fetch_bytes", self.max_partition_fetch_bytes, 1024, 1 << 30)
        if self.fetch_via not in ("data_port", "frontend"):
            raise ValueError(f"fetch_via {self.fetch_via!r}: choose data_port or frontend")
        _check("drain_timeout_s", self.drain_timeout_s, 0, 10**6)
        _check("interval_s", self.interval_s, 0.05, 3600)
        _check("window_ms", self.window_ms, 1, 2**40)
        if self.progress not in ("auto", "lines", "off"):
            raise ValueError(f"progress {self.progress!r}: choose auto, lines or off")
        if self.plot_path is not None and not self.plot_path.lower().endswith((".svg", ".html", ".htm")):
            raise ValueError(f"plot {self.plot_path!r}: loadgen writes .svg or .html charts")

    @property
    def producing(self) -> bool:
        return self.workload in ("produce", "e2e")

    @property
    def consuming(self) -> bool:
        return self.workload in ("consume", "e2e")

    @property
    def effective_duration_s(self) -> float | None:
        """How long the run lasts when no record count (or until_end) bounds it: the duration
        given, or 10 s."""
        if self.duration_s is not None:
            return self.duration_s
        if self.records is None and not self.until_end:
            return DEFAULT_DURATION_S
        return None

    @property
    def consumer_start(self) -> str:
        return self.start_from or ("latest" if self.workload == "e2e" else "earliest")

    def security(self) -> ClientSecurity | None:
        """The CurveZMQ identity every producer, consumer and admin of the run connects with
        (read again in each process: it is the files' content, not a setting to pickle)."""
        return resolve_client_security(key_file=self.key_file, server_key_file=self.server_key_file,
                                       config_file=self.client_config)

    def producer_options(self) -> dict:
        """The producer settings passed to ``hpbroker.Producer``: those left None are not passed,
        so the client's defaults apply."""
        options = {"acks": self.acks, "linger_ms": self.linger_ms, "batch_bytes": self.batch_bytes,
                   "compression": self.compression}
        for name, value in (("enable_idempotence", self.enable_idempotence),
                            ("max_in_flight_requests_per_partition", self.max_in_flight),
                            ("request_timeout_ms", self.request_timeout_ms)):
            if value is not None:
                options[name] = value
        return options

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["record_size"] = str(self.record_size)
        out["keys"] = str(self.keys)
        out["topic_configs"] = dict(self.topic_configs)
        return out


def _check(name: str, value: object, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ValueError(f"{name} must be a number in [{low}, {high}], got {value!r}")
