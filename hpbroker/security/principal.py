"""A connection's identity with security on: the key's name *and* which key it was.

A principal is a key name (``hpbroker.security.keys``): ACLs, ``super_users``, error messages
and logs speak of names.  But a name alone cannot tell a key from the one that replaced it under
the same name (a leaked key rotated: ``keys revoke alice``, ``keys generate alice``, ``keys
allow``, SIGHUP): a connection made with the old key would still be "alice".  So the broker
identifies a connection by the pair (name, *fingerprint*), the fingerprint being the first
:data:`FINGERPRINT_CHARS` z85 characters of the public key it authenticated with, and treats a
pair no longer on the allowlist exactly like a name removed from it (error 27).

- The front-end's ZAP handler sets the ZeroMQ ``User-Id`` of a connection to
  ``NAME#FINGERPRINT`` (:func:`user_id`); ``#`` is never in a key name (``keys.KEY_NAME``), so
  the first ``#`` splits it (the fingerprint itself may hold ``#``: z85 has it).
- :class:`Principal` is a ``str`` equal to the bare name (it compares, hashes, prints and
  encodes as the name: every ACL check and message sees ``alice``) that also carries
  :attr:`Principal.fingerprint`.
- Fetch tokens carry the fingerprint too (``hpbroker.security.tokens``), so a token minted for a
  connection of the old key is refused at the data ports once the key changed.

Pure: no I/O, no zmq.
"""

from __future__ import annotations

__all__ = ["FINGERPRINT_CHARS", "SEPARATOR", "Principal", "fingerprint", "from_user_id", "user_id"]

SEPARATOR = "#"  # between the name and the fingerprint in a User-Id: never in a key name
FINGERPRINT_CHARS = 16  # z85 characters of the public key (80 bits)


class Principal(str):
    """A key name (the ``str`` value) and the fingerprint of the key that authenticated it
    (``""`` when unknown: matches no key)."""

    fingerprint: str

    def __new__(cls, name: str, fingerprint: str) -> Principal:
        self = super().__new__(cls, name)
        self.fingerprint = fingerprint
        return self

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return Principal, (str(self), self.fingerprint)


def fingerprint(public_key: bytes) -> str:
    """The fingerprint of a z85 public key (40 bytes): its first :data:`FINGERPRINT_CHARS`
    characters."""
    return public_key[:FINGERPRINT_CHARS].decode("ascii")


def user_id(name: str, public_key: bytes) -> str:
    """The ZeroMQ ``User-Id`` of a connection made with ``public_key`` named ``name``."""
    return f"{name}{SEPARATOR}{fingerprint(public_key)}"


def from_user_id(text: str) -> Principal:
    """The principal a ``User-Id`` names (without a separator: the fingerprint is empty, and
    the principal matches no key on the allowlist)."""
    name, _, fp = text.partition(SEPARATOR)
    return Principal(name, fp)
