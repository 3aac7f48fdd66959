"""The ``loadgen`` command: options to a :class:`~loadgen.config.LoadConfig`, a run, the report.

Exit status: 0 when the run completed with no failed record, no worker failure and (when
checked) nothing missing, duplicated or out of order; 1 when it found any of those; 2 when the
options are invalid or the run could not start (no broker, no topic, a worker failed to boot).
"""

from __future__ import annotations

import argparse
import json
import sys

from loadgen.config import DEFAULT_DURATION_S, WORKLOADS, LoadConfig
from loadgen.payload import KeySpec, SizeSpec
from loadgen.report import format_report

__all__ = ["build_parser", "config_from_args", "main", "parse_count", "report_ok"]

_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9}


def parse_count(text: str) -> float:
    """``"2000"``, ``"2.5k"``, ``"10M"``, ``"1G"`` (decimal suffixes) as a number."""
    text = str(text).strip()
    factor = _SUFFIXES.get(text[-1:].lower(), 1)
    number = text[:-1] if factor != 1 else text
    try:
        value = float(number) * factor
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (suffixes k, M, G allowed)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


def _count(text: str) -> int:
    value = parse_count(text)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(value)


def _rate(text: str) -> float | None:
    return None if text.lower() == "max" else parse_count(text)


def _topic_config(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    return key.strip(), value.strip()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loadgen", description="Load generator for hpbroker: produce, consume or both, "
        "with live progress, latency percentiles, a loss/duplication check and ground truth for audits.")
    parser.add_argument("workload", choices=WORKLOADS, help="produce, consume, or e2e (both, end to end)")
    where = parser.add_argument_group("broker and topic")
    where.add_argument("--bootstrap", default="127.0.0.1:9092",
                       help="the broker's front-end (default %(default)s)")
    where.add_argument("--topic", default="loadgen", help="topic (default %(default)s)")
    where.add_argument("--key-file", default=None, metavar="FILE",
                       help="a broker with security = curve: this client's secret key file "
                            "(default $HPBROKER_CLIENT_KEY_FILE)")
    where.add_argument("--server-key-file", default=None, metavar="FILE",
                       help="the broker's public key file (default $HPBROKER_CLIENT_SERVER_KEY_FILE)")
    where.add_argument("--client-config", default=None, metavar="FILE",
                       help="a client config file naming both (default $HPBROKER_CLIENT_CONFIG)")
    where.add_argument("--create-topic", action="store_true", help="create the topic if it does not exist")
    where.add_argument("--partitions", type=int, default=1, help="partitions of a created topic (default 1)")
    where.add_argument("--topic-config", type=_topic_config, action="append", default=[], metavar="KEY=VALUE",
                       help="log setting of a created topic, e.g. flush_fsync=false (repeatable)")
    where.add_argument("--delete-topic", action="store_true", help="delete the topic at the end if this run "
                       "created it")
    load = parser.add_argument_group("load")
    load.add_argument("--producers", type=int, default=1, help="producer processes (default 1)")
    load.add_argument("--consumers", type=int, default=1, help="consumer processes (default 1)")
    load.add_argument("--record-size", type=SizeSpec.parse, default=SizeSpec("fixed", 100), metavar="SPEC",
                      help="value bytes, 24-byte header included: N, uniform:MIN:MAX or normal:MEAN:STDDEV "
                      "(default 100)")
    load.add_argument("--payload", choices=("random", "log"), default="random",
                      help="random bytes, or JSON access-log lines (compressible) (default random)")
    load.add_argument("--keys", type=KeySpec.parse, default=KeySpec("none"), metavar="SPEC",
                      help="none, uniform:K or zipf:K[:S] (default none)")
    load.add_argument("--rate", type=_rate, default=None, metavar="R",
                      help="records/s of all producers together, or max (default max)")
    load.add_argument("--duration", type=float, default=None, metavar="S",
                      help=f"seconds to send (consume: to read); default {DEFAULT_DURATION_S:g} unless "
                      "--records or --until-end bound the run")
    load.add_argument("--records", type=_count, default=None, metavar="N",
                      help="records to send, all producers together (consume: to read); 10M works")
    load.add_argument("--until-end", action="store_true",
                      help="consume: read up to the end offsets the partitions had at the start")
    load.add_argument("--max-duration", type=float, default=3600.0, metavar="S",
                      help="longest run when --records or --until-end alone bound it (default 3600)")
    client = parser.add_argument_group("producer and consumer settings")
    client.add_argument("--acks", type=int, choices=(0, 1), default=1,
                        help="default 1 (acknowledged after the broker's flush)")
    client.add_argument("--compression", choices=("none", "lz4"), default="none", help="default none")
    client.add_argument("--linger-ms", type=float, default=5.0, help="default 5")
    client.add_argument("--batch-bytes", type=_count, default=1 << 20, help="default 1048576")
    client.add_argument("--idempotence", choices=("on", "off"), default=None,
                        help="producer enable_idempotence: one copy of each record across retries "
                        "(default: the client's, on unless --acks 0)")
    client.add_argument("--max-in-flight", type=int, default=None, metavar="N",
                        help="producer max_in_flight_requests_per_partition, 1..5 (default: the client's)")
    client.add_argument("--request-timeout-ms", type=int, default=None, metavar="MS",
                        help="producer request_timeout_ms: a request unanswered that long is retried "
                        "(default: the client's)")
    client.add_argument("--chunk-records", type=int, default=1000,
                        help="records per send_many call at most (default 1000)")
    client.add_argument("--pace-ms", type=float, default=1.0,
                        help="with --rate: send a chunk every PACE_MS ms (default 1)")
    client.add_argument("--from", dest="start_from", choices=("earliest", "latest"), default=None,
                        help="where consumers start (default: latest for e2e, earliest for consume)")
    client.add_argument("--no-check", dest="check", action="store_false",
                        help="consumers count records only: no tally, no order check, no e2e latency")
    client.add_argument("--fetch-max-wait-ms", type=int, default=500, help="default 500")
    client.add_argument("--fetch-bytes", type=_count, default=1 << 20, help="max_partition_fetch_bytes "
                        "(default 1048576)")
    client.add_argument("--fetch-via", choices=("data_port", "frontend"), default="data_port",
                        help="where consumers fetch: the TCP data ports (sendfile, default) or the broker's "
                        "ZeroMQ front-end (CurveZMQ-encrypted with security on; slower)")
    client.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                        help="e2e: how long consumers may take after the producers end (default 30)")
    out = parser.add_argument_group("output")
    out.add_argument("--interval", type=float, default=1.0, metavar="S",
                     help="seconds per progress line and timeline point (default 1)")
    out.add_argument("--window", type=float, default=10.0, metavar="S",
                     help="ground truth window, seconds, aligned to the epoch (default 10)")
    out.add_argument("--seed", type=int, default=None, help="seed of payloads, sizes and keys")
    out.add_argument("--truth", default=None, metavar="FILE", help="write the ground truth (JSON, or CSV if "
                     "FILE ends in .csv)")
    out.add_argument("--report", default=None, metavar="FILE", help="write the report as JSON to FILE")
    out.add_argument("--plot", default=None, metavar="FILE", help="write a chart (.svg or .html)")
    out.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    out.add_argument("--progress", choices=("auto", "lines", "off"), default="auto",
                     help="auto: a refreshed line on stderr when it is a terminal (default)")
    return parser


