"""What the client subcommands share: finding the broker, and turning errors into exit status 1."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable

import zmq

from hpbroker.errors import HPBrokerError

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_VARIABLE = "HPBROKER_BOOTSTRAP"


def add_bootstrap(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", "-b", metavar="HOST:PORT",
                        default=os.environ.get(BOOTSTRAP_VARIABLE, DEFAULT_BOOTSTRAP),
                        help=f"the broker's front-end (default ${BOOTSTRAP_VARIABLE}, else "
                             f"{DEFAULT_BOOTSTRAP})")


def reports_errors(command: str) -> Callable[[Callable[[argparse.Namespace], int]],
                                              Callable[[argparse.Namespace], int]]:
    """Run the command; an hpbroker error, a refused value, a timeout, an address ZeroMQ cannot
    use or a closed client becomes one line on stderr (``hpbroker <command>: <message>``) and
    exit status 1; a broken pipe is left to :func:`hpbroker.cli.main`, which ends quietly."""

    def decorate(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        @functools.wraps(run)
        def guarded(args: argparse.Namespace) -> int:
            try:
                return run(args)
            except BrokenPipeError:
                raise  # the reader went away (`| head`): main() ends quietly
            except HPBrokerError as e:
                print(f"hpbroker {command}: {type(e).__name__}: {e.message}", file=sys.stderr)
            except (ValueError, TypeError, TimeoutError, OSError, RuntimeError, zmq.ZMQError) as e:
                print(f"hpbroker {command}: {type(e).__name__}: {e}", file=sys.stderr)
            return 1

        return guarded

    return decorate
