"""What the client subcommands share: finding the broker, and turning errors into exit status 1.

An hpbroker error is one line that names it in words, then says what happened, then gives its
class and wire code for scripts and searches::

    hpbroker consume: unknown topic or partition: topic 'nosuch' does not exist
    (UnknownTopicOrPartitionError, error 6)

(on one line).
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import select
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import zmq

from hpbroker.errors import HPBrokerError

if TYPE_CHECKING:
    from hpbroker.security.client import ClientSecurity

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
BOOTSTRAP_VARIABLE = "HPBROKER_BOOTSTRAP"
DEFAULT_ZOOKEEPER = "127.0.0.1:2181"  # the local stack's (hpbroker up)
ZOOKEEPER_VARIABLE = "HPBROKER_ZOOKEEPER"


def add_zookeeper(parser: argparse.ArgumentParser) -> None:
    """``--zookeeper``/``-z`` HOSTS for the commands that read ZooKeeper themselves."""
    parser.add_argument("--zookeeper", "-z", metavar="HOSTS",
                        default=os.environ.get(ZOOKEEPER_VARIABLE, DEFAULT_ZOOKEEPER),
                        help=f"ZooKeeper (default ${ZOOKEEPER_VARIABLE}, else {DEFAULT_ZOOKEEPER})")


ZOOKEEPER_CREDENTIALS_VARIABLE = "HPBROKER_ZOOKEEPER_CREDENTIALS_FILE"


def add_zookeeper_credentials(parser: argparse.ArgumentParser) -> None:
    """``--zookeeper-credentials-file FILE`` for the commands that write ZooKeeper: the cluster's
    ``user:password`` (the brokers' ``zookeeper_credentials_file``), needed once its znodes
    carry ACLs (docs/SECURITY.md).  Read it with :func:`zookeeper_credentials`."""
    parser.add_argument("--zookeeper-credentials-file", metavar="FILE",
                        default=os.environ.get(ZOOKEEPER_CREDENTIALS_VARIABLE) or None,
                        help=f"the cluster's ZooKeeper credentials, user:password (default "
                             f"${ZOOKEEPER_CREDENTIALS_VARIABLE}, else none)")


def zookeeper_credentials(args: argparse.Namespace):  # -> ZkCredentials | None (kazoo loaded lazily)
    """The credentials ``--zookeeper-credentials-file`` names, or None; InvalidConfigError
    naming the file when it cannot be used."""
    path = getattr(args, "zookeeper_credentials_file", None)
    if not path:
        return None
    from hpbroker.coord.zk_security import load_credentials

    return load_credentials(path)


def add_bootstrap(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap``, and the client's CurveZMQ keys (:func:`add_client_security`)."""
    parser.add_argument("--bootstrap", "-b", metavar="HOST:PORT",
                        default=os.environ.get(BOOTSTRAP_VARIABLE, DEFAULT_BOOTSTRAP),
                        help=f"the broker's front-end (default ${BOOTSTRAP_VARIABLE}, else "
                             f"{DEFAULT_BOOTSTRAP})")
    add_client_security(parser)


def add_client_security(parser: argparse.ArgumentParser) -> None:
    """``--key-file``, ``--server-key-file``, ``--client-config``: a client's CurveZMQ identity for
    a broker with ``security = "curve"`` (read by :func:`client_security`)."""
    parser.add_argument("--key-file", metavar="PATH",
                        help="this client's secret key file, NAME.key_secret (default "
                             "$HPBROKER_CLIENT_KEY_FILE, else the client config file's)")
    parser.add_argument("--server-key-file", metavar="PATH",
                        help="the broker's public key file (default $HPBROKER_CLIENT_SERVER_KEY_FILE, "
                             "else the client config file's)")
    parser.add_argument("--client-config", metavar="PATH",
                        help="a client config file with [security] key_file and server_key_file "
                             "(default $HPBROKER_CLIENT_CONFIG)")


def client_security(args: argparse.Namespace) -> ClientSecurity | None:
    """The command's CurveZMQ identity: the options, else the environment, else the client
    config file, else None (``hpbroker.security.client.resolve_client_security``)."""
    from hpbroker.security.client import resolve_client_security

    return resolve_client_security(key_file=getattr(args, "key_file", None),
                                   server_key_file=getattr(args, "server_key_file", None),
                                   config_file=getattr(args, "client_config", None))


# Names that read badly word by word; a name of one word gets "error" after it ("storage error").
_NAMES = {"UnknownServerError": "unknown server error", "HPBrokerError": "error",
          "InvalidConfigError": "invalid configuration"}


def error_name(error: HPBrokerError) -> str:
    """The error's name in words: ``UnknownTopicOrPartitionError`` is "unknown topic or partition"."""
    cls = type(error).__name__
    if cls in _NAMES:
        return _NAMES[cls]
    words = [word if word.isupper() and len(word) > 1 else word.lower()
             for word in re.findall(r"[A-Z]+(?![a-z])|[A-Z][a-z0-9]*|[a-z0-9]+", cls.removesuffix("Error"))]
    if len(words) == 1:
        words.append("error")
    return " ".join(words) or cls


def describe_error(error: HPBrokerError) -> str:
    """``<name in words>: <message> (<class>, error <code>)`` (module docstring)."""
    return f"{error_name(error)}: {error.message} ({type(error).__name__}, error {error.code})"


def stdout_broken() -> bool:
    """Whether standard output is a pipe whose reader has gone (poll reports an error on it)."""
    try:
        fd = sys.__stdout__.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


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
            except BrokenPipeError as e:
                if stdout_broken():
                    raise  # the reader went away (`| head`): main() ends quietly
                print(f"hpbroker {command}: {type(e).__name__}: {e}", file=sys.stderr)  # a socket's
            except HPBrokerError as e:
                print(f"hpbroker {command}: {describe_error(e)}", file=sys.stderr)
            except (ValueError, TypeError, TimeoutError, OSError, RuntimeError, zmq.ZMQError) as e:
                print(f"hpbroker {command}: {type(e).__name__}: {e}", file=sys.stderr)
            return 1

        return guarded

    return decorate
