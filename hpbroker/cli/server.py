"""``hpbroker up [...]``: the local stack (``hpbroker.stack``): a managed ZooKeeper, or an existing
ensemble with ``--zookeeper``, and a broker registered in it, until Ctrl-C or SIGTERM.

``hpbroker serve [--config FILE] [--port N] ...``: run a broker (``hpbroker.workers.arbiter``)
until SIGTERM or SIGINT; settings come from the flags, then ``HPBROKER_*`` variables, then the
TOML file (``hpbroker.broker.config``, docs/CONFIGURATION.md).  Before the workers are forked, the
soft file-descriptor limit is raised to the hard one (``hpbroker.broker.descriptors``) and logged
with the number of partitions a worker can hold open.  The log goes to stderr, one line
per event, as text or JSON (``--log-format``, ``hpbroker.broker.logging_setup``); the line saying
where the broker listens goes to stdout, or with JSON into the log as its first event.  Exit status:
the arbiter's (0 after a graceful stop, 1 when it could not start), 2 for an invalid
configuration."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from hpbroker import __version__

logger = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    # Only listed here: main() hands "up ..." to the stack's own parser before this one runs.
    sub.add_parser("up", add_help=False, help="run the local stack: ZooKeeper and a broker (up --help)")
    serve = sub.add_parser("serve", help="run a broker until SIGTERM or SIGINT")
    serve.add_argument("--config", metavar="FILE", help="TOML file with [broker] and [log] sections")
    serve.add_argument("--host", help="address to bind and advertise")
    serve.add_argument("--port", type=int, help="ZeroMQ front-end port")
    serve.add_argument("--fetch-port", type=int, help="first TCP data port (worker s: fetch port + s)")
    serve.add_argument("--workers", type=int, help="I/O worker processes")
    serve.add_argument("--data-dir", metavar="DIR", help="where topics and partitions are kept")
    serve.add_argument("--broker-id", type=int, help="this broker's id")
    serve.add_argument("--metrics-port", type=int,
                       help="HTTP port of GET /metrics for Prometheus (default 0: no endpoint)")
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                       help="logging threshold (default INFO); the log goes to stderr")
    serve.add_argument("--log-format", default="text", choices=["text", "json"],
                       help="one line per event: text (default) or json (one object a line)")
    serve.set_defaults(run=serve_command)


def serve_command(args: argparse.Namespace) -> int:
    """Load the configuration, run the arbiter, return its exit status."""
    from hpbroker.broker.config import BrokerConfig
    from hpbroker.broker.descriptors import DescriptorBudget, raise_nofile_limit
    from hpbroker.broker.logging_setup import setup_logging
    from hpbroker.broker.memory import tune_allocator
    from hpbroker.errors import InvalidConfigError
    from hpbroker.workers.arbiter import Arbiter

    overrides = {"host": args.host, "port": args.port, "fetch_port": args.fetch_port, "workers": args.workers,
                 "data_dir": args.data_dir, "broker_id": args.broker_id, "metrics_port": args.metrics_port}
    try:
        config = BrokerConfig.load(args.config, **overrides)
    except InvalidConfigError as e:
        print(f"hpbroker serve: invalid configuration: {e.message}", file=sys.stderr)
        return 2
    setup_logging(args.log_level, args.log_format)
    tune_allocator()  # before the workers are forked: they inherit it
    last_port = config.fetch_port + config.workers - 1
    banner = (f"hpbroker {__version__}: broker {config.broker_id} on tcp://{config.host}:{config.port} "
              f"(ZeroMQ), data ports {config.fetch_port}..{last_port} (TCP), {config.workers} workers, "
              f"data in {os.path.abspath(config.data_dir)}"
              + (f", metrics on http://{config.metrics_host or config.host}:{config.metrics_port}/metrics"
                 if config.metrics_port else ""))
    if args.log_format == "text":
        print(banner, flush=True)
    else:  # a plain line would break the stream of JSON objects where stdout and stderr meet
        logger.info("%s", banner)
    raise_nofile_limit()  # before the workers are forked, like the allocator: they inherit it
    logger.info("%s", DescriptorBudget.current(config.max_connections).describe())
    return Arbiter(config).run()


def up(argv: Sequence[str]) -> int:
    from hpbroker.stack import run_stack

    return run_stack(argv)