def config_from_args(args: argparse.Namespace) -> LoadConfig:
    return LoadConfig(
        workload=args.workload, bootstrap=args.bootstrap, topic=args.topic,
        create_topic=args.create_topic, partitions=args.partitions, topic_configs=tuple(args.topic_config),
        delete_topic=args.delete_topic, producers=args.producers, consumers=args.consumers,
        record_size=args.record_size, payload=args.payload, keys=args.keys, rate=args.rate,
        duration_s=args.duration, records=args.records, until_end=args.until_end,
        max_duration_s=args.max_duration, acks=args.acks,
        compression=None if args.compression == "none" else args.compression, linger_ms=args.linger_ms,
        batch_bytes=args.batch_bytes,
        enable_idempotence=None if args.idempotence is None else args.idempotence == "on",
        max_in_flight=args.max_in_flight, request_timeout_ms=args.request_timeout_ms,
        chunk_records=args.chunk_records, pace_ms=args.pace_ms,
        start_from=args.start_from, check=args.check, fetch_max_wait_ms=args.fetch_max_wait_ms,
        max_partition_fetch_bytes=args.fetch_bytes, fetch_via=args.fetch_via,
        drain_timeout_s=args.drain_timeout,
        interval_s=args.interval, window_ms=max(1, round(args.window * 1000)), seed=args.seed,
        truth_path=args.truth, report_path=args.report, plot_path=args.plot, json_output=args.json,
        progress=args.progress, key_file=args.key_file, server_key_file=args.server_key_file,
        client_config=args.client_config)


def report_ok(report: dict) -> bool:
    """No failed record, no failed worker, and (when checked) nothing missing or repeated."""
    if report["failures"]:
        return False
    produce, consume, check = report.get("produce"), report.get("consume"), report.get("check")
    if produce and produce["failed"]:
        return False
    if consume and consume["errors"]:
        return False
    return not (check and not check["ok"])


def main(argv: list[str] | None = None) -> int:
    from loadgen.runner import LoadgenError, run

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        config.security()  # key files that cannot be read: an error now, not in every worker
    except ValueError as e:
        parser.error(str(e))
    try:
        report = run(config)
    except LoadgenError as e:
        print(f"loadgen: {e}", file=sys.stderr)
        return 2
    if config.json_output:
        json.dump(report, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(format_report(report))
    return 0 if report_ok(report) else 1


if __name__ == "__main__":
    sys.exit(main())
