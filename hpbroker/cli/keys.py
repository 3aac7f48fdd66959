"""``hpbroker keys generate|list|allow|revoke``: CurveZMQ key files (``hpbroker.security.keys``).

``generate NAME [--dir DIR]`` writes ``DIR/NAME.key`` (public) and ``DIR/NAME.key_secret``
(secret, mode 0600) and prints both paths and the public key; an existing key is never
overwritten.  ``list [--dir DIR]``: a line per key, ``NAME  PUBLIC_KEY  public|public+secret
PATH``.  ``allow PUBLIC_KEY_FILE --allowlist DIR [--name NAME]`` copies a public key onto a
broker's allowlist as ``NAME.key`` (default: the file's own name) and prints the principal it
admits; a key the allowlist has under another name is refused; ``revoke NAME --allowlist DIR``
moves ``NAME.key`` into ``DIR/revoked/``.  A broker re-reads its allowlist on SIGHUP
(``systemctl reload hpbroker``): both commands say so.  DIR defaults to ``./keys``.  These
commands touch files only, never a broker.
"""

from __future__ import annotations

import argparse

from hpbroker.cli.common import reports_errors

DEFAULT_KEY_DIR = "keys"
_RELOAD_HINT = ("the broker applies it once it re-reads its allowlist: send it SIGHUP "
                "(kill -HUP <pid>, or systemctl reload hpbroker)")


def register(sub: argparse._SubParsersAction) -> None:
    keys = sub.add_parser("keys", help="generate, list, allowlist or revoke CurveZMQ keys")
    actions = keys.add_subparsers(dest="action", required=True)
    generate = actions.add_parser("generate", help="write a new key pair NAME.key and NAME.key_secret")
    generate.add_argument("name", help="the key's name: the principal ACLs name")
    generate.add_argument("--dir", "-d", default=DEFAULT_KEY_DIR, help="where to write it (default ./keys)")
    listing = actions.add_parser("list", help="list the keys in a directory")
    listing.add_argument("--dir", "-d", default=DEFAULT_KEY_DIR, help="the directory (default ./keys)")
    allow = actions.add_parser("allow", help="copy a public key file onto a broker's allowlist")
    allow.add_argument("path", help="the public key file, NAME.key")
    allow.add_argument("--allowlist", "-a", required=True, metavar="DIR", help="the broker's allowlist_dir")
    allow.add_argument("--name", "-n", help="the principal to admit the key as (default: the file's name, "
                       "NAME of NAME.key)")
    revoke = actions.add_parser("revoke", help="take a key off a broker's allowlist")
    revoke.add_argument("name")
    revoke.add_argument("--allowlist", "-a", required=True, metavar="DIR", help="the broker's allowlist_dir")
    keys.set_defaults(run=_run)


@reports_errors("keys")
def _run(args: argparse.Namespace) -> int:
    from hpbroker.security import keys

    if args.action == "generate":
        pair = keys.generate_key_pair(args.dir, args.name)
        public = pair.path.with_name(args.name + keys.PUBLIC_SUFFIX)
        print(f"public key: {public}  (give it to brokers' allowlists: hpbroker keys allow {public} "
              f"--allowlist DIR)")
        print(f"secret key: {pair.path}  (mode 0600: keep it with {args.name!r}, never share it)")
        print(f"public-key = {pair.public_key.decode()}")
    elif args.action == "list":
        for info in keys.list_keys(args.dir):
            kind = "public+secret" if info.has_secret else "public"
            print(f"{info.name}\t{info.public_key.decode()}\t{kind}\t{info.path}")
    elif args.action == "allow":
        target = keys.allow_key(args.path, args.allowlist, args.name)
        print(f"allowlisted principal {keys.key_name(target)!r}: {target}; {_RELOAD_HINT}")
    else:
        target = keys.revoke_key(args.allowlist, args.name)
        print(f"revoked {args.name!r}: moved to {target}; {_RELOAD_HINT}; then its next connection is "
              f"refused, and its requests on connections still open get error 27")
    return 0
