"""``python -m chaos``: the command line of a chaos campaign (``chaos.runner`` runs it).

    python -m chaos [--duration S] [--seed N] [--brokers 3..5] [--nemeses kill,pause,...]
                    [--out DIR] [--short] [--partitions N] [--rate R] [--session-timeout-ms MS]

``--short`` is the preset of ``make test``: about three minutes, every nemesis at least once, a
4 s ZooKeeper session timeout; options given with it override its values.  Exit status (the
run's verdict, ``chaos.verdict``): 0 OK; 1 FAILED, the acks=all topics show lost-write,
inconsistent-offsets or poll-skip (the report says which records); 3 INCONCLUSIVE, problems met
or an empty campaign (printed as ``chaos: problem: ...``); 2 for bad usage, a ``--out`` that is
not empty, or a machine that cannot run the campaign (the message says why: not root, no ``ip
netns``, no Java or ZooKeeper, no libfaketime, no nftables); 130 when interrupted (Ctrl-C or
SIGTERM), once everything it started is stopped.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from chaos.runner import FULL, NEMESES, SHORT, CampaignOptions, run_campaign

__all__ = ["main", "parse_args"]


def _nemesis_list(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in NEMESES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown nemesis {', '.join(unknown) or '(none given)'}; "
                                         f"known: {', '.join(NEMESES)}")
    return names


def _brokers(text: str) -> int:
    value = int(text)
    if not 3 <= value <= 5:
        raise argparse.ArgumentTypeError(f"--brokers must be 3, 4 or 5, got {value}")
    return value


def _positive(kind: type) -> object:
    def parse(text: str) -> object:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value
    return parse


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(
        prog="python -m chaos",
        description="Attack a real hpbroker cluster (ZooKeeper ensemble of three, brokers in network "
                    "namespaces) with faults on a seeded schedule while producers and a consumer group run, "
                    "then check every acknowledged record and write a report (docs/CHAOS.md).")
    made.add_argument("--duration", type=_positive(float),
                      help=f"seconds of faults (default {FULL.duration_s:.0f}; "
                           f"--short: {SHORT.duration_s:.0f})")
    made.add_argument("--seed", type=int, help="the schedule's seed (default: random, printed)")
    made.add_argument("--brokers", type=_brokers, help=f"brokers, 3 to 5 (default {FULL.brokers})")
    made.add_argument("--nemeses", type=_nemesis_list, help="comma-separated fault kinds (default: all)")
    made.add_argument("--out", type=Path, help="the results directory (default chaos-results/<UTC time>)")
    made.add_argument("--short", action="store_true",
                      help="the short campaign: about 3 minutes, every nemesis at least once")
    made.add_argument("--partitions", type=_positive(int), help="partitions per topic")
    made.add_argument("--rate", type=_positive(float), help="records a second per producer")
    made.add_argument("--session-timeout-ms", type=_positive(int), help="the ZooKeeper session timeout")
    return made


def parse_args(argv: Sequence[str]) -> CampaignOptions:
    args = parser().parse_args(argv)
    options = SHORT if args.short else FULL
    given = {"duration_s": args.duration, "seed": args.seed, "brokers": args.brokers, "nemeses": args.nemeses,
             "partitions": args.partitions, "rate_per_producer": args.rate,
             "session_timeout_ms": args.session_timeout_ms}
    out = args.out or Path("chaos-results") / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return options.replace(out=out, argv=tuple(argv), **{k: v for k, v in given.items() if v is not None})


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run_campaign(options)
    except KeyboardInterrupt:  # the runner has stopped everything by then
        print(f"chaos: interrupted; everything stopped; the files so far: {options.out}", file=sys.stderr)
        return 130
